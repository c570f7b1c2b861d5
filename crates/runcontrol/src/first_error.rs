//! The first error line of a process's log: what the operator quotes when a process it started
//! (a component, a control server) ends or does not start, so that the cause is on the
//! console, in the run summary, in the web UI and in the run record, not only in the log.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let log = dir.path().join("ru-0.log");
//! std::fs::write(&log, "2026-01-01T00:00:00.000001Z  INFO component started\n\
//!     2026-01-01T00:00:01.000001Z ERROR configure: listening on 127.0.0.1:7200: Address already in use (os error 98)\n\
//!     daqflow: error: ru-0 ended\n").unwrap();
//! assert_eq!(
//!     daqflow_runcontrol::first_error::first_error_line(&log, 0).as_deref(),
//!     Some("configure: listening on 127.0.0.1:7200: Address already in use (os error 98)")
//! );
//! ```

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// The most of a log read, from where its process's life began.
const READ_AT_MOST: u64 = 4 << 20;
/// The longest line quoted, in characters.
const QUOTE_AT_MOST: usize = 300;

/// The length of the file at `path` now (0 if there is none): where the log of a process
/// started next begins.
pub fn log_length(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// The first error line written to the log at `path` from byte `from` on (one process's life,
/// in a log appended across lives), without its time stamp and level: a record at level
/// ERROR, the `daqflow: error: …` a command ends with, a panic's message, or a Python
/// traceback's last line. None if there is none, or no log.
pub fn first_error_line(path: &Path, from: u64) -> Option<String> {
    let mut file = std::fs::File::open(path).ok()?;
    file.seek(SeekFrom::Start(from)).ok()?;
    let mut bytes = Vec::new();
    file.take(READ_AT_MOST).read_to_end(&mut bytes).ok()?;
    first_error_in(&String::from_utf8_lossy(&bytes))
}

/// The first error line of a log's text (see [`first_error_line`]).
pub fn first_error_in(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().map(|l| l.trim_end_matches('\r')).collect();
    let mut traceback = false;
    for (i, line) in lines.iter().enumerate() {
        if let Some(message) = tracing_error(line) {
            return Some(quote(message));
        }
        if let Some(message) = line.trim_start().strip_prefix("daqflow: error: ") {
            return Some(quote(message));
        }
        if line.contains("panicked at") {
            // Rust prints the message on the line after the place.
            let message = lines.get(i + 1).map_or("", |l| l.trim());
            return Some(quote(&format!("panicked: {message}")));
        }
        if line.starts_with("Traceback (most recent call last)") {
            traceback = true;
        }
    }
    if traceback {
        // The exception is the last line of the traceback that is not indented.
        let last = lines.iter().rev().find(|l| !l.trim().is_empty() && !l.starts_with(' '))?;
        return Some(quote(last));
    }
    None
}

/// The message of a `tracing` record at level ERROR (`TIME ERROR message`, the format of
/// every daqflow process's log), if the line is one.
fn tracing_error(line: &str) -> Option<&str> {
    let mut words = line.splitn(3, ' ').filter(|w| !w.is_empty());
    let time = words.next()?;
    if !time.as_bytes().first().is_some_and(u8::is_ascii_digit) || !time.contains('T') {
        return None;
    }
    let rest = line[time.len()..].trim_start();
    rest.strip_prefix("ERROR ").map(str::trim)
}

/// `text` cut to [`QUOTE_AT_MOST`] characters.
fn quote(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(QUOTE_AT_MOST) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// What a process's end looks like with its first error line: `exit status: 1; first error:
/// …` (the status alone without one).
pub fn with_first_error(status: &str, log: &Path, from: u64) -> String {
    match first_error_line(log, from) {
        Some(e) => format!("{status}; first error: {e}"),
        None => status.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_error_is_found_in_each_shape_a_process_writes_it() {
        let log = "2026-01-01T00:00:00.000001Z  INFO component started\n\
                   2026-01-01T00:00:00.000002Z  WARN refusing a second source 0: it already sends\n\
                   2026-01-01T00:00:01.000001Z ERROR run{n=1}: start: connecting to 127.0.0.1:9: Connection refused\n\
                   2026-01-01T00:00:01.000002Z ERROR a later one\n";
        assert_eq!(
            first_error_in(log).as_deref(),
            Some("run{n=1}: start: connecting to 127.0.0.1:9: Connection refused")
        );
        assert_eq!(
            first_error_in(
                "daqflow: error: the control server cannot listen on 127.0.0.1:7000: Address already in use\n"
            )
            .as_deref(),
            Some("the control server cannot listen on 127.0.0.1:7000: Address already in use")
        );
        let panic = "thread 'main' panicked at crates/x/src/lib.rs:3:5:\nindex out of bounds\nnote: run with …\n";
        assert_eq!(first_error_in(panic).as_deref(), Some("panicked: index out of bounds"));
        let python = "Traceback (most recent call last):\n  File \"readout.py\", line 3, in <module>\n    open('/dev/x')\nFileNotFoundError: [Errno 2] No such file or directory: '/dev/x'\n";
        assert_eq!(
            first_error_in(python).as_deref(),
            Some("FileNotFoundError: [Errno 2] No such file or directory: '/dev/x'")
        );
        // Nothing that is an error, nothing quoted (a word "error" in a message is not one).
        assert_eq!(first_error_in("2026-01-01T00:00:00Z  INFO error_count = 0\nplain output\n"), None);
        let long = format!("2026-01-01T00:00:00Z ERROR {}\n", "x".repeat(1000));
        assert_eq!(first_error_in(&long).unwrap().chars().count(), QUOTE_AT_MOST + 1);
    }

    #[test]
    fn only_the_life_that_ended_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.log");
        std::fs::write(&path, "2026-01-01T00:00:00Z ERROR the life before\n").unwrap();
        let from = log_length(&path);
        assert_eq!(first_error_line(&path, from), None);
        assert_eq!(with_first_error("exit status: 1", &path, from), "exit status: 1");
        std::fs::write(&path, "2026-01-01T00:00:00Z ERROR the life before\n2026-01-01T00:00:09Z ERROR this one\n")
            .unwrap();
        assert_eq!(with_first_error("exit status: 1", &path, from), "exit status: 1; first error: this one");
        assert_eq!(first_error_line(&dir.path().join("none.log"), 0), None);
    }
}
