//! The control servers a system's operator starts: each a `daqflow control-server` process of
//! its own, the primary and any spares (`system.control = "PRIMARY[,SPARE…]"`). Every process
//! of the system is given all their addresses and uses the first that answers, moving to the
//! next when its server dies (`docs/dialog.md`). A control server that dies is started again on
//! its address by a thread of this module, which is also the thread that started it (so that a
//! server's parent-death signal fires only when the operator ends): at once when it was the
//! only one, else after the processes have moved to a spare ([`SPARE_SETTLE`]), so that they
//! never end up split between two directories. For the same reason each server of several
//! ends by itself when it finds that it did not run for about as long as its processes wait
//! for it (`--end-after-stall`: they have moved to another meanwhile), and is started again.
//! And when the processes end up split anyway (a network partition that healed), the server
//! serving fewer ends (`--siblings`: each asks the others every second), and is started again.
//!
//! A server whose address is not one of this host's is started on the host of that address
//! with `remote_command` (ssh by default), as a remote component is: the token on its standard
//! input, which stays open; a line every second keeps its lease (`--lease`, the system's
//! `lease_s`), so that it ends when the operator, its host or the network to it is gone.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::children::Detach;

/// How long a dead control server stays down while another is alive: twice the time after
/// which a process that hears nothing from its server looks for another (3 s).
pub(crate) const SPARE_SETTLE: Duration = Duration::from_secs(6);

/// How to start a control server.
#[derive(Debug, Clone)]
pub(crate) struct ServerLaunch {
    /// The `daqflow` binary.
    pub binary: PathBuf,
    /// The system token's file.
    pub token_file: PathBuf,
    /// Where the servers' output goes (`control-server-N.log`).
    pub logs: PathBuf,
    /// How to run `daqflow` on another host (`system.remote_command`, `{host}` in it).
    pub remote: String,
    /// The system token, for a server on another host (on its standard input).
    pub token: daqflow_transport::auth::Token,
    /// The lease of a server on another host: it ends when it hears nothing from the operator
    /// for this long.
    pub lease_s: f64,
}

/// Whether `ip` is an address of this host (a control server on it is started here; on any
/// other, on that host with `remote_command`).
pub(crate) fn is_local(ip: std::net::IpAddr) -> bool {
    ip.is_loopback() || ip.is_unspecified() || std::net::TcpListener::bind((ip, 0)).is_ok()
}

/// The command line of the control server on `listen`: `daqflow control-server …` here, or
/// `remote_command` on the host of `listen` with `--token-stdin --lease`; and whether the
/// token goes to its standard input.
fn server_command(
    launch: &ServerLaunch,
    listen: SocketAddr,
    several: bool,
    siblings: &[SocketAddr],
) -> (Vec<String>, bool) {
    let remote = !is_local(listen.ip());
    let mut argv: Vec<String> = if remote {
        launch.remote.replace("{host}", &listen.ip().to_string()).split_whitespace().map(str::to_owned).collect()
    } else {
        // Named by the path it stands for (logs and `ps`), never `/proc/self/exe`.
        let shown = crate::children::shown_binary(&launch.binary);
        vec![shown, "--token-file".into(), launch.token_file.display().to_string()]
    };
    argv.extend(["control-server".to_owned(), "--listen".to_owned(), listen.to_string()]);
    if several {
        argv.push("--end-after-stall".into());
    }
    if !siblings.is_empty() {
        argv.push("--siblings".into());
        argv.push(siblings.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(","));
    }
    if remote {
        argv.extend(["--token-stdin".to_owned(), "--lease".to_owned(), launch.lease_s.to_string()]);
    }
    (argv, remote)
}

/// The running control servers.
pub(crate) struct ControlServers {
    addrs: Vec<SocketAddr>,
    pids: Arc<Mutex<Vec<u32>>>,
    restarts: Arc<Mutex<u64>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Parses `PRIMARY[,SPARE…]`.
pub(crate) fn parse_list(text: &str) -> Result<Vec<SocketAddr>, String> {
    let addrs: Result<Vec<SocketAddr>, String> = text
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<SocketAddr>().map_err(|e| format!("{p:?}: {e}")))
        .collect();
    let addrs = addrs?;
    if addrs.is_empty() {
        return Err("no address".into());
    }
    Ok(addrs)
}

impl ControlServers {
    /// Starts one control server per address of `listen` and waits until each listens.
    pub(crate) fn start(listen: Vec<SocketAddr>, launch: ServerLaunch) -> Result<ControlServers, String> {
        let (ready_tx, ready_rx) = channel::<Result<Vec<(SocketAddr, u32)>, String>>();
        let stop = Arc::new(AtomicBool::new(false));
        let pids = Arc::new(Mutex::new(Vec::new()));
        let restarts = Arc::new(Mutex::new(0));
        let (stop2, pids2, restarts2) = (stop.clone(), pids.clone(), restarts.clone());
        let thread = std::thread::Builder::new()
            .name("control-servers".into())
            .spawn(move || supervise(listen, launch, ready_tx, stop2, pids2, restarts2))
            .map_err(|e| e.to_string())?;
        let started = ready_rx.recv().map_err(|_| "the control-server thread ended".to_owned())??;
        let addrs = started.iter().map(|(a, _)| *a).collect();
        Ok(ControlServers { addrs, pids, restarts, stop, thread: Some(thread) })
    }

    /// Their addresses, the primary first.
    pub(crate) fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Their addresses as the `--control` argument of a process: `A,B,…`.
    pub(crate) fn list(&self) -> String {
        self.addrs.iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(",")
    }

    /// The process ids of the servers now (in the order of their addresses).
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.pids.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many times a dead server was started again.
    pub(crate) fn restarts(&self) -> u64 {
        *self.restarts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the servers (SIGTERM, then SIGKILL after 5 s).
    pub(crate) fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ControlServers {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts a control server on `listen`; its child and the address it listens on. One of
/// `several` ends by itself when it finds it did not run for about as long as its processes
/// wait for it (`--end-after-stall`): they have moved to another, and it must not serve a
/// second directory; it is then started again like any dead one.
fn spawn_server(
    launch: &ServerLaunch,
    listen: SocketAddr,
    index: usize,
    several: bool,
    siblings: &[SocketAddr],
) -> Result<(Child, SocketAddr), String> {
    let log_path = launch.logs.join(format!("control-server-{index}.log"));
    let log_from = crate::first_error::log_length(&log_path);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let (argv, token_stdin) = server_command(launch, listen, several, siblings);
    let mut cmd = if token_stdin { Command::new(&argv[0]) } else { Command::new(&launch.binary) };
    cmd.args(&argv[1..])
        .stdin(if token_stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(log);
    // Kept from the terminal (its signals reach only the operator): the operator's own binary in
    // a process group of its own, a remote command (ssh) in a session of its own; SIGTERM when
    // this thread (the operator's control-server thread, as long-lived as the operator) ends.
    let detach = if token_stdin { Detach::Session } else { Detach::ProcessGroup };
    crate::children::detached_ending_with_parent(&mut cmd, detach);
    let mut child = cmd.spawn().map_err(|e| format!("starting {}: {e}", argv[0]))?;
    if let Some(pipe) = child.stdin.as_mut() {
        use std::io::Write;
        // The token's line; the pipe stays open (the server's lease: a line every second).
        let line = [launch.token.as_bytes(), b"\n"].concat();
        if let Err(e) = pipe.write_all(&line).and_then(|()| pipe.flush()) {
            tracing::warn!(%listen, "giving the control server the system token on its standard input: {e}");
        }
    }
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(l)) = lines.next() {
            let _ = tx.send(l);
        }
        // Keep reading so that the server never blocks on a full pipe.
        for _ in lines {}
    });
    let line = rx.recv_timeout(Duration::from_secs(20)).map_err(|_| {
        let _ = child.kill();
        let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
        did_not_start(listen, &status, crate::first_error::first_error_line(&log_path, log_from), &log_path)
    })?;
    let addr = line
        .strip_prefix("listening on ")
        .and_then(|a| a.trim().parse::<SocketAddr>().ok())
        .ok_or_else(|| format!("the control server on {listen} said {line:?}"))?;
    tracing::info!(%addr, pid = child.id(), "control server started: {}", argv.join(" "));
    Ok((child, addr))
}

/// Why a control server did not start: how it ended, its first error line, and for an address
/// in use what to do about it.
fn did_not_start(listen: SocketAddr, status: &str, first_error: Option<String>, log: &std::path::Path) -> String {
    let Some(error) = first_error else {
        return format!("the control server on {listen} did not start ({status}); see {}", log.display());
    };
    if error.contains("in use") {
        format!(
            "the control server cannot listen on {listen}: the address is in use (another operator or control \
             server of this system still running? `ss -ltnp 'sport = :{}'` names the process); stop it, or give \
             `control` another port (port 0: any free one)",
            listen.port()
        )
    } else {
        format!("the control server on {listen} did not start ({status}): {error}; see {}", log.display())
    }
}

fn supervise(
    listen: Vec<SocketAddr>,
    launch: ServerLaunch,
    ready: Sender<Result<Vec<(SocketAddr, u32)>, String>>,
    stop: Arc<AtomicBool>,
    pids: Arc<Mutex<Vec<u32>>>,
    restarts: Arc<Mutex<u64>>,
) {
    // Each server's siblings: the others with a fixed port (port 0 is known only once bound).
    let siblings = |i: usize| -> Vec<SocketAddr> {
        listen.iter().enumerate().filter(|&(j, a)| j != i && a.port() != 0).map(|(_, a)| *a).collect()
    };
    let mut servers: Vec<(SocketAddr, Child)> = Vec::new();
    for (i, &addr) in listen.iter().enumerate() {
        match spawn_server(&launch, addr, i, listen.len() > 1, &siblings(i)) {
            Ok((child, bound)) => servers.push((bound, child)),
            Err(e) => {
                for (_, mut c) in servers {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                let _ = ready.send(Err(e));
                return;
            }
        }
    }
    *pids.lock().unwrap_or_else(|p| p.into_inner()) = servers.iter().map(|(_, c)| c.id()).collect();
    let _ = ready.send(Ok(servers.iter().map(|(a, c)| (*a, c.id())).collect()));
    let (_never, idle): (Sender<()>, Receiver<()>) = channel();
    // When each server was seen dead (None: alive).
    let mut dead_since: Vec<Option<Instant>> = vec![None; servers.len()];
    let mut last_ping = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now.duration_since(last_ping) >= Duration::from_secs(1) {
            // The lease of the servers on other hosts: a line every second.
            last_ping = now;
            for (_, child) in servers.iter_mut() {
                if let Some(pipe) = child.stdin.as_mut() {
                    use std::io::Write;
                    let _ = pipe.write_all(b"\n").and_then(|()| pipe.flush());
                }
            }
        }
        for (i, (addr, child)) in servers.iter_mut().enumerate() {
            if dead_since[i].is_none()
                && let Ok(Some(status)) = child.try_wait()
            {
                tracing::error!(%addr, "the control server died ({status})");
                dead_since[i] = Some(now);
            }
        }
        let alive = dead_since.iter().filter(|d| d.is_none()).count();
        for (i, (addr, child)) in servers.iter_mut().enumerate() {
            let Some(since) = dead_since[i] else { continue };
            // With another server alive, every process moves there first (at once when its
            // connection closes, within a heartbeat check otherwise): starting this one again
            // sooner could split them between two directories.
            if alive > 0 && now.duration_since(since) < SPARE_SETTLE {
                continue;
            }
            match spawn_server(&launch, *addr, i, listen.len() > 1, &siblings(i)) {
                Ok((c, _)) => {
                    *child = c;
                    dead_since[i] = None;
                    *restarts.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                }
                Err(e) => tracing::warn!(%addr, "starting the control server again: {e}; trying again"),
            }
        }
        *pids.lock().unwrap_or_else(|p| p.into_inner()) = servers.iter().map(|(_, c)| c.id()).collect();
        let _ = idle.recv_timeout(Duration::from_millis(200));
    }
    for (_, c) in &servers {
        // SAFETY: kill(2) with the pid of our own child, not reaped yet (we hold its `Child`).
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for (addr, c) in &mut servers {
        loop {
            match c.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    tracing::warn!(%addr, "the control server did not end on SIGTERM; killing it");
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> ServerLaunch {
        ServerLaunch {
            binary: "/opt/daqflow".into(),
            token_file: "/data/token".into(),
            logs: "/data/logs".into(),
            remote: "ssh -i /k {host} /usr/bin/daqflow".into(),
            token: daqflow_transport::auth::Token::new("secret-token-0123").unwrap(),
            lease_s: 7.5,
        }
    }

    #[test]
    fn a_server_on_another_host_is_started_there_with_the_token_on_its_input_and_knows_its_siblings() {
        // 192.0.2.1 (TEST-NET-1) is no address of this host.
        let spare: SocketAddr = "192.0.2.1:7001".parse().unwrap();
        let primary: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        assert!(is_local(primary.ip()) && !is_local(spare.ip()));
        let (argv, token_stdin) = server_command(&launch(), spare, true, &[primary]);
        assert!(token_stdin);
        assert_eq!(
            argv.join(" "),
            "ssh -i /k 192.0.2.1 /usr/bin/daqflow control-server --listen 192.0.2.1:7001 --end-after-stall \
             --siblings 127.0.0.1:7000 --token-stdin --lease 7.5"
        );
        let (argv, token_stdin) = server_command(&launch(), primary, true, &[spare]);
        assert!(!token_stdin);
        assert_eq!(
            argv.join(" "),
            "/opt/daqflow --token-file /data/token control-server --listen 127.0.0.1:7000 --end-after-stall \
             --siblings 192.0.2.1:7001"
        );
        let (argv, _) = server_command(&launch(), primary, false, &[]);
        assert_eq!(argv.join(" "), "/opt/daqflow --token-file /data/token control-server --listen 127.0.0.1:7000");
        for addr in [primary, spare] {
            let (argv, _) = server_command(&launch(), addr, true, &[]);
            assert!(!argv.iter().any(|a| a.contains("secret-token")), "{argv:?}");
        }
    }
}
