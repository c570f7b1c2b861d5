//! The standard-input protocol of a component process, typed: one command per [`Line`] in, one
//! [`Answer`](LineAnswer) per command out, and the [`LineEvent`]s the process prints by itself.
//! A person types the lines (`configure`, `start 12`, `stop`); a program that drives a
//! component this way (`daqflow evb local --join-bu`, `daqflow bench chain`) writes a [`Line`]
//! and reads a [`LineOutput`], never the text by hand.
//!
//! ```
//! use daqflow_component::stdin::{Line, LineOutput};
//! use daqflow_component::{Command, State};
//!
//! let line: Line = "start 12".parse().unwrap();
//! assert_eq!(line, Line::Command(Command::Start { run: 12 }));
//! assert_eq!(line.to_string(), "start 12");
//! assert_eq!("start".parse::<Line>().unwrap_err().to_string(), "usage: start RUN");
//!
//! let out: LineOutput = serde_json::from_str(r#"{"ok":false,"state":"Initial","error":"cannot start in state Initial","kind":"illegal_transition"}"#).unwrap();
//! let LineOutput::Answer(a) = out else { panic!() };
//! assert_eq!((a.ok, a.state), (false, State::Initial));
//! assert_eq!(a.into_result().unwrap_err().message, "cannot start in state Initial");
//! ```

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Answer, Command, ComponentError, ErrorKind, State};

/// One line of standard input.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// A command of the state machine, or `set KEY=VALUE`.
    Command(Command),
    /// `stats`: the live counters (the result is a [`crate::Stats`]).
    Stats,
    /// `state`: the state, and why it failed (`{"failure": …}`).
    State,
    /// `schema`: the kind's typed schema (null for a kind without one).
    Schema,
    /// `quit`: end (a running component stops first).
    Quit,
}

/// A line that is no command: what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LineError(pub String);

/// Every command a line may hold, for the error of an unknown one.
pub const LINES: &str =
    "configure, start RUN, pause, resume, stop [N], set KEY=VALUE, stats, state, schema, reset, quit";

impl std::str::FromStr for Line {
    type Err = LineError;

    /// A line as a person types it: a word and at most one argument, blanks around them.
    fn from_str(line: &str) -> Result<Line, LineError> {
        let mut words = line.split_whitespace();
        let verb = words.next().unwrap_or("");
        let arg = words.next();
        let usage = |u: &str| Err(LineError(format!("usage: {u}")));
        if words.next().is_some() {
            return Err(LineError(format!("`{verb}` takes one argument at most ({LINES})")));
        }
        Ok(Line::Command(match (verb, arg) {
            ("configure", None) => Command::Configure { config: None },
            ("start", Some(run)) => match run.parse() {
                Ok(run) => Command::Start { run },
                Err(_) => return usage("start RUN"),
            },
            ("start", None) => return usage("start RUN"),
            ("stop", last) => match last.map(str::parse::<u64>).transpose() {
                Ok(last_event) => Command::Stop { last_event },
                Err(_) => return usage("stop [LAST_EVENT]"),
            },
            ("pause", None) => Command::Pause,
            ("resume", None) => Command::Resume,
            ("reset", None) => Command::Reset,
            ("set", arg) => match arg.and_then(|a| a.split_once('=')) {
                Some((key, value)) if !key.is_empty() => Command::Set {
                    key: key.to_owned(),
                    value: serde_json::to_value(crate::process::parse_value(value)).unwrap_or(Value::Null),
                },
                _ => return usage("set KEY=VALUE"),
            },
            ("stats", None) => return Ok(Line::Stats),
            ("state", None) => return Ok(Line::State),
            ("schema", None) => return Ok(Line::Schema),
            ("quit", None) => return Ok(Line::Quit),
            ("configure" | "pause" | "resume" | "reset" | "stats" | "state" | "schema" | "quit", Some(_)) => {
                return Err(LineError(format!("`{verb}` takes no argument")));
            }
            (other, _) => return Err(LineError(format!("unknown command `{other}` ({LINES})"))),
        }))
    }
}

impl std::fmt::Display for Line {
    /// The line to write (a `configure` with keys, which a line cannot hold, is written bare).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Line::Command(Command::Start { run }) => write!(f, "start {run}"),
            Line::Command(Command::Stop { last_event: Some(n) }) => write!(f, "stop {n}"),
            Line::Command(Command::Set { key, value }) => match value {
                Value::String(s) => write!(f, "set {key}={s}"),
                v => write!(f, "set {key}={v}"),
            },
            Line::Command(c) => f.write_str(c.verb().name()),
            Line::Stats => f.write_str("stats"),
            Line::State => f.write_str("state"),
            Line::Schema => f.write_str("schema"),
            Line::Quit => f.write_str("quit"),
        }
    }
}

/// The answer to one command line: `{"ok": true, "state": …, "result": …}` or `{"ok": false,
/// "state": …, "error": "…", "kind": …}` (`kind`: the [`ErrorKind`], absent for a line that is
/// no command).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineAnswer {
    /// Whether the command was done.
    pub ok: bool,
    /// The component's state after it.
    pub state: State,
    /// What it returned: what `configure` tells the others, `{"run": N}` for `start`, the
    /// summary for `stop`, the counters for `stats`; absent (null) otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why it was refused or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The error's kind (a command the component refused or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
}

impl LineAnswer {
    /// The answer of a component now in `state` to a command that returned `result`.
    pub fn of(state: State, result: Result<Option<Value>, LineFailure>) -> LineAnswer {
        match result {
            Ok(result) => {
                LineAnswer { ok: true, state, result: result.filter(|v| !v.is_null()), error: None, kind: None }
            }
            Err(LineFailure::Component(e)) => {
                LineAnswer { ok: false, state, result: None, error: Some(e.to_string()), kind: Some(e.kind()) }
            }
            Err(LineFailure::Line(e)) => LineAnswer { ok: false, state, result: None, error: Some(e.0), kind: None },
        }
    }

    /// The result, or why not.
    pub fn into_result(self) -> Result<Value, Refusal> {
        if self.ok {
            return Ok(self.result.unwrap_or(Value::Null));
        }
        Err(Refusal { kind: self.kind, message: self.error.unwrap_or_else(|| "failed".into()) })
    }
}

/// Why a command line was not done, as its answer said.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// The component's error kind; `None` for a line that is no command.
    pub kind: Option<ErrorKind>,
    /// Why, as the component said it.
    pub message: String,
}

/// Why a line was not done: the component's error, or a line that is no command.
#[derive(Debug, Clone, PartialEq)]
pub enum LineFailure {
    /// The component refused or failed the command.
    Component(ComponentError),
    /// The line is no command.
    Line(LineError),
}

/// A line the process prints by itself: `{"event": "error", "error": "…"}`, when the
/// component fails during its run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineEvent {
    /// What happened: `error`.
    pub event: String,
    /// Why.
    pub error: String,
}

/// A line of a component process's standard output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LineOutput {
    /// Something that happened by itself.
    Event(LineEvent),
    /// The answer to the oldest command not yet answered.
    Answer(LineAnswer),
}

/// A command's answer as the JSON of an answer line's `result`: what configure tells the
/// others, `{"run": N}` for start, the summary for stop, null otherwise.
pub fn answer_json(answer: &Answer) -> Value {
    match answer {
        Answer::Nothing => Value::Null,
        Answer::Info(i) => Value::Object(i.clone()),
        Answer::Run(run) => serde_json::json!({ "run": run }),
        Answer::Summary(s) => serde_json::to_value(s).unwrap_or(Value::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lines_become_commands_or_say_how_to_write_them() {
        let p = |s: &str| s.parse::<Line>();
        assert_eq!(p("start 4"), Ok(Line::Command(Command::Start { run: 4 })));
        assert_eq!(p("  stop  "), Ok(Line::Command(Command::Stop { last_event: None })));
        assert_eq!(p("stop 40"), Ok(Line::Command(Command::Stop { last_event: Some(40) })));
        assert_eq!(p("start x").unwrap_err().0, "usage: start RUN");
        assert_eq!(p("stop -1").unwrap_err().0, "usage: stop [LAST_EVENT]");
        assert_eq!(p("set =3").unwrap_err().0, "usage: set KEY=VALUE");
        assert_eq!(p("pause now").unwrap_err().0, "`pause` takes no argument");
        assert_eq!(p("start 1 2").unwrap_err().0, format!("`start` takes one argument at most ({LINES})"));
        assert!(p("strat 1").unwrap_err().0.starts_with("unknown command `strat`"));
        assert_eq!(p("stats"), Ok(Line::Stats));
        assert_eq!(
            p("set rate_hz=2.5"),
            Ok(Line::Command(Command::Set { key: "rate_hz".into(), value: serde_json::json!(2.5) }))
        );
    }

    #[test]
    fn answers_keep_the_shapes_of_the_standard_input_protocol() {
        assert_eq!(answer_json(&Answer::Nothing), Value::Null);
        let mut info = crate::Info::new();
        info.insert("listen".into(), serde_json::json!("127.0.0.1:1"));
        assert_eq!(answer_json(&Answer::Info(info)), serde_json::json!({"listen": "127.0.0.1:1"}));
        assert_eq!(answer_json(&Answer::Summary(crate::Stats::counted(2, 9)))["events"], 2);
        let ok = LineAnswer::of(State::Running, Ok(Some(answer_json(&Answer::Run(3)))));
        assert_eq!(
            serde_json::to_value(&ok).unwrap(),
            serde_json::json!({"ok": true, "state": "Running", "result": {"run": 3}})
        );
        let done = LineAnswer::of(State::Paused, Ok(Some(Value::Null)));
        assert_eq!(serde_json::to_value(&done).unwrap(), serde_json::json!({"ok": true, "state": "Paused"}));
        let e = ComponentError::IllegalTransition { command: crate::Verb::Resume, state: State::Configured };
        let refused = LineAnswer::of(State::Configured, Err(LineFailure::Component(e.clone())));
        assert_eq!(
            serde_json::to_value(&refused).unwrap(),
            serde_json::json!({"ok": false, "state": "Configured", "error": "cannot resume in state Configured",
                "kind": "illegal_transition"})
        );
        let why = refused.into_result().unwrap_err();
        assert_eq!(
            (why.kind, why.message.as_str()),
            (Some(ErrorKind::IllegalTransition), "cannot resume in state Configured")
        );
        let not_a_line = LineAnswer::of(State::Initial, Err(LineFailure::Line(LineError("usage: start RUN".into()))));
        assert_eq!(not_a_line.into_result().unwrap_err(), Refusal { kind: None, message: "usage: start RUN".into() });
        let event: LineOutput = serde_json::from_str(r#"{"event":"error","error":"disk full"}"#).unwrap();
        assert_eq!(event, LineOutput::Event(LineEvent { event: "error".into(), error: "disk full".into() }));
    }

    fn line() -> impl Strategy<Value = Line> {
        prop_oneof![
            Just(Line::Command(Command::Configure { config: None })),
            any::<u32>().prop_map(|run| Line::Command(Command::Start { run })),
            Just(Line::Command(Command::Pause)),
            Just(Line::Command(Command::Resume)),
            any::<Option<u64>>().prop_map(|last_event| Line::Command(Command::Stop { last_event })),
            Just(Line::Command(Command::Reset)),
            ("[a-z_]{1,10}(\\.[a-z_]{1,6})?", -1000i64..1000)
                .prop_map(|(key, n)| Line::Command(Command::Set { key, value: serde_json::json!(n) })),
            Just(Line::Stats),
            Just(Line::State),
            Just(Line::Schema),
            Just(Line::Quit),
        ]
    }

    proptest! {
        #[test]
        fn every_line_written_reads_back(l in line()) {
            prop_assert_eq!(l.to_string().parse::<Line>(), Ok(l));
        }

        #[test]
        fn any_text_is_a_line_or_says_what_to_write(text in ".{0,40}") {
            let _ = text.parse::<Line>();
        }

        #[test]
        fn any_output_text_is_an_output_or_an_error(text in ".{0,80}") {
            let _ = serde_json::from_str::<LineOutput>(&text);
        }
    }
}
