//! [`SourceStream`]: the sending side of the source protocol as a library, for a readout of the
//! user's own (a program driving real hardware, the Python package's `daqflow.SourceStream`): it
//! connects to an RU, says hello and sends the fragments the caller gives it, each with event
//! ids 1, 2, 3, … in order, then the end frame.
//!
//! ```no_run
//! use daqflow_evb::source::SourceStream;
//! let mut stream = SourceStream::connect("127.0.0.1:7200", 3, 12, "my-readout", std::time::Duration::from_secs(5))?;
//! for _ in 0..1000 {
//!     stream.send(1, b"the detector's bytes")?; // event 1, 2, 3, …: trigger type 1
//! }
//! stream.end()?; // the end frame: the RU knows the stream ended at event 1000
//! # Ok::<(), daqflow_evb::EvbError>(())
//! ```

use std::time::Duration;

use daqflow_transport::Connection;
use daqflow_wire::{EventId, FRAGMENT_HEADER_LEN, FragmentFlags, FragmentHeader, pad8};

use super::KIND_FRAGMENT;
use crate::EvbError;
use crate::link::{connect, data_options, unix_ns};
use crate::protocol::{Message, Role};

/// The largest payload one fragment may carry (the RU's limit on a source's fragment frame is
/// larger; this keeps a mistaken size from reaching the wire).
pub const MAX_FRAGMENT_PAYLOAD: usize = 64 << 20;

/// One source's stream of fragments to an RU (`docs/evb.md`, "Writing a source").
pub struct SourceStream {
    conn: Option<Connection>,
    source_id: u32,
    run: u32,
    /// The last event id sent (0 before the first).
    last: u64,
    /// Bytes sent in fragments (headers and padding included), as the source kind counts them.
    bytes: u64,
    addr: String,
}

impl SourceStream {
    /// Connects to the RU at `addr` (retrying for `patience`: the RU may still be starting) and
    /// says hello as source `source_id` of run `run`. The connection proves the process's system
    /// token ([`daqflow_transport::auth::set_process_token`]) when it has one.
    pub fn connect(
        addr: &str,
        source_id: u32,
        run: u32,
        name: &str,
        patience: Duration,
    ) -> Result<SourceStream, EvbError> {
        let hello = Message::Hello {
            role: Role::Source,
            id: source_id,
            run,
            name: name.to_owned(),
            addr: String::new(),
            generation: 0,
        };
        let conn = connect(addr, &data_options(), patience, &hello)?;
        Ok(SourceStream { conn: Some(conn), source_id, run, last: 0, bytes: 0, addr: addr.to_owned() })
    }

    /// The id the next fragment gets.
    pub fn next_event(&self) -> u64 {
        self.last + 1
    }

    /// The last event id sent (0 before the first).
    pub fn last_event(&self) -> u64 {
        self.last
    }

    /// Bytes sent in fragments: their 48-byte headers, payloads and padding to 8 bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn conn(&mut self) -> Result<&mut Connection, EvbError> {
        let addr = &self.addr;
        self.conn.as_mut().ok_or_else(|| EvbError::Failed(format!("the stream to {addr} has ended")))
    }

    /// Sends the next event's fragment: `payload` with trigger type `trigger_type`, time-stamped
    /// now. It is queued; the transport writes as its chunks fill and on [`flush`](Self::flush)
    /// (a paced readout flushes before it waits). An error ends the stream.
    pub fn send(&mut self, trigger_type: u32, payload: &[u8]) -> Result<u64, EvbError> {
        self.send_stamped(trigger_type, unix_ns(), payload)
    }

    /// [`send`](Self::send) with the caller's time stamp (ns since the Unix epoch).
    pub fn send_stamped(&mut self, trigger_type: u32, timestamp: u64, payload: &[u8]) -> Result<u64, EvbError> {
        if payload.len() > MAX_FRAGMENT_PAYLOAD {
            return Err(EvbError::Failed(format!(
                "a fragment of {} bytes: at most {MAX_FRAGMENT_PAYLOAD} bytes of payload",
                payload.len()
            )));
        }
        let id = self.last + 1;
        let header = FragmentHeader {
            flags: FragmentFlags::empty(),
            source_id: self.source_id,
            event_id: EventId(id),
            run_number: self.run,
            trigger_type,
            timestamp,
            payload_len: payload.len() as u32,
            payload_crc: daqflow_wire::crc::crc32c(payload),
        };
        let padding = [0u8; 8];
        let pad = pad8(payload.len()) - payload.len();
        let sent = self.conn()?.send_slices(KIND_FRAGMENT, 0, 0, &[&header.encode(), payload, &padding[..pad]]);
        if let Err(e) = sent {
            self.conn = None;
            return Err(EvbError::Failed(format!("sending event {id} to {}: {e}", self.addr)));
        }
        self.last = id;
        self.bytes += (FRAGMENT_HEADER_LEN + pad8(payload.len())) as u64;
        Ok(id)
    }

    /// Writes what is queued (without waiting for the RU to read it all when the socket is full:
    /// what remains goes out with the next send or flush).
    pub fn flush(&mut self) -> Result<(), EvbError> {
        let addr = self.addr.clone();
        let r = self.conn()?.try_flush();
        r.map(|_| ()).map_err(|e| {
            self.conn = None;
            EvbError::Failed(format!("sending to {addr}: {e}"))
        })
    }

    /// Sends the end frame (the last event id sent), writes everything and closes the
    /// connection. Returns the last event id.
    pub fn end(&mut self) -> Result<u64, EvbError> {
        let last = self.last;
        let addr = self.addr.clone();
        let mut conn = self.conn.take().ok_or_else(|| EvbError::Failed(format!("the stream to {addr} has ended")))?;
        let failed = |e: &dyn std::fmt::Display| EvbError::Failed(format!("ending the stream to {addr}: {e}"));
        conn.send(Message::End { last_event: last }.to_frame()).map_err(|e| failed(&e))?;
        conn.close().map_err(|e| failed(&e))?;
        Ok(last)
    }

    /// Whether the stream is still open (not ended, no error).
    pub fn is_open(&self) -> bool {
        self.conn.is_some()
    }
}
