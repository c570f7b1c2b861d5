//! An ET system as the output of a builder: [`EtSink`] puts each event it is handed into the
//! ET system's GRAND_CENTRAL station, the way a producer does, with the control words it is
//! given. An event is safe once put (the ET system holds it) as long as the ET system lives, so a
//! builder confirms at once. With [`EventSink::confirm_when_consumed`], a flush waits until every
//! event put so far has come back to GRAND_CENTRAL through every station (the recorder wrote it):
//! what the builder confirms then survives the death of the ET system's whole host.
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use bytes::Bytes;
//! use daqflow_et::sink::EtSink;
//! use daqflow_wire::EventId;
//! use daqflow_wire::sink::EventSink;
//! let mut sink = EtSink::open("/tmp/et_sys_demo")?;
//! sink.put(EventId(1), &[Bytes::from_static(b"an event")], 8, [1, 0, 0, 0], &AtomicBool::new(false))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_wire::EventId;
use daqflow_wire::sink::{EventSink, SinkError};

use crate::{Attachment, EtClient, EtError, LocalAttachment, Wait};

/// A producer attached to GRAND_CENTRAL of a local ET system.
pub struct EtSink {
    // Declared first: the attachment detaches before the client unmaps the system.
    producer: LocalAttachment,
    client: EtClient,
    /// Confirm only what came back through every station (see [`EtSink::drain_wait`]).
    when_consumed: bool,
}

/// How long a flush waits for the stations to give back what was put, before it fails.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

impl EtSink {
    /// Opens the ET system named `name` (its file) and attaches to GRAND_CENTRAL.
    pub fn open(name: &str) -> Result<EtSink, EtError> {
        let client = EtClient::connect(name)?;
        let producer = client.attach("GRAND_CENTRAL")?;
        Ok(EtSink { producer, client, when_consumed: false })
    }

    /// Waits until every event of the pool is back in GRAND_CENTRAL: every station's consumers
    /// are done with everything put so far. Exact when this sink is the system's only producer
    /// (one builder unit per ET system, as on a BU host); with other producers it also waits for
    /// theirs. Fails after a minute, or when the ET system is gone.
    fn drain_wait(&mut self) -> Result<(), SinkError> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            let snap = self.client.snapshot().map_err(|e| SinkError::Failed(e.to_string()))?;
            if snap.free_events >= snap.events {
                return Ok(());
            }
            if start.elapsed() >= DRAIN_LIMIT {
                return Err(SinkError::Failed(format!(
                    "the ET system's consumers kept {} event(s) for more than {} s (is its recorder running?)",
                    snap.events - snap.free_events,
                    DRAIN_LIMIT.as_secs()
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }
}

impl std::fmt::Debug for EtSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtSink").finish_non_exhaustive()
    }
}

impl EventSink for EtSink {
    fn put(
        &mut self,
        _event_id: EventId,
        parts: &[Bytes],
        len: usize,
        control: [i32; 4],
        stop: &AtomicBool,
    ) -> Result<(), SinkError> {
        // Wait for a free event in slices, so that a stop ends the wait.
        let mut events = loop {
            match self.producer.new_events(1, len, Wait::Timed(Duration::from_millis(50))) {
                Ok(e) => break e,
                Err(EtError::Timeout) if stop.load(Ordering::Relaxed) => {
                    return Err(SinkError::Stopped("the ET system had no free event".into()));
                }
                Err(EtError::Timeout) => {}
                Err(e) => return Err(SinkError::Failed(e.to_string())),
            }
        };
        let e = &mut events[0];
        let buf = e.buffer_mut();
        let mut at = 0;
        for p in parts {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        e.set_len(len).map_err(|e| SinkError::Failed(e.to_string()))?;
        e.set_control(control);
        self.producer.put_events(&mut events).map_err(|e| SinkError::Failed(e.to_string()))
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        if self.when_consumed { self.drain_wait() } else { Ok(()) }
    }

    fn durable_at_once(&self) -> bool {
        !self.when_consumed
    }

    fn confirm_when_consumed(&mut self) -> Result<(), SinkError> {
        self.when_consumed = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EtSystem, Position, StationConfig, SystemConfig};

    #[test]
    fn confirming_when_consumed_a_flush_waits_until_the_recorder_gave_every_event_back() {
        let name = format!("sink-consumed-{}", std::process::id());
        let system = EtSystem::create(SystemConfig::new(&name, 16, 256)).unwrap();
        let client = EtClient::connect(system.name()).unwrap();
        client.create_station("rec", StationConfig::default(), Position::End).unwrap();
        let recorder = client.attach("rec").unwrap();
        let mut sink = EtSink::open(system.name()).unwrap();
        assert!(sink.durable_at_once(), "by default an event is confirmed once put");
        sink.confirm_when_consumed().unwrap();
        assert!(!sink.durable_at_once());
        let stop = AtomicBool::new(false);
        for i in 0..3 {
            sink.put(EventId(i + 1), &[Bytes::from_static(b"event")], 5, [0; 4], &stop).unwrap();
        }
        // The recorder takes the three events and holds them for a while: the flush waits.
        let mut held = recorder.get_events(3, Wait::Timed(Duration::from_secs(5))).unwrap();
        assert_eq!(held.len(), 3);
        let (tx, rx) = std::sync::mpsc::channel();
        let flusher = std::thread::spawn(move || {
            let r = sink.flush();
            tx.send(Instant::now()).unwrap();
            r
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(rx.try_recv().is_err(), "the flush returned while the recorder still held the events");
        let given_back = Instant::now();
        recorder.put_events(&mut held).unwrap();
        let returned = rx.recv_timeout(Duration::from_secs(5)).expect("the flush returns once they are back");
        assert!(returned >= given_back);
        flusher.join().unwrap().unwrap();
    }
}
