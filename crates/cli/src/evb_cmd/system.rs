//! The system file `evb local` generates from its arguments, for the operator to run: the EVM,
//! the RUs, `rus × streams` sources and the BUs, each with its parameters, the EVM's and each
//! RU's address as references (`${evm.listen}`, `${ru-N.listen}`), and the sources stopped at
//! the EVM's last event (`stop_arg = "${evm.last_event}"`). `daqflow evb local --print-config`
//! prints it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use daqflow_evb::model::SizeModel;

use super::LocalArgs;

/// The kinds `--set KIND.KEY=VALUE` may name.
const KINDS: [&str; 4] = ["evm", "ru", "bu", "source"];

/// The arguments of `evb local` that need more than a number, checked.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The sources' fragment-size model.
    pub size: SizeModel,
    /// `--kill NAME@SECS`.
    pub kill: Option<(String, f64)>,
    /// `--corrupt SOURCE:EVENT`.
    pub corrupt: Option<(u32, u64)>,
    /// `--set KIND.KEY=VALUE`: (kind, dotted key, value).
    pub sets: Vec<(String, String, toml::Value)>,
    /// `--output`, absolute.
    pub output: Option<PathBuf>,
    /// `--stream-table`, absolute.
    pub stream_table: Option<PathBuf>,
    /// `--cpus KIND=LIST`: the CPUs of every component of a kind.
    pub cpus: Vec<(String, daqflow_wire::affinity::CpuSet)>,
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("the absolute path of {}", p.display()))
}

impl Plan {
    /// Checks the arguments.
    pub(crate) fn new(args: &LocalArgs) -> anyhow::Result<Plan> {
        if args.rus == 0 || args.bus == 0 || args.streams == 0 {
            bail!("--rus, --bus and --streams must be at least 1");
        }
        let size = match &args.size {
            Some(s) => super::parse_size(s)?,
            None => SizeModel::Fixed { bytes: args.fragment_size },
        };
        let kill = match &args.kill {
            Some(s) => {
                let (name, t) = s.split_once('@').ok_or_else(|| anyhow::anyhow!("--kill {s}: expected NAME@SECS"))?;
                let t = t.parse::<f64>().ok().filter(|t| t.is_finite() && *t >= 0.0);
                Some((name.to_owned(), t.with_context(|| format!("--kill {s}: SECS is not a time in seconds"))?))
            }
            None => None,
        };
        let corrupt = match &args.corrupt {
            Some(s) => {
                let bad = || format!("--corrupt {s}: expected SOURCE:EVENT (two numbers)");
                let (src, ev) = s.split_once(':').with_context(bad)?;
                Some((src.parse::<u32>().with_context(bad)?, ev.parse::<u64>().with_context(bad)?))
            }
            None => None,
        };
        let mut sets = Vec::new();
        for s in &args.set {
            let bad = || anyhow::anyhow!("--set {s}: expected KIND.KEY=VALUE with KIND one of {}", KINDS.join(", "));
            let (target, value) = s.split_once('=').ok_or_else(bad)?;
            let (kind, key) = target.trim().split_once('.').ok_or_else(bad)?;
            if !KINDS.contains(&kind) || key.split('.').any(str::is_empty) {
                return Err(bad());
            }
            sets.push((kind.to_owned(), key.to_owned(), whole(crate::component_cmd::parse_value(value.trim()))));
        }
        if let Some(dir) = &args.profile {
            // Each of the EVM, the RUs and the BUs writes its own profile at the run's stop.
            let path = absolute(dir)?.join("{name}-run{run}.prof").display().to_string();
            for kind in ["evm", "ru", "bu"] {
                sets.push((kind.to_owned(), "profile".to_owned(), toml::Value::String(path.clone())));
            }
        }
        let mut cpus = Vec::new();
        for c in &args.cpus {
            let bad = || anyhow::anyhow!("--cpus {c}: expected KIND=LIST with KIND one of {}", KINDS.join(", "));
            let (kind, list) = c.split_once('=').ok_or_else(bad)?;
            if !KINDS.contains(&kind.trim()) {
                return Err(bad());
            }
            let set = list.parse::<daqflow_wire::affinity::CpuSet>().map_err(|e| anyhow::anyhow!("--cpus {c}: {e}"))?;
            cpus.push((kind.trim().to_owned(), set));
        }
        let output = args.output.as_deref().map(absolute).transpose()?;
        let stream_table = args.stream_table.as_deref().map(absolute).transpose()?;
        Ok(Plan { size, kill, corrupt, sets, output, stream_table, cpus })
    }
}

/// A whole number written as a float (`1e8`) as an integer, which a count or size key takes
/// (and a rate key too: an integer is a float there).
fn whole(v: toml::Value) -> toml::Value {
    match v {
        toml::Value::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => toml::Value::Integer(f as i64),
        other => other,
    }
}

/// A component's parameters, in the order they are written.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Params(Vec<(String, toml::Value)>);

impl Params {
    fn with(mut self, key: &str, value: impl Into<toml::Value>) -> Params {
        self.set(key, value.into());
        self
    }

    /// Sets `key` (dotted for a key of a table: `size.kind`), over what was there.
    pub(crate) fn set(&mut self, key: &str, value: toml::Value) {
        let (top, rest) = match key.split_once('.') {
            Some((t, r)) => (t, Some(r)),
            None => (key, None),
        };
        let slot = match self.0.iter().position(|(k, _)| k == top) {
            Some(i) => &mut self.0[i].1,
            None => {
                self.0.push((top.to_owned(), toml::Value::Table(toml::Table::new())));
                &mut self.0.last_mut().expect("just pushed").1
            }
        };
        let Some(rest) = rest else {
            *slot = value;
            return;
        };
        let mut table = slot;
        let mut path: Vec<&str> = rest.split('.').collect();
        let last = path.pop().unwrap_or(rest);
        for p in path {
            if !table.is_table() {
                *table = toml::Value::Table(toml::Table::new());
            }
            let Some(t) = table.as_table_mut() else { return };
            table = t.entry(p.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        }
        if !table.is_table() {
            *table = toml::Value::Table(toml::Table::new());
        }
        if let Some(t) = table.as_table_mut() {
            t.insert(last.to_owned(), value);
        }
    }

    /// The user's `--set`s for `kind`, over the rest.
    fn with_sets(mut self, kind: &str, plan: &Plan) -> Params {
        for (k, key, value) in &plan.sets {
            if k == kind {
                self.set(key, value.clone());
            }
        }
        self
    }

    /// As `daqflow component --set KEY=VALUE` arguments.
    pub(crate) fn to_sets(&self) -> Vec<String> {
        self.0.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    fn write(&self, out: &mut String) {
        for (k, v) in &self.0 {
            let _ = writeln!(out, "{} = {v}", key(k));
        }
    }
}

/// A TOML key: bare when it can be.
fn key(k: &str) -> String {
    let bare = !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if bare { k.to_owned() } else { toml::Value::String(k.to_owned()).to_string() }
}

fn int(n: impl Into<i64>) -> toml::Value {
    toml::Value::Integer(n.into())
}

fn usize_value(n: usize) -> toml::Value {
    toml::Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

fn size_table(size: &SizeModel) -> toml::Value {
    let mut t = toml::Table::new();
    match *size {
        SizeModel::Fixed { bytes } => {
            t.insert("kind".into(), "fixed".into());
            t.insert("bytes".into(), usize_value(bytes));
        }
        SizeModel::Uniform { min, max } => {
            t.insert("kind".into(), "uniform".into());
            t.insert("min".into(), usize_value(min));
            t.insert("max".into(), usize_value(max));
        }
        SizeModel::LogNormal { mean, rms } => {
            t.insert("kind".into(), "lognormal".into());
            t.insert("mean".into(), mean.into());
            t.insert("rms".into(), rms.into());
        }
    }
    toml::Value::Table(t)
}

/// The parameters of BU `id`, whose EVM is at `evm` (an address or `${evm.listen}`).
pub(crate) fn bu_params(args: &LocalArgs, plan: &Plan, id: u32, evm: &str) -> Params {
    let mut p = Params::default().with("id", int(id)).with("evm", evm).with("threads", usize_value(args.threads));
    if args.no_crc {
        p = p.with("check_crc", false);
    }
    if let Some(c) = args.credits {
        p = p.with("credits", int(c));
    }
    if let Some(dir) = &plan.output {
        p = p.with("output", "files").with("directory", dir.display().to_string());
    }
    if let Some(et) = &args.et {
        p = p.with("output", "et").with("et", et.as_str());
    }
    p.with_sets("bu", plan)
}

/// The names of the components of the system, in the file's order.
pub(crate) fn component_names(args: &LocalArgs) -> Vec<String> {
    let mut names = vec!["evm".to_owned()];
    for r in 0..args.rus {
        names.push(format!("ru-{r}"));
        names.extend((0..args.streams).map(|k| format!("src-{}", r * args.streams + k)));
    }
    names.extend((0..args.bus).map(|b| format!("bu-{b}")));
    names
}

fn component(
    out: &mut String,
    plan: &Plan,
    (name, kind): (&str, &str),
    stop_arg: Option<&str>,
    host: Option<&str>,
    params: &Params,
) {
    let _ = writeln!(out, "\n[[component]]\nname = \"{name}\"\nkind = \"{kind}\"");
    if let Some((_, cpus)) = plan.cpus.iter().rev().find(|(k, _)| k == kind) {
        let list: Vec<String> = cpus.cpus().iter().map(usize::to_string).collect();
        let _ = writeln!(out, "cpus = [{}]", list.join(", "));
    }
    if let Some(h) = host {
        let _ = writeln!(out, "host = {}", toml::Value::String(h.to_owned()));
    }
    if let Some(a) = stop_arg {
        let _ = writeln!(out, "stop_arg = \"{a}\"");
    }
    out.push_str("[component.params]\n");
    params.write(out);
}

/// The host of the `i`-th component placed on `hosts` (none: this one).
fn on(hosts: &[String], i: u32) -> Option<&str> {
    (!hosts.is_empty()).then(|| hosts[i as usize % hosts.len()].as_str())
}

/// The system file for `args`.
pub(crate) fn system_text(args: &LocalArgs, plan: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# `daqflow evb local`: an EVM, {} RU(s) × {} source(s), {} BU(s); generated from its arguments.\n\
         # Run it by hand with `daqflow run FILE` (docs/operator-guide.md).",
        args.rus, args.streams, args.bus
    );
    let remote = !args.ru_hosts.is_empty() || !args.bu_hosts.is_empty();
    let control = args.control.clone().unwrap_or_else(|| if remote { "0.0.0.0:0" } else { "127.0.0.1:0" }.into());
    let _ = writeln!(out, "[system]\nname = \"evb-local\"\ncontrol = {}", toml::Value::String(control));
    if let Some(r) = &args.remote_command {
        let _ = writeln!(out, "remote_command = {}", toml::Value::String(r.clone()));
    }
    // Across hosts every listener binds a wildcard and tells the address the others reach.
    let listen = |p: Params| if remote { p.with("listen", "0.0.0.0:0") } else { p };
    if let Some(d) = &args.data {
        let dir = absolute(d).unwrap_or_else(|_| d.clone());
        let _ = writeln!(out, "data = {}", toml::Value::String(dir.display().to_string()));
    }
    out.push_str(
        "# A component that dies or fails stops the run; the EVM re-assigns a dead BU's events\n\
         # before the run ends (docs/evb.md, \"evb local\").\npolicy = \"stop\"\n",
    );
    let evm = Params::default().with("rus", int(args.rus)).with("reject_fraction", args.reject).with_sets("evm", plan);
    component(&mut out, plan, ("evm", "evm"), None, None, &listen(evm));
    for r in 0..args.rus {
        let ru = Params::default()
            .with("id", int(r))
            .with("evm", "${evm.listen}")
            .with("streams", int(args.streams))
            .with_sets("ru", plan);
        component(&mut out, plan, (&format!("ru-{r}"), "ru"), None, on(&args.ru_hosts, r), &listen(ru));
        for k in 0..args.streams {
            let id = r * args.streams + k;
            let mut src = Params::default()
                .with("source_id", int(id))
                .with("ru", format!("${{ru-{r}.listen}}"))
                .with("seed", int(id))
                .with("size", size_table(&plan.size));
            if let Some(t) = &plan.stream_table {
                src = src.with("stream_table", t.display().to_string());
            }
            if let Some(rate) = args.rate {
                src = src.with("rate_hz", rate);
            }
            if args.cached_payload {
                src = src.with("payload", "cached");
            }
            if let Some((s, ev)) = plan.corrupt
                && s == id
            {
                src = src.with("corrupt_event", int(i64::try_from(ev).unwrap_or(i64::MAX)));
            }
            component(
                &mut out,
                plan,
                (&format!("src-{id}"), "source"),
                Some("${evm.last_event}"),
                on(&args.ru_hosts, r),
                &src.with_sets("source", plan),
            );
        }
    }
    for b in 0..args.bus {
        component(
            &mut out,
            plan,
            (&format!("bu-{b}"), "bu"),
            None,
            on(&args.bu_hosts, b),
            &bu_params(args, plan, b, "${evm.listen}"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use daqflow_runcontrol::system::SystemFile;

    fn file(args: &LocalArgs) -> SystemFile {
        let text = system_text(args, &Plan::new(args).unwrap());
        SystemFile::parse(&text, &daqflow::registry::standard()).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    fn params<'a>(f: &'a SystemFile, name: &str) -> &'a toml::Table {
        &f.components.iter().find(|c| c.name == name).unwrap().params
    }

    #[test]
    fn the_default_system_has_an_evm_two_rus_with_four_sources_each_and_two_bus() {
        let f = file(&LocalArgs::default());
        let names: Vec<&str> = f.components.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, component_names(&LocalArgs::default()));
        assert_eq!(names.len(), 1 + 2 + 8 + 2);
        assert_eq!(params(&f, "ru-1")["evm"].as_str(), Some("${evm.listen}"));
        assert_eq!(params(&f, "src-5")["ru"].as_str(), Some("${ru-1.listen}"));
        assert_eq!(params(&f, "src-5")["size"]["bytes"].as_integer(), Some(1024));
        let src = f.components.iter().find(|c| c.name == "src-0").unwrap();
        assert_eq!(src.stop_arg.as_deref(), Some("${evm.last_event}"));
        assert_eq!(f.system.policy, daqflow_api::Policy::Stop);
        assert!(params(&f, "bu-0").get("output").is_none(), "events are discarded by default");
    }

    #[test]
    fn every_option_becomes_a_parameter() {
        let args = LocalArgs {
            rus: 1,
            bus: 1,
            streams: 2,
            size: Some("lognormal:2048:512".into()),
            output: Some("/tmp/evb-out".into()),
            threads: 2,
            no_crc: true,
            rate: Some(1000.0),
            reject: 0.25,
            credits: Some(64),
            cached_payload: true,
            corrupt: Some("1:100".into()),
            set: vec!["ru.buffer_bytes=1e8".into(), "source.size.rms=256".into(), "evm.assign_batch=8".into()],
            ..LocalArgs::default()
        };
        let f = file(&args);
        assert_eq!(params(&f, "evm")["reject_fraction"].as_float(), Some(0.25));
        assert_eq!(params(&f, "evm")["assign_batch"].as_integer(), Some(8));
        assert_eq!(params(&f, "ru-0")["buffer_bytes"].as_integer(), Some(100_000_000), "1e8 is a whole number");
        let src = params(&f, "src-1");
        assert_eq!(src["size"]["kind"].as_str(), Some("lognormal"));
        assert_eq!(src["size"]["mean"].as_float(), Some(2048.0));
        assert_eq!(src["size"]["rms"].as_integer(), Some(256), "--set goes over the size model");
        assert_eq!(src["rate_hz"].as_float(), Some(1000.0));
        assert_eq!(src["payload"].as_str(), Some("cached"));
        assert_eq!(src["corrupt_event"].as_integer(), Some(100));
        assert!(params(&f, "src-0").get("corrupt_event").is_none());
        let bu = params(&f, "bu-0");
        assert_eq!(bu["threads"].as_integer(), Some(2));
        assert_eq!(bu["check_crc"].as_bool(), Some(false));
        assert_eq!(bu["credits"].as_integer(), Some(64));
        assert_eq!((bu["output"].as_str(), bu["directory"].as_str()), (Some("files"), Some("/tmp/evb-out")));
    }

    #[test]
    fn cpus_pin_every_component_of_a_kind() {
        let first = daqflow_wire::affinity::allowed().unwrap().cpus()[0];
        let args = LocalArgs { cpus: vec![format!("ru={first}"), format!("bu={first}")], ..LocalArgs::default() };
        let f = file(&args);
        for c in &f.components {
            let expected = ["ru", "bu"].contains(&c.kind.as_str()).then(|| first.to_string());
            assert_eq!(c.cpus.as_ref().map(ToString::to_string), expected, "{}", c.name);
        }
    }

    #[test]
    fn a_late_bu_gets_the_same_parameters_with_the_evms_address() {
        let args =
            LocalArgs { et: Some("my-et".into()), set: vec!["bu.request_batch=4".into()], ..LocalArgs::default() };
        let plan = Plan::new(&args).unwrap();
        let sets = bu_params(&args, &plan, 2, "127.0.0.1:4000").to_sets();
        assert_eq!(
            sets,
            ["id=2", "evm=\"127.0.0.1:4000\"", "threads=1", "output=\"et\"", "et=\"my-et\"", "request_batch=4"]
        );
        let table = crate::component_cmd::config_table(None, &sets).unwrap();
        assert_eq!(table["evm"].as_str(), Some("127.0.0.1:4000"));
    }

    #[test]
    fn bad_arguments_are_refused_with_the_option() {
        for (args, why) in [
            (LocalArgs { rus: 0, ..LocalArgs::default() }, "at least 1"),
            (LocalArgs { kill: Some("bu-1".into()), ..LocalArgs::default() }, "--kill bu-1"),
            (LocalArgs { kill: Some("bu-1@soon".into()), ..LocalArgs::default() }, "--kill bu-1@soon"),
            (LocalArgs { corrupt: Some("1".into()), ..LocalArgs::default() }, "--corrupt 1"),
            (LocalArgs { set: vec!["rus=3".into()], ..LocalArgs::default() }, "--set rus=3"),
            (LocalArgs { set: vec!["et.events=3".into()], ..LocalArgs::default() }, "KIND one of"),
            (LocalArgs { size: Some("normal:1".into()), ..LocalArgs::default() }, "size model"),
            (LocalArgs { cpus: vec!["et=0".into()], ..LocalArgs::default() }, "--cpus et=0: expected KIND=LIST"),
            (LocalArgs { cpus: vec!["ru=0,0".into()], ..LocalArgs::default() }, "--cpus ru=0,0: names CPU 0 twice"),
        ] {
            let e = Plan::new(&args).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
    }
}
