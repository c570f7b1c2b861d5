//! `daqflow bench transport`: framed TCP against raw blocking sockets on loopback.
//!
//! Cases:
//! - `frame_size`: one connection, frames of 64 B … 1 MiB;
//! - `connections`: 1, 2 and 4 connections into one receiving thread;
//! - `driving`: the receiver as a dedicated thread in blocking `recv` against an engine-style
//!   task polling `try_recv` with a spin-then-wait idle strategy.
//!
//! Every repetition measures the raw reference first and then daqflow, so the ratio compares
//! two numbers taken under the same load.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use daqflow_transport::{Connection, ConnectionOptions, Listener, RecvError, wait_ready};
use daqflow_wire::frame::Frame;

use super::harness::{BenchConfig, Metrics, Param, Plot, Series, Suite};

/// What one measurement moved.
#[derive(Debug, Clone, Copy, Default)]
struct Moved {
    frames: u64,
    payload_bytes: u64,
    seconds: f64,
    writes: u64,
}

impl Moved {
    fn frames_per_s(&self) -> f64 {
        self.frames as f64 / self.seconds
    }
    fn mb_per_s(&self) -> f64 {
        self.payload_bytes as f64 / self.seconds / 1e6
    }
}

/// How the receiver is driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driving {
    /// A dedicated thread blocked in `recv` (one connection).
    Thread,
    /// One thread polling every connection with `try_recv`, spinning and then waiting in
    /// `poll(2)` when idle — what an engine task does.
    Task,
}

pub fn run(config: BenchConfig) -> anyhow::Result<Suite> {
    let mut suite = Suite::new("transport", "framed TCP on loopback against raw blocking sockets", config.clone());
    let t = config.measure_time;
    let sizes: &[usize] =
        if config.quick { &[64, 1024, 65536, 1 << 20] } else { &[64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20] };
    for &size in sizes {
        suite.measure("frame_size", vec![("frame_bytes", size.into()), ("connections", 1usize.into())], || {
            let reference = raw(size, 1, t)?;
            let ours = framed(size, 1, t, Driving::Thread)?;
            metrics(&ours, reference, || raw(size, 1, t))
        })?;
    }
    let conn_sizes: &[usize] = if config.quick { &[64, 65536] } else { &[64, 4096, 65536] };
    for &size in conn_sizes {
        for n in [1usize, 2, 4] {
            suite.measure("connections", vec![("frame_bytes", size.into()), ("connections", n.into())], || {
                let reference = raw(size, n, t)?;
                let ours = framed(size, n, t, Driving::Task)?;
                metrics(&ours, reference, || raw(size, n, t))
            })?;
        }
    }
    for &size in &[64usize, 65536] {
        for (name, driving) in [("thread", Driving::Thread), ("task", Driving::Task)] {
            suite.measure(
                "driving",
                vec![("frame_bytes", size.into()), ("connections", 1usize.into()), ("driving", name.into())],
                || {
                    let ours = framed(size, 1, t, driving)?;
                    Ok(Metrics::new().with("frames_per_s", ours.frames_per_s()).with("mb_per_s", ours.mb_per_s()))
                },
            )?;
        }
    }
    suite.plots = plots(conn_sizes);
    suite.note(super::machine_note());
    suite.note(
        "raw reference: std sockets, TCP_NODELAY, 1 MiB per write (as many messages as make it), one receiving \
         thread reading 4 MiB at a time from every socket after a 0.1 s warm-up, no framing; daqflow: Connection with default options \
         (small frames coalesced into 128 KiB chunks, writes of up to 1 MiB, payloads above 2 KiB written from their \
         own memory, frames received as slices of 256 KiB buffers). Senders and receiver are threads of one process \
         on loopback. MB = 10^6 bytes of payload (frame headers not counted).",
    );
    for p in suite.points.iter().filter(|p| p.case == "frame_size") {
        let size = p.param("frame_bytes").and_then(Param::num).unwrap_or(0.0);
        if let (Some(r), Some(f)) = (p.metric("ratio_to_raw"), p.metric("frames_per_s"))
            && (size == 64.0 || size == 65536.0)
        {
            let note = if size == 64.0 {
                format!("target 64 B: ≥ 5 M frames/s on one connection — measured {}", crate::format::si(f.median))
            } else {
                format!("target 64 KiB: ≥ 80% of raw — measured {:.0}%", r.median * 100.0)
            };
            suite.notes.push(note);
        }
    }
    Ok(suite)
}

/// The metrics of one repetition: ours, and the raw reference `raw` (measured `again` while
/// it has a [flaw](super::raw::Reference::flaw)).
fn metrics(
    ours: &Moved,
    raw: (Moved, Duration),
    mut again: impl FnMut() -> anyhow::Result<(Moved, Duration)>,
) -> anyhow::Result<Metrics> {
    let reference = |(m, window): &(Moved, Duration)| super::raw::Reference {
        bytes: m.payload_bytes,
        seconds: m.seconds,
        window: window.as_secs_f64(),
    };
    let mut frames_per_byte = raw.0.frames as f64 / raw.0.payload_bytes.max(1) as f64;
    let settled = super::raw::settle(reference(&raw), ours.mb_per_s(), || {
        let r = again()?;
        frames_per_byte = r.0.frames as f64 / r.0.payload_bytes.max(1) as f64;
        Ok(reference(&r))
    })?;
    let m = Metrics::new()
        .with("frames_per_s", ours.frames_per_s())
        .with("mb_per_s", ours.mb_per_s())
        .with("raw_frames_per_s", settled.mb_per_s() * 1e6 * frames_per_byte);
    Ok(super::raw::with_ratio(m, "ratio_to_raw", ours.mb_per_s(), &settled)
        .with("frames_per_write", if ours.writes > 0 { ours.frames as f64 / ours.writes as f64 } else { 0.0 }))
}

fn plots(conn_sizes: &[usize]) -> Vec<Plot> {
    let s = |label: &str, case: &'static str, metric: &'static str, filter: Vec<(&'static str, Param)>| Series {
        label: label.into(),
        case,
        metric,
        filter,
    };
    let mut conn_series = Vec::new();
    for &size in conn_sizes {
        let b = crate::format::bytes(size as f64);
        conn_series.push(s(&format!("daqflow {b}"), "connections", "mb_per_s", vec![("frame_bytes", size.into())]));
        conn_series.push(s(&format!("raw {b}"), "connections", "raw_mb_per_s", vec![("frame_bytes", size.into())]));
    }
    vec![
        Plot {
            title: "one connection: throughput vs frame size".into(),
            x: "frame_bytes",
            x_label: "frame size (bytes)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "payload throughput (MB/s)".into(),
            y_log: true,
            series: vec![
                s("daqflow Connection", "frame_size", "mb_per_s", vec![]),
                s("raw blocking socket", "frame_size", "raw_mb_per_s", vec![]),
            ],
        },
        Plot {
            title: "one connection: frame rate vs frame size".into(),
            x: "frame_bytes",
            x_label: "frame size (bytes)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "frames per second".into(),
            y_log: true,
            series: vec![
                s("daqflow Connection", "frame_size", "frames_per_s", vec![]),
                s("raw (1 MiB writes)", "frame_size", "raw_frames_per_s", vec![]),
            ],
        },
        Plot {
            title: "connections into one receiver".into(),
            x: "connections",
            x_label: "connections (count)".into(),
            x_log: false,
            x_bytes: false,
            y_label: "payload throughput (MB/s)".into(),
            y_log: true,
            series: conn_series,
        },
        Plot {
            title: "daqflow relative to raw sockets".into(),
            x: "frame_bytes",
            x_label: "frame size (bytes)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "throughput ratio daqflow / raw".into(),
            y_log: false,
            series: vec![
                s("1 connection", "frame_size", "ratio_to_raw", vec![]),
                s("2 connections", "connections", "ratio_to_raw", vec![("connections", 2usize.into())]),
                s("4 connections", "connections", "ratio_to_raw", vec![("connections", 4usize.into())]),
            ],
        },
    ]
}

/// daqflow: `connections` senders pushing frames of `size` bytes as fast as they can into one
/// receiver for `duration`.
fn framed(size: usize, connections: usize, duration: Duration, driving: Driving) -> anyhow::Result<Moved> {
    let opts = ConnectionOptions::default();
    let listener = Listener::bind(localhost(), opts.clone())?;
    let addr = listener.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = (0..connections)
        .map(|_| {
            let stop = stop.clone();
            let opts = opts.clone();
            thread::spawn(move || -> anyhow::Result<(u64, u64)> {
                let mut c = Connection::connect(addr, &opts)?;
                let payload = Bytes::from(vec![0x5a; size]);
                let batch = ((1usize << 20) / size.max(1)).clamp(1, 1024);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..batch {
                        if size <= opts.copy_threshold_bytes {
                            c.send_slice(1, 0, n as u32, &payload)?;
                        } else {
                            c.send(Frame::new(1, payload.clone()).with_channel(n as u32))?;
                        }
                        n += 1;
                    }
                }
                c.close()?;
                Ok((n, c.send_stats().syscalls))
            })
        })
        .collect();
    let mut conns = Vec::new();
    for _ in 0..connections {
        let mut conn = listener.accept()?;
        conn.admit();
        conns.push(conn);
    }
    let mut moved = receive(&mut conns, driving, duration, &stop)?;
    let mut sent = 0;
    for s in senders {
        let (n, writes) = s.join().map_err(|_| anyhow::anyhow!("sender thread panicked"))??;
        sent += n;
        moved.writes += writes;
    }
    anyhow::ensure!(sent == moved.frames, "sent {sent} frames but received {}", moved.frames);
    Ok(moved)
}

fn receive(conns: &mut [Connection], driving: Driving, duration: Duration, stop: &AtomicBool) -> anyhow::Result<Moved> {
    let start = Instant::now();
    let mut first: Option<Instant> = None;
    let mut moved = Moved::default();
    let mut open = vec![true; conns.len()];
    let mut check = 0u32;
    let count = |moved: &mut Moved, f: &Frame, first: &mut Option<Instant>| {
        moved.frames += 1;
        moved.payload_bytes += f.payload.len() as u64;
        if first.is_none() {
            *first = Some(Instant::now());
        }
    };
    let end_of = |e: RecvError| -> anyhow::Result<()> { if e.is_clean_close() { Ok(()) } else { Err(e.into()) } };
    match driving {
        Driving::Thread => {
            anyhow::ensure!(conns.len() == 1, "a dedicated thread drives one connection");
            loop {
                match conns[0].recv() {
                    Ok(f) => count(&mut moved, &f, &mut first),
                    Err(e) => {
                        end_of(e)?;
                        break;
                    }
                }
                check += 1;
                if check & 1023 == 0 && start.elapsed() >= duration {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }
        Driving::Task => {
            let mut idle = 0u32;
            while open.iter().any(|&o| o) {
                let mut got = false;
                for (i, c) in conns.iter_mut().enumerate() {
                    if !open[i] {
                        continue;
                    }
                    // Take a bounded number per turn so that every connection is served.
                    for _ in 0..256 {
                        match c.try_recv() {
                            Ok(Some(f)) => {
                                count(&mut moved, &f, &mut first);
                                got = true;
                            }
                            Ok(None) => break,
                            Err(e) => {
                                end_of(e)?;
                                open[i] = false;
                                break;
                            }
                        }
                    }
                }
                if got {
                    idle = 0;
                } else {
                    idle += 1;
                    if idle < 64 {
                        std::hint::spin_loop();
                    } else {
                        let fds: Vec<_> =
                            conns.iter().zip(&open).filter(|(_, o)| **o).map(|(c, _)| c.as_fd()).collect();
                        wait_ready(&fds, libc_pollin(), Some(Duration::from_millis(1)))?;
                    }
                }
                check += 1;
                if check & 255 == 0 && start.elapsed() >= duration {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    moved.seconds = first.map_or(0.0, |f| f.elapsed().as_secs_f64()).max(1e-9);
    Ok(moved)
}

fn libc_pollin() -> i16 {
    // POLLIN is 1 on every Linux architecture.
    1
}

/// The reference: raw sockets moving messages of `size` bytes with no framing. Senders write
/// 1 MiB per call ([`super::raw::send_until`]); one receiving thread reads every socket,
/// [`super::raw::READ_BYTES`] at a time after the [`super::raw::WARMUP`]. What moved, and the window it was given.
fn raw(size: usize, connections: usize, duration: Duration) -> anyhow::Result<(Moved, Duration)> {
    let listener = TcpListener::bind(localhost()).context("raw reference: bind")?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = (0..connections)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                super::raw::send_until(TcpStream::connect(addr)?, size, || stop.load(Ordering::Relaxed))
            })
        })
        .collect();
    let mut socks = Vec::new();
    for _ in 0..connections {
        socks.push(listener.accept()?.0);
    }
    let start = Instant::now();
    let got = super::raw::receive_all(socks, || {
        if start.elapsed() >= duration + super::raw::WARMUP {
            stop.store(true, Ordering::Relaxed);
        }
    })?;
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        s.join().map_err(|_| anyhow::anyhow!("raw sender panicked"))??;
    }
    Ok((Moved { frames: got.bytes / size as u64, payload_bytes: got.bytes, seconds: got.seconds, writes: 0 }, duration))
}

fn localhost() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}
