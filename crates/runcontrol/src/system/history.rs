//! The system file's `[history]` table: what the operator samples into the run database's
//! history of slow values, how often, and for how long it keeps them
//! (`docs/operator-guide.md`, "The history of slow values").
//!
//! ```toml
//! [history]
//! interval_s = 5          # a sample of every value every 5 s
//! retention_days = 7      # samples older than this are deleted
//! services = ["hv/state"] # dialog services whose numbers are sampled too
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// The shortest `interval_s`, in seconds.
pub const MIN_INTERVAL_S: f64 = 0.1;
/// The longest `interval_s`, in seconds (a day).
pub const MAX_INTERVAL_S: f64 = 86_400.0;
/// The longest `retention_days` (a hundred years).
pub const MAX_RETENTION_DAYS: f64 = 36_500.0;

/// The `[history]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistorySection {
    /// Whether the operator samples at all (default true).
    #[serde(default = "default_enabled")]
    pub enabled: bool,
    /// Seconds between two samples of every value (default 5).
    #[serde(default = "default_interval")]
    pub interval_s: f64,
    /// Samples older than this many days are deleted (default 7; fractions allowed).
    #[serde(default = "default_retention")]
    pub retention_days: f64,
    /// Dialog services whose values are sampled too: every number of a JSON value, by its
    /// path (`SERVICE.PATH`), or the service's name alone for a bare number.
    #[serde(default)]
    pub services: Vec<String>,
}

fn default_enabled() -> bool {
    true
}
fn default_interval() -> f64 {
    5.0
}
fn default_retention() -> f64 {
    7.0
}

impl Default for HistorySection {
    fn default() -> Self {
        HistorySection {
            enabled: default_enabled(),
            interval_s: default_interval(),
            retention_days: default_retention(),
            services: Vec::new(),
        }
    }
}

impl HistorySection {
    /// The interval as a duration (held within its range).
    pub fn interval(&self) -> std::time::Duration {
        let s = if self.interval_s.is_nan() { default_interval() } else { self.interval_s };
        std::time::Duration::from_secs_f64(s.clamp(MIN_INTERVAL_S, MAX_INTERVAL_S))
    }

    /// The retention in milliseconds (held within its range).
    pub fn retention_ms(&self) -> u64 {
        let d = if self.retention_days.is_nan() { default_retention() } else { self.retention_days };
        (d.clamp(0.0, MAX_RETENTION_DAYS) * 86_400_000.0) as u64
    }
}

/// The `[history]` values with where they are.
#[derive(Debug, Deserialize)]
struct HistorySpans {
    #[serde(default)]
    history: BTreeMap<String, Spanned<toml::Value>>,
}

/// Range-checks the `[history]` values: each problem with the line of its key.
pub(crate) fn check(text: &str, history: &HistorySection, problems: &mut Vec<String>) {
    let spans: HistorySpans = toml::from_str(text).unwrap_or(HistorySpans { history: BTreeMap::new() });
    let line = |key: &str| {
        spans.history.get(key).map_or_else(
            || super::line_of(text, text.find("[history]").unwrap_or(0)),
            |v| super::line_of(text, v.span().start),
        )
    };
    let mut bad = |key: &str, what: String| problems.push(format!("line {}: `history.{key}` {what}", line(key)));
    let interval = history.interval_s;
    if !(interval.is_finite() && (MIN_INTERVAL_S..=MAX_INTERVAL_S).contains(&interval)) {
        bad("interval_s", format!("= {interval} is out of range: {MIN_INTERVAL_S} … {MAX_INTERVAL_S} (seconds)"));
    }
    let days = history.retention_days;
    if !(days.is_finite() && days > 0.0 && days <= MAX_RETENTION_DAYS) {
        bad("retention_days", format!("= {days} is out of range: more than 0 … {MAX_RETENTION_DAYS} (days)"));
    }
    for (i, service) in history.services.iter().enumerate() {
        if !daqflow_dialog::protocol::valid_name(service) {
            bad(
                "services",
                format!(
                    "[{i}] = {service:?} is not a service name: 1 … 200 characters among letters, digits and - _ . : / @ +"
                ),
            );
        } else if history.services[..i].contains(service) {
            bad("services", format!("[{i}] = {service:?} is named twice"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<crate::system::SystemFile, crate::system::SystemFileError> {
        crate::system::SystemFile::parse(text, &daqflow_component::Registry::new())
    }

    const COMPONENT: &str = "[[component]]\nname = \"a\"\nkind = \"x\"\ncommand = [\"/bin/true\"]\n";

    #[test]
    fn the_history_table_has_defaults_and_takes_every_key() {
        let file = parse(&format!("[system]\nname = \"s\"\n{COMPONENT}")).unwrap();
        assert_eq!(file.history, HistorySection::default());
        assert_eq!((file.history.interval_s, file.history.retention_days, file.history.enabled), (5.0, 7.0, true));
        let text = format!(
            "[system]\nname = \"s\"\n\n[history]\nenabled = false\ninterval_s = 0.5\nretention_days = 0.25\n\
             services = [\"hv/state\", \"cryo/temperature\"]\n\n{COMPONENT}"
        );
        let h = parse(&text).unwrap().history;
        assert_eq!(
            h,
            HistorySection {
                enabled: false,
                interval_s: 0.5,
                retention_days: 0.25,
                services: vec!["hv/state".into(), "cryo/temperature".into()],
            }
        );
        assert_eq!((h.interval(), h.retention_ms()), (std::time::Duration::from_millis(500), 21_600_000));
    }

    #[test]
    fn a_bad_history_value_is_reported_with_its_line() {
        let text = format!(
            "[system]\nname = \"s\"\n\n[history]\ninterval_s = 0\nretention_days = -1\n\
             services = [\"hv/state\", \"has space\", \"hv/state\"]\n\n{COMPONENT}"
        );
        let e = parse(&text).unwrap_err();
        let problems = e.problems.join("\n");
        assert!(problems.contains("line 5: `history.interval_s` = 0 is out of range: 0.1 … 86400"), "{problems}");
        assert!(problems.contains("line 6: `history.retention_days` = -1 is out of range"), "{problems}");
        assert!(
            problems.contains("line 7: `history.services` [1] = \"has space\" is not a service name"),
            "{problems}"
        );
        assert!(problems.contains("line 7: `history.services` [2] = \"hv/state\" is named twice"), "{problems}");
        let e = parse(&format!("[system]\nname = \"s\"\n\n[history]\ninterval = 5\n\n{COMPONENT}")).unwrap_err();
        assert!(e.to_string().contains("line 5") && e.to_string().contains("unknown field `interval`"), "{e}");
    }
}
