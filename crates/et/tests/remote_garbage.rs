//! A stranger sends garbage to the ET system's remote server over real TCP, before the
//! handshake and after it: random bytes, truncated frames, frames announcing more than the
//! server takes, requests of every kind with random payloads, a PUT whose data never comes.
//! The server closes those connections, stays up, and keeps serving a well-behaved client
//! (`docs/fuzzing.md`; the decoders themselves are fuzzed by `fuzz/`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use daqflow_et::*;
use daqflow_wire::frame::{FRAME_HEADER_LEN, FrameHeader};
use daqflow_wire::kinds::ET_REMOTE;

const HELLO: u16 = ET_REMOTE.at(1);
const PUT: u16 = ET_REMOTE.at(9);

/// A small deterministic generator (xorshift): the same garbage at every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn frame(kind: u16, channel: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = FrameHeader { kind, flags: 0, channel, len: payload.len() as u32 }.encode().to_vec();
    out.extend_from_slice(payload);
    out
}

/// A raw connection; with `handshake`, after the transport's handshake (no token: the test
/// system has none).
fn raw(addr: SocketAddr, handshake: bool) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    if handshake {
        daqflow_transport::auth::handshake_std(&mut s, "et", None, Duration::from_secs(10)).expect("handshake");
    }
    s
}

/// Sends `bytes` (the server may close the connection meanwhile), then reads what the server
/// answers until it closes the connection or goes quiet.
fn send_garbage(addr: SocketAddr, handshake: bool, bytes: &[u8], close_early: bool) {
    let mut s = raw(addr, handshake);
    let _ = s.write_all(bytes);
    if close_early {
        return;
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 4096];
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    while let Ok(n) = s.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
}

/// A well-behaved client: attaches as a producer and a consumer, moves a few events through.
fn serves_a_client(system: &EtSystem, round: usize) {
    let client = RemoteClient::connect(system.remote_addr().unwrap()).expect("a client connects after the garbage");
    let producer = client.attach("GRAND_CENTRAL").expect("attach a producer");
    let consumer = client.attach("mon").expect("attach a consumer");
    let mut events = producer.new_events(3, 64, Wait::Timed(Duration::from_secs(10))).expect("new events");
    assert_eq!(events.len(), 3);
    for (i, e) in events.iter_mut().enumerate() {
        e.write(format!("round {round} event {i}").as_bytes()).unwrap();
    }
    producer.put_events(&mut events).expect("put events");
    let mut got = Vec::new();
    while got.len() < 3 {
        let mut batch = consumer.get_events(3, Wait::Timed(Duration::from_secs(10))).expect("get events");
        got.extend(batch.iter().map(|e| e.data().to_vec()));
        consumer.put_events(&mut batch).expect("events back");
    }
    got.sort();
    let want: Vec<Vec<u8>> = (0..3).map(|i| format!("round {round} event {i}").into_bytes()).collect();
    assert_eq!(got, want);
}

#[test]
fn the_remote_server_survives_garbage_and_keeps_serving() {
    let mut config = SystemConfig::new(format!("garbage-{}", std::process::id()), 64, 256);
    config.listen = Some("127.0.0.1:0".parse().unwrap());
    let system = EtSystem::create(config).expect("create the system");
    system.create_station("mon", StationConfig::default(), Position::End).unwrap();
    let addr = system.remote_addr().unwrap();
    serves_a_client(&system, 0);

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let huge = FrameHeader { kind: HELLO, flags: 0, channel: 0, len: u32::MAX }.encode();
    let valid_hello = frame(HELLO, 0, b"{}");

    // Before the handshake: the server's listener expects a RESPONSE.
    send_garbage(addr, false, b"GET / HTTP/1.1\r\nHost: et\r\n\r\n", false);
    send_garbage(addr, false, &rng.bytes(3000), false);
    send_garbage(addr, false, &huge, false);
    send_garbage(addr, false, &valid_hello[..7], true);
    send_garbage(addr, false, &valid_hello, false);
    serves_a_client(&system, 1);

    // After the handshake, before HELLO: only HELLO is served, in small frames.
    send_garbage(addr, true, &rng.bytes(5000), false);
    send_garbage(addr, true, &huge, false);
    send_garbage(addr, true, &frame(PUT, 0, &rng.bytes(100)), false);
    send_garbage(addr, true, &valid_hello[..FRAME_HEADER_LEN + 1], true);
    serves_a_client(&system, 2);

    // After HELLO: every request kind with random payloads and channels, truncated frames,
    // oversized frames, and a PUT announcing data frames that never come.
    for round in 0..200 {
        let mut bytes = valid_hello.clone();
        for _ in 0..1 + rng.next() % 4 {
            let kind = ET_REMOTE.at((rng.next() % 20) as u16);
            let len = (rng.next() % 200) as usize;
            let channel = (rng.next() % 4) as u32;
            let payload = rng.bytes(len);
            bytes.extend(frame(kind, channel, &payload));
        }
        match round % 5 {
            0 => {
                let cut = (rng.next() as usize) % bytes.len();
                bytes.truncate(cut.max(valid_hello.len()));
            }
            1 => bytes.extend_from_slice(&huge),
            _ => {}
        }
        send_garbage(addr, true, &bytes, round % 7 == 0);
    }
    // A PUT of one event whose data would follow in a DATA frame, then silence and a close.
    let mut put = Vec::new();
    put.extend_from_slice(&1u32.to_le_bytes());
    put.extend_from_slice(&0u32.to_le_bytes()); // index
    put.extend_from_slice(&4000u32.to_le_bytes()); // length
    put.extend_from_slice(&4096u32.to_le_bytes()); // capacity
    put.push(16); // data in a frame of its own
    put.extend_from_slice(&[0; 3 + 16]);
    let mut bytes = valid_hello.clone();
    bytes.extend(frame(PUT, 0, &put));
    send_garbage(addr, true, &bytes, true);

    for round in 3..6 {
        serves_a_client(&system, round);
    }
    let s = system.snapshot();
    assert_eq!(s.accounted(), u64::from(s.events), "every event is accounted for: {s:#?}");
}
