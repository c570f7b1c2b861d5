//! The repeater's `splice(2)` forwarding (`forward = "splice"`, an option): the data of large
//! chunks goes from the upstream socket into a pipe and from the pipe into the downstream
//! socket as references to the kernel's pages, never through this process's memory. On
//! loopback that removes both copies a forwarding process otherwise makes (socket → user
//! buffer → socket), and yet it was measured slower than the transport path on the reference
//! machine: the pages travel through megabytes of queues and pipe, so the generator's and the
//! sink's copies miss the cache, and the transmit path costs more per byte
//! (`docs/performance.md`, chain). The suite `daqflow bench chain` measures it in every run.
//!
//! The frames stay daqflow frames and every one is checked on the way ([`StreamCheck`]): the
//! repeater reads frame and chunk headers into its buffer (reading no further than the headers
//! after a large chunk, so that the next chunk's data is left in the socket to be spliced),
//! and small frames (data under `splice_min_bytes`) are read in large batches into the buffer.
//! Headers and small frames are written from the buffer into the same pipe, so that the pipe
//! holds the output in order, and the pipe is emptied into the downstream in large batches.

use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;

use daqflow_transport::Connection;
use daqflow_wire::frame::{DEFAULT_MAX_FRAME_LEN, FRAME_HEADER_LEN, FrameHeader};

use super::Broken;
use crate::link::{Cut, Live, TICK, wait};
use crate::protocol::{CHUNK_HEADER_LEN, KIND_CHUNK, StreamCheck, StreamEvent};

/// Frame header and chunk header: what is read of a chunk whose data is spliced.
const HEADS: usize = FRAME_HEADER_LEN + CHUNK_HEADER_LEN;

/// Sizes of the splice forwarder.
#[derive(Debug, Clone, Copy)]
pub(super) struct SpliceSizes {
    /// Chunks with at least this much data are spliced; smaller frames go through the buffer.
    pub min_bytes: usize,
    /// Requested pipe capacity (`F_SETPIPE_SZ`), and the bytes gathered in the pipe before it
    /// is emptied into the downstream.
    pub pipe_bytes: usize,
    /// Buffer the headers and small frames are read into.
    pub buffer_bytes: usize,
}

/// A pipe between the two sockets.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl Pipe {
    fn new(size: usize) -> io::Result<Pipe> {
        let mut fds: [libc::c_int; 2] = [0; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded: both descriptors are new, open and owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let want = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
        // SAFETY: fcntl on a descriptor we own; a refused size (above fs.pipe-max-size for an
        // unprivileged process) leaves the pipe as it was, which we read back below.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
        // SAFETY: as above.
        let capacity = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ) };
        Ok(Pipe { read, write, capacity: usize::try_from(capacity).ok().filter(|&c| c > 0).unwrap_or(64 << 10) })
    }
}

fn retry<T>(mut f: impl FnMut() -> isize, ok: impl Fn(usize) -> T) -> io::Result<T> {
    loop {
        let n = f();
        if n >= 0 {
            return Ok(ok(n as usize));
        }
        let e = io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Moves up to `len` bytes from `from` to `to` without waiting; `more`: more data follows.
fn splice(from: RawFd, to: RawFd, len: usize, more: bool) -> io::Result<usize> {
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK | if more { libc::SPLICE_F_MORE } else { 0 };
    // SAFETY: both descriptors are open for the duration of the call (the caller owns them);
    // null offsets are required for pipes and sockets.
    retry(|| unsafe { libc::splice(from, std::ptr::null_mut(), to, std::ptr::null_mut(), len, flags) }, |n| n)
}

/// Reads into `buf` without waiting; 0 is the end of the stream.
fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes during the call.
    retry(|| unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) }, |n| n)
}

/// Writes from `buf` into a pipe without waiting.
fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for reads of `buf.len()` bytes during the call.
    retry(|| unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) }, |n| n)
}

/// Where the forwarder stands. The buffer holds, in order: bytes parsed and not yet put into
/// the pipe (`out..parsed`), bytes read and not yet parsed (`parsed..end`).
struct Forwarder {
    buf: Vec<u8>,
    out: usize,
    parsed: usize,
    end: usize,
    /// Bytes of the current large chunk still to move from the upstream into the pipe.
    splice_left: usize,
    /// Bytes in the pipe (at most the pipe's capacity in bytes, although the kernel counts
    /// its capacity in pages and may take more).
    in_pipe: usize,
    /// The last frame was spliced: read no further than the next headers.
    large: bool,
    /// The end marker was parsed: nothing more is read.
    ended: bool,
    /// Bytes the parser needs before it can go on (0: it can go on).
    need: usize,
}

/// Why [`Forwarder::fill`] stopped.
#[derive(PartialEq, Eq)]
enum Stalled {
    /// The upstream has nothing more now.
    Input,
    /// The pipe is full.
    Pipe,
    /// The end marker is in the pipe.
    Ended,
}

/// Forwards from `up` to `down` until the end marker has been passed on and the sending
/// direction shut down.
///
/// Everything goes through the pipe, in order: headers and small frames are written into it
/// from the buffer, the data of large chunks is spliced into it from the upstream socket.
/// The pipe is emptied into the downstream socket whenever the input stalls (nothing more
/// to read now, or the pipe is full): the downstream then gets large writes, and its reader
/// few wake-ups, as with the transport's 1 MiB writes.
pub(super) fn forward(
    up: &Connection,
    down: &Connection,
    check: &mut StreamCheck,
    live: &Live,
    sizes: SpliceSizes,
) -> Result<(), Broken> {
    let peer = up.peer_addr();
    let (u, d) = (up.as_raw_fd(), down.as_raw_fd());
    let pipe = Pipe::new(sizes.pipe_bytes).map_err(|e| Broken::Upstream(format!("creating a pipe: {e}")))?;
    let min_bytes = sizes.min_bytes.max(1);
    let mut f = Forwarder {
        buf: vec![0u8; sizes.buffer_bytes.max(min_bytes + HEADS).max(64 << 10)],
        out: 0,
        parsed: 0,
        end: 0,
        splice_left: 0,
        in_pipe: 0,
        large: false,
        ended: false,
        need: FRAME_HEADER_LEN,
    };
    loop {
        if live.abandon.load(Ordering::Relaxed) {
            return Err(Broken::Cut(Cut::Abandoned));
        }
        let (stalled, mut progress) = f.fill(u, &pipe, check, min_bytes, pipe.capacity, peer)?;
        live.observe(check);
        while f.in_pipe > 0 {
            match splice(pipe.read.as_raw_fd(), d, f.in_pipe, f.splice_left > 0) {
                Ok(n) => {
                    f.in_pipe -= n;
                    progress |= n > 0;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(Broken::Cut(Cut::Failed(e.to_string()))),
            }
        }
        if stalled == Stalled::Ended && f.in_pipe == 0 {
            // SAFETY: shutdown(2) on the downstream socket, which `down` keeps open.
            if unsafe { libc::shutdown(d, libc::SHUT_WR) } < 0 {
                return Err(Broken::Cut(Cut::Failed(io::Error::last_os_error().to_string())));
            }
            return Ok(());
        }
        if !progress {
            let read = (stalled == Stalled::Input).then_some(u);
            let write = (f.in_pipe > 0).then_some(d);
            wait(read, write, TICK).map_err(|e| Broken::Upstream(format!("waiting for data: {e}")))?;
        }
    }
}

impl Forwarder {
    /// Moves input into the pipe until the upstream has nothing more, the pipe is full or the
    /// end marker is in; and whether anything moved.
    fn fill(
        &mut self,
        u: RawFd,
        pipe: &Pipe,
        check: &mut StreamCheck,
        min_bytes: usize,
        batch: usize,
        peer: std::net::SocketAddr,
    ) -> Result<(Stalled, bool), Broken> {
        let mut progress = false;
        loop {
            // Parsed bytes first: they come before the data of the chunk they head.
            if self.out < self.parsed {
                match write(pipe.write.as_raw_fd(), &self.buf[self.out..self.parsed]) {
                    Ok(n) => {
                        self.out += n;
                        self.in_pipe += n;
                        progress |= n > 0;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok((Stalled::Pipe, progress)),
                    Err(e) => return Err(Broken::Upstream(format!("writing into the pipe: {e}"))),
                }
                if self.out < self.parsed {
                    return Ok((Stalled::Pipe, progress));
                }
            }
            if self.splice_left > 0 {
                if self.in_pipe >= batch {
                    return Ok((Stalled::Pipe, progress));
                }
                match splice(u, pipe.write.as_raw_fd(), self.splice_left.min(batch - self.in_pipe), true) {
                    Ok(0) => {
                        return Err(Broken::Upstream(format!(
                            "upstream {peer} closed the connection in the middle of chunk {}",
                            check.chunks()
                        )));
                    }
                    Ok(n) => {
                        self.splice_left -= n;
                        self.in_pipe += n;
                        progress = true;
                        continue;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        // The upstream has nothing more now, or the pipe is full (the kernel
                        // counts pages, not bytes): with data in the pipe, empty it first,
                        // rather than wake up for an upstream that is readable all along.
                        let stalled = if self.in_pipe > 0 { Stalled::Pipe } else { Stalled::Input };
                        return Ok((stalled, progress));
                    }
                    Err(e) => return Err(Broken::Upstream(format!("upstream {peer}: {e}"))),
                }
            }
            if self.ended {
                return Ok((Stalled::Ended, progress));
            }
            self.parse(check, min_bytes, peer)?;
            if self.out < self.parsed || self.splice_left > 0 || self.ended {
                continue;
            }
            if !self.read(u, check, peer)? {
                return Ok((Stalled::Input, progress));
            }
            progress = true;
        }
    }

    /// Parses whole frames (and the headers of a large chunk) out of `parsed..end`.
    fn parse(&mut self, check: &mut StreamCheck, min_bytes: usize, peer: std::net::SocketAddr) -> Result<(), Broken> {
        let bad = |e: &dyn std::fmt::Display| Broken::Upstream(format!("upstream {peer} sent {e}; connection closed"));
        self.need = 0;
        while !self.ended {
            let avail = &self.buf[self.parsed..self.end];
            let Some(h) = avail.first_chunk::<FRAME_HEADER_LEN>() else {
                self.need = FRAME_HEADER_LEN - avail.len();
                return Ok(());
            };
            let header = FrameHeader::decode(h, DEFAULT_MAX_FRAME_LEN)
                .map_err(|e| Broken::Upstream(format!("upstream {peer} sent invalid data, connection closed: {e}")))?;
            let payload = header.len as usize;
            let total = FRAME_HEADER_LEN + payload;
            if header.kind == KIND_CHUNK && payload >= min_bytes {
                if avail.len() < HEADS {
                    self.need = HEADS - avail.len();
                    return Ok(());
                }
                check
                    .on_head(header.kind, header.flags, &avail[FRAME_HEADER_LEN..HEADS], payload)
                    .map_err(|e| bad(&e))?;
                let have = avail.len().min(total);
                self.parsed += have;
                self.splice_left = total - have;
                self.large = true;
                return Ok(());
            }
            if total > self.buf.len() {
                // Not a small frame this repeater can hold: the check names what is wrong.
                let head = &avail[FRAME_HEADER_LEN..];
                check.on_head(header.kind, header.flags, head, payload).map_err(|e| bad(&e))?;
                return Err(bad(&format!("a frame of {payload} bytes that is neither a marker nor a chunk")));
            }
            if avail.len() < total {
                self.need = total - avail.len();
                self.large = false;
                return Ok(());
            }
            let event = check
                .on_head(header.kind, header.flags, &avail[FRAME_HEADER_LEN..total], payload)
                .map_err(|e| bad(&e))?;
            self.parsed += total;
            self.large = false;
            self.ended = event == StreamEvent::End;
        }
        Ok(())
    }

    /// Reads from the upstream into the buffer: after a large chunk only up to the next
    /// headers, else as much as fits. Whether anything was read.
    fn read(&mut self, u: RawFd, check: &StreamCheck, peer: std::net::SocketAddr) -> Result<bool, Broken> {
        if self.out == self.parsed && self.parsed > 0 {
            // Everything parsed was written: move the partial frame to the front.
            self.buf.copy_within(self.parsed..self.end, 0);
            self.end -= self.parsed;
            (self.out, self.parsed) = (0, 0);
        }
        let room = self.buf.len() - self.end;
        let want = if self.large { (HEADS.saturating_sub(self.end - self.parsed)).max(self.need) } else { room };
        let want = want.min(room);
        if want == 0 {
            return Ok(false); // the buffer is full of bytes still to be written
        }
        match recv(u, &mut self.buf[self.end..self.end + want]) {
            Ok(0) if self.end == self.parsed => Err(Broken::Upstream(format!(
                "upstream {peer} closed the connection without an end marker after chunk {}",
                check.chunks()
            ))),
            Ok(0) => Err(Broken::Upstream(format!(
                "upstream {peer} closed the connection in the middle of a frame (after chunk {})",
                check.chunks()
            ))),
            Ok(n) => {
                self.end += n;
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(Broken::Upstream(format!("upstream {peer}: {e}"))),
        }
    }
}
