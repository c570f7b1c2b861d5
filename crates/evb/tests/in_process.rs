//! A whole event builder in one process (threads, real sockets): the logic end to end.

use std::time::Duration;

use daqflow_evb::bu::{Bu, BuConfig, Output};
use daqflow_evb::component::Component;
use daqflow_evb::evm::{Evm, EvmConfig};
use daqflow_evb::model::SizeModel;
use daqflow_evb::ru::{Ru, RuConfig};
use daqflow_evb::source::{Source, SourceConfig};
use serde_json::Value;

struct Builder {
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
    for i in 0..rus {
        let mut ru = Ru::new(
            &format!("ru-{i}"),
            RuConfig { id: i, evm: evm_addr.clone(), streams: streams as usize, ..Default::default() },
        );
        let addr = listen(ru.configure().unwrap());
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
            b.configure().unwrap();
            b
        })
        .collect();
    Builder { evm: e, rus: r, bus: b, sources: s }
}

impl Builder {
    fn run(&mut self, run: u32, secs: f64) -> (Value, Vec<Value>, Vec<Value>) {
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
