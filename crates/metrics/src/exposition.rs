//! Prometheus' text exposition format, version 0.0.4: the one formatter of the workspace.
//!
//! A text is a list of families, each `# HELP NAME TEXT`, `# TYPE NAME TYPE` and its samples
//! `NAME{LABEL="VALUE",…} NUMBER`. Names are the program's own (constants), so a name that is
//! not a valid Prometheus name is a bug, caught by a debug assertion; label *values* come from
//! anywhere (component names, station names, statistics keys) and are escaped here.

use std::borrow::Cow;
use std::fmt::Write as _;

/// The type of a metric family (`# TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// A number that only goes up (reset when the process or the run starts again).
    Counter,
    /// A number that goes up and down.
    Gauge,
}

impl MetricType {
    /// The name in `# TYPE`.
    pub fn name(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
        }
    }
}

/// A sample's value: an integer, written exactly, or a float (`NaN`, `+Inf`, `-Inf` as
/// Prometheus spells them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A count.
    Unsigned(u64),
    /// Anything else.
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Unsigned(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Unsigned(u64::from(v))
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Value {
        Value::Unsigned(v as u64)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Unsigned(u64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Value::Unsigned(v) => write!(f, "{v}"),
            Value::Float(v) if v.is_nan() => f.write_str("NaN"),
            Value::Float(v) if v == f64::INFINITY => f.write_str("+Inf"),
            Value::Float(v) if v == f64::NEG_INFINITY => f.write_str("-Inf"),
            Value::Float(v) => write!(f, "{v}"),
        }
    }
}

/// A label value as the text format wants it: `\`, `"` and newlines escaped.
pub fn escape_label_value(s: &str) -> Cow<'_, str> {
    if !s.contains(['\\', '"', '\n']) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
}

/// A `# HELP` text: `\` and newlines escaped.
fn escape_help(s: &str) -> Cow<'_, str> {
    if !s.contains(['\\', '\n']) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(s.replace('\\', "\\\\").replace('\n', "\\n"))
}

/// Whether `name` is a valid metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`), or with `colon` false a
/// valid label name (`[a-zA-Z_][a-zA-Z0-9_]*`).
fn valid_name(name: &str, colon: bool) -> bool {
    let ok = |c: char, first: bool| {
        c.is_ascii_alphabetic() || c == '_' || (colon && c == ':') || (!first && c.is_ascii_digit())
    };
    let mut chars = name.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false))
}

/// A text in the exposition format, written family by family.
///
/// ```
/// use daqflow_metrics::{Exposition, MetricType};
/// let mut e = Exposition::new();
/// e.family("daqflow_et_station_queued", "Events in the station's input list.", MetricType::Gauge)
///     .sample(&[("system", "daq"), ("station", "GRAND_CENTRAL")], 2990u32)
///     .sample(&[("system", "daq"), ("station", "mon")], 10u32);
/// e.family("daqflow_example_ratio", "A ratio.", MetricType::Gauge).sample(&[], f64::NAN);
/// let text = e.into_string();
/// assert!(text.contains("daqflow_et_station_queued{system=\"daq\",station=\"mon\"} 10\n"));
/// assert!(text.ends_with("daqflow_example_ratio NaN\n"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// An empty text.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts a family: writes its `# HELP` and `# TYPE` lines; add its samples to what this
    /// returns. `name` must be a valid metric name (a program's constant).
    pub fn family<'a>(&'a mut self, name: &'a str, help: &str, kind: MetricType) -> Family<'a> {
        debug_assert!(valid_name(name, true), "`{name}` is not a Prometheus metric name");
        let _ = writeln!(self.text, "# HELP {name} {}\n# TYPE {name} {}", escape_help(help), kind.name());
        Family { text: &mut self.text, name }
    }

    /// Appends another text (a family must not be split across the two).
    pub fn append(&mut self, other: &Exposition) {
        self.text.push_str(&other.text);
    }

    /// The text so far.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// The text.
    pub fn into_string(self) -> String {
        self.text
    }
}

/// The family being written: [`Family::sample`] adds one sample line.
#[derive(Debug)]
pub struct Family<'a> {
    text: &'a mut String,
    name: &'a str,
}

impl<'a> Family<'a> {
    /// Adds a sample with these labels (names: valid label names; values: anything, escaped
    /// here) and this value.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl Into<Value>) -> &mut Family<'a> {
        let text = &mut *self.text;
        text.push_str(self.name);
        if !labels.is_empty() {
            text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                debug_assert!(valid_name(k, false), "`{k}` is not a Prometheus label name");
                if i > 0 {
                    text.push(',');
                }
                let _ = write!(text, "{k}=\"{}\"", escape_label_value(v));
            }
            text.push('}');
        }
        let _ = writeln!(text, " {}", value.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_family_has_its_help_its_type_and_its_samples() {
        let mut e = Exposition::new();
        e.family("daqflow_a_total", "Back\\slash and\nnewline.", MetricType::Counter)
            .sample(&[], 7u64)
            .sample(&[("who", "x\"y\\z\nw")], u64::MAX);
        e.family("daqflow_b", "Floats.", MetricType::Gauge)
            .sample(&[("k", "1")], 0.5)
            .sample(&[("k", "2")], f64::INFINITY)
            .sample(&[("k", "3")], f64::NEG_INFINITY)
            .sample(&[("k", "4")], 3.0)
            .sample(&[("k", "5")], true);
        assert_eq!(
            e.as_str(),
            "# HELP daqflow_a_total Back\\\\slash and\\nnewline.\n# TYPE daqflow_a_total counter\n\
             daqflow_a_total 7\n\
             daqflow_a_total{who=\"x\\\"y\\\\z\\nw\"} 18446744073709551615\n\
             # HELP daqflow_b Floats.\n# TYPE daqflow_b gauge\n\
             daqflow_b{k=\"1\"} 0.5\ndaqflow_b{k=\"2\"} +Inf\ndaqflow_b{k=\"3\"} -Inf\ndaqflow_b{k=\"4\"} 3\n\
             daqflow_b{k=\"5\"} 1\n"
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_name("daqflow_x:y_1", true));
        assert!(!valid_name("daqflow_x:y", false));
        for bad in ["", "1abc", "a-b", "a b", "é"] {
            assert!(!valid_name(bad, true), "{bad}");
        }
    }

    proptest! {
        /// Whatever a label value holds, its sample stays one line that unescapes to it.
        #[test]
        fn any_label_value_makes_one_line_that_unescapes_to_it(v in any::<String>()) {
            let mut e = Exposition::new();
            e.family("daqflow_t", "T.", MetricType::Gauge).sample(&[("v", &v)], 1u64);
            let text = e.into_string();
            let line = text.lines().nth(2).unwrap();
            prop_assert_eq!(text.lines().count(), 3);
            let quoted = line.strip_prefix("daqflow_t{v=\"").unwrap().strip_suffix("\"} 1").unwrap();
            let mut back = String::new();
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    match chars.next() {
                        Some('n') => back.push('\n'),
                        Some(o) => back.push(o),
                        None => prop_assert!(false, "a lone backslash"),
                    }
                } else {
                    prop_assert!(c != '"', "an unescaped quote");
                    back.push(c);
                }
            }
            prop_assert_eq!(back, v);
        }
    }
}
