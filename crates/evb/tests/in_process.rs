//! A whole event builder in one process (threads, real sockets): the logic end to end.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daqflow_component::{Answer, Command, Component, Driver, Info, Registry, State, Stats, TriggerCounts};
use daqflow_evb::bu::{Bu, BuConfig, BuDetail, EtOpener, Output};
use daqflow_evb::evm::{Evm, EvmConfig, EvmDetail};
use daqflow_evb::model::SizeModel;
use daqflow_evb::ru::{Ru, RuConfig, RuDetail};
use daqflow_evb::source::{Payload, Source, SourceConfig, SourceDetail};
use daqflow_wire::EventId;
use daqflow_wire::sink::{EventSink, SinkError};
use serde_json::{Value, json};

struct Builder {
    ru_addr: String,
    evm_addr: String,
    evm: Evm,
    rus: Vec<Ru>,
    bus: Vec<Bu>,
    sources: Vec<Source>,
}

fn listen(v: Info) -> String {
    v["listen"].as_str().unwrap().to_owned()
}

/// The EVM's accounting in its stats.
fn trigger(evm: &Stats) -> TriggerCounts {
    evm.trigger.clone().unwrap_or_else(|| panic!("no trigger counts: {evm:?}"))
}

/// The EVM's figures.
fn evm_detail(evm: &Stats) -> EvmDetail {
    evm.detail_as().unwrap_or_else(|| panic!("no EVM detail: {evm:?}"))
}

/// The last event of a run, from the EVM's summary.
fn last_event(evm: &Stats) -> u64 {
    evm_detail(evm).last_event.unwrap_or_else(|| panic!("no last event: {evm:?}"))
}

fn ru_detail(ru: &Stats) -> RuDetail {
    ru.detail_as().unwrap_or_else(|| panic!("no RU detail: {ru:?}"))
}

fn bu_detail(bu: &Stats) -> BuDetail {
    bu.detail_as().unwrap_or_else(|| panic!("no BU detail: {bu:?}"))
}

fn source_detail(source: &Stats) -> SourceDetail {
    source.detail_as().unwrap_or_else(|| panic!("no source detail: {source:?}"))
}

fn setup(rus: u32, bus: u32, streams: u32, evm: EvmConfig, bu: BuConfig, size: SizeModel) -> Builder {
    setup_with(rus, bus, streams, evm, bu, size, None)
}

/// A builder whose BUs open their ET output with `et`.
fn setup_with(
    rus: u32,
    bus: u32,
    streams: u32,
    evm: EvmConfig,
    bu: BuConfig,
    size: SizeModel,
    et: Option<EtOpener>,
) -> Builder {
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
            let mut b = Bu::new(&format!("bu-{i}"), BuConfig { id: i, evm: evm_addr.clone(), ..bu.clone() });
            if let Some(et) = &et {
                b = b.with_et(et.clone());
            }
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

    fn run(&mut self, run: u32, secs: f64) -> (Stats, Vec<Stats>, Vec<Stats>) {
        self.start(run);
        std::thread::sleep(Duration::from_secs_f64(secs));
        let evm = self.evm.stop(None).unwrap();
        let last = last_event(&evm);
        for s in &mut self.sources {
            let v = s.stop(Some(last)).unwrap();
            assert!(source_detail(&v).error.is_none(), "{v:?}");
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
    eprintln!("{evm:?}\n{rus:?}\n{bus:?}");
    let last = last_event(&evm);
    assert!(last > 100, "{evm:?}");
    assert_eq!(trigger(&evm).lost, 0, "{evm:?}");
    assert_eq!(trigger(&evm).built, last);
    assert_eq!(evm.events, last, "the EVM's events are the events triggered");
    let built: u64 = bus.iter().map(|b| b.events).sum();
    assert_eq!(built, last);
    for r in &rus {
        assert_eq!(ru_detail(r).leftover_events, Some(0), "{r:?}");
        assert_eq!(ru_detail(r).counters.sequence_errors, 0, "{r:?}");
        assert_eq!(r.events, last, "one super-fragment per event");
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
fn cached_payload_sources_of_every_size_build_clean_events_into_files() {
    // A cached payload is copied into the send chunk below 512 bytes and written from its own
    // buffer above: sizes on both sides of that, and the event layout and every CRC must hold.
    let dir = tempfile::tempdir().unwrap();
    let bu = BuConfig { output: Output::Files, directory: dir.path().to_owned(), ..Default::default() };
    let size = SizeModel::Uniform { min: 8, max: 3000 };
    let mut b = setup(1, 1, 3, EvmConfig::default(), bu, size);
    b.sources = (0..3)
        .map(|k| {
            let config = SourceConfig {
                source_id: k,
                ru: b.ru_addr.clone(),
                size,
                payload: Payload::Cached,
                ..Default::default()
            };
            let mut src = Source::new(&format!("src-{k}"), config);
            src.configure().unwrap();
            src
        })
        .collect();
    let (evm, _, bus) = b.run(3, 0.5);
    let last = last_event(&evm);
    assert!(last > 100, "{evm:?}");
    assert_eq!(trigger(&evm).lost, 0, "{evm:?}");
    assert_eq!(bus[0].events, last);
    let (mut events, mut small, mut large) = (0, 0, 0);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let reader = daqflow_wire::file::FileReader::open(entry.unwrap().path()).unwrap();
        for item in reader.scan() {
            if let Ok(daqflow_wire::file::ScanItem::Record(r)) = item {
                let ev = daqflow_wire::Event::parse(r.payload.clone()).unwrap();
                let check = ev.check().unwrap();
                assert!(check.is_clean(), "event {}: {check:?}", ev.header().event_id.0);
                assert_eq!(check.fragments, 3);
                for sf in ev.super_fragments() {
                    for f in sf.unwrap().fragments() {
                        if f.unwrap().header().payload_len < 512 {
                            small += 1;
                        } else {
                            large += 1;
                        }
                    }
                }
                events += 1;
            }
        }
    }
    assert_eq!(events, last);
    assert!(small > 0 && large > 0, "{small} fragments under 512 bytes, {large} above");
}

#[test]
fn bound_to_every_interface_each_unit_tells_an_address_its_peers_reach() {
    // A component process sets the route target to its control server; here loopback.
    daqflow_transport::advertise::set_route_target("127.0.0.1".parse().unwrap());
    let mut evm = Evm::new("evm", EvmConfig { rus: 1, listen: "0.0.0.0:0".into(), ..Default::default() });
    let evm_addr = listen(evm.configure().unwrap());
    assert!(evm_addr.starts_with("127.0.0.1:"), "the EVM answers {evm_addr}");
    let ru_config = |advertise: Option<&str>| RuConfig {
        id: 0,
        evm: evm_addr.clone(),
        listen: "0.0.0.0:0".into(),
        advertise: advertise.map(str::to_owned),
        ..Default::default()
    };
    // A name given in `advertise` is told as it is, with the bound port.
    let mut named = Ru::new("ru-0", ru_config(Some("ru-host.example.org")));
    let told = listen(named.configure().unwrap());
    let port = named.listen_addr().unwrap().port();
    assert_eq!(told, format!("ru-host.example.org:{port}"));
    drop(named);
    // Bad values are refused at configure, naming the key.
    let e = Ru::new("ru-0", ru_config(Some("0.0.0.0"))).configure().unwrap_err().to_string();
    assert!(e.contains("advertise") && e.contains("wildcard"), "{e}");

    // The RU's address goes to the BU through the EVM: the run builds every event.
    let mut ru = Ru::new("ru-0", ru_config(None));
    let ru_addr = listen(ru.configure().unwrap());
    assert!(ru_addr.starts_with("127.0.0.1:"), "the RU answers {ru_addr}");
    let mut src = Source::new("src-0", SourceConfig { source_id: 0, ru: ru_addr, ..Default::default() });
    src.configure().unwrap();
    let mut bu = Bu::new("bu-0", BuConfig { id: 0, evm: evm_addr.clone(), ..Default::default() });
    bu.configure().unwrap();
    let mut b = Builder { ru_addr: String::new(), evm_addr, evm, rus: vec![ru], bus: vec![bu], sources: vec![src] };
    let (evm, _, bus) = b.run(1, 0.5);
    let last = last_event(&evm);
    assert!(last > 10, "{evm:?}");
    assert_eq!(trigger(&evm).lost, 0, "{evm:?}");
    assert_eq!(bus[0].events, last);
}

#[test]
fn level_2_rejects_are_accounted_and_freed() {
    let evm = EvmConfig { reject_fraction: 0.3, ..Default::default() };
    let mut b = setup(1, 1, 2, evm, BuConfig::default(), SizeModel::Fixed { bytes: 512 });
    let (evm, rus, bus) = b.run(1, 0.5);
    let last = last_event(&evm);
    let rejected = trigger(&evm).rejected;
    assert!(rejected > 0);
    assert_eq!(trigger(&evm).built + rejected, last, "{evm:?}");
    assert_eq!(bus[0].events + rejected, last);
    assert_eq!(ru_detail(&rus[0]).counters.rejected, rejected);
    assert_eq!(ru_detail(&rus[0]).leftover_events, Some(0));
}

/// What the BU put into its ET output, a stand-in for the ET system (`daqflow-et` has the real
/// one; the event builder only knows the sink it is given): (ET system name, event bytes,
/// control words) per event.
type Put = Arc<Mutex<Vec<(String, Vec<u8>, [i32; 4])>>>;

struct StandInSink {
    system: String,
    put: Put,
}

impl EventSink for StandInSink {
    fn put(
        &mut self,
        _: EventId,
        parts: &[bytes::Bytes],
        len: usize,
        control: [i32; 4],
        _: &AtomicBool,
    ) -> Result<(), SinkError> {
        let data: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(data.len(), len);
        self.put.lock().unwrap().push((self.system.clone(), data, control));
        Ok(())
    }
}

#[test]
fn built_events_go_into_the_et_output_the_bu_is_given() {
    let put = Put::default();
    let opener: EtOpener = {
        let put = put.clone();
        Arc::new(move |system: &str| {
            Ok(Box::new(StandInSink { system: system.to_owned(), put: put.clone() }) as Box<dyn EventSink>)
        })
    };
    let bu = BuConfig { output: Output::Et, et: "evb-test".into(), threads: 2, ..Default::default() };
    let mut b = setup_with(1, 1, 2, EvmConfig::default(), bu, SizeModel::Fixed { bytes: 2000 }, Some(opener));
    let (evm, _, bus) = b.run(3, 0.5);
    let last = last_event(&evm);
    assert_eq!(trigger(&evm).lost, 0);
    assert_eq!(bus[0].events, last);
    let mut ids = Vec::new();
    for (system, data, control) in put.lock().unwrap().iter() {
        assert_eq!(system, "evb-test", "the ET system the configuration names");
        let ev = daqflow_wire::Event::parse(bytes::Bytes::copy_from_slice(data)).unwrap();
        assert!(ev.check().unwrap().is_clean());
        assert_eq!(control[0], 1, "trigger type in control word 0");
        assert_eq!(control[1], 0, "no event flags in control word 1");
        ids.push(ev.header().event_id.0);
    }
    ids.sort_unstable();
    assert_eq!(ids, (1..=last).collect::<Vec<_>>(), "every event reached the ET output once");
}

#[test]
fn a_bu_with_output_et_needs_the_way_to_open_an_et_system() {
    let config = BuConfig { output: Output::Et, et: "evb-test".into(), ..Default::default() };
    let e = Bu::new("bu-0", config).configure().unwrap_err().to_string();
    assert!(e.contains("this program cannot open an ET system"), "{e}");
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
                generation: 0,
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
                generation: 0,
            };
            // A component of another run (a stale process): refused, so its leaving is not an
            // RU lost (which would stop the run).
            let stale = daqflow_evb::protocol::Message::Hello {
                role: daqflow_evb::protocol::Role::Ru,
                id: 1,
                run: 2,
                name: "stale".into(),
                addr: "127.0.0.1:9".into(),
                generation: 0,
            };
            // An impostor of a connected RU, in this run: refused, the run goes on (it used to
            // abort the run).
            let twin = daqflow_evb::protocol::Message::Hello {
                role: daqflow_evb::protocol::Role::Ru,
                id: 0,
                run: 1,
                name: "twin".into(),
                addr: "127.0.0.1:9".into(),
                generation: 0,
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
                generation: 0,
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
                generation: 0,
            };
            rogue.push(hello_from(addr, stale));
        }
        std::thread::sleep(Duration::from_millis(200));
        drop(rogue);
    }
    std::thread::sleep(Duration::from_millis(300));
    let evm = b.evm.stop(None).unwrap();
    let last = last_event(&evm);
    for s in &mut b.sources {
        s.stop(Some(last)).unwrap();
    }
    let ru = b.rus[0].stop(None).unwrap();
    let bu = b.bus[0].stop(None).unwrap();
    assert!(
        trigger(&evm).error.is_none() && ru_detail(&ru).error.is_none() && bu_detail(&bu).error.is_none(),
        "{evm:?}\n{ru:?}\n{bu:?}"
    );
    assert_eq!(trigger(&evm).lost, 0);
    assert_eq!(evm_detail(&evm).reassigned, 0, "the impostor's exit did not count as the real BU's");
    assert!(last > 0);
    assert_eq!(bu.events, last);
}

/// The event builder's kinds, as the `daqflow` binary registers them (no ET system here).
fn registry() -> Registry {
    let mut r = Registry::new();
    r.add(daqflow_evb::evm::kind())
        .add(daqflow_evb::ru::kind())
        .add(daqflow_evb::bu::kind(None))
        .add(daqflow_evb::source::kind());
    r
}

/// A driver of a component of `kind` named `name`, in state Initial.
fn driver(kind: &str, name: &str) -> Driver {
    Driver::new(registry(), kind, name, Default::default())
}

/// `configure` with `config` (a JSON object of keys), as the component protocol carries it.
fn configure(d: &mut Driver, config: Value) -> Result<Info, String> {
    let command: Command = serde_json::from_value(json!({ "command": "configure", "config": config })).unwrap();
    match d.execute(command) {
        Ok(Answer::Info(info)) => Ok(info),
        Ok(other) => panic!("configure answered {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn commands_out_of_order_are_refused_with_the_state() {
    let mut evm = driver("evm", "evm");
    let err = evm.start(1).unwrap_err().to_string();
    assert_eq!(err, "cannot start in state Initial");
    assert!(evm.stop(None).unwrap_err().to_string().contains("cannot stop in state Initial"));
    evm.configure(None).unwrap();
    assert_eq!(evm.state(), State::Configured);
    assert!(evm.configure(None).unwrap_err().to_string().contains("cannot configure in state Configured"));
    let bad = configure(&mut driver("ru", "ru"), json!({ "streams": 0 })).unwrap_err();
    assert!(bad.contains("streams"), "{bad}");
    assert_eq!(bad, "configuration: ru: `streams` = 0 is out of range: 1 … 4096");
}

#[test]
fn a_component_called_out_of_order_without_a_driver_refuses_and_never_panics() {
    let mut evm = Evm::new("evm", EvmConfig::default());
    // Named from the component table, as the driver would (it refuses these before any hook).
    assert_eq!(evm.start(1).unwrap_err().to_string(), "cannot start now (not configured): only in state Configured");
    assert!(evm.stop(None).unwrap_err().to_string().contains("no run is taken"));
    assert!(evm.pause().is_err());
    let mut ru = Ru::new("ru", RuConfig::default());
    assert!(ru.start(1).unwrap_err().to_string().contains("not configured"));
    assert!(ru.stop(None).unwrap_err().to_string().contains("no run is taken"));
    let mut bu = Bu::new("bu", BuConfig::default());
    assert!(bu.start(1).unwrap_err().to_string().contains("not configured"));
    assert!(bu.stop(None).unwrap_err().to_string().contains("no run is taken"));
    let mut source = Source::new("src", SourceConfig::default());
    assert!(source.start(1).unwrap_err().to_string().contains("not configured"));
    assert!(source.stop(None).unwrap_err().to_string().contains("no run is taken"));
    assert!(source.resume().is_err());
    // Reset is always allowed.
    for c in [&mut evm as &mut dyn Component, &mut ru, &mut bu, &mut source] {
        c.reset().unwrap();
        assert_eq!((c.stats().events, c.stats().bytes), (0, 0), "nothing counted before a run");
    }
}

#[test]
fn every_component_is_ready_for_the_next_run_after_stop() {
    // EVM, RU, BU and two sources, each run by the contract's Driver from its configuration.
    let mut evm = driver("evm", "evm");
    let evm_addr = listen(configure(&mut evm, json!({ "rus": 1 })).unwrap());
    let mut ru = driver("ru", "ru-0");
    let ru_addr = listen(configure(&mut ru, json!({ "id": 0, "evm": evm_addr, "streams": 2 })).unwrap());
    let mut bu = driver("bu", "bu-0");
    configure(&mut bu, json!({ "id": 0, "evm": evm_addr })).unwrap();
    let mut sources: Vec<Driver> = (0..2)
        .map(|s| {
            let mut d = driver("source", &format!("src-{s}"));
            let size = json!({ "kind": "fixed", "bytes": 256 });
            configure(&mut d, json!({ "source_id": s, "ru": ru_addr, "size": size })).unwrap();
            d
        })
        .collect();
    let mut last_of_run = Vec::new();
    for run in [1, 2] {
        evm.start(run).unwrap();
        ru.start(run).unwrap();
        bu.start(run).unwrap();
        for s in &mut sources {
            s.start(run).unwrap();
        }
        std::thread::sleep(Duration::from_millis(300));
        // During the run the Driver stamps the run the counters count.
        assert_eq!(bu.stats().run, Some(run));
        if run == 2 {
            // Pausing: the Driver refuses a second pause and reports the state.
            evm.pause().unwrap();
            assert_eq!(evm.state(), State::Paused);
            assert_eq!(evm.pause().unwrap_err().to_string(), "cannot pause in state Paused");
            evm.resume().unwrap();
            std::thread::sleep(Duration::from_millis(100));
        }
        let e = evm.stop(None).unwrap();
        let last = last_event(&e);
        for s in &mut sources {
            // Free-running sources are ahead of the EVM: they sent at least the run's events.
            let summary = s.stop(Some(last)).unwrap();
            assert!(summary.events >= last && source_detail(&summary).run == run, "{summary:?}");
            assert_eq!(source_detail(&summary).last_event, summary.events);
        }
        let r = ru.stop(None).unwrap();
        let b = bu.stop(None).unwrap();
        for (name, d) in [("evm", &evm), ("ru", &ru), ("bu", &bu)] {
            assert_eq!(d.state(), State::Configured, "{name} after stop");
        }
        assert!(sources.iter().all(|s| s.state() == State::Configured));
        // Every count is the run's own: fresh counters, event ids from 1 again.
        let t = trigger(&e);
        assert!(last > 0, "run {run}: {e:?}");
        assert_eq!((t.triggered, t.built, t.lost, e.events), (last, last, 0, last), "run {run}: {e:?}");
        assert_eq!(evm_detail(&e).run, run);
        assert_eq!((r.events, ru_detail(&r).run), (last, run), "{r:?}");
        assert!(ru_detail(&r).counters.fragments >= 2 * last, "{r:?}");
        assert_eq!(ru_detail(&r).leftover_events, Some(0));
        assert_eq!((b.events, bu_detail(&b).run), (last, run), "{b:?}");
        assert!(b.bytes > last * 2 * 256 && b.events_per_s > 0.0 && b.mb_per_s > 0.0, "{b:?}");
        // After the stop nothing moves: the live counters are the run's last, their rates 0
        // (not the run's last second, for ever).
        for (name, d, summary) in [("evm", &evm, &e), ("ru", &ru, &r), ("bu", &bu, &b)] {
            let live = d.stats();
            assert_eq!((live.events, live.bytes), (summary.events, summary.bytes), "{name}: {live:?}");
            assert_eq!((live.events_per_s, live.mb_per_s, live.run), (0.0, 0.0, Some(run)), "{name}: {live:?}");
            assert!(live.at_ms.is_some(), "{name}: the Driver stamps when it read them");
        }
        assert_eq!(evm.stats().trigger, e.trigger, "the trigger's final accounting");
        assert_eq!(ru_detail(&ru.stats()).fragments_per_s, 0.0);
        last_of_run.push(last);
    }
    eprintln!("events of runs 1 and 2: {last_of_run:?}");
    // The live counters of the last run too.
    assert_eq!(bu.stats().detail_as::<BuDetail>().map(|d| d.run), Some(2));
    for mut d in [evm, ru, bu].into_iter().chain(sources) {
        d.reset().unwrap();
        assert_eq!(d.state(), State::Initial);
        assert_eq!(d.stats().run, None, "reset: the counters count no run");
    }
}

#[test]
fn a_bu_leaving_during_the_run_loses_nothing() {
    let mut b = setup(1, 2, 2, EvmConfig::default(), BuConfig::default(), SizeModel::Fixed { bytes: 400 });
    b.start(1);
    std::thread::sleep(Duration::from_millis(400));
    let left = b.bus[1].stop(None).unwrap();
    assert!(bu_detail(&left).left_during_run, "{left:?}");
    assert!(left.events > 0);
    std::thread::sleep(Duration::from_millis(400));
    let evm = b.evm.stop(None).unwrap();
    let last = last_event(&evm);
    for s in &mut b.sources {
        s.stop(Some(last)).unwrap();
    }
    b.rus[0].stop(None).unwrap();
    let stayed = b.bus[0].stop(None).unwrap();
    assert_eq!(trigger(&evm).lost, 0, "{evm:?}");
    // At least once: an event the leaving BU had not confirmed is built again by the other.
    let built = left.events + stayed.events;
    assert!(built >= last, "{built} built of {last}");
    assert_eq!(trigger(&evm).built, last);
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
    let mut trigger_source = Source::new(
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
    trigger_source.configure().unwrap();
    b.evm.start(2).unwrap();
    b.rus[0].start(2).unwrap();
    b.bus[0].start(2).unwrap();
    for s in &mut b.sources {
        s.start(2).unwrap();
    }
    trigger_source.start(2).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    // Producers first: the trigger ends its stream, then the EVM drains.
    let t = trigger_source.stop(None).unwrap();
    assert!(source_detail(&t).error.is_none(), "{t:?}");
    std::thread::sleep(Duration::from_millis(50));
    let evm = b.evm.stop(None).unwrap();
    let last = last_event(&evm);
    assert_eq!(last, source_detail(&t).last_event, "every trigger sent became an event");
    assert_eq!(t.events, last);
    for s in &mut b.sources {
        s.stop(Some(last)).unwrap();
    }
    b.rus[0].stop(None).unwrap();
    let bu = b.bus[0].stop(None).unwrap();
    assert_eq!(trigger(&evm).lost, 0);
    assert_eq!(bu.events, last);
    assert!((1500..=4000).contains(&last), "about 5 kHz for 0.6 s: {last}");
    let files = bu_detail(&bu).files;
    let path = &files[0].path;
    let mut reader = daqflow_wire::file::FileReader::open(path).unwrap();
    let ev = daqflow_wire::Event::parse(reader.read_record(0).unwrap().payload).unwrap();
    assert_eq!(ev.header().trigger_type, 7, "the trigger source's trigger type");
}

#[test]
fn a_paused_run_takes_no_new_events_and_resumes() {
    let mut b = setup(1, 1, 1, EvmConfig::default(), BuConfig::default(), SizeModel::Fixed { bytes: 100 });
    b.start(1);
    std::thread::sleep(Duration::from_millis(300));
    // (Pausing twice is refused by the contract's Driver: see
    // `every_component_is_ready_for_the_next_run_after_stop`.)
    b.evm.pause().unwrap();
    std::thread::sleep(Duration::from_millis(300)); // what was in flight finishes
    let t1 = trigger(&b.evm.stats()).triggered;
    std::thread::sleep(Duration::from_millis(300));
    let t2 = trigger(&b.evm.stats()).triggered;
    assert_eq!(t1, t2, "no triggers while paused");
    assert_eq!(b.evm.stats().events, t2, "the EVM's events are the events triggered");
    b.evm.resume().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t3 = trigger(&b.evm.stats()).triggered;
    assert!(t3 > t2, "triggering resumed");
    let evm = b.evm.stop(None).unwrap();
    let last = last_event(&evm);
    b.sources[0].stop(Some(last)).unwrap();
    b.rus[0].stop(None).unwrap();
    b.bus[0].stop(None).unwrap();
    assert_eq!(trigger(&evm).lost, 0);
}

#[test]
fn a_builder_that_stops_making_progress_fails_the_run_and_says_why() {
    let evm = EvmConfig { stall_timeout_ms: 600, ..EvmConfig::default() };
    let mut b = setup(1, 1, 2, evm, BuConfig::default(), SizeModel::Fixed { bytes: 8 });
    b.start(1);
    let built = |b: &Builder| b.evm.stats().trigger.map_or(0, |t| t.built);
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
    // (With a failure, the contract's Driver reports the component in Error.) The live
    // accounting names the error too.
    let deadline = Instant::now() + Duration::from_secs(20);
    while trigger(&b.evm.stats()).error.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(trigger(&b.evm.stats()).error.as_deref(), Some(why.as_str()));
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
    let last = last_event(&evm);
    b.sources[0].stop(Some(last)).unwrap();
    b.rus[0].stop(None).unwrap();
    b.bus[0].stop(None).unwrap();
    assert!(trigger(&evm).error.is_none(), "{evm:?}");
    assert_eq!(trigger(&evm).lost, 0);
}

#[test]
fn a_bu_that_left_is_replaced_by_a_successor_with_its_id() {
    let mut b = setup(1, 2, 2, EvmConfig::default(), BuConfig::default(), SizeModel::Fixed { bytes: 400 });
    b.start(1);
    std::thread::sleep(Duration::from_millis(300));
    let first = b.bus[0].stop(None).unwrap();
    assert!(bu_detail(&first).left_during_run, "{first:?}");
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
    let built = |s: &Bu| s.stats().events;
    while built(&successor) < 100 && Instant::now() < deadline && successor.failure().is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(successor.failure().is_none(), "{:?}", successor.failure());
    assert!(
        built(&successor) >= 100,
        "the successor builds: {:?} / EVM {:?} / RU {:?}",
        successor.stats(),
        b.evm.stats(),
        b.rus[0].stats()
    );
    let evm = b.evm.stop(None).unwrap();
    let last = last_event(&evm);
    for s in &mut b.sources {
        s.stop(Some(last)).unwrap();
    }
    b.rus[0].stop(None).unwrap();
    successor.stop(None).unwrap();
    b.bus[1].stop(None).unwrap();
    assert_eq!(trigger(&evm).lost, 0, "{evm:?}");
}

/// A TCP relay between an RU and the EVM whose EVM → RU direction can be held: while `held`
/// is set, what the EVM sends the RU waits in the relay, in order (an RU that falls behind on
/// its EVM link, as a busy host's can).
struct Relay {
    addr: String,
    held: Arc<AtomicBool>,
}

impl Relay {
    fn to(evm: &str) -> Relay {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let held = Arc::new(AtomicBool::new(false));
        let (evm, h) = (evm.to_owned(), held.clone());
        std::thread::spawn(move || {
            for ru in listener.incoming() {
                let Ok(ru) = ru else { return };
                let Ok(evm) = std::net::TcpStream::connect(&evm) else { return };
                Relay::pump(ru.try_clone().unwrap(), evm.try_clone().unwrap(), None);
                Relay::pump(evm, ru, Some(h.clone()));
            }
        });
        Relay { addr, held }
    }

    /// Copies `from` to `to`; what was read waits while `held` is set (so that nothing read
    /// after it was set goes through).
    fn pump(mut from: std::net::TcpStream, mut to: std::net::TcpStream, held: Option<Arc<AtomicBool>>) {
        use std::io::{Read, Write};
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = to.shutdown(std::net::Shutdown::Write);
                        return;
                    }
                    Ok(n) => n,
                };
                while held.as_ref().is_some_and(|h| h.load(std::sync::atomic::Ordering::SeqCst)) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        });
    }

    fn hold(&self, held: bool) {
        self.held.store(held, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Waits (at most 20 s) until `done`; whether it happened.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// The race of the simulation's `a_restarted_bu_that_reaches_an_ru_before_its_predecessors_bu_gone_builds_on`,
/// with real sockets: the EVM's BU gone for a dead BU reaches the RU only after the BU's
/// successor (same id, generation 1) has connected to the RU. The RU holds the successor until
/// the BU gone comes, so the successor gets nothing of what was queued for its predecessor and
/// is not dropped by the late BU gone: it builds on, and nothing is lost. (Before generations,
/// the RU took the successor at once, sent it the predecessor's events, and then dropped it on
/// the BU gone: the successor failed, and with it the run.)
#[test]
fn a_restarted_bu_that_reaches_an_ru_before_its_predecessors_bu_gone_is_held_then_builds_on() {
    let mut evm = Evm::new("evm", EvmConfig { rus: 1, ..Default::default() });
    let evm_addr = listen(evm.configure().unwrap());
    let relay = Relay::to(&evm_addr);
    let mut ru = Ru::new("ru-0", RuConfig { id: 0, evm: relay.addr.clone(), streams: 2, ..Default::default() });
    let ru_addr = listen(ru.configure().unwrap());
    let mut sources: Vec<Source> = (0..2)
        .map(|k| {
            let size = SizeModel::Fixed { bytes: 200 };
            let mut s = Source::new(
                &format!("src-{k}"),
                SourceConfig { source_id: k, ru: ru_addr.clone(), size, ..Default::default() },
            );
            s.configure().unwrap();
            s
        })
        .collect();
    let bu_config = BuConfig { id: 0, evm: evm_addr.clone(), ..Default::default() };
    let mut first = Bu::new("bu-0", bu_config.clone());
    first.configure().unwrap();
    evm.start(1).unwrap();
    ru.start(1).unwrap();
    first.start(1).unwrap();
    for s in &mut sources {
        s.start(1).unwrap();
    }
    assert!(eventually(|| first.stats().events >= 100), "the run builds first: {:?}", evm.stats());
    // Stream 1 stops delivering: the events assigned to the first BU wait at the RU, queued.
    sources[1].pause().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // The RU falls behind on its EVM link; the first BU dies (its process: no goodbye).
    relay.hold(true);
    first.reset().unwrap();
    let mut successor = Bu::new("bu-0", bu_config);
    successor.configure().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = successor.start(1) {
        // Refused while the EVM still holds the first one: tried again, as the operator does.
        assert!(Instant::now() < deadline, "{e}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The successor is connected to the RU (from its side) and the RU holds it: it has not had
    // the BU gone for generation 0. Stream 1 delivers again, so the first BU's queued events
    // are ready to go: they must not go to the successor.
    let connected = |bu: &Bu| bu.stats().detail_as::<BuDetail>().is_some_and(|d| d.rus_connected == 1);
    assert!(eventually(|| connected(&successor)), "{:?}", successor.stats());
    sources[1].resume().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let held = ru_detail(&ru.stats());
    assert_eq!(held.bus_held, 1, "the RU holds the successor: {held:?}");
    assert_eq!(successor.stats().events, 0, "{:?}", successor.stats());
    assert!(successor.failure().is_none() && ru.failure().is_none(), "{:?} {:?}", successor.failure(), ru.failure());
    // The BU gone comes: the RU drops the first BU's queue, takes the successor, and the EVM's
    // re-assignments and new events go to it.
    relay.hold(false);
    assert!(
        eventually(|| successor.stats().events >= 200 || successor.failure().is_some()),
        "the successor builds: {:?} / EVM {:?} / RU {:?}",
        successor.stats(),
        evm.stats(),
        ru.stats()
    );
    assert!(successor.failure().is_none(), "{:?}", successor.failure());
    let evm_summary = evm.stop(None).unwrap();
    let last = last_event(&evm_summary);
    for s in &mut sources {
        s.stop(Some(last)).unwrap();
    }
    let ru_summary = ru.stop(None).unwrap();
    let bu_summary = successor.stop(None).unwrap();
    let (t, r, b) = (trigger(&evm_summary), ru_detail(&ru_summary), bu_detail(&bu_summary));
    assert!(
        t.error.is_none() && r.error.is_none() && b.error.is_none(),
        "{evm_summary:?}\n{ru_summary:?}\n{bu_summary:?}"
    );
    assert_eq!((t.lost, t.built), (0, last), "{evm_summary:?}");
    assert!(evm_detail(&evm_summary).reassigned > 0, "the first BU held events: {evm_summary:?}");
    assert_eq!(b.incomplete_at_end, Some(0), "no stray super-fragment in the successor: {bu_summary:?}");
    assert_eq!(r.leftover_events, Some(0), "{ru_summary:?}");
}

/// Connects to an EVM or RU at `addr` as a peer would (the transport's handshake) and sends
/// `payload` as one frame of kind `kind`: the peer's end, to read what comes back.
fn raw_peer(addr: &str, kind: u16, payload: bytes::Bytes) -> std::net::TcpStream {
    use std::io::Write;
    let mut buf = bytes::BytesMut::new();
    daqflow_wire::frame::FrameCodec::default().encode(&daqflow_wire::frame::Frame::new(kind, payload), &mut buf);
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    daqflow_transport::auth::handshake_std(&mut s, daqflow_evb::protocol::PROTOCOL, None, Duration::from_secs(10))
        .unwrap();
    s.write_all(&buf).unwrap();
    s
}

/// What a peer's end reads within `wait`: `Some(bytes)` once the other end closed, `None` if it
/// is still open.
fn closed_within(s: &mut std::net::TcpStream, wait: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut got = Vec::new();
    match std::io::Read::read_to_end(s, &mut got) {
        Ok(_) => Some(got),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => None,
        Err(_) => Some(got),
    }
}

/// The generation rule at an RU, with real sockets, and the protocol version at the EVM and
/// the RU: a connection of a generation the EVM said is gone is refused; one of a generation
/// whose predecessors' BU gone never comes is held, then closed after the RU's
/// `connect_timeout_ms`; a hello of protocol version 1 (no version) is refused by both. The run
/// goes on undisturbed.
#[test]
fn an_ru_refuses_a_gone_generation_and_closes_one_held_too_long_and_both_refuse_another_version() {
    use daqflow_evb::protocol::{KIND_HELLO, Message, Role};
    let mut b = setup(1, 2, 2, EvmConfig::default(), BuConfig::default(), SizeModel::Fixed { bytes: 300 });
    let patience = Duration::from_millis(3000);
    // The RU again, with a shorter patience, on the address its sources know.
    let (evm_addr, listen_at) = (b.evm_addr.clone(), b.ru_addr.clone());
    b.rus[0].reset().unwrap();
    let config = RuConfig { id: 0, evm: evm_addr, listen: listen_at, streams: 2, ..Default::default() };
    b.rus[0] = Ru::new("ru-0", RuConfig { connect_timeout_ms: patience.as_millis() as u64, ..config });
    assert_eq!(listen(b.rus[0].configure().unwrap()), b.ru_addr);
    b.start(1);
    let ru_addr = b.ru_addr.clone();
    assert!(eventually(|| b.bus[1].stats().events >= 50), "the run builds: {:?}", b.evm.stats());
    // BU 1 dies: the EVM tells the RU BU 1 generation 0 is gone.
    b.bus[1].reset().unwrap();
    let gone_at_evm =
        |b: &Builder| b.evm.stats().detail_as::<EvmDetail>().is_some_and(|d| d.bus.iter().all(|x| x.id != 1));
    assert!(eventually(|| gone_at_evm(&b)), "{:?}", b.evm.stats());
    // The BU gone went out with the removal; the RU reads it at once.
    std::thread::sleep(Duration::from_millis(500));
    let hello = |id: u32, generation: u32| {
        Message::Hello {
            role: Role::Bu,
            id,
            run: 1,
            name: format!("rogue-{id}-{generation}"),
            addr: String::new(),
            generation,
        }
        .encode()
    };
    // Version 1's hello: the five fields, no version.
    let mut w = daqflow_wire::codec::Writer::new();
    w.u32(3);
    w.u32(9);
    w.u32(1);
    w.text("old-bu-9");
    w.text("");
    let v1 = w.finish();
    // BU 1 generation 0 is gone: refused (long before the RU's patience would run out).
    let mut gone = raw_peer(&ru_addr, KIND_HELLO, hello(1, 0));
    // BU 7 generation 2: generations 0 and 1 of id 7 are never gone; held, then closed.
    let mut early = raw_peer(&ru_addr, KIND_HELLO, hello(7, 2));
    let mut old_at_ru = raw_peer(&ru_addr, KIND_HELLO, v1.clone());
    let mut old_at_evm = raw_peer(&b.evm_addr, KIND_HELLO, v1);
    let half = patience / 2;
    for (what, s) in [
        ("a gone generation", &mut gone),
        ("version 1 at the RU", &mut old_at_ru),
        ("version 1 at the EVM", &mut old_at_evm),
    ] {
        assert_eq!(closed_within(s, half), Some(Vec::new()), "{what}: closed, nothing sent");
    }
    assert_eq!(closed_within(&mut early, Duration::from_millis(300)), None, "held");
    assert_eq!(closed_within(&mut early, Duration::from_secs(20)), Some(Vec::new()), "closed after the patience");
    let evm = b.evm.stop(None).unwrap();
    let last = last_event(&evm);
    for s in &mut b.sources {
        s.stop(Some(last)).unwrap();
    }
    let ru = b.rus[0].stop(None).unwrap();
    let bu = b.bus[0].stop(None).unwrap();
    assert!(
        trigger(&evm).error.is_none() && ru_detail(&ru).error.is_none() && bu_detail(&bu).error.is_none(),
        "{evm:?}\n{ru:?}\n{bu:?}"
    );
    assert_eq!(trigger(&evm).lost, 0, "{evm:?}");
}

#[test]
fn a_bu_whose_start_fails_leaves_no_empty_data_file() {
    // The second builder thread cannot open its file (a directory holds its name); the first
    // had opened its own: the start fails, and that file, which holds no event, is removed.
    let dir = tempfile::tempdir().unwrap();
    let mut evm = driver("evm", "evm");
    let evm_addr = listen(configure(&mut evm, json!({ "rus": 1 })).unwrap());
    let mut bu = driver("bu", "bu-0");
    let config = json!({ "id": 0, "evm": evm_addr, "output": "files", "directory": dir.path(), "threads": 2 });
    configure(&mut bu, config.clone()).unwrap();
    std::fs::create_dir(dir.path().join("run000001_bu-0-t1_0001.daq.part")).unwrap();
    let err = bu.start(1).unwrap_err().to_string();
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
    let left: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left, ["run000001_bu-0-t1_0001.daq.part"], "what the failed start left");
    // With the obstacle gone and the BU reset, the same run starts, its files numbered from the
    // first.
    std::fs::remove_dir(dir.path().join("run000001_bu-0-t1_0001.daq.part")).unwrap();
    assert_eq!(bu.state(), State::Error);
    bu.reset().unwrap();
    configure(&mut bu, config).unwrap();
    bu.start(1).unwrap();
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["run000001_bu-0-t0_0001.daq.part", "run000001_bu-0-t1_0001.daq.part"]);
}
