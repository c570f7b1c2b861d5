//! The alarms' condition language (`when = "…"` of a system file's `[[alarm]]`), a small
//! parser with no I/O. `docs/operator-guide.md`, "Alarms", has the grammar:
//!
//! ```text
//! condition = test [ "for" NUMBER TIME ] [ "while" SYSTEM_STATE { "," SYSTEM_STATE } ]
//! test      = COMPONENT "." KEY OP NUMBER [ SIZE ]             (a slow value)
//!           | ( COMPONENT | "any" ) "in" STATE { "," STATE }   (a component's state)
//!           | "disk" ( DIR | "data" ) "free" OP NUMBER SIZE     (free space of a directory)
//! OP        = "<" | "<=" | ">" | ">=" | "==" | "!="
//! TIME      = "ms" | "s" | "min" | "h"
//! SIZE      = "B" | "kB" | "MB" | "GB" | "TB" | "KiB" | "MiB" | "GiB" | "TiB"
//! ```
//!
//! ```
//! use daqflow_runcontrol::alarm::{Condition, Test};
//! let c = Condition::parse("evm.events_per_s < 1000 for 10 s while Running", &["evm"]).unwrap();
//! assert_eq!(c.hold, std::time::Duration::from_secs(10));
//! assert!(matches!(c.test, Test::Value { ref component, ref key, .. } if component == "evm" && key == "events_per_s"));
//! let e = Condition::parse("evb.events_per_s < 1000", &["evm"]).unwrap_err();
//! assert!(e.to_string().contains("no component `evb`"), "{e}");
//! ```

use std::path::PathBuf;
use std::time::Duration;

use daqflow_api::{ComponentState, SystemState};

/// Why a condition does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    /// The text does not follow the grammar.
    #[error("condition {text:?}: {what}")]
    Syntax {
        /// The condition.
        text: String,
        /// What is wrong and where.
        what: String,
    },
    /// It names a component the system does not have.
    #[error("condition {text:?}: there is no component `{name}` (the system has: {known})")]
    UnknownComponent {
        /// The condition.
        text: String,
        /// The name it used.
        name: String,
        /// The system's components.
        known: String,
    },
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `<`
    Less,
    /// `<=`
    LessOrEqual,
    /// `>`
    Greater,
    /// `>=`
    GreaterOrEqual,
    /// `==`
    Equal,
    /// `!=`
    NotEqual,
}

impl Op {
    /// Whether `a OP b`.
    pub fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Op::Less => a < b,
            Op::LessOrEqual => a <= b,
            Op::Greater => a > b,
            Op::GreaterOrEqual => a >= b,
            Op::Equal => a == b,
            Op::NotEqual => a != b,
        }
    }

    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "<" => Op::Less,
            "<=" => Op::LessOrEqual,
            ">" => Op::Greater,
            ">=" => Op::GreaterOrEqual,
            "==" => Op::Equal,
            "!=" => Op::NotEqual,
            _ => return None,
        })
    }
}

/// The directory of a `disk` test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disk {
    /// The system's data directory (`disk data`).
    Data,
    /// A directory (relative: to where the operator runs).
    Dir(PathBuf),
}

/// What a condition tests.
#[derive(Debug, Clone, PartialEq)]
pub enum Test {
    /// `COMPONENT.KEY OP NUMBER`: a slow value (a key of `Stats::values`).
    Value {
        /// The component.
        component: String,
        /// The key of its stats (`events_per_s`, `detail.free_bytes`, …).
        key: String,
        /// The comparison.
        op: Op,
        /// The number compared with (units applied).
        limit: f64,
    },
    /// `COMPONENT in STATE,…` (`any`: some component).
    State {
        /// The component; `None` for `any`.
        component: Option<String>,
        /// The states that make it hold.
        states: Vec<ComponentState>,
    },
    /// `disk DIR free OP NUMBER SIZE`.
    Disk {
        /// The directory.
        dir: Disk,
        /// The comparison.
        op: Op,
        /// Bytes.
        limit: f64,
    },
}

/// A parsed condition.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// The text, as written.
    pub text: String,
    /// What it tests.
    pub test: Test,
    /// How long the test must hold before the alarm is raised (`for`; zero without).
    pub hold: Duration,
    /// The system states in which it is tested (`while`; empty: in every state).
    pub states: Vec<SystemState>,
}

/// The longest condition accepted, in bytes.
pub const MAX_CONDITION_LEN: usize = 1000;

/// The words of a condition: operators, commas, quoted strings and runs of anything else.
fn tokens(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some(&(i, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == ',' {
            chars.next();
            out.push(",".to_owned());
        } else if "<>=!".contains(c) {
            chars.next();
            let mut op = c.to_string();
            if let Some(&(_, '=')) = chars.peek() {
                chars.next();
                op.push('=');
            }
            if Op::parse(&op).is_none() {
                return Err(format!("`{op}` at character {} is not a comparison (< <= > >= == !=)", i + 1));
            }
            out.push(op);
        } else if c == '"' {
            chars.next();
            let mut s = String::new();
            loop {
                match chars.next() {
                    Some((_, '"')) => break,
                    Some((_, ch)) => s.push(ch),
                    None => return Err(format!("the quote at character {} is not closed", i + 1)),
                }
            }
            if s.is_empty() {
                return Err(format!("an empty quoted string at character {}", i + 1));
            }
            // Marked as quoted: never a keyword.
            out.push(format!("\"{s}"));
        } else {
            let mut s = String::new();
            while let Some(&(_, ch)) = chars.peek() {
                if ch.is_whitespace() || ch == ',' || "<>=!\"".contains(ch) {
                    break;
                }
                s.push(ch);
                chars.next();
            }
            out.push(s);
        }
    }
    Ok(out)
}

/// `NUMBER` or `NUMBERUNIT` (one word or two) at `words[*at]`: the number and its unit, if any.
fn number_and_unit(words: &[String], at: &mut usize) -> Result<(f64, Option<String>), String> {
    let word = words.get(*at).ok_or("a number is missing at the end")?;
    *at += 1;
    let split = word.len() - word.bytes().rev().take_while(u8::is_ascii_alphabetic).count();
    let (digits, unit) = word.split_at(split);
    // A bare exponent such as `1e` is no number.
    let number: f64 = digits.parse().map_err(|_| format!("`{word}` is not a number"))?;
    if !number.is_finite() {
        return Err(format!("`{word}` is not a finite number"));
    }
    if !unit.is_empty() {
        return Ok((number, Some(unit.to_owned())));
    }
    match words.get(*at) {
        Some(next) if !next.is_empty() && next.bytes().all(|b| b.is_ascii_alphabetic()) && !is_keyword(next) => {
            *at += 1;
            Ok((number, Some(next.clone())))
        }
        _ => Ok((number, None)),
    }
}

fn is_keyword(w: &str) -> bool {
    matches!(w, "for" | "while")
}

/// Bytes per unit of size.
fn size_unit(u: &str) -> Option<f64> {
    Some(match u {
        "B" => 1.0,
        "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    })
}

const SIZES: &str = "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB";

/// Seconds per unit of time.
fn time_unit(u: &str) -> Option<f64> {
    Some(match u {
        "ms" => 1e-3,
        "s" => 1.0,
        "min" => 60.0,
        "h" => 3600.0,
        _ => return None,
    })
}

/// The longest `for` accepted: a day.
pub const MAX_HOLD: Duration = Duration::from_secs(86_400);

fn component_state(w: &str) -> Option<ComponentState> {
    [
        ComponentState::Starting,
        ComponentState::Initial,
        ComponentState::Configured,
        ComponentState::Running,
        ComponentState::Paused,
        ComponentState::Error,
        ComponentState::Dead,
    ]
    .into_iter()
    .find(|s| s.name() == w)
}

fn system_state(w: &str) -> Option<SystemState> {
    SystemState::ALL.into_iter().find(|s| s.name() == w)
}

/// `NAME,NAME,…` from `words[*at]` on, each read by `one`.
fn list<T>(words: &[String], at: &mut usize, what: &str, one: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    loop {
        let w = words.get(*at).ok_or_else(|| format!("{what} is missing at the end"))?;
        out.push(one(w).ok_or_else(|| format!("`{w}` is not {what}"))?);
        *at += 1;
        if words.get(*at).map(String::as_str) == Some(",") {
            *at += 1;
        } else {
            return Ok(out);
        }
    }
}

impl Condition {
    /// Parses `text`; `components` are the system's component names (a slow value or a state
    /// test must name one of them).
    pub fn parse(text: &str, components: &[&str]) -> Result<Condition, ConditionError> {
        let syntax = |what: String| ConditionError::Syntax { text: text.to_owned(), what };
        if text.len() > MAX_CONDITION_LEN {
            return Err(syntax(format!("longer than {MAX_CONDITION_LEN} bytes")));
        }
        let words = tokens(text).map_err(syntax)?;
        let unknown = |name: &str| ConditionError::UnknownComponent {
            text: text.to_owned(),
            name: name.to_owned(),
            known: components.join(", "),
        };
        let first = words.first().ok_or_else(|| syntax("it is empty".into()))?;
        let mut at = 1;
        let comparison = |at: &mut usize| -> Result<Op, ConditionError> {
            let w =
                words.get(*at).ok_or_else(|| syntax("a comparison (< <= > >= == !=) is missing at the end".into()))?;
            *at += 1;
            Op::parse(w).ok_or_else(|| syntax(format!("`{w}` is not a comparison (< <= > >= == !=)")))
        };
        let test = if words.get(1).map(String::as_str) == Some("in") {
            let name = first.trim_start_matches('"');
            let component = if first == "any" {
                None
            } else if components.contains(&name) {
                Some(name.to_owned())
            } else {
                return Err(unknown(name));
            };
            at = 2;
            let states = list(
                &words,
                &mut at,
                "a component state (Starting, Initial, Configured, Running, Paused, Error, Dead)",
                component_state,
            )
            .map_err(syntax)?;
            Test::State { component, states }
        } else if first == "disk" {
            let dir = words.get(1).ok_or_else(|| syntax("`disk` needs a directory (or `data`)".into()))?;
            let dir = match dir.as_str() {
                "data" => Disk::Data,
                "free" | "," | "<" | "<=" | ">" | ">=" | "==" | "!=" => {
                    return Err(syntax("`disk` needs a directory (or `data`) before `free`".into()));
                }
                d => Disk::Dir(PathBuf::from(d.trim_start_matches('"'))),
            };
            if words.get(2).map(String::as_str) != Some("free") {
                return Err(syntax("`disk DIR` must be followed by `free` (`disk data free < 5 GB`)".into()));
            }
            at = 3;
            let op = comparison(&mut at)?;
            let (n, unit) = number_and_unit(&words, &mut at).map_err(syntax)?;
            let unit = unit.ok_or_else(|| syntax(format!("the free space needs a unit ({SIZES})")))?;
            let scale = size_unit(&unit).ok_or_else(|| syntax(format!("`{unit}` is not a unit of size ({SIZES})")))?;
            Test::Disk { dir, op, limit: n * scale }
        } else {
            let name = first.as_str();
            // The longest component name followed by a dot (names may hold dots).
            let component = components
                .iter()
                .filter(|c| name.len() > c.len() + 1 && name.starts_with(**c) && name.as_bytes()[c.len()] == b'.')
                .max_by_key(|c| c.len());
            let Some(component) = component else {
                return Err(match name.split_once('.') {
                    Some((c, k)) if !c.is_empty() && !k.is_empty() && !name.starts_with('"') => unknown(c),
                    _ => syntax(format!(
                        "`{name}` is not a slow value (COMPONENT.KEY), `COMPONENT in STATE`, `any in STATE` or `disk DIR free`"
                    )),
                });
            };
            let key = name[component.len() + 1..].to_owned();
            let op = comparison(&mut at)?;
            let (n, unit) = number_and_unit(&words, &mut at).map_err(syntax)?;
            let scale = match unit {
                None => 1.0,
                Some(u) => size_unit(&u).ok_or_else(|| syntax(format!("`{u}` is not a unit of size ({SIZES})")))?,
            };
            Test::Value { component: (*component).to_owned(), key, op, limit: n * scale }
        };
        let mut hold = Duration::ZERO;
        let mut states = Vec::new();
        if words.get(at).map(String::as_str) == Some("for") {
            at += 1;
            let (n, unit) = number_and_unit(&words, &mut at).map_err(syntax)?;
            let unit = unit.ok_or_else(|| syntax("the time after `for` needs a unit (ms, s, min, h)".into()))?;
            let scale =
                time_unit(&unit).ok_or_else(|| syntax(format!("`{unit}` is not a unit of time (ms, s, min, h)")))?;
            let seconds = n * scale;
            if !(0.0..=MAX_HOLD.as_secs_f64()).contains(&seconds) {
                return Err(syntax(format!("`for` must be 0 … {} s", MAX_HOLD.as_secs())));
            }
            hold = Duration::from_secs_f64(seconds);
        }
        if words.get(at).map(String::as_str) == Some("while") {
            at += 1;
            states =
                list(&words, &mut at, "a system state (Initial, Configured, Running, Paused, Error, …)", system_state)
                    .map_err(syntax)?;
        }
        if let Some(rest) = words.get(at) {
            return Err(syntax(format!(
                "`{}` is left over (after the test come only `for TIME` and `while STATE`)",
                rest.trim_start_matches('"')
            )));
        }
        Ok(Condition { text: text.to_owned(), test, hold, states })
    }

    /// The components it names.
    pub fn component(&self) -> Option<&str> {
        match &self.test {
            Test::Value { component, .. } => Some(component),
            Test::State { component, .. } => component.as_deref(),
            Test::Disk { .. } => None,
        }
    }
}

/// One `[[alarm]]` of the system file.
#[derive(Debug, Clone, PartialEq)]
pub struct AlarmSpec {
    /// Its name (unique in the system: what `ack NAME` and `POST /api/alarms/ack` take).
    pub name: String,
    /// `warning` (the default) or `error`.
    pub severity: daqflow_api::alarms::AlarmSeverity,
    /// When it is raised.
    pub condition: Condition,
    /// The text shown and logged (default: the condition).
    pub message: String,
    /// Whether an alarm whose condition ended goes back to Ok by itself, acknowledged or not
    /// (default `false`: it waits, cleared, for a person to acknowledge it, as in MIDAS).
    pub auto_clear: bool,
    /// The line of its `name`.
    pub line: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NAMES: &[&str] = &["evm", "ru-0", "rec", "bu.a"];

    fn parse(t: &str) -> Result<Condition, ConditionError> {
        Condition::parse(t, NAMES)
    }

    #[test]
    fn every_form_of_the_grammar_parses() {
        let c = parse("evm.events_per_s < 1000 for 10 s while Running").unwrap();
        assert_eq!(
            c.test,
            Test::Value { component: "evm".into(), key: "events_per_s".into(), op: Op::Less, limit: 1000.0 }
        );
        assert_eq!((c.hold, c.states.clone()), (Duration::from_secs(10), vec![SystemState::Running]));
        let c = parse("rec.detail.free_bytes<=5GB for 2min while Running,Paused").unwrap();
        assert_eq!(
            c.test,
            Test::Value { component: "rec".into(), key: "detail.free_bytes".into(), op: Op::LessOrEqual, limit: 5e9 }
        );
        assert_eq!((c.hold, c.states.len()), (Duration::from_secs(120), 2));
        let c = parse("bu.a.trigger.lost != 0").unwrap();
        assert!(
            matches!(c.test, Test::Value { ref component, ref key, op: Op::NotEqual, .. } if component == "bu.a" && key == "trigger.lost")
        );
        assert_eq!((c.hold, c.states.len()), (Duration::ZERO, 0));
        let c = parse("ru-0 in Error, Dead for 500 ms").unwrap();
        assert_eq!(
            c.test,
            Test::State { component: Some("ru-0".into()), states: vec![ComponentState::Error, ComponentState::Dead] }
        );
        assert_eq!(c.hold, Duration::from_millis(500));
        assert_eq!(
            parse("any in Error").unwrap().test,
            Test::State { component: None, states: vec![ComponentState::Error] }
        );
        assert_eq!(
            parse("disk data free < 5 GB").unwrap().test,
            Test::Disk { dir: Disk::Data, op: Op::Less, limit: 5e9 }
        );
        assert_eq!(
            parse("disk \"/mnt/my disk\" free >= 2 GiB while Running").unwrap().test,
            Test::Disk {
                dir: Disk::Dir("/mnt/my disk".into()),
                op: Op::GreaterOrEqual,
                limit: 2.0 * 1024.0 * 1024.0 * 1024.0
            }
        );
        assert_eq!(
            parse("evm.x == 1.5e3").unwrap().test,
            Test::Value { component: "evm".into(), key: "x".into(), op: Op::Equal, limit: 1500.0 }
        );
        assert_eq!(
            parse("evm.x > 2 h").unwrap_err().to_string(),
            "condition \"evm.x > 2 h\": `h` is not a unit of size (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        );
    }

    #[test]
    fn bad_conditions_say_what_is_wrong() {
        for (text, says) in [
            ("", "empty"),
            ("evb.events_per_s < 1000", "no component `evb`"),
            ("nobody in Error", "no component `nobody`"),
            ("evm.events_per_s", "comparison"),
            ("evm.events_per_s = 3", "`=` at character 18 is not a comparison"),
            ("evm.events_per_s < lots", "`lots` is not a number"),
            ("evm.events_per_s < 1 for 10", "needs a unit"),
            ("evm.events_per_s < 1 for 10 years", "`years` is not a unit of time"),
            ("evm.events_per_s < 1 for -1 s", "`for` must be"),
            ("evm.events_per_s < 1 while Sleeping", "`Sleeping` is not a system state"),
            ("evm.events_per_s < 1 while Running, ", "missing at the end"),
            ("evm in Happy", "`Happy` is not a component state"),
            ("disk data free < 5", "needs a unit"),
            ("disk data < 5 GB", "followed by `free`"),
            ("disk", "needs a directory"),
            ("evm.events_per_s < 1 GB please", "`please` is left over"),
            ("evm.events_per_s < 1 please", "`please` is not a unit of size"),
            ("events_per_s < 1", "is not a slow value"),
            ("evm.events_per_s < \"1", "not closed"),
            ("evm.events_per_s < 1e999", "not a finite number"),
            ("evm.events_per_s < inf", "`inf` is not a number"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        assert!(parse(&"evm.x < 1 ".repeat(200)).unwrap_err().to_string().contains("longer than"));
    }

    proptest! {
        #[test]
        fn random_text_never_panics(text in ".{0,80}") {
            let _ = parse(&text);
        }

        #[test]
        fn random_words_of_the_language_never_panic(words in proptest::collection::vec(
            proptest::sample::select(vec![
                "evm.events_per_s", "ru-0", "any", "in", "disk", "data", "free", "for", "while", "<", "<=", "==",
                "!=", ">", "1", "1e3", "5GB", "GB", "s", "min", "Running", "Error", "Dead", ",", "\"", "bu.a.x",
            ]),
            0..12,
        )) {
            let _ = parse(&words.join(" "));
        }
    }
}
