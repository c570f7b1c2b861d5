//! The supervisor: the component processes the operator started. It starts them (each with
//! its output appended to `logs/NAME.log`, the system token's file, and a parent-death signal
//! so that no component outlives a crashed operator), notices when one ends, and ends them
//! all at shutdown. What to do when one ends is the sequencer's business (its policy).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
}

/// The component processes.
pub(crate) struct Supervisor {
    launch: Launch,
    children: HashMap<String, Child>,
}

impl Supervisor {
    pub(crate) fn new(launch: Launch) -> Supervisor {
        Supervisor { launch, children: HashMap::new() }
    }

    /// Starts the process of `spec` (ending a process of it that still runs, whose end is then
    /// not reported); its pid. The parent-death signal fires when the calling thread ends: the
    /// operator calls this from its event loop, which lives as long as the operator.
    pub(crate) fn spawn(&mut self, spec: &ComponentSpec, control: &str) -> Result<u32, String> {
        if let Some(mut old) = self.children.remove(&spec.name) {
            let _ = old.kill();
            let _ = old.wait();
        }
        let child = spawn_component(&self.launch, spec, control)?;
        let pid = child.id();
        self.children.insert(spec.name.clone(), child);
        Ok(pid)
    }

    /// The processes that ended since the last call: name and how.
    pub(crate) fn exits(&mut self) -> Vec<(String, String)> {
        let mut exited = Vec::new();
        for (name, child) in self.children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                exited.push((name.clone(), status.to_string()));
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
        for c in children.values() {
            // SAFETY: kill(2) with a pid of our own child that has not been reaped yet (it is
            // still in `children`), so the pid cannot have been reused.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + grace;
        for (name, c) in children.iter_mut() {
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

/// Starts one component's process, its output appended to `logs/NAME.log`. It gets the system
/// token's file in `DAQFLOW_TOKEN_FILE` (a user's own command reads it from there too), and a
/// local `daqflow component` also as `--token-file`.
fn spawn_component(launch: &Launch, spec: &ComponentSpec, control: &str) -> Result<Child, String> {
    use std::os::unix::process::CommandExt;
    let (binary, remote, logs) = (&launch.binary, &launch.remote, &launch.logs);
    let log_path = logs.join(format!("{}.log", spec.name));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let err_log = log.try_clone().map_err(|e| e.to_string())?;
    let mut argv: Vec<String> = match (&spec.command, &spec.host) {
        (Some(cmd), None) => cmd.clone(),
        (Some(cmd), Some(host)) => {
            remote.replace("{host}", host).split_whitespace().map(str::to_owned).chain(cmd.iter().cloned()).collect()
        }
        (None, None) => vec![
            binary.display().to_string(),
            "--token-file".into(),
            launch.token_file.display().to_string(),
            "component".into(),
            spec.kind.clone(),
        ],
        (None, Some(host)) => remote
            .replace("{host}", host)
            .split_whitespace()
            .map(str::to_owned)
            .chain(["component".to_owned(), spec.kind.clone()])
            .collect(),
    };
    argv.extend(["--name".into(), spec.name.clone(), "--control".into(), control.to_owned()]);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err_log)
        .env("DAQFLOW_COMPONENT", &spec.name)
        .env("DAQFLOW_TOKEN_FILE", &launch.token_file);
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl(2),
    // which is async-signal-safe; it asks the kernel to send SIGTERM to the child when the
    // thread that started it (the operator's event loop, which lives as long as the operator)
    // ends, so that no component outlives a crashed operator.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong, 0, 0, 0);
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| format!("starting {} ({}): {e}", spec.name, argv.join(" ")))?;
    tracing::info!(component = %spec.name, pid = child.id(), "started {}", argv.join(" "));
    Ok(child)
}
