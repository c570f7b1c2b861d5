//! The event builder without sockets: the EVM, RU and BU cores wired together in memory and
//! stepped by a seeded scheduler on virtual time (`sim.rs`), under random interleavings, BU
//! deaths and joins, credits, level-2 rejects and a stop at a random point.
//!
//! `SIM_TRACE=1` keeps the last 400 lines of a run's trace in its report (printed by the
//! scenario tests when they fail). `docs/evb.md`, "Testing the builder without sockets", tells
//! what is simulated and what is checked.
//!
//! The simulation is a test of its own rather than a module of the library: nothing but tests
//! has a use for it, and it needs only the crate's public API (the cores, the protocol, the
//! size models), which it uses as any user of the cores would.

mod sim;

use std::time::Duration;

use daqflow_evb::model::SizeModel;
use daqflow_wire::file::DiskMarks;
use proptest::prelude::*;
use sim::{BuSpec, Chaos, Report, Sim, SimConfig, SimDisk, Triggering};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// Fails with the report's summary, the problem and (with `SIM_TRACE`) the trace.
fn verdict(r: &Report, check: Result<(), String>) {
    if let Err(e) = check {
        panic!("{e}\n{}\n{}", r.summary(), r.trace.join("\n"));
    }
}

// ------------------------------------------------------------------------ scenarios

#[test]
fn a_quiet_run_builds_every_event_once() {
    let r = Sim::new(SimConfig::default(), vec![(ms(20), Chaos::Stop)]).run();
    verdict(&r, r.check_all());
    let acc = r.accounting.clone().unwrap();
    assert!(r.last_event > 20, "{}", r.summary());
    assert_eq!(acc.built, r.last_event);
    assert_eq!(sim::builds(&r).values().filter(|&&n| n != 1).count(), 0, "every event built by one BU");
}

/// A BU whose byte window holds only a few events flushes (and confirms) by bytes, not only by
/// its interval: events waiting for a flush hold credits, and a BU that flushed only every
/// `flush_interval` or every half of its credits in events would build its window's worth of
/// events per interval (issue 29: 16 MiB per 20 ms, 0.8 GB/s into files whatever the disk).
#[test]
fn a_bu_whose_byte_window_holds_few_events_confirms_by_bytes_not_by_its_interval() {
    let bu = BuSpec { flush_interval: ms(1000), max_bytes_in_flight: 16 << 10, ..BuSpec::new(0, 256, 8) };
    let cfg = SimConfig {
        rus: 1,
        sizes: SizeModel::Fixed { bytes: 1000 },
        max_triggers: 300,
        bus: vec![bu],
        ..SimConfig::default()
    };
    let r = Sim::new(cfg, vec![(ms(100), Chaos::Stop)]).run();
    verdict(&r, r.check_all());
    let acc = r.accounting.clone().unwrap();
    assert_eq!(acc.built, r.last_event, "{}", r.summary());
    // Triggered in the first 100 ms: a few windows' worth if every window waited for the
    // interval. (The last events, fewer than a flush's bytes, still wait for it.)
    assert!(r.last_event >= 100, "{} events in 100 ms with a window of 8: {}", r.last_event, r.summary());
}

#[test]
fn a_bu_that_dies_holding_events_has_them_built_by_the_others() {
    let mut s = Sim::new(SimConfig { seed: 3, ..SimConfig::default() }, Vec::new());
    assert!(s.run_until(|s| s.accounting().built >= 20 && s.in_flight_at(0) >= 3));
    let held = s.in_flight_at(0) as u64;
    s.crash(0);
    assert!(s.run_until(|s| s.accounting().reassigned >= held && s.accounting().built >= 60));
    s.stop();
    let r = s.run();
    verdict(&r, r.check_all());
    let acc = r.accounting.clone().unwrap();
    assert_eq!(acc.reassigned, held, "{}", r.summary());
    assert_eq!(acc.lost_total(), 0);
    // Whatever BU 0 held and had not confirmed, BU 1 built and confirmed.
    let dead = &r.bus[0];
    let unconfirmed: Vec<u64> = dead.assigned.iter().copied().filter(|id| !dead.confirmations.contains(id)).collect();
    assert_eq!(unconfirmed.len() as u64, held);
    assert!(unconfirmed.iter().all(|id| r.bus[1].confirmations.contains(id)), "{unconfirmed:?}");
}

#[test]
fn a_bu_that_hangs_is_declared_dead_and_a_successor_with_its_id_takes_over() {
    let mut s = Sim::new(SimConfig { seed: 5, ..SimConfig::default() }, Vec::new());
    assert!(s.run_until(|s| s.accounting().built >= 20 && s.in_flight_at(0) >= 2));
    s.hang(0, ms(10));
    let successor = s.start_bu(BuSpec::new(0, 8, 2));
    // The EVM takes it for dead after `bu_timeout_ms` of silence; its successor waits until
    // then, and builds.
    assert!(s.run_until(|s| s.confirmed_by(successor) >= 20));
    s.stop();
    let r = s.run();
    verdict(&r, r.check_all());
    assert!(r.bus[successor].admitted && !r.bus[successor].confirmations.is_empty(), "{}", r.summary());
    assert!(r.timed_out >= 1, "the EVM's BU timeout declared it dead: {}", r.summary());
    assert_eq!(r.accounting.as_ref().unwrap().lost_total(), 0);
}

#[test]
fn a_bu_that_joins_mid_run_gets_its_share() {
    let cfg = SimConfig { seed: 7, bus: vec![BuSpec::new(0, 8, 2)], ..SimConfig::default() };
    let plan = vec![(ms(10), Chaos::Join { reuse: None, credits: 8, request_batch: 2 }), (ms(40), Chaos::Stop)];
    let r = Sim::new(cfg, plan).run();
    verdict(&r, r.check_all());
    assert_eq!(r.bus.len(), 2);
    assert_eq!(r.bus[1].id, 1, "a fresh id");
    assert!(r.bus[1].confirmations.len() > 20, "{}", r.summary());
    assert!(r.bus.iter().all(|b| b.survived));
}

#[test]
fn all_bus_die_and_one_comes_back_with_a_reused_id() {
    let plan = vec![
        (ms(5), Chaos::Crash(0)),
        (ms(5), Chaos::Crash(0)),
        (ms(15), Chaos::Join { reuse: Some(1), credits: 4, request_batch: 1 }),
        (ms(30), Chaos::Stop),
    ];
    let r = Sim::new(SimConfig { seed: 11, ..SimConfig::default() }, plan).run();
    verdict(&r, r.check_all());
    let acc = r.accounting.clone().unwrap();
    assert_eq!(r.bus.len(), 3);
    assert_eq!(r.bus[2].id, 1, "the id of the second BU that died");
    assert!(acc.reassigned > 0, "{}", r.summary());
    assert_eq!(acc.lost_total(), 0);
    assert_eq!(acc.built, r.last_event);
}

#[test]
fn with_every_bu_dead_the_rest_is_lost_with_the_reason() {
    let plan = vec![(ms(5), Chaos::Crash(0)), (ms(5), Chaos::Crash(0)), (ms(8), Chaos::Stop)];
    let cfg = SimConfig { seed: 13, triggering: Triggering::Paced(10), ..SimConfig::default() };
    let r = Sim::new(cfg, plan).run();
    verdict(&r, r.check_accounting());
    let acc = r.accounting.clone().unwrap();
    assert!(acc.lost_total() > 0, "{}", r.summary());
    assert_eq!(acc.lost.keys().collect::<Vec<_>>(), ["no builder unit left to build them"]);
    assert_eq!(acc.built + acc.lost_total(), r.last_event);
    assert!(r.elapsed >= Duration::from_secs(10), "the drain timeout ended the run");
}

#[test]
fn a_reject_storm_frees_every_rejected_event_at_every_ru() {
    let cfg = SimConfig {
        seed: 17,
        rus: 3,
        streams: 3,
        reject_fraction: 0.9,
        reject_group: 10,
        triggering: Triggering::Paced(20),
        max_triggers: 1000,
        ..SimConfig::default()
    };
    let r = Sim::new(cfg, vec![(ms(40), Chaos::Stop)]).run();
    verdict(&r, r.check_all());
    let acc = r.accounting.clone().unwrap();
    assert!(acc.rejected > 600 && acc.built > 30, "{}", r.summary());
    for (leftover, c) in &r.rus {
        assert!(leftover.is_empty());
        assert_eq!(c.rejected, acc.rejected);
    }
}

// ------------------------------------------------------------------------ properties

fn sizes() -> impl Strategy<Value = SizeModel> {
    prop_oneof![
        (0usize..400).prop_map(|bytes| SizeModel::Fixed { bytes }),
        (0usize..200, 0usize..600).prop_map(|(a, b)| SizeModel::Uniform { min: a.min(b), max: a.max(b) }),
        (50.0f64..400.0, 0.0f64..300.0).prop_map(|(mean, rms)| SizeModel::LogNormal { mean, rms }),
    ]
}

/// Credits, request batch, flush interval (ms), and `max_bytes_in_flight` (small ones cut the
/// credits once the first events are built).
fn bu_spec() -> impl Strategy<Value = (u32, u32, u64, u64)> {
    (1u32..=16, 1u32..=16, 0u64..=4, prop_oneof![3 => Just(16u64 << 20), 1 => 1024u64..32 << 10])
        .prop_map(|(c, b, f, m)| (c, b.min(c), f, m))
}

fn config() -> impl Strategy<Value = SimConfig> {
    (
        (any::<u64>(), 1u32..=3, 1usize..=3, sizes(), 1usize..=16),
        (prop_oneof![2 => Just(0.0), 1 => 0.05f64..0.6], 1u32..=8, 0u64..=3000, 1usize..=8, 1usize..=8),
        (prop_oneof![Just(Triggering::OnDemand), (1u32..=20).prop_map(Triggering::Paced)], 0u64..=2000, 0u64..=2000),
        proptest::collection::vec(bu_spec(), 1..=3),
        // Half the cases write files on a disk of 16 MiB per BU host: (high mark, the low mark
        // below it, readings every 1 to 3 ms).
        proptest::option::of((85u32..=97, 1u32..=10, 1u64..=3)),
    )
        .prop_map(|(ru, evm, timing, bus, disk)| {
            let (seed, rus, streams, sizes, read_ahead_kib) = ru;
            let (reject_fraction, assign_batch, assign_timeout_us, reject_group, release_group) = evm;
            let (triggering, link_us, build_us) = timing;
            SimConfig {
                seed,
                rus,
                streams,
                sizes,
                ru_read_ahead_bytes: read_ahead_kib << 10,
                reject_fraction,
                assign_batch,
                assign_timeout: us(assign_timeout_us),
                reject_group,
                release_group,
                triggering,
                max_link_delay: us(link_us),
                max_build_delay: us(build_us),
                max_triggers: 250,
                bus: bus
                    .into_iter()
                    .enumerate()
                    .map(|(i, (credits, batch, flush, max_bytes_in_flight))| BuSpec {
                        flush_interval: ms(flush),
                        max_bytes_in_flight,
                        ..BuSpec::new(i as u32, credits, batch)
                    })
                    .collect(),
                disk: disk.map(|(high, below, check_ms)| SimDisk {
                    marks: DiskMarks { high_pct: f64::from(high), low_pct: f64::from(high - below) },
                    check_interval: ms(check_ms),
                    ..SimDisk::default()
                }),
                ..SimConfig::default()
            }
        })
}

fn chaos() -> impl Strategy<Value = Chaos> {
    prop_oneof![
        3 => (0usize..4).prop_map(Chaos::Crash),
        1 => (0usize..4).prop_map(Chaos::Hang),
        2 => (0usize..4, any::<bool>()).prop_map(|(n, hang)| Chaos::Restart { n, hang }),
        1 => (0usize..4).prop_map(Chaos::Leave),
        3 => (proptest::option::of(0usize..4), 1u32..=16, 1u32..=16).prop_map(|(reuse, credits, batch)| Chaos::Join {
            reuse,
            credits,
            request_batch: batch.min(credits),
        }),
        1 => (0usize..4).prop_map(Chaos::DropEvmLink),
        1 => (0usize..4, 0usize..3).prop_map(|(n, r)| Chaos::DropRuLink { n, r }),
    ]
}

/// Faults that end the run, rarer: an RU, a source or the EVM dies.
fn fatal() -> impl Strategy<Value = Chaos> {
    prop_oneof![
        (0usize..3).prop_map(Chaos::KillRu),
        (0usize..3, 0usize..3).prop_map(|(n, s)| Chaos::KillSource { n, s }),
        Just(Chaos::KillEvm),
    ]
}

/// Episodes of the disks (with files): another writer fills them (to a level between 5 % below
/// the low mark and half way into the reserve above the high mark) and frees them again
/// later; writing gets slower, and fast again.
fn disk_episodes() -> impl Strategy<Value = Vec<(Duration, Chaos)>> {
    let episode = prop_oneof![
        2 => (0u8..=100).prop_map(Chaos::FillDisk),
        1 => (2u32..=20).prop_map(Chaos::DiskSpeed),
    ];
    proptest::collection::vec((0u64..40_000, 0u64..20_000, episode), 0..3).prop_map(|episodes| {
        let mut plan = Vec::new();
        for (t, d, e) in episodes {
            let end = match e {
                Chaos::DiskSpeed(_) => Chaos::DiskSpeed(1),
                _ => Chaos::FreeDisk,
            };
            plan.push((us(t), e));
            plan.push((us(t + d), end));
        }
        plan
    })
}

/// Failures at random times in the first 40 ms, disk episodes, in one case of ten a fault that
/// ends the run, and the stop somewhere in the first 50 ms.
fn plan() -> impl Strategy<Value = Vec<(Duration, Chaos)>> {
    (
        proptest::collection::vec((0u64..40_000, chaos()), 0..6),
        disk_episodes(),
        proptest::option::weighted(0.1, (0u64..40_000, fatal())),
        0u64..50_000,
    )
        .prop_map(|(plan, disk, fatal, stop)| {
            let mut plan: Vec<(Duration, Chaos)> = plan.into_iter().map(|(t, c)| (us(t), c)).collect();
            plan.extend(disk);
            plan.extend(fatal.map(|(t, c)| (us(t), c)));
            plan.push((us(stop), Chaos::Stop));
            plan
        })
}

/// The case of seed `seed`: a configuration and a plan of failures drawn from one number, so
/// that any failing case is reproduced by it alone (`SIM_SEED`).
pub fn case(seed: u64) -> (SimConfig, Vec<(Duration, Chaos)>) {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
    let mut bytes = [0u8; 32];
    let mut x = seed;
    for chunk in bytes.chunks_mut(8) {
        // splitmix64: every seed, 0 included, gives a well-mixed key.
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    let mut runner =
        TestRunner::new_with_rng(ProptestConfig::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let cfg = config().new_tree(&mut runner).expect("a configuration").current();
    let plan = plan().new_tree(&mut runner).expect("a plan").current();
    (cfg, plan)
}

/// The seeds the random runs take: `SIM_SEEDS` of them (2 000 by default) from `SIM_FIRST_SEED`
/// (0 by default).
fn seeds() -> std::ops::Range<u64> {
    let var = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let first = var("SIM_FIRST_SEED", 0);
    first..first + var("SIM_SEEDS", 2000)
}

/// Whatever the configuration, the interleaving, the failures and the stop, in every one of
/// thousands of random runs:
/// - every triggered event is built (confirmed once, by a BU it was assigned to), rejected, or
///   lost with a reason, and the EVM's books say so (and balanced at every step of the run);
/// - no event is lost while a BU lives through the drain;
/// - once the run ended with everything built or rejected, the RUs hold no fragment;
/// - BUs get super-fragments only of their events, once each, and build every event from one
///   super-fragment per RU holding every stream's fragment of that event;
/// - no BU writes more than its disk holds.
///
/// A failing case is reproduced from its seed alone: `SIM_SEED=N SIM_TRACE=5000 cargo test -p
/// daqflow-evb --test simulation random_runs -- --nocapture` runs only it and prints its trace.
/// `SIM_SEEDS=20000` runs many more.
#[test]
fn random_runs_keep_every_rule() {
    if let Some(seed) = std::env::var("SIM_SEED").ok().and_then(|v| v.parse::<u64>().ok()) {
        let (cfg, plan) = case(seed);
        eprintln!("{cfg:#?}\n{plan:#?}");
        let r = Sim::new(cfg, plan).run();
        eprintln!("{}\n{}", r.trace.join("\n"), r.summary());
        verdict(&r, r.check_all());
        return;
    }
    let t = std::time::Instant::now();
    let seeds = seeds();
    let n = seeds.end - seeds.start;
    // Both halves at once: the cases are independent.
    let results: Vec<Vec<(u64, Report)>> = std::thread::scope(|scope| {
        let mid = seeds.start + n / 2;
        let halves = [seeds.start..mid, mid..seeds.end];
        let handles: Vec<_> = halves
            .into_iter()
            .map(|half| {
                scope.spawn(move || {
                    half.map(|seed| {
                        let (cfg, plan) = case(seed);
                        (seed, Sim::new(cfg, plan).run())
                    })
                    .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a simulation thread")).collect()
    });
    let mut seen = Seen::default();
    let mut failures = Vec::new();
    for (seed, r) in results.iter().flatten() {
        seen.add(r);
        if let Err(e) = r.check_all() {
            failures.push(format!(
                "seed {seed}: {e}\n{}\nreproduce: SIM_SEED={seed} SIM_TRACE=5000 cargo test -p daqflow-evb --test \
                 simulation random_runs -- --nocapture",
                r.summary()
            ));
        }
    }
    eprintln!("{n} random runs in {:.1?}: {seen:?}", t.elapsed());
    assert!(
        failures.is_empty(),
        "{} of {n} runs failed:\n\n{}",
        failures.len(),
        failures[..failures.len().min(3)].join("\n\n")
    );
    // The runs went through what they are for (so that a generator that stopped making
    // failures cannot pass unseen).
    if n >= 500 {
        assert!(seen.reassigned > n / 20 && seen.lost > 0 && seen.held > 0, "{seen:?}");
        assert!(seen.throttled > n / 50 && seen.timed_out > n / 50, "{seen:?}");
        assert!(seen.aborted > n / 100 && seen.evm_died > n / 200 && seen.link_dropped > n / 50, "{seen:?}");
    }
}

/// How many of the random runs saw each kind of thing happen.
#[derive(Debug, Default)]
struct Seen {
    events: u64,
    reassigned: u64,
    lost: u64,
    held: u64,
    refused: u64,
    throttled: u64,
    timed_out: u64,
    aborted: u64,
    evm_died: u64,
    link_dropped: u64,
    peak_disk_pct: f64,
    max_steps: u64,
}

impl Seen {
    fn add(&mut self, r: &Report) {
        let acc = r.accounting.clone().unwrap_or_default();
        self.events += r.last_event;
        self.reassigned += u64::from(acc.reassigned > 0);
        self.lost += u64::from(acc.lost_total() > 0);
        self.held += u64::from(!r.held_by_ru.is_empty());
        self.refused += u64::from(!r.refused_by_ru.is_empty());
        self.throttled += u64::from(r.throttles > 0);
        self.timed_out += u64::from(r.timed_out > 0);
        self.aborted += u64::from(r.evm_failure.is_some());
        self.evm_died += u64::from(r.evm_died);
        self.link_dropped += u64::from(!r.evm_link_dropped.is_empty());
        self.max_steps = self.max_steps.max(r.steps);
        self.peak_disk_pct = self.peak_disk_pct.max(r.disk_peak_pct);
    }
}

/// The race the generations are for: the only BU is restarted, and its successor's hello
/// reaches an RU before the EVM's BU gone for its predecessor does. The RU holds the successor
/// (generation 1) until that BU gone (generation 0) comes, so the successor never gets what was
/// queued for its predecessor and is never dropped by the BU gone: it builds on, nothing is
/// lost. (Before the generations, the RU took the successor at once, sent it its predecessor's
/// queue, and dropped it on the late BU gone.) The race needs slow links and the right delays:
/// the seeds are tried until it happened a few times.
#[test]
fn a_restarted_bu_that_reaches_an_ru_before_its_predecessors_bu_gone_builds_on() {
    let mut raced = 0;
    for seed in 0..400 {
        let cfg = SimConfig { seed, max_link_delay: ms(2), bus: vec![BuSpec::new(0, 8, 2)], ..SimConfig::default() };
        let r = Sim::new(cfg, vec![(ms(10), Chaos::Restart { n: 0, hang: false }), (ms(30), Chaos::Stop)]).run();
        assert!(r.dropped_by_ru.is_empty(), "seed {seed}: {:?}\n{}", r.dropped_by_ru, r.summary());
        verdict(&r, r.check_all());
        assert!(r.bus[1].survived && !r.bus[1].confirmations.is_empty(), "seed {seed}: {}", r.summary());
        assert_eq!(r.accounting.as_ref().unwrap().lost_total(), 0, "seed {seed}: {}", r.summary());
        if r.held_by_ru.iter().any(|h| h.contains("generation 1")) {
            raced += 1;
            if raced == 3 {
                return;
            }
        }
    }
    panic!("the race happened {raced} times in 400 seeds");
}

/// Each listed mutation of the real machines (`daqflow_evb::mutation`) makes the simulation
/// fail within a few thousand random runs: the simulation checks the code that runs, not a
/// model of it. A mutation that survives means a rule the simulation no longer exercises.
#[test]
fn every_mutation_of_the_real_code_makes_the_simulation_fail() {
    use daqflow_evb::mutation::{self, Mutation};
    let mut survivors = Vec::new();
    for m in Mutation::ALL {
        let t = std::time::Instant::now();
        let caught = mutation::with(m, || {
            (0..3000u64).find_map(|seed| {
                let (cfg, plan) = case(seed);
                Sim::new(cfg, plan).run().check_all().err().map(|e| (seed, e))
            })
        });
        match caught {
            Some((seed, e)) => {
                let first = e.lines().next().unwrap_or_default().to_owned();
                eprintln!("{m:?}: caught by seed {seed} in {:.1?}: {first}", t.elapsed());
            }
            None => survivors.push(m),
        }
    }
    assert!(survivors.is_empty(), "mutations no random run caught: {survivors:?}");
}
