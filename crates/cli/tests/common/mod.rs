//! Running `daqflow` as child processes in integration tests: stdout lines, stderr, signals.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// A `daqflow` child process, killed when dropped.
pub struct Proc {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Vec<String>,
    stderr: Receiver<String>,
}

impl Proc {
    pub fn spawn(args: &[&str]) -> Proc {
        Self::spawn_with_env(args, &[])
    }

    /// [`Proc::spawn`] with extra environment variables.
    pub fn spawn_with_env(args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_daqflow"));
        cmd.args(args).envs(env.iter().copied());
        Self::spawn_command(cmd)
    }

    /// Any command (`daqflow` in a test host, say), its standard streams piped like
    /// [`Proc::spawn`]'s.
    pub fn spawn_command(mut cmd: Command) -> Proc {
        if cmd.get_envs().all(|(k, _)| k != "DAQFLOW_LOG") {
            cmd.env("DAQFLOW_LOG", "info");
        }
        let mut child =
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn daqflow");
        let (tx, lines) = channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let (etx, stderr) = channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = etx.send(l);
            }
        });
        let stdin = child.stdin.take();
        Proc { child, stdin, lines, seen: Vec::new(), stderr }
    }

    /// Waits for a stdout line containing `text`; returns it.
    pub fn expect(&mut self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        if let Some(l) = self.seen.iter().find(|l| l.contains(text)) {
            return l.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.contains(text) {
                        return l;
                    }
                }
                Err(_) => {
                    let (status, err) = self.exit_and_stderr();
                    panic!("no line containing {text:?}; got {:?}; exit {status:?}; stderr {err:#?}", self.seen)
                }
            }
        }
    }

    /// The next stdout line, waiting at most 20 s.
    pub fn next_line(&mut self) -> String {
        match self.lines.recv_timeout(Duration::from_secs(20)) {
            Ok(l) => {
                self.seen.push(l.clone());
                l
            }
            Err(_) => {
                let (status, err) = self.exit_and_stderr();
                panic!("no line within 20 s; got {:?}; exit {status:?}; stderr {err:#?}", self.seen)
            }
        }
    }

    /// Its exit status if it ended, and its standard error so far (for a failure's message).
    fn exit_and_stderr(&mut self) -> (Option<std::process::ExitStatus>, Vec<String>) {
        let status = self.child.try_wait().ok().flatten();
        let mut err = Vec::new();
        while let Ok(l) = self.stderr.recv_timeout(Duration::from_millis(200)) {
            err.push(l);
        }
        (status, err)
    }

    /// Every stdout line so far (those already read included), one text.
    pub fn drain(&mut self) -> String {
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(l);
        }
        self.seen.join("\n")
    }

    pub fn stderr_contains(&mut self, text: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            match self.stderr.recv_timeout(Duration::from_millis(100)) {
                Ok(l) if l.contains(text) => return true,
                _ => {}
            }
        }
        false
    }

    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Closes its standard input (the end of input).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Every standard error line that came so far.
    pub fn stderr_lines(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        while let Ok(l) = self.stderr.recv_timeout(Duration::from_millis(200)) {
            lines.push(l);
        }
        lines
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) with the pid of our own child process; no memory is involved.
        let r = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(r, 0);
    }

    pub fn wait_exit(&mut self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "process did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether test hosts (`daqflow::hosts`, with an sshd each if `ssh`) can run here; if not, says
/// why. In CI as root, a missing tool is a failure, not a reason to skip.
pub fn hosts_available(ssh: bool) -> bool {
    let check = if ssh { daqflow::hosts::check_ssh() } else { daqflow::hosts::check() };
    match check {
        Ok(()) => true,
        Err(e @ daqflow::hosts::HostsError::MissingTool { .. }) if std::env::var_os("CI").is_some() => {
            panic!("{e}: CI runs as root and must have it (.ci/run installs it)")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            false
        }
    }
}
