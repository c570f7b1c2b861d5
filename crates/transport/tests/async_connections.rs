//! The control-plane layer (tokio) over real sockets on 127.0.0.1.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use daqflow_transport::*;
use daqflow_wire::frame::{Frame, FrameError};
use tokio::io::AsyncWriteExt;

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// The next connection, admitted to the default frame limits (these tests are not about hellos).
async fn accept(listener: &AsyncListener) -> AsyncConnection {
    let mut c = listener.accept().await.unwrap();
    c.admit();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_from_many_tasks_share_one_connection_in_per_task_order() {
    let listener = AsyncListener::bind(localhost(), ConnectionOptions::default()).await.unwrap();
    let addr = listener.local_addr();
    let client = tokio::spawn(async move {
        let (tx, _rx) = AsyncConnection::connect(addr, &ConnectionOptions::default()).await.unwrap().split();
        let mut tasks = Vec::new();
        for task in 0..8u32 {
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                for seq in 0..2000u32 {
                    let len = (seq % 5) as usize * 700;
                    tx.send(Frame::new(task as u16, Bytes::from(vec![task as u8; len])).with_channel(seq))
                        .await
                        .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        tx.close().await.unwrap();
        tx.stats()
    });
    let (_tx, mut rx) = accept(&listener).await.split();
    let mut next = [0u32; 8];
    loop {
        match rx.recv().await {
            Ok(f) => {
                let task = f.kind as usize;
                assert_eq!(f.channel, next[task], "frames of one task stay in order");
                assert!(f.payload.iter().all(|&b| b == task as u8));
                next[task] += 1;
            }
            Err(e) => {
                assert!(e.is_clean_close(), "{e}");
                break;
            }
        }
    }
    assert_eq!(next, [2000; 8]);
    let stats = client.await.unwrap();
    assert_eq!(stats.frames, 16000);
    assert!(stats.syscalls < 16000, "coalesced: {} writes", stats.syscalls);
}

#[tokio::test]
async fn a_full_queue_gives_the_frame_back_with_try_send() {
    let opts = ConnectionOptions {
        send_queue_bytes: 32 << 10,
        send_buffer_bytes: Some(16 << 10),
        recv_buffer_bytes: Some(16 << 10),
        ..Default::default()
    };
    let listener = AsyncListener::bind(localhost(), opts.clone()).await.unwrap();
    let (tx, _rx) = AsyncConnection::connect(listener.local_addr(), &opts).await.unwrap().split();
    let _server = accept(&listener).await; // accepted, never read
    let payload = Bytes::from(vec![0u8; 4096]);
    let mut accepted = 0;
    let err = loop {
        match tx.try_send(Frame::new(1, payload.clone())) {
            Ok(()) => accepted += 1,
            Err(e) => break e,
        }
        if accepted % 16 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await; // let the writer fill the socket
        }
        assert!(accepted < 100_000, "never full");
    };
    assert!(matches!(err, SendError::Full { .. }), "{err}");
    assert!(tx.queued_bytes() <= 32 << 10);
    assert_eq!(err.into_frame().unwrap().payload.len(), 4096);
}

#[tokio::test]
async fn garbage_closes_only_the_connection_that_sent_it() {
    let listener = AsyncListener::bind(localhost(), ConnectionOptions::default()).await.unwrap();
    let addr = listener.local_addr();
    let mut bad = tokio::net::TcpStream::connect(addr).await.unwrap();
    bad.write_all(&[0xff; 64]).await.unwrap();
    let (tx, mut rx) = AsyncConnection::connect(addr, &ConnectionOptions::default()).await.unwrap().split();
    // Only the good connection is handed out: the garbage never passed the handshake.
    let (stx, mut srx) = accept(&listener).await.split();
    let echo = tokio::spawn(async move {
        let mut echoed = 0;
        loop {
            match srx.recv().await {
                Ok(f) => {
                    stx.send(f).await.unwrap();
                    echoed += 1;
                }
                Err(e) => return (echoed, e),
            }
        }
    });
    for i in 0..100u32 {
        tx.send(Frame::new(1, Bytes::from(i.to_le_bytes().to_vec()))).await.unwrap();
        assert_eq!(&rx.recv().await.unwrap().payload[..], &i.to_le_bytes());
    }
    tx.close().await.unwrap();
    let (echoed, end) = echo.await.unwrap();
    assert_eq!(echoed, 100);
    assert!(end.is_clean_close(), "{end}");
    // The garbage sender got the challenge, then its connection was closed.
    let mut seen = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tokio::io::AsyncReadExt::read_to_end(&mut bad, &mut seen));
    let _ = read.await.expect("the server closes the garbage connection");
    assert_eq!(u16::from_le_bytes([seen[4], seen[5]]), auth::KIND_CHALLENGE);
    assert_eq!(listener.handshake_stats().refused, 1);
    let _ = FrameError::BadMagic { found: 0 };
}

#[tokio::test]
async fn flush_waits_until_the_frames_are_written_and_close_ends_cleanly() {
    let listener = AsyncListener::bind(localhost(), ConnectionOptions::default()).await.unwrap();
    let (tx, _rx) =
        AsyncConnection::connect(listener.local_addr(), &ConnectionOptions::default()).await.unwrap().split();
    let (_stx, mut srx) = accept(&listener).await.split();
    let big = Bytes::from(vec![3u8; 4 << 20]);
    tx.send(Frame::new(1, big.clone())).await.unwrap();
    let reader = tokio::spawn(async move {
        let f = srx.recv().await.unwrap();
        assert_eq!(f.payload, big);
        srx.recv().await.unwrap_err()
    });
    tx.flush().await.unwrap();
    assert_eq!(tx.queued_bytes(), 0);
    tx.close().await.unwrap();
    assert!(tx.is_closed());
    let err = tx.send(Frame::new(1, Bytes::new())).await.unwrap_err();
    assert!(matches!(err, SendError::Closed { .. }), "{err}");
    assert!(reader.await.unwrap().is_clean_close());
}

#[tokio::test]
async fn dropping_every_sender_closes_the_sending_direction() {
    let listener = AsyncListener::bind(localhost(), ConnectionOptions::default()).await.unwrap();
    let (tx, _rx) =
        AsyncConnection::connect(listener.local_addr(), &ConnectionOptions::default()).await.unwrap().split();
    let (_stx, mut srx) = accept(&listener).await.split();
    let tx2 = tx.clone();
    tx.send(Frame::new(1, Bytes::from_static(b"a"))).await.unwrap();
    tx2.send(Frame::new(1, Bytes::from_static(b"b"))).await.unwrap();
    drop(tx);
    drop(tx2);
    assert_eq!(&srx.recv().await.unwrap().payload[..], b"a");
    assert_eq!(&srx.recv().await.unwrap().payload[..], b"b");
    assert!(srx.recv().await.unwrap_err().is_clean_close());
}

#[tokio::test]
async fn async_connect_retries_until_the_listener_appears() {
    let port = Listener::bind(localhost(), ConnectionOptions::default()).unwrap().local_addr().port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let client = tokio::spawn(async move {
        let policy =
            RetryPolicy { initial: Duration::from_millis(20), ..RetryPolicy::for_duration(Duration::from_secs(30)) };
        AsyncConnection::connect_with_retry(&[addr], &ConnectionOptions::default(), &policy).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listener = AsyncListener::bind(addr, ConnectionOptions::default()).await.unwrap();
    let _server = accept(&listener).await;
    assert_eq!(client.await.unwrap().peer_addr(), addr);
}

#[tokio::test]
async fn blocking_and_async_layers_speak_the_same_framing() {
    let listener = Listener::bind(localhost(), ConnectionOptions::default()).unwrap();
    let addr = listener.local_addr();
    let server = std::thread::spawn(move || {
        let mut c = listener.accept().unwrap();
        let mut n = 0;
        while let Ok(f) = c.recv() {
            c.send(f).unwrap();
            n += 1;
        }
        c.close().unwrap();
        n
    });
    let (tx, mut rx) = AsyncConnection::connect(addr, &ConnectionOptions::default()).await.unwrap().split();
    for i in 0..50u32 {
        tx.send(Frame::new(4, Bytes::from(vec![i as u8; i as usize * 100])).with_channel(i)).await.unwrap();
    }
    tx.close().await.unwrap();
    for i in 0..50u32 {
        let f = rx.recv().await.unwrap();
        assert_eq!((f.kind, f.channel, f.payload.len()), (4, i, i as usize * 100));
    }
    assert!(rx.recv().await.unwrap_err().is_clean_close());
    assert_eq!(tokio::task::spawn_blocking(move || server.join().unwrap()).await.unwrap(), 50);
}

#[tokio::test]
async fn start_send_orders_frames_past_the_bound_and_ready_waits_for_room() {
    let opts = ConnectionOptions { send_queue_bytes: 4096, ..Default::default() };
    let listener = AsyncListener::bind(localhost(), opts.clone()).await.unwrap();
    let (tx, _rx) = AsyncConnection::connect(listener.local_addr(), &opts).await.unwrap().split();
    let (_stx, mut srx) = accept(&listener).await.split();
    for i in 0..100u32 {
        let _room = tx.start_send(Frame::new(1, Bytes::from(vec![0u8; 1000])).with_channel(i)).unwrap();
    }
    assert!(!tx.has_room(), "100 KB queued past a 4 KiB bound");
    tx.ready().await;
    assert!(tx.has_room());
    for i in 0..100u32 {
        assert_eq!(srx.recv().await.unwrap().channel, i);
    }
}

#[tokio::test]
async fn abort_unblocks_a_sender_whose_peer_stopped_reading() {
    let opts = ConnectionOptions {
        send_queue_bytes: 64 << 10,
        send_buffer_bytes: Some(16 << 10),
        recv_buffer_bytes: Some(16 << 10),
        ..Default::default()
    };
    let listener = AsyncListener::bind(localhost(), opts.clone()).await.unwrap();
    let (tx, _rx) = AsyncConnection::connect(listener.local_addr(), &opts).await.unwrap().split();
    let _never_read = accept(&listener).await;
    let blocked = {
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = tx.send(Frame::new(1, Bytes::from(vec![0u8; 8192]))).await {
                    return e;
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!blocked.is_finished(), "the sender should be blocked by back-pressure");
    tx.abort();
    let err = tokio::time::timeout(Duration::from_secs(10), blocked).await.expect("abort wakes the sender").unwrap();
    assert!(matches!(err, SendError::Closed { .. }), "{err}");
    assert!(tx.is_closed());
}
