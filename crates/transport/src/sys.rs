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
