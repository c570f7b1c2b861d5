//! Connection options, the full-queue policy and the reconnect back-off.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use daqflow_wire::frame::DEFAULT_MAX_FRAME_LEN;

use crate::auth::Token;

/// What a send does when the connection's send queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenFull {
    /// Wait until the peer has taken enough data (back-pressure reaches the sender).
    #[default]
    Block,
    /// Give the frame back at once with [`SendError::Full`](crate::SendError::Full); the caller
    /// decides (drop it and count it, retry later, …).
    Fail,
}

/// Options of a framed connection. The defaults suit both planes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionOptions {
    /// Set `TCP_NODELAY` (default on): frames leave when written, coalescing is done by us.
    pub nodelay: bool,
    /// `SO_SNDBUF` in bytes; `None` keeps the kernel's default and its auto-tuning.
    pub send_buffer_bytes: Option<usize>,
    /// `SO_RCVBUF` in bytes; `None` keeps the kernel's default and its auto-tuning.
    pub recv_buffer_bytes: Option<usize>,
    /// Largest frame payload accepted from the peer; a larger one closes the connection before
    /// any memory is reserved for it. Default 64 MiB.
    pub max_frame_bytes: u32,
    /// Most bytes that may wait in the send queue; then [`WhenFull`] applies. A single frame
    /// larger than this is still accepted into an empty queue. Default 8 MiB.
    pub send_queue_bytes: usize,
    /// What a send does when the queue is full. Default [`WhenFull::Block`].
    pub when_full: WhenFull,
    /// Small frames are copied together into chunks of this size (the CMS event builder's
    /// message size, 128 KiB, by default); a write gathers several chunks.
    pub coalesce_bytes: usize,
    /// Most bytes gathered into one vectored write (at least one frame is always taken whole),
    /// and the amount queued at which the data-plane connection writes without waiting for a
    /// flush. Fewer, larger writes mean fewer wake-ups of the receiver: 1 MiB moved 64 KiB
    /// frames twice as fast as 128 KiB on loopback (`docs/transport.md`). Default 1 MiB.
    pub max_write_bytes: usize,
    /// Payloads up to this size are copied into the coalescing chunk; larger ones are written
    /// from their own memory (vectored write, no copy). Default 2 KiB.
    pub copy_threshold_bytes: usize,
    /// Size of each receive buffer; frames are handed out as slices of it. Default 256 KiB.
    pub recv_chunk_bytes: usize,
    /// Longest wait for one connection attempt. Default 5 s.
    pub connect_timeout: Duration,
    /// The protocol spoken on the connection, named in the [handshake](crate::auth): a client
    /// that dialled a port of another protocol is told so. Default `daqflow`.
    pub protocol: &'static str,
    /// The system token the [handshake](crate::auth) proves. A listener with a token accepts
    /// only clients that prove the same token; a client with a token talks only to a server that
    /// proves it. Default: the process's token ([`auth::set_process_token`](crate::auth::set_process_token)).
    pub token: Option<Token>,
    /// Longest time a listener gives a new connection to complete the handshake. Default 5 s.
    pub handshake_timeout: Duration,
    /// Most handshakes a listener has under way; a newcomer past it makes the oldest one be
    /// dropped. Default 64.
    pub max_pending_handshakes: usize,
    /// Largest frame payload an accepted connection takes after the handshake, until the
    /// protocol has read the peer's hello and sets the limits for what that peer may send
    /// ([`Connection::set_frame_limits`](crate::Connection::set_frame_limits)). Default 64 KiB.
    pub hello_max_frame_bytes: u32,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        ConnectionOptions {
            nodelay: true,
            send_buffer_bytes: None,
            recv_buffer_bytes: None,
            max_frame_bytes: DEFAULT_MAX_FRAME_LEN,
            send_queue_bytes: 8 << 20,
            when_full: WhenFull::Block,
            coalesce_bytes: 128 << 10,
            max_write_bytes: 1 << 20,
            copy_threshold_bytes: 2 << 10,
            recv_chunk_bytes: 256 << 10,
            connect_timeout: Duration::from_secs(5),
            protocol: "daqflow",
            token: crate::auth::process_token(),
            handshake_timeout: Duration::from_secs(5),
            max_pending_handshakes: 64,
            hello_max_frame_bytes: 64 << 10,
        }
    }
}

impl ConnectionOptions {
    /// The defaults, for `protocol`.
    pub fn for_protocol(protocol: &'static str) -> Self {
        ConnectionOptions { protocol, ..ConnectionOptions::default() }
    }

    /// The limit of an accepted connection until the protocol admits its peer.
    pub(crate) fn hello_limit(&self) -> u32 {
        self.hello_max_frame_bytes.min(self.max_frame_bytes)
    }

    pub(crate) fn credentials(&self) -> crate::auth::Credentials {
        crate::auth::Credentials { protocol: self.protocol, token: self.token.clone() }
    }
}

/// Back-off between connection attempts: `initial`, then multiplied by `multiplier` after each
/// failure, never more than `max`; give up after `max_attempts` or `deadline`, if set.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Wait after the first failure.
    pub initial: Duration,
    /// Longest wait between attempts.
    pub max: Duration,
    /// Growth of the wait after each failure.
    pub multiplier: f64,
    /// Give up after this many attempts (`None`: never).
    pub max_attempts: Option<u32>,
    /// Give up when this much time has passed since the first attempt (`None`: never).
    pub deadline: Option<Duration>,
}

impl Default for RetryPolicy {
    /// 50 ms, doubling up to 2 s, forever.
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(2),
            multiplier: 2.0,
            max_attempts: None,
            deadline: None,
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retry.
    pub fn once() -> Self {
        RetryPolicy { max_attempts: Some(1), ..Default::default() }
    }

    /// The default back-off, giving up after `deadline`.
    pub fn for_duration(deadline: Duration) -> Self {
        RetryPolicy { deadline: Some(deadline), ..Default::default() }
    }

    /// The wait after failed attempt number `attempt` (from 1).
    pub fn delay_after(&self, attempt: u32) -> Duration {
        let factor = self.multiplier.max(1.0).powi(attempt.saturating_sub(1).min(64) as i32);
        let d = self.initial.as_secs_f64() * factor;
        Duration::from_secs_f64(d.min(self.max.as_secs_f64()).max(0.0))
    }
}

/// Connection attempts under a [`RetryPolicy`]: both I/O layers count their attempts here and
/// ask, after each round over the addresses, whether to wait and try again or to give up.
pub(crate) struct Attempts<'a> {
    policy: &'a RetryPolicy,
    start: Instant,
    made: u32,
}

impl<'a> Attempts<'a> {
    pub(crate) fn new(policy: &'a RetryPolicy) -> Self {
        Attempts { policy, start: Instant::now(), made: 0 }
    }

    /// Counts an attempt; returns its number, from 1.
    pub(crate) fn attempt(&mut self) -> u32 {
        self.made += 1;
        self.made
    }

    /// After a round in which every address failed (the last with `last`): how long to wait
    /// before the next round, or the error to give up with.
    pub(crate) fn after_failed_round(
        &self,
        addrs: &[SocketAddr],
        last: Option<io::Error>,
    ) -> Result<Duration, crate::ConnectError> {
        let elapsed = self.start.elapsed();
        let delay = self.policy.delay_after(self.made);
        let out_of_attempts = self.policy.max_attempts.is_some_and(|m| self.made >= m);
        let out_of_time = self.policy.deadline.is_some_and(|d| elapsed + delay > d);
        if out_of_attempts || out_of_time {
            return Err(crate::ConnectError::GaveUp {
                addrs: addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(","),
                attempts: self.made,
                elapsed,
                last: last.unwrap_or_else(|| io::Error::other("no attempt made")),
            });
        }
        Ok(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_grows_and_is_capped() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay_after(1), Duration::from_millis(50));
        assert_eq!(p.delay_after(2), Duration::from_millis(100));
        assert_eq!(p.delay_after(3), Duration::from_millis(200));
        assert_eq!(p.delay_after(10), Duration::from_secs(2));
        assert_eq!(p.delay_after(u32::MAX), Duration::from_secs(2));
    }
}
