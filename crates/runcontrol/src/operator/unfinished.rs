//! Run records the run database refused to finish: the file `DATA/unfinished-runs`.
//!
//! When a run ends, the operator closes its record in the run database. When that fails (the
//! data directory is full: SQLite's "database or disk is full"; the database cannot be
//! written), the record would stay `running`, and the next operator would mark it `abandoned`
//! without saying why. So the operator notes the run and the reason here, and the next
//! operator on the data directory, once it holds the directory's lock, finishes the record as
//! `abandoned` with the reason as its error (`the operator could not finish the record: run
//! database …: database or disk is full`), says so on its terminal, and empties the file.
//!
//! A note must be written when the disk is full, when a new file, or a file that grows, may get
//! no space. So the file is made at the operator's start with [`RESERVED`] bytes written (not
//! a hole: the space is taken then), and a note is written over them in place, at offset 0,
//! the whole reserved size in one write: JSON, padded with spaces. Nothing is allocated then on
//! a filesystem that overwrites in place (ext4, XFS, tmpfs). The file holds a JSON array of
//! [`Unfinished`] (`[]`: none) followed by spaces; a note too long for the space has its
//! reason cut. When even that write fails, the operator logs the note (its terminal and
//! `logs/operator.log`), and the record is finished as abandoned without the reason, as before.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The file's name in the data directory.
pub const UNFINISHED_FILE: &str = "unfinished-runs";

/// The file's size, taken at the operator's start: room for a few notes.
pub const RESERVED: usize = 8192;

/// The longest reason kept in a note.
const MAX_REASON: usize = 1024;

/// A run whose record the operator could not finish.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Unfinished {
    /// The run number.
    pub run: u32,
    /// The system's name (the record's `system`).
    pub system: String,
    /// When the operator gave up on the record (Unix ms): the run's stop time.
    pub stopped_ms: u64,
    /// Why the record could not be finished.
    pub reason: String,
}

/// The reserved file of a data directory, held by the operator that holds its lock.
#[derive(Debug)]
pub struct UnfinishedRuns {
    file: File,
    path: PathBuf,
    notes: Vec<Unfinished>,
}

impl UnfinishedRuns {
    /// Opens `DATA/unfinished-runs` (making it, its space reserved, if missing): the file and
    /// the notes an earlier operator left in it. A file that cannot be read as notes (damaged
    /// by hand) is an error naming it.
    pub fn open(data: &Path) -> io::Result<(UnfinishedRuns, Vec<Unfinished>)> {
        let path = data.join(UNFINISHED_FILE);
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
        let len = file.metadata()?.len();
        let mut bytes = vec![0u8; len.min(1 << 20) as usize];
        file.read_exact_at(&mut bytes, 0)?;
        let text = String::from_utf8_lossy(&bytes);
        let text = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
        let left: Vec<Unfinished> = if text.is_empty() {
            Vec::new()
        } else {
            serde_json::from_str(text).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{}: not a list of notes: {e}", path.display()))
            })?
        };
        let runs = UnfinishedRuns { file, path, notes: left.clone() };
        if len < RESERVED as u64 {
            runs.write()?;
        }
        Ok((runs, left))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The notes the file holds now.
    pub fn notes(&self) -> &[Unfinished] {
        &self.notes
    }

    /// Adds `note` (a run's earlier note is replaced) and writes the file in place.
    pub fn note(&mut self, mut note: Unfinished) -> io::Result<()> {
        if note.reason.len() > MAX_REASON {
            let mut cut = MAX_REASON;
            while !note.reason.is_char_boundary(cut) {
                cut -= 1;
            }
            note.reason.truncate(cut);
            note.reason.push('…');
        }
        self.notes.retain(|n| n.run != note.run || n.system != note.system);
        self.notes.push(note);
        // The oldest notes go when the space is short (their records are then finished as
        // abandoned without a reason, as before these notes).
        while self.notes.len() > 1 && self.text().len() > RESERVED {
            self.notes.remove(0);
        }
        self.write()
    }

    /// Keeps the notes for which `keep` is true, and writes the file in place.
    pub fn retain(&mut self, keep: impl FnMut(&Unfinished) -> bool) -> io::Result<()> {
        self.notes.retain(keep);
        self.write()
    }

    fn text(&self) -> String {
        serde_json::to_string(&self.notes).unwrap_or_else(|_| "[]".into())
    }

    /// The notes over the reserved bytes, in one write at offset 0, padded with spaces.
    fn write(&self) -> io::Result<()> {
        let mut bytes = self.text().into_bytes();
        if bytes.len() < RESERVED {
            bytes.resize(RESERVED, b' ');
        }
        self.file.write_all_at(&bytes, 0)?;
        self.file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(run: u32, reason: &str) -> Unfinished {
        Unfinished { run, system: "s".into(), stopped_ms: 1000 + u64::from(run), reason: reason.into() }
    }

    #[test]
    fn notes_survive_to_the_next_open_and_the_space_is_taken_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (mut runs, left) = UnfinishedRuns::open(dir.path()).unwrap();
        assert!(left.is_empty());
        let path = runs.path().to_owned();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), RESERVED as u64);
        runs.note(note(4, "database or disk is full")).unwrap();
        runs.note(note(5, &"x".repeat(5000))).unwrap();
        runs.note(note(4, "again")).unwrap();
        drop(runs);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), RESERVED as u64, "written in place");
        let (mut runs, left) = UnfinishedRuns::open(dir.path()).unwrap();
        assert_eq!(left.len(), 2, "{left:?}");
        assert_eq!(left[0].run, 5);
        assert!(left[0].reason.len() <= MAX_REASON + 3 && left[0].reason.ends_with('…'));
        assert_eq!(left[1], note(4, "again"));
        runs.retain(|n| n.run != 4).unwrap();
        drop(runs);
        let (_, left) = UnfinishedRuns::open(dir.path()).unwrap();
        assert_eq!(left.iter().map(|n| n.run).collect::<Vec<_>>(), [5]);
    }

    #[test]
    fn the_oldest_notes_give_way_when_the_space_is_short() {
        let dir = tempfile::tempdir().unwrap();
        let (mut runs, _) = UnfinishedRuns::open(dir.path()).unwrap();
        for run in 1..=20 {
            runs.note(note(run, &"y".repeat(900))).unwrap();
        }
        let (_, left) = UnfinishedRuns::open(dir.path()).unwrap();
        assert!(left.len() < 20 && left.last().unwrap().run == 20, "{}", left.len());
    }

    #[test]
    fn a_damaged_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(UNFINISHED_FILE), "{not json").unwrap();
        let e = UnfinishedRuns::open(dir.path()).unwrap_err();
        assert!(e.to_string().contains(UNFINISHED_FILE), "{e}");
    }
}
