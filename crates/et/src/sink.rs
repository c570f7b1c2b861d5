//! An ET system as the output of a builder: [`EtSink`] puts each event it is handed into the
//! ET system's GRAND_CENTRAL station, the way a producer does, with the control words it is
//! given. An event is safe once put (the ET system holds it), so a builder confirms at once.
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
use std::time::Duration;

use bytes::Bytes;
use daqflow_wire::EventId;
use daqflow_wire::sink::{EventSink, SinkError};

use crate::{Attachment, EtClient, EtError, LocalAttachment, Wait};

/// A producer attached to GRAND_CENTRAL of a local ET system.
pub struct EtSink {
    // Declared first: the attachment detaches before the client unmaps the system.
    producer: LocalAttachment,
    _client: EtClient,
}

impl EtSink {
    /// Opens the ET system named `name` (its file) and attaches to GRAND_CENTRAL.
    pub fn open(name: &str) -> Result<EtSink, EtError> {
        let client = EtClient::connect(name)?;
        let producer = client.attach("GRAND_CENTRAL")?;
        Ok(EtSink { producer, _client: client })
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
}
