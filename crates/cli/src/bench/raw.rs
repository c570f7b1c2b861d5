//! The raw-TCP references shared by the suites: plain sockets, no framing, maximal batching.

use std::io::{IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// Writes `size`-byte messages, 64 per `writev` (at most 4 MiB per call), until `done()`; then
/// shuts the sending direction down.
pub fn send_until(mut s: TcpStream, size: usize, mut done: impl FnMut() -> bool) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let msg = vec![0x5au8; size.max(1)];
    let per_call = ((4usize << 20) / msg.len()).clamp(1, 64);
    while !done() {
        let mut slices: Vec<IoSlice<'_>> = (0..per_call).map(|_| IoSlice::new(&msg)).collect();
        let mut bufs = &mut slices[..];
        while !bufs.is_empty() {
            let n = s.write_vectored(bufs)?;
            IoSlice::advance_slices(&mut bufs, n);
        }
    }
    s.shutdown(std::net::Shutdown::Write)
}

/// What [`receive_all`] read.
pub struct Received {
    /// Bytes read.
    pub bytes: u64,
    /// Seconds from the first byte to the last.
    pub seconds: f64,
}

/// Reads every socket from one thread, 1 MiB at a time, until all are closed; `tick` runs after
/// each pass (a suite stops its senders from there).
pub fn receive_all(mut socks: Vec<TcpStream>, mut tick: impl FnMut()) -> std::io::Result<Received> {
    let many = socks.len() > 1;
    for s in &socks {
        s.set_nonblocking(many)?;
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut open = vec![true; socks.len()];
    let mut bytes = 0u64;
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    while open.iter().any(|&o| o) {
        let mut got = false;
        for (i, s) in socks.iter_mut().enumerate() {
            if !open[i] {
                continue;
            }
            match s.read(&mut buf) {
                Ok(0) => open[i] = false,
                Ok(n) => {
                    bytes += n as u64;
                    got = true;
                    last = Instant::now();
                    first.get_or_insert(last);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if !got && many {
            let fds: Vec<_> = socks.iter().zip(&open).filter(|(_, o)| **o).map(|(s, _)| s.as_fd()).collect();
            // POLLIN is 1 on every Linux architecture.
            daqflow_transport::wait_ready(&fds, 1, Some(Duration::from_millis(1)))?;
        }
        tick();
    }
    let seconds = first.map_or(1e-9, |f| (last - f).as_secs_f64().max(1e-9));
    Ok(Received { bytes, seconds })
}

/// The raw one-hop reference of the evb and chain suites: one blocking TCP connection over 127.0.0.1 between two threads of this
/// process, the sender writing `chunk`-byte messages 64 per `writev` (at most 4 MiB per call),
/// the receiver reading 1 MiB at a time, for `duration`: MB/s.
pub(super) fn one_hop_mb_per_s(chunk: usize, duration: std::time::Duration) -> anyhow::Result<f64> {
    use anyhow::Context;
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    let listener = TcpListener::bind(("127.0.0.1", 0)).context("raw reference: bind")?;
    let addr = listener.local_addr().context("raw reference: local address")?;
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || send_until(TcpStream::connect(addr)?, chunk, || stop.load(Ordering::Relaxed)))
    };
    let (sock, _) = listener.accept().context("raw reference: accept")?;
    let start = Instant::now();
    let got = receive_all(vec![sock], || {
        if start.elapsed() >= duration {
            stop.store(true, Ordering::Relaxed);
        }
    });
    stop.store(true, Ordering::Relaxed);
    sender.join().map_err(|_| anyhow::anyhow!("raw reference: sender panicked"))?.context("raw reference: send")?;
    let got = got.context("raw reference: receive")?;
    Ok(got.bytes as f64 / got.seconds / 1e6)
}
