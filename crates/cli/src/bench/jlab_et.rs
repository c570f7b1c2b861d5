//! Jefferson Lab's ET, run beside daqflow's in `daqflow bench et --jlab-et DIR`: its own
//! `et_start`, `et_producer` and `et_consumer` (the programs of its release, built from its
//! public source: `scripts/build-jlab-et.sh`), at the settings of the suite's `batch` case.
//!
//! Its programs print their rate every 5 s (`… Events: 8.25e+05 Hz, …`): a measurement runs the
//! system, one consumer on a blocking station of its own and one producer attached to
//! GrandCentral (events of 64 B, only the length set, `-c BATCH` events per call on both sides,
//! the same pool of 3000 events), and takes the consumer's second 5 s interval (the first one
//! starts before the producer does).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::helper::Helper;

/// The programs used, in the order they start.
const PROGRAMS: [&str; 3] = ["et_start", "et_producer", "et_consumer"];

/// Where Jefferson Lab's ET programs are: `dir` itself or its `examples` folder (where its CMake
/// build installs the producer and consumer), each program found in one of them.
#[derive(Debug, Clone)]
pub struct JlabEt {
    programs: [PathBuf; 3],
    /// `LD_LIBRARY_PATH` for `libet.so` (`dir/../lib` and `dir/lib` where they exist, then the
    /// caller's).
    library_path: String,
}

impl JlabEt {
    /// Finds the programs under `dir`; an error naming what is missing and how to build it.
    pub fn find(dir: &Path) -> anyhow::Result<JlabEt> {
        let look = |name: &str| -> Option<PathBuf> {
            [dir.join(name), dir.join("examples").join(name), dir.join("bin").join(name)]
                .into_iter()
                .find(|p| p.is_file())
        };
        let mut found = Vec::new();
        for name in PROGRAMS {
            match look(name) {
                Some(p) => found.push(p),
                None => bail!(
                    "--jlab-et {}: no `{name}` there or in its `examples` or `bin` folder (build Jefferson Lab's ET \
                     with its examples: scripts/build-jlab-et.sh SOURCE PREFIX, then --jlab-et PREFIX/bin)",
                    dir.display()
                ),
            }
        }
        let mut libs: Vec<String> = [dir.join("../lib"), dir.join("lib"), dir.join("../../lib")]
            .iter()
            .filter(|p| p.is_dir())
            .map(|p| p.display().to_string())
            .collect();
        if let Ok(v) = std::env::var("LD_LIBRARY_PATH") {
            libs.push(v);
        }
        let programs = found.try_into().map_err(|_| anyhow::anyhow!("three programs"))?;
        Ok(JlabEt { programs, library_path: libs.join(":") })
    }

    /// `program` with its output line-buffered (`stdbuf -oL`: the programs use stdio, which
    /// holds its lines in a block buffer when writing into a pipe).
    fn command(&self, index: usize, args: &[&str]) -> Command {
        let mut c = Command::new("stdbuf");
        c.arg("-oL").arg(&self.programs[index]).args(args).env("LD_LIBRARY_PATH", &self.library_path);
        c
    }

    /// One measurement: events/s through a consumer of `batch` events per call, 64 B events.
    pub fn measure(&self, batch: usize, n: u64) -> anyhow::Result<f64> {
        let file = std::env::temp_dir().join(format!("daqflow-bench-jlab-et-{}-{n}", std::process::id()));
        let _remove = Remove(file.clone());
        let f = file.to_str().context("temporary file name")?;
        let batch = batch.to_string();
        let system =
            Helper::spawn_command(self.command(0, &["-f", f, "-n", "3000", "-s", "64", "-d"])).context("et_start")?;
        // Ready once its memory-mapped file exists and the system has had a moment to start
        // its threads (et_start says nothing machine-readable when it is).
        let ready = Instant::now() + Duration::from_secs(20);
        while !file.exists() {
            if Instant::now() > ready {
                bail!("Jefferson Lab's et_start made no {f} in 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(500));
        let consumer =
            Helper::spawn_command(self.command(2, &["-f", f, "-s", "c", "-c", &batch])).context("et_consumer")?;
        std::thread::sleep(Duration::from_millis(300));
        let producer =
            Helper::spawn_command(self.command(1, &["-f", f, "-c", &batch, "-s", "64"])).context("et_producer")?;
        let rates = rates(&consumer, 2, Duration::from_secs(30))?;
        drop((producer, consumer, system));
        Ok(rates[1])
    }
}

/// Removes a file when dropped.
struct Remove(PathBuf);

impl Drop for Remove {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The first `count` rates a JLab program printed (`… Events: RATE Hz, …`), waiting at most
/// `limit` in all; what it said instead if it stops or says none.
fn rates(program: &Helper, count: usize, limit: Duration) -> anyhow::Result<Vec<f64>> {
    let end = Instant::now() + limit;
    let mut out = Vec::new();
    let mut said = Vec::new();
    while out.len() < count {
        let left = end.saturating_duration_since(Instant::now());
        let line = match program.line(left) {
            Ok(l) => l,
            Err(_) => bail!(
                "Jefferson Lab's et_consumer printed {} rate(s) in {limit:?}; it said: {}",
                out.len(),
                said.join(" | ")
            ),
        };
        match parse_rate(&line) {
            Some(r) => out.push(r),
            None if !line.trim().is_empty() && said.len() < 8 => said.push(line),
            None => {}
        }
    }
    Ok(out)
}

/// The rate of a JLab producer's or consumer's `Events:` line.
fn parse_rate(line: &str) -> Option<f64> {
    let rest = line.split_once("Events:")?.1;
    rest.split_whitespace().next()?.trim_end_matches(',').parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_of_a_jlab_line_is_read_and_other_lines_are_not() {
        assert_eq!(parse_rate(" et_consumer Events: 8.25e+05 Hz,  8.25e+05 Avg."), Some(825_000.0));
        assert_eq!(parse_rate("et_producer Events:  1.234e+07 Hz,    1.2e+07 Avg."), Some(12_340_000.0));
        assert_eq!(parse_rate(" et_consumer Data:   5.28e+04 kB/s,  5.28e+04 Avg."), None);
        assert_eq!(parse_rate("ET is local"), None);
    }

    #[test]
    fn missing_programs_are_named_with_how_to_build_them() {
        let dir = tempfile::tempdir().unwrap();
        let e = JlabEt::find(dir.path()).unwrap_err().to_string();
        assert!(e.contains("no `et_start`") && e.contains("scripts/build-jlab-et.sh"), "{e}");
        for p in PROGRAMS {
            std::fs::write(dir.path().join(p), "").unwrap();
        }
        let found = JlabEt::find(dir.path()).unwrap();
        assert_eq!(found.programs[1], dir.path().join("et_producer"));
    }
}
