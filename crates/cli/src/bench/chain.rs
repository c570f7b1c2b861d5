//! `daqflow bench chain`: the DAQ-Middleware paper's figures 4–9 on this machine.
//!
//! Every repetition of every point starts a chain of component processes over loopback TCP
//! (`daqflow component generator | repeater | sink`, driven by their standard input):
//! generator → sink (figs. 4, 6), generator → repeater → sink (figs. 5, 7), and generator → k
//! repeaters → sink for k = 2 … 6 (figs. 8, 9), at chunk sizes 1 KiB … 1 MiB. The generator is
//! free-running; the throughput is the sink's data bytes per second over a window after a
//! warm-up, taken from the sink's own counters and clock. After the window the generator
//! stops, its end marker flows down the chain, and the point fails unless the sink received
//! every chunk the generator sent, in order.
//!
//! Every repetition first measures the raw reference at the point's chunk size: one blocking
//! TCP connection over 127.0.0.1 between two threads of the bench process, so that
//! `ratio_to_raw` compares two numbers taken under the same load of a shared machine.

use std::thread;
use std::time::Duration;

use anyhow::{Context, bail};
use daqflow_component::Command;
use daqflow_component::stdin::Line;
use serde_json::Value;

use crate::child::{Child, Launch};

use super::harness::{BenchConfig, Metrics, Param, Plot, Series, Suite};

/// Longest wait for a component's answer to one command.
const CALL: Duration = Duration::from_secs(30);

/// Options of the chain suite.
#[derive(Debug, Clone)]
pub struct ChainOptions {
    /// Chunk sizes in bytes.
    pub sizes: Vec<usize>,
    /// Repeater counts (0: generator → sink).
    pub repeaters: Vec<usize>,
    /// Generator CRCs checked by the sink.
    pub check: bool,
    /// A quick run.
    pub quick: bool,
}

impl ChainOptions {
    /// The sweep of a full or a quick run.
    pub fn new(quick: bool, sizes: Option<Vec<usize>>) -> ChainOptions {
        let sizes = sizes.unwrap_or_else(|| {
            if quick {
                vec![4 << 10, 64 << 10, 1 << 20]
            } else {
                vec![1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]
            }
        });
        let repeaters = if quick { vec![0, 1, 2] } else { (0..=6).collect() };
        ChainOptions { sizes, repeaters, check: false, quick }
    }

    /// Chunk sizes of the fan-out cases: 4 KiB, 64 KiB and 1 MiB of the sweep; only 64 KiB in a
    /// quick run.
    fn fanout_sizes(&self) -> Vec<usize> {
        let wanted: &[usize] = if self.quick { &[64 << 10] } else { &[4 << 10, 64 << 10, 1 << 20] };
        self.sizes.iter().copied().filter(|c| wanted.contains(c)).collect()
    }

    /// Chunk sizes of the `splice` case: those of at least 16 KiB (the repeater's default
    /// `splice_min_bytes`); only 64 KiB in a quick run.
    fn splice_sizes(&self) -> &[usize] {
        let from = self.sizes.iter().position(|&c| c >= 16 << 10).unwrap_or(self.sizes.len());
        let sizes = &self.sizes[from..];
        if self.quick {
            sizes.iter().position(|&c| c == 64 << 10).map_or(&sizes[..0], |i| &sizes[i..=i])
        } else {
            sizes
        }
    }
}

fn counter(v: &Value, key: &str) -> anyhow::Result<u64> {
    v[key].as_u64().with_context(|| format!("`{key}` missing from {v}"))
}

/// What one chain run measured.
struct ChainRun {
    /// Data MB/s at the sink in the window.
    mb_per_s: f64,
    chunks_per_s: f64,
}

/// Where the processes of a chain run.
struct Places {
    generator: Launch,
    repeaters: Launch,
    sink: Launch,
    /// The sink's `listen` (none: its default, loopback).
    sink_listen: Option<String>,
}

impl Places {
    /// Every process a child of this one, on loopback.
    fn here() -> Places {
        Places { generator: Launch::Here, repeaters: Launch::Here, sink: Launch::Here, sink_listen: None }
    }
}

/// One chain run: sink, `repeaters` repeaters and a generator as processes, where `places`
/// says; `warmup` seconds, then the window; then the generator stops and every chunk is
/// accounted for.
fn run_chain(
    places: &Places,
    chunk: usize,
    repeaters: usize,
    forward: &str,
    check: bool,
    warmup: f64,
    window: f64,
) -> anyhow::Result<ChainRun> {
    let mut sets = vec![format!("check={check}")];
    sets.extend(places.sink_listen.iter().map(|l| format!("listen={l}")));
    let mut sink = Child::launch(&places.sink, "sink", "chain-sink", &sets, None)?;
    let mut next = sink.call(Line::Command(Command::Configure { config: None }), CALL)?["listen"]
        .as_str()
        .context("sink: no listen address")?
        .to_owned();
    let mut reps = Vec::with_capacity(repeaters);
    // From the sink upwards: repeater k-1 feeds the sink, repeater 0 is fed by the generator.
    for i in (0..repeaters).rev() {
        let sets = [format!("downstream={next}"), format!("forward={forward}")];
        let mut r = Child::launch(&places.repeaters, "repeater", &format!("chain-rep-{i}"), &sets, None)?;
        next = r.call(Line::Command(Command::Configure { config: None }), CALL)?["listen"]
            .as_str()
            .context("repeater: no listen address")?
            .to_owned();
        reps.push(r);
    }
    let sets = [format!("downstream={next}"), format!("chunk_bytes={chunk}"), format!("check={check}")];
    let mut generator = Child::launch(&places.generator, "generator", "chain-gen", &sets, None)?;
    generator.call(Line::Command(Command::Configure { config: None }), CALL)?;
    sink.call(Line::Command(Command::Start { run: 1 }), CALL)?;
    for r in &mut reps {
        r.call(Line::Command(Command::Start { run: 1 }), CALL)?;
    }
    generator.call(Line::Command(Command::Start { run: 1 }), CALL)?;
    thread::sleep(Duration::from_secs_f64(warmup));
    let s0 = sink.call(Line::Stats, CALL)?;
    thread::sleep(Duration::from_secs_f64(window));
    let s1 = sink.call(Line::Stats, CALL)?;
    let g = generator.call(Line::Command(Command::Stop { last_event: None }), CALL)?;
    let mut passed = Vec::new();
    for r in reps.iter_mut().rev() {
        passed.push(r.call(Line::Command(Command::Stop { last_event: None }), CALL)?);
    }
    let s = sink.call(Line::Command(Command::Stop { last_event: None }), CALL)?;
    let mut errors: Vec<String> = Vec::new();
    for p in std::iter::once(&mut generator).chain(reps.iter_mut()).chain(std::iter::once(&mut sink)) {
        p.drain_events();
        errors.extend(p.errors.iter().map(|e| format!("{}: {e}", p.name)));
    }
    for (who, summary) in
        std::iter::once(("generator", &g)).chain(passed.iter().map(|p| ("repeater", p))).chain([("sink", &s)])
    {
        if let Some(e) = summary["detail"]["error"].as_str() {
            errors.push(format!("{who}: {e}"));
        }
    }
    generator.finish();
    for mut r in reps {
        r.finish();
    }
    sink.finish();
    if !errors.is_empty() {
        bail!("{}", errors.join("; "));
    }
    // Chunks are the chain's events; the sink's checks are in its detail.
    let sent = counter(&g, "events")?;
    let got = counter(&s, "events")?;
    let (seq, crc) = (counter(&s["detail"], "sequence_errors")?, counter(&s["detail"], "crc_errors")?);
    if got != sent || seq != 0 || crc != 0 || s["detail"]["end_seen"] != true {
        bail!("chunks lost or damaged: {sent} sent, {got} received, {seq} sequence errors, {crc} CRC errors: {s}");
    }
    let dt = s1["detail"]["seconds"].as_f64().unwrap_or(0.0) - s0["detail"]["seconds"].as_f64().unwrap_or(0.0);
    let db = counter(&s1, "bytes")?.saturating_sub(counter(&s0, "bytes")?);
    let dc = counter(&s1, "events")?.saturating_sub(counter(&s0, "events")?);
    if dt <= 0.0 || db == 0 {
        bail!("no data reached the sink in the measurement window");
    }
    Ok(ChainRun { mb_per_s: db as f64 / dt / 1e6, chunks_per_s: dc as f64 / dt })
}

/// One output of a fan-out run: the kind of its process, its mode at the dispatcher, its
/// `--set`s.
struct FanOut {
    kind: &'static str,
    mode: &'static str,
    sets: Vec<String>,
}

/// What a fan-out run measured at each output: data MB/s and chunks per second in the
/// window, and the chunks the dispatcher dropped for it over the run.
struct FanOutRun {
    mb_per_s: Vec<f64>,
    chunks_per_s: Vec<f64>,
    dropped: Vec<u64>,
}

/// One fan-out run: the `outputs` as processes, a dispatcher (`policy`) feeding them, a
/// free-running generator; `warmup` seconds, then the window; then the generator stops and
/// every chunk is accounted for: the dispatcher received every chunk sent, a blocking output
/// got every chunk passed to it (all of them with `copy`), and a sampling output's passed and
/// dropped chunks add up.
fn run_fanout(chunk: usize, policy: &str, outputs: &[FanOut], warmup: f64, window: f64) -> anyhow::Result<FanOutRun> {
    let mut children = Vec::with_capacity(outputs.len());
    let mut declared = Vec::with_capacity(outputs.len());
    for (i, o) in outputs.iter().enumerate() {
        let mut c = Child::launch(&Launch::Here, o.kind, &format!("fanout-out-{i}"), &o.sets, None)?;
        let listen = c.call(Line::Command(Command::Configure { config: None }), CALL)?["listen"]
            .as_str()
            .context("output: no listen address")?
            .to_owned();
        declared.push(format!("{{ downstream = \"{listen}\", mode = \"{}\" }}", o.mode));
        children.push(c);
    }
    let sets = [format!("outputs=[{}]", declared.join(", ")), format!("policy={policy}")];
    let mut dispatcher = Child::launch(&Launch::Here, "dispatcher", "fanout-dispatch", &sets, None)?;
    let listen = dispatcher.call(Line::Command(Command::Configure { config: None }), CALL)?["listen"]
        .as_str()
        .context("dispatcher: no listen")?
        .to_owned();
    let sets = [format!("downstream={listen}"), format!("chunk_bytes={chunk}"), "check=false".to_owned()];
    let mut generator = Child::launch(&Launch::Here, "generator", "fanout-gen", &sets, None)?;
    generator.call(Line::Command(Command::Configure { config: None }), CALL)?;
    for c in &mut children {
        c.call(Line::Command(Command::Start { run: 1 }), CALL)?;
    }
    dispatcher.call(Line::Command(Command::Start { run: 1 }), CALL)?;
    generator.call(Line::Command(Command::Start { run: 1 }), CALL)?;
    thread::sleep(Duration::from_secs_f64(warmup));
    let s0: Vec<Value> = children.iter_mut().map(|c| c.call(Line::Stats, CALL)).collect::<Result<_, _>>()?;
    thread::sleep(Duration::from_secs_f64(window));
    let s1: Vec<Value> = children.iter_mut().map(|c| c.call(Line::Stats, CALL)).collect::<Result<_, _>>()?;
    let g = generator.call(Line::Command(Command::Stop { last_event: None }), CALL)?;
    let d = dispatcher.call(Line::Command(Command::Stop { last_event: None }), CALL)?;
    let ends: Vec<Value> = children
        .iter_mut()
        .map(|c| c.call(Line::Command(Command::Stop { last_event: None }), CALL))
        .collect::<Result<_, _>>()?;
    let mut errors: Vec<String> = Vec::new();
    for p in std::iter::once(&mut generator).chain(std::iter::once(&mut dispatcher)).chain(children.iter_mut()) {
        p.drain_events();
        errors.extend(p.errors.iter().map(|e| format!("{}: {e}", p.name)));
    }
    for (who, summary) in [("generator", &g), ("dispatcher", &d)].into_iter().chain(ends.iter().map(|e| ("output", e)))
    {
        if let Some(e) = summary["detail"]["error"].as_str() {
            errors.push(format!("{who}: {e}"));
        }
    }
    generator.finish();
    dispatcher.finish();
    for mut c in children {
        c.finish();
    }
    if !errors.is_empty() {
        bail!("{}", errors.join("; "));
    }
    let sent = counter(&g, "events")?;
    if counter(&d, "events")? != sent {
        bail!("the dispatcher received {} of {sent} chunks: {d}", counter(&d, "events")?);
    }
    let per_output = d["detail"]["outputs"].as_array().context("dispatcher: no outputs in its summary")?;
    let mut dropped = Vec::with_capacity(outputs.len());
    for (i, (o, end)) in outputs.iter().zip(&ends).enumerate() {
        let (passed, lost) = (counter(&per_output[i], "passed")?, counter(&per_output[i], "dropped")?);
        let got = counter(end, "events")?;
        if got != passed {
            bail!("output {i} ({}) received {got} of the {passed} chunks passed to it: {end}", o.kind);
        }
        if o.mode == "blocking" && lost != 0 {
            bail!("the blocking output {i} dropped {lost} chunks: {d}");
        }
        if policy == "copy" && passed + lost != sent {
            bail!("output {i}: {passed} passed + {lost} dropped is not the {sent} chunks sent: {d}");
        }
        dropped.push(lost);
    }
    if policy == "round_robin" && per_output.iter().map(|o| o["passed"].as_u64().unwrap_or(0)).sum::<u64>() != sent {
        bail!("round robin: the outputs' chunks do not add up to the {sent} sent: {d}");
    }
    let (mut mb_per_s, mut chunks_per_s) = (Vec::new(), Vec::new());
    for ((a, b), o) in s0.iter().zip(&s1).zip(outputs) {
        let dt = b["detail"]["seconds"].as_f64().unwrap_or(0.0) - a["detail"]["seconds"].as_f64().unwrap_or(0.0);
        let db = counter(b, "bytes")?.saturating_sub(counter(a, "bytes")?);
        let dc = counter(b, "events")?.saturating_sub(counter(a, "events")?);
        if dt <= 0.0 || dc == 0 {
            // A slow sampling output may take nothing in a short window; a blocking one must.
            if o.mode == "blocking" {
                bail!("no data reached the {} output in the measurement window", o.kind);
            }
            mb_per_s.push(0.0);
            chunks_per_s.push(0.0);
            continue;
        }
        mb_per_s.push(db as f64 / dt / 1e6);
        chunks_per_s.push(dc as f64 / dt);
    }
    Ok(FanOutRun { mb_per_s, chunks_per_s, dropped })
}

/// The dispatcher's fan-out cases at chunk size `chunk`: `fanout_copy` and
/// `fanout_round_robin` (generator → dispatcher → 2 sinks), `logger` (→ a logger alone) and
/// `logger_monitor` (→ the logger, blocking, and a chain monitor taking 10 ms per chunk,
/// sampling).
fn measure_fanout(suite: &mut Suite, failures: &mut Vec<String>, chunk: usize, warmup: f64, window: f64) {
    let sink = || FanOut { kind: "sink", mode: "blocking", sets: vec!["check=false".into()] };
    let params = |outputs: usize| vec![("chunk_bytes", Param::from(chunk)), ("outputs", Param::from(outputs))];
    for policy in ["copy", "round_robin"] {
        suite.measure_or_record(&format!("fanout_{policy}"), params(2), failures, || {
            let r = run_fanout(chunk, policy, &[sink(), sink()], warmup, window)?;
            // Copy: each sink takes every chunk, the slower sets the pace; round robin: they share.
            let (mb, chunks) = if policy == "copy" {
                (
                    r.mb_per_s.iter().copied().fold(f64::MAX, f64::min),
                    r.chunks_per_s.iter().copied().fold(f64::MAX, f64::min),
                )
            } else {
                (r.mb_per_s.iter().sum(), r.chunks_per_s.iter().sum())
            };
            Ok(Metrics::new().with("mb_per_s", mb).with("chunks_per_s", chunks))
        });
    }
    let directory = std::env::temp_dir().join(format!("daqflow-bench-logger-{}", std::process::id()));
    let logger = || FanOut {
        kind: "logger",
        mode: "blocking",
        sets: vec![format!("directory={}", directory.display()), "sync_on_close=false".into(), "check=false".into()],
    };
    let monitor =
        FanOut { kind: "chain_monitor", mode: "sampling", sets: vec!["work_us=10000".into(), "check=false".into()] };
    suite.measure_or_record("logger", params(1), failures, || {
        let r = run_fanout(chunk, "copy", &[logger()], warmup, window);
        let _ = std::fs::remove_dir_all(&directory);
        let r = r?;
        Ok(Metrics::new().with("mb_per_s", r.mb_per_s[0]).with("chunks_per_s", r.chunks_per_s[0]))
    });
    suite.measure_or_record("logger_monitor", params(2), failures, || {
        let r =
            run_fanout(chunk, "copy", &[logger(), FanOut { sets: monitor.sets.clone(), ..monitor }], warmup, window);
        let _ = std::fs::remove_dir_all(&directory);
        let r = r?;
        Ok(Metrics::new()
            .with("mb_per_s", r.mb_per_s[0])
            .with("chunks_per_s", r.chunks_per_s[0])
            .with("monitor_chunks_per_s", r.chunks_per_s[1])
            .with("monitor_dropped", r.dropped[1] as f64))
    });
}

/// Runs the suite: the results and the failed points.
pub fn run(config: BenchConfig, opts: ChainOptions) -> anyhow::Result<(Suite, Vec<String>)> {
    // Every chain run has its own warm-up before its window.
    let config = BenchConfig { warmup: false, ..config };
    let quick = config.quick;
    let window = config.measure_time.as_secs_f64();
    let warmup = if quick { 0.2 } else { 0.4 };
    let raw_time = Duration::from_secs_f64(if quick { 0.2 } else { 0.4 });
    let mut suite = Suite::new(
        "chain",
        "the DAQ-Middleware component chain (figs. 4–9): generator → k repeaters → sink",
        config.clone(),
    );
    let mut failures = Vec::new();
    let places = Places::here();
    let mut measure = |suite: &mut Suite, case: &str, chunk: usize, k: usize, forward: &str| {
        let params = vec![("chunk_bytes", Param::from(chunk)), ("repeaters", Param::from(k))];
        let r = suite.measure(case, params, || {
            let raw = super::raw::one_hop(chunk, raw_time)?;
            let c = run_chain(&places, chunk, k, forward, opts.check, warmup, window)?;
            let raw = super::raw::settle(raw, c.mb_per_s, || super::raw::one_hop(chunk, raw_time))?;
            let m = Metrics::new().with("mb_per_s", c.mb_per_s).with("chunks_per_s", c.chunks_per_s);
            Ok(super::raw::with_ratio(m, "ratio_to_raw", c.mb_per_s, &raw))
        });
        if let Err(e) = r {
            eprintln!("\n  FAILED: {e:#}");
            failures.push(format!("{e:#}"));
        }
    };
    for &k in &opts.repeaters {
        for &chunk in &opts.sizes {
            measure(&mut suite, "chain", chunk, k, "transport");
        }
    }
    // The alternative the repeater offers: splice(2) from socket to socket (chunks of 16 KiB
    // and more are spliced), at the sizes where it applies.
    for &chunk in opts.splice_sizes() {
        measure(&mut suite, "splice", chunk, 1, "splice");
    }
    // DAQ-Middleware's dispatcher: fan-out to two sinks, and a logger with and without a slow
    // sampling monitor beside it.
    for chunk in opts.fanout_sizes() {
        measure_fanout(&mut suite, &mut failures, chunk, warmup, window);
    }
    suite.plots = plots(&opts.repeaters, &opts.sizes);
    notes(&mut suite, &opts, warmup, window, raw_time);
    fanout_notes(&mut suite, &opts.fanout_sizes());
    suite.note_failures(&failures);
    Ok((suite, failures))
}

/// What the fan-out cases are, and the logger's rate beside a slow monitor against its rate
/// alone (the target: at least 90%).
fn fanout_notes(suite: &mut Suite, sizes: &[usize]) {
    if sizes.is_empty() {
        return;
    }
    suite.note(
        "Fan-out cases (DAQ-Middleware's dispatcher), processes on loopback as above, the generator free-running: \
         fanout_copy and fanout_round_robin: generator → dispatcher → 2 sinks (mb_per_s: copy, the slower sink's \
         rate, each sink receiving every chunk; round robin, the two sinks' rates summed); logger: generator → \
         dispatcher → a logger writing data files into the temporary directory (sync_on_close = false); \
         logger_monitor: the same logger as a blocking output and a chain monitor taking 10 ms per chunk \
         (work_us = 10000) as a sampling output (mb_per_s: the logger's; monitor_chunks_per_s and monitor_dropped: \
         what the monitor took and what the dispatcher dropped for it). Every run checks that the blocking outputs \
         received every chunk and that each sampling output's passed and dropped chunks add up to the chunks sent.",
    );
    let median = |case: &str, chunk: usize| {
        suite
            .points
            .iter()
            .find(|p| p.case == case && p.param("chunk_bytes").and_then(Param::num) == Some(chunk as f64))
            .and_then(|p| p.metric("mb_per_s"))
            .map(|m| m.median)
    };
    let ratios: Vec<(usize, f64)> =
        sizes.iter().filter_map(|&c| Some((c, median("logger_monitor", c)? / median("logger", c)?))).collect();
    if ratios.is_empty() {
        suite.note(
            "target: the logger's rate beside a 10 ms/chunk sampling monitor ≥ 90% of its rate alone — not measured",
        );
    } else {
        let list: Vec<String> =
            ratios.iter().map(|(c, r)| format!("{} {:.0}%", crate::format::bytes(*c as f64), r * 100.0)).collect();
        let met = ratios.iter().all(|(_, r)| *r >= 0.9);
        suite.note(format!(
            "target: the logger's rate beside a 10 ms/chunk sampling monitor ≥ 90% of its rate alone — measured {} ({})",
            list.join(", "),
            if met { "met" } else { "NOT met" }
        ));
    }
}

/// Runs the chain across two test hosts (`bench chain --hosts 2`, DAQ-Middleware figs. 4–5):
/// the generator in host 1 (the bench process's end of the chain), the sink in host 2 started
/// over ssh from host 1 and driven over that connection, at every chunk size; each repetition
/// next to raw TCP from host 1 to host 2. The results and the failed points.
pub fn run_hosts(config: BenchConfig, opts: ChainOptions, hosts: usize) -> anyhow::Result<(Suite, Vec<String>)> {
    if hosts != 2 {
        bail!("bench chain --hosts {hosts}: the chain runs on 2 hosts (the generator on host 1, the sink on host 2)");
    }
    let config = BenchConfig { warmup: false, ..config };
    let quick = config.quick;
    let window = config.measure_time.as_secs_f64();
    let warmup = if quick { 0.2 } else { 0.4 };
    let raw_seconds = if quick { 0.2 } else { 0.4 };
    let set = super::hosts::create("chain", hosts)?;
    let (from, to) = (set.host(0), set.host(1));
    let remote = set.remote_command(&super::hosts::exe()?)?;
    let log = format!("DAQFLOW_LOG={}", std::env::var("DAQFLOW_LOG").unwrap_or_else(|_| "warn".into()));
    let places = Places {
        generator: Launch::InHost(from.clone()),
        repeaters: Launch::InHost(from.clone()),
        sink: Launch::remote(Some(from), &remote, &to.addr().to_string(), &[&log])?,
        sink_listen: Some(format!("{}:0", to.addr())),
    };
    let mut suite = Suite::new(
        "chain-hosts",
        "the DAQ-Middleware chain across 2 hosts (figs. 4–5, network namespaces): generator on host 1 → sink on host 2, \
         next to raw TCP between them",
        config.clone(),
    );
    let mut failures = Vec::new();
    for &chunk in &opts.sizes {
        let params = vec![("chunk_bytes", Param::from(chunk)), ("hosts", Param::from(hosts))];
        suite.measure_or_record("hosts", params, &mut failures, || {
            let raw = super::hosts::raw(from, to, chunk, raw_seconds)?;
            let c = run_chain(&places, chunk, 0, "transport", opts.check, warmup, window)?;
            let raw = super::raw::settle(raw, c.mb_per_s, || super::hosts::raw(from, to, chunk, raw_seconds))?;
            let m = Metrics::new().with("mb_per_s", c.mb_per_s).with("chunks_per_s", c.chunks_per_s);
            Ok(super::raw::with_ratio(m, "ratio_to_raw", c.mb_per_s, &raw).with("lost_chunks", 0.0))
        });
    }
    drop(set);
    let series =
        |label: &str, metric: &'static str| Series { label: label.into(), case: "hosts", metric, filter: vec![] };
    let plot = |title: &str, y_label: &str, series: Vec<Series>| {
        Plot::over_bytes(title, "chunk_bytes", "chunk size (bytes)", y_label, false, series)
    };
    suite.plots = vec![
        plot(
            "throughput at the sink vs chunk size, generator and sink on two hosts (figs. 4–5)",
            "MB/s at the sink",
            vec![
                series("generator (host 1) → sink (host 2)", "mb_per_s"),
                series("raw TCP, host 1 → host 2", "raw_mb_per_s"),
            ],
        ),
        plot(
            "ratio to raw TCP between the same hosts",
            "chain MB/s ÷ raw MB/s",
            vec![series("generator → sink", "ratio_to_raw")],
        ),
    ];
    suite.note(super::machine_note());
    suite.note(
        "The hosts are 2 network namespaces of this machine (10.77.0.1, 10.77.0.2) joined by a software bridge, each \
         with an sshd: they share its cores and memory bandwidth, and their traffic crosses veth pairs and the bridge, \
         not a NIC. This measures the software path across hosts, not a network.",
    );
    suite.note(format!(
        "Every repetition starts the sink in host 2 over ssh from host 1 (`daqflow component sink --token-stdin`, the \
         system token on its first input line, as the operator hands it over; listening on 10.77.0.2) and the \
         generator in host 1, both driven over their standard input as in the local chain suite: {warmup} s of \
         warm-up, a {window} s window, then the generator stops and the sink must have received every chunk it \
         sent, in order (a point fails otherwise; lost_chunks is then 0). mb_per_s: data bytes per second at the sink, \
         from its counters and clock; MB = 10^6 bytes."
    ));
    suite.note(format!(
        "raw reference (raw_mb_per_s), measured before each run: one TCP connection from host 1 to host 2, a `daqflow \
         bench-helper` process in each namespace, messages of the point's chunk size, written 1 MiB per call, \
         read 4 MiB at a time, for {raw_seconds} s after a 0.1 s warm-up."
    ));
    suite.note_failures(&failures);
    Ok((suite, failures))
}

fn label(k: usize) -> String {
    match k {
        0 => "generator → sink".into(),
        1 => "1 repeater".into(),
        k => format!("{k} repeaters"),
    }
}

fn plots(repeaters: &[usize], sizes: &[usize]) -> Vec<Plot> {
    let per_k = |metric: &'static str, ks: &[usize]| -> Vec<Series> {
        ks.iter()
            .map(|&k| Series { label: label(k), case: "chain", metric, filter: vec![("repeaters", k.into())] })
            .collect()
    };
    let splice = |metric: &'static str| Series {
        label: "1 repeater, forward = splice".into(),
        case: "splice",
        metric,
        filter: vec![("repeaters", 1usize.into())],
    };
    // The plot has eight colours: the throughput panel shows some of the chains and the
    // reference, the ratio panel all of them.
    let shown: Vec<usize> = repeaters.iter().copied().filter(|k| [0, 1, 2, 4, 6].contains(k)).collect();
    let mut mb = per_k("mb_per_s", &shown);
    let raw_k = repeaters.first().copied().unwrap_or(0);
    mb.push(Series {
        label: "raw loopback TCP, one hop".into(),
        case: "chain",
        metric: "raw_mb_per_s",
        filter: vec![("repeaters", raw_k.into())],
    });
    let mut ratio = per_k("ratio_to_raw", repeaters);
    ratio.push(splice("ratio_to_raw"));
    let per_size: Vec<Series> = sizes
        .iter()
        .map(|&c| Series {
            label: format!("{} chunks", crate::format::bytes(c as f64)),
            case: "chain",
            metric: "mb_per_s",
            filter: vec![("chunk_bytes", c.into())],
        })
        .collect();
    vec![
        Plot {
            title: "throughput at the sink vs chunk size (figs. 6, 7, 9)".into(),
            x: "chunk_bytes",
            x_label: "chunk size (bytes)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "MB/s at the sink".into(),
            y_log: false,
            series: mb,
        },
        Plot {
            title: "ratio to raw loopback TCP (one hop, same chunk size)".into(),
            x: "chunk_bytes",
            x_label: "chunk size (bytes)".into(),
            x_log: true,
            x_bytes: true,
            y_label: "chain MB/s ÷ raw MB/s".into(),
            y_log: false,
            series: ratio,
        },
        Plot {
            title: "throughput vs repeaters in the chain (fig. 9)".into(),
            x: "repeaters",
            x_label: "repeaters between generator and sink".into(),
            x_log: false,
            x_bytes: false,
            y_label: "MB/s at the sink".into(),
            y_log: false,
            series: per_size,
        },
    ]
}

fn notes(suite: &mut Suite, opts: &ChainOptions, warmup: f64, window: f64, raw_time: Duration) {
    suite.note(super::machine_note());
    suite.note(format!(
        "Every repetition starts the chain as separate processes (`daqflow component sink | repeater | generator`) \
         on loopback TCP, runs {warmup} s of warm-up and a {window} s window, then stops the generator and checks \
         that the sink received every chunk it sent, in order (a point fails otherwise). The generator is \
         free-running and sends one cached pattern per chunk with a fresh 16-byte header (sequence number, length{}); \
         repeaters pass every frame on without copying it in user space; the sink checks sequence numbers{} and \
         discards the data. mb_per_s: data bytes per second at the sink (headers not counted), from the sink's \
         counters and clock; MB = 10^6 bytes. Case chain: repeaters with forward = transport (the default); case \
         splice: one repeater with forward = splice (splice(2) from socket to socket through a pipe).",
        if opts.check { ", CRC32C" } else { "" },
        if opts.check { " and CRCs" } else { "" },
    ));
    suite.note(format!(
        "raw reference (raw_mb_per_s), measured before each run: one blocking TCP connection over 127.0.0.1 between \
         two threads of the bench process, messages of the point's chunk size, written 1 MiB per call, read \
         4 MiB at a time, for {} s after a 0.1 s warm-up: loopback's best case for one hop and two threads. A chain of k repeaters moves \
         every byte over k + 1 hops with k + 2 processes on the same cores, so the ratio falls with k.",
        raw_time.as_secs_f64()
    ));
    let at = |k: usize, c: usize| {
        suite
            .points
            .iter()
            .find(|p| {
                p.param("repeaters").and_then(Param::num) == Some(k as f64)
                    && p.param("chunk_bytes").and_then(Param::num) == Some(c as f64)
            })
            .and_then(|p| p.metric("ratio_to_raw"))
            .map(|s| s.median)
    };
    let target: Vec<(usize, f64)> =
        opts.sizes.iter().filter(|&&c| c >= 64 << 10).filter_map(|&c| Some((c, at(1, c)?))).collect();
    if target.is_empty() {
        suite.note("target: generator → repeater → sink at ≥ 64 KiB chunks ≥ 60% of raw — not measured");
    } else {
        let list: Vec<String> =
            target.iter().map(|(c, r)| format!("{} {:.0}%", crate::format::bytes(*c as f64), r * 100.0)).collect();
        let met = target.iter().all(|(_, r)| *r >= 0.6);
        suite.note(format!(
            "target: generator → repeater → sink at ≥ 64 KiB chunks ≥ 60% of the raw single-hop reference — measured \
             {} ({})",
            list.join(", "),
            if met { "met" } else { "NOT met" }
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_sweep_covers_the_papers_figures() {
        let o = ChainOptions::new(false, None);
        assert_eq!(o.repeaters, vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!((o.sizes[0], *o.sizes.last().unwrap()), (1024, 1 << 20));
        assert!(o.sizes.windows(2).all(|w| w[1] == w[0] * 4));
        assert_eq!(o.splice_sizes(), &[16 << 10, 64 << 10, 256 << 10, 1 << 20]);
        assert_eq!(ChainOptions::new(true, None).splice_sizes(), &[64 << 10]);
        assert!(ChainOptions::new(true, Some(vec![1024])).splice_sizes().is_empty());
    }
}
