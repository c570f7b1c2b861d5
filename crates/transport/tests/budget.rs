//! The process-wide budget for partial frames: peers that announce large frames and trickle
//! their bytes cannot make the process hold more than the budget. A binary of its own: the
//! budget is one per process.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use daqflow_transport::*;
use daqflow_wire::frame::FrameHeader;

#[test]
fn partial_frames_past_the_process_budget_close_the_connection_that_asked_and_nothing_else() {
    budget::set(8 << 20);
    let opts = ConnectionOptions { token: None, ..ConnectionOptions::for_protocol("test") };
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), opts).unwrap();
    let addr: SocketAddr = listener.local_addr();
    let mut peers = Vec::new();
    let mut conns = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).unwrap();
        let t = std::thread::spawn(move || {
            auth::handshake_std(&mut s, "test", None, Duration::from_secs(10)).unwrap();
            s
        });
        let mut c = listener.accept().unwrap();
        c.admit();
        conns.push(c);
        peers.push(t.join().unwrap());
    }
    // Each announces 3 MiB and sends 1 MiB of it: two fit into 8 MiB, the third does not.
    for s in &mut peers {
        s.write_all(&FrameHeader { kind: 1, flags: 0, channel: 0, len: 3 << 20 }.encode()).unwrap();
        s.write_all(&vec![0u8; 1 << 20]).unwrap();
    }
    let mut results: Vec<Option<RecvError>> = vec![None, None, None];
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && results.iter().filter(|r| r.is_some()).count() < 1 {
        for (c, r) in conns.iter_mut().zip(&mut results) {
            if r.is_none()
                && let Err(e) = c.try_recv()
            {
                *r = Some(e);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let refused: Vec<_> = results.iter().flatten().collect();
    assert_eq!(refused.len(), 1, "{results:?}");
    assert!(
        matches!(refused[0], RecvError::OverBudget { need, budget, .. } if *need == (3 << 20) + 16 && *budget == 8 << 20)
    );
    assert!(refused[0].to_string().contains("DAQFLOW_RECV_BUDGET_BYTES"));
    assert_eq!(budget::in_use(), 2 * ((3 << 20) + 16), "two partial frames hold the budget");
    // The two others complete; the budget comes back.
    for (i, s) in peers.iter_mut().enumerate() {
        if results[i].is_none() {
            s.write_all(&vec![0u8; 2 << 20]).unwrap();
        }
    }
    for (i, c) in conns.iter_mut().enumerate() {
        if results[i].is_none() {
            assert_eq!(c.recv().unwrap().payload.len(), 3 << 20);
        }
    }
    assert_eq!(budget::in_use(), 0);
}
