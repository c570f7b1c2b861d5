//! `daqflow bench evb --hosts N`: the event builder across N test hosts (network namespaces of
//! this machine, [`daqflow::hosts`]), next to raw TCP between the same namespaces.
//!
//! Every repetition of every point runs `daqflow evb local … --json` inside host 1 (the
//! operator, its control server on a wildcard and the EVM there), with the RUs and their
//! sources on the RU hosts and the BUs on the BU hosts, started by the operator over ssh
//! (`--ru-hosts`, `--bu-hosts`, `--remote-command`): hosts 2 … k+1 hold RUs and hosts k+2 … N
//! BUs, k = (N − 1) / 2 (N = 3: an RU host and a BU host; N = 5: two of each). The metrics are
//! the local suite's, from the JSON summary; a point fails if an event was lost (or the
//! accounting is incomplete) or a component reported an error.
//!
//! Every repetition first measures the raw reference between the same namespaces: one TCP
//! connection from the first RU host to the first BU host, 1 MiB written per call, so that
//! `ratio_to_raw` compares two numbers taken in the same run. A reference with a flaw
//! (`raw::Reference::flaw`: it did not fill its window, or moved less than the builder, as the
//! first connection across fresh namespaces can) is measured again, at most three times, and a
//! ratio to a flawed one is withheld.

use std::time::Duration;

use anyhow::{Context, bail};
use daqflow::hosts::Hosts;
use serde_json::Value;

use super::harness::{BenchConfig, Metrics, Param, Plot, Series, Suite};

/// Seconds every event-builder run lasts beyond the window's length: room for `evb local`'s
/// warm-up (a fifth of the run, at most 1 s), after which its window opens.
const LEAD_S: f64 = 0.5;

/// Source streams per RU.
const STREAMS: u32 = 4;

/// Options of the event-builder suite across hosts.
#[derive(Debug, Clone)]
pub struct EvbHostsOptions {
    /// Test hosts (at least 3).
    pub hosts: usize,
    /// Fragment sizes.
    pub sizes: Vec<usize>,
    /// RU counts (as many BUs as RUs).
    pub rus: Vec<u32>,
}

impl EvbHostsOptions {
    /// The sweep of a full or a quick run: 1 KiB, 4 KiB, 16 KiB fragments with 1 and 2 RUs;
    /// quick: 1 KiB and 16 KiB with 1 RU.
    pub fn new(hosts: usize, quick: bool, sizes: Option<Vec<usize>>) -> EvbHostsOptions {
        let sizes =
            sizes.unwrap_or_else(|| if quick { vec![1 << 10, 16 << 10] } else { vec![1 << 10, 4 << 10, 16 << 10] });
        let rus = if quick { vec![1] } else { vec![1, 2] };
        EvbHostsOptions { hosts, sizes, rus }
    }
}

/// Which hosts (indices from 0) hold RUs and which BUs: host 0 is the operator's.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    ru_hosts: Vec<usize>,
    bu_hosts: Vec<usize>,
}

impl Layout {
    fn new(n: usize) -> anyhow::Result<Layout> {
        if n < 3 {
            bail!("bench evb --hosts {n}: the builder needs at least 3 hosts (the operator and EVM, RUs, BUs)");
        }
        let k = (n - 1) / 2;
        Ok(Layout { ru_hosts: (1..=k).collect(), bu_hosts: (k + 1..n).collect() })
    }

    /// `10.77.0.A,10.77.0.B,…` of some hosts.
    fn addresses(hosts: &Hosts, which: &[usize]) -> String {
        which.iter().map(|&i| hosts.host(i).addr().to_string()).collect::<Vec<_>>().join(",")
    }

    /// Hosts `a` … `b` as people count them (from 1).
    fn range(which: &[usize]) -> String {
        match which {
            [one] => format!("host {}", one + 1),
            [first, .., last] => format!("hosts {}–{}", first + 1, last + 1),
            [] => "no host".into(),
        }
    }
}

/// What one `evb local --json` run measured.
struct Measured {
    events_per_s: f64,
    ru_mb_per_s: f64,
}

/// Reads `evb local --json`'s summary: its rates, or why the point failed.
fn judge(json: &Value) -> anyhow::Result<Measured> {
    let errors: Vec<&str> = json["errors"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let why = match errors.len() {
        0 => String::new(),
        1..=3 => format!(": {}", errors.join("; ")),
        n => format!(": {}; and {} more", errors[..3].join("; "), n - 3),
    };
    match json["lost"].as_u64() {
        Some(0) => {}
        Some(n) => bail!("{n} event(s) lost{why}"),
        None => bail!("no complete accounting of lost events ({}){why}", json["run"]["unknown"]),
    }
    if json["clean"] != true {
        bail!("a component failed{why}");
    }
    let rate = |key: &str| json["measured"][key].as_f64().with_context(|| format!("`measured.{key}` missing"));
    let m = Measured { events_per_s: rate("events_per_s")?, ru_mb_per_s: rate("ru_mb_per_s")? };
    if m.events_per_s <= 0.0 {
        bail!("no event built in the measurement window");
    }
    Ok(m)
}

/// One event builder across the hosts: `daqflow evb local … --json` in host 1.
fn builder(
    hosts: &Hosts,
    layout: &Layout,
    remote: &str,
    rus: u32,
    fragment: usize,
    window: f64,
) -> anyhow::Result<Measured> {
    let seconds = LEAD_S + window;
    let mut cmd = hosts.host(0).command(super::hosts::exe()?);
    cmd.args(["evb", "local", "--json", "--cached-payload", "--no-crc", "--control", "0.0.0.0:0"])
        .args(["--rus", &rus.to_string(), "--bus", &rus.to_string(), "--streams", &STREAMS.to_string()])
        .args(["--fragment-size", &fragment.to_string(), "--seconds", &seconds.to_string()])
        .args(["--ru-hosts", &Layout::addresses(hosts, &layout.ru_hosts)])
        .args(["--bu-hosts", &Layout::addresses(hosts, &layout.bu_hosts)])
        .args(["--remote-command", remote]);
    let out = super::hosts::output_within(cmd, Duration::from_secs_f64(seconds + 180.0))
        .context("daqflow evb local in host 1")?;
    let json: Value = serde_json::from_str(&out.stdout).with_context(|| {
        format!("daqflow evb local in host 1 ended ({}) without a summary: {}", out.status, out.stderr.trim())
    })?;
    judge(&json)
}

/// Runs the suite: the results and the failed points.
pub fn run(config: BenchConfig, opts: EvbHostsOptions) -> anyhow::Result<(Suite, Vec<String>)> {
    let layout = Layout::new(opts.hosts)?;
    // Every event-builder run has its own warm-up before its window.
    let config = BenchConfig { warmup: false, ..config };
    let quick = config.quick;
    let window = config.measure_time.as_secs_f64();
    let raw_seconds = if quick { 0.25 } else { 0.4 };
    let hosts = super::hosts::create("evb", opts.hosts)?;
    let remote = hosts.remote_command(&super::hosts::exe()?)?;
    let mut suite = Suite::new(
        "evb-hosts",
        format!(
            "the event builder across {} hosts (network namespaces): RUs on {}, BUs on {}, next to raw TCP between them",
            opts.hosts,
            Layout::range(&layout.ru_hosts),
            Layout::range(&layout.bu_hosts)
        ),
        config.clone(),
    );
    let (from, to) = (hosts.host(layout.ru_hosts[0]), hosts.host(layout.bu_hosts[0]));
    let mut failures: Vec<String> = Vec::new();
    for &rus in &opts.rus {
        for &fragment in &opts.sizes {
            let params = vec![
                ("fragment_bytes", Param::from(fragment)),
                ("rus", Param::from(rus as usize)),
                ("bus", Param::from(rus as usize)),
                ("streams", Param::from(STREAMS as usize)),
                ("hosts", Param::from(opts.hosts)),
            ];
            suite.measure_or_record("hosts", params, &mut failures, || {
                let raw = super::hosts::raw(from, to, fragment, raw_seconds)?;
                let b = builder(&hosts, &layout, &remote, rus, fragment, window)?;
                let raw =
                    super::raw::settle(raw, b.ru_mb_per_s, || super::hosts::raw(from, to, fragment, raw_seconds))?;
                let m = Metrics::new().with("events_per_s", b.events_per_s).with("mb_per_s", b.ru_mb_per_s);
                Ok(super::raw::with_ratio(m, "ratio_to_raw", b.ru_mb_per_s, &raw).with("lost_events", 0.0))
            });
        }
    }
    drop(hosts);
    suite.plots = plots(&opts.rus);
    notes(&mut suite, &opts, &layout, window, raw_seconds);
    suite.note_failures(&failures);
    Ok((suite, failures))
}

fn plots(rus: &[u32]) -> Vec<Plot> {
    let per_rus = |metric: &'static str| -> Vec<Series> {
        rus.iter()
            .map(|&k| Series {
                label: format!("{k} RU × {k} BU"),
                case: "hosts",
                metric,
                filter: vec![("rus", (k as usize).into())],
            })
            .collect()
    };
    let mut mb = per_rus("mb_per_s");
    let raw_rus = rus.first().copied().unwrap_or(1);
    mb.push(Series {
        label: "raw TCP, RU host → BU host".into(),
        case: "hosts",
        metric: "raw_mb_per_s",
        filter: vec![("rus", (raw_rus as usize).into())],
    });
    let plot = |title: &str, y_label: &str, y_log: bool, series: Vec<Series>| {
        Plot::over_bytes(title, "fragment_bytes", "fragment size (bytes)", y_label, y_log, series)
    };
    vec![
        plot("throughput into the RUs vs fragment size, across hosts", "MB/s into all RUs", false, mb),
        plot(
            "events built per second vs fragment size, across hosts",
            "events per second",
            true,
            per_rus("events_per_s"),
        ),
        plot("ratio to raw TCP between the same hosts", "builder MB/s ÷ raw MB/s", false, per_rus("ratio_to_raw")),
    ]
}

fn notes(suite: &mut Suite, opts: &EvbHostsOptions, layout: &Layout, window: f64, raw_seconds: f64) {
    suite.note(super::machine_note());
    suite.note(format!(
        "The hosts are {} network namespaces of this machine (10.77.0.1 … 10.77.0.{}) joined by a software bridge, \
         each with an sshd: they share its cores and memory bandwidth, and their traffic crosses veth pairs and the \
         bridge, not a NIC. This measures the software path across hosts, not a network.",
        opts.hosts, opts.hosts
    ));
    suite.note(format!(
        "Every repetition runs `daqflow evb local --json` inside host 1 (the operator, its control server on \
         0.0.0.0 and the EVM), with the RUs, each with {STREAMS} sources, on {} and the BUs on {} (RU r on the RU \
         hosts' (r mod their number)-th, BU b likewise), started by the operator over ssh; every listener binds a wildcard and tells the address the \
         others reach. Sources are free-running with the cached payload; RUs check every fragment's CRC, BUs build \
         and discard without a CRC check. Runs last {LEAD_S} s + {window} s; the window opens after `evb \
         local`'s warm-up (a fifth of the run, at most 1 s). mb_per_s: fragment bytes into all RUs per second (source \
         → RU stays inside an RU host, RU → BU crosses the bridge); MB = 10^6 bytes. lost_events: the operator's \
         accounting; a point fails if it is not 0 or a component reported an error.",
        Layout::range(&layout.ru_hosts),
        Layout::range(&layout.bu_hosts)
    ));
    suite.note(format!(
        "raw reference (raw_mb_per_s), measured before each run: one TCP connection from {} (RU) to {} (BU), a \
         `daqflow bench-helper` process in each namespace, messages of the point's fragment size, written 1 MiB per call, read \
         4 MiB at a time, for {raw_seconds} s after a 0.1 s warm-up.",
        Layout::range(&layout.ru_hosts[..1]),
        Layout::range(&layout.bu_hosts[..1])
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rus_take_the_first_half_of_the_hosts_after_the_operators_and_bus_the_rest() {
        assert_eq!(Layout::new(3).unwrap(), Layout { ru_hosts: vec![1], bu_hosts: vec![2] });
        assert_eq!(Layout::new(4).unwrap(), Layout { ru_hosts: vec![1], bu_hosts: vec![2, 3] });
        assert_eq!(Layout::new(5).unwrap(), Layout { ru_hosts: vec![1, 2], bu_hosts: vec![3, 4] });
        assert!(Layout::new(2).is_err());
        assert_eq!((Layout::range(&[1, 2]), Layout::range(&[2])), ("hosts 2–3".to_owned(), "host 3".to_owned()));
    }

    #[test]
    fn a_summary_with_lost_events_or_errors_fails_the_point() {
        let ok = serde_json::json!({
            "lost": 0, "clean": true, "errors": [],
            "measured": { "events_per_s": 1000.0, "ru_mb_per_s": 4.0 },
        });
        assert_eq!(judge(&ok).unwrap().ru_mb_per_s, 4.0);
        let mut lost = ok.clone();
        lost["lost"] = 3.into();
        lost["errors"] = serde_json::json!(["bu-0: gone"]);
        assert_eq!(judge(&lost).err().unwrap().to_string(), "3 event(s) lost: bu-0: gone");
        let mut unknown = ok.clone();
        unknown["lost"] = Value::Null;
        assert!(judge(&unknown).is_err());
        let mut dirty = ok;
        dirty["clean"] = false.into();
        assert!(judge(&dirty).is_err());
    }
}
