//! The errors of the component framework, and their form on the wire: a command's reply
//! carries a [`ComponentError`] whole (its kind and its fields, with the text a person reads),
//! so that the operator and any other client act on the kind, not on the words.

use serde::{Deserialize, Serialize};

use crate::{State, Verb};

/// Why a component refused or failed a command.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ComponentError {
    /// The command is not allowed in the component's state ([`Verb::transition`]).
    #[error("cannot {command} in state {state}")]
    IllegalTransition {
        /// The command refused.
        command: Verb,
        /// The state the component is in.
        state: State,
    },
    /// The configuration is wrong: an unknown or missing key, a bad value.
    #[error("configuration: {0}")]
    Config(String),
    /// The component kind is not known to this binary.
    #[error("unknown component kind `{0}` (known: {1})")]
    UnknownKind(String, String),
    /// A command's payload could not be read; the text says why.
    #[error("bad command: {0}")]
    BadCommand(String),
    /// A request the component does not take in its state (a live parameter it does not
    /// declare, or not now); nothing changed.
    #[error("{0}")]
    Refused(String),
    /// The hook failed; the text says why.
    #[error("{0}")]
    Failed(String),
}

impl From<std::io::Error> for ComponentError {
    fn from(e: std::io::Error) -> Self {
        ComponentError::Failed(e.to_string())
    }
}

/// What kind of error a reply carries (`"kind"` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// [`ComponentError::IllegalTransition`]: nothing was done; `command` and `state` say why.
    IllegalTransition,
    /// [`ComponentError::Config`]: the configuration was refused; the component is in Error.
    Config,
    /// [`ComponentError::UnknownKind`]: this process does not know the kind.
    UnknownKind,
    /// [`ComponentError::BadCommand`]: the request could not be read; nothing was done.
    BadCommand,
    /// [`ComponentError::Refused`]: not taken in this state; nothing changed.
    Refused,
    /// [`ComponentError::Failed`]: the hook failed; the component is in Error.
    Failed,
}

/// A [`ComponentError`] on the wire: `{"kind": …, "message": …}`, with `command` and `state`
/// for an illegal transition and `known` (the kinds this process knows) for an unknown kind.
/// `message` is the error's text, what a person reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireError {
    /// The error's kind.
    pub kind: ErrorKind,
    /// Its text.
    pub message: String,
    /// The command refused (an illegal transition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Verb>,
    /// The component's state (an illegal transition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    /// The kinds this process knows (an unknown kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known: Option<String>,
}

impl ComponentError {
    /// Its kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ComponentError::IllegalTransition { .. } => ErrorKind::IllegalTransition,
            ComponentError::Config(_) => ErrorKind::Config,
            ComponentError::UnknownKind(..) => ErrorKind::UnknownKind,
            ComponentError::BadCommand(_) => ErrorKind::BadCommand,
            ComponentError::Refused(_) => ErrorKind::Refused,
            ComponentError::Failed(_) => ErrorKind::Failed,
        }
    }

    /// A hook called outside the states the table allows its command in ([`Verb::transition`]):
    /// what a kind answers when called without a [`crate::Driver`] (which refuses such a call
    /// before any hook runs), with the allowed states named from the table. `Refused`: nothing
    /// changed.
    ///
    /// ```
    /// use daqflow_component::{ComponentError, Verb};
    /// let e = ComponentError::out_of_order(Verb::Stop, "no run is taken");
    /// assert_eq!(e.to_string(), "cannot stop now (no run is taken): only in state Running, Paused or Error");
    /// ```
    pub fn out_of_order(command: Verb, why: &str) -> ComponentError {
        let states: Vec<&str> =
            command.transition().map(|(from, _)| from.iter().map(|s| s.name()).collect()).unwrap_or_default();
        let list = match states.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            Some((last, _)) => (*last).to_owned(),
            None => "a configured state".to_owned(),
        };
        ComponentError::Refused(format!("cannot {command} now ({why}): only in state {list}"))
    }

    /// Whether the command changed nothing (refused before anything was done), as opposed to
    /// a hook that failed, leaving the component in Error.
    pub fn changed_nothing(&self) -> bool {
        matches!(
            self,
            ComponentError::IllegalTransition { .. } | ComponentError::BadCommand(_) | ComponentError::Refused(_)
        )
    }
}

/// The text of a variant's payload: the message less the prefix its `Display` adds.
fn payload(message: &str, prefix: &str) -> String {
    message.strip_prefix(prefix).unwrap_or(message).to_owned()
}

impl From<&ComponentError> for WireError {
    fn from(e: &ComponentError) -> WireError {
        let mut w = WireError { kind: e.kind(), message: e.to_string(), command: None, state: None, known: None };
        match e {
            ComponentError::IllegalTransition { command, state } => {
                w.command = Some(*command);
                w.state = Some(*state);
            }
            ComponentError::UnknownKind(_, known) => w.known = Some(known.clone()),
            _ => {}
        }
        w
    }
}

impl From<WireError> for ComponentError {
    /// The error a reply carried. One whose fields are missing (an illegal transition without
    /// its command or state) is the failure its message says.
    fn from(w: WireError) -> ComponentError {
        match (w.kind, w.command, w.state) {
            (ErrorKind::IllegalTransition, Some(command), Some(state)) => {
                ComponentError::IllegalTransition { command, state }
            }
            (ErrorKind::Config, ..) => ComponentError::Config(payload(&w.message, "configuration: ")),
            (ErrorKind::UnknownKind, ..) => {
                let name = w
                    .message
                    .strip_prefix("unknown component kind `")
                    .and_then(|r| r.split_once('`'))
                    .map_or(w.message.clone(), |(n, _)| n.to_owned());
                ComponentError::UnknownKind(name, w.known.unwrap_or_default())
            }
            (ErrorKind::BadCommand, ..) => ComponentError::BadCommand(payload(&w.message, "bad command: ")),
            (ErrorKind::Refused, ..) => ComponentError::Refused(w.message),
            _ => ComponentError::Failed(w.message),
        }
    }
}

impl Serialize for ComponentError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        WireError::from(self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for ComponentError {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ComponentError, D::Error> {
        WireError::deserialize(d).map(ComponentError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_crosses_the_wire_whole() {
        for e in [
            ComponentError::IllegalTransition { command: Verb::Start, state: State::Running },
            ComponentError::Config("`batch` = 0 is out of range".into()),
            ComponentError::UnknownKind("rru".into(), "ru, bu".into()),
            ComponentError::BadCommand("start: the payload must name the run".into()),
            ComponentError::Refused("`step` cannot change while Paused".into()),
            ComponentError::Failed("disk full".into()),
        ] {
            let json = serde_json::to_value(&e).unwrap();
            assert_eq!(json["message"], e.to_string());
            let back: ComponentError = serde_json::from_value(json).unwrap();
            assert_eq!(back, e);
        }
        let json =
            serde_json::to_value(ComponentError::IllegalTransition { command: Verb::Resume, state: State::Configured })
                .unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "illegal_transition", "message": "cannot resume in state Configured",
                "command": "resume", "state": "Configured"})
        );
    }

    #[test]
    fn a_reply_from_elsewhere_with_missing_fields_is_the_failure_it_says() {
        let e: ComponentError =
            serde_json::from_str(r#"{"kind": "illegal_transition", "message": "cannot start now"}"#).unwrap();
        assert_eq!(e, ComponentError::Failed("cannot start now".into()));
        assert!(serde_json::from_str::<ComponentError>(r#"{"kind": "oops", "message": "x"}"#).is_err());
        assert!(serde_json::from_str::<ComponentError>(r#""cannot start in state Running""#).is_err());
    }
}
