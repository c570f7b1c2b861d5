//! `daqflow component KIND`: one component as a process, driven by line commands on its standard
//! input (what `daqflow bench chain`, the late builder unit of `daqflow evb local --join-bu` and
//! scripts use; the operator drives the same components over the control plane).
//!
//! Commands, one per line: `configure`, `start RUN`, `pause`, `resume`, `stop [ARG]`, `stats`,
//! `state`, `reset`, `quit`. Every command gets exactly one JSON line on standard output:
//! `{"ok":true,"state":"Running","result":…}` or `{"ok":false,"state":…,"error":"…"}`. When the
//! component fails during a run, a line `{"event":"error","error":"…"}` appears by itself. End of
//! input stops a running component and exits; so does SIGTERM or Ctrl-C.
//!
//! With `--token-stdin` the first line of standard input is the system token, read before
//! anything else (how the operator hands it to a component on another host: never on a command
//! line, never in an environment). With `--control`, `--lease` bounds how long the component
//! goes on without any control server.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

pub const AFTER_HELP: &str = "Examples:\n  \
    daqflow component evm --name evm --set rus=2 --set listen=127.0.0.1:7100\n  \
    daqflow component ru --name ru-0 --set id=0 --set evm=127.0.0.1:7100 --set streams=4\n  \
    daqflow component bu --name bu-0 --config bu.toml --set output=files --set directory=/dev/shm/run\n  \
    daqflow component source --name src-3 --set source_id=3 --set ru=127.0.0.1:7201 --set size.kind=lognormal \\\n      \
    --set size.mean=2048 --set size.rms=512\n  \
    daqflow component --command \"python3 python/examples/readout.py\" --name src-3 --set source_id=3 \\\n      \
    --set ru=127.0.0.1:7201   (a component written in Python: docs/python.md)\n\n\
    Then type commands (one per line): configure, start RUN, pause, resume, stats, stop [LAST_EVENT],\n\
    set KEY=VALUE (a live parameter), state, schema, reset, quit.\n\
    Each gets one JSON line back. With --start RUN the component configures and starts at once and\n\
    runs until its input ends or it gets SIGTERM / Ctrl-C; it then stops and prints its summary.\n\n\
    With --control HOST:PORT the component also joins the control plane: `daqflow dialog send\n\
    evm/start 7`, `daqflow dialog listen evm/state`. It then ends by itself when no control server\n\
    was reachable for longer than --lease (15 s; 0: never), stopping a run in progress.\n\n\
    With --token-stdin the first input line is the system token (what the operator does over ssh):\n  \
    (cat DATA/token; cat) | ssh host daqflow component sink --name s --control ADDR --token-stdin\n\n\
    Every kind's configuration keys, their ranges, units and live states: `daqflow component KIND\n\
    --schema` (the tables of docs/operator-guide.md, \"Parameters of the standard kinds\").";

/// Arguments of `daqflow component`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// What to run: source, evm, ru, bu (the event builder), et, recorder, monitor, msglogger,
    /// generator, repeater, sink. With --command: the kind's name the program is told
    /// (`--kind`), if given.
    #[arg(required_unless_present = "command")]
    pub kind: Option<String>,
    /// Run a component program of your own instead of a built-in kind, e.g.
    /// `"python3 my_readout.py"` (a `daqflow.Component` from the Python package): the command
    /// line (read by /bin/sh) gets this command's arguments (`--name`, `--config`, `--set`,
    /// `--start`, `--control`, `--lease`, `--operator`, `--token-stdin`, `--kind`) and the system
    /// token's file in `DAQFLOW_TOKEN_FILE`; it replaces this process.
    #[arg(long, value_name = "COMMAND")]
    pub command: Option<String>,
    /// The component's name, unique in the system.
    #[arg(long, required_unless_present = "schema")]
    pub name: Option<String>,
    /// Print the kind's typed schema and exit: every configuration key with its default, range
    /// and unit, the states in which it may change live, and its meaning; then what `configure`
    /// gives others (`${NAME.KEY}`). A Markdown table (the one in docs/operator-guide.md), or
    /// JSON with --json (what the web UI and the Python package read).
    #[arg(long, conflicts_with = "command")]
    pub schema: bool,
    /// With --schema: JSON instead of a table.
    #[arg(long, requires = "schema")]
    pub json: bool,
    /// A TOML file with the configuration keys.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Set one configuration key (dotted for nested keys: size.kind=lognormal); after --config.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Configure and start run RUN at once, then run until the input ends or a signal.
    #[arg(long, value_name = "RUN")]
    pub start: Option<u32>,
    /// Also take commands from the control plane (the dialog control server at HOST:PORT):
    /// `NAME/configure` (payload: optional {"config": {…}} merged over the configuration),
    /// `NAME/start` (payload: the run number), `NAME/pause`, `NAME/resume`, `NAME/stop`
    /// (payload: optional last event), `NAME/reset`, and the same under `all/`; publish
    /// `NAME/state`, `NAME/stats` (JSON, once a second and on every change) and `NAME/log`.
    /// The end of standard input then does not end the process (unless --token-stdin); SIGTERM,
    /// Ctrl-C or the end of --lease does.
    #[arg(long, value_name = "HOST:PORT")]
    pub control: Option<String>,
    /// With --control: end (stopping a run in progress; exit status 1) once no control server
    /// has been reachable for longer than this many seconds; 0: never. The operator gives its
    /// system file's `lease_s`.
    #[arg(long, value_name = "SECS", default_value = "15", value_parser = parse_lease)]
    pub lease: f64,
    /// Read the system token from the first line of standard input, before anything else (it
    /// wins over --token-file and the environment): how the operator hands it to a component on
    /// another host. Standard input is then the launcher's line to the component: its end ends
    /// the component, also with --control.
    #[arg(long)]
    pub token_stdin: bool,
    /// With --control: take commands only from the process of this name (the operator that
    /// started the component gives its own, `operator`): a command from anyone else is refused
    /// with a reply saying so, so the operator's control lock covers every way to drive the run.
    #[arg(long, value_name = "NAME")]
    pub operator: Option<String>,
    /// With --control: the incarnation the operator launched this process as (a number new at
    /// every start, default `$DAQFLOW_INCARNATION`), put in every `NAME/state`: the operator
    /// takes statuses only from the incarnation it launched.
    #[arg(long, value_name = "N", env = "DAQFLOW_INCARNATION")]
    pub incarnation: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics: the component's state, run, counters
    /// and each number of its kind's statistics, labelled with its name and kind, in the names
    /// of the operator's /metrics (docs/operator-guide.md, "Monitoring with Prometheus"). Not
    /// with --command (a program of your own serves its own).
    #[arg(long, value_name = "ADDR", conflicts_with = "command")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Pin the whole process to these CPUs first thing, before any thread starts (every
    /// thread inherits them): the kernel's list form, `0`, `0,2`, `0-3,8`. What the operator
    /// gives from a component's `cpus = [..]`. A CPU this process may not use is refused.
    /// With --command the program runs pinned.
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<daqflow_wire::affinity::CpuSet>,
}

/// The longest `--lease`, in seconds (a day).
const MAX_LEASE_S: f64 = 86_400.0;

pub(crate) fn parse_lease(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=MAX_LEASE_S).contains(&s) => Ok(s),
        _ => Err(format!("`{text}` is not a number of seconds from 0 (never) to {MAX_LEASE_S}")),
    }
}

/// Reads the system token from the first line of `input` (`--token-stdin`), leaving the rest
/// of the input unread.
pub fn read_token_line(input: impl std::io::BufRead) -> anyhow::Result<daqflow_dialog::Token> {
    use std::io::BufRead;
    let limit = daqflow_transport::auth::MAX_TOKEN_LEN + 2;
    let mut line = Vec::new();
    input.take(limit as u64).read_until(b'\n', &mut line).context("reading standard input")?;
    if line.is_empty() {
        bail!("standard input ended before the token's line");
    }
    if line.last() != Some(&b'\n') && line.len() >= limit {
        bail!("the first line of standard input is longer than a token ({} bytes at most)", limit - 2);
    }
    let text = std::str::from_utf8(&line).context("the token's line is not UTF-8")?;
    Ok(daqflow_dialog::Token::new(text)?)
}

/// Reads `--config` and applies `--set`s into one TOML table
/// ([`daqflow_component::process::config_table`]).
pub fn config_table(config: Option<&PathBuf>, sets: &[String]) -> anyhow::Result<toml::Table> {
    Ok(daqflow_component::process::config_table(config.map(PathBuf::as_path), sets)?)
}

/// A TOML value (number, boolean, array, inline table, quoted string) or else a bare string.
pub(crate) fn parse_value(v: &str) -> toml::Value {
    daqflow_component::process::parse_value(v)
}

/// The arguments a component program of the user's own gets (`--command`): the ones this
/// command was given, in the same spelling.
pub fn forwarded_args(args: &Args) -> Vec<String> {
    let mut out = vec!["--name".to_owned(), args.name.clone().unwrap_or_default()];
    if let Some(kind) = &args.kind {
        out.extend(["--kind".to_owned(), kind.clone()]);
    }
    if let Some(config) = &args.config {
        out.extend(["--config".to_owned(), config.display().to_string()]);
    }
    for set in &args.set {
        out.extend(["--set".to_owned(), set.clone()]);
    }
    if let Some(run) = args.start {
        out.extend(["--start".to_owned(), run.to_string()]);
    }
    if let Some(control) = &args.control {
        out.extend(["--control".to_owned(), control.clone()]);
    }
    out.extend(["--lease".to_owned(), args.lease.to_string()]);
    if let Some(operator) = &args.operator {
        out.extend(["--operator".to_owned(), operator.clone()]);
    }
    if let Some(incarnation) = args.incarnation {
        out.extend(["--incarnation".to_owned(), incarnation.to_string()]);
    }
    if args.token_stdin {
        out.push("--token-stdin".to_owned());
    }
    out
}

/// `--command`: becomes the user's program (exec through /bin/sh, so that the command may hold
/// quoted words), with [`forwarded_args`] after it.
fn exec_command(command: &str, args: &Args, token_file: Option<&std::path::Path>) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    if command.trim().is_empty() {
        return anyhow::anyhow!("--command must name a program");
    }
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c").arg(format!("exec {command} \"$@\"")).arg("daqflow-component").args(forwarded_args(args));
    if let Some(path) = token_file {
        cmd.env("DAQFLOW_TOKEN_FILE", path);
    }
    let e = cmd.exec();
    anyhow::anyhow!("running {command}: {e}")
}

pub fn run(args: &Args, token_file: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    if let Some(cpus) = &args.cpus {
        daqflow_wire::affinity::pin_process(cpus).with_context(|| format!("--cpus {cpus}"))?;
    }
    if let Some(command) = &args.command {
        return Err(exec_command(command, args, token_file));
    }
    let registry = daqflow::registry::standard();
    let kind = args.kind.clone().unwrap_or_default();
    if !registry.kinds().contains(&kind.as_str()) {
        bail!(
            "unknown component kind `{kind}` (known: {}; or --command for a program of your own)",
            registry.kinds().join(", ")
        );
    }
    if args.schema {
        let Some(schema) = registry.kind(&kind).and_then(|k| k.schema.as_deref()) else {
            bail!("the kind `{kind}` declares no schema");
        };
        if args.json {
            println!("{}", serde_json::to_string_pretty(schema)?);
        } else {
            print!("{}", schema.to_markdown());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let options = daqflow_component::process::Options {
        kind,
        name: args.name.clone().unwrap_or_default(),
        config: config_table(args.config.as_ref(), &args.set)?,
        start: args.start,
        control: args.control.clone(),
        lease: (args.lease > 0.0).then(|| std::time::Duration::from_secs_f64(args.lease)),
        end_with_stdin: args.token_stdin,
        operator: args.operator.clone(),
        incarnation: args.incarnation,
        transition_delay: transition_delay(
            args.name.as_deref().unwrap_or_default(),
            std::env::var(DELAY_ENV).ok().as_deref(),
        )?,
    };
    let (seen, mut observer) = crate::metrics::observe(&options.name, &options.kind);
    let _metrics = match args.metrics {
        Some(addr) => {
            let what = format!("component {}", options.name);
            Some(crate::metrics::serve(addr, &what, move || {
                crate::metrics::component(&seen.lock().unwrap_or_else(|p| p.into_inner()))
            })?)
        }
        None => None,
    };
    let failed = daqflow_component::process::run_observed(registry, options, &mut observer)?;
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The environment variable that makes components slow (docs/operator-guide.md, "A slow
/// component"): `MS` for every component, or `NAME=MS[,NAME=MS…]` for the ones named.
pub const DELAY_ENV: &str = "DAQFLOW_TRANSITION_DELAY";

/// How long component `name` waits before joining and before each transition, from
/// [`DELAY_ENV`]'s value `spec` (none or empty: not at all).
pub fn transition_delay(name: &str, spec: Option<&str>) -> anyhow::Result<std::time::Duration> {
    let ms = |text: &str| -> anyhow::Result<u64> {
        match text.trim().parse::<u64>() {
            Ok(ms) if ms <= 600_000 => Ok(ms),
            _ => bail!("{DELAY_ENV}: `{text}` is not a number of milliseconds from 0 to 600000"),
        }
    };
    let spec = spec.unwrap_or("").trim();
    if spec.is_empty() {
        return Ok(std::time::Duration::ZERO);
    }
    if !spec.contains('=') {
        return Ok(std::time::Duration::from_millis(ms(spec)?));
    }
    let mut delay = 0;
    for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((who, value)) = item.split_once('=') else {
            bail!("{DELAY_ENV}: `{item}` is not NAME=MS (or give one number for every component)");
        };
        let value = ms(value)?;
        if who.trim() == name {
            delay = value;
        }
    }
    Ok(std::time::Duration::from_millis(delay))
}

/// A flag set by SIGTERM or SIGINT.
pub fn install_signal_flag() -> anyhow::Result<&'static std::sync::atomic::AtomicBool> {
    Ok(daqflow_component::process::signal_flag()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_the_first_line_and_the_rest_of_the_input_stays() {
        use std::io::BufRead;
        let mut input = std::io::Cursor::new(b"0123abcd\nconfigure\nstart 1\n".to_vec());
        let token = read_token_line(&mut input).unwrap();
        assert_eq!(token.as_bytes(), b"0123abcd");
        let rest: Vec<String> = (&mut input).lines().map(Result::unwrap).collect();
        assert_eq!(rest, ["configure", "start 1"]);
        // Without a newline at the end of the input, the token is still the line.
        assert_eq!(read_token_line(std::io::Cursor::new(b"abc".to_vec())).unwrap().as_bytes(), b"abc");
    }

    #[test]
    fn no_token_an_empty_one_or_an_endless_line_are_refused() {
        let err = |bytes: &[u8]| read_token_line(std::io::Cursor::new(bytes.to_vec())).unwrap_err().to_string();
        assert!(err(b"").contains("ended before the token"));
        assert!(err(b"\nsecret\n").contains("empty"));
        assert!(err(b"two words\n").contains("white space"));
        assert!(err(&vec![b'a'; 5000]).contains("longer than a token"));
    }

    #[test]
    fn a_transition_delay_is_for_every_component_or_the_ones_named() {
        let d = |name: &str, spec: Option<&str>| transition_delay(name, spec).map(|d| d.as_millis());
        assert_eq!(d("evm", None).unwrap(), 0);
        assert_eq!(d("evm", Some(" ")).unwrap(), 0);
        assert_eq!(d("evm", Some("1500")).unwrap(), 1500);
        assert_eq!(d("evm", Some("sink=200, evm=1500")).unwrap(), 1500);
        assert_eq!(d("ru-0", Some("sink=200,evm=1500")).unwrap(), 0);
        for bad in ["soon", "evm", "evm=x", "evm=1500,sink", "700000"] {
            assert!(transition_delay("evm", Some(bad)).unwrap_err().to_string().contains(DELAY_ENV), "{bad}");
        }
    }

    #[test]
    fn a_lease_is_zero_or_a_positive_number_of_seconds_up_to_a_day() {
        assert_eq!(parse_lease("0"), Ok(0.0));
        assert_eq!(parse_lease("7.5"), Ok(7.5));
        for bad in ["-1", "nan", "inf", "1e6", "soon"] {
            assert!(parse_lease(bad).is_err(), "{bad}");
        }
    }
}
