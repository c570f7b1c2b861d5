//! Socket set-up and readiness waits shared by both I/O layers.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use crate::ConnectionOptions;

/// Applies the options to a connected socket.
pub(crate) fn configure(socket: &Socket, opts: &ConnectionOptions) -> io::Result<()> {
    socket.set_tcp_nodelay(opts.nodelay)?;
    if let Some(n) = opts.send_buffer_bytes {
        socket.set_send_buffer_size(n)?;
    }
    if let Some(n) = opts.recv_buffer_bytes {
        socket.set_recv_buffer_size(n)?;
    }
    Ok(())
}

/// A listening socket with `SO_REUSEADDR`, so that a restarted process can bind its port again
/// while old connections linger in `TIME_WAIT`.
pub(crate) fn listen(addr: SocketAddr, opts: &ConnectionOptions) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_cloexec(true)?;
    // Accepted sockets inherit the buffer sizes from the listener; set them before listen()
    // so the window scale is negotiated for them.
    if let Some(n) = opts.send_buffer_bytes {
        socket.set_send_buffer_size(n)?;
    }
    if let Some(n) = opts.recv_buffer_bytes {
        socket.set_recv_buffer_size(n)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket)
}

/// A socket connected to `addr` within `opts.connect_timeout`.
pub(crate) fn connect(addr: SocketAddr, opts: &ConnectionOptions) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_cloexec(true)?;
    if let Some(n) = opts.send_buffer_bytes {
        socket.set_send_buffer_size(n)?;
    }
    if let Some(n) = opts.recv_buffer_bytes {
        socket.set_recv_buffer_size(n)?;
    }
    socket.connect_timeout(&addr.into(), opts.connect_timeout)?;
    configure(&socket, opts)?;
    Ok(socket)
}

/// Waits until one of `fds` is ready for `events` (`libc::POLLIN`, `libc::POLLOUT`), or the
/// timeout passes (`None`: wait for ever). Returns how many are ready (0 on timeout).
pub fn wait_ready(fds: &[BorrowedFd<'_>], events: i16, timeout: Option<Duration>) -> io::Result<usize> {
    let mut pfds: Vec<libc::pollfd> =
        fds.iter().map(|fd| libc::pollfd { fd: fd.as_raw_fd(), events, revents: 0 }).collect();
    let timeout_ms = match timeout {
        None => -1,
        Some(d) => i32::try_from(d.as_millis().max(u128::from(!d.is_zero()))).unwrap_or(i32::MAX),
    };
    loop {
        // SAFETY: `pfds` is a valid, initialised array of `pfds.len()` pollfd structures that
        // lives across the call, and each fd is kept open by the `BorrowedFd` borrows.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// A non-blocking eventfd, to wake a thread that waits in [`wait_ready`].
pub(crate) fn eventfd() -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Makes the eventfd readable.
pub(crate) fn signal_eventfd(fd: &std::os::fd::OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a local array to a descriptor we own.
    let _ = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
}

/// Whether the eventfd was signalled since the last call (reading it resets it).
pub(crate) fn eventfd_signalled(fd: &std::os::fd::OwnedFd) -> bool {
    let mut v = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a local array from a descriptor we own.
    let n = unsafe { libc::read(fd.as_raw_fd(), v.as_mut_ptr().cast(), v.len()) };
    n == 8
}
