//! What `daqflow bench evb --hosts N` and `daqflow bench chain --hosts 2` share: a set of test
//! hosts (network namespaces joined by a bridge, with an sshd each: [`daqflow::hosts`]), the
//! raw TCP reference between two of them, and running a `daqflow` command in a host to its end.
//!
//! The hosts are namespaces of this one machine: they share its cores and its memory bandwidth,
//! and their traffic crosses veth pairs and a software bridge, not a NIC. What these suites
//! measure is the software path across hosts (listeners on wildcards, addresses told to the
//! others, components started over ssh), not a network.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use daqflow::hosts::{Host, Hosts};

use super::dialog::RawReport;
use super::helper::{Helper, helper_args};

/// Makes `n` test hosts with an sshd each; why not, in words that say what to do.
pub(super) fn create(suite: &str, n: usize) -> anyhow::Result<Hosts> {
    let why = |e: daqflow::hosts::HostsError| {
        anyhow::anyhow!(
            "bench {suite} --hosts {n}: {e} (the hosts are network namespaces with an sshd each: run as root, with \
             iproute2 and OpenSSH installed)"
        )
    };
    daqflow::hosts::check_ssh().map_err(why)?;
    let mut hosts = Hosts::create(n).map_err(why)?;
    hosts.start_sshd().map_err(why)?;
    Ok(hosts)
}

/// The path of this binary, for running it in a host (`ip netns exec` and ssh need a path, not
/// `/proc/self/exe`).
pub(super) fn exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("finding the daqflow binary")
}

/// The raw reference across two hosts: a `raw-receiver` helper listening on `to`'s address, a
/// `raw-sender` in `from` writing `size`-byte messages (1 MiB per call) to it for `seconds`;
/// what the receiver read from its first byte to its last.
pub(super) fn raw(from: &Host, to: &Host, size: usize, seconds: f64) -> anyhow::Result<super::raw::Reference> {
    let exe = exe()?;
    let mut receiver = to.command(&exe);
    let listen = format!("{}:0", to.addr());
    receiver.args(helper_args(&["raw-receiver", "--connections", "1", "--listen", &listen]));
    let mut receiver = Helper::spawn_command(receiver)?;
    let addr = receiver.listening(&format!("raw receiver in {}", to.addr()))?;
    let mut sender = from.command(&exe);
    // The sender runs the receiver's warm-up longer than the window.
    let (size_text, seconds_text) = (size.to_string(), (seconds + super::raw::WARMUP.as_secs_f64()).to_string());
    sender.args(helper_args(&["raw-sender", "--connect", &addr, "--size", &size_text, "--seconds", &seconds_text]));
    let mut sender = Helper::spawn_command(sender)?;
    let wait = Duration::from_secs_f64(seconds + 60.0);
    let _: serde_json::Value = sender.json(wait).context("raw sender")?;
    let got: RawReport = receiver.json(wait).context("raw receiver")?;
    if got.bytes == 0 {
        bail!("raw reference {} → {}: no byte arrived", from.addr(), to.addr());
    }
    Ok(super::raw::Reference { bytes: got.bytes, seconds: got.seconds, window: seconds })
}

/// What a command run to its end wrote.
pub(super) struct Output {
    /// Its exit status.
    pub status: std::process::ExitStatus,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// Runs `cmd` (e.g. `Host::command`) to its end, killed after `limit`: what it wrote.
pub(super) fn output_within(mut cmd: Command, limit: Duration) -> anyhow::Result<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let collect = |stream: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut s) = stream {
                let _ = s.read_to_string(&mut text);
            }
            text
        })
    };
    let out = collect(child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let err = collect(child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let status = match daqflow::hosts::wait_timeout(&mut child, limit)? {
        Some(s) => s,
        None => {
            // Its own children may hold the pipes open: the readers are left to end with them.
            let _ = child.kill();
            let _ = child.wait();
            bail!("it did not end within {limit:?}");
        }
    };
    let stdout = out.join().map_err(|_| anyhow::anyhow!("reading its output"))?;
    let stderr = err.join().map_err(|_| anyhow::anyhow!("reading its errors"))?;
    Ok(Output { status, stdout, stderr })
}
