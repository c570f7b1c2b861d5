//! The data-plane layer over real sockets on 127.0.0.1.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_transport::*;
use daqflow_wire::frame::{Frame, FrameError, FrameHeader};

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// The next connection, admitted to the default frame limits (these tests are not about hellos).
fn accept(listener: &Listener) -> Connection {
    let mut c = listener.accept().unwrap();
    c.admit();
    c
}

/// A plain socket that completed the handshake (no token), for sending raw bytes.
fn raw(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    auth::handshake_std(&mut s, "daqflow", None, Duration::from_secs(10)).unwrap();
    s
}

fn pattern(seq: u32, len: usize) -> Bytes {
    Bytes::from((0..len).map(|i| (seq as usize * 131 + i) as u8).collect::<Vec<u8>>())
}

fn sizes() -> impl Iterator<Item = (u32, usize)> {
    let cycle = [0usize, 1, 15, 64, 1000, 2048, 2049, 4096, 65536, 131072, 1 << 20, 3];
    (0..400u32).map(move |i| (i, cycle[i as usize % cycle.len()]))
}

#[test]
fn frames_of_every_size_arrive_in_order_and_intact() {
    let listener = Listener::bind(localhost(), ConnectionOptions::default()).unwrap();
    let addr = listener.local_addr();
    let sender = thread::spawn(move || {
        let mut c = Connection::connect(addr, &ConnectionOptions::default()).unwrap();
        for (seq, len) in sizes() {
            c.send(Frame::new((seq % 7) as u16, pattern(seq, len)).with_channel(seq).with_flags(seq as u8)).unwrap();
        }
        c.close().unwrap();
    });
    let mut c = accept(&listener);
    for (seq, len) in sizes() {
        let f = c.recv().unwrap();
        assert_eq!((f.channel, f.kind, f.flags), (seq, (seq % 7) as u16, seq as u8));
        assert_eq!(f.payload, pattern(seq, len), "frame {seq}");
    }
    assert!(c.recv().unwrap_err().is_clean_close());
    sender.join().unwrap();
}

#[test]
fn small_frames_are_coalesced_into_few_writes() {
    let listener = Listener::bind(localhost(), ConnectionOptions::default()).unwrap();
    let addr = listener.local_addr();
    let sender = thread::spawn(move || {
        let mut c = Connection::connect(addr, &ConnectionOptions::default()).unwrap();
        for i in 0..20_000u32 {
            c.send_slice(1, 0, i, &[0xa5; 64]).unwrap();
        }
        c.close().unwrap();
        c.send_stats()
    });
    let mut c = accept(&listener);
    let mut n = 0u32;
    while let Ok(f) = c.recv() {
        assert_eq!(f.channel, n);
        n += 1;
    }
    let stats = sender.join().unwrap();
    assert_eq!(n, 20_000);
    assert_eq!(stats.frames, 20_000);
    assert_eq!(stats.bytes, 20_000 * 80);
    // 1.6 MB in chunks of 128 KiB: a dozen writes, not twenty thousand.
    assert!(stats.syscalls <= 40, "{} writes for 20000 frames", stats.syscalls);
    assert!(c.recv_stats().syscalls < 2_000, "{} reads for 20000 frames", c.recv_stats().syscalls);
}

#[test]
fn received_payloads_are_slices_of_one_buffer_not_copies() {
    let listener = Listener::bind(localhost(), ConnectionOptions::default()).unwrap();
    let addr = listener.local_addr();
    let sender = thread::spawn(move || {
        let mut c = Connection::connect(addr, &ConnectionOptions::default()).unwrap();
        for i in 0..3u32 {
            c.send(Frame::new(1, pattern(i, 100))).unwrap();
        }
        c.close().unwrap();
    });
    let mut c = accept(&listener);
    // Wait until all three frames are buffered by one read, then take them.
    thread::sleep(Duration::from_millis(100));
    let frames: Vec<Frame> = (0..3).map(|_| c.recv().unwrap()).collect();
    for w in frames.windows(2) {
        let gap = w[1].payload.as_ptr() as usize - w[0].payload.as_ptr() as usize;
        assert_eq!(gap, 100 + 16, "the next payload follows the previous one and its header in the same buffer");
    }
    sender.join().unwrap();
}

#[test]
fn garbage_from_one_peer_closes_only_that_connection() {
    let listener = Arc::new(Listener::bind(localhost(), ConnectionOptions::default()).unwrap());
    let addr = listener.local_addr();
    let served = Arc::new(AtomicU64::new(0));
    let server = {
        let (served, listener) = (served.clone(), listener.clone());
        thread::spawn(move || {
            let mut handlers = Vec::new();
            // Three connect; the one that sends garbage never gets past the handshake.
            for _ in 0..2 {
                let mut c = accept(&listener);
                let served = served.clone();
                handlers.push(thread::spawn(move || {
                    loop {
                        match c.recv() {
                            Ok(f) => {
                                c.send(f).unwrap();
                                c.flush().unwrap();
                                served.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => return e,
                        }
                    }
                }));
            }
            handlers.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        })
    };
    let mut good1 = Connection::connect(addr, &ConnectionOptions::default()).unwrap();
    let mut bad = TcpStream::connect(addr).unwrap();
    let mut good2 = Connection::connect(addr, &ConnectionOptions::default()).unwrap();
    bad.write_all(b"GET / HTTP/1.1\r\nHost: daqflow\r\n\r\n").unwrap();
    for i in 0..100u32 {
        for c in [&mut good1, &mut good2] {
            c.send(Frame::new(2, pattern(i, 50))).unwrap();
            c.flush().unwrap();
            assert_eq!(c.recv().unwrap().payload, pattern(i, 50));
        }
    }
    good1.close().unwrap();
    good2.close().unwrap();
    let errors = server.join().unwrap();
    assert_eq!(served.load(Ordering::Relaxed), 200);
    assert!(errors.iter().all(|e| e.is_clean_close()), "{errors:?}");
    // The garbage sender got the challenge, then its connection was closed.
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut seen = Vec::new();
    let _ = std::io::Read::read_to_end(&mut bad, &mut seen);
    assert_eq!(u16::from_le_bytes([seen[4], seen[5]]), auth::KIND_CHALLENGE);
    // Its handshake is counted as refused once the listener has looked at it again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while listener.handshake_stats().refused == 0 && Instant::now() < deadline {
        let _ = listener.accept_timeout(Duration::from_millis(50)).unwrap();
    }
    assert_eq!(listener.handshake_stats().refused, 1);
    assert_eq!(listener.handshake_stats().accepted, 2);
}

#[test]
fn an_oversized_frame_is_refused_before_it_is_received() {
    let opts = ConnectionOptions { max_frame_bytes: 1024, ..Default::default() };
    let listener = Listener::bind(localhost(), opts).unwrap();
    let addr = listener.local_addr();
    let mut raw = raw(addr);
    // Announce 3 GiB; send only the header.
    raw.write_all(&FrameHeader { kind: 9, flags: 0, channel: 0, len: 3 << 30 }.encode()).unwrap();
    let mut c = accept(&listener);
    let err = c.recv().unwrap_err();
    assert!(
        matches!(err, RecvError::Protocol { source: FrameError::TooLarge { len, max: 1024, .. }, .. } if len == 3 << 30),
        "{err}"
    );
    assert!(err.to_string().contains("more than the configured maximum"));
}

#[test]
fn a_peer_closing_mid_frame_is_reported_as_truncated() {
    let listener = Listener::bind(localhost(), ConnectionOptions::default()).unwrap();
    let addr = listener.local_addr();
    let mut raw = raw(addr);
    raw.write_all(&FrameHeader { kind: 1, flags: 0, channel: 0, len: 100 }.encode()).unwrap();
    raw.write_all(&[0u8; 40]).unwrap();
    drop(raw);
    let mut c = accept(&listener);
    assert!(matches!(c.recv(), Err(RecvError::Truncated { buffered: 56, .. })));
}

#[test]
fn back_pressure_blocks_the_sender_until_the_peer_reads() {
    let opts = ConnectionOptions {
        send_queue_bytes: 256 << 10,
        send_buffer_bytes: Some(64 << 10),
        recv_buffer_bytes: Some(64 << 10),
        ..Default::default()
    };
    let listener = Listener::bind(localhost(), opts.clone()).unwrap();
    let addr = listener.local_addr();
    let sent = Arc::new(AtomicU64::new(0));
    const FRAMES: u64 = 2000; // 2000 × 10 KiB = 20 MB, far more than the queue and the kernel buffers
    let sender = {
        let sent = sent.clone();
        thread::spawn(move || {
            let mut c = Connection::connect(addr, &opts).unwrap();
            let payload = Bytes::from(vec![1u8; 10 << 10]);
            for _ in 0..FRAMES {
                c.send(Frame::new(1, payload.clone())).unwrap();
                assert!(c.queued_bytes() <= (256 << 10) + (10 << 10) + 16, "queue over its bound");
                sent.fetch_add(1, Ordering::Relaxed);
            }
            c.close().unwrap();
        })
    };
    let mut c = accept(&listener);
    // While nobody reads, the sender stalls well short of the end.
    let mut last = u64::MAX;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        thread::sleep(Duration::from_millis(200));
        let now = sent.load(Ordering::Relaxed);
        if now == last {
            break;
        }
        last = now;
        assert!(Instant::now() < deadline, "the sender never stalled");
    }
    assert!(last < FRAMES / 2, "sender got {last} frames out with nobody reading");
    let mut n = 0;
    while c.recv().is_ok() {
        n += 1;
    }
    sender.join().unwrap();
    assert_eq!(n, FRAMES);
}

#[test]
fn when_full_fail_gives_the_frame_back_and_loses_nothing() {
    let opts = ConnectionOptions {
        send_queue_bytes: 64 << 10,
        when_full: WhenFull::Fail,
        send_buffer_bytes: Some(32 << 10),
        recv_buffer_bytes: Some(32 << 10),
        ..Default::default()
    };
    let listener = Listener::bind(localhost(), opts.clone()).unwrap();
    let mut c = Connection::connect(listener.local_addr(), &opts).unwrap();
    let mut server = accept(&listener);
    let mut accepted = 0u32;
    let refused = loop {
        match c.send(Frame::new(1, pattern(accepted, 4000)).with_channel(accepted)) {
            Ok(()) => accepted += 1,
            Err(SendError::Full { frame, queued, .. }) => {
                assert!(queued <= 64 << 10);
                break frame;
            }
            Err(e) => panic!("{e}"),
        }
        assert!(accepted < 100_000, "the queue never filled");
    };
    assert_eq!(refused.channel, accepted, "the refused frame is the one just offered");
    let reader = thread::spawn(move || {
        let mut got = 0u32;
        while let Ok(f) = server.recv() {
            assert_eq!(f.channel, got);
            got += 1;
        }
        got
    });
    c.close().unwrap();
    assert_eq!(reader.join().unwrap(), accepted, "every accepted frame arrives");
}

#[test]
fn connect_retries_until_the_listener_appears() {
    // Find a free port, then listen on it only after the client started trying.
    let port = Listener::bind(localhost(), ConnectionOptions::default()).unwrap().local_addr().port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let client = thread::spawn(move || {
        let policy =
            RetryPolicy { initial: Duration::from_millis(20), ..RetryPolicy::for_duration(Duration::from_secs(30)) };
        let mut c = Connection::connect_with_retry(&[addr], &ConnectionOptions::default(), &policy).unwrap();
        c.send(Frame::new(3, Bytes::from_static(b"late"))).unwrap();
        c.close().unwrap();
    });
    thread::sleep(Duration::from_millis(300));
    let listener = Listener::bind(addr, ConnectionOptions::default()).unwrap();
    let mut c = accept(&listener);
    assert_eq!(&c.recv().unwrap().payload[..], b"late");
    client.join().unwrap();
}

#[test]
fn connect_gives_up_when_its_deadline_passes() {
    let port = Listener::bind(localhost(), ConnectionOptions::default()).unwrap().local_addr().port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let policy =
        RetryPolicy { initial: Duration::from_millis(10), ..RetryPolicy::for_duration(Duration::from_millis(300)) };
    let err = Connection::connect_with_retry(&[addr], &ConnectionOptions::default(), &policy).unwrap_err();
    match &err {
        ConnectError::GaveUp { attempts, last, .. } => {
            assert!(*attempts > 1);
            assert_eq!(last.kind(), std::io::ErrorKind::ConnectionRefused);
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains(&addr.to_string()));
}

#[test]
fn the_second_address_is_used_when_the_first_is_down() {
    let down = Listener::bind(localhost(), ConnectionOptions::default()).unwrap().local_addr();
    let listener = Listener::bind(localhost(), ConnectionOptions::default()).unwrap();
    let up = listener.local_addr();
    let policy = RetryPolicy::for_duration(Duration::from_secs(10));
    let c = Connection::connect_with_retry(&[down, up], &ConnectionOptions::default(), &policy).unwrap();
    assert_eq!(c.peer_addr(), up);
}

#[test]
fn try_recv_never_waits_and_recv_timeout_returns_when_nothing_comes() {
    let listener = Listener::bind(localhost(), ConnectionOptions::default()).unwrap();
    let mut client = Connection::connect(listener.local_addr(), &ConnectionOptions::default()).unwrap();
    let mut server = accept(&listener);
    assert!(server.try_recv().unwrap().is_none());
    assert!(server.recv_timeout(Duration::from_millis(50)).unwrap().is_none());
    client.send(Frame::new(1, Bytes::from_static(b"x"))).unwrap();
    assert_eq!(client.queued_bytes(), 17, "a small frame waits for more or for a flush");
    assert!(server.recv_timeout(Duration::from_millis(50)).unwrap().is_none(), "nothing was written yet");
    assert!(client.try_flush().unwrap(), "a 17-byte write fits at once");
    let f = server.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(&f.payload[..], b"x");
}

#[test]
fn halves_work_from_two_threads() {
    let listener = Listener::bind(localhost(), ConnectionOptions::default()).unwrap();
    let addr = listener.local_addr();
    let echo = thread::spawn(move || {
        let (mut tx, mut rx) = accept(&listener).split();
        while let Ok(f) = rx.recv() {
            tx.send(f).unwrap();
            tx.flush().unwrap();
        }
        tx.close().unwrap();
    });
    let (mut tx, mut rx) = Connection::connect(addr, &ConnectionOptions::default()).unwrap().split();
    let reader = thread::spawn(move || {
        let mut n = 0u32;
        while let Ok(f) = rx.recv() {
            assert_eq!(f.channel, n);
            n += 1;
        }
        n
    });
    for i in 0..5000u32 {
        tx.send(Frame::new(1, pattern(i, 33)).with_channel(i)).unwrap();
    }
    tx.close().unwrap();
    assert_eq!(reader.join().unwrap(), 5000);
    echo.join().unwrap();
}
