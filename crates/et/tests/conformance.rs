//! Conformance of the ET system's behaviour, each test run twice: through local (shared-memory)
//! attachments and through remote (TCP) attachments to the same system.
//!
//! Events carry their sequence number in their first 8 bytes, so that every test can say
//! exactly which events a station got and in which order.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use daqflow_et::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Local,
    Remote,
}

/// A connection of either kind.
#[derive(Clone)]
enum Conn {
    Local(EtClient),
    Remote(RemoteClient),
}

impl Conn {
    fn attach(&self, station: &str) -> Box<dyn Attachment + Send> {
        self.try_attach(station).expect("attach")
    }

    fn try_attach(&self, station: &str) -> Result<Box<dyn Attachment + Send>, EtError> {
        Ok(match self {
            Conn::Local(c) => Box::new(c.attach(station)?),
            Conn::Remote(c) => Box::new(c.attach(station)?),
        })
    }

    fn create(&self, name: &str, config: StationConfig, position: Position) {
        match self {
            Conn::Local(c) => c.create_station(name, config, position),
            Conn::Remote(c) => c.create_station(name, config, position),
        }
        .expect("create station")
    }

    fn configure(&self, name: &str, config: StationConfig) {
        match self {
            Conn::Local(c) => c.configure_station(name, config),
            Conn::Remote(c) => c.configure_station(name, config),
        }
        .expect("configure station")
    }

    fn snapshot(&self) -> Snapshot {
        match self {
            Conn::Local(c) => c.snapshot(),
            Conn::Remote(c) => c.snapshot(),
        }
        .expect("snapshot")
    }

    fn station(&self, name: &str) -> StationStatus {
        self.snapshot().stations.into_iter().find(|s| s.name == name).expect("station exists")
    }
}

struct Setup {
    system: EtSystem,
    kind: Kind,
    conn: Conn,
}

impl Setup {
    fn new(kind: Kind, test: &str, events: u32, event_size: usize) -> Setup {
        Self::with(kind, test, |c| {
            c.events = events;
            c.event_size = event_size;
        })
    }

    fn with(kind: Kind, test: &str, tweak: impl FnOnce(&mut SystemConfig)) -> Setup {
        let name = format!("conf-{test}-{kind:?}-{}", std::process::id());
        let mut config = SystemConfig::new(&name, 500, 256);
        config.listen = Some("127.0.0.1:0".parse().unwrap());
        tweak(&mut config);
        let system = EtSystem::create(config).expect("create the system");
        let conn = Self::connect_to(kind, &system);
        Setup { system, kind, conn }
    }

    fn connect_to(kind: Kind, system: &EtSystem) -> Conn {
        match kind {
            Kind::Local => Conn::Local(EtClient::connect(system.name()).expect("connect")),
            Kind::Remote => Conn::Remote(RemoteClient::connect(system.remote_addr().unwrap()).expect("connect")),
        }
    }

    /// A second, independent connection (as another process would have).
    fn connect(&self) -> Conn {
        Self::connect_to(self.kind, &self.system)
    }

    /// Waits until the whole pool is back in GrandCentral, and checks the books.
    fn assert_all_free(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let s = self.conn.snapshot();
            if s.free_events == s.events && s.temp_events == 0 {
                assert_eq!(s.accounted(), u64::from(s.events), "{s:#?}");
                assert!(s.attachments.iter().all(|a| a.held == 0), "{s:#?}");
                return;
            }
            assert!(Instant::now() < deadline, "events did not come back to GrandCentral: {s:#?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn station(f: impl FnOnce(&mut StationConfig)) -> StationConfig {
    let mut c = StationConfig::default();
    f(&mut c);
    c
}

fn seq(e: &Event<'_>) -> u64 {
    u64::from_le_bytes(e.data()[..8].try_into().unwrap())
}

/// Produces events `first..first + n` in batches of `batch`, with control integers and
/// priority from `header(seq)`.
fn produce(
    att: &dyn Attachment,
    first: u64,
    n: u64,
    batch: usize,
    size: usize,
    header: impl Fn(u64) -> ([i32; 4], Priority),
) {
    let mut next = first;
    while next < first + n {
        let k = batch.min((first + n - next) as usize);
        let mut events = att.new_events(k, size, Wait::Timed(Duration::from_secs(10))).expect("new events");
        for e in &mut events {
            let mut data = vec![0u8; size.max(8)];
            data[..8].copy_from_slice(&next.to_le_bytes());
            e.write(&data).unwrap();
            let (control, priority) = header(next);
            e.set_control(control);
            e.set_priority(priority);
            next += 1;
        }
        att.put_events(&mut events).expect("put");
    }
}

fn plain(_: u64) -> ([i32; 4], Priority) {
    ([0; 4], Priority::Low)
}

/// Gets events until none comes for `quiet`, putting them on; returns their sequence numbers.
fn drain(att: &dyn Attachment, quiet: Duration) -> Vec<u64> {
    let mut seqs = Vec::new();
    loop {
        match att.get_events(64, Wait::Timed(quiet)) {
            Ok(mut events) => {
                seqs.extend(events.iter().map(seq));
                att.put_events(&mut events).expect("put");
            }
            Err(EtError::Timeout) => return seqs,
            Err(e) => panic!("get: {e}"),
        }
    }
}

/// Gets exactly `n` events (waiting up to 10 s), putting them on.
fn take(att: &dyn Attachment, n: usize) -> Vec<u64> {
    let mut seqs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seqs.len() < n {
        assert!(Instant::now() < deadline, "got {} of {n} events", seqs.len());
        match att.get_events(n - seqs.len(), Wait::Timed(Duration::from_millis(200))) {
            Ok(mut events) => {
                seqs.extend(events.iter().map(seq));
                att.put_events(&mut events).expect("put");
            }
            Err(EtError::Timeout) => {}
            Err(e) => panic!("get: {e}"),
        }
    }
    seqs
}

const QUIET: Duration = Duration::from_millis(300);

macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn local() {
                super::$name(super::Kind::Local)
            }
            #[test]
            fn remote() {
                super::$name(super::Kind::Remote)
            }
        }
    )*};
}

both!(
    ordering,
    blocking_and_non_blocking,
    selection_by_control_integers,
    prescale,
    priorities,
    large_events,
    large_events_are_limited,
    an_event_over_max_event_bytes_is_refused_before_anything_is_taken,
    one_attachment_holds_a_bounded_number_of_large_events,
    temporary_buffers_are_bounded_in_bytes,
    a_connection_has_a_bounded_number_of_attachments,
    consumers_share_a_station,
    chain_of_stations,
    parallel_groups,
    a_parallel_group_member_leaving_redistributes_its_events_to_the_others,
    configure_while_running,
    dump_skips_the_rest,
    idle_stations_let_events_pass,
    a_station_that_keeps_its_events_while_idle_gives_them_to_the_next_consumer,
    restore_modes_on_detach,
    closure_and_predicate_selection,
    dead_system_is_noticed,
    a_consumer_leaving_gives_back_what_it_did_not_use,
);

/// Events reach a consumer in the order they were put, across batches and a concurrent producer.
fn ordering(kind: Kind) {
    let s = Setup::new(kind, "ordering", 300, 64);
    s.conn.create("a", StationConfig::default(), Position::End);
    let consumer = s.conn.attach("a");
    let producer_conn = s.connect();
    let producer = std::thread::spawn(move || {
        let att = producer_conn.attach(GRAND_CENTRAL);
        produce(&*att, 0, 5000, 37, 64, plain);
    });
    let got = take(&*consumer, 5000);
    producer.join().unwrap();
    assert_eq!(got, (0..5000).collect::<Vec<_>>());
    drop(consumer);
    s.assert_all_free();
}

/// A blocking station gets every event; a non-blocking one only up to its cue, the rest flow past.
fn blocking_and_non_blocking(kind: Kind) {
    let s = Setup::new(kind, "blocking", 500, 64);
    s.conn.create(
        "nb",
        station(|c| {
            c.blocking = false;
            c.cue = 10;
        }),
        Position::End,
    );
    s.conn.create("blk", StationConfig::default(), Position::End);
    let nb = s.conn.attach("nb");
    let blk = s.conn.attach("blk");
    let producer = s.conn.attach(GRAND_CENTRAL);
    produce(&*producer, 0, 100, 25, 64, plain);
    assert_eq!(s.conn.station("nb").queued, 10);
    assert_eq!(s.conn.station("blk").queued, 90);
    // The non-blocking station got the first ten; put on, they follow to the blocking one.
    let mut first = nb.get_events(100, Wait::NoWait).unwrap();
    assert_eq!(first.iter().map(seq).collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
    nb.put_events(&mut first).unwrap();
    let at_blk = take(&*blk, 100);
    assert_eq!(at_blk.iter().copied().collect::<BTreeSet<_>>(), (0..100).collect::<BTreeSet<_>>());
    assert_eq!(&at_blk[..90], &(10..100).collect::<Vec<_>>()[..]);

    // Nobody reads: the blocking station holds every event it gets, the producer runs dry.
    let mut produced = 0;
    loop {
        let mut events = producer.new_events(50, 64, Wait::NoWait).unwrap();
        if events.is_empty() {
            break;
        }
        produced += events.len();
        producer.put_events(&mut events).unwrap();
    }
    assert_eq!(produced, 500);
    let snap = s.conn.snapshot();
    assert_eq!(snap.free_events, 0);
    assert_eq!(s.conn.station("nb").queued, 10);
    assert_eq!(s.conn.station("blk").queued, 490);
    assert!(matches!(producer.new_events(1, 64, Wait::Timed(Duration::from_millis(50))), Err(EtError::Timeout)));
    drop((nb, blk));
    s.assert_all_free();
}

/// Stations select by control integers, with wildcards, ranges and masks; every station in the
/// chain sees every event it selects.
fn selection_by_control_integers(kind: Kind) {
    let s = Setup::new(kind, "select", 1000, 64);
    let selections = [
        ("m1", Selection::Match([Some(1), None, None, None])),
        ("m2", Selection::Match([None, Some(7), None, Some(-3)])),
        ("range", Selection::Range { index: 2, lo: 10, hi: 20 }),
        ("any", Selection::MaskAny { index: 3, mask: 0x6 }),
        ("all", Selection::MaskAll { index: 3, mask: 0x6 }),
    ];
    for (name, sel) in &selections {
        s.conn.create(name, station(|c| c.selection = sel.clone()), Position::End);
    }
    let consumers: Vec<_> = selections.iter().map(|(n, _)| s.conn.attach(n)).collect();
    let control = |i: u64| -> [i32; 4] {
        [(i % 3) as i32, (i % 8) as i32, (i % 25) as i32, if i % 4 == 3 { -3 } else { (i % 8) as i32 }]
    };
    let producer = s.conn.attach(GRAND_CENTRAL);
    produce(&*producer, 0, 800, 100, 64, |i| (control(i), Priority::Low));
    let expect = |f: &dyn Fn([i32; 4]) -> bool| (0..800).filter(|&i| f(control(i))).collect::<Vec<u64>>();
    let wanted: [Vec<u64>; 5] = [
        expect(&|c| c[0] == 1),
        expect(&|c| c[1] == 7 && c[3] == -3),
        expect(&|c| (10..=20).contains(&c[2])),
        expect(&|c| c[3] & 0x6 != 0),
        expect(&|c| c[3] & 0x6 == 0x6),
    ];
    // Draining the stations in chain order, each gets every event it selects. Events that came
    // by different paths (through an upstream station or past it) need not keep their
    // relative order; events that came by the same path do.
    for (k, ((consumer, want), (name, _))) in consumers.iter().zip(&wanted).zip(&selections).enumerate() {
        assert!(!want.is_empty());
        let got = drain(&**consumer, QUIET);
        let path = |i: u64| -> Vec<bool> { wanted[..k].iter().map(|w| w.contains(&i)).collect() };
        let mut by_path: std::collections::BTreeMap<Vec<bool>, Vec<u64>> = Default::default();
        for &i in &got {
            by_path.entry(path(i)).or_default().push(i);
        }
        assert!(by_path.values().all(|v| v.is_sorted()), "station {name}: {got:?}");
        let mut got = got;
        got.sort_unstable();
        assert_eq!(&got, want, "station {name}");
    }
    drop(consumers);
    s.assert_all_free();
}

/// A prescale of N takes every Nth selected event; the others flow past.
fn prescale(kind: Kind) {
    let s = Setup::new(kind, "prescale", 500, 64);
    s.conn.create(
        "ps",
        station(|c| {
            c.prescale = 3;
            c.selection = Selection::Match([Some(1), None, None, None]);
        }),
        Position::End,
    );
    s.conn.create("after", StationConfig::default(), Position::End);
    let ps = s.conn.attach("ps");
    let after = s.conn.attach("after");
    let producer = s.conn.attach(GRAND_CENTRAL);
    produce(&*producer, 0, 120, 10, 64, |i| ([(i % 2) as i32 + 1, 0, 0, 0], Priority::Low));
    // Selected: the even sequence numbers (control 1); taken: every third of those.
    let want: Vec<u64> = (0..120).filter(|i| i % 2 == 0).step_by(3).collect();
    assert_eq!(drain(&*ps, QUIET), want);
    assert_eq!(drain(&*after, QUIET).len(), 120);
    drop((ps, after));
    s.assert_all_free();
}

/// High-priority events go ahead of low-priority ones.
fn priorities(kind: Kind) {
    let s = Setup::new(kind, "priority", 200, 64);
    s.conn.create("a", StationConfig::default(), Position::End);
    s.conn.create("high-only", station(|c| c.selection = Selection::HighPriority), Position::End);
    let a = s.conn.attach("a");
    let high_only = s.conn.attach("high-only");
    let producer = s.conn.attach(GRAND_CENTRAL);
    produce(&*producer, 0, 10, 10, 64, plain);
    produce(&*producer, 10, 10, 3, 64, |_| ([0; 4], Priority::High));
    produce(&*producer, 20, 5, 5, 64, plain);
    let mut got = a.get_events(100, Wait::NoWait).unwrap();
    let order: Vec<u64> = got.iter().map(seq).collect();
    let mut want: Vec<u64> = (10..20).collect();
    want.extend(0..10);
    want.extend(20..25);
    assert_eq!(order, want);
    assert!(got[..10].iter().all(|e| e.priority() == Priority::High));
    a.put_events(&mut got).unwrap();
    assert_eq!(drain(&*high_only, QUIET), (10..20).collect::<Vec<_>>());
    drop((a, high_only));
    s.assert_all_free();
}

/// Events larger than the pool's size get temporary buffers, transparently, freed when they
/// return to GrandCentral.
fn large_events(kind: Kind) {
    let s = Setup::new(kind, "large", 100, 1024);
    s.conn.create("a", StationConfig::default(), Position::End);
    s.conn.create("b", StationConfig::default(), Position::End);
    let a = s.conn.attach("a");
    let b = s.conn.attach("b");
    let producer = s.conn.attach(GRAND_CENTRAL);
    for round in 0..5u8 {
        let sizes = [100usize, 300_000, 1024, 1025, 2 << 20];
        for &size in &sizes {
            let mut ev = producer.new_events(1, size, Wait::Sleep).unwrap();
            assert!(ev[0].capacity() >= size);
            assert_eq!(ev[0].is_large(), size > 1024);
            let data: Vec<u8> = (0..size).map(|i| (i as u8).wrapping_mul(31).wrapping_add(round)).collect();
            ev[0].write(&data).unwrap();
            producer.put_events(&mut ev).unwrap();
        }
        assert!(s.conn.snapshot().temp_events > 0);
        // The first station rewrites the big ones in place; the second sees the change.
        let mut got = a.get_events(10, Wait::Timed(Duration::from_secs(5))).unwrap();
        assert_eq!(got.len(), sizes.len());
        for (e, &size) in got.iter_mut().zip(&sizes) {
            assert_eq!(e.len(), size);
            let d = e.data();
            assert!(d.iter().enumerate().all(|(i, &x)| x == (i as u8).wrapping_mul(31).wrapping_add(round)));
            if e.is_large() {
                e.buffer_mut()[size - 1] = 0xEE;
            }
        }
        a.put_events(&mut got).unwrap();
        let mut got = b.get_events(10, Wait::Timed(Duration::from_secs(5))).unwrap();
        assert_eq!(got.len(), sizes.len());
        for e in &got {
            assert_eq!(e.data()[e.len() - 1] == 0xEE, e.is_large());
        }
        b.put_events(&mut got).unwrap();
    }
    drop((a, b));
    s.assert_all_free();
}

/// The number of temporary buffers is bounded; a refused request gives back what it took.
fn large_events_are_limited(kind: Kind) {
    let s = Setup::with(kind, "large-limit", |c| {
        c.events = 50;
        c.event_size = 512;
        c.max_temp_events = 4;
    });
    let producer = s.conn.attach(GRAND_CENTRAL);
    let mut four = producer.new_events(4, 4096, Wait::Sleep).unwrap();
    assert_eq!(four.len(), 4);
    match producer.new_events(2, 4096, Wait::Sleep) {
        Err(e @ EtError::OverLimit { limit: Limit::TempEvents, requested: 6, max: 4 }) => {
            let m = e.to_string();
            assert!(m.contains("max_temp_events") && m.contains("--max-temp"), "{m}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(s.conn.snapshot().free_events, 46);
    producer.dump_events(&mut four).unwrap();
    s.assert_all_free();
    let mut again = producer.new_events(4, 4096, Wait::Sleep).unwrap();
    producer.put_events(&mut again).unwrap();
    s.assert_all_free();
    if kind == Kind::Remote {
        // Larger than one frame can carry: refused up front, nothing taken.
        match producer.new_events(1, 3 << 30, Wait::NoWait) {
            Err(EtError::Refused(m)) => assert!(m.contains("cannot travel remotely"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        s.assert_all_free();
    }
}

/// A `new_events` larger than `max_event_bytes` is refused with an error naming the limit and
/// its key, at once (even with every event taken and `Wait::Sleep`), and takes nothing; the
/// limit itself is allowed.
fn an_event_over_max_event_bytes_is_refused_before_anything_is_taken(kind: Kind) {
    let s = Setup::with(kind, "max-event", |c| {
        c.events = 20;
        c.event_size = 1024;
        c.max_event_bytes = 100_000;
    });
    let producer = s.conn.attach(GRAND_CENTRAL);
    let mut exact = producer.new_events(1, 100_000, Wait::Sleep).unwrap();
    assert!(exact[0].is_large() && exact[0].capacity() >= 100_000);
    // Every other event is taken: a request that took events first would wait (then time out).
    let mut rest = producer.new_events(19, 10, Wait::Sleep).unwrap();
    assert_eq!(rest.len(), 19);
    match producer.new_events(2, 1 << 30, Wait::Timed(Duration::from_secs(5))) {
        Err(e @ EtError::OverLimit { limit: Limit::EventBytes, requested, max: 100_000 }) => {
            assert_eq!(requested, 1 << 30);
            assert_eq!(Limit::EventBytes.key(), "max_event_bytes");
            let m = e.to_string();
            assert!(
                m.contains("1073741824") && m.contains("max_event_bytes") && m.contains("--max-event-bytes"),
                "{m}"
            );
        }
        other => panic!("expected a refusal naming max_event_bytes, got {other:?}"),
    }
    let snap = s.conn.snapshot();
    assert_eq!((snap.free_events, snap.temp_events), (0, 1), "{snap:#?}");
    producer.dump_events(&mut rest).unwrap();
    producer.dump_events(&mut exact).unwrap();
    s.assert_all_free();
    // Sizes up to the pool's event size always fit, whatever the limit.
    let s = Setup::with(kind, "max-event-small", |c| {
        c.events = 20;
        c.event_size = 4096;
        c.max_event_bytes = 100;
    });
    let producer = s.conn.attach(GRAND_CENTRAL);
    let mut small = producer.new_events(2, 4096, Wait::Sleep).unwrap();
    producer.put_events(&mut small).unwrap();
    assert!(matches!(
        producer.new_events(1, 4097, Wait::NoWait),
        Err(EtError::OverLimit { limit: Limit::EventBytes, max: 4096, .. })
    ));
    s.assert_all_free();
}

/// One attachment holds at most `max_temp_per_attachment` large events (made or got); others
/// still get theirs, and it gets more once it put some.
fn one_attachment_holds_a_bounded_number_of_large_events(kind: Kind) {
    let s = Setup::with(kind, "per-att", |c| {
        c.events = 30;
        c.event_size = 512;
        c.max_temp_per_attachment = 3;
    });
    s.conn.create("sink", StationConfig::default(), Position::End);
    let sink = s.conn.attach("sink");
    let a = s.conn.attach(GRAND_CENTRAL);
    let b = s.conn.attach(GRAND_CENTRAL);
    let mut held = a.new_events(2, 5000, Wait::Sleep).unwrap();
    match a.new_events(2, 5000, Wait::Sleep) {
        Err(e @ EtError::OverLimit { limit: Limit::TempEventsPerAttachment, requested: 4, max: 3 }) => {
            assert!(e.to_string().contains("max_temp_per_attachment"), "{e}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Small events are not limited, nor is another attachment.
    let mut small = a.new_events(5, 100, Wait::Sleep).unwrap();
    let mut other = b.new_events(3, 5000, Wait::Sleep).unwrap();
    assert_eq!((small.len(), other.len()), (5, 3));
    held.extend(a.new_events(1, 5000, Wait::Sleep).unwrap());
    assert_eq!(held.len(), 3);
    a.put_events(&mut held).unwrap();
    // Events got count too: the consumer holding 3 large ones makes no large one.
    let mut got = sink.get_events(10, Wait::Timed(Duration::from_secs(5))).unwrap();
    assert_eq!(got.len(), 3);
    assert!(matches!(
        sink.new_events(1, 5000, Wait::NoWait),
        Err(EtError::OverLimit { limit: Limit::TempEventsPerAttachment, .. })
    ));
    let mut again = a.new_events(3, 5000, Wait::Sleep).unwrap();
    assert_eq!(again.len(), 3);
    for (att, evs) in [(&a, &mut again), (&a, &mut small), (&b, &mut other), (&sink, &mut got)] {
        att.dump_events(evs).unwrap();
    }
    s.assert_all_free();
}

/// The temporary buffers of the whole system take at most `max_temp_bytes` (sizes rounded up to
/// 4 KiB); the snapshot shows what they take.
fn temporary_buffers_are_bounded_in_bytes(kind: Kind) {
    let s = Setup::with(kind, "temp-bytes", |c| {
        c.events = 30;
        c.event_size = 512;
        c.max_temp_bytes = 1 << 20;
    });
    let a = s.conn.attach(GRAND_CENTRAL);
    let b = s.conn.attach(GRAND_CENTRAL);
    let mut two = a.new_events(2, 400_000, Wait::Sleep).unwrap();
    let taken = 2 * 401_408; // 400 000 rounded up to 4 KiB, twice
    assert_eq!(s.conn.snapshot().temp_bytes, taken);
    match b.new_events(1, 300_000, Wait::Sleep) {
        Err(e @ EtError::OverLimit { limit: Limit::TempBytes, max: 1_048_576, requested }) => {
            assert_eq!(requested, taken + 303_104);
            assert!(e.to_string().contains("max_temp_bytes") && e.to_string().contains("--max-temp-bytes"), "{e}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let snap = s.conn.snapshot();
    assert_eq!((snap.free_events, snap.temp_events), (28, 2), "nothing taken: {snap:#?}");
    let mut fits = b.new_events(1, 200_000, Wait::Sleep).unwrap();
    b.put_events(&mut fits).unwrap();
    a.put_events(&mut two).unwrap();
    s.assert_all_free();
    assert_eq!(s.conn.snapshot().temp_bytes, 0);
}

/// One connection makes at most `max_attachments_per_connection` attachments; another
/// connection still attaches, and a detach makes room.
fn a_connection_has_a_bounded_number_of_attachments(kind: Kind) {
    let s = Setup::with(kind, "per-conn", |c| {
        c.max_attachments_per_connection = 2;
    });
    let one = s.conn.attach(GRAND_CENTRAL);
    let two = s.conn.attach(GRAND_CENTRAL);
    match s.conn.try_attach(GRAND_CENTRAL) {
        Err(e @ EtError::OverLimit { limit: Limit::AttachmentsPerConnection, requested: 3, max: 2 }) => {
            assert!(e.to_string().contains("max_attachments_per_connection"), "{e}");
        }
        Err(e) => panic!("expected a refusal, got {e:?}"),
        Ok(_) => panic!("a third attachment on one connection"),
    }
    let other = s.connect();
    let three = other.attach(GRAND_CENTRAL);
    drop(one);
    let four = s.conn.attach(GRAND_CENTRAL);
    // The ET process's own attachments are not limited.
    let own: Vec<_> = (0..4).map(|_| s.system.attach(GRAND_CENTRAL).unwrap()).collect();
    assert_eq!(s.conn.snapshot().attachments.len(), 3 + own.len());
    drop((two, three, four, own));
}

/// Several consumers on one station share its flow: each event goes to exactly one.
fn consumers_share_a_station(kind: Kind) {
    let s = Setup::new(kind, "shared", 400, 64);
    s.conn.create("shared", StationConfig::default(), Position::End);
    const N: u64 = 6000;
    let total = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let consumers: Vec<_> = (0..3)
        .map(|_| {
            let conn = s.connect();
            let total = total.clone();
            std::thread::spawn(move || {
                let att = conn.attach("shared");
                let mut mine = Vec::new();
                while total.load(std::sync::atomic::Ordering::Acquire) < N {
                    match att.get_events(50, Wait::Timed(Duration::from_millis(50))) {
                        Ok(mut events) => {
                            total.fetch_add(events.len() as u64, std::sync::atomic::Ordering::AcqRel);
                            mine.extend(events.iter().map(seq));
                            // Slow enough that the others get a share.
                            std::thread::sleep(Duration::from_micros(200));
                            att.put_events(&mut events).unwrap();
                        }
                        Err(EtError::Timeout) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                mine
            })
        })
        .collect();
    // Let every consumer attach before producing (events flow past an unattached station).
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.conn.station("shared").attachments < 3 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let producer = s.conn.attach(GRAND_CENTRAL);
    produce(&*producer, 0, N, 100, 64, plain);
    let shares: Vec<Vec<u64>> = consumers.into_iter().map(|c| c.join().unwrap()).collect();
    let mut all: Vec<u64> = shares.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..N).collect::<Vec<_>>(), "each event exactly once");
    for share in &shares {
        assert!(!share.is_empty(), "every consumer got a share: {:?}", shares.iter().map(Vec::len).collect::<Vec<_>>());
        assert!(share.windows(2).all(|w| w[0] < w[1]), "each consumer sees its events in order");
    }
    s.assert_all_free();
}

/// Events go through the stations of the chain in order; each sees the previous one's changes.
fn chain_of_stations(kind: Kind) {
    let s = Setup::new(kind, "chain", 200, 128);
    let names = ["first", "second", "third"];
    for n in names {
        s.conn.create(n, StationConfig::default(), Position::End);
    }
    s.conn.create("zeroth", StationConfig::default(), Position::First);
    s.conn.create("between", StationConfig::default(), Position::After("first".into()));
    let order: Vec<String> = s.conn.snapshot().stations.iter().map(|x| x.name.clone()).collect();
    assert_eq!(order, [GRAND_CENTRAL, "zeroth", "first", "between", "second", "third"]);
    const N: u64 = 3000;
    let workers: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(k, name)| {
            let conn = s.connect();
            let name = name.to_string();
            std::thread::spawn(move || {
                let att = conn.attach(&name);
                let mut seen = 0u64;
                while seen < N {
                    let mut events = match att.get_events(64, Wait::Timed(Duration::from_secs(10))) {
                        Ok(e) => e,
                        Err(e) => panic!("{name}: {e}"),
                    };
                    for e in &mut events {
                        assert_eq!(seq(e), seen, "{name} sees the events in order");
                        // Each station stamps byte 8 + k, having checked the previous stamps.
                        for j in 0..k {
                            assert_eq!(e.data()[8 + j], j as u8 + 1, "{name} sees station {j}'s stamp");
                        }
                        e.buffer_mut()[8 + k] = k as u8 + 1;
                        seen += 1;
                    }
                    att.put_events(&mut events).unwrap();
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while names.iter().any(|n| s.conn.station(n).attachments == 0) {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let producer = s.conn.attach(GRAND_CENTRAL);
    produce(&*producer, 0, N, 50, 128, plain);
    for w in workers {
        w.join().unwrap();
    }
    let snap = s.conn.snapshot();
    for n in names {
        let st = snap.stations.iter().find(|x| x.name == n).unwrap();
        assert_eq!((st.events_in, st.events_out), (N, N), "{n}");
    }
    s.assert_all_free();
}

/// A parallel group gives each event to one member: in turn, or to the shortest queue.
fn parallel_groups(kind: Kind) {
    let s = Setup::new(kind, "parallel", 500, 64);
    s.conn.create("p1", StationConfig::default(), Position::End);
    s.conn.create("p2", StationConfig::default(), Position::ParallelWith("p1".into()));
    s.conn.create(
        "p3",
        station(|c| c.selection = Selection::Match([Some(1), None, None, None])),
        Position::ParallelWith("p1".into()),
    );
    s.conn.create("after", StationConfig::default(), Position::End);
    let snap = s.conn.snapshot();
    let group = |n: &str| snap.stations.iter().find(|x| x.name == n).unwrap().group;
    assert!(group("p1").is_some() && group("p1") == group("p2") && group("p2") == group("p3"));
    assert_eq!(group("after"), None);
    let p: Vec<_> = ["p1", "p2", "p3"].iter().map(|n| s.conn.attach(n)).collect();
    let after = s.conn.attach("after");
    let producer = s.conn.attach(GRAND_CENTRAL);
    // Round robin among the members that select the event (p3 only takes control 1).
    produce(&*producer, 0, 90, 10, 64, plain);
    let got: Vec<Vec<u64>> = p.iter().map(|a| drain(&**a, QUIET)).collect();
    assert_eq!(got[2], Vec::<u64>::new());
    assert_eq!(got[0], (0..90).step_by(2).collect::<Vec<_>>());
    assert_eq!(got[1], (1..90).step_by(2).collect::<Vec<_>>());
    assert_eq!(drain(&*after, QUIET).len(), 90, "the group's output goes on to the next station");

    // Shortest queue: p1 holds a backlog, so new events go to the others.
    s.conn.configure("p1", station(|c| c.group_policy = GroupPolicy::ShortestQueue));
    produce(&*producer, 100, 20, 20, 64, |_| ([1, 0, 0, 0], Priority::Low));
    let queued = |n: &str| s.conn.station(n).queued;
    assert_eq!((queued("p1"), queued("p2"), queued("p3")), (7, 7, 6));
    let backlog = p[0].get_events(100, Wait::NoWait).unwrap();
    let _ = p[1].get_events(100, Wait::NoWait).unwrap();
    // p1 and p2 hold 7 each but have empty queues; p3 has 6 queued.
    produce(&*producer, 200, 12, 12, 64, |_| ([1, 0, 0, 0], Priority::Low));
    assert_eq!((queued("p1"), queued("p2"), queued("p3")), (6, 6, 6));
    drop(backlog);
    drop(p);
    drop(after);
    s.assert_all_free();
}

/// A member of a parallel group (restore `Redistribute`, keeping its events while idle: a farm
/// of recorders) that leaves holding events hands them and its queue to the group's other
/// members; while it is away its share goes to them; nothing flows past the group unrecorded.
fn a_parallel_group_member_leaving_redistributes_its_events_to_the_others(kind: Kind) {
    let s = Setup::new(kind, "farm", 300, 64);
    let member = || {
        station(|c| {
            c.restore = RestoreMode::Redistribute;
            c.keep_when_idle = true;
        })
    };
    s.conn.create("f1", member(), Position::End);
    s.conn.create("f2", member(), Position::ParallelWith("f1".into()));
    s.conn.create("f3", member(), Position::ParallelWith("f1".into()));
    s.conn.create("end", StationConfig::default(), Position::End);
    let f1 = s.conn.attach("f1");
    let f2 = s.conn.attach("f2");
    let f3 = s.conn.attach("f3");
    let end = s.conn.attach("end");
    let producer = s.conn.attach(GRAND_CENTRAL);
    produce(&*producer, 0, 30, 30, 64, plain);
    // f2 holds 5 of its 10 and leaves the other 5 in its queue.
    let held = f2.get_events(5, Wait::Timed(Duration::from_secs(5))).unwrap();
    assert_eq!(held.len(), 5);
    let held_seqs: Vec<u64> = held.iter().map(seq).collect();
    drop(held);
    drop(f2);
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.conn.station("f2").attachments > 0 || s.conn.station("f2").queued > 0 {
        assert!(Instant::now() < deadline, "f2's queue did not go to the others: {:?}", s.conn.station("f2"));
        std::thread::sleep(Duration::from_millis(10));
    }
    // While it is away, its share goes to the others.
    produce(&*producer, 30, 30, 30, 64, plain);
    let mut got = drain(&*f1, QUIET);
    got.extend(drain(&*f3, QUIET));
    for h in &held_seqs {
        assert!(got.contains(h), "event {h}, held by the member that left, went to another member");
    }
    got.sort_unstable();
    assert_eq!(got, (0..60).collect::<Vec<_>>(), "every event once, to the members still there");
    assert_eq!(drain(&*end, QUIET).len(), 60, "and on down the chain once");
    // Every member away: the events wait in the members, none flows past the group.
    drop((f1, f3));
    produce(&*producer, 60, 10, 10, 64, plain);
    assert_eq!(drain(&*end, Duration::from_millis(200)), Vec::<u64>::new(), "nothing flows past the group");
    // A member back takes them all: those kept by the others come to it within the watchdog's
    // 100 ms.
    let back = s.conn.attach("f2");
    let mut got = drain(&*back, QUIET);
    got.sort_unstable();
    assert_eq!(got, (60..70).collect::<Vec<_>>());
    assert_eq!(drain(&*end, QUIET).len(), 10);
    drop((back, end, producer));
    s.assert_all_free();
}

/// Station settings change while events flow.
fn configure_while_running(kind: Kind) {
    let s = Setup::new(kind, "configure", 500, 64);
    s.conn.create("a", station(|c| c.selection = Selection::Match([Some(1), None, None, None])), Position::End);
    let a = s.conn.attach("a");
    let producer = s.conn.attach(GRAND_CENTRAL);
    let header = |i: u64| ([(i % 2) as i32 + 1, 0, 0, 0], Priority::Low);
    produce(&*producer, 0, 40, 10, 64, header);
    assert_eq!(drain(&*a, QUIET), (0..40).step_by(2).collect::<Vec<_>>());
    s.conn.configure(
        "a",
        station(|c| {
            c.selection = Selection::Match([Some(2), None, None, None]);
            c.blocking = false;
            c.cue = 5;
        }),
    );
    let snap = s.conn.station("a");
    assert!(!snap.config.blocking && snap.config.cue == 5);
    produce(&*producer, 40, 40, 40, 64, header);
    assert_eq!(drain(&*a, QUIET), vec![41, 43, 45, 47, 49], "non-blocking now: the cue of 5 filled, the rest passed");
    s.conn.configure("a", station(|c| c.prescale = 4));
    produce(&*producer, 80, 40, 40, 64, header);
    assert_eq!(drain(&*a, QUIET), (80..120).step_by(4).collect::<Vec<_>>());
    drop(a);
    s.assert_all_free();
}

/// Dumped events go straight back to GrandCentral, skipping the stations after.
fn dump_skips_the_rest(kind: Kind) {
    let s = Setup::new(kind, "dump", 100, 64);
    s.conn.create("a", StationConfig::default(), Position::End);
    s.conn.create("b", StationConfig::default(), Position::End);
    let a = s.conn.attach("a");
    let b = s.conn.attach("b");
    let producer = s.conn.attach(GRAND_CENTRAL);
    produce(&*producer, 0, 50, 50, 64, plain);
    let mut got = a.get_events(50, Wait::NoWait).unwrap();
    assert_eq!(got.len(), 50);
    let mut keep: Vec<_> = got.drain(..10).collect();
    a.dump_events(&mut got).unwrap();
    assert!(got.is_empty());
    a.put_events(&mut keep).unwrap();
    assert_eq!(drain(&*b, QUIET), (0..10).collect::<Vec<_>>());
    // A producer can also dump events it decided not to fill.
    let mut unused = producer.new_events(20, 64, Wait::NoWait).unwrap();
    producer.dump_events(&mut unused).unwrap();
    drop((a, b));
    s.assert_all_free();
}

/// A station without attachments lets events flow past; events queued there when its last
/// attachment leaves flow on too.
fn idle_stations_let_events_pass(kind: Kind) {
    let s = Setup::new(kind, "idle", 200, 64);
    s.conn.create("idle", StationConfig::default(), Position::End);
    s.conn.create("end", StationConfig::default(), Position::End);
    let end = s.conn.attach("end");
    let producer = s.conn.attach(GRAND_CENTRAL);
    produce(&*producer, 0, 30, 10, 64, plain);
    assert_eq!(drain(&*end, QUIET), (0..30).collect::<Vec<_>>());
    let idle = s.conn.attach("idle");
    produce(&*producer, 30, 30, 10, 64, plain);
    assert_eq!(s.conn.station("idle").queued, 30);
    assert_eq!(drain(&*end, Duration::from_millis(100)), Vec::<u64>::new());
    drop(idle);
    assert_eq!(drain(&*end, QUIET), (30..60).collect::<Vec<_>>(), "the queue of a station left alone flows on");
    s.assert_all_free();
}

/// A station with `keep_when_idle` keeps what it selects while nobody is attached (a recorder
/// restarting): nothing flows past it; a consumer attaching later gets everything, in order,
/// including what its predecessor held when it left.
fn a_station_that_keeps_its_events_while_idle_gives_them_to_the_next_consumer(kind: Kind) {
    let s = Setup::new(kind, "keep", 200, 64);
    let keep = station(|c| {
        c.keep_when_idle = true;
        c.restore = RestoreMode::Input;
    });
    s.conn.create("keep", keep, Position::End);
    s.conn.create("end", StationConfig::default(), Position::End);
    let end = s.conn.attach("end");
    let producer = s.conn.attach(GRAND_CENTRAL);
    // Nobody attached yet: the events wait.
    produce(&*producer, 0, 30, 10, 64, plain);
    assert_eq!(drain(&*end, Duration::from_millis(200)), Vec::<u64>::new(), "nothing flows past");
    assert_eq!(s.conn.station("keep").queued, 30);
    // A consumer takes some and leaves holding 5; more come while it is away.
    let first = s.conn.attach("keep");
    assert_eq!(take(&*first, 10), (0..10).collect::<Vec<_>>());
    let held = first.get_events(5, Wait::Timed(Duration::from_secs(5))).unwrap();
    assert_eq!(held.len(), 5);
    drop(held);
    drop(first);
    assert_eq!(drain(&*end, QUIET), (0..10).collect::<Vec<_>>(), "what it put went on");
    produce(&*producer, 30, 10, 10, 64, plain);
    assert_eq!(drain(&*end, Duration::from_millis(200)), Vec::<u64>::new(), "nothing flows past while away");
    let next = s.conn.attach("keep");
    let mut got = drain(&*next, QUIET);
    got.sort_unstable();
    assert_eq!(got, (10..40).collect::<Vec<_>>(), "everything after what the first consumer put");
    let mut at_end = drain(&*end, QUIET);
    at_end.sort_unstable();
    assert_eq!(at_end, (10..40).collect::<Vec<_>>(), "the next consumer put them on");
    drop(next);
    s.assert_all_free();
}

/// An attachment that detaches holding events gives them back per its station's restore mode
/// (clean detach: not marked corrupt; the crash tests cover processes that die).
fn restore_modes_on_detach(kind: Kind) {
    let s = Setup::new(kind, "restore", 200, 64);
    for (name, mode) in [
        ("out", RestoreMode::Output),
        ("in", RestoreMode::Input),
        ("gc", RestoreMode::GrandCentral),
        ("redist", RestoreMode::Redistribute),
    ] {
        s.conn.create(name, station(|c| c.restore = mode), Position::End);
    }
    s.conn.create("end", StationConfig::default(), Position::End);
    let end = s.conn.attach("end");
    let producer = s.conn.attach(GRAND_CENTRAL);
    for (name, back_here, to_end) in
        [("out", false, true), ("in", true, false), ("gc", false, false), ("redist", true, false)]
    {
        let keeper = s.conn.attach(name);
        let other = s.conn.attach(name);
        produce(&*producer, 0, 10, 10, 64, plain);
        let held = keeper.get_events(10, Wait::Timed(Duration::from_secs(5))).unwrap();
        assert_eq!(held.len(), 10);
        drop(held); // handles only: the events stay held by `keeper`
        drop(keeper);
        let again = drain(&*other, QUIET);
        assert_eq!(again.len(), if back_here { 10 } else { 0 }, "{name}");
        let at_end = drain(&*end, QUIET);
        assert_eq!(at_end.len(), if to_end || back_here { 10 } else { 0 }, "{name}");
        drop(other);
        s.assert_all_free();
    }
}

/// Selection by a closure running in the ET process, and by built-in predicates.
fn closure_and_predicate_selection(kind: Kind) {
    let s = Setup::new(kind, "closure", 200, 64);
    let even_first_byte: SelectFn =
        std::sync::Arc::new(|e: &EventView<'_>| e.data.first().is_some_and(|b| b % 2 == 0) && e.control[1] == 5);
    s.system
        .create_station("closure", station(|c| c.selection = Selection::Closure(even_first_byte)), Position::End)
        .unwrap();
    s.conn.create("after", StationConfig::default(), Position::End);
    let closure = s.conn.attach("closure");
    let after = s.conn.attach("after");
    assert!(s.conn.snapshot().stations.iter().any(|x| x.name == "closure" && x.closure));
    let producer = s.conn.attach(GRAND_CENTRAL);
    produce(&*producer, 0, 100, 20, 64, |i| ([0, if i % 3 == 0 { 5 } else { 0 }, 0, 0], Priority::Low));
    let want: Vec<u64> = (0..100).filter(|i| i % 2 == 0 && i % 3 == 0).collect();
    assert_eq!(drain(&*closure, QUIET), want);
    let at_after = drain(&*after, QUIET);
    let (through, past): (Vec<u64>, Vec<u64>) = at_after.iter().partition(|&&i| want.contains(&i));
    assert_eq!(through, want, "the closure station's events follow, in order");
    assert_eq!(past, (0..100).filter(|i| !want.contains(i)).collect::<Vec<_>>(), "the others pass it, in order");
    // Only the ET process can create a closure station.
    if let Conn::Local(c) = &s.conn {
        let f: SelectFn = std::sync::Arc::new(|_: &EventView<'_>| true);
        assert!(matches!(
            c.create_station("x", station(|c| c.selection = Selection::Closure(f)), Position::End),
            Err(EtError::Refused(_))
        ));
    }
    drop((closure, after));
    s.assert_all_free();
}

/// Users of a system that stops get an error promptly, and attach again when it is back.
fn dead_system_is_noticed(kind: Kind) {
    let s = Setup::new(kind, "death", 100, 64);
    s.conn.create("a", StationConfig::default(), Position::End);
    let conn = s.connect();
    let waiter = std::thread::spawn(move || {
        let att = conn.attach("a");
        let start = Instant::now();
        let result = att.get_events(10, Wait::Sleep).map(|e| e.len());
        (result, start.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let Setup { system, conn, .. } = s;
    let config_name = system.name().to_owned();
    let addr = system.remote_addr();
    let stopped = Instant::now();
    drop(system);
    let (result, _) = waiter.join().unwrap();
    let noticed = stopped.elapsed();
    assert!(matches!(result, Err(EtError::SystemDead(_))), "{result:?}");
    assert!(noticed < Duration::from_secs(5), "noticed after {noticed:?}");
    assert!(matches!(
        match &conn {
            Conn::Local(c) => c.snapshot().map(|_| ()),
            Conn::Remote(c) => c.snapshot().map(|_| ()),
        },
        Err(EtError::SystemDead(_))
    ));
    // Back again under the same name (and, for remote clients, the same address).
    let mut config = SystemConfig::new(&config_name, 100, 64);
    config.listen = addr;
    let system = EtSystem::create(config).expect("restart");
    let conn = Setup::connect_to(kind, &system);
    conn.create("a", StationConfig::default(), Position::End);
    let consumer = conn.attach("a");
    let producer = conn.attach(GRAND_CENTRAL);
    produce(&*producer, 0, 5, 5, 64, plain);
    assert_eq!(drain(&*consumer, QUIET), (0..5).collect::<Vec<_>>());
}

/// A consumer that leaves after a full batch (the remote client has asked for the next batch
/// ahead of time) gives back what it never handed out: the next consumer gets every event after
/// the ones used, in order, none marked corrupt, and the counters count each event once.
fn a_consumer_leaving_gives_back_what_it_did_not_use(kind: Kind) {
    let s = Setup::new(kind, "unget", 300, 64);
    s.conn.create("a", StationConfig::default(), Position::End);
    let producer = s.conn.attach(GRAND_CENTRAL);
    let first = s.conn.attach("a");
    produce(&*producer, 0, 100, 50, 64, plain);
    let mut got = first.get_events(10, Wait::Timed(Duration::from_secs(5))).unwrap();
    assert_eq!(got.iter().map(seq).collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
    // Remote: the next ten were asked for ahead of time and are held; local: still queued.
    let deadline = Instant::now() + Duration::from_secs(5);
    let expected = if kind == Kind::Remote { 20 } else { 10 };
    loop {
        let held: u64 = s.conn.snapshot().attachments.iter().filter(|a| a.station == "a").map(|a| a.held).sum();
        if held == expected {
            break;
        }
        assert!(Instant::now() < deadline, "held {held}, expected {expected}");
        std::thread::sleep(Duration::from_millis(10));
    }
    first.put_events(&mut got).unwrap();
    // Attached before the first leaves: a station without attachments lets its events flow on.
    let second = s.conn.attach("a");
    drop(first);
    let mut rest = Vec::new();
    while rest.len() < 90 {
        let mut events = second.get_events(90 - rest.len(), Wait::Timed(Duration::from_secs(5))).unwrap();
        assert!(events.iter().all(|e| !e.is_possibly_corrupt()), "given back unchanged");
        rest.extend(events.iter().map(seq));
        second.put_events(&mut events).unwrap();
    }
    assert_eq!(rest, (10..100).collect::<Vec<_>>(), "in order, right after the ones used");
    let st = s.conn.station("a");
    assert_eq!((st.events_in, st.events_out), (100, 100), "each event counted once");
    drop(second);
    s.assert_all_free();
}

/// A client process's consumer keeps the events it puts back to GrandCentral and pushes them in
/// groups (docs/et.md, "Why the cache lines"): a consumer that stops calling after its puts
/// leaves nothing kept for longer than a heartbeat, so that a drain waiting for every event to be
/// free (a sink at run stop) is never held up by it, and the books balance all along.
#[test]
fn a_local_consumer_that_stops_calling_leaves_nothing_kept_after_a_heartbeat() {
    let s = Setup::new(Kind::Local, "kept-beat", 3000, 64);
    s.conn.create("c", StationConfig::default(), Position::End);
    let consumer = s.conn.attach("c");
    let producer = s.conn.attach(GRAND_CENTRAL);
    produce(&*producer, 0, 10, 1, 64, plain);
    for _ in 0..10 {
        let mut evs = consumer.get_events(1, Wait::Timed(Duration::from_secs(5))).unwrap();
        consumer.put_events(&mut evs).unwrap();
    }
    let snap = s.conn.snapshot();
    assert_eq!(snap.accounted(), 3000, "kept events are counted held: {snap:#?}");
    assert!(snap.free_events < 3000, "the ten were kept to go back in a group: {snap:#?}");
    let kept_since = Instant::now();
    s.assert_all_free();
    assert!(kept_since.elapsed() < Duration::from_millis(1500), "pushed by the heartbeat within about 100 ms");
    drop(consumer);
    drop(producer);
}
