//! Control ownership: which web client may drive the run, without I/O (time is passed in).
//!
//! One session controls at a time; the others watch. The controller keeps control while its
//! session is seen: any request with it, or an open event stream of it. Unseen for the lapse
//! time (30 s by default), or its session ended, it loses control. `force` takes control from
//! another session (the server allows it only to sessions that may act at all).

use std::time::{Duration, Instant};

use crate::session::Sessions;

/// The controlling session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    /// Its id (secret: never shown).
    pub session: String,
    /// Its label number (shown as `client N`).
    pub label: u64,
    /// Since when it controls (Unix ms).
    pub since_ms: u64,
}

/// The ownership state.
#[derive(Debug)]
pub(crate) struct Control {
    lapse: Duration,
    holder: Option<Holder>,
}

impl Control {
    /// No controller; control lapses after `lapse` unseen.
    pub fn new(lapse: Duration) -> Control {
        Control { lapse, holder: None }
    }

    /// The controller, if any.
    pub fn holder(&self) -> Option<&Holder> {
        self.holder.as_ref()
    }

    /// Whether `session` controls.
    pub fn holds(&self, session: &str) -> bool {
        self.holder.as_ref().is_some_and(|h| h.session == session)
    }

    /// `session` (labelled `label`) takes control. Returns whether the controller changed, or
    /// the holder that refused it (another session holds control and `force` is false).
    pub fn take(&mut self, session: &str, label: u64, force: bool, now_ms: u64) -> Result<bool, Holder> {
        match &self.holder {
            Some(h) if h.session == session => Ok(false),
            Some(h) if !force => Err(h.clone()),
            _ => {
                self.holder = Some(Holder { session: session.to_owned(), label, since_ms: now_ms });
                Ok(true)
            }
        }
    }

    /// `session` releases control. Returns whether the controller changed (false when nobody
    /// controlled), or the holder when it is another session.
    pub fn release(&mut self, session: &str) -> Result<bool, Holder> {
        match &self.holder {
            None => Ok(false),
            Some(h) if h.session == session => {
                self.holder = None;
                Ok(true)
            }
            Some(h) => Err(h.clone()),
        }
    }

    /// Ends the control of a controller unseen for the lapse time (or whose session ended).
    /// Returns whether the controller changed.
    pub fn expire(&mut self, sessions: &Sessions, now: Instant) -> bool {
        let lapse = self.lapse;
        let lapsed = self
            .holder
            .as_ref()
            .is_some_and(|h| sessions.get(&h.session, now).is_none_or(|s| s.unused_for(now) >= lapse));
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

    fn sessions(t0: Instant) -> Sessions {
        let mut s = Sessions::new(Duration::from_secs(3600), 10);
        s.insert("a".into(), true, t0, None);
        s.insert("b".into(), true, t0, None);
        s
    }

    #[test]
    fn one_session_controls_the_others_are_refused_until_release_or_force() {
        let mut c = Control::new(LAPSE);
        let a = Holder { session: "a".into(), label: 1, since_ms: 1000 };
        assert_eq!(c.take("a", 1, false, 1000), Ok(true));
        assert_eq!(c.take("a", 1, false, 1001), Ok(false));
        assert_eq!(c.take("b", 2, false, 1002), Err(a.clone()));
        assert_eq!(c.release("b"), Err(a));
        assert!(c.holds("a") && !c.holds("b"));
        assert_eq!(c.release("a"), Ok(true));
        assert_eq!(c.release("a"), Ok(false));
        assert_eq!(c.take("b", 2, false, 1003), Ok(true));
        assert_eq!(c.take("a", 1, true, 1004), Ok(true));
        assert_eq!(c.holder(), Some(&Holder { session: "a".into(), label: 1, since_ms: 1004 }));
    }

    #[test]
    fn an_unseen_controller_lapses_a_seen_or_streaming_one_does_not() {
        let t0 = Instant::now();
        let mut s = sessions(t0);
        let mut c = Control::new(LAPSE);
        c.take("a", 1, false, 0).unwrap();
        s.seen("a", t0 + Duration::from_secs(20));
        assert!(!c.expire(&s, t0 + Duration::from_secs(40)));
        assert!(c.expire(&s, t0 + Duration::from_secs(50)));
        assert_eq!(c.holder(), None);

        let t1 = t0 + Duration::from_secs(50);
        s.seen("a", t1);
        c.take("a", 1, false, 0).unwrap();
        s.stream_opened("a", t1);
        assert!(!c.expire(&s, t1 + Duration::from_secs(500)));
        s.stream_closed("a", t1 + Duration::from_secs(500));
        assert!(!c.expire(&s, t1 + Duration::from_secs(529)));
        assert!(c.expire(&s, t1 + Duration::from_secs(530)));
    }

    #[test]
    fn a_controller_whose_session_ended_loses_control() {
        let t0 = Instant::now();
        let mut s = Sessions::new(Duration::from_secs(3600), 1);
        s.insert("a".into(), true, t0, None);
        let mut c = Control::new(LAPSE);
        c.take("a", 1, false, 0).unwrap();
        s.insert("b".into(), true, t0, None);
        assert!(c.expire(&s, t0));
        assert_eq!(c.holder(), None);
    }
}
