//! The child processes benchmark suites start (`daqflow bench-helper ROLE`), and the
//! driver's handle on them.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

/// Hidden helper roles, run as child processes by the suites.
#[derive(clap::Subcommand, Debug)]
pub enum HelperRole {
    /// Provide `PREFIX/sender-INDEX` and publish as fast as possible after `PREFIX/go`.
    DialogSender {
        #[arg(long)]
        control: String,
        /// The point's own name space (a point's helpers never meet an earlier point's).
        #[arg(long, default_value = "bench")]
        prefix: String,
        #[arg(long)]
        index: usize,
        #[arg(long)]
        size: usize,
        #[arg(long)]
        seconds: f64,
    },
    /// Subscribe to `PREFIX/sender-0..SENDERS` and count; report after `PREFIX/stop`.
    DialogSubscriber {
        #[arg(long)]
        control: String,
        /// The point's own name space.
        #[arg(long, default_value = "bench")]
        prefix: String,
        #[arg(long)]
        senders: usize,
    },
    /// Write messages on a raw TCP connection for SECONDS.
    RawSender {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long)]
        size: usize,
        #[arg(long)]
        seconds: f64,
    },
    /// Accept CONNECTIONS raw TCP connections on ADDR and count bytes until all close.
    RawReceiver {
        #[arg(long)]
        connections: usize,
        /// Where to listen (an address of a test host, in `bench --hosts`).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
    /// Connect to every OUTPUT, accept INPUTS raw TCP connections on 127.0.0.1 and relay whole
    /// events of SIZE-byte messages until an input ends; report the bytes forwarded.
    RawRelay {
        #[arg(long)]
        inputs: usize,
        #[arg(long)]
        size: usize,
        #[arg(long = "connect")]
        outputs: Vec<SocketAddr>,
    },
    /// Spin on one CPU, doing nothing useful, for SECONDS at most (until killed, normally): the
    /// competing load of `bench evb`'s contention case.
    Busy {
        #[arg(long)]
        seconds: f64,
    },
    /// Produce into an ET system for SECONDS; report the count.
    EtProducer(super::et::ProducerArgs),
    /// Consume from an ET station until the flow stops; report the count and the window.
    EtConsumer(super::et::ConsumerArgs),
    /// Run a `recorder` component on an ET system until the flow stops; report the count and
    /// the window.
    EtRecorder(super::et::RecorderArgs),
}

/// Runs a helper role; prints its JSON report on stdout.
pub fn run_helper(role: &HelperRole) -> anyhow::Result<()> {
    match role {
        HelperRole::EtProducer(a) => super::et::producer(a),
        HelperRole::EtConsumer(a) => super::et::consumer(a),
        HelperRole::EtRecorder(a) => super::et::recorder(a),
        HelperRole::RawRelay { inputs, size, outputs } => super::relay::helper(*inputs, *size, outputs),
        HelperRole::Busy { seconds } => {
            busy(Duration::from_secs_f64(*seconds));
            Ok(())
        }
        _ => super::dialog::run_helper(role),
    }
}

/// Spins for `limit` at most, touching nothing but its own registers and checking the clock
/// every few million iterations: a process that wants a whole CPU and never yields it.
pub fn busy(limit: Duration) {
    let end = std::time::Instant::now() + limit;
    let mut x = 1u64;
    while std::time::Instant::now() < end {
        for _ in 0..(1 << 22) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

/// Peak resident set of this process, MB (VmHWM).
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// A child process whose stdout lines we read.
pub struct Helper {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Helper {
    /// `daqflow ARGS`, a child of this process.
    pub fn spawn(args: &[String]) -> anyhow::Result<Helper> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(args);
        Helper::spawn_command(cmd)
    }

    /// `cmd` (a `daqflow` command, maybe run in a test host: `Host::command`), its standard
    /// output read line by line.
    pub fn spawn_command(mut cmd: Command) -> anyhow::Result<Helper> {
        let mut child = cmd
            .env("DAQFLOW_LOG", std::env::var("DAQFLOW_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting a benchmark process")?;
        let out = child.stdout.take().context("helper stdout")?;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Ok(Helper { child, lines })
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn line(&self, timeout: Duration) -> anyhow::Result<String> {
        self.lines.recv_timeout(timeout).context("a benchmark process did not answer in time (see its errors above)")
    }

    /// The address a helper that listens says it listens on (`listening on ADDR`, its first
    /// line); what it said instead, as an error naming `what`.
    pub fn listening(&self, what: &str) -> anyhow::Result<String> {
        let line = self.line(Duration::from_secs(30))?;
        match line.strip_prefix("listening on ") {
            Some(addr) => Ok(addr.trim().to_string()),
            None => anyhow::bail!("{what} said `{line}`, not `listening on ADDR`"),
        }
    }

    pub fn json<T: for<'de> Deserialize<'de>>(&mut self, timeout: Duration) -> anyhow::Result<T> {
        let line = self.line(timeout)?;
        let v = serde_json::from_str(&line).with_context(|| format!("benchmark process said: {line}"))?;
        let _ = self.child.wait();
        Ok(v)
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn helper_args(role: &[&str]) -> Vec<String> {
    std::iter::once("bench-helper").chain(role.iter().copied()).map(String::from).collect()
}
