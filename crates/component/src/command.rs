//! The component protocol's messages, typed: a [`Request`] (a [`Command`] with a request id and
//! where to send the reply), the [`CommandReply`], and the [`ComponentStatus`] a component
//! publishes. `docs/operator-guide.md` ("Component protocol") gives their JSON.
//!
//! On the control plane a command travels as the dialog command `NAME/VERB` (or `all/VERB`),
//! its payload the request's JSON; the component answers each request that names `reply_to`
//! with the dialog command `REPLY_TO/reply`, its payload the reply's JSON. A person may send a
//! bare payload (empty, or a number: the run for `start`, the last event for `stop`).
//!
//! ```
//! use daqflow_component::{Answer, Command, CommandReply, ComponentStatus, Request, State, Verb};
//! let request = Request { id: 7, reply_to: Some("operator".into()), command: Command::Start { run: 12 } };
//! let (verb, payload) = request.encode();
//! assert_eq!(verb, Verb::Start);
//! assert_eq!(Request::decode(verb, &payload).unwrap(), request);
//! assert_eq!(Request::decode(Verb::Start, b"12").unwrap().command, Command::Start { run: 12 });
//! assert!(Request::decode(Verb::Start, b"").is_err()); // start needs its run
//!
//! let status = ComponentStatus { name: "ru-0".into(), kind: "ru".into(), pid: 42, incarnation: Some(3), seq: 7,
//!     state: State::Running, run: Some(12), since_ms: 0, error: None, cpus: None };
//! let reply = CommandReply::new(&request, status, Ok(Answer::Run(12)));
//! let back: CommandReply = serde_json::from_slice(&reply.to_json()).unwrap();
//! assert_eq!(back, reply);
//! ```

use serde::{Deserialize, Serialize};

use crate::{ComponentError, Info, State, Stats};

/// The commands of the state machine, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// Initial → Configured.
    Configure,
    /// Configured → Running.
    Start,
    /// Running → Paused.
    Pause,
    /// Paused → Running.
    Resume,
    /// Running or Paused → Configured.
    Stop,
    /// Any → Initial.
    Reset,
    /// Change a live parameter (no transition).
    Set,
}

impl Verb {
    /// Every command.
    pub const ALL: [Verb; 7] =
        [Verb::Configure, Verb::Start, Verb::Pause, Verb::Resume, Verb::Stop, Verb::Reset, Verb::Set];

    /// The commands of the state machine (every one but `set`).
    pub const TRANSITIONS: [Verb; 6] =
        [Verb::Configure, Verb::Start, Verb::Pause, Verb::Resume, Verb::Stop, Verb::Reset];

    /// The command's name (`configure`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Verb::Configure => "configure",
            Verb::Start => "start",
            Verb::Pause => "pause",
            Verb::Resume => "resume",
            Verb::Stop => "stop",
            Verb::Reset => "reset",
            Verb::Set => "set",
        }
    }

    /// The command of a name.
    pub fn parse(name: &str) -> Option<Verb> {
        Verb::ALL.into_iter().find(|v| v.name() == name)
    }

    /// The component state machine, the one table of it: the states a command may be given in,
    /// and the state it leads to. `stop` is also taken in Error, from a component that failed
    /// during its run (to collect what it has; it stays in Error); `reset` from any state; `set`
    /// changes no state (each live key says in which states it may change: its schema's `live`).
    ///
    /// ```
    /// use daqflow_component::{State, Verb};
    /// assert_eq!(Verb::Start.transition(), Some((&[State::Configured][..], State::Running)));
    /// assert!(Verb::Stop.allowed_in(State::Paused) && !Verb::Stop.allowed_in(State::Initial));
    /// assert!(State::ALL.iter().all(|s| Verb::Reset.allowed_in(*s)));
    /// assert_eq!(Verb::Set.transition(), None);
    /// ```
    pub const fn transition(self) -> Option<(&'static [State], State)> {
        use State::*;
        Some(match self {
            Verb::Configure => (&[Initial], Configured),
            Verb::Start => (&[Configured], Running),
            Verb::Pause => (&[Running], Paused),
            Verb::Resume => (&[Paused], Running),
            Verb::Stop => (&[Running, Paused, Error], Configured),
            Verb::Reset => (&[Initial, Configured, Running, Paused, Error], Initial),
            Verb::Set => return None,
        })
    }

    /// The commands that take a component from state `from` to state `to` by the table
    /// ([`Verb::transition`]), fewest first: empty when it is there, `None` when no command
    /// leads there (Error). How the operator brings a restarted component back to where the
    /// system is.
    ///
    /// ```
    /// use daqflow_component::{State, Verb};
    /// assert_eq!(Verb::path(State::Initial, State::Paused), Some(vec![Verb::Configure, Verb::Start, Verb::Pause]));
    /// assert_eq!(Verb::path(State::Running, State::Running), Some(vec![]));
    /// assert_eq!(Verb::path(State::Initial, State::Error), None);
    /// ```
    pub fn path(from: State, to: State) -> Option<Vec<Verb>> {
        let mut paths: Vec<(State, Vec<Verb>)> = vec![(from, Vec::new())];
        let mut seen = vec![from];
        let mut i = 0;
        while let Some((state, path)) = paths.get(i).cloned() {
            if state == to {
                return Some(path);
            }
            for verb in Verb::TRANSITIONS {
                if let Some((_, next)) = verb.transition().filter(|_| verb.allowed_in(state))
                    && !seen.contains(&next)
                {
                    seen.push(next);
                    let mut longer = path.clone();
                    longer.push(verb);
                    paths.push((next, longer));
                }
            }
            i += 1;
        }
        None
    }

    /// Whether the command may be given to a component in `state` (by [`Verb::transition`];
    /// `set` in any configured state, its key deciding).
    pub fn allowed_in(self, state: State) -> bool {
        match self.transition() {
            Some((from, _)) => from.contains(&state),
            None => !matches!(state, State::Initial | State::Error),
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A command with its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "lowercase", deny_unknown_fields)]
pub enum Command {
    /// Build the component from its configuration, with `config` merged over it key by key.
    Configure {
        /// Keys merged over the process's own configuration.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        config: Option<toml::Table>,
    },
    /// Take run `run`.
    Start {
        /// The run number.
        run: u32,
    },
    /// Hold back (producers) until resumed.
    Pause,
    /// Carry on.
    Resume,
    /// End the run; a source produces up to `last_event` first.
    Stop {
        /// The last event to produce (sources).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_event: Option<u64>,
    },
    /// Back to Initial, whatever the state.
    Reset,
    /// Change live parameter `key` to `value` (a key its kind's [schema](crate::schema) declares live).
    Set {
        /// The parameter (dotted for a nested one).
        key: String,
        /// Its new value.
        value: serde_json::Value,
    },
}

impl Command {
    /// The command's verb.
    pub fn verb(&self) -> Verb {
        match self {
            Command::Configure { .. } => Verb::Configure,
            Command::Start { .. } => Verb::Start,
            Command::Pause => Verb::Pause,
            Command::Resume => Verb::Resume,
            Command::Stop { .. } => Verb::Stop,
            Command::Reset => Verb::Reset,
            Command::Set { .. } => Verb::Set,
        }
    }
}

/// A command sent to a component.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Chosen by the sender, echoed in the reply (0 when a person sent a bare payload).
    pub id: u64,
    /// The dialog name of the process that wants the reply (it registered `NAME/reply`).
    pub reply_to: Option<String>,
    /// The command.
    pub command: Command,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    #[serde(default)]
    id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    run: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_event: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    config: Option<toml::Table>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<serde_json::Value>,
}

impl Envelope {
    fn empty() -> Envelope {
        Envelope { id: 0, reply_to: None, run: None, last_event: None, config: None, key: None, value: None }
    }
}

impl Request {
    /// The verb (the dialog command `NAME/VERB`) and the payload (JSON) of the request.
    pub fn encode(&self) -> (Verb, Vec<u8>) {
        let mut e = Envelope { id: self.id, reply_to: self.reply_to.clone(), ..Envelope::empty() };
        match &self.command {
            Command::Configure { config } => e.config = config.clone(),
            Command::Start { run } => e.run = Some(*run),
            Command::Stop { last_event } => e.last_event = *last_event,
            Command::Set { key, value } => {
                e.key = Some(key.clone());
                e.value = Some(value.clone());
            }
            Command::Pause | Command::Resume | Command::Reset => {}
        }
        (self.command.verb(), serde_json::to_vec(&e).unwrap_or_default())
    }

    /// The request in a payload of command `verb`: empty, a bare number (the run for `start`,
    /// the last event for `stop`), or a JSON object with `id`, `reply_to` and the command's
    /// arguments (`run`, `last_event`, `config`). Anything else is refused with the reason.
    pub fn decode(verb: Verb, payload: &[u8]) -> Result<Request, ComponentError> {
        let bad = |why: String| ComponentError::BadCommand(format!("{verb}: {why}"));
        let text = std::str::from_utf8(payload).map_err(|_| bad("the payload is not UTF-8".into()))?.trim();
        let e: Envelope = if text.is_empty() {
            Envelope::empty()
        } else if let Ok(n) = text.parse::<u64>() {
            let mut e = Envelope::empty();
            match verb {
                Verb::Start => e.run = Some(u32::try_from(n).map_err(|_| bad(format!("run {n} is out of range")))?),
                Verb::Stop => e.last_event = Some(n),
                _ => return Err(bad(format!("takes no number (got {n})"))),
            }
            e
        } else {
            serde_json::from_str(text).map_err(|err| bad(format!("the payload is not a request: {err}")))?
        };
        let refuse_arg = |present: bool, key: &str| {
            if present { Err(bad(format!("takes no `{key}`"))) } else { Ok(()) }
        };
        refuse_arg(e.run.is_some() && verb != Verb::Start, "run")?;
        refuse_arg(e.last_event.is_some() && verb != Verb::Stop, "last_event")?;
        refuse_arg(e.config.is_some() && verb != Verb::Configure, "config")?;
        refuse_arg(e.key.is_some() && verb != Verb::Set, "key")?;
        refuse_arg(e.value.is_some() && verb != Verb::Set, "value")?;
        let command = match verb {
            Verb::Configure => Command::Configure { config: e.config },
            Verb::Start => Command::Start {
                run: e.run.ok_or_else(|| bad("the payload must name the run (a number or {\"run\": N})".into()))?,
            },
            Verb::Pause => Command::Pause,
            Verb::Resume => Command::Resume,
            Verb::Stop => Command::Stop { last_event: e.last_event },
            Verb::Reset => Command::Reset,
            Verb::Set => Command::Set {
                key: e.key.filter(|k| !k.is_empty()).ok_or_else(|| bad("the payload must name the `key`".into()))?,
                value: e.value.ok_or_else(|| bad("the payload must give the `value`".into()))?,
            },
        };
        Ok(Request { id: e.id, reply_to: e.reply_to, command })
    }
}

/// What a command that succeeded returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Answer {
    /// Nothing (pause, resume, reset).
    Nothing,
    /// What `configure` tells the others.
    Info(Info),
    /// The run taken (`start`).
    Run(u32),
    /// The run's summary (`stop`).
    Summary(Stats),
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Done.
    Ok(Answer),
    /// Refused (illegal in the state, a bad request) or failed: the error whole, its kind and
    /// its text ([`crate::WireError`] is its JSON).
    Error(ComponentError),
}

/// The answer to one [`Request`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandReply {
    /// The request's id.
    pub id: u64,
    /// The command answered.
    pub command: Verb,
    /// The component's status right after the command (the same it published in `NAME/state`,
    /// which may reach the requester later than this reply).
    pub status: ComponentStatus,
    /// The result.
    pub outcome: Outcome,
}

impl CommandReply {
    /// The reply of a component, whose status is now `status`, to `request`.
    pub fn new(request: &Request, status: ComponentStatus, result: Result<Answer, ComponentError>) -> CommandReply {
        CommandReply {
            id: request.id,
            command: request.command.verb(),
            status,
            outcome: match result {
                Ok(a) => Outcome::Ok(a),
                Err(e) => Outcome::Error(e),
            },
        }
    }

    /// The reply as JSON (the payload of `REPLY_TO/reply`).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The result, as a `Result`.
    pub fn result(self) -> Result<Answer, ComponentError> {
        match self.outcome {
            Outcome::Ok(a) => Ok(a),
            Outcome::Error(e) => Err(e),
        }
    }
}

/// How far apart two statuses of one incarnation can be in `seq` and still be ordered by it:
/// a component publishes a status on every change and once a second, and the two paths a status
/// travels (`NAME/state`, and the reply to a command) are never that many publications apart.
/// A status whose `seq` is more than this below the last one taken is newer, not older: the
/// last one's number was not a real one (forged, or corrupted), and must not hide the real
/// ones for ever.
pub const SEQ_WINDOW: u64 = 100;

impl ComponentStatus {
    /// Whether this status is newer than one of the same incarnation numbered `last`: a
    /// higher `seq`, or one more than [`SEQ_WINDOW`] lower (`last` was not a real number).
    ///
    /// ```
    /// use daqflow_component::ComponentStatus;
    /// let s = |seq| ComponentStatus { name: "a".into(), kind: "k".into(), pid: 1, incarnation: Some(1), seq,
    ///     state: daqflow_component::State::Initial, run: None, since_ms: 0, error: None, cpus: None };
    /// assert!(s(8).is_newer_than(7));
    /// assert!(!s(7).is_newer_than(8));
    /// assert!(s(8).is_newer_than(1_000_000_000)); // a forged number does not pin the view
    /// ```
    pub fn is_newer_than(&self, last: u64) -> bool {
        self.seq > last || last - self.seq > SEQ_WINDOW
    }
}

/// What a component publishes in its `NAME/state` service, on every change and once a second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentStatus {
    /// The component's name.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// Its process id.
    pub pid: u32,
    /// The incarnation its operator launched it as (`--incarnation`, `DAQFLOW_INCARNATION`):
    /// a number the operator gives each process it starts, new at every start. The operator
    /// takes a status only from the incarnation it launched last; absent for a process nobody
    /// gave one (started by hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<u64>,
    /// Counts the publications of this incarnation, from 1: of two statuses of one
    /// incarnation, the higher `seq` is the newer (they travel different paths), unless it is
    /// more than [`SEQ_WINDOW`] higher (a number that far ahead was not this process's).
    pub seq: u64,
    /// Its state.
    pub state: State,
    /// The run it takes, or last took.
    pub run: Option<u32>,
    /// Since when (Unix ms) it is in this state.
    pub since_ms: u64,
    /// Why it is in Error, if it is.
    pub error: Option<String>,
    /// The CPUs its process may run on (its main thread's affinity, the kernel's list form
    /// `0-3,8`): what the component's `cpus` pinned it to, or what it inherited; absent where
    /// the OS cannot say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bad_payloads_are_refused_with_the_reason() {
        for (verb, payload, why) in [
            (Verb::Start, &b""[..], "must name the run"),
            (Verb::Start, b"99999999999", "out of range"),
            (Verb::Pause, b"3", "takes no number"),
            (Verb::Pause, br#"{"run": 3}"#, "takes no `run`"),
            (Verb::Start, br#"{"run": 3, "last_event": 9}"#, "takes no `last_event`"),
            (Verb::Stop, br#"{"config": {}}"#, "takes no `config`"),
            (Verb::Stop, br#"{"colour": 1}"#, "unknown field `colour`"),
            (Verb::Configure, b"\xff\xfe", "not UTF-8"),
            (Verb::Configure, b"[1,2]", "not a request"),
        ] {
            let e = Request::decode(verb, payload).unwrap_err().to_string();
            assert!(e.contains(why) && e.starts_with(&format!("bad command: {verb}")), "{e}");
        }
    }

    #[test]
    fn a_person_may_send_bare_payloads() {
        assert_eq!(Request::decode(Verb::Stop, b" 40 ").unwrap().command, Command::Stop { last_event: Some(40) });
        assert_eq!(
            Request::decode(Verb::Reset, b"").unwrap(),
            Request { id: 0, reply_to: None, command: Command::Reset }
        );
        let c = Request::decode(Verb::Configure, br#"{"id": 3, "config": {"batch": 8}}"#).unwrap();
        assert_eq!(c.id, 3);
        let Command::Configure { config: Some(t) } = c.command else { panic!("{c:?}") };
        assert_eq!(t["batch"].as_integer(), Some(8));
    }

    fn command() -> impl Strategy<Value = Command> {
        prop_oneof![
            any::<Option<u8>>().prop_map(|n| Command::Configure {
                config: n.map(|n| {
                    let mut t = toml::Table::new();
                    t.insert("n".into(), toml::Value::Integer(n.into()));
                    t
                })
            }),
            any::<u32>().prop_map(|run| Command::Start { run }),
            Just(Command::Pause),
            Just(Command::Resume),
            any::<Option<u64>>().prop_map(|last_event| Command::Stop { last_event }),
            Just(Command::Reset),
        ]
    }

    proptest! {
        #[test]
        fn requests_round_trip(id: u64, reply_to in proptest::option::of("[a-z0-9/_-]{1,20}"), command in command()) {
            let r = Request { id, reply_to, command };
            let (verb, payload) = r.encode();
            prop_assert_eq!(Request::decode(verb, &payload).unwrap(), r);
        }

        #[test]
        fn any_payload_is_a_request_or_an_error(payload in proptest::collection::vec(any::<u8>(), 0..64), v in 0usize..6) {
            let _ = Request::decode(Verb::ALL[v], &payload);
        }

        #[test]
        fn any_reply_text_is_a_reply_or_an_error(text in ".{0,80}") {
            let _ = serde_json::from_str::<CommandReply>(&text);
        }
    }
}
