//! A component process driven over its standard input (`daqflow component KIND`, one command a
//! line, one JSON answer a line): what `daqflow bench chain` starts, and the late builder unit of
//! `daqflow evb local --join-bu`.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use daqflow_component::stdin::{Line, LineEvent, LineOutput};
use serde_json::Value;

/// The running binary, for starting components: `/proc/self/exe` stays valid when the file is
/// replaced by a rebuild during a long run (its path would then name a deleted or newer file).
pub(crate) fn self_exe() -> anyhow::Result<PathBuf> {
    let proc = PathBuf::from("/proc/self/exe");
    if proc.exists() { Ok(proc) } else { std::env::current_exe().context("finding the daqflow binary") }
}

/// Where a component process runs.
#[derive(Debug, Clone)]
pub(crate) enum Launch {
    /// A child of this process, the system token in its environment.
    Here,
    /// In a test host (`ip netns exec`), the system token in its environment.
    InHost(daqflow::hosts::Host),
    /// On another host: `argv` runs the binary there (`ssh … HOST PROGRAM`, a system file's
    /// `remote_command` with its host filled in), itself run in test host `from` if given; the
    /// system token is the first line of the component's input (`--token-stdin`), as the
    /// operator hands it over.
    Remote {
        /// The test host `argv` runs in (none: this process's).
        from: Option<daqflow::hosts::Host>,
        /// The remote command.
        argv: Vec<String>,
    },
}

impl Launch {
    /// [`Launch::Remote`] from a `remote_command` (`{host}` stands for the host), split at
    /// white space as the operator does, run in test host `from` if given. `env`
    /// (`NAME=VALUE`) comes before the program: ssh hands the remote shell one command line,
    /// where they set the program's environment.
    pub(crate) fn remote(
        from: Option<&daqflow::hosts::Host>,
        remote_command: &str,
        host: &str,
        env: &[&str],
    ) -> anyhow::Result<Launch> {
        let mut argv: Vec<String> =
            remote_command.replace("{host}", host).split_whitespace().map(str::to_owned).collect();
        let program = argv.pop().with_context(|| format!("remote command `{remote_command}` is empty"))?;
        argv.extend(env.iter().map(|e| e.to_string()));
        argv.push(program);
        Ok(Launch::Remote { from: from.cloned(), argv })
    }
}

/// A component process driven over its standard input.
pub(crate) struct Child {
    pub(crate) name: String,
    process: std::process::Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<LineOutput>,
    /// Failures the component reported by itself (`{"event":"error"}` lines).
    pub(crate) errors: Vec<String>,
    killed: bool,
}

impl Child {
    /// `daqflow component KIND --name NAME --set S…`, a child of this process, also joined to
    /// the control plane at `control` (`--control A,B,…`): it then publishes `NAME/state` and `NAME/stats` like a component the operator started.
    pub(crate) fn spawn_with_control(
        kind: &str,
        name: &str,
        sets: &[String],
        control: Option<&str>,
    ) -> anyhow::Result<Child> {
        Child::launch(&Launch::Here, kind, name, sets, control)
    }

    /// `daqflow component KIND --name NAME --set S…` started as `launch` says.
    pub(crate) fn launch(
        launch: &Launch,
        kind: &str,
        name: &str,
        sets: &[String],
        control: Option<&str>,
    ) -> anyhow::Result<Child> {
        // The system these children form proves one token on every connection.
        let token = crate::ensure_process_token()?;
        let mut cmd = match launch {
            Launch::Here => {
                let mut cmd = std::process::Command::new(self_exe()?);
                std::os::unix::process::CommandExt::arg0(&mut cmd, "daqflow");
                cmd
            }
            // `ip netns exec` runs a path, not `/proc/self/exe` (that would name `ip` itself).
            Launch::InHost(host) => host.command(std::env::current_exe().context("finding the daqflow binary")?),
            Launch::Remote { from, argv } => {
                let (program, args) = argv.split_first().context("an empty remote command")?;
                let mut cmd = match from {
                    Some(host) => host.command(program),
                    None => std::process::Command::new(program),
                };
                cmd.args(args);
                cmd
            }
        };
        cmd.args(["component", kind, "--name", name]);
        if let Some(c) = control {
            cmd.args(["--control", c]);
        }
        if matches!(launch, Launch::Remote { .. }) {
            cmd.arg("--token-stdin");
        } else {
            cmd.env(crate::TOKEN_ENV, token.reveal());
        }
        if std::env::var_os("DAQFLOW_LOG").is_none() {
            cmd.env("DAQFLOW_LOG", "warn");
        }
        for s in sets {
            cmd.arg("--set").arg(s);
        }
        let mut process = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let stdout = process.stdout.take().context("the child's standard output")?;
        let (tx, rx) = std::sync::mpsc::channel();
        let label = name.to_owned();
        std::thread::Builder::new().name(format!("{name}-out")).spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<LineOutput>(&line) {
                    Ok(v) => {
                        if tx.send(v).is_err() {
                            break;
                        }
                    }
                    Err(_) => eprintln!("{label}: {line}"),
                }
            }
        })?;
        let mut child = Child {
            name: name.into(),
            stdin: process.stdin.take(),
            process,
            lines: rx,
            errors: Vec::new(),
            killed: false,
        };
        if matches!(launch, Launch::Remote { .. }) {
            child.send(token.reveal())?;
        }
        Ok(child)
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Whether it was killed ([`Child::kill`]).
    pub(crate) fn killed(&self) -> bool {
        self.killed
    }

    /// Sends a command and waits for its answer: its result (null for none).
    pub(crate) fn call(&mut self, command: Line, timeout: Duration) -> anyhow::Result<Value> {
        let text = command.to_string();
        self.send(&text)?;
        self.answer(&text, timeout)
    }

    /// Sends a line without waiting for the answer ([`Child::answer`]).
    fn send(&mut self, command: &str) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow::anyhow!("{}: input closed", self.name))?;
        writeln!(stdin, "{command}")
            .and_then(|()| stdin.flush())
            .with_context(|| format!("{}: sending `{command}` (has it died?)", self.name))
    }

    /// Waits for the answer to `command`, sent before.
    fn answer(&mut self, command: &str, timeout: Duration) -> anyhow::Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(LineOutput::Event(e)) => self.note_event(e),
                Ok(LineOutput::Answer(a)) => {
                    return a.into_result().map_err(|why| anyhow::anyhow!("{}: {command}: {why}", self.name));
                }
                Err(RecvTimeoutError::Timeout) => bail!("{}: no answer to `{command}` within {timeout:?}", self.name),
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.process.wait().map(|s| s.to_string()).unwrap_or_default();
                    bail!("{}: exited ({status}) before answering `{command}`", self.name)
                }
            }
        }
    }

    fn note_event(&mut self, event: LineEvent) {
        if !self.errors.contains(&event.error) {
            self.errors.push(event.error);
        }
    }

    /// Collects the errors the component reported by itself since the last call.
    pub(crate) fn drain_events(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            if let LineOutput::Event(e) = line {
                self.note_event(e);
            }
        }
    }

    /// Kills the process with SIGKILL (a failure drill) and reaps it.
    pub(crate) fn kill(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        self.stdin = None;
        self.killed = true;
    }

    /// Ends the process: `quit`, then SIGKILL after 10 s.
    pub(crate) fn finish(&mut self) {
        if self.killed {
            return;
        }
        if let Some(mut s) = self.stdin.take() {
            let _ = writeln!(s, "quit");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.process.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.process.kill();
                    let _ = self.process.wait();
                    return;
                }
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.killed && matches!(self.process.try_wait(), Ok(None)) {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}
