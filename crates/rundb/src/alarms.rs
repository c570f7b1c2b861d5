//! The table of alarm events (`alarm_events`): every alarm raised, acknowledged and cleared,
//! with its time, system, name, severity, message and who acknowledged it.

use daqflow_api::alarms::{AlarmEvent, AlarmEventKind, AlarmSeverity};

use crate::sql::{Arg, Fail};
use crate::{DbError, Mode, RunDb};

/// The table in SQLite.
pub(crate) const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS alarm_events (
    id INTEGER PRIMARY KEY,
    t_ms INTEGER NOT NULL,
    system TEXT NOT NULL,
    name TEXT NOT NULL,
    event TEXT NOT NULL,
    severity TEXT NOT NULL,
    message TEXT NOT NULL,
    who TEXT
);
CREATE INDEX IF NOT EXISTS alarm_events_t ON alarm_events (t_ms);
";

/// The table in PostgreSQL (made under the same advisory lock as the others).
pub(crate) const POSTGRES_SCHEMA: &str = "
BEGIN;
SELECT pg_advisory_xact_lock(7233184783426232387);
CREATE TABLE IF NOT EXISTS alarm_events (
    id BIGSERIAL PRIMARY KEY,
    t_ms BIGINT NOT NULL,
    system TEXT NOT NULL,
    name TEXT NOT NULL,
    event TEXT NOT NULL,
    severity TEXT NOT NULL,
    message TEXT NOT NULL,
    who TEXT
);
CREATE INDEX IF NOT EXISTS alarm_events_t ON alarm_events (t_ms);
COMMIT;
";

impl RunDb {
    /// Stores alarm events, all or none.
    pub fn add_alarm_events(&self, events: &[AlarmEvent]) -> Result<(), DbError> {
        if events.is_empty() {
            return Ok(());
        }
        let rows: Vec<Vec<Arg<'_>>> = events
            .iter()
            .map(|e| {
                vec![
                    Arg::count(e.t_ms),
                    Arg::text(&e.system),
                    Arg::text(&e.name),
                    Arg::text(e.kind.name()),
                    Arg::text(e.severity.name()),
                    Arg::text(&e.message),
                    Arg::opt_text(e.who.as_deref()),
                ]
            })
            .collect();
        self.transact(Mode::Write, |tx| {
            tx.execute_each(
                "INSERT INTO alarm_events (t_ms, system, name, event, severity, message, who)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                &rows,
            )
        })
    }

    /// The newest `limit` alarm events, of `system` only if given, newest first.
    pub fn alarm_events(&self, system: Option<&str>, limit: usize) -> Result<Vec<AlarmEvent>, DbError> {
        let (sql, args) = match system {
            Some(s) => (
                "SELECT t_ms, system, name, event, severity, message, who FROM alarm_events WHERE system = ?2
                 ORDER BY t_ms DESC, id DESC LIMIT ?1",
                vec![Arg::count(limit as u64), Arg::text(s)],
            ),
            None => (
                "SELECT t_ms, system, name, event, severity, message, who FROM alarm_events
                 ORDER BY t_ms DESC, id DESC LIMIT ?1",
                vec![Arg::count(limit as u64)],
            ),
        };
        self.transact(Mode::Read, |tx| {
            let rows = tx.query(sql, &args)?;
            rows.iter()
                .map(|r| {
                    let event = r.text(3)?;
                    let severity = r.text(4)?;
                    Ok(AlarmEvent {
                        t_ms: r.count(0)?,
                        system: r.text(1)?,
                        name: r.text(2)?,
                        kind: AlarmEventKind::parse(&event).ok_or_else(|| {
                            Fail::Unreadable(format!("alarm event `{event}` is none this version knows"))
                        })?,
                        severity: AlarmSeverity::parse(&severity).ok_or_else(|| {
                            Fail::Unreadable(format!("alarm severity `{severity}` is none this version knows"))
                        })?,
                        message: r.text(5)?,
                        who: r.opt_text(6)?,
                    })
                })
                .collect()
        })
    }
}
