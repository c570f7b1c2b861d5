//! The receiving side every chain kind that ends a stream shares (the sink's loop, with the
//! kind's own work per chunk): accept the upstream, check every frame, hand each chunk's
//! header and data to the kind, until the end marker.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use daqflow_transport::{Listener, RecvError};

use crate::link::{BATCH, Live, TICK, accept, wait};
use crate::protocol::{CHUNK_HEADER_LEN, ChunkHeader, StreamCheck, StreamEvent};

/// Receives the stream of run `run` from the upstream that connects to `listener`, checks it
/// (CRCs too if `check_crc`; its data type if `data_type` names one: an untyped stream is
/// taken, one of another type refused), and calls `on_chunk` with each chunk's header and data, in
/// order.
/// What it counted is in `live`; a failure (the upstream's, or the text `on_chunk` returned)
/// too. `Ok(true)`: the end marker came; `Ok(false)`: abandoned before it.
pub(crate) fn receive_chunks(
    name: &str,
    run: u32,
    check_crc: bool,
    data_type: Option<&str>,
    listener: &Listener,
    live: &Live,
    mut on_chunk: impl FnMut(&ChunkHeader, Bytes) -> Result<(), String>,
) -> bool {
    let mut check = StreamCheck::new(run, check_crc);
    let mut upstream: Option<String> = None;
    // The connection outlives the closure: a refusal is recorded (`live.fail`) before the
    // upstream sees its connection close, so that whoever hears of the upstream's failure
    // first (the operator, through it) finds this side's reason already there.
    let mut held = None;
    let result: Result<bool, String> = (|| {
        let Some(up) = accept(listener, live, run, name)? else { return Ok(false) };
        let up = held.insert(up);
        let peer = up.peer_addr();
        upstream = Some(peer.to_string());
        *live.upstream.lock().unwrap_or_else(|p| p.into_inner()) = upstream.clone();
        loop {
            if live.abandon.load(Ordering::Relaxed) {
                return Ok(false);
            }
            let mut got = false;
            let mut published = Instant::now();
            for _ in 0..BATCH {
                let frame = match up.try_recv() {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(RecvError::Closed { .. }) => {
                        return Err(format!(
                            "upstream {peer} closed the connection without an end marker after chunk {}",
                            check.chunks()
                        ));
                    }
                    Err(e) => return Err(format!("upstream: {e}")),
                };
                got = true;
                let event =
                    check.on_frame(&frame).map_err(|e| format!("upstream {peer} sent {e}; connection closed"))?;
                match event {
                    StreamEvent::End => return Ok(true),
                    StreamEvent::Chunk { .. } => {
                        // The check decoded the header: it is there.
                        let header = ChunkHeader::decode(&frame.payload).unwrap_or_default();
                        on_chunk(&header, frame.payload.slice(CHUNK_HEADER_LEN..))?;
                    }
                    StreamEvent::Begin => {
                        let found = check.data_type();
                        if let Some(wanted) = data_type
                            && found != 0
                            && found != crate::protocol::data_type_tag(wanted)
                        {
                            return Err(format!(
                                "upstream {peer} sends data of another type (tag {found:#010x} in its begin marker); \
                                 this input takes `{wanted}` (tag {:#010x}) or untyped data",
                                crate::protocol::data_type_tag(wanted)
                            ));
                        }
                    }
                }
                if live.abandon.load(Ordering::Relaxed) {
                    break;
                }
                // A kind that takes its time per chunk (a monitor's `work_us`) still publishes
                // its counters every TICK, not only after a batch.
                if published.elapsed() >= TICK {
                    live.observe(&check);
                    published = Instant::now();
                }
            }
            live.observe(&check);
            if !got {
                wait(Some(up.as_raw_fd()), None, TICK).map_err(|e| format!("waiting for data: {e}"))?;
            }
        }
    })();
    live.observe(&check);
    let error = match result {
        Ok(true) => None,
        Ok(false) => Some(match &upstream {
            None => "stopped before an upstream connected".to_owned(),
            Some(u) => {
                format!("stopped before the end marker came from upstream {u} ({} chunks received)", check.chunks())
            }
        }),
        Err(e) => Some(e),
    };
    let ended = error.is_none();
    if let Some(e) = error {
        live.fail(name, e);
    }
    drop(held);
    ended
}
