//! One operator per data directory: the lock file `DATA/operator.lock`.
//!
//! An operator (`daqflow run`, `daqflow demo`, `daqflow evb local`, `daqflow soak`) holds an
//! exclusive `flock` on `DATA/operator.lock` for its whole life. The kernel releases it when the
//! process ends, however it ends (Ctrl-C, a crash, `kill -9`), so the lock is never left held by
//! a process that is gone. A second operator on the same directory finds it held and is refused
//! before it writes anything there ([`LockError::Held`], naming the first: pid, host, since when,
//! its web UI); the run database's "finish the runs left open as abandoned" happens only after the
//! lock is taken, so only the operator holding it can do that.
//!
//! The file holds what the tools need to find the running system, as one JSON object
//! ([`LockInfo`]):
//!
//! ```json
//! {
//!   "pid": 41327,
//!   "host": "daq-01",
//!   "started": "2026-05-01 14:50:12 UTC",
//!   "started_ms": 1777647012000,
//!   "system": "demo",
//!   "data": "/home/shift/daqflow-demo",
//!   "control": ["127.0.0.1:40123"],
//!   "web": "http://127.0.0.1:8080"
//! }
//! ```
//!
//! `control` is the control servers' list (primary first, a wildcard address written as this
//! host's loopback) and `web` the web UI's address without its token (absent with no web UI);
//! both are filled in once known, so a reader may see them missing while the operator starts.
//! The file is rewritten in place (never replaced: the lock is on its inode) and emptied when the
//! operator ends cleanly. So, for a reader ([`holder`]): locked is a running operator; unlocked
//! and empty (or no file) is none; unlocked with content is an operator that died without
//! ending cleanly, whose lock the next operator takes over, saying whose it was.
//!
//! `daqflow --data DIR dialog ls` reads it to find the control server (the token is in
//! `DIR/token`).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = "operator.lock";

/// How long a reader (a tool's shared lock for a moment) may hold the file before an operator
/// that wants it takes it as held by another operator; and how long a reader waits for a holder
/// that is writing the file.
const PATIENCE: Duration = Duration::from_millis(500);
const STEP: Duration = Duration::from_millis(20);

/// What the lock file says about the operator holding it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LockInfo {
    /// The operator's process id.
    pub pid: u32,
    /// The host it runs on.
    pub host: String,
    /// When it took the lock, as UTC text (`2026-05-01 14:50:12 UTC`).
    pub started: String,
    /// The same, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// The system's name (`[system] name`).
    pub system: String,
    /// The data directory (absolute).
    pub data: PathBuf,
    /// The control servers' addresses, primary first, as this host reaches them; empty until
    /// they are started.
    #[serde(default)]
    pub control: Vec<String>,
    /// The web UI's address (`http://HOST:PORT`, without the token); none until it is started,
    /// or with no web UI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web: Option<String>,
}

impl std::fmt::Display for LockInfo {
    /// `pid 41327 on daq-01 since 2026-05-01 14:50:12 UTC (system `demo`), web UI
    /// http://127.0.0.1:8080, control server 127.0.0.1:40123`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} on {} since {} (system `{}`)", self.pid, self.host, self.started, self.system)?;
        match &self.web {
            Some(w) => write!(f, ", web UI {w}")?,
            None => write!(f, ", no web UI")?,
        }
        match self.control.as_slice() {
            [] => write!(f, ", control server not started yet"),
            [one] => write!(f, ", control server {one}"),
            many => write!(f, ", control servers {}", many.join(",")),
        }
    }
}

/// Why the lock could not be taken or read.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another operator holds the data directory.
    #[error(
        "the data directory {} is in use by another operator: {}. Stop that one first (Ctrl-C in its terminal, `quit` on its console), or give this one another data directory (--data DIR)",
        data.display(),
        holder.as_ref().map_or_else(|| "one that is starting (it has not written its details yet)".to_owned(), |h| h.to_string())
    )]
    Held {
        /// The data directory.
        data: PathBuf,
        /// What the holder wrote in the lock file (none while it starts).
        holder: Option<Box<LockInfo>>,
    },
    /// Opening, locking, reading or writing the lock file failed.
    #[error("the operator's lock file {}: {source}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

/// An operator that died holding the data directory, whose lock was taken over.
#[derive(Debug, Clone, PartialEq)]
pub struct LeftBehind {
    /// What it wrote in the lock file; none when the file's content could not be read as a
    /// [`LockInfo`].
    pub holder: Option<LockInfo>,
}

impl std::fmt::Display for LeftBehind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.holder {
            Some(h) => write!(f, "its operator ({h}) ended without releasing it (killed, or it crashed)"),
            None => {
                write!(f, "its operator ended without releasing it (what it wrote in its lock file cannot be read)")
            }
        }
    }
}

/// The lock on a data directory, held while this value lives: dropping it empties the file and
/// releases the lock (a clean end).
#[derive(Debug)]
pub struct OperatorLock {
    file: File,
    path: PathBuf,
    info: LockInfo,
    left_behind: Option<LeftBehind>,
}

impl OperatorLock {
    /// Takes the lock on `data` (which must exist) for the operator of `system`: refused with
    /// [`LockError::Held`] when another operator holds it, after nothing was written. A lock
    /// left by an operator that died is taken over ([`OperatorLock::left_behind`] says whose it
    /// was).
    pub fn acquire(data: &Path, system: &str) -> Result<OperatorLock, LockError> {
        let path = data.join(LOCK_FILE);
        let io = |source| LockError::Io { path: path.clone(), source };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&path)
            .map_err(io)?;
        // A tool reading the file (`holder`) holds a shared lock for a moment: only a lock held
        // longer than that is another operator's.
        let mut waited = Duration::ZERO;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if waited < PATIENCE => {
                    std::thread::sleep(STEP);
                    waited += STEP;
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(LockError::Held {
                        data: data.to_path_buf(),
                        holder: read_written(&file).map(Box::new),
                    });
                }
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
        }
        let left_behind = match read_text(&file).map_err(io)? {
            text if text.trim().is_empty() => None,
            text => Some(LeftBehind { holder: serde_json::from_str(&text).ok() }),
        };
        let started_ms = daqflow_component::log::now_ms();
        let info = LockInfo {
            pid: std::process::id(),
            host: host_name(),
            started: daqflow_api::utc(started_ms.saturating_mul(1_000_000)),
            started_ms,
            system: system.to_owned(),
            data: data.to_path_buf(),
            control: Vec::new(),
            web: None,
        };
        let lock = OperatorLock { file, path, info, left_behind };
        lock.write()?;
        Ok(lock)
    }

    /// What the file says now.
    pub fn info(&self) -> &LockInfo {
        &self.info
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The operator that died holding the directory, when this lock was taken over from one.
    pub fn left_behind(&self) -> Option<&LeftBehind> {
        self.left_behind.as_ref()
    }

    /// Writes the control servers' addresses (primary first) into the file.
    pub fn set_control(&mut self, control: Vec<String>) -> Result<(), LockError> {
        self.info.control = control;
        self.write()
    }

    /// Writes the web UI's address (without its token) into the file; none: no web UI.
    pub fn set_web(&mut self, web: Option<String>) -> Result<(), LockError> {
        self.info.web = web;
        self.write()
    }

    /// Rewrites the file in place (the lock is on its inode: it is never replaced): the new text
    /// from the start, then cut to its length. A reader that sees it half written retries.
    fn write(&self) -> Result<(), LockError> {
        let io = |source| LockError::Io { path: self.path.clone(), source };
        let mut text = serde_json::to_string_pretty(&self.info).map_err(|e| io(std::io::Error::other(e)))?;
        text.push('\n');
        self.file.write_all_at(text.as_bytes(), 0).map_err(io)?;
        self.file.set_len(text.len() as u64).map_err(io)
    }
}

impl Drop for OperatorLock {
    /// A clean end: the file is emptied (nobody holds the directory), then the lock released as
    /// the file closes.
    fn drop(&mut self) {
        if let Err(e) = self.file.set_len(0) {
            tracing::warn!("emptying {}: {e}", self.path.display());
        }
    }
}

/// Who holds a data directory, as a tool sees it ([`holder`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Holder {
    /// No operator: none has used the directory, or the last one ended cleanly.
    Nobody,
    /// An operator holds it and is starting: it has not written its details yet.
    Starting,
    /// An operator holds it.
    Running(LockInfo),
    /// The operator that held it died without ending cleanly (what it wrote; none when that
    /// could not be read). The next operator takes the directory over.
    Died(Option<LockInfo>),
}

/// Who holds the data directory `data`, without disturbing its operator (a shared lock taken
/// and released at once when nobody holds it).
pub fn holder(data: &Path) -> Result<Holder, LockError> {
    let path = data.join(LOCK_FILE);
    let io = |source| LockError::Io { path: path.clone(), source };
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Holder::Nobody),
        Err(e) => return Err(io(e)),
    };
    match file.try_lock_shared() {
        Ok(()) => {
            let text = read_text(&file).map_err(io)?;
            drop(file);
            if text.trim().is_empty() { Ok(Holder::Nobody) } else { Ok(Holder::Died(serde_json::from_str(&text).ok())) }
        }
        Err(TryLockError::WouldBlock) => Ok(read_written(&file).map_or(Holder::Starting, Holder::Running)),
        Err(TryLockError::Error(e)) => Err(io(e)),
    }
}

/// The holder's details, waiting a moment for a holder that is writing them.
fn read_written(file: &File) -> Option<LockInfo> {
    let mut waited = Duration::ZERO;
    loop {
        if let Some(info) = read_text(file).ok().and_then(|t| serde_json::from_str(&t).ok()) {
            return Some(info);
        }
        if waited >= PATIENCE {
            return None;
        }
        std::thread::sleep(STEP);
        waited += STEP;
    }
}

fn read_text(mut file: &File) -> std::io::Result<String> {
    use std::io::Seek;
    file.seek(std::io::SeekFrom::Start(0))?;
    let mut text = String::new();
    // A file that is not text (not ours) reads as unreadable content, not as an error.
    let mut bytes = Vec::new();
    file.take(1 << 20).read_to_end(&mut bytes)?;
    text.push_str(&String::from_utf8_lossy(&bytes));
    Ok(text)
}

/// This host's name (the kernel's), or `localhost` when it cannot be read.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_directory_is_refused_naming_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = OperatorLock::acquire(dir.path(), "demo").unwrap();
        assert!(first.left_behind().is_none());
        first.set_control(vec!["127.0.0.1:40123".into()]).unwrap();
        first.set_web(Some("http://127.0.0.1:8080".into())).unwrap();
        // Another open file description of the same file: what a second process has.
        let e = OperatorLock::acquire(dir.path(), "demo").unwrap_err();
        let LockError::Held { holder: Some(h), .. } = &e else { panic!("{e:?}") };
        assert_eq!(**h, *first.info());
        let text = e.to_string();
        for part in [
            &format!("pid {}", std::process::id()),
            &first.info().started,
            "web UI http://127.0.0.1:8080",
            "control server 127.0.0.1:40123",
            "--data DIR",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        assert_eq!(holder(dir.path()).unwrap(), Holder::Running(first.info().clone()));
        // Looking did not take it: the holder still holds it.
        assert!(matches!(OperatorLock::acquire(dir.path(), "demo"), Err(LockError::Held { .. })));
    }

    #[test]
    fn a_clean_end_empties_the_file_and_the_next_operator_takes_it_without_a_word() {
        let dir = tempfile::tempdir().unwrap();
        drop(OperatorLock::acquire(dir.path(), "demo").unwrap());
        assert_eq!(std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap(), "");
        assert_eq!(holder(dir.path()).unwrap(), Holder::Nobody);
        let second = OperatorLock::acquire(dir.path(), "demo").unwrap();
        assert!(second.left_behind().is_none());
    }

    #[test]
    fn a_lock_file_with_content_and_no_lock_is_taken_over_saying_whose_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let dead = LockInfo {
            pid: 4_000_000,
            host: "daq-01".into(),
            started: "2026-05-01 14:50:12 UTC".into(),
            started_ms: 1_777_647_012_000,
            system: "demo".into(),
            data: dir.path().to_path_buf(),
            control: vec!["127.0.0.1:7000".into()],
            web: Some("http://127.0.0.1:8080".into()),
        };
        // What an operator killed with -9 leaves: its details, no lock.
        std::fs::write(dir.path().join(LOCK_FILE), serde_json::to_string(&dead).unwrap()).unwrap();
        assert_eq!(holder(dir.path()).unwrap(), Holder::Died(Some(dead.clone())));
        let lock = OperatorLock::acquire(dir.path(), "demo").unwrap();
        let left = lock.left_behind().unwrap();
        assert_eq!(left.holder.as_ref(), Some(&dead));
        let said = left.to_string();
        assert!(said.contains("pid 4000000 on daq-01 since 2026-05-01 14:50:12 UTC"), "{said}");
        assert!(said.contains("ended without releasing it"), "{said}");
        // The file is the new holder's now, whole (no tail of the longer old text).
        let now: LockInfo = serde_json::from_str(&std::fs::read_to_string(lock.path()).unwrap()).unwrap();
        assert_eq!(now.pid, std::process::id());
        assert!(now.control.is_empty() && now.web.is_none());
        drop(lock);
        // Garbage left behind is taken over too, saying it could not be read.
        std::fs::write(dir.path().join(LOCK_FILE), "not json").unwrap();
        let lock = OperatorLock::acquire(dir.path(), "demo").unwrap();
        assert_eq!(lock.left_behind(), Some(&LeftBehind { holder: None }));
        assert!(lock.left_behind().unwrap().to_string().contains("cannot be read"));
    }

    #[test]
    fn a_reader_holding_the_file_for_a_moment_does_not_make_an_operator_refuse() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE);
        std::fs::write(&path, "").unwrap();
        let reader = File::open(&path).unwrap();
        reader.try_lock_shared().unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(reader);
        });
        let lock = OperatorLock::acquire(dir.path(), "demo").unwrap();
        release.join().unwrap();
        assert_eq!(lock.info().pid, std::process::id());
    }

    #[test]
    fn the_start_time_is_utc_text() {
        let utc_text = |ms: u64| daqflow_api::utc(ms * 1_000_000);
        assert_eq!(utc_text(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_text(1_795_317_309_000), "2026-11-22 03:15:09 UTC");
        assert_eq!(utc_text(951_782_400_999), "2000-02-29 00:00:00 UTC");
    }
}
