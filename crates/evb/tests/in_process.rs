//! A whole event builder in one process (threads, real sockets): the logic end to end.

use std::time::{Duration, Instant};

use daqflow_evb::bu::{Bu, BuConfig, Output};
use daqflow_evb::component::Component;
use daqflow_evb::evm::{Evm, EvmConfig};
use daqflow_evb::model::SizeModel;
use daqflow_evb::ru::{Ru, RuConfig};
use daqflow_evb::source::{Source, SourceConfig};
use serde_json::Value;

struct Builder {
    ru_addr: String,
    evm_addr: String,
    evm: Evm,
    rus: Vec<Ru>,
    bus: Vec<Bu>,
    sources: Vec<Source>,
}

fn listen(v: Value) -> String {
    v["listen"].as_str().unwrap().to_owned()
}

fn setup(rus: u32, bus: u32, streams: u32, evm: EvmConfig, bu: BuConfig, size: SizeModel) -> Builder {
    let mut e = Evm::new("evm", EvmConfig { rus: rus as usize, ..evm });
    let evm_addr = listen(e.configure().unwrap());
    let mut r = Vec::new();
    let mut s = Vec::new();
    let mut ru_addr = String::new();
    for i in 0..rus {
        let mut ru = Ru::new(
            &format!("ru-{i}"),
            RuConfig { id: i, evm: evm_addr.clone(), streams: streams as usize, ..Default::default() },
        );
        let addr = listen(ru.configure().unwrap());
        ru_addr = addr.clone();
        for k in 0..streams {
            let id = i * 100 + k;
            let mut src = Source::new(
                &format!("src-{id}"),
                SourceConfig { source_id: id, ru: addr.clone(), size, ..Default::default() },
            );
            src.configure().unwrap();
            s.push(src);
        }
        r.push(ru);
    }
    let b = (0..bus)
        .map(|i| {
            let et: daqflow_evb::bu::EtOpener = std::sync::Arc::new(|name: &str| {
                let sink = daqflow_et::sink::EtSink::open(name).map_err(|e| e.to_string())?;
                Ok(Box::new(sink) as Box<dyn daqflow_wire::sink::EventSink>)
            });
            let mut b =
                Bu::new(&format!("bu-{i}"), BuConfig { id: i, evm: evm_addr.clone(), ..bu.clone() }).with_et(et);
            b.configure().unwrap();
            b
        })
        .collect();
    Builder { ru_addr, evm_addr, evm: e, rus: r, bus: b, sources: s }
}

impl Builder {
    /// Starts run `run`: the EVM, the RUs, the BUs, then the sources.
    fn start(&mut self, run: u32) {
        self.evm.start(run).unwrap();
        for r in &mut self.rus {
            r.start(run).unwrap();
        }
        for b in &mut self.bus {
            b.start(run).unwrap();
        }
        for s in &mut self.sources {
            s.start(run).unwrap();
        }
    }

    fn run(&mut self, run: u32, secs: f64) -> (Value, Vec<Value>, Vec<Value>) {
        self.start(run);
        std::thread::sleep(Duration::from_secs_f64(secs));
        let evm = self.evm.stop(None).unwrap();
        let last = evm["last_event"].as_u64().unwrap();
        for s in &mut self.sources {
            let v = s.stop(Some(last)).unwrap();
            assert!(v["error"].is_null(), "{v}");
        }
        let rus = self.rus.iter_mut().map(|r| r.stop(None).unwrap()).collect();
        let bus = self.bus.iter_mut().map(|b| b.stop(None).unwrap()).collect();
        (evm, rus, bus)
    }
}

#[test]
fn two_rus_two_bus_build_every_event_into_files() {
    let dir = tempfile::tempdir().unwrap();
    let bu = BuConfig { output: Output::Files, directory: dir.path().to_owned(), threads: 2, ..Default::default() };
    let mut b = setup(2, 2, 2, EvmConfig::default(), bu, SizeModel::Uniform { min: 100, max: 3000 });
    let (evm, rus, bus) = b.run(5, 1.0);
    eprintln!("{evm}\n{rus:?}\n{bus:?}");
    let last = evm["last_event"].as_u64().unwrap();
    assert!(last > 100, "{evm}");
    assert_eq!(evm["lost"], 0, "{evm}");
    assert_eq!(evm["built"].as_u64().unwrap(), last);
    let built: u64 = bus.iter().map(|b| b["events_built"].as_u64().unwrap()).sum();
    assert_eq!(built, last);
    for r in &rus {
        assert_eq!(r["leftover_events"], 0, "{r}");
        assert_eq!(r["counters"]["sequence_errors"], 0, "{r}");
    }
    // Every event is in a file, once, and checks clean.
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let reader = daqflow_wire::file::FileReader::open(&path).unwrap();
        let report = reader.verify(true).unwrap();
        assert!(report.is_clean(), "{path:?}: {report:?}");
        for item in reader.scan() {
            if let Ok(daqflow_wire::file::ScanItem::Record(r)) = item {
                let ev = daqflow_wire::Event::parse(r.payload.clone()).unwrap();
                assert!(ev.check().unwrap().is_clean());
                assert_eq!(ev.header().super_fragment_count, 2);
                ids.push(ev.header().event_id.0);
            }
        }
    }
    ids.sort_unstable();
    assert_eq!(ids, (1..=last).collect::<Vec<_>>());
}

#[test]
fn level_2_rejects_are_accounted_and_freed() {
    let evm = EvmConfig { reject_fraction: 0.3, ..Default::default() };
    let mut b = setup(1, 1, 2, evm, BuConfig::default(), SizeModel::Fixed { bytes: 512 });
    let (evm, rus, bus) = b.run(1, 0.5);
    let last = evm["last_event"].as_u64().unwrap();
    let rejected = evm["rejected"].as_u64().unwrap();
    assert!(rejected > 0);
    assert_eq!(evm["built"].as_u64().unwrap() + rejected, last, "{evm}");
    assert_eq!(bus[0]["events_built"].as_u64().unwrap() + rejected, last);
    assert_eq!(rus[0]["counters"]["rejected"].as_u64().unwrap(), rejected);
    assert_eq!(rus[0]["leftover_events"], 0);
}

#[test]
fn built_events_go_into_an_et_system() {
    use daqflow_et::{Attachment, EtClient, EtSystem, Position, StationConfig, SystemConfig, Wait};
    let name = format!("evb-test-{}", std::process::id());
    let system = EtSystem::create(SystemConfig::new(&name, 512, 16 << 10)).unwrap();
    system.create_station("all", StationConfig::default(), Position::End).unwrap();
    // A consumer that checks every event while the builder runs.
    let consumer = {
        let name = name.clone();
        std::thread::spawn(move || {
            let client = EtClient::connect(&name).unwrap();
            let station = client.attach("all").unwrap();
            let mut ids = Vec::new();
            let idle_until = |d| std::time::Instant::now() + d;
            let mut deadline = idle_until(Duration::from_secs(5));
            while std::time::Instant::now() < deadline {
                let mut got = station.get_events(64, Wait::Timed(Duration::from_millis(100))).unwrap_or_default();
                if !got.is_empty() {
                    deadline = idle_until(Duration::from_secs(2));
                }
                for e in &got {
                    let ev = daqflow_wire::Event::parse(bytes::Bytes::copy_from_slice(e.data())).unwrap();
                    assert!(ev.check().unwrap().is_clean());
                    assert_eq!(e.control()[0], 1, "trigger type in control word 0");
                    ids.push(ev.header().event_id.0);
                }
                station.put_events(&mut got).unwrap();
            }
            ids
        })
    };
    let bu = BuConfig { output: Output::Et, et: name.clone(), ..Default::default() };
    let mut b = setup(1, 1, 2, EvmConfig::default(), bu, SizeModel::Fixed { bytes: 2000 });
    let (evm, _, bus) = b.run(3, 0.5);
    let mut ids = consumer.join().unwrap();
    ids.sort_unstable();
    let last = evm["last_event"].as_u64().unwrap();
    assert_eq!(evm["lost"], 0);
    assert_eq!(bus[0]["events_built"].as_u64(), Some(last));
    assert_eq!(ids, (1..=last).collect::<Vec<_>>(), "every event reached the ET consumer once");
    drop(system);
}

#[test]
fn garbage_on_every_listening_socket_harms_no_one() {
    use std::io::Write;
    let mut b = setup(1, 1, 2, EvmConfig::default(), BuConfig::default(), SizeModel::Fixed { bytes: 300 });
    let evm_addr = b.evm.listen_addr().unwrap();
    b.evm.start(1).unwrap();
    let ru_addr: std::net::SocketAddr = b.ru_addr.parse().unwrap();
    b.rus[0].start(1).unwrap();
    b.bus[0].start(1).unwrap();
    for s in &mut b.sources {
        s.start(1).unwrap();
    }
    // A well-formed hello from a rogue client that got past the handshake (no token is set
    // here: any local process can).
    let hello_from = |addr, hello: daqflow_evb::protocol::Message| {
        let mut buf = bytes::BytesMut::new();
        daqflow_wire::frame::FrameCodec::default().encode(&hello.to_frame(), &mut buf);
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let protocol = daqflow_evb::protocol::PROTOCOL;
        daqflow_transport::auth::handshake_std(&mut s, protocol, None, Duration::from_secs(10)).unwrap();
        s.write_all(&buf).unwrap();
        s
    };
    // Rogue clients: random bytes, a valid frame header announcing a huge frame, a half hello.
    for addr in [evm_addr, ru_addr] {
        let mut rogue = Vec::new();
        for payload in [
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            (0..4096u32).map(|i| (i * 7919) as u8).collect(),
            daqflow_evb::protocol::Message::Hello {
                role: daqflow_evb::protocol::Role::Source,
                id: 99,
                run: 1,
                name: "rogue".into(),
                addr: String::new(),
            }
            .to_frame()
            .payload[..5]
                .to_vec(),
        ] {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            let _ = s.write_all(&payload);
            rogue.push(s);
        }
        if addr == evm_addr {
            // An impostor: a well-formed hello of a BU whose id is taken. Refused, and its
            // leaving must not look like the real BU leaving (no re-assignment).
            let hello = daqflow_evb::protocol::Message::Hello {
                role: daqflow_evb::protocol::Role::Bu,
                id: 0,
                run: 1,
                name: "impostor".into(),
                addr: String::new(),
            };
            // A component of another run (a stale process): refused, so its leaving is not an
            // RU lost (which would stop the run).
            let stale = daqflow_evb::protocol::Message::Hello {
                role: daqflow_evb::protocol::Role::Ru,
                id: 1,
                run: 2,
                name: "stale".into(),
                addr: "127.0.0.1:9".into(),
            };
            // An impostor of a connected RU, in this run: refused, the run goes on (it used to
            // abort the run).
            let twin = daqflow_evb::protocol::Message::Hello {
                role: daqflow_evb::protocol::Role::Ru,
                id: 0,
                run: 1,
                name: "twin".into(),
                addr: "127.0.0.1:9".into(),
            };
            rogue.push(hello_from(addr, hello));
            rogue.push(hello_from(addr, stale));
            rogue.push(hello_from(addr, twin));
        } else {
            // An impostor of the connected BU at the RU: refused, so that it never takes the
            // real BU's super-fragments (it used to replace the real BU's connection).
            let bu = daqflow_evb::protocol::Message::Hello {
                role: daqflow_evb::protocol::Role::Bu,
                id: 0,
                run: 1,
                name: "impostor".into(),
                addr: String::new(),
            };
            let mut impostor = hello_from(addr, bu);
            impostor.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            let mut got = Vec::new();
            let _ = std::io::Read::read_to_end(&mut impostor, &mut got);
            assert!(got.is_empty(), "the impostor received {} bytes of super-fragments", got.len());
            // A source of another run at the RU: refused, its stream slot stays free.
            let stale = daqflow_evb::protocol::Message::Hello {
                role: daqflow_evb::protocol::Role::Source,
                id: 77,
                run: 2,
                name: "stale".into(),
                addr: String::new(),
            };
            rogue.push(hello_from(addr, stale));
        }
        std::thread::sleep(Duration::from_millis(200));
        drop(rogue);
    }
    std::thread::sleep(Duration::from_millis(300));
    let evm = b.evm.stop(None).unwrap();
    let last = evm["last_event"].as_u64().unwrap();
    for s in &mut b.sources {
        s.stop(Some(last)).unwrap();
    }
    let ru = b.rus[0].stop(None).unwrap();
    let bu = b.bus[0].stop(None).unwrap();
    assert!(evm["error"].is_null() && ru["error"].is_null() && bu["error"].is_null(), "{evm}\n{ru}\n{bu}");
    assert_eq!(evm["lost"], 0);
    assert_eq!(evm["reassigned"], 0, "the impostor's exit did not count as the real BU's");
    assert!(last > 0);
    assert_eq!(bu["events_built"].as_u64(), Some(last));
}

#[test]
fn commands_out_of_order_are_refused_with_the_state() {
    let mut evm = Evm::new("evm", EvmConfig::default());
    let err = evm.start(1).unwrap_err().to_string();
    assert_eq!(err, "cannot start in state Initial");
    assert!(evm.stop(None).unwrap_err().to_string().contains("cannot stop in state Initial"));
    evm.configure().unwrap();
    assert!(evm.configure().unwrap_err().to_string().contains("cannot configure in state Configured"));
    let bad = Ru::new("ru", RuConfig { streams: 0, ..Default::default() }).configure().unwrap_err().to_string();
    assert!(bad.contains("streams"), "{bad}");
}

#[test]
fn a_bu_leaving_during_the_run_loses_nothing() {
    let mut b = setup(1, 2, 2, EvmConfig::default(), BuConfig::default(), SizeModel::Fixed { bytes: 400 });
    b.start(1);
    std::thread::sleep(Duration::from_millis(400));
    let left = b.bus[1].stop(None).unwrap();
    assert_eq!(left["left_during_run"], true, "{left}");
    assert!(left["events_built"].as_u64().unwrap() > 0);
    std::thread::sleep(Duration::from_millis(400));
    let evm = b.evm.stop(None).unwrap();
    let last = evm["last_event"].as_u64().unwrap();
    for s in &mut b.sources {
        s.stop(Some(last)).unwrap();
    }
    b.rus[0].stop(None).unwrap();
    let stayed = b.bus[0].stop(None).unwrap();
    assert_eq!(evm["lost"], 0, "{evm}");
    // At least once: an event the leaving BU had not confirmed is built again by the other.
    let built = left["events_built"].as_u64().unwrap() + stayed["events_built"].as_u64().unwrap();
    assert!(built >= last, "{built} built of {last}");
    assert_eq!(evm["built"].as_u64(), Some(last));
}

#[test]
fn triggers_from_a_trigger_source_process_drive_the_run() {
    use daqflow_evb::evm::TriggerMode;
    use daqflow_evb::source::SourceRole;
    let dir = tempfile::tempdir().unwrap();
    let evm = EvmConfig { trigger: TriggerMode::Source, ..Default::default() };
    let bu = BuConfig { output: Output::Files, directory: dir.path().to_owned(), ..Default::default() };
    let mut b = setup(1, 1, 2, evm, bu, SizeModel::Fixed { bytes: 256 });
    let evm_addr = b.evm.listen_addr().unwrap().to_string();
    let mut trigger = Source::new(
        "trigger",
        SourceConfig {
            source_id: 1000,
            ru: evm_addr,
            role: SourceRole::Trigger,
            trigger_type: 7,
            rate_hz: 5000.0,
            ..Default::default()
        },
    );
    trigger.configure().unwrap();
    b.evm.start(2).unwrap();
    b.rus[0].start(2).unwrap();
    b.bus[0].start(2).unwrap();
    for s in &mut b.sources {
        s.start(2).unwrap();
    }
    trigger.start(2).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    // Producers first: the trigger ends its stream, then the EVM drains.
    let t = trigger.stop(None).unwrap();
    assert!(t["error"].is_null(), "{t}");
    std::thread::sleep(Duration::from_millis(50));
    let evm = b.evm.stop(None).unwrap();
    let last = evm["last_event"].as_u64().unwrap();
    assert_eq!(last, t["last_event"].as_u64().unwrap(), "every trigger sent became an event");
    for s in &mut b.sources {
        s.stop(Some(last)).unwrap();
    }
    b.rus[0].stop(None).unwrap();
    let bu = b.bus[0].stop(None).unwrap();
    assert_eq!(evm["lost"], 0);
    assert_eq!(bu["events_built"].as_u64(), Some(last));
    assert!((1500..=4000).contains(&last), "about 5 kHz for 0.6 s: {last}");
    let path = bu["files"][0]["path"].as_str().unwrap();
    let mut reader = daqflow_wire::file::FileReader::open(path).unwrap();
    let ev = daqflow_wire::Event::parse(reader.read_record(0).unwrap().payload).unwrap();
    assert_eq!(ev.header().trigger_type, 7, "the trigger source's trigger type");
}

#[test]
fn a_paused_run_takes_no_new_events_and_resumes() {
    let mut b = setup(1, 1, 1, EvmConfig::default(), BuConfig::default(), SizeModel::Fixed { bytes: 100 });
    b.start(1);
    std::thread::sleep(Duration::from_millis(300));
    b.evm.pause().unwrap();
    assert_eq!(b.evm.state(), daqflow_evb::component::State::Paused);
    assert!(b.evm.pause().is_err(), "already paused");
    std::thread::sleep(Duration::from_millis(300)); // what was in flight finishes
    let t1 = b.evm.stats()["triggered"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t2 = b.evm.stats()["triggered"].as_u64().unwrap();
    assert_eq!(t1, t2, "no triggers while paused");
    b.evm.resume().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t3 = b.evm.stats()["triggered"].as_u64().unwrap();
    assert!(t3 > t2, "triggering resumed");
    let evm = b.evm.stop(None).unwrap();
    let last = evm["last_event"].as_u64().unwrap();
    b.sources[0].stop(Some(last)).unwrap();
    b.rus[0].stop(None).unwrap();
    b.bus[0].stop(None).unwrap();
    assert_eq!(evm["lost"], 0);
}

#[test]
fn a_builder_that_stops_making_progress_fails_the_run_and_says_why() {
    let evm = EvmConfig { stall_timeout_ms: 600, ..EvmConfig::default() };
    let mut b = setup(1, 1, 2, evm, BuConfig::default(), SizeModel::Fixed { bytes: 8 });
    b.start(1);
    let built = |b: &Builder| b.evm.stats()["built"].as_u64().unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while built(&b) < 100 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(built(&b) >= 100, "the run builds first");
    // One stream stops delivering while the EVM keeps triggering: its events wait for ever.
    b.sources[1].pause().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while b.evm.failure().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let why = b.evm.failure().expect("the EVM says the builder is stalled");
    assert!(why.contains("stalled") && why.contains("in flight") && why.contains("BU 0"), "{why}");
    assert_eq!(b.evm.state(), daqflow_evb::component::State::Error);
}

#[test]
fn a_paused_run_is_not_a_stall() {
    let evm = EvmConfig { stall_timeout_ms: 300, ..EvmConfig::default() };
    let mut b = setup(1, 1, 1, evm, BuConfig::default(), SizeModel::Fixed { bytes: 8 });
    b.start(1);
    std::thread::sleep(Duration::from_millis(200));
    b.evm.pause().unwrap();
    b.sources[0].pause().unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    assert!(b.evm.failure().is_none(), "{:?}", b.evm.failure());
    b.sources[0].resume().unwrap();
    b.evm.resume().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let evm = b.evm.stop(None).unwrap();
    let last = evm["last_event"].as_u64().unwrap();
    b.sources[0].stop(Some(last)).unwrap();
    b.rus[0].stop(None).unwrap();
    b.bus[0].stop(None).unwrap();
    assert!(evm["error"].is_null(), "{evm}");
    assert_eq!(evm["lost"], 0);
}

#[test]
fn a_bu_that_left_is_replaced_by_a_successor_with_its_id() {
    let mut b = setup(1, 2, 2, EvmConfig::default(), BuConfig::default(), SizeModel::Fixed { bytes: 400 });
    b.start(1);
    std::thread::sleep(Duration::from_millis(300));
    let first = b.bus[0].stop(None).unwrap();
    assert_eq!(first["left_during_run"], true, "{first}");
    // Its successor, same id, joins the running run at once.
    let evm_addr = b.evm_addr.clone();
    let mut successor = Bu::new("bu-0", BuConfig { id: 0, evm: evm_addr, ..BuConfig::default() });
    successor.configure().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // Refused while the EVM still holds the first one: tried again, as the operator does.
        match successor.start(1) {
            Ok(()) => break,
            Err(e) => assert!(Instant::now() < deadline, "{e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let built = |s: &Bu| s.stats()["events_built"].as_u64().unwrap_or(0);
    while built(&successor) < 100 && Instant::now() < deadline && successor.failure().is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(successor.failure().is_none(), "{:?}", successor.failure());
    assert!(
        built(&successor) >= 100,
        "the successor builds: {} / EVM {} / RU {}",
        successor.stats(),
        b.evm.stats(),
        b.rus[0].stats()
    );
    let evm = b.evm.stop(None).unwrap();
    let last = evm["last_event"].as_u64().unwrap();
    for s in &mut b.sources {
        s.stop(Some(last)).unwrap();
    }
    b.rus[0].stop(None).unwrap();
    successor.stop(None).unwrap();
    b.bus[1].stop(None).unwrap();
    assert_eq!(evm["lost"], 0, "{evm}");
}
