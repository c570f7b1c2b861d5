//! The send side of the framing core: a queue that coalesces small frames and gathers the
//! queued bytes for one vectored write. No I/O happens here.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use daqflow_wire::frame::{FRAME_HEADER_LEN, Frame, FrameHeader};

/// Most slices handed to one vectored write: Linux's `IOV_MAX`. A frame written from its own
/// memory takes two slices (its header and its payload), so a lower limit would cap the size of
/// a write of mid-size frames: with 64 slices, 4 KiB frames left 128 KiB per call and reached
/// 71% of the raw socket; with 1024 they reach 1 MiB per call and beat it (docs/transport.md).
pub const MAX_WRITE_SLICES: usize = 1024;

/// Frames waiting to be written, in order.
///
/// Small frames (payload up to `copy_threshold`) are copied with their headers into a staging
/// chunk of up to `coalesce_bytes`; a large frame's header ends the chunk and its payload is
/// queued as its own segment, written from its own memory. [`SendQueue::gather`] returns the
/// queued bytes as slices for one `writev`, [`SendQueue::advance`] consumes what was written.
///
/// ```
/// use bytes::Bytes;
/// use daqflow_transport::SendQueue;
/// use daqflow_wire::frame::Frame;
/// let mut q = SendQueue::new(1 << 20, 128 << 10, 2048);
/// for _ in 0..1000 {
///     q.push(Frame::new(1, Bytes::from_static(&[0u8; 64]))).unwrap();
/// }
/// let mut slices = Vec::new();
/// let bytes = q.gather(&mut slices);
/// assert_eq!(bytes, 1000 * 80);
/// assert_eq!(slices.len(), 1, "a thousand small frames are one contiguous write");
/// q.advance(bytes);
/// assert!(q.is_empty());
/// ```
#[derive(Debug)]
pub struct SendQueue {
    segments: VecDeque<Bytes>,
    staging: BytesMut,
    queued: usize,
    capacity: usize,
    coalesce_bytes: usize,
    max_write: usize,
    copy_threshold: usize,
    frames_queued: u64,
    /// Bytes queued just after a write found the socket full (`None`: the last write took all
    /// it was offered).
    full_at: Option<usize>,
}

impl SendQueue {
    /// A queue holding at most `capacity` bytes, coalescing into chunks of `coalesce_bytes`,
    /// copying payloads of at most `copy_threshold` bytes, gathering up to `coalesce_bytes` per
    /// write (see [`SendQueue::with_max_write`]).
    pub fn new(capacity: usize, coalesce_bytes: usize, copy_threshold: usize) -> Self {
        let coalesce_bytes = coalesce_bytes.max(FRAME_HEADER_LEN * 4);
        SendQueue {
            max_write: coalesce_bytes,
            segments: VecDeque::new(),
            staging: BytesMut::new(),
            queued: 0,
            capacity,
            coalesce_bytes,
            copy_threshold: copy_threshold.min(coalesce_bytes),
            frames_queued: 0,
            full_at: None,
        }
    }

    /// The same queue gathering up to `max_write` bytes per write.
    pub fn with_max_write(mut self, max_write: usize) -> Self {
        self.max_write = max_write.max(1);
        self
    }

    /// Bytes waiting (headers included).
    pub fn queued_bytes(&self) -> usize {
        self.queued
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// Frames accepted since the queue was made.
    pub fn frames_queued(&self) -> u64 {
        self.frames_queued
    }

    /// Whether a frame with `payload_len` bytes fits now. An empty queue takes any frame.
    pub fn has_room_for(&self, payload_len: usize) -> bool {
        self.queued == 0 || self.queued + FRAME_HEADER_LEN + payload_len <= self.capacity
    }

    /// Whether enough is queued to fill a write of the maximum size (the data-plane connection
    /// writes then without waiting for a flush). After a write found the socket full
    /// ([`SendQueue::note_write`]), only once another write's worth has been queued since: a
    /// sender that runs ahead of its reader then tries once per `max_write` bytes, not once per
    /// frame (with 1 KiB frames, a system call per frame was most of a source's time).
    pub fn wants_write(&self) -> bool {
        self.queued >= self.max_write && self.full_at.is_none_or(|at| self.queued >= at.saturating_add(self.max_write))
    }

    /// Records how a write went: `written` of the `offered` bytes (0 when the socket would have
    /// blocked), after [`SendQueue::advance`]. Less than offered means the socket is full.
    pub fn note_write(&mut self, offered: usize, written: usize) {
        self.full_at = (written < offered).then_some(self.queued);
    }

    /// Queues `frame`, or gives it back if the queue is full.
    pub fn push(&mut self, frame: Frame) -> Result<(), Frame> {
        if !self.has_room_for(frame.payload.len()) {
            return Err(frame);
        }
        self.push_unbounded(frame)
    }

    /// Queues `frame` whether or not the queue is full (the caller bounds the queue itself,
    /// e.g. by waiting for room afterwards). Never fails; returns `Ok` for symmetry with
    /// [`SendQueue::push`].
    pub fn push_unbounded(&mut self, frame: Frame) -> Result<(), Frame> {
        let len = frame.payload.len();
        let header = frame.header();
        if len <= self.copy_threshold {
            self.put_small(&header, &frame.payload);
        } else {
            self.reserve_staging(FRAME_HEADER_LEN);
            self.staging.put_slice(&header.encode());
            self.segments.push_back(self.staging.split().freeze());
            self.segments.push_back(frame.payload);
        }
        self.queued += FRAME_HEADER_LEN + len;
        self.frames_queued += 1;
        Ok(())
    }

    /// Queues a frame whose payload is `prefix` followed by `payload`, whether or not the queue
    /// is full: the small prefix (a sequence number, a sub-header) is copied next to the frame
    /// header, and a large `payload` is written from its own memory. The receiver sees one
    /// contiguous payload.
    pub fn push_prefixed_unbounded(&mut self, kind: u16, flags: u8, channel: u32, prefix: &[u8], payload: Bytes) {
        let len = prefix.len() + payload.len();
        let header = FrameHeader { kind, flags, channel, len: u32::try_from(len).unwrap_or(u32::MAX) };
        if len <= self.copy_threshold {
            let n = FRAME_HEADER_LEN + len;
            if self.staging.len() + n > self.coalesce_bytes && !self.staging.is_empty() {
                self.segments.push_back(self.staging.split().freeze());
            }
            self.reserve_staging(n);
            self.staging.put_slice(&header.encode());
            self.staging.put_slice(prefix);
            self.staging.put_slice(&payload);
        } else {
            self.reserve_staging(FRAME_HEADER_LEN + prefix.len());
            self.staging.put_slice(&header.encode());
            self.staging.put_slice(prefix);
            self.segments.push_back(self.staging.split().freeze());
            self.segments.push_back(payload);
        }
        self.queued += FRAME_HEADER_LEN + len;
        self.frames_queued += 1;
    }

    /// Queues a frame whose payload is `prefix` followed by every part of `parts`, whether or not
    /// the queue is full: small parts are copied into the coalescing chunk, parts above the copy
    /// threshold are written from their own memory. The receiver sees one contiguous payload
    /// (a readout unit sends a super-fragment header and the fragments it holds this way).
    pub fn push_parts_unbounded(&mut self, kind: u16, flags: u8, channel: u32, prefix: &[u8], parts: &[Bytes]) {
        let len = prefix.len() + parts.iter().map(Bytes::len).sum::<usize>();
        let header = FrameHeader { kind, flags, channel, len: u32::try_from(len).unwrap_or(u32::MAX) };
        let n = FRAME_HEADER_LEN + prefix.len();
        if self.staging.len() + n > self.coalesce_bytes && !self.staging.is_empty() {
            self.segments.push_back(self.staging.split().freeze());
        }
        self.reserve_staging(n);
        self.staging.put_slice(&header.encode());
        self.staging.put_slice(prefix);
        for part in parts {
            if part.len() <= self.copy_threshold {
                if self.staging.len() + part.len() > self.coalesce_bytes && !self.staging.is_empty() {
                    self.segments.push_back(self.staging.split().freeze());
                }
                self.reserve_staging(part.len());
                self.staging.put_slice(part);
            } else {
                if !self.staging.is_empty() {
                    self.segments.push_back(self.staging.split().freeze());
                }
                self.segments.push_back(part.clone());
            }
        }
        self.queued += FRAME_HEADER_LEN + len;
        self.frames_queued += 1;
    }

    /// Queues a frame whose payload is copied from `payload` (no `Bytes` needed for small
    /// messages), or returns `false` if the queue is full.
    pub fn push_slice(&mut self, kind: u16, flags: u8, channel: u32, payload: &[u8]) -> bool {
        if !self.has_room_for(payload.len()) {
            return false;
        }
        let Ok(len) = u32::try_from(payload.len()) else { return false };
        let header = FrameHeader { kind, flags, channel, len };
        if payload.len() <= self.copy_threshold {
            self.put_small(&header, payload);
        } else {
            self.reserve_staging(FRAME_HEADER_LEN);
            self.staging.put_slice(&header.encode());
            self.segments.push_back(self.staging.split().freeze());
            self.segments.push_back(Bytes::copy_from_slice(payload));
        }
        self.queued += FRAME_HEADER_LEN + payload.len();
        self.frames_queued += 1;
        true
    }

    /// Queues a frame whose payload is the concatenation of `parts`, copied (no `Bytes` needed:
    /// a producer assembles a small frame from a header and data it holds without allocating),
    /// or returns `false` if the queue is full.
    pub fn push_slices(&mut self, kind: u16, flags: u8, channel: u32, parts: &[&[u8]]) -> bool {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if !self.has_room_for(len) {
            return false;
        }
        let Ok(len32) = u32::try_from(len) else { return false };
        let header = FrameHeader { kind, flags, channel, len: len32 };
        let n = FRAME_HEADER_LEN + len;
        if len <= self.copy_threshold {
            if self.staging.len() + n > self.coalesce_bytes && !self.staging.is_empty() {
                self.segments.push_back(self.staging.split().freeze());
            }
            self.reserve_staging(n);
            self.staging.put_slice(&header.encode());
            for p in parts {
                self.staging.put_slice(p);
            }
        } else {
            self.reserve_staging(FRAME_HEADER_LEN);
            self.staging.put_slice(&header.encode());
            self.segments.push_back(self.staging.split().freeze());
            let mut whole = BytesMut::with_capacity(len);
            for p in parts {
                whole.put_slice(p);
            }
            self.segments.push_back(whole.freeze());
        }
        self.queued += n;
        self.frames_queued += 1;
        true
    }

    #[inline]
    fn put_small(&mut self, header: &FrameHeader, payload: &[u8]) {
        let n = FRAME_HEADER_LEN + payload.len();
        if self.staging.len() + n > self.coalesce_bytes && !self.staging.is_empty() {
            // The chunk is full: it becomes a segment and a new chunk starts.
            self.segments.push_back(self.staging.split().freeze());
        }
        self.reserve_staging(n);
        self.staging.put_slice(&header.encode());
        self.staging.put_slice(payload);
    }

    #[inline]
    fn reserve_staging(&mut self, n: usize) {
        if self.staging.capacity() - self.staging.len() < n {
            // Reclaims the previous chunk when everything written from it has been dropped.
            self.staging.reserve(n.max(self.coalesce_bytes));
        }
    }

    /// Fills `out` with slices of the queued bytes, in order, for one vectored write: at most
    /// [`MAX_WRITE_SLICES`] slices, stopping once the maximum write size is gathered (the
    /// first slice is always taken whole). Returns the number of bytes gathered.
    pub fn gather<'a>(&'a self, out: &mut Vec<IoSlice<'a>>) -> usize {
        out.clear();
        let mut total = 0;
        for seg in &self.segments {
            if out.len() == MAX_WRITE_SLICES || (total >= self.max_write && !out.is_empty()) {
                return total;
            }
            out.push(IoSlice::new(seg));
            total += seg.len();
        }
        if !self.staging.is_empty() && out.len() < MAX_WRITE_SLICES && (total < self.max_write || out.is_empty()) {
            out.push(IoSlice::new(&self.staging));
            total += self.staging.len();
        }
        total
    }

    /// Takes up to about `max_bytes` of queued data out as owned segments, in order (for a
    /// writer that must not borrow the queue while it writes, such as an async task).
    pub fn take(&mut self, max_bytes: usize, out: &mut Vec<Bytes>) -> usize {
        out.clear();
        let mut total = 0;
        while let Some(seg) = self.segments.front() {
            if out.len() == MAX_WRITE_SLICES || (total >= max_bytes && !out.is_empty()) {
                break;
            }
            total += seg.len();
            out.extend(self.segments.pop_front());
        }
        if !self.staging.is_empty() && out.len() < MAX_WRITE_SLICES && (total < max_bytes || out.is_empty()) {
            total += self.staging.len();
            out.push(self.staging.split().freeze());
        }
        self.queued -= total;
        total
    }

    /// Consumes `n` written bytes from the front of the queue.
    ///
    /// # Panics
    /// If `n` is more than is queued (a bug in the caller, never input).
    pub fn advance(&mut self, mut n: usize) {
        assert!(n <= self.queued, "advance({n}) past the {} queued bytes", self.queued);
        self.queued -= n;
        while n > 0 {
            match self.segments.front_mut() {
                Some(seg) if seg.len() <= n => {
                    n -= seg.len();
                    self.segments.pop_front();
                }
                Some(seg) => {
                    seg.advance(n);
                    n = 0;
                }
                None => {
                    self.staging.advance(n);
                    n = 0;
                }
            }
        }
        if self.staging.is_empty() && self.segments.is_empty() {
            // Start the next chunk at the beginning of the buffer when it is free again.
            self.staging.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use daqflow_wire::frame::FrameCodec;

    fn drain(q: &mut SendQueue, write_sizes: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut i = 0;
        while !q.is_empty() {
            let mut slices = Vec::new();
            let avail = q.gather(&mut slices);
            assert!(avail > 0);
            let want = write_sizes[i % write_sizes.len()].min(avail);
            i += 1;
            let mut left = want;
            for s in &slices {
                let take = left.min(s.len());
                out.extend_from_slice(&s[..take]);
                left -= take;
                if left == 0 {
                    break;
                }
            }
            q.advance(want);
        }
        out
    }

    #[test]
    fn mixed_frames_come_out_in_order_whatever_the_partial_writes() {
        let codec = FrameCodec::default();
        let frames: Vec<Frame> = (0..200u32)
            .map(|i| {
                let len = match i % 5 {
                    0 => 0,
                    1 => 10,
                    2 => 3000,
                    3 => 100_000,
                    _ => 2048,
                };
                Frame::new(i as u16, Bytes::from(vec![i as u8; len])).with_channel(i)
            })
            .collect();
        for sizes in [&[usize::MAX][..], &[1, 7, 100, 65536], &[13]] {
            let mut q = SendQueue::new(usize::MAX, 128 << 10, 2048);
            for f in &frames {
                q.push(f.clone()).unwrap();
            }
            let wire = drain(&mut q, sizes);
            let mut buf = BytesMut::from(&wire[..]);
            let mut back = Vec::new();
            while let Some(f) = codec.decode(&mut buf).unwrap() {
                back.push(f);
            }
            assert_eq!(back, frames);
        }
    }

    #[test]
    fn after_a_short_write_the_next_eager_write_waits_for_another_full_write() {
        let mut q = SendQueue::new(1 << 20, 4096, 2048).with_max_write(4096);
        let frame = || Frame::new(1, Bytes::from(vec![7u8; 1008])); // 1 KiB with its header
        while !q.wants_write() {
            q.push(frame()).unwrap();
        }
        let mut slices = Vec::new();
        let offered = q.gather(&mut slices);
        drop(slices);
        // The socket took 100 bytes: it is full. The next frames do not try again...
        q.advance(100);
        q.note_write(offered, 100);
        let at = q.queued_bytes();
        assert!(!q.wants_write());
        for _ in 0..3 {
            q.push(frame()).unwrap();
            assert!(!q.wants_write(), "{} bytes queued since the socket was full", q.queued_bytes() - at);
        }
        // ... until another full write's worth is queued.
        q.push(frame()).unwrap();
        assert!(q.wants_write());
        // A write that took all it was offered forgets the full socket.
        let mut slices = Vec::new();
        let offered = q.gather(&mut slices);
        drop(slices);
        q.advance(offered);
        q.note_write(offered, offered);
        while q.queued_bytes() < 4096 {
            q.push(frame()).unwrap();
        }
        assert!(q.wants_write());
    }

    #[test]
    fn large_payloads_are_not_copied() {
        let big = Bytes::from(vec![1u8; 100_000]);
        let mut q = SendQueue::new(usize::MAX, 128 << 10, 2048);
        q.push(Frame::new(1, big.clone())).unwrap();
        let mut slices = Vec::new();
        q.gather(&mut slices);
        assert_eq!(slices.len(), 2);
        assert_eq!(slices[1].as_ptr(), big.as_ptr(), "the payload is written from its own memory");
    }

    #[test]
    fn a_full_queue_gives_the_frame_back() {
        let mut q = SendQueue::new(1000, 128 << 10, 2048);
        q.push(Frame::new(1, Bytes::from(vec![0u8; 2000]))).unwrap(); // empty queue takes anything
        let f = Frame::new(2, Bytes::from_static(b"x"));
        assert_eq!(q.push(f.clone()), Err(f));
        assert!(!q.push_slice(3, 0, 0, b"y"));
        let mut v = Vec::new();
        q.take(usize::MAX, &mut v);
        assert!(q.is_empty());
        assert!(q.push_slice(3, 0, 0, b"y"));
    }

    #[test]
    fn chunks_are_bounded_by_the_coalescing_size() {
        let mut q = SendQueue::new(usize::MAX, 4096, 2048);
        for _ in 0..1000 {
            assert!(q.push_slice(1, 0, 0, &[0u8; 100]));
        }
        let mut slices = Vec::new();
        let n = q.gather(&mut slices);
        assert!(slices.iter().all(|s| s.len() <= 4096));
        assert!((4096..4096 + 4096).contains(&n), "gathered {n}");
    }

    #[test]
    fn gathered_frames_arrive_contiguous_and_large_parts_are_not_copied() {
        let codec = FrameCodec::default();
        let big = Bytes::from(vec![7u8; 10_000]);
        let small = Bytes::from_static(b"small part");
        for sizes in [&[usize::MAX][..], &[1, 7, 100, 65536], &[13]] {
            let mut q = SendQueue::new(usize::MAX, 4096, 2048);
            q.push_slice(9, 0, 0, b"before");
            q.push_parts_unbounded(5, 1, 3, b"HDR", &[small.clone(), big.clone(), small.clone(), Bytes::new()]);
            q.push_parts_unbounded(6, 0, 0, b"", &[]);
            if sizes[0] == usize::MAX {
                let mut slices = Vec::new();
                q.gather(&mut slices);
                assert!(
                    slices.iter().any(|s| s.as_ptr() == big.as_ptr()),
                    "the large part is written from its own memory"
                );
            }
            let wire = drain(&mut q, sizes);
            let mut buf = BytesMut::from(&wire[..]);
            let a = codec.decode(&mut buf).unwrap().unwrap();
            let b = codec.decode(&mut buf).unwrap().unwrap();
            let c = codec.decode(&mut buf).unwrap().unwrap();
            assert_eq!(&a.payload[..], b"before");
            let mut want = b"HDR".to_vec();
            want.extend_from_slice(&small);
            want.extend_from_slice(&big);
            want.extend_from_slice(&small);
            assert_eq!((b.kind, b.flags, b.channel), (5, 1, 3));
            assert_eq!(&b.payload[..], &want[..]);
            assert_eq!((c.kind, c.payload.len()), (6, 0));
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn frames_from_slices_arrive_whole_small_or_large() {
        let codec = FrameCodec::default();
        let mut q = SendQueue::new(usize::MAX, 4096, 2048);
        let big = vec![3u8; 5000];
        assert!(q.push_slices(1, 0, 9, &[b"head", b"tail"]));
        assert!(q.push_slices(2, 0, 0, &[b"H", &big]));
        assert!(q.push_slices(3, 0, 0, &[]));
        let wire = drain(&mut q, &[7, 1000]);
        let mut buf = BytesMut::from(&wire[..]);
        let a = codec.decode(&mut buf).unwrap().unwrap();
        let b = codec.decode(&mut buf).unwrap().unwrap();
        let c = codec.decode(&mut buf).unwrap().unwrap();
        assert_eq!((a.kind, a.channel, &a.payload[..]), (1, 9, &b"headtail"[..]));
        assert_eq!(b.payload.len(), 5001);
        assert_eq!(&b.payload[..1], b"H");
        assert_eq!(c.payload.len(), 0);
        let mut full = SendQueue::new(10, 4096, 2048);
        assert!(full.push_slices(1, 0, 0, &[&[0u8; 20]]), "an empty queue takes anything");
        assert!(!full.push_slices(1, 0, 0, &[b"x"]));
    }
}
