//! `daqflow`: the one binary of the daqflow data-acquisition framework.
//!
//! Every subcommand has `--help` with examples. See the README and `docs/`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod child;
mod component_cmd;
mod dialog_cmd;
mod engine_cmd;
mod et_cmd;
mod evb_cmd;
mod export_cmd;
mod format;
mod inspect;
mod metrics;
mod profile_cmd;
mod retention;
mod run_cmd;
mod soak_cmd;
mod terminal;

/// daqflow: a data-acquisition dataflow framework for physics experiments.
///
/// Readout, event building across hosts, event distribution, recording and online monitoring,
/// with the control plane and run control that hold them together.
#[derive(Parser, Debug)]
#[command(name = "daqflow", version, propagate_version = true)]
#[command(after_help = "Examples:\n  \
    daqflow bench transport --quick --out bench-out   reproduce the transport figures\n  \
    daqflow inspect --verify run000123_0001.daq       check a data file\n  \
    daqflow control-server &                          start a control plane\n  \
    daqflow dialog ls                                 list its processes\n  \
    daqflow --data daqflow-demo dialog ls             the processes of the demo that runs there\n  \
    daqflow engine testbed --profile run.prof         run the ROB test bed, profiled\n  \
    daqflow evb local --output /dev/shm/evb           a whole event builder on this machine\n  \
    daqflow profile run.prof --out profile-out        its histograms and sequence diagram\n\n\
    Logging: set DAQFLOW_LOG (e.g. DAQFLOW_LOG=debug or DAQFLOW_LOG=daqflow_transport=trace).")]
struct Cli {
    /// The system token: a file holding the shared secret every connection proves (mode 0600).
    /// Components, control servers and clients of one system share it; `daqflow run` and
    /// `daqflow demo` make one per system when none is given.
    #[arg(long, global = true, env = "DAQFLOW_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The data directory of a running operator (`daqflow demo`, `daqflow run`), given before
    /// the command: `dialog` finds the control server in DIR/operator.lock and the token in
    /// DIR/token (`daqflow --data daqflow-demo dialog ls`); `--control` and the token's own
    /// options win over it. For `demo` and `run` it is their `--data`.
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The main job: a whole DAQ on this machine (trigger, sources, readout and builder units,
    /// ET, recorder, monitor, message logger, run database, web UI), one run, a summary.
    #[command(after_help = run_cmd::DEMO_AFTER_HELP)]
    Demo(run_cmd::DemoArgs),
    /// The operator: start the system a TOML file describes, drive its runs, serve the web UI.
    #[command(after_help = run_cmd::RUN_AFTER_HELP)]
    Run(run_cmd::RunArgs),
    /// Print the version of daqflow and of its formats.
    Version,
    /// Read data files: summary, size distribution, and with --verify every CRC.
    #[command(after_help = inspect::AFTER_HELP)]
    Inspect(inspect::Args),
    /// Write data files (a run's, or those given) as Parquet, ROOT or HDF5 for analysis.
    #[command(after_help = export_cmd::AFTER_HELP, override_usage = export_cmd::USAGE)]
    Export(export_cmd::Args),
    /// Reproduce the papers' figures on this machine: table, CSV, JSON and PNG.
    #[command(after_help = bench::AFTER_HELP)]
    Bench(bench::Args),
    /// Run the dialog control server (the control plane's directory).
    #[command(name = "control-server", after_help = dialog_cmd::SERVER_AFTER_HELP)]
    ControlServer(dialog_cmd::ServerArgs),
    /// Look at and talk to the control plane: list processes, listen, send, publish.
    #[command(after_help = dialog_cmd::DIALOG_AFTER_HELP)]
    Dialog(dialog_cmd::DialogArgs),
    /// The Event Transfer system: run one, produce, consume, monitor, bridge.
    #[command(after_help = et_cmd::AFTER_HELP)]
    Et(et_cmd::EtArgs),
    /// The event builder (CMS DAQ2): a whole builder on this machine (`evb local`).
    #[command(after_help = evb_cmd::AFTER_HELP)]
    Evb(evb_cmd::EvbArgs),
    /// Run one component (source, evm, ru, bu, et, recorder, monitor, msglogger, generator,
    /// repeater, sink) as this process, driven by commands on stdin or the control plane.
    #[command(after_help = component_cmd::AFTER_HELP)]
    Component(component_cmd::Args),
    /// The data-plane engine's examples: the paper's ROB / TRG / collector test bed, profiled.
    #[command(after_help = engine_cmd::AFTER_HELP)]
    Engine(engine_cmd::EngineArgs),
    /// Read a time-stamp profile: per-probe time distributions, scheduler transitions, and
    /// histograms and a sequence diagram as PNG.
    #[command(after_help = profile_cmd::AFTER_HELP)]
    Profile(profile_cmd::Args),
    /// The demo's system at full speed for N minutes with random kill -9 of its restartable
    /// components: every event accounted for, files verified, no growth of memory, files or
    /// /dev/shm.
    #[command(after_help = soak_cmd::AFTER_HELP)]
    Soak(soak_cmd::Args),
    /// Processes the benchmark suites start (not for direct use).
    #[command(name = "bench-helper", hide = true)]
    BenchHelper {
        #[command(subcommand)]
        role: bench::helper::HelperRole,
    },
}

/// Memory freed by a process stays with it, to be reused without page faults.
///
/// glibc's defaults give a freed allocation back to the kernel as soon as 128 KiB to a few MiB
/// lie free at the top of a heap, and serve allocations from 128 KiB up (raised on the fly to the
/// largest one freed, 32 MiB at most) with `mmap`. A readout unit or a builder unit receives into
/// 1 MiB chunks that live as long as the fragments in them: each chunk freed after its events
/// left was handed back, and the next one faulted in and zeroed page by page inside the socket
/// read (4 % of the RU's time at 4 KiB fragments, in `exc_page_fault` and `clear_page_erms`
/// under `tcp_recvmsg`; docs/performance.md). Here allocations up to 32 MiB come from the heap
/// and up to 64 MiB of free memory at its top is kept: a process's memory is its peak of the
/// last run, not less.
fn keep_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters; called first in `main`, before any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    let mut cli = Cli::parse();
    // Servers and components report what they do; short-lived tools only what goes wrong.
    init_logging(match cli.command {
        Command::ControlServer(_) | Command::Component(_) => "info",
        Command::Run(_) | Command::Demo(_) => "warn",
        Command::Et(ref args) if args.is_server() => "info",
        _ => "warn",
    });
    // The commands whose job is printing (`daqflow inspect … | head`) end as a shell's tools do
    // when the reader goes: by SIGPIPE, not a panic of `println!` with a backtrace. Rust ignores
    // SIGPIPE for every program; the others keep it ignored (their sockets and pipes report a
    // gone peer as an error they handle).
    if matches!(cli.command, Command::Inspect(_) | Command::Version | Command::Profile(_) | Command::Export(_)) {
        // SAFETY: restores the default disposition of SIGPIPE before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // A program of the user's own (`component --command`) reads the token line itself.
    let token_stdin = matches!(&cli.command, Command::Component(args) if args.token_stdin && args.command.is_none());
    // `--data DIR` before the command: the data directory of a running operator, for the tools.
    let data_token = match (&cli.data, &mut cli.command) {
        (None, _) => None,
        (Some(dir), Command::Dialog(_)) => Some(dir.join("token")),
        (Some(dir), Command::Demo(args)) => match args.data.replace(dir.clone()) {
            Some(own) if own != *dir => return data_twice(dir, &own),
            _ => None,
        },
        (Some(dir), Command::Run(args)) => match args.data.replace(dir.clone()) {
            Some(own) if own != *dir => return data_twice(dir, &own),
            _ => None,
        },
        (Some(dir), Command::Export(args)) => match args.data.replace(dir.clone()) {
            Some(own) if own != *dir => return data_twice(dir, &own),
            _ => None,
        },
        (Some(_), _) => {
            eprintln!(
                "daqflow: error: --data before the command is read by `dialog`, `demo`, `run` and `export`; give this command's own options after its name (see its --help)"
            );
            return ExitCode::from(2);
        }
    };
    let token = match (&cli.token_file, std::env::var(TOKEN_ENV), &data_token) {
        _ if token_stdin => component_cmd::read_token_line(std::io::stdin().lock())
            .map(Some)
            .map_err(|e| format!("--token-stdin: {e:#}")),
        (Some(path), _, _) => {
            daqflow_dialog::Token::from_file(path).map(Some).map_err(|e| format!("--token-file: {e}"))
        }
        (None, Ok(text), _) => daqflow_dialog::Token::new(&text).map(Some).map_err(|e| format!("{TOKEN_ENV}: {e}")),
        (None, Err(_), Some(path)) => daqflow_dialog::Token::from_file(path).map(Some).map_err(|e| {
            format!(
                "--data: {e} (is {} the data directory of a `daqflow demo` or `daqflow run`?)",
                path.parent().map_or_else(String::new, |d| d.display().to_string())
            )
        }),
        (None, Err(_), None) => Ok(None),
    };
    match token {
        Ok(t) => daqflow_transport::auth::set_process_token(t),
        Err(e) => {
            eprintln!("daqflow: error: {e}");
            return ExitCode::from(2);
        }
    }
    let result = match cli.command {
        Command::Demo(args) => run_cmd::demo(&args),
        Command::Run(args) => run_cmd::run(&args),
        Command::Version => {
            print_version();
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect(args) => inspect::run(&args),
        Command::Export(args) => export_cmd::run(&args),
        Command::Bench(args) => bench::run(&args).map(|()| ExitCode::SUCCESS),
        Command::ControlServer(args) => dialog_cmd::run_server(&args),
        Command::Dialog(args) => dialog_cmd::run(&args, cli.data.as_deref(), cli.token_file.as_deref()),
        Command::Et(args) => et_cmd::run(&args),
        Command::Engine(args) => engine_cmd::run(&args),
        Command::Evb(args) => evb_cmd::run(&args),
        Command::Component(args) => component_cmd::run(&args, cli.token_file.as_deref()),
        Command::Soak(args) => soak_cmd::run(&args),
        Command::Profile(args) => profile_cmd::run(&args),
        Command::BenchHelper { role } => bench::helper::run_helper(&role).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            terminal::say_err!("daqflow: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// `daqflow --data A demo --data B` (or `run`): two data directories.
fn data_twice(before: &std::path::Path, after: &std::path::Path) -> ExitCode {
    eprintln!(
        "daqflow: error: two data directories: --data {} before the command and --data {} after it; give one",
        before.display(),
        after.display()
    );
    ExitCode::from(2)
}

/// The environment variable a launcher passes the system token in (the secret itself, for a
/// child process: only its user can read a process's environment); `--token-file` wins.
pub(crate) const TOKEN_ENV: &str = "DAQFLOW_TOKEN";

/// The system token of a system this process starts by itself (`evb local`, the bench suites):
/// the process's own (`--token-file`), else a new random one, which the children get in
/// `DAQFLOW_TOKEN`.
pub(crate) fn ensure_process_token() -> anyhow::Result<daqflow_dialog::Token> {
    if let Some(t) = daqflow_transport::auth::process_token() {
        return Ok(t);
    }
    let t = daqflow_dialog::Token::try_generate()?;
    daqflow_transport::auth::set_process_token(Some(t.clone()));
    Ok(t)
}

fn init_logging(default_level: &str) {
    daqflow_component::log::init(default_level);
}

fn print_version() {
    use daqflow_wire::*;
    println!("daqflow {}", env!("CARGO_PKG_VERSION"));
    println!(
        "formats: fragment v{FRAGMENT_VERSION}, super-fragment v{SUPER_FRAGMENT_VERSION}, event v{EVENT_VERSION}, frame v{}, data file v{}",
        frame::FRAME_VERSION,
        file::FILE_VERSION
    );
    println!("checksum: CRC32C (crc-fast, hardware accelerated where the CPU allows)");
}

/// A directory argument that is created when missing.
pub(crate) fn ensure_dir(dir: &PathBuf) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))
}
