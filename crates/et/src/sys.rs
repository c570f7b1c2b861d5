//! The operating-system layer: anonymous shared memory (memfd), futexes, file-descriptor
//! passing over Unix sockets, and process liveness. Everything unsafe
//! in the crate's shared-memory handling starts here.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// A memory file: anonymous shared memory with no name in any filesystem. The kernel frees it
/// when the last descriptor and mapping are gone, so a crash leaves nothing behind.
pub(crate) fn memfd(name: &str, len: u64) -> io::Result<OwnedFd> {
    let cname = CString::new(name).map_err(|_| io::Error::other("memfd name with a NUL byte"))?;
    // SAFETY: `cname` is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on a valid descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A shared mapping of a memory file.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all access to its contents goes through atomics
// or through the ownership protocol of the ET system (a queue lock hands an event to exactly one
// owner), so sharing the handle between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd`, readable and writable, shared with every other mapping, with
    /// every page faulted in now (the pool).
    ///
    /// MAP_POPULATE: every page is faulted in now, once, instead of one page fault per 4 KiB
    /// the first time each process touches an event while data flows (tens of thousands of
    /// faults for a 200 MB pool, in every producer and consumer). On a memory file this also
    /// **allocates** every page (a shared mapping has no zero page; even a read fault
    /// allocates), so it is only for memory that is meant to be used whole.
    pub(crate) fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        Self::map_with(fd, len, libc::MAP_SHARED | libc::MAP_POPULATE)
    }

    /// Maps `len` bytes of `fd` like [`Mapping::map`] but faults nothing in: a page of the
    /// memory file is allocated only when some process first touches it (large events, whose
    /// size a client chooses: nothing is committed for the bytes it never writes).
    pub(crate) fn map_lazy(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        Self::map_with(fd, len, libc::MAP_SHARED)
    }

    fn map_with(fd: &OwnedFd, len: usize, flags: libc::c_int) -> io::Result<Mapping> {
        // SAFETY: mmap of a valid descriptor with a length the caller sized the file to; the
        // result is checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the region mmap returned, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
/// Bytes of memory a memory file occupies: the pages allocated to it (written, or faulted in).
pub(crate) fn allocated_bytes(fd: &OwnedFd) -> io::Result<u64> {
    // SAFETY: `st` is a properly sized, zeroed stat buffer; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a valid descriptor with a valid out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_blocks as u64 * 512)
}

/// Size of a file descriptor's file.
pub(crate) fn file_len(fd: &OwnedFd) -> io::Result<u64> {
    // SAFETY: `st` is a properly sized, zeroed stat buffer; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a valid descriptor with a valid out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_size as u64)
}

/// Waits while `word` holds `expected`, at most `timeout`; may return early (spuriously).
/// The futex is not private: it works across processes sharing the memory.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout
        .map(|d| libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT reads the 32-bit word at a valid, aligned address that lives for the
    // call (it is borrowed); the timeout pointer is null or points to a live timespec.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, tsp, std::ptr::null::<u32>(), 0);
    }
}

/// Wakes up to `n` waiters on `word`.
pub(crate) fn futex_wake(word: &AtomicU32, n: u32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned address; no memory is read or written by us.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            n.min(i32::MAX as u32),
            std::ptr::null::<u32>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}

/// Whether process `pid` exists.
/// Whether process `pid` has ended: gone, or a zombie not yet reaped (which `pid_alive` counts
/// as alive; a queue lock it held will never be released).
pub(crate) fn pid_gone(pid: u32) -> bool {
    if !pid_alive(pid) {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold any byte.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| matches!(rest.trim_start().as_bytes().first(), Some(b'Z' | b'X'))),
        Err(_) => !pid_alive(pid),
    }
}

pub(crate) fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Sends SIGKILL to process `pid`.
pub(crate) fn kill(pid: u32) {
    // 0, -1 and negative ids name process groups or everything: never those, never ourselves.
    if pid <= 1 || pid > i32::MAX as u32 || pid == getpid() {
        return;
    }
    // SAFETY: sending a signal to one process id; no memory is involved.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
}

/// Who is on the other end of a Unix socket, from the kernel (SO_PEERCRED): the credentials
/// the peer had when it connected, not what it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerCred {
    pub pid: u32,
    pub uid: u32,
}

/// The credentials of the peer of a Unix socket (SO_PEERCRED).
pub(crate) fn peer_cred(sock: &UnixStream) -> io::Result<PeerCred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which is that large.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let pid =
        u32::try_from(cred.pid).ok().filter(|&p| p > 0).ok_or_else(|| io::Error::other("peer has no process id"))?;
    Ok(PeerCred { pid, uid: cred.uid })
}

/// This process's effective user id.
pub(crate) fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// This process's id.
pub(crate) fn getpid() -> u32 {
    std::process::id()
}

/// Writes all of `data` on a Unix socket, with `fd` attached (SCM_RIGHTS) if given.
pub(crate) fn send_with_fd(sock: &UnixStream, data: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // Room for one descriptor's control message.
    let mut cbuf = [0u64; 4];
    // SAFETY: msghdr is a plain C struct; zeroed is a valid initial value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE/LEN are pure size computations.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        assert!(space <= std::mem::size_of_val(&cbuf));
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points to `space` bytes of our buffer, enough for one header
        // and one descriptor; CMSG_FIRSTHDR returns a pointer into it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        }
    }
    let mut sent = 0usize;
    while sent < data.len() {
        if sent > 0 {
            // The descriptor went with the first part.
            msg.msg_control = std::ptr::null_mut();
            msg.msg_controllen = 0;
            iov.iov_base = data[sent..].as_ptr() as *mut libc::c_void;
            iov.iov_len = data.len() - sent;
            msg.msg_iov = &mut iov;
        }
        // SAFETY: `msg` points to live iovec and control buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += n as usize;
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes from a Unix socket, collecting a descriptor passed with them.
/// `Ok(None)`-style end of stream is reported as `UnexpectedEof`.
pub(crate) fn recv_with_fd(sock: &UnixStream, buf: &mut [u8]) -> io::Result<Option<OwnedFd>> {
    let mut got = 0usize;
    let mut fd_out = None;
    while got < buf.len() {
        let mut iov = libc::iovec { iov_base: buf[got..].as_mut_ptr().cast(), iov_len: buf.len() - got };
        let mut cbuf = [0u64; 4];
        // SAFETY: msghdr is a plain C struct; zeroed is a valid initial value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        // SAFETY: `msg` points to live buffers of the stated sizes for the duration of the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += n as usize;
        // SAFETY: the kernel filled `msg`'s control area; CMSG_FIRSTHDR/NXTHDR walk it within
        // msg_controllen, and CMSG_DATA points at the descriptors of an SCM_RIGHTS message,
        // as many as its length says. Every one of them is now ours: each is taken into an
        // OwnedFd (the first kept, any other closed), so that a peer sending several leaks none
        // into this process.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(cmsg);
                    let bytes = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                    for k in 0..bytes / std::mem::size_of::<RawFd>() {
                        let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(k));
                        let fd = OwnedFd::from_raw_fd(fd);
                        if fd_out.is_none() {
                            fd_out = Some(fd);
                        }
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
    }
    Ok(fd_out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_memfd_mapped_twice_shares_its_bytes() {
        let fd = memfd("test", 8192).unwrap();
        let a = Mapping::map(&fd, 8192).unwrap();
        let b = Mapping::map(&fd, 8192).unwrap();
        // SAFETY: both mappings are 8192 bytes long; offset 100 is inside.
        unsafe {
            *a.base().add(100) = 42;
            assert_eq!(*b.base().add(100), 42);
        }
        assert_eq!(file_len(&fd).unwrap(), 8192);
    }

    #[test]
    fn a_lazy_mapping_allocates_only_the_pages_touched_and_a_populated_one_all() {
        const LEN: usize = 64 << 20;
        let fd = memfd("lazy", LEN as u64).unwrap();
        let lazy = Mapping::map_lazy(&fd, LEN).unwrap();
        assert_eq!(allocated_bytes(&fd).unwrap(), 0, "sizing and mapping allocate nothing");
        // SAFETY: offsets 0 and 10 MiB are inside the mapping.
        unsafe {
            *lazy.base() = 1;
            *lazy.base().add(10 << 20) = 2;
        }
        // Two pages written, two pages allocated (two huge pages where shmem uses them).
        let touched = allocated_bytes(&fd).unwrap();
        assert!((2 * 4096..=2 * (2 << 20)).contains(&touched), "{touched} bytes allocated");
        let populated = Mapping::map(&fd, LEN).unwrap();
        assert_eq!(allocated_bytes(&fd).unwrap(), LEN as u64, "MAP_POPULATE allocates the whole file");
        // SAFETY: offset 10 MiB is inside both mappings of the same file.
        assert_eq!(unsafe { *populated.base().add(10 << 20) }, 2);
    }

    #[test]
    fn a_descriptor_travels_over_a_unix_socket() {
        let (x, y) = UnixStream::pair().unwrap();
        let fd = memfd("passed", 4096).unwrap();
        let m = Mapping::map(&fd, 4096).unwrap();
        // SAFETY: offset 0 is inside the 4096-byte mapping.
        unsafe { *m.base() = 7 };
        send_with_fd(&x, b"hello", Some(fd.as_raw_fd())).unwrap();
        let mut buf = [0u8; 5];
        let got = recv_with_fd(&y, &mut buf).unwrap().expect("a descriptor");
        assert_eq!(&buf, b"hello");
        let m2 = Mapping::map(&got, 4096).unwrap();
        // SAFETY: offset 0 is inside the mapping.
        assert_eq!(unsafe { *m2.base() }, 7);
    }

    #[test]
    fn every_descriptor_of_a_message_is_taken_and_all_but_the_first_closed() {
        let (x, y) = UnixStream::pair().unwrap();
        // Three pipes; the write ends travel in one message.
        let pipes: Vec<(OwnedFd, OwnedFd)> = (0..3)
            .map(|_| {
                let mut p = [0; 2];
                // SAFETY: pipe2 writes two new descriptors into `p`, which we then own.
                assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
                // SAFETY: as above.
                unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
            })
            .collect();
        let fds: Vec<RawFd> = pipes.iter().map(|p| p.1.as_raw_fd()).collect();
        let data = [7u8; 4];
        let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
        let mut cbuf = [0u64; 8];
        // SAFETY: msghdr is a plain C struct; zeroed is a valid initial value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE/LEN are size computations; the control buffer holds 64 bytes, more
        // than one header and three descriptors; CMSG_FIRSTHDR points into it.
        unsafe {
            msg.msg_controllen = libc::CMSG_SPACE(12) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(12) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast::<RawFd>(), 3);
            assert_eq!(libc::sendmsg(x.as_raw_fd(), &msg, 0), 4);
        }
        let mut buf = [0u8; 4];
        let kept = recv_with_fd(&y, &mut buf).unwrap().expect("the first descriptor");
        // Our own write ends go; a pipe reads end of file once no write end is left anywhere.
        let readers: Vec<OwnedFd> = pipes.into_iter().map(|(r, _w)| r).collect();
        let at_eof = |r: &OwnedFd| {
            let mut p = libc::pollfd { fd: r.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd on our stack; zero timeout.
            unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLHUP != 0 }
        };
        assert!(!at_eof(&readers[0]), "the first is kept");
        assert!(at_eof(&readers[1]) && at_eof(&readers[2]), "the others were closed, not leaked");
        drop(kept);
        assert!(at_eof(&readers[0]));
    }

    #[test]
    fn futex_wait_returns_when_the_value_differs_or_times_out() {
        let w = AtomicU32::new(1);
        futex_wait(&w, 0, Some(Duration::from_secs(5))); // value differs: returns at once
        let t = std::time::Instant::now();
        futex_wait(&w, 1, Some(Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(15));
        w.store(2, Ordering::SeqCst);
        futex_wake(&w, 1);
        assert!(pid_alive(getpid()));
    }
}
