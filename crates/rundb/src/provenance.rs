//! Each run's provenance and the parameters changed while it ran: the tables `run_provenance`
//! (one row per run: the system file's digest, the effective configuration's digest, the
//! overrides, every component's parameters as configured, the run it repeats) and
//! `run_changes` (one row per change: when, which component, which key, the new value), in both
//! backends (`docs/operator-guide.md`, "Provenance").

use std::collections::BTreeMap;

use daqflow_api::{ParameterChange, RunProvenance};
use serde_json::Value;

use crate::sql::{Arg, Fail, Row, Sql};
use crate::{DbError, Mode, RunDb};

/// The provenance tables in SQLite.
pub(crate) const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS run_provenance (
    run INTEGER PRIMARY KEY,
    system_digest TEXT NOT NULL,
    effective_digest TEXT NOT NULL,
    overrides TEXT NOT NULL,
    params TEXT NOT NULL,
    repeat_of INTEGER
);
CREATE TABLE IF NOT EXISTS run_changes (
    id INTEGER PRIMARY KEY,
    run INTEGER NOT NULL,
    t_ms INTEGER NOT NULL,
    component TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS run_changes_run ON run_changes (run, t_ms);
";

/// The same tables in PostgreSQL, made under the schema's advisory lock.
pub(crate) const POSTGRES_SCHEMA: &str = "
BEGIN;
SELECT pg_advisory_xact_lock(7233184783426232387);
CREATE TABLE IF NOT EXISTS run_provenance (
    run BIGINT PRIMARY KEY,
    system_digest TEXT NOT NULL,
    effective_digest TEXT NOT NULL,
    overrides TEXT NOT NULL,
    params TEXT NOT NULL,
    repeat_of BIGINT
);
CREATE TABLE IF NOT EXISTS run_changes (
    id BIGSERIAL PRIMARY KEY,
    run BIGINT NOT NULL,
    t_ms BIGINT NOT NULL,
    component TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS run_changes_run ON run_changes (run, t_ms);
COMMIT;
";

/// Whether run `run` has a record.
fn require_run(tx: &mut dyn Sql, run: u32) -> Result<bool, Fail> {
    Ok(!tx.query("SELECT run FROM runs WHERE run = ?1", &[Arg::Int(run.into())])?.is_empty())
}

/// A JSON text column read back; what is not JSON is kept as a string.
fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn json_map(text: &str) -> BTreeMap<String, Value> {
    serde_json::from_str(text).unwrap_or_default()
}

impl RunDb {
    /// Stores the provenance of run `run` (replacing what was stored for it): the system
    /// file's digest, the effective configuration's, the overrides, every component's
    /// parameters and the run it repeats. The run must exist ([`DbError::NoRun`]).
    pub fn set_provenance(&self, run: u32, p: &RunProvenance) -> Result<(), DbError> {
        let overrides = serde_json::to_string(&p.overrides).unwrap_or_default();
        let params = serde_json::to_string(&p.params).unwrap_or_default();
        let found = self.transact(Mode::Write, |tx| {
            if !require_run(tx, run)? {
                return Ok(false);
            }
            let mut args = vec![
                Arg::Int(run.into()),
                Arg::text(&p.system_digest),
                Arg::text(&p.effective_digest),
                Arg::text(&overrides),
                Arg::text(&params),
            ];
            let repeat = match p.repeat_of {
                Some(n) => {
                    args.push(Arg::Int(n.into()));
                    "?6"
                }
                None => "NULL",
            };
            tx.execute(
                &format!(
                    "INSERT INTO run_provenance (run, system_digest, effective_digest, overrides, params, repeat_of)
                     VALUES (?1, ?2, ?3, ?4, ?5, {repeat})
                     ON CONFLICT (run) DO UPDATE SET system_digest = excluded.system_digest,
                     effective_digest = excluded.effective_digest, overrides = excluded.overrides,
                     params = excluded.params, repeat_of = excluded.repeat_of"
                ),
                &args,
            )?;
            Ok(true)
        })?;
        if found { Ok(()) } else { Err(DbError::NoRun(run)) }
    }

    /// The provenance of run `run`; none for a run recorded without it (by an older version,
    /// or not a run at all).
    pub fn provenance(&self, run: u32) -> Result<Option<RunProvenance>, DbError> {
        self.transact(Mode::Read, |tx| read_provenance(tx, run))
    }

    /// Records that parameter `key` of `component` was changed to `value` at `t_ms` (Unix ms)
    /// during run `run`. The run must exist ([`DbError::NoRun`]).
    pub fn add_change(&self, run: u32, change: &ParameterChange) -> Result<(), DbError> {
        let value = change.value.to_string();
        let found = self.transact(Mode::Write, |tx| {
            if !require_run(tx, run)? {
                return Ok(false);
            }
            tx.execute(
                "INSERT INTO run_changes (run, t_ms, component, key, value) VALUES (?1, ?2, ?3, ?4, ?5)",
                &[
                    Arg::Int(run.into()),
                    Arg::count(change.t_ms),
                    Arg::text(&change.component),
                    Arg::text(&change.key),
                    Arg::text(&value),
                ],
            )?;
            Ok(true)
        })?;
        if found { Ok(()) } else { Err(DbError::NoRun(run)) }
    }

    /// The parameters changed during run `run`, in time order (then in the order recorded).
    pub fn changes(&self, run: u32) -> Result<Vec<ParameterChange>, DbError> {
        self.transact(Mode::Read, |tx| read_changes(tx, run))
    }
}

/// The provenance row of `run`, in a transaction.
pub(crate) fn read_provenance(tx: &mut dyn Sql, run: u32) -> Result<Option<RunProvenance>, Fail> {
    let rows = tx.query(
        "SELECT system_digest, effective_digest, overrides, params, repeat_of FROM run_provenance WHERE run = ?1",
        &[Arg::Int(run.into())],
    )?;
    rows.first().map(provenance_row).transpose()
}

fn provenance_row(r: &Row) -> Result<RunProvenance, Fail> {
    let repeat_of = match r.opt_int(4)? {
        Some(n) => Some(u32::try_from(n).map_err(|_| Fail::Unreadable(format!("repeat_of {n} is not a run number")))?),
        None => None,
    };
    Ok(RunProvenance {
        system_digest: r.text(0)?,
        effective_digest: r.text(1)?,
        overrides: json_map(&r.text(2)?),
        params: json_map(&r.text(3)?),
        repeat_of,
    })
}

/// The changes of `run`, in a transaction.
pub(crate) fn read_changes(tx: &mut dyn Sql, run: u32) -> Result<Vec<ParameterChange>, Fail> {
    let rows = tx.query(
        "SELECT t_ms, component, key, value FROM run_changes WHERE run = ?1 ORDER BY t_ms, id",
        &[Arg::Int(run.into())],
    )?;
    rows.iter()
        .map(|r| {
            Ok(ParameterChange { t_ms: r.count(0)?, component: r.text(1)?, key: r.text(2)?, value: json(&r.text(3)?) })
        })
        .collect()
}
