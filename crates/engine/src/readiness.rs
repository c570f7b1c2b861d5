//! Which sockets an idle scheduler reads: a socket found empty is not read again (no system
//! call) until the kernel says it is readable (`poll(2)`) or the scheduler did work.
//!
//! A task that reads a socket without blocking costs a system call each time it looks, data or
//! not. While a scheduler is idle it looks at every task once per cycle, so a module polling
//! *n* sockets made *n* `recv(2)` calls per idle cycle that almost all returned `EAGAIN` (97 % of
//! the event builder EVM's `recvfrom` calls, 87 % of a builder unit's), and an idle cycle cost
//! microseconds where it should cost nanoseconds (docs/performance.md, "Idle cycles without
//! system calls").
//!
//! The readiness cache is the thread's own list of sockets found empty:
//!
//! - a task asks [`worth_reading`] before a non-blocking read and calls [`found_empty`] when the
//!   read found nothing whole;
//! - the [scheduler](crate::Scheduler) running on the thread forgets the list after every cycle in
//!   which a task acted (busy: every socket is read as before), and asks the kernel instead of the
//!   sockets while it is idle: one `poll(2)` without waiting, on every descriptor its tasks name
//!   ([`Task::wait_fds`](crate::Task::wait_fds)), every [`RECHECK_EVERY`] idle cycles, and the
//!   `ppoll(2)` of each park; a socket it reports readable (or closed, or in error) leaves the list,
//!   and so does every socket it was not asked about.
//!
//! Only a scheduler takes sockets off the list, so only tasks run by a scheduler may use the
//! cache: elsewhere a socket [`found_empty`] would not be read again on that thread. A scheduler
//! empties the list when it starts and when it ends. A task that does not use the cache reads its
//! sockets as before.
//!
//! ```
//! use daqflow_engine::readiness::{found_empty, worth_reading};
//!
//! // What a task does; the scheduler running it clears the list after each cycle with work,
//! // and learns from the kernel while idle.
//! assert!(worth_reading(7));
//! found_empty(7);
//! assert!(!worth_reading(7));
//! daqflow_engine::readiness::forget_all();
//! assert!(worth_reading(7));
//! ```

use std::cell::RefCell;
use std::os::fd::RawFd;

/// An idle scheduler asks the kernel about its sockets every this many idle cycles (and at every
/// park), instead of reading each of them on every cycle.
pub const RECHECK_EVERY: u64 = 8;

thread_local! {
    /// Sockets found empty since the last cycle with work, not yet reported readable.
    static EMPTY: RefCell<Vec<RawFd>> = const { RefCell::new(Vec::new()) };
}

/// Whether a non-blocking read of `fd` may find something: false only while `fd` is on this
/// thread's list of sockets found empty.
#[inline]
pub fn worth_reading(fd: RawFd) -> bool {
    EMPTY.with(|e| e.try_borrow().map_or(true, |e| !e.contains(&fd)))
}

/// A non-blocking read of `fd` found nothing whole: it is not worth reading again until the
/// scheduler learns otherwise.
#[inline]
pub fn found_empty(fd: RawFd) {
    EMPTY.with(|e| {
        if let Ok(mut e) = e.try_borrow_mut()
            && !e.contains(&fd)
        {
            e.push(fd);
        }
    });
}

/// Forgets every socket found empty: each is worth reading again. The scheduler calls it after
/// every cycle in which a task acted.
#[inline]
pub fn forget_all() {
    EMPTY.with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            e.clear();
        }
    });
}

/// Whether any socket is on this thread's list.
#[inline]
pub(crate) fn any_empty() -> bool {
    EMPTY.with(|e| e.try_borrow().is_ok_and(|e| !e.is_empty()))
}

/// What a `poll(2)` or `ppoll(2)` of `polled` reported: a socket it was asked about and found readable,
/// closed or in error (any `revents`) is worth reading again, and so is every socket it was not
/// asked about (nothing is known of it); the others stay on the list.
pub(crate) fn learn(polled: &[libc::pollfd]) {
    EMPTY.with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            e.retain(|fd| polled.iter().any(|p| p.fd == *fd && p.revents == 0));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pfd(fd: RawFd, revents: i16) -> libc::pollfd {
        libc::pollfd { fd, events: libc::POLLIN, revents }
    }

    #[test]
    fn a_poll_keeps_only_what_it_found_not_ready() {
        forget_all();
        for fd in [3, 4, 5, 6] {
            found_empty(fd);
        }
        found_empty(3);
        // 3 still empty, 4 readable, 5 hung up, 6 not asked about.
        learn(&[pfd(3, 0), pfd(4, libc::POLLIN), pfd(5, libc::POLLHUP), pfd(9, 0)]);
        assert!(!worth_reading(3));
        assert!(worth_reading(4));
        assert!(worth_reading(5));
        assert!(worth_reading(6));
        assert!(worth_reading(9), "a socket never found empty is always worth reading");
        assert!(any_empty());
        forget_all();
        assert!(!any_empty());
        assert!(worth_reading(3));
    }

    #[test]
    fn each_thread_has_its_own_list() {
        forget_all();
        found_empty(11);
        assert!(std::thread::spawn(|| worth_reading(11)).join().unwrap());
        assert!(!worth_reading(11));
        forget_all();
    }
}
