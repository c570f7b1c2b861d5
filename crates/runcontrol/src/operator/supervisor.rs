//! The supervisor: the component processes the operator started. It starts them (each with
//! its output appended to `logs/NAME.log`, the system token, its lease, kept from the terminal
//! so that its signals reach only the operator (`crate::children`), and with a parent-death signal so
//! that no local component outlives a crashed operator), notices when one ends, and ends them
//! all at shutdown. What to do when one ends is the sequencer's business (its policy).
//!
//! A `daqflow component` on another host (`host`, started with `remote_command`, ssh by
//! default) gets the token on its standard input, the first line, with `--token-stdin`: ssh
//! passes neither the environment nor files, and a command line is readable by everyone. The
//! supervisor then keeps that pipe open for as long as the component should live: when the
//! operator ends, however it ends, the pipe closes, ssh passes the end on, and the component
//! ends (`docs/operator-guide.md`, "Components on other hosts"). Its lease covers what the
//! pipe cannot tell, a host or a network that is gone.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use daqflow_transport::auth::Token;

use crate::children::Detach;
use crate::system::ComponentSpec;

/// What every component process is started with.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    /// The `daqflow` binary.
    pub binary: PathBuf,
    /// `system.remote_command`.
    pub remote: String,
    /// Where the components' logs go.
    pub logs: PathBuf,
    /// The system token's file (`DATA/token`).
    pub token_file: PathBuf,
    /// The system token, for the components on other hosts.
    pub token: Token,
    /// `system.lease_s`, given to every `daqflow component` as `--lease`.
    pub lease_s: f64,
}

impl Launch {
    /// The binary as people read it, in logs and `ps`: `/proc/self/exe` (what is run: it stays
    /// valid when a rebuild replaces the file) is the path of the file it names.
    fn binary_shown(&self) -> String {
        crate::children::shown_binary(&self.binary)
    }
}

/// A component process the operator started.
struct Running {
    child: Child,
    /// The pipe to its standard input, held open while it should live (a component on
    /// another host).
    _stdin: Option<ChildStdin>,
    /// Its log, and where this life's output begins in it.
    log: PathBuf,
    log_from: u64,
}

/// The component processes.
pub(crate) struct Supervisor {
    launch: Launch,
    children: HashMap<String, Running>,
    /// The incarnation the next process started gets: the operator's start time in
    /// microseconds, counted up by one per start, so that no two starts of one operator, nor of
    /// two operators one after the other, share one.
    next_incarnation: u64,
}

/// A process the supervisor started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Started {
    /// Its process id.
    pub pid: u32,
    /// The incarnation it was given (`None`: a program of the user's own on another host,
    /// which gets nothing but `--name` and `--control`).
    pub incarnation: Option<u64>,
}

impl Supervisor {
    pub(crate) fn new(launch: Launch) -> Supervisor {
        let micros =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_micros() as u64);
        Supervisor { launch, children: HashMap::new(), next_incarnation: micros }
    }

    /// Starts the process of `spec` (ending a process of it that still runs, whose end is then
    /// not reported) as a new incarnation. The parent-death signal fires when the calling
    /// thread ends: the operator calls this from its event loop, which lives as long as the
    /// operator.
    pub(crate) fn spawn(&mut self, spec: &ComponentSpec, control: &str) -> Result<Started, String> {
        if let Some(mut old) = self.children.remove(&spec.name) {
            let _ = old.child.kill();
            let _ = old.child.wait();
        }
        self.next_incarnation += 1;
        let incarnation = self.next_incarnation;
        let running = spawn_component(&self.launch, spec, control, incarnation)?;
        let pid = running.child.id();
        self.children.insert(spec.name.clone(), running);
        let given = !(spec.command.is_some() && spec.host.is_some());
        Ok(Started { pid, incarnation: given.then_some(incarnation) })
    }

    /// The processes that ended since the last call: name and how, with the first error line
    /// of that life's log (`exit status: 1; first error: …`).
    pub(crate) fn exits(&mut self) -> Vec<(String, String)> {
        let mut exited = Vec::new();
        for (name, running) in self.children.iter_mut() {
            if let Ok(Some(status)) = running.child.try_wait() {
                let how = crate::first_error::with_first_error(&status.to_string(), &running.log, running.log_from);
                exited.push((name.clone(), how));
            }
        }
        for (name, _) in &exited {
            self.children.remove(name);
        }
        exited
    }

    /// Ends every process: SIGTERM, then SIGKILL after `grace`.
    pub(crate) fn terminate_all(&mut self, grace: Duration) {
        let mut children = std::mem::take(&mut self.children);
        for r in children.values() {
            // SAFETY: kill(2) with a pid of our own child that has not been reaped yet (it is
            // still in `children`), so the pid cannot have been reused.
            unsafe { libc::kill(r.child.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + grace;
        for (name, r) in children.iter_mut() {
            let c = &mut r.child;
            loop {
                match c.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        tracing::warn!(component = %name, "{name} did not end on SIGTERM; killing it");
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }
}

/// The command line of one component's process: a program of the user's own (run through
/// `remote_command` with a host), else `daqflow component KIND` (the same) with its lease, its
/// operator, its incarnation and,
/// locally, the token's file, on another host `--token-stdin`; then `--name NAME --control
/// ADDR`. Whether the token goes to its standard input.
fn command_line(launch: &Launch, spec: &ComponentSpec, control: &str, incarnation: u64) -> (Vec<String>, bool) {
    let remote = |host: &str| -> Vec<String> {
        launch.remote.replace("{host}", host).split_whitespace().map(str::to_owned).collect()
    };
    // Its lease, its operator (the only process whose commands it takes), and the incarnation
    // it is (the operator takes statuses only from it).
    let lease = [
        "--lease".to_owned(),
        launch.lease_s.to_string(),
        "--operator".to_owned(),
        super::DIALOG_NAME.to_owned(),
        "--incarnation".to_owned(),
        incarnation.to_string(),
    ];
    let (mut argv, token_stdin) = match (&spec.command, &spec.host) {
        (Some(cmd), None) => (cmd.clone(), false),
        (Some(cmd), Some(host)) => (remote(host).into_iter().chain(cmd.iter().cloned()).collect(), false),
        (None, None) => {
            let mut argv = vec![
                launch.binary_shown(),
                "--token-file".into(),
                launch.token_file.display().to_string(),
                "component".into(),
                spec.kind.clone(),
            ];
            argv.extend(lease);
            (argv, false)
        }
        (None, Some(host)) => {
            let mut argv = remote(host);
            argv.extend(["component".to_owned(), spec.kind.clone(), "--token-stdin".to_owned()]);
            argv.extend(lease);
            (argv, true)
        }
    };
    if let (Some(addr), None) = (spec.metrics, &spec.command) {
        argv.extend(["--metrics".to_owned(), addr.to_string()]);
    }
    // `daqflow component` pins its whole process first thing (here or on another host); a
    // program of the user's own on this host is pinned from its start (`spawn_component`).
    if let (None, Some(cpus)) = (&spec.command, &spec.cpus) {
        argv.extend(["--cpus".to_owned(), cpus.to_string()]);
    }
    argv.extend(["--name".into(), spec.name.clone(), "--control".into(), control.to_owned()]);
    (argv, token_stdin)
}

/// Starts one component's process, its output appended to `logs/NAME.log`. It gets the system
/// token's file in `DAQFLOW_TOKEN_FILE` (a user's own command reads it from there too, and its
/// lease, operator and incarnation from `DAQFLOW_LEASE_S`, `DAQFLOW_OPERATOR` and
/// `DAQFLOW_INCARNATION`), a local `daqflow component` also as `--token-file`, one on another
/// host the token itself as the first line of its standard input, which stays open.
fn spawn_component(launch: &Launch, spec: &ComponentSpec, control: &str, incarnation: u64) -> Result<Running, String> {
    let log_path = launch.logs.join(format!("{}.log", spec.name));
    let log_from = crate::first_error::log_length(&log_path);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let err_log = log.try_clone().map_err(|e| e.to_string())?;
    let (argv, token_stdin) = command_line(launch, spec, control, incarnation);
    // A local `daqflow component` runs the operator's binary (`launch.binary`), named by its
    // path (`argv[0]`, what logs and `ps` show).
    let local_daqflow = spec.command.is_none() && spec.host.is_none();
    let mut cmd = if local_daqflow { Command::new(&launch.binary) } else { Command::new(&argv[0]) };
    std::os::unix::process::CommandExt::arg0(&mut cmd, &argv[0]);
    cmd.args(&argv[1..])
        .stdin(if token_stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(log)
        .stderr(err_log)
        .env("DAQFLOW_COMPONENT", &spec.name)
        .env("DAQFLOW_TOKEN_FILE", &launch.token_file)
        // For a program of the user's own, which gets only `--name` and `--control`: its lease
        // and its operator (the Python package's `daqflow.Component` reads them).
        .env("DAQFLOW_LEASE_S", launch.lease_s.to_string())
        .env("DAQFLOW_OPERATOR", super::DIALOG_NAME)
        .env(daqflow_component::process::INCARNATION_ENV, incarnation.to_string());
    // Kept from the terminal (its Ctrl-C reaches the operator alone, which stops the run in
    // order): a local `daqflow component` in a process group of its own, sharing the operator's
    // scheduling group; ssh or a user's program in a session of its own, without a terminal.
    // It ends when the thread that started it (the operator's event loop, which lives as long
    // as the operator) ends, so that no component outlives a crashed operator.
    let detach = if local_daqflow { Detach::ProcessGroup } else { Detach::Session };
    crate::children::detached_ending_with_parent(&mut cmd, detach);
    if let (Some(_), None, Some(cpus)) = (&spec.command, &spec.host, &spec.cpus) {
        daqflow_wire::affinity::pin_command(&mut cmd, cpus).map_err(|e| format!("pinning {}: {e}", spec.name))?;
    }
    let mut child = cmd.spawn().map_err(|e| format!("starting {} ({}): {e}", spec.name, argv.join(" ")))?;
    tracing::info!(component = %spec.name, pid = child.id(), "started {}", argv.join(" "));
    let mut stdin = child.stdin.take();
    if let Some(pipe) = stdin.as_mut() {
        // A few dozen bytes into an empty pipe: this does not wait for the component. If the
        // process already ended, its end is reported like any other.
        let line = [launch.token.as_bytes(), b"\n"].concat();
        if let Err(e) = pipe.write_all(&line).and_then(|()| pipe.flush()) {
            tracing::warn!(component = %spec.name, "giving {} the system token on its standard input: {e}", spec.name);
        }
    }
    Ok(Running { child, _stdin: stdin, log: log_path, log_from })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(host: Option<&str>, command: Option<&[&str]>) -> ComponentSpec {
        ComponentSpec {
            name: "c-1".into(),
            kind: "sink".into(),
            host: host.map(str::to_owned),
            command: command.map(|c| c.iter().map(|s| s.to_string()).collect()),
            policy: crate::system::Policy::Stop,
            start_order: 0,
            stop_order: 0,
            stop_arg: None,
            metrics: None,
            params: toml::Table::new(),
            line: 1,
            needs: Vec::new(),
            role: daqflow_component::Role::Other,
            data_files: None,
            system_digest: false,
            cpus: None,
            schema: None,
        }
    }

    fn launch() -> Launch {
        Launch {
            binary: "/opt/daqflow".into(),
            remote: "ssh -i /k {host} /usr/bin/daqflow".into(),
            logs: "/data/logs".into(),
            token_file: "/data/token".into(),
            token: Token::new("secret-token-0123").unwrap(),
            lease_s: 7.5,
        }
    }

    #[test]
    fn a_remote_component_takes_the_token_on_standard_input_and_never_on_its_command_line() {
        let control = "10.0.0.1:7000,10.0.0.1:7001";
        let (argv, token_stdin) = command_line(&launch(), &spec(Some("10.0.0.2"), None), control, 42);
        assert!(token_stdin);
        assert_eq!(
            argv.join(" "),
            "ssh -i /k 10.0.0.2 /usr/bin/daqflow component sink --token-stdin --lease 7.5 \
             --operator operator --incarnation 42 --name c-1 --control 10.0.0.1:7000,10.0.0.1:7001"
        );
        let (argv, token_stdin) = command_line(&launch(), &spec(None, None), control, 42);
        assert!(!token_stdin);
        assert_eq!(
            argv.join(" "),
            "/opt/daqflow --token-file /data/token component sink --lease 7.5 --operator operator --incarnation 42 --name c-1 --control 10.0.0.1:7000,10.0.0.1:7001"
        );
        // With a metrics address, `daqflow component` serves there.
        let mut served = spec(None, None);
        served.metrics = Some("127.0.0.1:9102".parse().unwrap());
        let (argv, _) = command_line(&launch(), &served, control, 42);
        assert!(
            argv.join(" ").ends_with(
                "--incarnation 42 --metrics 127.0.0.1:9102 --name c-1 --control 10.0.0.1:7000,10.0.0.1:7001"
            )
        );
        // A program of the user's own gets neither: only its name and the control address.
        let (argv, token_stdin) = command_line(&launch(), &spec(Some("h2"), Some(&["mine", "-v"])), control, 42);
        assert!(!token_stdin);
        assert_eq!(
            argv.join(" "),
            "ssh -i /k h2 /usr/bin/daqflow mine -v --name c-1 --control 10.0.0.1:7000,10.0.0.1:7001"
        );
        // The binary at `/proc/self/exe` (the running one) is shown by its path.
        let own = Launch { binary: "/proc/self/exe".into(), ..launch() };
        let (argv, _) = command_line(&own, &spec(None, None), control, 42);
        assert_eq!(argv[0], std::env::current_exe().unwrap().display().to_string());
        assert!(!argv.join(" ").contains("/proc/self"), "{argv:?}");
        for (host, command) in [(Some("h2"), None), (None, None), (None, Some(&["mine"][..]))] {
            let (argv, _) = command_line(&launch(), &spec(host, command), control, 42);
            assert!(!argv.iter().any(|a| a.contains("secret-token")), "{argv:?}");
        }
    }
}
