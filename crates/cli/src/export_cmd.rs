//! `daqflow export`: a run's data files as Parquet, ROOT or HDF5 (docs/analysis-files.md).
//!
//! The files are written by the field's own libraries (pyarrow, uproot, h5py), which live in
//! Python: this command finds the files (a run number is looked up in the run database), checks
//! that the Python it is given has the daqflow package, and runs `python -m daqflow.export`
//! (`python/daqflow/export.py`), which streams the files in bounded memory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};
use daqflow_runcontrol::db::RunDb;

/// Where `demo` and `run` keep their data by default (`--data`).
const DEFAULT_DATA: &str = "daqflow-demo";

/// Arguments of `daqflow export`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// What to export, then the file to write (OUT, last): run numbers (their files, from the
    /// run database in --data) or data files (`.daq`, `.daq.part`), in order.
    #[arg(required = true, value_name = "RUN-or-FILE… OUT")]
    pub args: Vec<String>,
    /// The format to write.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub to: Format,
    /// Also write every fragment's payload (without it: the events' and fragments' numbers).
    #[arg(long)]
    pub payload: bool,
    /// The compression (parquet: none, snappy, zstd, lz4, gzip, brotli; root: none, zlib, lzma,
    /// lz4, zstd; hdf5: none, gzip, lzf); default: snappy, zlib, none.
    #[arg(long, value_name = "NAME")]
    pub compression: Option<String>,
    /// Replace OUT if it exists.
    #[arg(long)]
    pub overwrite: bool,
    /// Leave out damaged records instead of stopping at the first.
    #[arg(long)]
    pub skip_damaged: bool,
    /// The data directory whose run database (runs.sqlite) lists a run's files [default:
    /// daqflow-demo]; `daqflow --data DIR export …` says the same.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// The Python with the daqflow package and the format's library.
    #[arg(long, value_name = "PYTHON", env = "DAQFLOW_PYTHON", default_value = "python3")]
    pub python: PathBuf,
    /// Print what was done as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Write the histograms and counters the run ended with (saved in its record) instead of
    /// its events: one run number, `--to root`.
    #[arg(long)]
    pub histograms: bool,
}

/// The formats `daqflow export` writes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Apache Parquet, written by pyarrow.
    Parquet,
    /// A ROOT file with a TTree `events`, written by uproot.
    Root,
    /// HDF5, written by h5py.
    Hdf5,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Root => "root",
            Format::Hdf5 => "hdf5",
        }
    }
}

pub const USAGE: &str = "daqflow export [OPTIONS] --to <FORMAT> <RUN-or-FILE>... <OUT>";

pub const AFTER_HELP: &str = "\
One row per event: run, event id, trigger type, flags, builder unit, trigger time, size, and the
fragments as lists (source id, size, time stamp, flags; with --payload their bytes). The
layouts: docs/analysis-files.md.

The files are written by the field's Python libraries, through the daqflow Python package:
  pip install ./python               # the daqflow package, from daqflow's source (docs/python.md)
  pip install pyarrow                # parquet
  pip install uproot awkward         # root
  pip install h5py                   # hdf5
into the Python given by --python (or $DAQFLOW_PYTHON; default python3).

The output is written as OUT.part and renamed when complete: an export that fails or is
interrupted (Ctrl-C) leaves nothing behind. Exit status: 0 written, 2 an error.

With --histograms, the histograms and counters run RUN ended with (its record keeps them) are
written instead, for ROOT: a directory per component, TH1D, TH2D, and a TObjString per counter.

Examples:
  daqflow export 1 --to parquet run1.parquet                  # run 1 of ./daqflow-demo
  daqflow export 1 --histograms --to root run1-histograms.root
  daqflow --data /data/daq export 1234 --to root run1234.root
  daqflow export data/run000123_*.daq --to hdf5 --payload run123.h5";

/// `daqflow export`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let (out, inputs) = match args.args.split_last() {
        Some((out, inputs)) if !inputs.is_empty() => (out, inputs),
        _ => bail!(
            "give what to export (run numbers or data files), then the file to write: daqflow export 1 --to parquet run1.parquet"
        ),
    };
    let data = args.data.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DATA));
    if args.histograms {
        return export_histograms(args, inputs, out, &data);
    }
    let mut files = Vec::new();
    for input in inputs {
        files.extend(resolve(input, &data)?);
    }
    check_python(&args.python)?;
    let mut command = Command::new(&args.python);
    command.args(["-m", "daqflow.export", "--to", args.to.name(), "--output"]).arg(out);
    for (flag, on) in [
        ("--payload", args.payload),
        ("--overwrite", args.overwrite),
        ("--skip-damaged", args.skip_damaged),
        ("--json", args.json),
    ] {
        if on {
            command.arg(flag);
        }
    }
    if let Some(c) = &args.compression {
        command.args(["--compression", c]);
    }
    // `--` so that a file named like an option is a file.
    command.arg("--").args(&files);
    run_export(command, &args.python, None)
}

/// Runs the export `command` of `python` (with `input` on its standard input) to its end; its
/// exit status as this command's.
fn run_export(mut command: Command, python: &Path, input: Option<&[u8]>) -> anyhow::Result<ExitCode> {
    if input.is_some() {
        command.stdin(std::process::Stdio::piped());
    }
    let mut child = command.spawn().with_context(|| format!("running {}", python.display()))?;
    // Ctrl-C reaches the export too (the terminal's process group): it removes what it wrote
    // and exits 130. This process waits for that rather than leaving before it (the child was
    // started first: it would inherit an ignored SIGINT, and Python would not stop on Ctrl-C).
    let _ignored = IgnoreSigint::now();
    if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        use std::io::Write;
        // An export that ends early (an error it prints) closes the pipe: its status says why.
        let _ = stdin.write_all(bytes);
    }
    let status = child.wait().with_context(|| format!("waiting for {}", python.display()))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(130) => ExitCode::from(130),
        Some(_) => ExitCode::from(2),
        None => {
            eprintln!("daqflow export: {} ended by a signal ({status})", python.display());
            ExitCode::from(2)
        }
    })
}

/// `daqflow export RUN --histograms --to root OUT`: the histograms run RUN's record saved.
fn export_histograms(args: &Args, inputs: &[String], out: &str, data: &Path) -> anyhow::Result<ExitCode> {
    if args.to != Format::Root {
        bail!("--histograms writes ROOT histograms (TH1D, TH2D): give --to root");
    }
    let [input] = inputs else { bail!("--histograms exports one run's: give one run number") };
    let run: u32 = input.parse().map_err(|_| anyhow::anyhow!("--histograms: {input} is not a run number"))?;
    let (db, database) = run_database(data, run)?;
    let detail = db.run(run).with_context(|| format!("reading {}", database.display()))?;
    let Some(detail) = detail else { bail!("run {run}: no such run in {}", database.display()) };
    let Some(summary) = detail.summary else { bail!("run {run} has no summary (it has not ended, or was abandoned)") };
    if summary.histograms.is_empty() {
        bail!("run {run} saved no histogram (no component published one when it ended)");
    }
    check_python(&args.python)?;
    let input = serde_json::to_vec(&serde_json::json!({ "run": run, "histograms": summary.histograms }))?;
    let mut command = Command::new(&args.python);
    command.args(["-m", "daqflow.export", "--histograms", "-", "--to", "root", "--output", out]);
    for (flag, on) in [("--overwrite", args.overwrite), ("--json", args.json)] {
        if on {
            command.arg(flag);
        }
    }
    run_export(command, &args.python, Some(&input))
}

/// SIGINT ignored by this process while it lives; the disposition before it restored after.
struct IgnoreSigint(libc::sighandler_t);

impl IgnoreSigint {
    fn now() -> IgnoreSigint {
        // SAFETY: `signal` only replaces the disposition of SIGINT (no handler of ours runs).
        IgnoreSigint(unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) })
    }
}

impl Drop for IgnoreSigint {
    fn drop(&mut self) {
        if self.0 != libc::SIG_ERR {
            // SAFETY: restores the disposition `signal` returned, which was valid then.
            unsafe { libc::signal(libc::SIGINT, self.0) };
        }
    }
}

/// The files `input` names: itself when it is a file, else a run's files from the run database
/// in `data`.
fn resolve(input: &str, data: &Path) -> anyhow::Result<Vec<OsString>> {
    let path = Path::new(input);
    if path.is_file() {
        return Ok(vec![path.as_os_str().to_owned()]);
    }
    let Ok(run) = input.parse::<u32>() else {
        if path.exists() {
            bail!("{input} is not a data file (a directory? give the files: DIR/*.daq)");
        }
        bail!("{input}: no such file, and not a run number");
    };
    let (db, database) = run_database(data, run)?;
    let files = db.files(run).with_context(|| format!("reading {}", database.display()))?;
    if files.is_empty() {
        bail!(
            "run {run}: {} lists no data file for it ({})",
            database.display(),
            match db.run(run) {
                Ok(Some(d)) if d.record.stopped_ms.is_none() => "the run has not ended",
                Ok(Some(_)) => "the run wrote none",
                Ok(None) => "no such run",
                Err(_) => "its record could not be read",
            }
        );
    }
    let mut found = Vec::new();
    for f in files {
        // A relative path is the writer's, which ran in the data directory.
        let p = if f.path.is_absolute() { f.path } else { data.join(f.path) };
        if !p.is_file() {
            bail!("run {run}: its file {} (written by {}) is not there any more", p.display(), f.component);
        }
        found.push(p.into_os_string());
    }
    Ok(found)
}

/// The run database of the data directory `data` (and its path), which must exist: run `run` is
/// looked up there.
fn run_database(data: &Path, run: u32) -> anyhow::Result<(RunDb, PathBuf)> {
    let database = data.join("runs.sqlite");
    if !database.is_file() {
        bail!(
            "run {run}: there is no run database at {} (give the data directory of the `daqflow run` or `demo` that took \
             the run: daqflow --data DIR export …, or the files themselves)",
            database.display()
        );
    }
    let db = RunDb::open(&database).with_context(|| format!("opening {}", database.display()))?;
    Ok((db, database))
}

/// Whether `python` runs and has the daqflow package; a clear error saying how to get them
/// otherwise. The format's own library is checked by the export, which names its package.
fn check_python(python: &Path) -> anyhow::Result<()> {
    let install = "install the daqflow Python package into it: pip install ./python from daqflow's source \
                   (docs/python.md), with pyarrow, uproot and awkward, or h5py for the format; or give another \
                   Python with --python or $DAQFLOW_PYTHON";
    let probe = Command::new(python)
        .args(["-c", "import daqflow.export"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .output();
    match probe {
        Err(e) => bail!(
            "daqflow export writes files with Python's libraries, but {} did not run ({e}): {install}",
            python.display()
        ),
        Ok(o) if !o.status.success() => {
            let said = String::from_utf8_lossy(&o.stderr);
            let last = said.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
            bail!("{} has no daqflow Python package ({last}): {install}", python.display())
        }
        Ok(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_itself_and_anything_else_needs_a_run_database() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.daq");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(resolve(file.to_str().unwrap(), dir.path()).unwrap(), [file.clone().into_os_string()]);
        let e = resolve("nothing-here.daq", dir.path()).unwrap_err().to_string();
        assert_eq!(e, "nothing-here.daq: no such file, and not a run number");
        let e = resolve(dir.path().to_str().unwrap(), dir.path()).unwrap_err().to_string();
        assert!(e.contains("is not a data file (a directory?"), "{e}");
        let e = resolve("7", dir.path()).unwrap_err().to_string();
        assert!(e.starts_with("run 7: there is no run database at"), "{e}");
    }

    #[test]
    fn a_run_is_its_files_from_the_run_database() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::open(&dir.path().join("runs.sqlite")).unwrap();
        assert_eq!(db.begin_run("s", "cfg", Some(3)).unwrap(), 3);
        assert_eq!(db.begin_run("s", "cfg", Some(4)).unwrap(), 4);
        let e = resolve("3", dir.path()).unwrap_err().to_string();
        assert!(e.ends_with("lists no data file for it (the run has not ended)"), "{e}");
        let e = resolve("9", dir.path()).unwrap_err().to_string();
        assert!(e.ends_with("(no such run)"), "{e}");
        let mut summary = daqflow_runcontrol::db::example_summary(3, 2);
        for name in ["run000003_bu-0_0001.daq", "sub/run000003_bu-1_0001.daq"] {
            summary.files.push(daqflow_api::FileRecord {
                component: name.split('_').nth(1).unwrap().into(),
                path: name.into(),
                events: 1,
                bytes: 1,
                first_event: None,
                last_event: None,
                complete: true,
            });
        }
        db.end_run(&summary).unwrap();
        let e = resolve("3", dir.path()).unwrap_err().to_string();
        assert!(e.contains("run000003_bu-0_0001.daq (written by bu-0) is not there any more"), "{e}");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        for name in ["run000003_bu-0_0001.daq", "sub/run000003_bu-1_0001.daq"] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let files = resolve("3", dir.path()).unwrap();
        let expected: Vec<OsString> = ["run000003_bu-0_0001.daq", "sub/run000003_bu-1_0001.daq"]
            .iter()
            .map(|n| dir.path().join(n).into_os_string())
            .collect();
        assert_eq!(files, expected, "relative paths are the data directory's, in writer order");
    }
}
