//! The authentication handshake and the limits before and after it, over real sockets on
//! 127.0.0.1, from the attacker's side: strangers without the token, clients of another
//! protocol, silent connections and large frame headers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_transport::auth::{self, AuthError, Token};
use daqflow_transport::*;
use daqflow_wire::frame::{Frame, FrameError, FrameHeader, FrameLimits};

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn opts(token: Option<&Token>) -> ConnectionOptions {
    ConnectionOptions { token: token.cloned(), ..ConnectionOptions::for_protocol("test") }
}

/// Connects from a thread (the blocking listener drives handshakes while it accepts).
fn connect_from_thread(addr: SocketAddr, o: ConnectionOptions) -> thread::JoinHandle<Result<Connection, ConnectError>> {
    thread::spawn(move || Connection::connect(addr, &o))
}

/// Accepts for a while and returns what was handed out.
fn accept_for(listener: &Listener, d: Duration) -> Vec<Connection> {
    let deadline = Instant::now() + d;
    let mut out = Vec::new();
    while Instant::now() < deadline {
        if let Some(c) = listener.accept_timeout(Duration::from_millis(20)).unwrap() {
            out.push(c);
        }
    }
    out
}

fn auth_error(r: Result<Connection, ConnectError>) -> AuthError {
    match r {
        Err(ConnectError::Auth(e)) => e,
        other => panic!("expected a handshake error, got {other:?}"),
    }
}

#[test]
fn the_same_token_on_both_ends_connects_and_frames_flow() {
    let token = Token::generate();
    let listener = Listener::bind(localhost(), opts(Some(&token))).unwrap();
    let client = connect_from_thread(listener.local_addr(), opts(Some(&token)));
    let mut server = listener.accept().unwrap();
    let mut client = client.join().unwrap().unwrap();
    client.send(Frame::new(1, Bytes::from_static(b"after the handshake"))).unwrap();
    client.flush().unwrap();
    assert_eq!(&server.recv().unwrap().payload[..], b"after the handshake");
    assert_eq!(listener.handshake_stats().accepted, 1);
}

#[test]
fn a_client_with_another_token_is_refused_and_told_why() {
    let listener = Listener::bind(localhost(), opts(Some(&Token::generate()))).unwrap();
    let client = connect_from_thread(listener.local_addr(), opts(Some(&Token::generate())));
    assert!(accept_for(&listener, Duration::from_millis(500)).is_empty(), "nothing handed out");
    let e = auth_error(client.join().unwrap());
    assert!(matches!(e, AuthError::WrongToken { .. }), "{e}");
    assert_eq!(listener.handshake_stats().refused, 1);
}

#[test]
fn a_client_without_a_token_is_told_the_server_requires_one() {
    let listener = Listener::bind(localhost(), opts(Some(&Token::generate()))).unwrap();
    let client = connect_from_thread(listener.local_addr(), opts(None));
    assert!(accept_for(&listener, Duration::from_millis(300)).is_empty());
    let e = auth_error(client.join().unwrap());
    assert!(matches!(e, AuthError::TokenRequired { .. }), "{e}");
    assert!(e.to_string().contains("--token-file"), "the message says what to do: {e}");
}

#[test]
fn a_client_with_a_token_does_not_talk_to_a_server_that_cannot_prove_it() {
    let listener = Listener::bind(localhost(), opts(None)).unwrap();
    let client = connect_from_thread(listener.local_addr(), opts(Some(&Token::generate())));
    assert!(accept_for(&listener, Duration::from_millis(300)).is_empty());
    assert!(matches!(auth_error(client.join().unwrap()), AuthError::ServerUnproven { .. }));
}

#[test]
fn a_client_of_another_protocol_is_told_it_dialled_the_wrong_port() {
    let listener = Listener::bind(localhost(), opts(None)).unwrap();
    let other = ConnectionOptions { token: None, ..ConnectionOptions::for_protocol("dialog-control") };
    let client = connect_from_thread(listener.local_addr(), other);
    assert!(accept_for(&listener, Duration::from_millis(300)).is_empty());
    let e = auth_error(client.join().unwrap());
    assert!(e.to_string().contains("speaks `test`"), "{e}");
}

#[test]
fn silent_strangers_do_not_hold_up_the_listener() {
    let o = ConnectionOptions { max_pending_handshakes: 16, ..opts(Some(&Token::generate())) };
    let token = o.token.clone();
    let listener = Listener::bind(localhost(), o).unwrap();
    let addr = listener.local_addr();
    // Far more silent connections than handshakes may be under way, all before the real client.
    let strangers: Vec<TcpStream> = (0..100).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let client = connect_from_thread(addr, ConnectionOptions { token, ..ConnectionOptions::for_protocol("test") });
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.is_empty() && Instant::now() < deadline {
        got.extend(listener.accept_timeout(Duration::from_millis(50)).unwrap());
    }
    assert_eq!(got.len(), 1, "the real client is accepted");
    client.join().unwrap().unwrap();
    assert!(listener.handshake_stats().evicted >= 84, "{:?}", listener.handshake_stats());
    drop(strangers);
}

#[test]
fn a_silent_connection_is_dropped_after_the_handshake_timeout() {
    let o = ConnectionOptions { handshake_timeout: Duration::from_millis(200), ..opts(None) };
    let listener = Listener::bind(localhost(), o).unwrap();
    let mut stranger = TcpStream::connect(listener.local_addr()).unwrap();
    assert!(accept_for(&listener, Duration::from_millis(600)).is_empty());
    stranger.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut seen = Vec::new();
    let _ = stranger.read_to_end(&mut seen);
    assert_eq!(seen.len(), 16 + 21 + 4, "the challenge (16 + 21 + protocol name), then the close");
    assert_eq!(listener.handshake_stats().abandoned, 1);
}

#[test]
fn a_large_frame_header_before_the_handshake_is_refused_at_once() {
    let listener = Listener::bind(localhost(), opts(Some(&Token::generate()))).unwrap();
    let mut stranger = TcpStream::connect(listener.local_addr()).unwrap();
    stranger.write_all(&FrameHeader { kind: 1, flags: 0, channel: 0, len: 60 << 20 }.encode()).unwrap();
    // Trickle some of it: nothing of it is kept.
    let _ = stranger.write_all(&vec![0u8; 1 << 20]);
    assert!(accept_for(&listener, Duration::from_millis(500)).is_empty());
    assert_eq!(listener.handshake_stats().refused, 1);
}

#[test]
fn an_accepted_peer_sends_only_small_frames_until_the_protocol_admits_it() {
    let o = ConnectionOptions { hello_max_frame_bytes: 4096, ..opts(None) };
    let listener = Listener::bind(localhost(), o.clone()).unwrap();
    let addr = listener.local_addr();
    let client = connect_from_thread(addr, o.clone());
    let mut server = listener.accept().unwrap();
    let mut client = client.join().unwrap().unwrap();
    client.send(Frame::new(1, Bytes::from(vec![1u8; 4096]))).unwrap();
    client.flush().unwrap();
    assert_eq!(server.recv().unwrap().payload.len(), 4096, "a hello-sized frame passes");
    client.send(Frame::new(1, Bytes::from(vec![1u8; 4097]))).unwrap();
    client.flush().unwrap();
    let e = server.recv().unwrap_err();
    assert!(matches!(e, RecvError::Protocol { source: FrameError::TooLarge { max: 4096, .. }, .. }), "{e}");

    // The same after the protocol admitted the peer, with a kind of its own allowed large.
    let client = connect_from_thread(addr, o);
    let mut server = listener.accept().unwrap();
    server.set_frame_limits(FrameLimits::uniform(4096).with_kind(7, 1 << 20));
    let mut client = client.join().unwrap().unwrap();
    client.send(Frame::new(7, Bytes::from(vec![1u8; 1 << 20]))).unwrap();
    client.flush().unwrap();
    assert_eq!(server.recv().unwrap().payload.len(), 1 << 20);
    client.send(Frame::new(8, Bytes::from(vec![1u8; 5000]))).unwrap();
    client.flush().unwrap();
    assert!(matches!(server.recv(), Err(RecvError::Protocol { source: FrameError::TooLarge { kind: 8, .. }, .. })));
}

#[test]
fn a_plain_socket_can_complete_the_handshake_as_documented() {
    let token = Token::generate();
    let listener = Listener::bind(localhost(), opts(Some(&token))).unwrap();
    let addr = listener.local_addr();
    let t = {
        let token = token.clone();
        thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            auth::handshake_std(&mut s, "test", Some(&token), Duration::from_secs(10)).unwrap();
            let mut wire = bytes::BytesMut::new();
            daqflow_wire::frame::FrameCodec::default().encode(&Frame::new(3, Bytes::from_static(b"raw")), &mut wire);
            s.write_all(&wire).unwrap();
            s
        })
    };
    let mut server = listener.accept().unwrap();
    assert_eq!(&server.recv().unwrap().payload[..], b"raw");
    drop(t.join().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_layer_refuses_the_same_strangers_and_serves_the_rest() {
    let token = Token::generate();
    let listener =
        AsyncListener::bind(localhost(), ConnectionOptions { max_pending_handshakes: 8, ..opts(Some(&token)) })
            .await
            .unwrap();
    let addr = listener.local_addr();
    let wrong = AsyncConnection::connect(addr, &opts(Some(&Token::generate()))).await.unwrap_err();
    assert!(matches!(wrong, ConnectError::Auth(AuthError::WrongToken { .. })), "{wrong}");
    let none = AsyncConnection::connect(addr, &opts(None)).await.unwrap_err();
    assert!(matches!(none, ConnectError::Auth(AuthError::TokenRequired { .. })), "{none}");
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let (tx, _rx) = AsyncConnection::connect(addr, &opts(Some(&token))).await.unwrap().split();
    tx.send(Frame::new(1, Bytes::from_static(b"x"))).await.unwrap();
    let (_stx, mut srx) =
        tokio::time::timeout(Duration::from_secs(30), listener.accept()).await.expect("accepted").unwrap().split();
    assert_eq!(&srx.recv().await.unwrap().payload[..], b"x");
    let stats = listener.handshake_stats();
    // The wrong token is refused; the client without one gives up at the challenge.
    assert_eq!((stats.accepted, stats.refused, stats.abandoned), (1, 1, 1), "{stats:?}");
    assert!(stats.evicted >= 42, "{stats:?}");
    drop(silent);
}
