//! `daqflow bench dialog`: the DIALOG paper's figures 9 and 10.
//!
//! 25 sender processes each provide one service and publish it as fast as they can; one
//! subscriber process receives them all and counts messages per second and MB/s. Every message
//! carries the sender's own sequence number, so the subscriber counts lost and out-of-order
//! messages. The reference, in the same run: the same 25 → 1 pattern over raw TCP sockets, the
//! senders writing 1 MiB per call, the receiver reading 4 MiB at a time after a 0.1 s warm-up. Every
//! process is a child of this one (`daqflow bench-helper …`), and each reports its peak RSS.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use daqflow_dialog::{Dialog, DialogConfig, ServiceEvent, parse_control_addrs};
use serde::{Deserialize, Serialize};

use super::harness::{BenchConfig, Metrics, Plot, Series, Suite};
use super::helper::{Helper, HelperRole, helper_args, peak_rss_mb};

#[derive(Debug, Serialize, Deserialize, Default)]
struct SenderReport {
    sent: u64,
    peak_rss_mb: f64,
}

#[derive(Debug, Serialize, Deserialize, Default)]
struct SubscriberReport {
    msgs: u64,
    bytes: u64,
    seconds: f64,
    lost: u64,
    out_of_order: u64,
    peak_rss_mb: f64,
}

/// What the `raw-receiver` helper read.
#[derive(Debug, Serialize, Deserialize, Default)]
pub(super) struct RawReport {
    pub(super) bytes: u64,
    pub(super) seconds: f64,
    pub(super) peak_rss_mb: f64,
}

fn helper_config(name: String, control: &str, threads: usize) -> anyhow::Result<DialogConfig> {
    let mut c = DialogConfig::new(name, parse_control_addrs(control)?);
    c.worker_threads = threads;
    Ok(c)
}

/// Runs a dialog helper role; prints its JSON report on stdout.
pub fn run_helper(role: &HelperRole) -> anyhow::Result<()> {
    match role {
        HelperRole::DialogSender { control, prefix, index, size, seconds } => {
            let dialog = Dialog::start(helper_config(format!("bench-sender-{index:02}"), control, 1)?)?;
            let svc = dialog.provide(&format!("{prefix}/sender-{index:02}"))?;
            let go = Arc::new(AtomicBool::new(false));
            let g = go.clone();
            let _cmd = dialog.register_command(&format!("{prefix}/go"), move |_| g.store(true, Ordering::Release))?;
            let deadline = Instant::now() + Duration::from_secs(60);
            while svc.subscriber_count() == 0 {
                anyhow::ensure!(Instant::now() < deadline, "no subscriber");
                std::thread::sleep(Duration::from_millis(5));
            }
            println!("ready");
            std::io::stdout().flush()?;
            while !go.load(Ordering::Acquire) {
                anyhow::ensure!(Instant::now() < deadline, "no go");
                std::thread::sleep(Duration::from_millis(1));
            }
            // The same bytes every time, written from this memory (as the raw reference does);
            // each update carries dialog's sequence number, which the subscriber checks.
            let mut msg = vec![0x5au8; (*size).max(4)];
            msg[..4].copy_from_slice(&(*index as u32).to_le_bytes());
            let msg = bytes::Bytes::from(msg);
            let stop = Instant::now() + Duration::from_secs_f64(*seconds);
            let mut sent = 0u64;
            loop {
                for _ in 0..64 {
                    svc.update_bytes(msg.clone())?;
                    sent += 1;
                }
                if Instant::now() >= stop {
                    break;
                }
            }
            drop(svc);
            dialog.shutdown();
            println!("{}", serde_json::to_string(&SenderReport { sent, peak_rss_mb: peak_rss_mb() })?);
        }
        HelperRole::DialogSubscriber { control, prefix, senders } => {
            let dialog = Dialog::start(helper_config("bench-subscriber".into(), control, 2)?)?;
            // One set of counters per sender, each on its own cache line: the handlers of
            // different subscriptions run on different threads.
            #[repr(align(64))]
            #[derive(Default)]
            struct Counters {
                msgs: AtomicU64,
                bytes: AtomicU64,
                lost: AtomicU64,
                disorder: AtomicU64,
            }
            let counters: Vec<Arc<Counters>> = (0..*senders).map(|_| Arc::default()).collect();
            let first = Arc::new(std::sync::Mutex::new(None::<Instant>));
            let last = Arc::new(std::sync::Mutex::new(Instant::now()));
            let mut subs = Vec::new();
            for (i, c) in counters.iter().enumerate() {
                let (c, first, last) = (c.clone(), first.clone(), last.clone());
                // Dialog numbers a service's updates 1, 2, 3…: a gap is a lost message, a step
                // back one out of order. The data names its sender: a mix-up counts as lost.
                let mut expected = 1u64;
                let me = (i as u32).to_le_bytes();
                subs.push(dialog.subscribe(&format!("{prefix}/sender-{i:02}"), move |e| {
                    if let ServiceEvent::Update { data, seq, .. } = e {
                        if data.get(..4) != Some(&me[..]) {
                            c.lost.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                        if seq > expected {
                            c.lost.fetch_add(seq - expected, Ordering::Relaxed);
                        } else if seq < expected {
                            c.disorder.fetch_add(1, Ordering::Relaxed);
                        }
                        expected = expected.max(seq + 1);
                        let n = c.msgs.fetch_add(1, Ordering::Relaxed);
                        c.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                        if n & 255 == 0 {
                            let now = Instant::now();
                            first.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(now);
                            *last.lock().unwrap_or_else(|p| p.into_inner()) = now;
                        }
                    }
                })?);
            }
            let total =
                |f: fn(&Counters) -> &AtomicU64| counters.iter().map(|c| f(c).load(Ordering::Relaxed)).sum::<u64>();
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let _cmd = dialog.register_command(&format!("{prefix}/stop"), move |_| s.store(true, Ordering::Release))?;
            println!("ready");
            std::io::stdout().flush()?;
            let deadline = Instant::now() + Duration::from_secs(600);
            while !stop.load(Ordering::Acquire) {
                anyhow::ensure!(Instant::now() < deadline, "no stop");
                std::thread::sleep(Duration::from_millis(10));
            }
            // Wait until what is in flight has arrived.
            let mut seen = total(|c| &c.msgs);
            loop {
                std::thread::sleep(Duration::from_millis(300));
                let now = total(|c| &c.msgs);
                if now == seen {
                    break;
                }
                seen = now;
            }
            let f = first.lock().unwrap_or_else(|p| p.into_inner()).unwrap_or_else(Instant::now);
            let l = *last.lock().unwrap_or_else(|p| p.into_inner());
            let report = SubscriberReport {
                msgs: total(|c| &c.msgs),
                bytes: total(|c| &c.bytes),
                seconds: (l - f).as_secs_f64().max(1e-6),
                lost: total(|c| &c.lost),
                out_of_order: total(|c| &c.disorder),
                peak_rss_mb: peak_rss_mb(),
            };
            println!("{}", serde_json::to_string(&report)?);
            drop(subs);
        }
        HelperRole::RawSender { connect, size, seconds } => {
            let stop = Instant::now() + Duration::from_secs_f64(*seconds);
            super::raw::send_until(TcpStream::connect(connect)?, *size, || Instant::now() >= stop)?;
            println!("{}", serde_json::to_string(&SenderReport { sent: 0, peak_rss_mb: peak_rss_mb() })?);
        }
        HelperRole::RawReceiver { connections, listen } => {
            let listener = TcpListener::bind(listen)?;
            println!("listening on {}", listener.local_addr()?);
            std::io::stdout().flush()?;
            let mut socks = Vec::new();
            for _ in 0..*connections {
                socks.push(listener.accept()?.0);
            }
            let got = super::raw::receive_all(socks, || {})?;
            println!(
                "{}",
                serde_json::to_string(&RawReport {
                    bytes: got.bytes,
                    seconds: got.seconds,
                    peak_rss_mb: peak_rss_mb()
                })?
            );
        }
        other => anyhow::bail!("not a dialog helper: {other:?}"),
    }
    Ok(())
}

struct Measured {
    msgs_per_s: f64,
    mb_per_s: f64,
    lost: u64,
    out_of_order: u64,
    peak_rss_mb: f64,
}

/// Sends command `name` until it reaches `want` processes. Each registered it before saying it
/// was ready, but a registration travels to the control server on its own: on a loaded machine
/// the command can come before it. A second delivery changes nothing (`go` and `stop` set a
/// flag); more than `want` processes, or 30 s, is an error.
fn send_until_reached(me: &Dialog, name: &str, want: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = me.send_command(name, b"")? as usize;
        anyhow::ensure!(n <= want, "{name} reached {n} processes, more than the {want} expected");
        if n == want {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{name} reached {n} of {want} processes in 30 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One measurement over dialog: a control server, one subscriber, `senders` senders.
fn dialog_point(control: &str, senders: usize, size: usize, seconds: f64) -> anyhow::Result<Measured> {
    // Names of this point's own: the services, `go` and `stop` of an earlier point's helpers,
    // which the control server may still list while they leave, are never this point's.
    static POINTS: AtomicU64 = AtomicU64::new(0);
    let prefix = format!("bench/{}-{}", std::process::id(), POINTS.fetch_add(1, Ordering::Relaxed));
    let mut sub = Helper::spawn(&helper_args(&[
        "dialog-subscriber",
        "--control",
        control,
        "--prefix",
        &prefix,
        "--senders",
        &senders.to_string(),
    ]))?;
    let wait = Duration::from_secs(60);
    if sub.line(wait)? != "ready" {
        bail!("subscriber did not start");
    }
    let mut procs = Vec::new();
    for i in 0..senders {
        procs.push(Helper::spawn(&helper_args(&[
            "dialog-sender",
            "--control",
            control,
            "--prefix",
            &prefix,
            "--index",
            &i.to_string(),
            "--size",
            &size.to_string(),
            "--seconds",
            &(seconds + super::raw::WARMUP.as_secs_f64()).to_string(),
        ]))?);
    }
    for p in &procs {
        if p.line(wait)? != "ready" {
            bail!("a sender did not start");
        }
    }
    let me = Dialog::start(helper_config(format!("bench-driver-{}", std::process::id()), control, 1)?)?;
    send_until_reached(&me, &format!("{prefix}/go"), senders)?;
    let mut peak = 0f64;
    let mut sent = 0u64;
    for p in &mut procs {
        let r: SenderReport = p.json(Duration::from_secs_f64(seconds + 60.0))?;
        sent += r.sent;
        peak = peak.max(r.peak_rss_mb);
    }
    send_until_reached(&me, &format!("{prefix}/stop"), 1)?;
    let r: SubscriberReport = sub.json(Duration::from_secs(60))?;
    peak = peak.max(r.peak_rss_mb);
    anyhow::ensure!(r.msgs + r.lost == sent, "sent {sent}, received {} and {} lost", r.msgs, r.lost);
    Ok(Measured {
        msgs_per_s: r.msgs as f64 / r.seconds,
        mb_per_s: r.bytes as f64 / r.seconds / 1e6,
        lost: r.lost,
        out_of_order: r.out_of_order,
        peak_rss_mb: peak,
    })
}

/// The reference: the same pattern over raw TCP.
/// The raw reference of one point: what the receiver read, and the largest peak RSS (MB).
fn raw_point(senders: usize, size: usize, seconds: f64) -> anyhow::Result<(super::raw::Reference, f64)> {
    let mut recv = Helper::spawn(&helper_args(&["raw-receiver", "--connections", &senders.to_string()]))?;
    let addr = recv.listening("raw receiver")?;
    let mut procs = Vec::new();
    for _ in 0..senders {
        procs.push(Helper::spawn(&helper_args(&[
            "raw-sender",
            "--connect",
            &addr,
            "--size",
            &size.to_string(),
            "--seconds",
            &(seconds + super::raw::WARMUP.as_secs_f64()).to_string(),
        ]))?);
    }
    let mut peak = 0f64;
    for p in &mut procs {
        let r: SenderReport = p.json(Duration::from_secs_f64(seconds + 60.0))?;
        peak = peak.max(r.peak_rss_mb);
    }
    let r: RawReport = recv.json(Duration::from_secs(60))?;
    Ok((super::raw::Reference { bytes: r.bytes, seconds: r.seconds, window: seconds }, peak.max(r.peak_rss_mb)))
}

/// Options of the dialog suite.
#[derive(Debug, Clone)]
pub struct DialogOptions {
    /// Sender processes.
    pub senders: usize,
    /// Message sizes.
    pub sizes: Vec<usize>,
}

pub fn run(config: BenchConfig, opts: DialogOptions) -> anyhow::Result<Suite> {
    let mut suite = Suite::new(
        "dialog",
        format!("{} sender processes → 1 subscriber process (DIALOG figs. 9 and 10)", opts.senders),
        config.clone(),
    );
    let seconds = config.measure_time.as_secs_f64();
    let cs = Helper::spawn(&["control-server".into(), "--listen".into(), "127.0.0.1:0".into()])?;
    let control = cs.listening("control server")?;
    for &size in &opts.sizes {
        suite.measure("senders", vec![("senders", opts.senders.into()), ("msg_bytes", size.into())], || {
            let (raw, mut raw_rss) = raw_point(opts.senders, size, seconds)?;
            let d = dialog_point(&control, opts.senders, size, seconds)?;
            let raw = super::raw::settle(raw, d.mb_per_s, || {
                let (r, rss) = raw_point(opts.senders, size, seconds)?;
                raw_rss = raw_rss.max(rss);
                Ok(r)
            })?;
            let m = Metrics::new()
                .with("msgs_per_s", d.msgs_per_s)
                .with("mb_per_s", d.mb_per_s)
                .with("lost_msgs", d.lost as f64)
                .with("out_of_order_msgs", d.out_of_order as f64)
                .with("peak_rss_mb", d.peak_rss_mb)
                .with("raw_msgs_per_s", raw.bytes as f64 / size as f64 / raw.seconds.max(1e-9))
                .with("raw_peak_rss_mb", raw_rss);
            Ok(super::raw::with_ratio(m, "ratio_to_raw", d.mb_per_s, &raw))
        })?;
    }
    drop(cs);
    let s = |label: &str, metric: &'static str| Series { label: label.into(), case: "senders", metric, filter: vec![] };
    suite.plots = vec![
        Plot {
            title: "messages received per second (fig. 9)".into(),
            x: "msg_bytes",
            x_label: "message size (bytes)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "messages per second into one process".into(),
            y_log: true,
            series: vec![s("daqflow dialog", "msgs_per_s"), s("raw TCP, 1 MiB writes", "raw_msgs_per_s")],
        },
        Plot {
            title: "data flow into one process (fig. 10)".into(),
            x: "msg_bytes",
            x_label: "message size (bytes)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "throughput (MB/s)".into(),
            y_log: true,
            series: vec![s("daqflow dialog", "mb_per_s"), s("raw TCP, 1 MiB writes", "raw_mb_per_s")],
        },
        Plot {
            title: "largest process's peak memory".into(),
            x: "msg_bytes",
            x_label: "message size (bytes)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "peak RSS (MB)".into(),
            y_log: false,
            series: vec![s("daqflow dialog", "peak_rss_mb"), s("raw TCP", "raw_peak_rss_mb")],
        },
    ];
    suite.note(super::machine_note());
    suite.note(format!(
        "{} sender processes and one subscriber process (a dialog client each, with a control server process), \
         senders publishing the same value as fast as they can for {seconds} s (update_bytes: written from the sender's \
         memory, as raw TCP does); the subscriber checks every update's sequence number (gaps: lost_msgs, regressions: \
         out_of_order_msgs) and that the data names its sender. Reference: the same processes over raw TCP, 1 MiB \
         written per call, one receiving thread reading 4 MiB at a time, counted after a 0.1 s warm-up. MB = 10^6 bytes.",
        opts.senders
    ));
    suite.note(
        "for scale (this machine type, same 25 → 1 pattern, from the issue): DIM v20r30 271k/246k/126k msgs/s at \
         16 B/128 B/1 KiB, 2.1 GB/s at 100 KiB; ZeroMQ 4.3.4 PUSH/PULL 3.4M/2.2M/690k, 1.76 GB/s at 100 KiB; \
         NATS 1.1M/0.93M/0.40M; iperf3 loopback 3.5 GB/s.",
    );
    Ok(suite)
}
