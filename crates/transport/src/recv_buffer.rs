//! The receive side of the framing core: a reusable buffer that reads land in and frames are
//! split off without copying. No I/O happens here.

use bytes::buf::Limit;
use bytes::{BufMut, BytesMut};
use daqflow_wire::frame::{FRAME_HEADER_LEN, Frame, FrameCodec, FrameError, FrameLimits};

/// Bytes received and not yet handed out as frames.
///
/// A reader asks for [`RecvBuffer::read_buf`] (room for at least one chunk or the rest of the
/// frame being received, checked against the maximum frame size first, and limited to what this
/// read may take), reads into it, and takes frames with [`RecvBuffer::next_frame`]. Each frame's
/// payload is a slice of the buffer: no copy. When every frame of a chunk has been dropped, the
/// chunk's memory is reused.
///
/// A frame larger than one chunk is received into an allocation of exactly its own size, and
/// the reads stop at its end: none of its bytes is ever moved, however long the frames before
/// it are kept. After such a frame the next read takes only a frame header, so that a stream
/// of large frames costs one small read per frame and never a copy.
///
/// ```
/// use bytes::{BufMut, Bytes, BytesMut};
/// use daqflow_transport::RecvBuffer;
/// use daqflow_wire::frame::{Frame, FrameCodec};
/// let mut wire = BytesMut::new();
/// FrameCodec::default().encode(&Frame::new(5, Bytes::from_static(b"payload")), &mut wire);
/// let mut rb = RecvBuffer::new(FrameCodec::default(), 64 << 10);
/// rb.read_buf().unwrap().put_slice(&wire); // what a socket read would do
/// let frame = rb.next_frame().unwrap().unwrap();
/// assert_eq!(&frame.payload[..], b"payload");
/// ```
#[derive(Debug)]
pub struct RecvBuffer {
    buf: BytesMut,
    codec: FrameCodec,
    chunk: usize,
    /// The last frame under way was larger than a chunk: read a header alone next.
    after_large: bool,
    /// Size of the frame being received into an allocation of its own (0: none).
    large_under_way: usize,
}

impl RecvBuffer {
    /// A buffer for `codec`'s frames, reading in chunks of `chunk` bytes.
    pub fn new(codec: FrameCodec, chunk: usize) -> Self {
        RecvBuffer { buf: BytesMut::new(), codec, chunk: chunk.max(4096), after_large: false, large_under_way: 0 }
    }

    /// The next whole frame, if one has arrived.
    #[inline]
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let f = self.codec.decode(&mut self.buf)?;
        if f.is_some() {
            self.large_under_way = 0;
        }
        Ok(f)
    }

    /// Changes the largest payloads accepted from now on (a frame under way is checked too).
    pub fn set_limits(&mut self, limits: FrameLimits) {
        self.codec = FrameCodec::with_limits(limits);
    }

    /// The size of the frame being received into an allocation of its own, if one is: the
    /// memory a partial frame holds beyond the reusable chunk.
    pub fn large_frame_under_way(&self) -> Option<usize> {
        (self.large_under_way > 0).then_some(self.large_under_way)
    }

    /// Room to read into: the buffer, limited to the bytes the next read may take (see
    /// [`RecvBuffer::prepare_read`]).
    pub fn read_buf(&mut self) -> Result<Limit<&mut BytesMut>, FrameError> {
        let n = self.prepare_read()?;
        Ok((&mut self.buf).limit(n))
    }

    /// Makes room for the next read and says how many bytes it may take (always at least one,
    /// and never more than the spare capacity of [`RecvBuffer::buf_mut`]). The header of a
    /// frame under way is checked against the maximum first, so that a hostile length cannot
    /// make us allocate.
    pub fn prepare_read(&mut self) -> Result<usize, FrameError> {
        let len = self.buf.len();
        let need = self.codec.bytes_needed(&self.buf)?;
        let missing = need.saturating_sub(len);
        if missing > 0 && len >= FRAME_HEADER_LEN {
            self.after_large = need > self.large_from();
            if self.after_large {
                self.large_under_way = need;
                // Its own allocation, exactly its size: the few bytes read so far (a header,
                // as a rule) are the only ones ever copied.
                if self.buf.capacity() - len < missing {
                    let mut own = BytesMut::with_capacity(need);
                    own.extend_from_slice(&self.buf);
                    self.buf = own;
                }
                return Ok(missing);
            }
        }
        let spare = self.buf.capacity() - len;
        if spare < missing.max(self.chunk / 2) {
            // Asking for no more than the chunk holds lets `reserve` take the chunk back (moving
            // the partial frame to its start) once every frame handed out of it was dropped.
            self.buf.reserve(missing.max(self.chunk.saturating_sub(len)).max(self.chunk / 2));
        }
        let spare = self.buf.capacity() - self.buf.len();
        if self.after_large && len < FRAME_HEADER_LEN {
            // The next frame may be large too: learn its length before reading into a chunk.
            return Ok(FRAME_HEADER_LEN - len);
        }
        Ok(spare)
    }

    /// Frames longer than this get an allocation of their own: an eighth of a chunk. A frame
    /// that straddles the end of a chunk has the part already read moved into a fresh chunk;
    /// from this size on, that copy (on average half a frame, for one frame in eight or more)
    /// costs more than the one small read of a header per frame.
    fn large_from(&self) -> usize {
        self.chunk / 8
    }

    /// The buffer to read into, as prepared by [`RecvBuffer::prepare_read`].
    pub fn buf_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Bytes buffered (a partial frame, or whole frames not taken yet).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{BufMut, Bytes};

    #[test]
    fn a_large_frame_reserves_its_size_once_after_the_header_checks() {
        let codec = FrameCodec::new(10 << 20);
        let mut wire = BytesMut::new();
        codec.encode(&Frame::new(1, Bytes::from(vec![7u8; 5 << 20])), &mut wire);
        let mut rb = RecvBuffer::new(codec, 64 << 10);
        rb.read_buf().unwrap().put_slice(&wire[..100]);
        let (spare, limit) = {
            let b = rb.read_buf().unwrap();
            (b.get_ref().capacity() - b.get_ref().len(), Limit::limit(&b))
        };
        assert_eq!(spare, (5 << 20) + 16 - 100, "room for exactly the whole frame");
        assert_eq!(limit, spare, "a read may fill it");
        rb.read_buf().unwrap().put_slice(&wire[100..]);
        let f = rb.next_frame().unwrap().unwrap();
        assert_eq!(f.payload.len(), 5 << 20);
    }

    #[test]
    fn reads_stop_at_the_end_of_a_large_frame_and_the_next_read_takes_a_header() {
        let codec = FrameCodec::new(10 << 20);
        let mut wire = BytesMut::new();
        for i in 0..3u8 {
            codec.encode(&Frame::new(1, Bytes::from(vec![i; 300 << 10])), &mut wire);
        }
        codec.encode(&Frame::new(2, Bytes::from_static(b"small")), &mut wire);
        let mut rb = RecvBuffer::new(codec, 64 << 10);
        let (mut pos, mut reads, mut kept) = (0, Vec::new(), Vec::new());
        while pos < wire.len() {
            let mut b = rb.read_buf().unwrap();
            let n = Limit::limit(&b).min(wire.len() - pos);
            b.put_slice(&wire[pos..pos + n]);
            reads.push(n);
            pos += n;
            while let Some(f) = rb.next_frame().unwrap() {
                kept.push(f); // held, as a repeater holds frames it has not sent yet
            }
        }
        // First read: one chunk (header and the start of frame 0); then the rest of frame 0 in
        // one read; then a header; then the rest of that frame; ...
        let frame = 16 + (300 << 10);
        assert_eq!(reads, [64 << 10, frame - (64 << 10), 16, frame - 16, 16, frame - 16, 16, 5], "{reads:?}");
        assert_eq!(kept.len(), 4);
        for (i, f) in kept.iter().take(3).enumerate() {
            assert!(f.payload.iter().all(|&b| b == i as u8));
        }
        assert_eq!(&kept[3].payload[..], b"small");
    }

    #[test]
    fn a_hostile_length_is_refused_before_allocating() {
        let codec = FrameCodec::new(1 << 20);
        let h = daqflow_wire::frame::FrameHeader { kind: 1, flags: 0, channel: 0, len: u32::MAX }.encode();
        let mut rb = RecvBuffer::new(codec, 64 << 10);
        rb.read_buf().unwrap().put_slice(&h);
        assert!(matches!(rb.read_buf(), Err(FrameError::TooLarge { .. })));
        assert!(matches!(rb.next_frame(), Err(FrameError::TooLarge { .. })));
    }
}

/// Counters of one direction of a connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectionStats {
    /// Frames queued for sending, or frames received.
    pub frames: u64,
    /// Bytes written to or read from the socket (headers included).
    pub bytes: u64,
    /// System calls that moved data (`writev` or `recv`).
    pub syscalls: u64,
}

#[derive(Debug, Clone, Copy)]
enum Dead {
    Closed,
    Truncated(usize),
    Protocol(FrameError),
    OverBudget { need: usize, in_use: usize, budget: usize },
    Failed,
}

/// The process-wide budget for frames under way in allocations of their own, in bytes: what
/// peers that send a large frame's header and then trickle its bytes can make this process hold.
pub mod budget {
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The environment variable that sets the budget (bytes) when the process starts.
    pub const ENV: &str = "DAQFLOW_RECV_BUDGET_BYTES";
    /// The budget when nothing else is set: 256 MiB (four of the ET system's largest events
    /// at once, or 2 000 of the event builder's largest super-fragments).
    pub const DEFAULT: usize = 256 << 20;

    const UNSET: usize = usize::MAX;
    static BUDGET: AtomicUsize = AtomicUsize::new(UNSET);
    static IN_USE: AtomicUsize = AtomicUsize::new(0);

    /// Sets the budget for the whole process.
    pub fn set(bytes: usize) {
        BUDGET.store(bytes.min(UNSET - 1), Ordering::Relaxed);
    }

    /// The budget: what [`set`] gave, else `DAQFLOW_RECV_BUDGET_BYTES`, else 256 MiB.
    pub fn get() -> usize {
        match BUDGET.load(Ordering::Relaxed) {
            UNSET => {
                let b = std::env::var(ENV).ok().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(DEFAULT);
                let _ = BUDGET.compare_exchange(UNSET, b.min(UNSET - 1), Ordering::Relaxed, Ordering::Relaxed);
                BUDGET.load(Ordering::Relaxed)
            }
            b => b,
        }
    }

    /// Bytes held by frames under way now.
    pub fn in_use() -> usize {
        IN_USE.load(Ordering::Relaxed)
    }

    /// Takes `n` bytes of the budget; `Err(in use)` if they are not there.
    pub(crate) fn reserve(n: usize) -> Result<(), usize> {
        let budget = get();
        IN_USE
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= budget)
            })
            .map(drop)
    }

    /// Gives `n` bytes back.
    pub(crate) fn release(n: usize) {
        IN_USE.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The receive state both I/O layers share: the buffer, whether the connection ended and how,
/// and the counters. The layers only do the reads.
#[derive(Debug)]
pub(crate) struct Inbox {
    buf: RecvBuffer,
    dead: Option<Dead>,
    pub(crate) stats: DirectionStats,
    peer: std::net::SocketAddr,
    /// Bytes of the process budget held for the large frame under way.
    reserved: usize,
    /// The limits the protocol admits a peer with (`ConnectionOptions::max_frame_bytes`).
    admitted: FrameLimits,
}

impl Drop for Inbox {
    fn drop(&mut self) {
        if self.reserved > 0 {
            budget::release(self.reserved);
        }
    }
}

impl Inbox {
    pub(crate) fn new(peer: std::net::SocketAddr, limits: FrameLimits, admitted: FrameLimits, chunk: usize) -> Self {
        Inbox {
            buf: RecvBuffer::new(FrameCodec::with_limits(limits), chunk),
            dead: None,
            stats: DirectionStats::default(),
            peer,
            reserved: 0,
            admitted,
        }
    }

    /// Changes the largest payloads accepted from now on.
    pub(crate) fn set_limits(&mut self, limits: FrameLimits) {
        self.buf.set_limits(limits);
    }

    /// Accepts frames up to the connection's configured maximum from now on.
    pub(crate) fn admit(&mut self) {
        self.buf.set_limits(self.admitted);
    }

    /// The next buffered frame. After the connection ended, frames that arrived before the end
    /// are still delivered, then the reason it ended. A protocol error is logged once.
    #[inline]
    pub(crate) fn take_frame(&mut self) -> Result<Option<Frame>, crate::RecvError> {
        match self.buf.next_frame() {
            Ok(Some(f)) => {
                self.stats.frames += 1;
                if self.reserved > 0 && self.buf.large_frame_under_way().is_none() {
                    budget::release(self.reserved);
                    self.reserved = 0;
                }
                Ok(Some(f))
            }
            Ok(None) => match self.dead {
                None => Ok(None),
                Some(d) => Err(self.error(d)),
            },
            Err(e) => Err(self.protocol(e)),
        }
    }

    /// Where the next read goes and how many bytes it may take; fails once the connection ended.
    pub(crate) fn read_buf(&mut self) -> Result<(&mut BytesMut, usize), crate::RecvError> {
        if let Some(d) = self.dead {
            return Err(self.error(d));
        }
        let n = match self.buf.prepare_read() {
            Ok(n) => n,
            Err(e) => return Err(self.protocol(e)),
        };
        if let Some(need) = self.buf.large_frame_under_way()
            && need > self.reserved
        {
            if let Err(in_use) = budget::reserve(need - self.reserved) {
                let dead = Dead::OverBudget { need, in_use, budget: budget::get() };
                tracing::warn!(peer = %self.peer, need, in_use, budget = budget::get(),
                    "closing connection: a frame under way would exceed the process's budget for partial frames ({})", budget::ENV);
                self.dead = Some(dead);
                return Err(self.error(dead));
            }
            self.reserved = need;
        }
        Ok((self.buf.buf_mut(), n))
    }

    /// Accounts a read of `n > 0` bytes.
    pub(crate) fn on_read(&mut self, n: usize) {
        self.stats.bytes += n as u64;
        self.stats.syscalls += 1;
    }

    /// The peer closed its side.
    pub(crate) fn on_eof(&mut self) -> crate::RecvError {
        let buffered = self.buf.buffered();
        let dead = if buffered == 0 {
            Dead::Closed
        } else {
            tracing::warn!(peer = %self.peer, buffered, "peer closed the connection in the middle of a frame");
            Dead::Truncated(buffered)
        };
        self.dead = Some(dead);
        self.error(dead)
    }

    /// A read failed.
    pub(crate) fn on_error(&mut self, source: std::io::Error) -> crate::RecvError {
        self.dead = Some(Dead::Failed);
        crate::RecvError::Io { peer: self.peer, source }
    }

    /// Whether the connection must be shut down because the peer sent garbage.
    pub(crate) fn is_poisoned(&self) -> bool {
        matches!(self.dead, Some(Dead::Protocol(_) | Dead::OverBudget { .. }))
    }

    fn protocol(&mut self, e: FrameError) -> crate::RecvError {
        if self.dead.is_none() {
            tracing::warn!(peer = %self.peer, error = %e, "closing connection: the peer sent data that is not daqflow framing");
        }
        self.dead = Some(Dead::Protocol(e));
        crate::RecvError::Protocol { peer: self.peer, source: e }
    }

    fn error(&self, d: Dead) -> crate::RecvError {
        let peer = self.peer;
        match d {
            Dead::Closed => crate::RecvError::Closed { peer },
            Dead::Truncated(buffered) => crate::RecvError::Truncated { peer, buffered },
            Dead::Protocol(source) => crate::RecvError::Protocol { peer, source },
            Dead::OverBudget { need, in_use, budget } => crate::RecvError::OverBudget { peer, need, in_use, budget },
            Dead::Failed => crate::RecvError::Io { peer, source: std::io::Error::other("an earlier read failed") },
        }
    }
}
