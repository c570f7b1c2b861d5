//! The bridge: moves events from a station of one ET system into another ET system, in batches
//! (as ET's bridge does), e.g. from a builder host to a monitoring host.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::config::Wait;
use crate::error::EtError;
use crate::event::Attachment;

/// What a bridge moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BridgeStats {
    /// Events copied into the destination.
    pub events: u64,
    /// Bytes copied.
    pub bytes: u64,
}

/// Copies events from `from` (a consumer attachment) into `to` (any attachment of the
/// destination system, used as a producer), `batch` at a time, until `stop` is set or `count`
/// events are moved. Data, length, control integers and priority travel; every source event is
/// put back to its system once copied.
pub fn bridge(
    from: &dyn Attachment,
    to: &dyn Attachment,
    batch: usize,
    count: Option<u64>,
    stop: &AtomicBool,
) -> Result<BridgeStats, EtError> {
    let mut stats = BridgeStats::default();
    let mut src = Vec::with_capacity(batch);
    let mut dst = Vec::with_capacity(batch);
    while !stop.load(Ordering::Acquire) && count.is_none_or(|c| stats.events < c) {
        let want = count.map_or(batch, |c| batch.min((c - stats.events) as usize));
        match from.get_events_into(want, Wait::Timed(Duration::from_millis(200)), &mut src) {
            Ok(_) => {}
            Err(EtError::Timeout) => continue,
            Err(e) => return Err(e),
        }
        let size = src.iter().map(|e| e.len()).max().unwrap_or(0);
        let mut got = 0;
        while got < src.len() {
            // Wait in short steps so that a stop is seen while the destination is full; the
            // events already taken then go back where they came from, none is lost.
            match to.new_events_into(src.len() - got, size, Wait::Timed(Duration::from_millis(200)), &mut dst) {
                Ok(n) => got += n,
                Err(EtError::Timeout) if stop.load(Ordering::Acquire) => {
                    to.dump_events(&mut dst)?;
                    from.put_events(&mut src)?;
                    return Ok(stats);
                }
                Err(EtError::Timeout) => {}
                Err(e) => return Err(e),
            }
        }
        for (s, d) in src.iter().zip(dst.iter_mut()) {
            d.write(s.data())?;
            d.set_control(s.control());
            d.set_priority(s.priority());
            stats.bytes += s.len() as u64;
        }
        stats.events += src.len() as u64;
        to.put_events(&mut dst)?;
        from.put_events(&mut src)?;
    }
    Ok(stats)
}
