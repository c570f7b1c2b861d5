//! Where built events go: [`EventSink`], the output of a builder (data files, an ET system, …).
//! The event builder hands its events to a sink without knowing what is behind it; the file
//! writer of this crate is one, the ET system's producer (in `daqflow-et`) another.
//!
//! ```
//! use std::sync::atomic::AtomicBool;
//! use bytes::Bytes;
//! use daqflow_wire::EventId;
//! use daqflow_wire::file::{FileWriter, FileWriterConfig};
//! use daqflow_wire::sink::EventSink;
//! let dir = std::env::temp_dir().join(format!("sink-doc-{}", std::process::id()));
//! let mut sink: Box<dyn EventSink> = Box::new(FileWriter::new(FileWriterConfig::new(&dir, 1))?);
//! let event = [Bytes::from_static(&[0u8; 8])]; // an event's bytes, in parts
//! sink.put(EventId(1), &event, 8, [0; 4], &AtomicBool::new(false))?;
//! sink.flush()?;
//! let files = sink.finish()?;
//! assert_eq!(files[0].events, 1);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::atomic::AtomicBool;

use bytes::Bytes;

use crate::EventId;
use crate::file::{ClosedFile, FileWriter};

/// An output failed.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Writing or handing over the event failed; the text says why.
    #[error("{0}")]
    Failed(String),
    /// The output had no room for the event until the run was stopped.
    #[error("no room for the event until the stop: {0}")]
    Stopped(String),
}

/// The output of a builder: takes built events, one at a time, in the order they are built.
pub trait EventSink: Send {
    /// Takes event `event_id`, whose bytes are `parts` concatenated (`len` bytes in all), with
    /// its four control words (the ET system's: trigger type, event flags, 0, 0). A sink that
    /// must wait for room looks at `stop` and gives up with [`SinkError::Stopped`] once it is set.
    fn put(
        &mut self,
        event_id: EventId,
        parts: &[Bytes],
        len: usize,
        control: [i32; 4],
        stop: &AtomicBool,
    ) -> Result<(), SinkError>;

    /// Makes what was put durable against a crash of this process.
    fn flush(&mut self) -> Result<(), SinkError> {
        Ok(())
    }

    /// Whether an event is safe as soon as [`EventSink::put`] returns (then a builder confirms
    /// it at once; otherwise after the next [`EventSink::flush`]).
    fn durable_at_once(&self) -> bool {
        true
    }

    /// From now on, confirm an event only once every consumer behind this output is done with
    /// it (an ET system: once it came back to GRAND_CENTRAL through every station, the
    /// recorder's included): [`EventSink::flush`] then waits for that, and
    /// [`EventSink::durable_at_once`] is false. What a builder confirms then survives the death
    /// of the whole host the output is on. An output that cannot tell refuses.
    fn confirm_when_consumed(&mut self) -> Result<(), SinkError> {
        Err(SinkError::Failed("this output cannot tell when its consumers are done with an event".into()))
    }

    /// Ends the output: the files it closed, if it writes files.
    fn finish(self: Box<Self>) -> Result<Vec<ClosedFile>, SinkError> {
        Ok(Vec::new())
    }
}

/// Data files, rotating by size: durable after a flush.
impl EventSink for FileWriter {
    fn put(
        &mut self,
        event_id: EventId,
        parts: &[Bytes],
        _len: usize,
        _control: [i32; 4],
        _stop: &AtomicBool,
    ) -> Result<(), SinkError> {
        let parts: Vec<&[u8]> = parts.iter().map(|b| &b[..]).collect();
        self.write_event_parts(event_id, &parts).map_err(|e| SinkError::Failed(e.to_string()))
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        FileWriter::flush(self).map_err(|e| SinkError::Failed(e.to_string()))
    }

    fn durable_at_once(&self) -> bool {
        false
    }

    fn finish(self: Box<Self>) -> Result<Vec<ClosedFile>, SinkError> {
        FileWriter::finish(*self).map_err(|e| SinkError::Failed(e.to_string()))
    }
}

/// Nothing: events are dropped (measurements of the builder alone).
#[derive(Debug, Default, Clone, Copy)]
pub struct Discard;

impl EventSink for Discard {
    fn put(&mut self, _: EventId, _: &[Bytes], _: usize, _: [i32; 4], _: &AtomicBool) -> Result<(), SinkError> {
        Ok(())
    }
}
