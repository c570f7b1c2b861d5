//! Failed logins: when each is answered, and what the log says of them.
//!
//! A login with a wrong token is answered no sooner than the configured delay after it arrived,
//! and across all clients such answers leave at most one per tenth of the delay, so that a
//! guesser learns at most ten wrong tokens per delay however many connections it opens; none is
//! held back longer than ten delays. The log names the first failure at once, then sums up the
//! failures of each following ten seconds in one line, so that a flood neither goes unnoticed
//! nor fills the log.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// At most one line about failed logins this often (the first of a burst at once).
pub(super) const LOG_EVERY: Duration = Duration::from_secs(10);

/// The most addresses a summary line names.
const PEERS_NAMED: usize = 8;

/// What to log about a failed login.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Log {
    /// Log it now.
    Now,
    /// Counted for a summary due at this time: the caller schedules [`FailedLogins::summary`].
    SummaryAt(Instant),
    /// Counted for a summary already scheduled.
    Counted,
}

/// The failed logins' schedule and log.
#[derive(Debug)]
pub(super) struct FailedLogins {
    delay: Duration,
    /// The earliest time the next failed login may be answered.
    next: Option<Instant>,
    /// When a line about failed logins was last logged.
    last_logged: Option<Instant>,
    /// Failures since then that no line has named yet, and some of their addresses.
    unlogged: u64,
    peers: BTreeSet<IpAddr>,
    /// A summary is scheduled.
    summary_due: bool,
}

/// A summary line: failures not logged one by one, since when, from which addresses (some).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Summary {
    pub count: u64,
    pub over: Duration,
    pub peers: Vec<IpAddr>,
}

impl FailedLogins {
    /// No failure yet; answers held back at least `delay`.
    pub fn new(delay: Duration) -> FailedLogins {
        FailedLogins { delay, next: None, last_logged: None, unlogged: 0, peers: BTreeSet::new(), summary_due: false }
    }

    /// Notes a failed login from `peer` at `now`: when to answer it, and what to log.
    pub fn fail(&mut self, now: Instant, peer: IpAddr) -> (Instant, Log) {
        let longest = now + self.delay * 10;
        let at = (now + self.delay).max(self.next.unwrap_or(now)).min(longest);
        self.next = Some((at + self.delay / 10).min(longest));
        let log = if self.summary_due {
            self.count(peer);
            Log::Counted
        } else if self.last_logged.is_none_or(|t| now.duration_since(t) >= LOG_EVERY) {
            self.last_logged = Some(now);
            Log::Now
        } else {
            self.count(peer);
            self.summary_due = true;
            Log::SummaryAt(self.last_logged.unwrap_or(now) + LOG_EVERY)
        };
        (at, log)
    }

    fn count(&mut self, peer: IpAddr) {
        self.unlogged += 1;
        if self.peers.len() < PEERS_NAMED {
            self.peers.insert(peer);
        }
    }

    /// The failures not logged yet (none: nothing to say); what follows is counted afresh.
    pub fn summary(&mut self, now: Instant) -> Option<Summary> {
        self.summary_due = false;
        let since = self.last_logged.replace(now).unwrap_or(now);
        if self.unlogged == 0 {
            return None;
        }
        let count = std::mem::take(&mut self.unlogged);
        let peers = std::mem::take(&mut self.peers).into_iter().collect();
        Some(Summary { count, over: now.duration_since(since), peers })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn a_lone_failure_waits_the_delay_and_is_logged_at_once() {
        let mut f = FailedLogins::new(Duration::from_secs(1));
        let t = Instant::now();
        assert_eq!(f.fail(t, PEER), (t + Duration::from_secs(1), Log::Now));
        // Much later: again a lone failure.
        let later = t + Duration::from_secs(60);
        assert_eq!(f.fail(later, PEER), (later + Duration::from_secs(1), Log::Now));
    }

    #[test]
    fn a_flood_is_answered_at_most_ten_per_delay_and_never_held_past_ten_delays() {
        let delay = Duration::from_secs(1);
        let mut f = FailedLogins::new(delay);
        let t = Instant::now();
        let answers: Vec<Instant> = (0..1000).map(|_| f.fail(t, PEER).0).collect();
        for pair in answers.windows(2) {
            assert!(pair[1] >= pair[0]);
        }
        // The first hundred are spaced a tenth of the delay apart; then every answer waits the
        // longest hold.
        assert_eq!(answers[1] - answers[0], delay / 10);
        assert_eq!(answers[90] - answers[0], delay * 9);
        assert!(answers.iter().all(|&a| a <= t + delay * 10 && a >= t + delay));
        // Once the flood has passed, a lone typo waits only the delay again.
        let after = t + delay * 30;
        assert_eq!(f.fail(after, PEER).0, after + delay);
    }

    #[test]
    fn a_burst_is_logged_once_then_summed_up() {
        let mut f = FailedLogins::new(Duration::from_millis(100));
        let t = Instant::now();
        assert_eq!(f.fail(t, PEER).1, Log::Now);
        let other: IpAddr = "127.0.0.2".parse().unwrap();
        assert_eq!(f.fail(t + Duration::from_secs(1), other).1, Log::SummaryAt(t + LOG_EVERY));
        for i in 0..98 {
            assert_eq!(f.fail(t + Duration::from_millis(1000 + i), PEER).1, Log::Counted);
        }
        let s = f.summary(t + LOG_EVERY).unwrap();
        assert_eq!((s.count, s.over, s.peers.len()), (99, LOG_EVERY, 2));
        // Nothing more: no line.
        assert_eq!(f.summary(t + LOG_EVERY * 2), None);
        // A failure right after a summary waits for the next one.
        assert_eq!(f.fail(t + LOG_EVERY * 2, PEER).1, Log::SummaryAt(t + LOG_EVERY * 3));
    }
}
