//! The DAQ-Middleware chain in one process: generator → repeaters → sink through real loopback
//! sockets, driven through the component state machine, every chunk accounted for; garbage,
//! pauses, a dead sink.

use std::time::{Duration, Instant};

use daqflow_chain::generator::GeneratorDetail;
use daqflow_chain::repeater::RepeaterDetail;
use daqflow_chain::sink::SinkDetail;
use daqflow_component::{Driver, Registry, Role, State, Stats};

/// The chain's kinds, as the `daqflow` binary registers them.
fn standard() -> Registry {
    let mut r = Registry::new();
    r.add(daqflow_chain::generator::kind()).add(daqflow_chain::repeater::kind()).add(daqflow_chain::sink::kind());
    r
}

fn table(s: &str) -> toml::Table {
    s.parse().unwrap()
}

/// The chain's drivers, sink first: sink, repeaters (downstream first), generator last.
struct Chain {
    sink: Driver,
    repeaters: Vec<Driver>,
    generator: Driver,
    first_listen: String,
}

fn chain(repeaters: usize, generator_keys: &str, sink_keys: &str) -> Chain {
    chain_with(repeaters, generator_keys, "", sink_keys)
}

fn chain_with(repeaters: usize, generator_keys: &str, repeater_keys: &str, sink_keys: &str) -> Chain {
    let mut sink = Driver::new(standard(), "sink", "sink", table(sink_keys));
    let mut next = sink.configure(None).unwrap()["listen"].as_str().unwrap().to_owned();
    let mut reps = Vec::new();
    for i in 0..repeaters {
        let keys = format!("downstream = '{next}'\n{repeater_keys}");
        let mut r = Driver::new(standard(), "repeater", &format!("rep-{i}"), table(&keys));
        next = r.configure(None).unwrap()["listen"].as_str().unwrap().to_owned();
        reps.push(r);
    }
    let keys = format!("downstream = '{next}'\n{generator_keys}");
    let mut generator = Driver::new(standard(), "generator", "gen", table(&keys));
    generator.configure(None).unwrap();
    Chain { sink, repeaters: reps, generator, first_listen: next }
}

impl Chain {
    fn start(&mut self, run: u32) {
        self.sink.start(run).unwrap();
        for r in &mut self.repeaters {
            r.start(run).unwrap();
        }
        self.generator.start(run).unwrap();
    }

    /// Stops in the order of the data: generator, repeaters, sink. Their summaries.
    fn stop(&mut self, last: Option<u64>) -> (Stats, Vec<Stats>, Stats) {
        let g = self.generator.stop(last).unwrap();
        let r = self.repeaters.iter_mut().map(|r| r.stop(None).unwrap()).collect();
        (g, r, self.sink.stop(None).unwrap())
    }
}

/// The kind's own figures in a summary or live stats.
fn detail<T: serde::de::DeserializeOwned>(s: &Stats) -> T {
    s.detail_as().unwrap_or_else(|| panic!("not the kind's detail: {s:?}"))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn generator_two_repeaters_and_sink_account_for_every_chunk() {
    every_chunk_is_accounted_for("forward = 'transport'");
}

#[test]
fn generator_two_splicing_repeaters_and_sink_account_for_every_chunk() {
    every_chunk_is_accounted_for("forward = 'splice'");
}

fn every_chunk_is_accounted_for(repeater_keys: &str) {
    for chunk in [1024usize, 65536, 1 << 20] {
        let mut c = chain_with(2, &format!("chunk_bytes = {chunk}"), repeater_keys, "check = true");
        for run in [1u32, 2] {
            c.start(run);
            wait_until("the sink has data", || c.sink.stats().events > 20);
            let (g, reps, s) = c.stop(None);
            let sent = g.events;
            assert!(sent > 20 && detail::<GeneratorDetail>(&g).error.is_none(), "{g:?}");
            assert_eq!(g.bytes, sent * chunk as u64);
            for r in &reps {
                let d: RepeaterDetail = detail(r);
                assert_eq!((r.events, r.bytes, d.end_seen), (sent, sent * chunk as u64, true), "{r:?}");
            }
            let d: SinkDetail = detail(&s);
            assert_eq!((s.events, s.bytes), (sent, sent * chunk as u64), "{s:?}");
            assert_eq!((d.sequence_errors, d.crc_errors, d.missing), (0, 0, 0), "{d:?}");
            assert_eq!((d.crc_checked, d.chunks_announced), (sent, Some(sent)), "{d:?}");
            assert!(s.mb_per_s > 0.0 && s.mb_per_s == d.mean_mb_per_s && d.error.is_none(), "{s:?}");
            for d in std::iter::once(&c.sink).chain(&c.repeaters).chain(std::iter::once(&c.generator)) {
                assert_eq!(d.state(), State::Configured, "{}: {:?}", d.name(), d.failure());
            }
        }
    }
}

#[test]
fn a_generator_told_where_to_stop_sends_exactly_that_many_chunks() {
    let mut c = chain(1, "chunk_bytes = 100\ncheck = false", "check = true");
    c.start(5);
    let (g, reps, s) = c.stop(Some(123_456));
    assert_eq!((g.events, reps[0].events, s.events), (123_456, 123_456, 123_456));
    let d: SinkDetail = detail(&s);
    assert_eq!((d.crc_checked, d.sequence_errors), (0, 0), "no CRCs sent: none checked");
}

#[test]
fn live_stats_count_during_the_run_and_pause_stops_the_flow() {
    let mut c = chain(1, "chunk_bytes = 4096", "");
    c.start(1);
    wait_until("the sink counts", || c.sink.stats().bytes > 0);
    // The rates are those of the last interval (at least 0.2 s long).
    std::thread::sleep(Duration::from_millis(300));
    wait_until("the sink has a rate", || c.sink.stats().events_per_s > 0.0);
    let stats = c.sink.stats();
    assert!(stats.mb_per_s > 0.0, "{stats:?}");
    let d: SinkDetail = detail(&stats);
    assert!(d.seconds > 0.0 && d.mean_mb_per_s > 0.0 && d.upstream.is_some(), "{d:?}");
    assert_eq!((d.sequence_errors, d.crc_errors, d.end_seen), (0, 0, false), "{d:?}");
    assert_eq!((c.sink.state(), c.sink.run()), (State::Running, Some(1)));
    c.generator.pause().unwrap();
    // Once what was in flight has arrived, nothing more comes.
    let mut last = u64::MAX;
    wait_until("the flow stops", || {
        std::thread::sleep(Duration::from_millis(100));
        let now = c.sink.stats().events;
        let still = now == last;
        last = now;
        still
    });
    assert_eq!(c.generator.stats().events, last, "everything sent has arrived");
    c.generator.resume().unwrap();
    wait_until("the flow resumes", || c.sink.stats().events > last);
    let (g, _, s) = c.stop(None);
    assert_eq!(g.events, s.events);
}

#[test]
fn garbage_into_a_repeater_is_refused_and_the_chain_runs_on() {
    use std::io::Write;
    let mut c = chain(1, "chunk_bytes = 2048", "");
    c.start(1);
    let mut raw = std::net::TcpStream::connect(&c.first_listen).unwrap();
    raw.write_all(b"GET /metrics HTTP/1.1\r\nHost: daqflow\r\n\r\n").unwrap();
    let mut seen = Vec::new();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = std::io::Read::read_to_end(&mut raw, &mut seen);
    assert!(!seen.is_empty(), "the stranger got the challenge, then was closed");
    wait_until("data flows", || c.sink.stats().events > 0);
    assert!(c.repeaters[0].failure().is_none() && c.sink.failure().is_none());
    let (g, _, s) = c.stop(None);
    assert_eq!(g.events, s.events);
}

#[test]
fn a_dead_sink_fails_the_chain_above_it_without_hanging() {
    for forward in ["transport", "splice"] {
        let mut c = chain_with(1, "chunk_bytes = 65536\nstop_timeout_ms = 2000", &format!("forward = '{forward}'"), "");
        c.start(1);
        wait_until("data flows", || c.sink.stats().events > 0);
        c.sink.reset().unwrap(); // as if the process died: its sockets close
        wait_until("the repeater fails", || c.repeaters[0].state() == State::Error);
        let why = c.repeaters[0].failure().unwrap();
        assert!(why.contains("downstream"), "{forward}: {why}");
        wait_until("the generator fails", || c.generator.state() == State::Error);
        let g = c.generator.stop(None).unwrap();
        assert!(detail::<GeneratorDetail>(&g).error.is_some(), "{g:?}");
    }
}

#[test]
fn unknown_and_missing_keys_are_refused_by_name() {
    let mut g = Driver::new(standard(), "generator", "gen", table("downstream = '127.0.0.1:9'\nchunk_size = 10"));
    let e = g.configure(None).unwrap_err().to_string();
    assert!(e.contains("`chunk_size`: no such key of a generator (its keys: downstream, chunk_bytes"), "{e}");
    let mut r = Driver::new(standard(), "repeater", "rep", toml::Table::new());
    let e = r.configure(None).unwrap_err().to_string();
    assert!(e.contains("rep: `downstream` is required"), "{e}");
    let mut s = Driver::new(standard(), "sink", "sink", table("listen = 'not an address'"));
    assert!(s.configure(None).unwrap_err().to_string().contains("`listen` = \"not an address\" is not an address"));
}

#[test]
fn the_kinds_keep_the_chain_order_of_stages() {
    let r = standard();
    let stages = |k: &str| {
        let kind = r.kind(k).unwrap();
        assert_eq!(kind.role, Role::Other, "{k}");
        (kind.start_stage, kind.stop_stage)
    };
    // Receivers start first and stop last; the generator starts last and stops first.
    assert_eq!((stages("sink"), stages("repeater"), stages("generator")), ((2, 5), (3, 4), (7, 1)));
}
