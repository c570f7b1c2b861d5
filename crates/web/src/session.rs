//! Sessions: the server-issued identity of a web client, without I/O (time is passed in).
//!
//! A session is a 128-bit random id the server gives in the cookie `daqflow_session` (HttpOnly,
//! so the page's scripts never see it) and never shows anywhere else: the API names a session
//! by its label, `client N`, a counter. With an access token configured, only a login with the
//! token creates a session; without one, every visitor gets an anonymous session. A session
//! unused (no request, no open event stream) for the lapse time ends; at the cap, a new session
//! ends the least recently used one (never the one spared: the controller's).

use std::collections::HashMap;
use std::io::Read;
use std::time::{Duration, Instant};

use crate::http::Request;

/// The session cookie's name.
pub(crate) const SESSION_COOKIE: &str = "daqflow_session";
/// Random bytes in a session id (128 bits; the id is their hex).
const SESSION_ID_BYTES: usize = 16;

/// `n` random bytes from the kernel (`/dev/urandom`), as lowercase hex.
pub(crate) fn random_hex(n: usize) -> std::io::Result<String> {
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A new session id: 128 random bits, hex.
pub(crate) fn new_session_id() -> std::io::Result<String> {
    random_hex(SESSION_ID_BYTES)
}

/// Whether `given` equals `expected`, in a time that depends only on `expected`'s length (a
/// wrong guess reveals nothing of how much of it was right).
pub(crate) fn constant_time_eq(expected: &[u8], given: &[u8]) -> bool {
    let mut diff = u8::from(expected.len() != given.len());
    for (i, &e) in expected.iter().enumerate() {
        diff |= e ^ given.get(i).copied().unwrap_or(!e);
    }
    std::hint::black_box(diff) == 0
}

/// The values of the session cookie in a request's `Cookie` header fields (a browser may send
/// several, e.g. one per path).
pub(crate) fn session_cookies(request: &Request) -> impl Iterator<Item = &str> {
    request
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("cookie"))
        .flat_map(|(_, v)| v.split(';'))
        .filter_map(|pair| pair.split_once('='))
        .filter(|(name, _)| name.trim() == SESSION_COOKIE)
        .map(|(_, value)| value.trim().trim_matches('"'))
        .filter(|value| !value.is_empty() && value.len() <= 2 * SESSION_ID_BYTES)
}

/// The `Set-Cookie` value that gives a client its session.
pub(crate) fn set_cookie(id: &str) -> String {
    format!("{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/")
}

/// The label the API shows for session number `n`.
pub(crate) fn label(n: u64) -> String {
    format!("client {n}")
}

/// One session.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// Its number, for its label.
    pub label: u64,
    /// Created by a login with the access token.
    pub authenticated: bool,
    last_seen: Instant,
    streams: usize,
}

impl Session {
    /// How long it has been unused at `now` (zero while it has an event stream open).
    pub fn unused_for(&self, now: Instant) -> Duration {
        if self.streams > 0 { Duration::ZERO } else { now.saturating_duration_since(self.last_seen) }
    }
}

/// Every session.
#[derive(Debug)]
pub(crate) struct Sessions {
    lapse: Duration,
    max: usize,
    next_label: u64,
    map: HashMap<String, Session>,
}

impl Sessions {
    /// No sessions; they end after `lapse` unused; at most `max` of them.
    pub fn new(lapse: Duration, max: usize) -> Sessions {
        Sessions { lapse, max: max.max(1), next_label: 1, map: HashMap::new() }
    }

    /// Adds session `id` (a fresh random id) and returns its label number. At the cap, ends
    /// the least recently used session other than `spare` (preferring those without an open
    /// event stream).
    pub fn insert(&mut self, id: String, authenticated: bool, now: Instant, spare: Option<&str>) -> u64 {
        self.expire(now);
        while self.map.len() >= self.max {
            let victim = |with_streams: bool| {
                self.map
                    .iter()
                    .filter(|(k, s)| Some(k.as_str()) != spare && (with_streams || s.streams == 0))
                    .min_by_key(|(_, s)| s.last_seen)
                    .map(|(k, _)| k.clone())
            };
            match victim(false).or_else(|| victim(true)) {
                Some(k) => {
                    self.map.remove(&k);
                }
                None => break,
            }
        }
        let label = self.next_label;
        self.next_label += 1;
        self.map.insert(id, Session { label, authenticated, last_seen: now, streams: 0 });
        label
    }

    /// The session `id`, if it is one that has not lapsed.
    pub fn get(&self, id: &str, now: Instant) -> Option<&Session> {
        self.map.get(id).filter(|s| s.unused_for(now) < self.lapse)
    }

    /// Notes a request of session `id`; false if there is no such session (or it lapsed: then
    /// it ends now).
    pub fn seen(&mut self, id: &str, now: Instant) -> bool {
        let lapse = self.lapse;
        match self.map.get_mut(id) {
            Some(s) if s.unused_for(now) < lapse => {
                s.last_seen = s.last_seen.max(now);
                true
            }
            Some(_) => {
                self.map.remove(id);
                false
            }
            None => false,
        }
    }

    /// Notes that session `id` opened an event stream (it counts as used while it is open).
    pub fn stream_opened(&mut self, id: &str, now: Instant) {
        if let Some(s) = self.map.get_mut(id) {
            s.last_seen = s.last_seen.max(now);
            s.streams += 1;
        }
    }

    /// Notes that an event stream of session `id` closed.
    pub fn stream_closed(&mut self, id: &str, now: Instant) {
        if let Some(s) = self.map.get_mut(id) {
            s.last_seen = s.last_seen.max(now);
            s.streams = s.streams.saturating_sub(1);
        }
    }

    /// Ends the sessions unused for the lapse time.
    pub fn expire(&mut self, now: Instant) {
        let lapse = self.lapse;
        self.map.retain(|_, s| s.unused_for(now) < lapse);
    }

    /// How many sessions there are.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Limits, Progress, parse_request};

    const LAPSE: Duration = Duration::from_secs(100);

    #[test]
    fn session_ids_are_128_random_bits_in_hex() {
        let a = new_session_id().unwrap();
        let b = new_session_id().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn tokens_compare_equal_only_when_equal() {
        assert!(constant_time_eq(b"abcdef", b"abcdef"));
        assert!(!constant_time_eq(b"abcdef", b"abcdeg"));
        assert!(!constant_time_eq(b"abcdef", b"abcde"));
        assert!(!constant_time_eq(b"abcdef", b"abcdefa"));
        assert!(!constant_time_eq(b"abcdef", b""));
        assert!(!constant_time_eq(b"\xff", b""));
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let bytes =
            b"GET / HTTP/1.1\r\nCookie: a=1; daqflow_session=abc; b=2\r\nCookie: daqflow_session=\"def\"\r\n\r\n";
        let Ok(Progress::Done(r, _)) = parse_request(bytes, &Limits { max_head: 1024, max_body: 0 }) else {
            panic!("not parsed")
        };
        assert_eq!(session_cookies(&r).collect::<Vec<_>>(), ["abc", "def"]);
    }

    #[test]
    fn an_unused_session_ends_one_with_a_stream_does_not() {
        let t0 = Instant::now();
        let mut s = Sessions::new(LAPSE, 10);
        let n = s.insert("a".into(), true, t0, None);
        assert_eq!(s.get("a", t0).map(|x| x.label), Some(n));
        assert!(s.seen("a", t0 + LAPSE / 2));
        assert!(s.seen("a", t0 + LAPSE));
        assert!(!s.seen("a", t0 + LAPSE * 3));
        assert!(s.get("a", t0 + LAPSE * 3).is_none());

        s.insert("b".into(), true, t0, None);
        s.stream_opened("b", t0);
        assert!(s.seen("b", t0 + LAPSE * 5));
        s.stream_closed("b", t0 + LAPSE * 5);
        s.expire(t0 + LAPSE * 6);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn at_the_cap_the_least_recently_used_session_ends_but_not_the_spared_one() {
        let t0 = Instant::now();
        let mut s = Sessions::new(LAPSE, 2);
        s.insert("old".into(), true, t0, None);
        s.insert("mid".into(), true, t0 + Duration::from_secs(1), None);
        s.insert("new".into(), true, t0 + Duration::from_secs(2), Some("old"));
        assert!(s.get("old", t0).is_some() && s.get("mid", t0).is_none() && s.get("new", t0).is_some());
        let a = s.insert("newer".into(), false, t0 + Duration::from_secs(3), None);
        assert!(s.get("old", t0).is_none());
        assert_eq!(s.get("newer", t0).map(|x| (x.label, x.authenticated)), Some((a, false)));
        assert_eq!(s.len(), 2);
    }
}
