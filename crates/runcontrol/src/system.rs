//! The system file: one TOML file describing a whole DAQ system for the operator
//! (`daqflow run SYSTEM.toml`; `docs/operator-guide.md` documents every key).
//!
//! ```toml
//! [system]
//! name = "teststand"
//! control = "127.0.0.1:7000"   # the control server the operator starts
//! data = "daqflow-data"        # files, logs and the run database go here
//! # database = "postgres://daq@db.example/daqruns"  # default: "runs.sqlite" in `data`
//! policy = "stop"              # when a component dies or fails in a run: "stop", "restart" or "expendable"
//! restart_max = 3              # restarts of one component in one run (then it is lost to the run)
//! restart_backoff_s = 1.0      # the second restart in a run waits this long, each further one twice as long
//! # token_file = "/etc/daqflow/token"          # the system token (default: a new one per start)
//! # web_token_file = "/etc/daqflow/web-token"   # the web UI's access token (default: a new one per start)
//!
//! [[component]]
//! name = "evm"
//! kind = "evm"
//! [component.params]
//! rus = 1
//!
//! [[component]]
//! name = "ru-0"
//! kind = "ru"
//! [component.params]
//! evm = "${evm.listen}"        # what evm's configure returned
//! ```
//!
//! Validation reports every problem with the line it is on.
//!
//! ```
//! let text = "[system]\nname = 'x'\n\n[[component]]\nname = 'a'\nkind = 'warp-drive'\n";
//! let registry = daqflow_component::Registry::new(); // the binary's: `daqflow::registry::standard()`
//! let err = daqflow_runcontrol::system::SystemFile::parse(text, &registry).unwrap_err();
//! assert!(err.to_string().contains("line 6"), "{err}");
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use daqflow_api::alarms::AlarmSeverity;
use daqflow_component::{DataFiles, Registry, Role};

mod history;
mod tables;
mod unique;
use crate::alarm::{AlarmSpec, Condition};
pub use history::{HistorySection, MAX_INTERVAL_S, MAX_RETENTION_DAYS, MIN_INTERVAL_S};

/// What to do when a component dies or fails: `stop` the run (the run record says why),
/// `restart` it (start it again, configure it and, during a run, start it in the same run), or
/// go on without it (`expendable`).
pub use daqflow_api::Policy;

/// The `[system]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemSection {
    /// The system's name (in the run database and the web UI).
    pub name: String,
    /// Address of the control server the operator starts (`127.0.0.1:0`: any free port), a
    /// process of its own; `PRIMARY,SPARE,…` starts spares too, which the processes of the
    /// system move to when the primary dies (the operator starts a dead one again).
    #[serde(default = "default_control")]
    pub control: String,
    /// Directory for data files, component logs and the run database (relative to where the
    /// operator runs).
    #[serde(default = "default_data")]
    pub data: PathBuf,
    /// The run database: an SQLite file (relative to `data`), or a PostgreSQL database,
    /// `postgres://USER@HOST:PORT/DBNAME` (its password better in `PGPASSWORD` or `~/.pgpass`
    /// than in the URL; see [`crate::db::Location`]).
    #[serde(default = "default_database")]
    pub database: String,
    /// The web UI's address (`daqflow run --web` overrides it).
    #[serde(default = "default_web")]
    pub web: String,
    /// A file holding the web UI's access token (see [`read_web_token`]), relative to where the
    /// operator runs. Without it, the operator makes a new random token at every start.
    #[serde(default)]
    pub web_token_file: Option<PathBuf>,
    /// What to do when a component dies or fails during a run (default `stop`).
    #[serde(default = "default_policy")]
    pub policy: Policy,
    /// How often one component may be restarted in one run (policy `restart`); past it the
    /// component is lost to the run: the run stops, unless the component belongs to a group
    /// that still has its minimum.
    #[serde(default = "default_restart_max")]
    pub restart_max: u32,
    /// The first restart of a component in a run is at once; the second waits this many
    /// seconds, each further one twice as long as the one before, at most
    /// `restart_backoff_max_s`.
    #[serde(default = "default_restart_backoff")]
    pub restart_backoff_s: f64,
    /// The longest back-off before a restart, in seconds.
    #[serde(default = "default_restart_backoff_max")]
    pub restart_backoff_max_s: f64,
    /// Seconds a component may take for configure, start, pause, resume and reset.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Seconds a component may take to stop (stops drain data).
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout_s: f64,
    /// Seconds a data writer (a recorder, a builder unit writing files) may stay throttled by
    /// its disk in a run: past it the disk counts as full for good, and the operator stops the
    /// run (the normal stop, producers first) with the error `disk full: …`. 0: never. Keep it
    /// below the event manager's `stall_timeout_ms`, which otherwise fails the run first.
    #[serde(default = "default_disk_full_stop")]
    pub disk_full_stop_s: f64,
    /// How components on other hosts are started: the command line before
    /// `component KIND …` (`{host}` is replaced by the host).
    #[serde(default = "default_remote")]
    pub remote_command: String,
    /// Seconds a `daqflow component` the operator started may go on without reaching any
    /// control server before it ends by itself (stopping a run in progress): what ends the
    /// components on other hosts when the operator, its host or the network to it is gone.
    /// Longer than a spare control server may take to take over ([`MIN_LEASE_S`]).
    #[serde(default = "default_lease")]
    pub lease_s: f64,
    /// The system token: a file holding the shared secret every connection of the system
    /// proves (readable by its owner only). Default: the token given to `daqflow run` with
    /// `--token-file`, else a new random token for each start of the operator. Either way the
    /// operator writes it to `DATA/token` (mode 0600), which the components and any client of
    /// the system read (`daqflow --token-file DATA/token dialog ls`).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

fn default_control() -> String {
    "127.0.0.1:7000".into()
}
fn default_data() -> PathBuf {
    "daqflow-data".into()
}
fn default_database() -> String {
    "runs.sqlite".into()
}
fn default_web() -> String {
    "127.0.0.1:8080".into()
}
fn default_policy() -> Policy {
    Policy::Stop
}
fn default_restart_max() -> u32 {
    3
}
fn default_restart_backoff() -> f64 {
    1.0
}
fn default_restart_backoff_max() -> f64 {
    60.0
}
fn default_timeout() -> f64 {
    20.0
}
fn default_stop_timeout() -> f64 {
    60.0
}
fn default_disk_full_stop() -> f64 {
    20.0
}
fn default_remote() -> String {
    "ssh {host} daqflow".into()
}
fn default_lease() -> f64 {
    15.0
}

/// One `[[component]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawComponent {
    name: Spanned<String>,
    kind: Spanned<String>,
    #[serde(default)]
    host: Option<Spanned<String>>,
    #[serde(default)]
    command: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    policy: Option<Policy>,
    #[serde(default)]
    start_order: Option<Spanned<i64>>,
    #[serde(default)]
    stop_order: Option<Spanned<i64>>,
    #[serde(default)]
    stop_arg: Option<Spanned<String>>,
    #[serde(default)]
    metrics: Option<Spanned<String>>,
    cpus: Option<Spanned<toml::Value>>,
    #[serde(default)]
    params: Option<Spanned<toml::Table>>,
}

/// The `[system]` values with where they are, for the range checks' line numbers.
#[derive(Debug, Deserialize)]
struct SystemSpans {
    #[serde(default)]
    system: BTreeMap<String, Spanned<toml::Value>>,
}

/// Range-checks the `[system]` values: each problem with the line of its key.
fn check_system(text: &str, system: &SystemSection, problems: &mut Vec<String>) {
    let spans: SystemSpans = toml::from_str(text).unwrap_or(SystemSpans { system: BTreeMap::new() });
    let line = |key: &str| {
        spans
            .system
            .get(key)
            .map_or_else(|| line_of(text, text.find("[system]").unwrap_or(0)), |v| line_of(text, v.span().start))
    };
    let mut bad = |key: &str, what: String| problems.push(format!("line {}: `{key}` {what}", line(key)));
    let name = &system.name;
    if name.trim().is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        bad("name", format!("= {name:?} must be 1 … 100 characters, none of them control characters"));
    }
    if let Some(e) =
        system.control.split(',').map(str::trim).find_map(|a| daqflow_component::checks::check_address(a).err())
    {
        bad("control", format!("= {:?} is not an address (or a list of them): {e}", system.control));
    }
    if system.web != "none"
        && let Err(e) = daqflow_component::checks::check_address(&system.web)
    {
        bad("web", format!("= {:?} is not an address (or \"none\"): {e}", system.web));
    }
    if system.data.as_os_str().to_string_lossy().trim().is_empty() {
        bad("data", "must not be empty".into());
    }
    if let Err(e) = crate::db::Location::parse(&system.database) {
        bad("database", format!("is not a database: {e}"));
    }
    for (key, v) in [
        ("restart_backoff_s", system.restart_backoff_s),
        ("restart_backoff_max_s", system.restart_backoff_max_s),
        ("disk_full_stop_s", system.disk_full_stop_s),
    ] {
        if !(v.is_finite() && (0.0..=MAX_TIMEOUT_S).contains(&v)) {
            bad(key, format!("= {v} is out of range: 0 … {MAX_TIMEOUT_S} (seconds)"));
        }
    }
    if system.restart_max > 1000 {
        bad("restart_max", format!("= {} is out of range: 0 … 1000", system.restart_max));
    }
    for (key, v) in [("timeout_s", system.timeout_s), ("stop_timeout_s", system.stop_timeout_s)] {
        if !(v.is_finite() && (MIN_TIMEOUT_S..=MAX_TIMEOUT_S).contains(&v)) {
            bad(key, format!("= {v} is out of range: {MIN_TIMEOUT_S} … {MAX_TIMEOUT_S} (seconds)"));
        }
    }
    if system.remote_command.split_whitespace().next().is_none() {
        bad("remote_command", "must not be empty".into());
    }
    let lease = system.lease_s;
    if !(lease.is_finite() && lease > MIN_LEASE_S && lease <= MAX_TIMEOUT_S) {
        bad(
            "lease_s",
            format!(
                "= {lease} is out of range: more than {MIN_LEASE_S} (the time a spare control server may take to take \
                 over) … {MAX_TIMEOUT_S} (seconds)"
            ),
        );
    }
}

/// `lease_s` must be longer than this: the time the processes of a system may be without a
/// control server while a spare takes over from a dead primary (or the operator starts a dead
/// one again), in seconds.
pub const MIN_LEASE_S: f64 = crate::control_servers::SPARE_SETTLE.as_secs() as f64;

/// The shortest `timeout_s` and `stop_timeout_s`, in seconds.
pub const MIN_TIMEOUT_S: f64 = 0.1;
/// The longest `timeout_s` and `stop_timeout_s`, in seconds (a day).
pub const MAX_TIMEOUT_S: f64 = 86_400.0;
/// The range of `start_order` and `stop_order`.
pub const ORDER_RANGE: std::ops::RangeInclusive<i64> = -1000..=1000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    system: SystemSection,
    #[serde(default)]
    component: Vec<RawComponent>,
    #[serde(default)]
    group: Vec<RawGroup>,
    #[serde(default)]
    history: HistorySection,
    #[serde(default)]
    alarm: Vec<RawAlarm>,
}

/// One `[[group]]`: components of which the run needs at least `min`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    name: Spanned<String>,
    members: Spanned<Vec<String>>,
    min: Spanned<i64>,
}

/// A group of components the run needs at least `min` of (`[[group]]`, e.g. the builder
/// units): the death or failure of a member, whatever its policy, stops the run only when fewer
/// than `min` members are left in it. A member under the `restart` policy is restarted first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Its name (in messages).
    pub name: String,
    /// Its members, components of the system.
    pub members: Vec<String>,
    /// How many members the run needs.
    pub min: usize,
}

/// One `[[alarm]]` (`docs/operator-guide.md`, "Alarms").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlarm {
    name: Spanned<String>,
    when: Spanned<String>,
    #[serde(default)]
    severity: Option<Spanned<String>>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    auto_clear: bool,
}

/// Checks the `[[alarm]]` tables: each problem with its line.
fn check_alarms(
    text: &str,
    raw: &[RawAlarm],
    components: &[ComponentSpec],
    problems: &mut Vec<String>,
) -> Vec<AlarmSpec> {
    let names: Vec<&str> = components.iter().map(|c| c.name.as_str()).collect();
    let mut lines: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for a in raw {
        let line = line_of(text, a.name.span().start);
        let name = a.name.get_ref().clone();
        if name.is_empty()
            || name.len() > 100
            || !name.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_' || ch == '.')
        {
            problems
                .push(format!("line {line}: alarm name {name:?} must be 1 … 100 letters, digits, '-', '_' and '.'"));
        }
        if let Some(first) = lines.insert(name.clone(), line) {
            problems.push(format!("line {line}: alarm `{name}` is already defined on line {first}"));
        }
        let severity = match &a.severity {
            None => Some(AlarmSeverity::Warning),
            Some(s) => {
                let parsed = AlarmSeverity::parse(s.get_ref());
                if parsed.is_none() {
                    problems.push(format!(
                        "line {}: alarm `{name}`: severity {:?} must be \"warning\" or \"error\"",
                        line_of(text, s.span().start),
                        s.get_ref()
                    ));
                }
                parsed
            }
        };
        let condition = match Condition::parse(a.when.get_ref(), &names) {
            Ok(c) => Some(c),
            Err(e) => {
                problems.push(format!("line {}: alarm `{name}`: {e}", line_of(text, a.when.span().start)));
                None
            }
        };
        if let (Some(severity), Some(condition)) = (severity, condition) {
            let message = a.message.clone().filter(|m| !m.trim().is_empty()).unwrap_or_else(|| condition.text.clone());
            out.push(AlarmSpec { name, severity, condition, message, auto_clear: a.auto_clear, line });
        }
    }
    out
}

/// A component of the system.
#[derive(Debug, Clone)]
pub struct ComponentSpec {
    /// Unique name.
    pub name: String,
    /// Kind.
    pub kind: String,
    /// Host to run on (`None`: this machine).
    pub host: Option<String>,
    /// A program to run instead of `daqflow component KIND` (a user's own component); it gets
    /// `--name NAME --control HOST:PORT` appended.
    pub command: Option<Vec<String>>,
    /// What to do when it dies or fails.
    pub policy: Policy,
    /// Start stage (lower first; the same stage starts together).
    pub start_order: i64,
    /// Stop stage (lower first).
    pub stop_order: i64,
    /// The stop command's argument: a number, or a reference such as `${evm.last_event}`.
    pub stop_arg: Option<String>,
    /// Where its process serves Prometheus metrics (`daqflow component --metrics`).
    pub metrics: Option<std::net::SocketAddr>,
    /// Its parameters, with `${…}` references still in.
    pub params: toml::Table,
    /// The line of the `[[component]]` entry's name.
    pub line: usize,
    /// Components whose results the parameters use (configure after them).
    pub needs: Vec<String>,
    /// How its counters enter the run's accounting (its kind's; `Other` for a program of
    /// the user's own).
    pub role: Role,
    /// Where it writes data files, from its resolved parameters (its kind's).
    pub data_files: Option<DataFiles>,
    /// Whether the operator gives it the system file's digest (`system_digest`; its kind's
    /// [`Kind::takes_system_digest`](daqflow_component::Kind::takes_system_digest)).
    pub system_digest: bool,
    /// Its kind's typed schema, when this binary knows the kind and the kind declares one:
    /// what `set` checks while Initial, and what references to it may name.
    pub schema: Option<std::sync::Arc<daqflow_component::schema::Schema>>,
    /// The CPUs its whole process is pinned to from its start (`cpus = [0, 1]`; every thread
    /// inherits them); `None`: not pinned.
    pub cpus: Option<daqflow_wire::affinity::CpuSet>,
}

/// A validated system file.
#[derive(Debug, Clone)]
pub struct SystemFile {
    /// `[system]`.
    pub system: SystemSection,
    /// Components in file order.
    pub components: Vec<ComponentSpec>,
    /// Groups of components with their minimums (`[[group]]`).
    pub groups: Vec<Group>,
    /// The text, as stored in each run record.
    pub text: String,
    /// `[history]`: the history of slow values.
    pub history: HistorySection,
    /// The `[[alarm]]`s, in file order.
    pub alarms: Vec<AlarmSpec>,
}

/// What is wrong with a system file: every problem, each with its line.
#[derive(Debug, thiserror::Error)]
#[error("{}", problems.join("\n"))]
pub struct SystemFileError {
    /// `line N: what is wrong`, one per problem.
    pub problems: Vec<String>,
}

/// The shortest web access token accepted from a file, in characters.
pub const WEB_TOKEN_MIN_LEN: usize = 16;
/// The longest web access token accepted from a file, in characters.
pub const WEB_TOKEN_MAX_LEN: usize = 256;

/// Why the web token file (`web_token_file`) cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WebTokenError {
    /// The file cannot be read (it does not exist, or no permission).
    #[error("web_token_file {path}: cannot read it: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// Group or others may access the file: the token would not be a secret.
    #[error(
        "web_token_file {path}: group or others may access it (mode {mode:04o}); make it the owner's alone: chmod 600 {path}"
    )]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file holds no token.
    #[error("web_token_file {path}: it is empty; put a random token in it (e.g. `openssl rand -hex 16`)")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The token is too short, too long, or has characters a URL would need to escape.
    #[error(
        "web_token_file {path}: the token must be {WEB_TOKEN_MIN_LEN} to {WEB_TOKEN_MAX_LEN} characters out of \
         A-Z a-z 0-9 - _ . ~ (it has {length} characters{})",
        if *bad_character { ", some of them others" } else { "" }
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The token's length.
        length: usize,
        /// Whether it has a character outside the set.
        bad_character: bool,
    },
}

/// Checks the `[[group]]`s: known members, each in one group at most, `min` within 0 … members.
fn check_groups(
    text: &str,
    raw: &[RawGroup],
    components: &HashMap<String, usize>,
    problems: &mut Vec<String>,
) -> Vec<Group> {
    let mut groups = Vec::new();
    let mut member_of: HashMap<&str, &str> = HashMap::new();
    for g in raw {
        let name = g.name.get_ref();
        let line = line_of(text, g.name.span().start);
        if name.trim().is_empty() || groups.iter().any(|x: &Group| &x.name == name) {
            problems.push(format!("line {line}: group name {name:?} is empty or used twice"));
        }
        let members_line = line_of(text, g.members.span().start);
        if g.members.get_ref().is_empty() {
            problems.push(format!("line {members_line}: group `{name}` has no members"));
        }
        for m in g.members.get_ref() {
            if !components.contains_key(m) {
                problems.push(format!("line {members_line}: group `{name}`: `{m}` is not a component"));
            } else if let Some(other) = member_of.insert(m, name) {
                problems.push(format!(
                    "line {members_line}: `{m}` is in group `{other}` and in group `{name}`: one group at most"
                ));
            }
        }
        let n = g.members.get_ref().len();
        let min = *g.min.get_ref();
        if min < 0 || min as usize > n {
            problems.push(format!(
                "line {}: group `{name}`: min = {min} is out of range: 0 … {n} (its members)",
                line_of(text, g.min.span().start)
            ));
        }
        groups.push(Group { name: name.clone(), members: g.members.get_ref().clone(), min: min.max(0) as usize });
    }
    groups
}

/// Reads the web UI's access token from `path` (the system file's `web_token_file`): the file's
/// content without surrounding white space. The file must exist, be accessible to its owner only
/// (no permission bit for group or others: mode 600 or 400), and hold one token of 16 to 256
/// characters out of `A-Z a-z 0-9 - _ . ~` (so that it goes into a URL as it is).
pub fn read_web_token(path: &Path) -> Result<String, WebTokenError> {
    let metadata = std::fs::metadata(path).map_err(|source| WebTokenError::Read { path: path.to_owned(), source })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = metadata.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(WebTokenError::Exposed { path: path.to_owned(), mode });
        }
    }
    #[cfg(not(unix))]
    let _ = metadata;
    let text = std::fs::read_to_string(path).map_err(|source| WebTokenError::Read { path: path.to_owned(), source })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(WebTokenError::Empty { path: path.to_owned() });
    }
    let bad_character = !token.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'));
    if bad_character || !(WEB_TOKEN_MIN_LEN..=WEB_TOKEN_MAX_LEN).contains(&token.len()) {
        return Err(WebTokenError::Invalid { path: path.to_owned(), length: token.chars().count(), bad_character });
    }
    Ok(token.to_owned())
}

/// The stages of a component whose kind this binary does not know (a program of the user's
/// own): start after the consumers, stop before them.
pub const FOREIGN_STAGES: (i64, i64) = (3, 4);

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|&b| b == b'\n').count() + 1
}

/// The `${name.key}` references in a string.
pub fn references(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        let Some(j) = rest[i..].find('}') else { break };
        let inner = &rest[i + 2..i + j];
        if let Some((a, b)) = inner.split_once('.') {
            out.push((a.to_owned(), b.to_owned()));
        }
        rest = &rest[i + j + 1..];
    }
    out
}

fn collect_refs(v: &toml::Value, out: &mut Vec<(String, String)>) {
    match v {
        toml::Value::String(s) => out.extend(references(s)),
        toml::Value::Array(a) => a.iter().for_each(|x| collect_refs(x, out)),
        toml::Value::Table(t) => t.values().for_each(|x| collect_refs(x, out)),
        _ => {}
    }
}

/// Replaces the references in `v` with values from `results` (component name → JSON object);
/// a string that is one whole reference takes the value's type.
pub fn resolve(v: &toml::Value, results: &HashMap<String, Value>) -> Result<toml::Value, String> {
    Ok(match v {
        toml::Value::String(s) => {
            let refs = references(s);
            if refs.is_empty() {
                v.clone()
            } else if refs.len() == 1 && s.starts_with("${") && s.ends_with('}') && s.matches("${").count() == 1 {
                let (a, b) = &refs[0];
                json_to_toml(lookup(results, a, b)?)
            } else {
                let mut out = s.clone();
                for (a, b) in refs {
                    let val = lookup(results, &a, &b)?;
                    let text = match val {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    out = out.replace(&format!("${{{a}.{b}}}"), &text);
                }
                toml::Value::String(out)
            }
        }
        toml::Value::Array(a) => toml::Value::Array(a.iter().map(|x| resolve(x, results)).collect::<Result<_, _>>()?),
        toml::Value::Table(t) => toml::Value::Table(
            t.iter().map(|(k, x)| Ok((k.clone(), resolve(x, results)?))).collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

fn lookup<'a>(results: &'a HashMap<String, Value>, name: &str, key: &str) -> Result<&'a Value, String> {
    let r = results.get(name).ok_or_else(|| format!("`${{{name}.{key}}}`: {name} has no result yet"))?;
    r.get(key)
        .filter(|v| !v.is_null())
        .ok_or_else(|| format!("`${{{name}.{key}}}`: {name} gave no `{key}` (it gave {r})"))
}

/// The keys of `${system.KEY}`: what the operator knows of the system itself.
pub const SYSTEM_KEYS: &[&str] = &["name", "id", "control", "data", "database", "digest"];

/// The standard counters of every summary, which a `stop_arg` may name besides a kind's own
/// summary keys.
const SUMMARY_KEYS: &[&str] = &["events", "bytes", "events_per_s", "mb_per_s"];

/// Every `${name.key}` must name something that exists: a component of the system whose kind
/// gives `key` at configure (in parameters), or in its stop summary (in a `stop_arg`), or a
/// key of `${system.…}`. A component of a kind this binary does not know (a program of your
/// own) may give anything.
fn check_references(text: &str, raw: &[RawComponent], components: &[ComponentSpec], problems: &mut Vec<String>) {
    let by_name: HashMap<&str, &ComponentSpec> = components.iter().map(|c| (c.name.as_str(), c)).collect();
    for (c, r) in components.iter().zip(raw) {
        let mut uses: Vec<(String, String, usize, bool)> = Vec::new();
        let params_span = r.params.as_ref().map(|p| p.span()).unwrap_or(0..0);
        for v in c.params.values() {
            let mut refs = Vec::new();
            collect_refs(v, &mut refs);
            for (a, b) in refs {
                let needle = format!("${{{a}.{b}}}");
                let at = text
                    .get(params_span.start..)
                    .and_then(|t| t.find(&needle))
                    .map_or(c.line, |i| line_of(text, params_span.start + i));
                uses.push((a, b, at, false));
            }
        }
        if let Some(a) = &r.stop_arg {
            for (x, y) in references(a.get_ref()) {
                uses.push((x, y, line_of(text, a.span().start), true));
            }
        }
        for (a, b, at, stop) in uses {
            let what = format!("line {at}: `${{{a}.{b}}}` in `{}`", c.name);
            if a == "system" {
                if !SYSTEM_KEYS.contains(&b.as_str()) {
                    let near = daqflow_component::schema::closest(&b, SYSTEM_KEYS)
                        .map(|n| format!("did you mean `{n}`? "))
                        .unwrap_or_default();
                    problems
                        .push(format!("{what}: the system has no `{b}`; {near}(its keys: {})", SYSTEM_KEYS.join(", ")));
                }
                continue;
            }
            let Some(schema) = by_name.get(a.as_str()).and_then(|t| t.schema.as_ref()) else { continue };
            let mut known: Vec<&str> = schema.outputs.iter().map(|k| k.name.as_str()).collect();
            if stop {
                known.extend(schema.summary.iter().map(|k| k.name.as_str()));
                known.extend(SUMMARY_KEYS);
            }
            if !known.contains(&b.as_str()) {
                let near = daqflow_component::schema::closest(&b, &known)
                    .map(|n| format!("did you mean `{n}`? "))
                    .unwrap_or_default();
                let gives = if known.is_empty() { "nothing".to_owned() } else { known.join(", ") };
                let when = if stop { "at configure or in its stop summary" } else { "at configure" };
                problems.push(format!(
                    "{what}: {a} (kind {}) gives no `{b}` {when}; {near}(it gives: {gives})",
                    schema.kind
                ));
            }
        }
    }
}

/// A component's `cpus`: a list of CPUs the operator may use (its own `sched_getaffinity`,
/// the set `taskset`, cgroups or a container gave it), not empty, none twice.
fn check_cpus(name: &str, value: &toml::Value) -> Result<daqflow_wire::affinity::CpuSet, String> {
    let what = |e: String| format!("`{name}`: `cpus` {e}");
    let toml::Value::Array(items) = value else {
        return Err(what(format!("= {value} is not a list of CPU numbers like [0, 1]")));
    };
    let numbers: Option<Vec<i64>> = items.iter().map(toml::Value::as_integer).collect();
    let numbers = numbers.ok_or_else(|| what(format!("= {value} is not a list of CPU numbers like [0, 1]")))?;
    let set = daqflow_wire::affinity::CpuSet::from_integers(numbers).map_err(|e| what(format!("= {value} {e}")))?;
    if let Ok(allowed) = daqflow_wire::affinity::allowed() {
        set.check_within(&allowed, "the operator").map_err(|e| what(format!("= {value} {e}")))?;
    }
    Ok(set)
}

/// Every thread role's `*_cpus` inside the component's `cpus`: a thread is pinned only inside
/// its process's set.
fn check_role_cpus(text: &str, components: &[ComponentSpec], problems: &mut Vec<String>) {
    for c in components {
        let (Some(cpus), Some(schema)) = (&c.cpus, &c.schema) else { continue };
        for key in schema.keys.iter().filter(|k| k.ty == daqflow_component::schema::Type::Cpus) {
            let Some(toml::Value::Array(items)) = c.params.get(&key.name) else { continue };
            let Ok(role) = daqflow_component::schema::check_cpus(items) else { continue };
            if let Err(e) = role.check_within(cpus, &format!("`{}`'s `cpus`", c.name)) {
                let at = text
                    .lines()
                    .enumerate()
                    .skip(c.line)
                    .find(|(_, l)| l.trim_start().starts_with(&key.name))
                    .map_or(c.line, |(i, _)| i + 1);
                problems.push(format!("line {at}: parameters of `{}`: `{}` {e}", c.name, key.name));
            }
        }
    }
}

/// A resolved reference's JSON value as TOML (`lookup` never gives null).
fn json_to_toml(v: &Value) -> toml::Value {
    daqflow_component::schema::json_to_toml(v).unwrap_or_else(|_| toml::Value::String(v.to_string()))
}

impl SystemFile {
    /// Parses and validates a system file; `registry` gives the kinds this binary knows
    /// (components with their own `command` may have any kind).
    pub fn parse(text: &str, registry: &Registry) -> Result<SystemFile, SystemFileError> {
        // A misspelt table header first: the TOML error it causes further down would hide it.
        let problems = tables::check(text);
        if !problems.is_empty() {
            return Err(SystemFileError { problems });
        }
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| format!("line {}: ", line_of(text, s.start))).unwrap_or_default();
            SystemFileError { problems: vec![format!("{line}{}", e.message().trim())] }
        })?;
        let mut problems = Vec::new();
        check_system(text, &raw.system, &mut problems);
        history::check(text, &raw.history, &mut problems);
        let mut components = Vec::new();
        let mut lines: HashMap<String, usize> = HashMap::new();
        // `metrics` addresses by host: two components of a host cannot listen on one.
        let mut metrics_at: HashMap<(String, std::net::SocketAddr), usize> = HashMap::new();
        let mut entries = Vec::new();
        let no_params = toml::Table::new();
        for c in &raw.component {
            for (key, order) in [("start_order", &c.start_order), ("stop_order", &c.stop_order)] {
                if let Some(o) = order.as_ref().filter(|o| !ORDER_RANGE.contains(o.get_ref())) {
                    problems.push(format!(
                        "line {}: `{key}` = {} is out of range: {} … {}",
                        line_of(text, o.span().start),
                        o.get_ref(),
                        ORDER_RANGE.start(),
                        ORDER_RANGE.end()
                    ));
                }
            }
            if let Some(h) = &c.host
                && (h.get_ref().trim().is_empty()
                    || h.get_ref().chars().any(|ch| ch.is_whitespace() || ch.is_control()))
            {
                problems.push(format!(
                    "line {}: `host` = {:?} must be a host name",
                    line_of(text, h.span().start),
                    h.get_ref()
                ));
            }
            if let Some(cmd) = &c.command
                && cmd.get_ref().first().is_none_or(|p| p.trim().is_empty())
            {
                problems.push(format!(
                    "line {}: `command` must name a program (a non-empty first element)",
                    line_of(text, cmd.span().start)
                ));
            }
            let line = line_of(text, c.name.span().start);
            let name = c.name.get_ref().clone();
            let kind = c.kind.get_ref().clone();
            let cpus = c.cpus.as_ref().and_then(|v| {
                let at = line_of(text, v.span().start);
                check_cpus(&name, v.get_ref()).map_err(|e| problems.push(format!("line {at}: {e}"))).ok()
            });
            if c.cpus.is_some() && c.command.is_some() && c.host.is_some() {
                problems.push(format!(
                    "line {line}: `{name}`: `cpus` pins a program of your own only on this host (on another host pin it in the program, or run it with `taskset -c`)"
                ));
            }
            let ok_name = !name.is_empty()
                && name.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_' || ch == '.');
            if !ok_name {
                problems.push(format!(
                    "line {line}: component name {name:?} may only contain letters, digits, '-', '_' and '.'"
                ));
            }
            if name == "all" || name == "system" || name == "operator" {
                problems.push(format!("line {line}: `{name}` is reserved and cannot name a component"));
            }
            if let Some(first) = lines.insert(name.clone(), line) {
                problems.push(format!("line {line}: component `{name}` is already defined on line {first}"));
            }
            if c.command.is_none() && !registry.kinds().contains(&kind.as_str()) {
                let guess = tables::suggest(&registry.kinds(), &kind)
                    .map(|k| format!("; did you mean `{k}`?"))
                    .unwrap_or_default();
                problems.push(format!(
                    "line {}: unknown kind `{kind}`{guess} (known: {}; or give `command` for a program of your own)",
                    line_of(text, c.kind.span().start),
                    registry.kinds().join(", ")
                ));
            }
            let (params, params_line, params_span) = match &c.params {
                Some(p) => (p.get_ref().clone(), line_of(text, p.span().start), p.span()),
                None => (toml::Table::new(), line, 0..0),
            };
            entries.push(unique::Entry {
                name: c.name.get_ref(),
                kind: c.kind.get_ref(),
                host: c.host.as_ref().map(|h| h.get_ref().as_str()).filter(|h| *h != "localhost" && *h != "127.0.0.1"),
                line,
                params: c.params.as_ref().map_or(&no_params, |p| p.get_ref()),
                params_at: c.params.as_ref().map(|p| p.span().start),
            });
            let mut refs = Vec::new();
            for v in params.values() {
                collect_refs(v, &mut refs);
            }
            if let Some(a) = &c.stop_arg {
                refs.extend(references(a.get_ref()));
                if references(a.get_ref()).is_empty() && a.get_ref().trim().parse::<u64>().is_err() {
                    problems.push(format!(
                        "line {}: stop_arg must be a number or a reference like \"${{evm.last_event}}\"",
                        line_of(text, a.span().start)
                    ));
                }
            }
            let metrics = c.metrics.as_ref().and_then(|m| {
                let at = line_of(text, m.span().start);
                if c.command.is_some() {
                    problems.push(format!(
                        "line {at}: `metrics` is for `daqflow component` (a program of your own given by `command` \
                         serves its own)"
                    ));
                    return None;
                }
                match m.get_ref().parse::<std::net::SocketAddr>() {
                    Ok(addr) => {
                        let host = c.host.as_ref().map_or("", |h| h.get_ref().as_str());
                        if let Some(first) = metrics_at.insert((host.to_owned(), addr), at) {
                            problems.push(format!(
                                "line {at}: `metrics = \"{addr}\"` is already given on line {first} for the same host"
                            ));
                        }
                        Some(addr)
                    }
                    Err(_) => {
                        problems.push(format!(
                            "line {at}: `metrics = {:?}` is not an address to listen on (IP:PORT, e.g. \"127.0.0.1:9102\")",
                            m.get_ref()
                        ));
                        None
                    }
                }
            });
            let mut needs: Vec<String> = refs.iter().map(|(a, _)| a.clone()).filter(|a| a != "system").collect();
            needs.sort();
            needs.dedup();
            // The parameters must make a valid configuration (references stand in as text).
            if c.command.is_none() && registry.kinds().contains(&kind.as_str()) {
                let probe = match registry.kind(&kind).and_then(|k| k.schema.as_ref()) {
                    Some(schema) => schema.with_placeholders(&params, &|s: &str| !references(s).is_empty()),
                    None => {
                        let mut probe = params.clone();
                        replace_refs_with_placeholders(&mut probe);
                        probe
                    }
                };
                if let Err(e) = registry.make(&kind, &name, probe) {
                    // One problem per key: a range check reports every key at once.
                    let e = e.to_string();
                    let (head, first) = match e.find('`') {
                        Some(i) => e.split_at(i),
                        None => (e.as_str(), ""),
                    };
                    let parts: Vec<&str> = if first.is_empty() {
                        vec![head]
                    } else {
                        first.split(daqflow_component::checks::SEPARATOR).collect()
                    };
                    for part in parts {
                        let text_of = if first.is_empty() { part.to_owned() } else { format!("{head}{part}") };
                        let at = key_line(text, params_span.clone(), &text_of).unwrap_or(params_line);
                        problems.push(format!("line {at}: parameters of `{name}`: {text_of}"));
                    }
                }
            }
            let known = registry.kind(&kind);
            let (start_stage, stop_stage) = known.map_or(FOREIGN_STAGES, |k| (k.start_stage, k.stop_stage));
            components.push(ComponentSpec {
                name,
                start_order: c.start_order.as_ref().map_or(start_stage, |o| *o.get_ref()),
                stop_order: c.stop_order.as_ref().map_or(stop_stage, |o| *o.get_ref()),
                role: known.map_or(Role::Other, |k| k.role),
                data_files: known.and_then(|k| k.data_files),
                system_digest: known.is_some_and(|k| k.system_digest),
                schema: if c.command.is_none() { known.and_then(|k| k.schema.clone()) } else { None },
                kind,
                host: c.host.as_ref().map(|h| h.get_ref().clone()).filter(|h| h != "localhost" && h != "127.0.0.1"),
                command: c.command.as_ref().map(|c| c.get_ref().clone()),
                policy: c.policy.unwrap_or(raw.system.policy),
                stop_arg: c.stop_arg.as_ref().map(|s| s.get_ref().clone()),
                metrics,
                params,
                line,
                needs,
                cpus,
            });
        }
        for c in &components {
            for n in &c.needs {
                if !lines.contains_key(n) {
                    problems.push(format!("line {}: `{}` refers to `{n}`, which is not a component", c.line, c.name));
                } else if n == &c.name {
                    problems.push(format!("line {}: `{}` refers to itself", c.line, c.name));
                }
            }
        }
        check_references(text, &raw.component, &components, &mut problems);
        check_role_cpus(text, &components, &mut problems);
        if components.is_empty() {
            problems.push("the system has no [[component]]".into());
        }
        unique::identities(text, &entries, registry, &mut problems);
        unique::ports(text, &raw.system, &entries, &mut problems);
        unique::groups(text, &entries, registry, &mut problems);
        let alarms = check_alarms(text, &raw.alarm, &components, &mut problems);
        if let Some(path) = &raw.system.web_token_file
            && let Err(e) = read_web_token(path)
        {
            problems.push(e.to_string());
        }
        if let Some(path) = &raw.system.token_file
            && let Err(e) = daqflow_transport::auth::Token::from_file(path)
        {
            problems.push(format!("token_file: {e}"));
        }
        let groups = check_groups(text, &raw.group, &lines, &mut problems);
        if problems.is_empty() {
            let file = SystemFile {
                system: raw.system,
                components,
                groups,
                text: text.to_owned(),
                history: raw.history,
                alarms,
            };
            if let Err(cycle) = file.configure_order() {
                problems.push(cycle);
            } else {
                return Ok(file);
            }
        }
        Err(SystemFileError { problems })
    }

    /// The order to configure in: by start stage, each component after those it refers to.
    pub fn configure_order(&self) -> Result<Vec<usize>, String> {
        let mut idx: Vec<usize> = (0..self.components.len()).collect();
        idx.sort_by_key(|&i| self.components[i].start_order);
        let mut done: Vec<usize> = Vec::new();
        let mut pending = idx;
        while !pending.is_empty() {
            let before = pending.len();
            let mut i = 0;
            while i < pending.len() {
                let c = &self.components[pending[i]];
                if c.needs.iter().all(|n| done.iter().any(|&d| &self.components[d].name == n)) {
                    done.push(pending.remove(i));
                    i = 0;
                } else {
                    i += 1;
                }
            }
            if pending.len() == before {
                let names: Vec<&str> = pending.iter().map(|&i| self.components[i].name.as_str()).collect();
                return Err(format!("the references between {} go round in a circle", names.join(", ")));
            }
        }
        Ok(done)
    }

    /// The group `component` belongs to.
    pub fn group_of(&self, component: &str) -> Option<&Group> {
        self.groups.iter().find(|g| g.members.iter().any(|m| m == component))
    }

    /// Components grouped by stage, in stage order (`start` or stop).
    pub fn stages(&self, start: bool) -> Vec<Vec<usize>> {
        let mut by: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for (i, c) in self.components.iter().enumerate() {
            by.entry(if start { c.start_order } else { c.stop_order }).or_default().push(i);
        }
        by.into_values().collect()
    }
}

/// The line of the key an error message names (`unknown field `x``, `invalid type … for key
/// `x``), looked up inside the parameters' text.
fn key_line(text: &str, span: std::ops::Range<usize>, message: &str) -> Option<usize> {
    let start = message.find('`')? + 1;
    let key = &message[start..start + message[start..].find('`')?];
    // The table runs from its header to the next header.
    let region = text.get(span.start..)?;
    let mut offset = 0;
    for (i, l) in region.split_inclusive('\n').enumerate() {
        let t = l.trim_start();
        if i > 0 && t.starts_with('[') {
            break;
        }
        if t.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('=')) {
            return Some(line_of(text, span.start + offset));
        }
        offset += l.len();
    }
    None
}

fn replace_refs_with_placeholders(t: &mut toml::Table) {
    for (_, v) in t.iter_mut() {
        match v {
            toml::Value::String(s) if !references(s).is_empty() => *s = "127.0.0.1:9".to_owned(),
            toml::Value::Table(inner) => replace_refs_with_placeholders(inner),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A component of any configuration (the system file's checks are what is tested here).
    struct Stub;
    impl daqflow_component::Component for Stub {
        fn start(&mut self, _run: u32) -> Result<(), daqflow_component::ComponentError> {
            Ok(())
        }
        fn stop(&mut self, _: Option<u64>) -> Result<daqflow_component::Stats, daqflow_component::ComponentError> {
            Ok(daqflow_component::Stats::default())
        }
    }

    fn parse(text: &str) -> Result<SystemFile, SystemFileError> {
        let mut r = Registry::new();
        for (kind, role) in [
            ("evm", Role::Trigger),
            ("ru", Role::Readout),
            ("bu", Role::Builder),
            ("source", Role::Readout),
            ("sink", Role::Other),
            ("et", Role::Buffer),
            ("recorder", Role::Recorder),
        ] {
            // Like a real kind, it refuses keys it does not know.
            let stub = daqflow_component::Kind::new(kind, "a stub", role, |name, t| {
                match t.keys().find(|k| !["evm", "streams", "listen", "id"].contains(&k.as_str())) {
                    Some(k) => Err(daqflow_component::ComponentError::Config(format!("{name}: unknown field `{k}`"))),
                    None => Ok(Box::new(Stub)),
                }
            });
            // The EVM declares what it gives, as the real kinds do.
            r.add(if kind == "evm" {
                use daqflow_component::schema::{Key, Schema};
                stub.schema(
                    Schema::new("evm")
                        .key(Key::address("listen", "where"))
                        .output(Key::address("listen", "where"))
                        .summary(Key::integer("last_event", 0, i64::MAX, "the last event")),
                )
            } else {
                stub
            });
        }
        SystemFile::parse(text, &r)
    }

    #[test]
    fn problems_point_at_their_lines() {
        let text = r#"[system]
name = "t"

[[component]]
name = "evm"
kind = "evm"

[[component]]
name = "evm"
kind = "evm"

[[component]]
name = "ru-0"
kind = "ru"
[component.params]
evm = "${nobody.listen}"
streamz = 4
"#;
        let e = parse(text).unwrap_err();
        let all = e.to_string();
        assert!(all.contains("line 9: component `evm` is already defined on line 5"), "{all}");
        assert!(all.contains("line 17: parameters of `ru-0`") && all.contains("streamz"), "{all}");
        assert!(all.contains("line 13: `ru-0` refers to `nobody`"), "{all}");
        let e = parse("[system]\nname = 1\n").unwrap_err().to_string();
        assert!(e.starts_with("line 2:"), "{e}");
        let e = parse("[system]\nname = 'x'\ncolour = 'red'\n").unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("colour"), "{e}");
    }

    #[test]
    fn a_metrics_address_is_an_address_one_per_host_and_not_for_a_program_of_ones_own() {
        let sink = |name: &str, extra: &str| format!("[[component]]\nname = '{name}'\nkind = 'sink'\n{extra}\n");
        let f = parse(&format!("[system]\nname = 't'\n{}{}", sink("a", "metrics = '127.0.0.1:9102'"), sink("b", "")))
            .unwrap();
        assert_eq!(f.components[0].metrics, Some("127.0.0.1:9102".parse().unwrap()));
        assert_eq!(f.components[1].metrics, None);
        // Two hosts may use one port; one host may not.
        let f = parse(&format!(
            "[system]\nname = 't'\n{}{}",
            sink("a", "metrics = '0.0.0.0:9102'"),
            sink("b", "metrics = '0.0.0.0:9102'\nhost = 'h2'")
        ));
        assert!(f.is_ok(), "{f:?}");
        let e = parse(&format!(
            "[system]\nname = 't'\n{}{}",
            sink("a", "metrics = '127.0.0.1:9102'"),
            sink("b", "metrics = '127.0.0.1:9102'")
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 10: `metrics = \"127.0.0.1:9102\"` is already given on line 6"), "{e}");
        let e =
            parse(&format!("[system]\nname = 't'\n{}", sink("a", "metrics = 'localhost'"))).unwrap_err().to_string();
        assert!(e.contains("line 6: `metrics = \"localhost\"` is not an address to listen on"), "{e}");
        let e = parse(&format!("[system]\nname = 't'\n{}", sink("a", "metrics = '127.0.0.1:1'\ncommand = ['mine']")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 6: `metrics` is for `daqflow component`"), "{e}");
    }

    #[test]
    fn the_lease_defaults_to_15_s_and_must_outlast_a_spare_control_server_taking_over() {
        let component = "[[component]]\nname = 'a'\nkind = 'sink'\n";
        let f = parse(&format!("[system]\nname = 't'\n{component}")).unwrap();
        assert_eq!(f.system.lease_s, 15.0);
        let f = parse(&format!("[system]\nname = 't'\nlease_s = 6.5\n{component}")).unwrap();
        assert_eq!(f.system.lease_s, 6.5);
        for bad in ["6", "0", "-3", "nan", "100000"] {
            let e = parse(&format!("[system]\nname = 't'\nlease_s = {bad}\n{component}")).unwrap_err().to_string();
            assert!(e.starts_with("line 3: `lease_s`") && e.contains("more than 6"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_reference_to_what_a_component_does_not_give_is_refused_with_the_line_and_the_key_meant() {
        let text = r#"[system]
name = "t"
[[component]]
name = "evm"
kind = "evm"
[[component]]
name = "ru-0"
kind = "ru"
stop_arg = "${evm.last_evnt}"
[component.params]
evm = "${evm.lisen}"
listen = "${system.contrl}"
[[component]]
name = "src-0"
kind = "source"
stop_arg = "${evm.last_event}"
[component.params]
evm = "${evm.listen}"
"#;
        let e = parse(text).unwrap_err().to_string();
        assert!(
            e.contains("line 11: `${evm.lisen}` in `ru-0`: evm (kind evm) gives no `lisen` at configure; did you mean `listen`? (it gives: listen)"),
            "{e}"
        );
        assert!(e.contains("line 9: `${evm.last_evnt}` in `ru-0`") && e.contains("did you mean `last_event`?"), "{e}");
        assert!(
            e.contains("line 12: `${system.contrl}` in `ru-0`: the system has no `contrl`; did you mean `control`?"),
            "{e}"
        );
        assert!(!e.contains("src-0"), "what the EVM gives is taken: {e}");
    }

    #[test]
    fn references_resolve_with_their_types_and_order_the_configuration() {
        let text = r#"[system]
name = "t"
[[component]]
name = "ru-0"
kind = "ru"
[component.params]
evm = "${evm.listen}"
[[component]]
name = "evm"
kind = "evm"
"#;
        let f = parse(text).unwrap();
        let order: Vec<&str> = f.configure_order().unwrap().iter().map(|&i| f.components[i].name.as_str()).collect();
        assert_eq!(order, vec!["evm", "ru-0"]);
        let mut results = HashMap::new();
        results.insert("evm".to_owned(), json!({"listen": "127.0.0.1:5000", "n": 3}));
        let v = resolve(&toml::Value::String("${evm.listen}".into()), &results).unwrap();
        assert_eq!(v.as_str(), Some("127.0.0.1:5000"));
        let v = resolve(&toml::Value::String("${evm.n}".into()), &results).unwrap();
        assert_eq!(v.as_integer(), Some(3));
        let v = resolve(&toml::Value::String("tcp://${evm.listen}/x${evm.n}".into()), &results).unwrap();
        assert_eq!(v.as_str(), Some("tcp://127.0.0.1:5000/x3"));
        assert!(resolve(&toml::Value::String("${evm.nope}".into()), &results).unwrap_err().contains("no `nope`"));
    }

    #[test]
    fn a_web_token_file_must_be_private_non_empty_and_hold_a_plain_token() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        let write = |text: &str, mode: u32| {
            std::fs::write(&file, text).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("0123456789abcdef0123456789abcdef\n", 0o600);
        assert_eq!(read_web_token(&file).unwrap(), "0123456789abcdef0123456789abcdef");
        write("0123456789abcdef0123456789abcdef\n", 0o400);
        assert!(read_web_token(&file).is_ok());
        for mode in [0o644, 0o640, 0o604, 0o620] {
            write("0123456789abcdef0123456789abcdef", mode);
            let e = read_web_token(&file).unwrap_err();
            assert!(matches!(e, WebTokenError::Exposed { .. }) && e.to_string().contains("chmod 600"), "{mode:o}: {e}");
        }
        write(" \n", 0o600);
        assert!(matches!(read_web_token(&file), Err(WebTokenError::Empty { .. })));
        for bad in ["short", "0123456789abcdef 0123456789abcdef", "0123456789abcdef&x=1", &"a".repeat(257)] {
            write(bad, 0o600);
            assert!(matches!(read_web_token(&file), Err(WebTokenError::Invalid { .. })), "{bad}");
        }
        let missing = dir.path().join("nothing");
        assert!(read_web_token(&missing).unwrap_err().to_string().contains("cannot read"));

        // In a system file, a bad one is a problem like any other.
        let text = format!(
            "[system]\nname = 't'\nweb_token_file = {:?}\n[[component]]\nname = 'a'\nkind = 'sink'\n",
            missing.display().to_string()
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("web_token_file") && e.contains("cannot read"), "{e}");
        write("0123456789abcdef0123456789abcdef", 0o600);
        let text = text.replace("nothing", "token");
        assert_eq!(parse(&text).unwrap().system.web_token_file.as_deref(), Some(file.as_path()));
    }

    #[test]
    fn circular_references_are_refused() {
        let text = r#"[system]
name = "t"
[[component]]
name = "a"
kind = "sink"
[component.params]
listen = "${b.listen}"
[[component]]
name = "b"
kind = "sink"
[component.params]
listen = "${a.listen}"
"#;
        assert!(parse(text).unwrap_err().to_string().contains("circle"));
    }

    #[test]
    fn alarms_are_read_and_their_problems_point_at_their_lines() {
        let head = "[system]\nname = 't'\n[[component]]\nname = 'evm'\nkind = 'evm'\n";
        let f = parse(&format!(
            "{head}[[alarm]]\nname = 'slow'\nwhen = 'evm.events_per_s < 1000 for 10 s while Running'\nseverity = 'error'\n\
             [[alarm]]\nname = 'disk'\nwhen = 'disk data free < 5 GB'\nmessage = 'the disk fills'\nauto_clear = true\n"
        ))
        .unwrap();
        assert_eq!(f.alarms.len(), 2);
        assert_eq!(
            (f.alarms[0].name.as_str(), f.alarms[0].severity, f.alarms[0].line),
            ("slow", AlarmSeverity::Error, 7)
        );
        assert_eq!(f.alarms[0].message, "evm.events_per_s < 1000 for 10 s while Running");
        assert_eq!(
            (f.alarms[1].severity, f.alarms[1].message.as_str(), f.alarms[1].auto_clear),
            (AlarmSeverity::Warning, "the disk fills", true)
        );
        let e = parse(&format!(
            "{head}[[alarm]]\nname = 'a'\nwhen = 'evb.events_per_s < 1000'\n\
             [[alarm]]\nname = 'b'\nwhen = 'evm.events_per_s < lots'\nseverity = 'fatal'\n\
             [[alarm]]\nname = 'a'\nwhen = 'any in Error'\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("line 8: alarm `a`: condition \"evb.events_per_s < 1000\": there is no component `evb`"),
            "{e}"
        );
        assert!(e.contains("line 11: alarm `b`: condition") && e.contains("`lots` is not a number"), "{e}");
        assert!(e.contains("line 12: alarm `b`: severity \"fatal\""), "{e}");
        assert!(e.contains("line 14: alarm `a` is already defined on line 7"), "{e}");
        let e = parse(&format!("{head}[[alarm]]\nname = 'a'\nwhen = 'any in Error'\ncolour = 'red'\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 9") && e.contains("colour"), "{e}");
    }
}
