//! The raw relay reference of `daqflow bench evb`: the readout unit's topology without the
//! readout unit. `STREAMS` sender processes write fragment-sized messages to one relay process,
//! which takes one message from every input per event and forwards whole events, alternately
//! by block, to `OUTPUTS` receiver processes; every process a child of the bench
//! (`daqflow bench-helper raw-sender | raw-relay | raw-receiver`).
//!
//! It is the best a relay of that shape does over these sockets on this machine: no framing,
//! no CRC, no accounting, reads of up to 4 MiB per input into one buffer each, events gathered
//! from those buffers without a copy and written with one `writev(2)` of up to 1 MiB (and at
//! most 1024 messages) per call. What it keeps of an event builder: every output byte is a
//! whole event, its fragments in stream order, and an event goes out only once every stream has
//! sent its fragment of it.

use std::io::{IoSlice, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::Duration;

use anyhow::{Context, bail};

use super::dialog::RawReport;
use super::helper::{Helper, helper_args, peak_rss_mb};
use super::raw::{BYTES_PER_WRITE, READ_BYTES, Received, Reference, WARMUP, Window};

/// Messages per `writev(2)` at most (Linux's `IOV_MAX`).
const MAX_SLICES: usize = 1024;

/// Whole events per write: as many as make [`BYTES_PER_WRITE`] and fit [`MAX_SLICES`], at
/// least one.
pub fn events_per_write(streams: usize, size: usize) -> usize {
    let event = (streams * size).max(1);
    (BYTES_PER_WRITE / event).min(MAX_SLICES / streams.max(1)).max(1)
}

/// One input's bytes not yet forwarded: `buf[start..end]`.
struct Input {
    sock: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    open: bool,
}

impl Input {
    /// Reads what the socket has (non-blocking) into the free end of the buffer, first moving
    /// what is left to its front when less than a quarter is free; whether a byte came.
    fn fill(&mut self) -> std::io::Result<bool> {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.buf.len() - self.end < self.buf.len() / 4 {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        if !self.open || self.end == self.buf.len() {
            return Ok(false);
        }
        match self.sock.read(&mut self.buf[self.end..]) {
            Ok(0) => {
                self.open = false;
                Ok(false)
            }
            Ok(n) => {
                self.end += n;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Relays `size`-byte messages from `inputs` to `outputs` until an input ends and no whole
/// event is left; then shuts the outputs' sending direction down and reads the other inputs
/// to their ends. Event `n` is message `n` of
/// every input, in input order; blocks of [`events_per_write`] events go to the outputs in
/// turn. Counts the bytes forwarded from [`WARMUP`] after the first write on.
pub fn relay(inputs: Vec<TcpStream>, mut outputs: Vec<TcpStream>, size: usize) -> std::io::Result<Received> {
    if inputs.is_empty() || outputs.is_empty() || size == 0 {
        return Err(std::io::Error::other("a relay needs inputs, outputs and a message size"));
    }
    let capacity = READ_BYTES.max(4 * size);
    let mut inputs: Vec<Input> = inputs
        .into_iter()
        .map(|sock| {
            sock.set_nonblocking(true)?;
            Ok(Input { sock, buf: vec![0; capacity], start: 0, end: 0, open: true })
        })
        .collect::<std::io::Result<_>>()?;
    for o in &outputs {
        o.set_nodelay(true)?;
    }
    let per_write = events_per_write(inputs.len(), size);
    let mut next_output = 0usize;
    let mut window = Window::default();
    loop {
        let mut got = false;
        for input in &mut inputs {
            got |= input.fill()?;
        }
        let whole = inputs.iter().map(|i| (i.end - i.start) / size).min().unwrap_or(0);
        if whole == 0 {
            // An input that ended without a whole message left: no event can be whole again.
            if inputs.iter().any(|i| !i.open && i.end - i.start < size) {
                break;
            }
            if !got {
                let fds: Vec<_> = inputs.iter().map(|i| i.sock.as_fd()).collect();
                // POLLIN is 1 on every Linux architecture.
                daqflow_transport::wait_ready(&fds, 1, Some(Duration::from_millis(1)))?;
            }
            continue;
        }
        let mut left = whole;
        while left > 0 {
            let events = left.min(per_write);
            // One allocation per write of up to 1 MiB: nothing next to the write itself.
            let mut slices = Vec::with_capacity(events * inputs.len());
            for e in 0..events {
                for input in &inputs {
                    let at = input.start + e * size;
                    slices.push(IoSlice::new(&input.buf[at..at + size]));
                }
            }
            let out = &mut outputs[next_output];
            let mut rest = &mut slices[..];
            while !rest.is_empty() {
                let n = out.write_vectored(rest)?;
                if n == 0 {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
                IoSlice::advance_slices(&mut rest, n);
            }
            drop(slices);
            for input in &mut inputs {
                input.start += events * size;
            }
            next_output = (next_output + 1) % outputs.len();
            window.add((events * inputs.len() * size) as u64);
            left -= events;
        }
    }
    for o in &outputs {
        o.shutdown(std::net::Shutdown::Write)?;
    }
    // The senders still writing are read to their end: closing a socket with bytes unread would
    // reset their connections.
    let mut sink = vec![0u8; READ_BYTES];
    for input in &mut inputs {
        if input.open {
            input.sock.set_nonblocking(false)?;
            while input.sock.read(&mut sink)? > 0 {}
        }
    }
    Ok(window.received())
}

/// The `raw-relay` helper: connects to `outputs`, listens on 127.0.0.1 and says where, takes
/// `inputs` connections, relays, and prints its [`RawReport`].
pub fn helper(inputs: usize, size: usize, outputs: &[SocketAddr]) -> anyhow::Result<()> {
    let outs = outputs
        .iter()
        .map(|a| TcpStream::connect(a).with_context(|| format!("raw relay: connecting to {a}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).context("raw relay: bind")?;
    println!("listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let socks = (0..inputs).map(|_| listener.accept().map(|(s, _)| s)).collect::<std::io::Result<Vec<_>>>()?;
    let got = relay(socks, outs, size).context("raw relay")?;
    let report = RawReport { bytes: got.bytes, seconds: got.seconds, peak_rss_mb: peak_rss_mb() };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Measures the relay reference: `outputs` raw receivers, one relay, `streams` raw senders of
/// `size`-byte messages, for `window` after the [`WARMUP`]; what the relay forwarded.
pub fn measure(streams: usize, outputs: usize, size: usize, window: Duration) -> anyhow::Result<Reference> {
    let receivers = (0..outputs)
        .map(|_| Helper::spawn(&helper_args(&["raw-receiver", "--connections", "1"])))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut args =
        vec!["raw-relay".to_string(), "--inputs".into(), streams.to_string(), "--size".into(), size.to_string()];
    for r in &receivers {
        args.push("--connect".into());
        args.push(r.listening("raw receiver")?);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut relay = Helper::spawn(&helper_args(&args))?;
    let at = relay.listening("raw relay")?;
    // Senders start one after the other: each runs a little longer than the window, so that
    // every one is still sending while the relay counts.
    let seconds = (window + WARMUP + Duration::from_millis(100)).as_secs_f64().to_string();
    let senders = (0..streams)
        .map(|_| {
            Helper::spawn(&helper_args(&[
                "raw-sender",
                "--connect",
                &at,
                "--size",
                &size.to_string(),
                "--seconds",
                &seconds,
            ]))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let wait = window + Duration::from_secs(60);
    for mut s in senders {
        let _: serde_json::Value = s.json(wait).context("raw sender")?;
    }
    let got: RawReport = relay.json(wait).context("raw relay")?;
    for mut r in receivers {
        let r: RawReport = r.json(wait).context("raw receiver behind the relay")?;
        if r.bytes == 0 {
            bail!("raw relay: a receiver got no byte");
        }
    }
    Ok(Reference { bytes: got.bytes, seconds: got.seconds, window: window.as_secs_f64() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_carries_whole_events_up_to_a_mebibyte_and_1024_messages() {
        assert_eq!(events_per_write(8, 16 << 10), 8);
        assert_eq!(events_per_write(8, 1024), 128);
        assert_eq!(events_per_write(8, 256), 128, "1024 messages at most");
        assert_eq!(events_per_write(8, 1 << 20), 1);
    }

    /// Three inputs of numbered messages through the relay to two outputs: every output is whole
    /// events of the inputs' messages in input order, the outputs take blocks in turn, and
    /// nothing is lost or repeated.
    #[test]
    fn the_relay_forwards_whole_events_in_stream_order_to_the_outputs_in_turn() {
        const SIZE: usize = 64;
        const MESSAGES: u32 = 5000;
        let (streams, outputs) = (3usize, 2usize);
        let listen = || TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let out_listeners: Vec<_> = (0..outputs).map(|_| listen()).collect();
        let out_addrs: Vec<_> = out_listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let readers: Vec<_> = out_listeners
            .into_iter()
            .map(|l| {
                std::thread::spawn(move || {
                    let mut v = Vec::new();
                    l.accept().unwrap().0.read_to_end(&mut v).unwrap();
                    v
                })
            })
            .collect();
        let outs: Vec<_> = out_addrs.iter().map(|a| TcpStream::connect(a).unwrap()).collect();
        let in_listener = listen();
        let in_addr = in_listener.local_addr().unwrap();
        let senders: Vec<_> = (0..streams)
            .map(|s| {
                std::thread::spawn(move || {
                    let mut sock = TcpStream::connect(in_addr).unwrap();
                    // Sent in uneven pieces: message boundaries are the relay's to find.
                    let mut all = Vec::new();
                    for n in 0..MESSAGES {
                        let mut m = [s as u8; SIZE];
                        m[1..5].copy_from_slice(&n.to_le_bytes());
                        all.extend_from_slice(&m);
                    }
                    for piece in all.chunks(1000 + 37 * s) {
                        sock.write_all(piece).unwrap();
                    }
                })
            })
            .collect();
        // Inputs in the order they were accepted; identify each by its first byte below.
        let ins: Vec<_> = (0..streams).map(|_| in_listener.accept().unwrap().0).collect();
        let got = relay(ins, outs, SIZE).unwrap();
        for s in senders {
            s.join().unwrap();
        }
        let outs: Vec<Vec<u8>> = readers.into_iter().map(|r| r.join().unwrap()).collect();
        let total: usize = outs.iter().map(Vec::len).sum();
        assert_eq!(total, streams * SIZE * MESSAGES as usize);
        assert!(got.bytes > 0 && got.bytes as usize <= total, "{} of {total}", got.bytes);
        let event = streams * SIZE;
        let mut seen = vec![false; MESSAGES as usize];
        for out in &outs {
            assert!(!out.is_empty(), "both outputs take blocks");
            assert_eq!(out.len() % event, 0);
            for ev in out.chunks(event) {
                let n = u32::from_le_bytes(ev[1..5].try_into().unwrap());
                let mut sources = Vec::new();
                for m in ev.chunks(SIZE) {
                    assert_eq!(u32::from_le_bytes(m[1..5].try_into().unwrap()), n, "one event, one message number");
                    sources.push(m[0]);
                }
                sources.sort();
                assert_eq!(sources, (0..streams as u8).collect::<Vec<_>>(), "one message of every stream");
                assert!(!std::mem::replace(&mut seen[n as usize], true), "event {n} twice");
            }
        }
        assert!(seen.iter().all(|&s| s), "every event forwarded");
    }
}
