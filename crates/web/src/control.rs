//! Control ownership: which web client may drive the run, without I/O (time is passed in).
//!
//! One client controls at a time; the others watch. A client is identified by the random token
//! its browser keeps (header `X-Daqflow-Client`, or `?client=` on an event stream). The
//! controller keeps control while it is seen: any request from it, or an open event stream of
//! it. Unseen for the lapse time (30 s by default), it loses control. `force` takes control from
//! another client.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The longest client id accepted.
pub(crate) const MAX_CLIENT_ID_LEN: usize = 64;

/// Whether `id` is a valid client id: 1 to 64 characters out of `A-Z a-z 0-9 - _ .`.
pub(crate) fn valid_client_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_CLIENT_ID_LEN
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// The controlling client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    /// Its id.
    pub client: String,
    /// Since when it controls (Unix ms).
    pub since_ms: u64,
}

#[derive(Debug)]
struct Seen {
    last: Instant,
    streams: usize,
}

/// The ownership state.
#[derive(Debug)]
pub(crate) struct Control {
    lapse: Duration,
    holder: Option<Holder>,
    clients: HashMap<String, Seen>,
}

impl Control {
    /// No controller; control lapses after `lapse` unseen.
    pub fn new(lapse: Duration) -> Control {
        Control { lapse, holder: None, clients: HashMap::new() }
    }

    /// The controller, if any.
    pub fn holder(&self) -> Option<&Holder> {
        self.holder.as_ref()
    }

    /// Whether `client` controls.
    pub fn holds(&self, client: &str) -> bool {
        self.holder.as_ref().is_some_and(|h| h.client == client)
    }

    /// Notes a request from `client`.
    pub fn seen(&mut self, client: &str, now: Instant) {
        match self.clients.get_mut(client) {
            Some(s) => s.last = s.last.max(now),
            None => {
                self.clients.insert(client.to_owned(), Seen { last: now, streams: 0 });
            }
        }
    }

    /// Notes that `client` opened an event stream (it counts as seen while the stream is open).
    pub fn stream_opened(&mut self, client: &str, now: Instant) {
        self.seen(client, now);
        if let Some(s) = self.clients.get_mut(client) {
            s.streams += 1;
        }
    }

    /// Notes that an event stream of `client` closed.
    pub fn stream_closed(&mut self, client: &str, now: Instant) {
        self.seen(client, now);
        if let Some(s) = self.clients.get_mut(client) {
            s.streams = s.streams.saturating_sub(1);
        }
    }

    /// `client` takes control. Returns whether the controller changed, or the holder that
    /// refused it (another client holds control and `force` is false).
    pub fn take(&mut self, client: &str, force: bool, now: Instant, now_ms: u64) -> Result<bool, Holder> {
        self.seen(client, now);
        self.expire(now);
        match &self.holder {
            Some(h) if h.client == client => Ok(false),
            Some(h) if !force => Err(h.clone()),
            _ => {
                self.holder = Some(Holder { client: client.to_owned(), since_ms: now_ms });
                Ok(true)
            }
        }
    }

    /// `client` releases control. Returns whether the controller changed (false when nobody
    /// controlled), or the holder when it is another client.
    pub fn release(&mut self, client: &str, now: Instant) -> Result<bool, Holder> {
        self.seen(client, now);
        self.expire(now);
        match &self.holder {
            None => Ok(false),
            Some(h) if h.client == client => {
                self.holder = None;
                Ok(true)
            }
            Some(h) => Err(h.clone()),
        }
    }

    /// Ends the control of a controller unseen for the lapse time and forgets clients unseen
    /// for as long. Returns whether the controller changed.
    pub fn expire(&mut self, now: Instant) -> bool {
        let lapse = self.lapse;
        let gone = |s: &Seen| s.streams == 0 && now.saturating_duration_since(s.last) >= lapse;
        self.clients.retain(|_, s| !gone(s));
        let lapsed = self.holder.as_ref().is_some_and(|h| !self.clients.contains_key(&h.client));
        if lapsed {
            self.holder = None;
        }
        lapsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAPSE: Duration = Duration::from_secs(30);

    #[test]
    fn one_client_controls_the_others_are_refused_until_release_or_force() {
        let t0 = Instant::now();
        let mut c = Control::new(LAPSE);
        assert_eq!(c.take("a", false, t0, 1000), Ok(true));
        assert_eq!(c.take("a", false, t0, 1001), Ok(false));
        assert_eq!(c.take("b", false, t0, 1002), Err(Holder { client: "a".into(), since_ms: 1000 }));
        assert_eq!(c.release("b", t0), Err(Holder { client: "a".into(), since_ms: 1000 }));
        assert!(c.holds("a") && !c.holds("b"));
        assert_eq!(c.release("a", t0), Ok(true));
        assert_eq!(c.release("a", t0), Ok(false));
        assert_eq!(c.take("b", false, t0, 1003), Ok(true));
        assert_eq!(c.take("a", true, t0, 1004), Ok(true));
        assert_eq!(c.holder(), Some(&Holder { client: "a".into(), since_ms: 1004 }));
    }

    #[test]
    fn an_unseen_controller_lapses_a_seen_or_streaming_one_does_not() {
        let t0 = Instant::now();
        let mut c = Control::new(LAPSE);
        c.take("a", false, t0, 0).unwrap();
        c.seen("a", t0 + Duration::from_secs(20));
        assert!(!c.expire(t0 + Duration::from_secs(40)));
        assert!(c.expire(t0 + Duration::from_secs(50)));
        assert_eq!(c.holder(), None);

        c.take("a", false, t0 + Duration::from_secs(50), 0).unwrap();
        c.stream_opened("a", t0 + Duration::from_secs(50));
        assert!(!c.expire(t0 + Duration::from_secs(500)));
        c.stream_closed("a", t0 + Duration::from_secs(500));
        assert!(!c.expire(t0 + Duration::from_secs(529)));
        assert!(c.expire(t0 + Duration::from_secs(530)));
    }

    #[test]
    fn a_lapsed_controller_does_not_block_a_take() {
        let t0 = Instant::now();
        let mut c = Control::new(LAPSE);
        c.take("a", false, t0, 0).unwrap();
        assert_eq!(c.take("b", false, t0 + LAPSE, 5), Ok(true));
        assert!(c.holds("b"));
    }

    #[test]
    fn client_ids_are_short_tokens() {
        assert!(valid_client_id("web-3f9a_2c.x"));
        assert!(!valid_client_id(""));
        assert!(!valid_client_id("a b"));
        assert!(!valid_client_id(&"x".repeat(65)));
    }
}
