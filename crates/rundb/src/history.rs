//! The history of slow values (MIDAS's history): samples `(time, name, value)` written in
//! batches by the operator's sampler, read back one name over a time range, down-sampled in
//! SQL to at most a number of points, and deleted when older than the retention.
//!
//! Two tables, the same in both backends: `history_names` gives every name a number once, and
//! `history` holds one row per sample, keyed by `(name_id, t_ms)`; that key is the index every
//! query reads (a range of one name, or the old end of one name for the retention). In SQLite
//! `history` is a `WITHOUT ROWID` table, so the key is the table and a sample takes about 20
//! bytes.

use std::collections::HashMap;

use daqflow_api::{HistoryPoint, HistoryQuery, HistorySeries};

use crate::sql::{Arg, Fail, Sql};
use crate::{DbError, Mode, RunDb};

/// The history's tables in SQLite.
pub(crate) const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS history_names (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS history (
    name_id INTEGER NOT NULL,
    t_ms INTEGER NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (name_id, t_ms)
) WITHOUT ROWID;
";

/// The history's tables in PostgreSQL, made under the schema's advisory lock.
pub(crate) const POSTGRES_SCHEMA: &str = "
BEGIN;
SELECT pg_advisory_xact_lock(7233184783426232387);
CREATE TABLE IF NOT EXISTS history_names (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS history (
    name_id BIGINT NOT NULL,
    t_ms BIGINT NOT NULL,
    value DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (name_id, t_ms)
);
COMMIT;
";

/// One sample of a slow value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// When it was taken (Unix ms).
    pub t_ms: u64,
    /// The value's name (`COMPONENT.KEY`, `system.KEY`, `SERVICE.PATH`).
    pub name: String,
    /// The value: finite (NaN and infinities are not stored).
    pub value: f64,
}

impl Sample {
    /// A sample of `name` at `t_ms`.
    pub fn new(t_ms: u64, name: impl Into<String>, value: f64) -> Sample {
        Sample { t_ms, name: name.into(), value }
    }
}

/// Every name's number, from `history_names`.
fn name_ids(tx: &mut dyn Sql) -> Result<HashMap<String, i64>, Fail> {
    let rows = tx.query("SELECT id, name FROM history_names", &[])?;
    rows.iter().map(|r| Ok((r.text(1)?, r.int(0)?))).collect()
}

/// The number of `name`, if it has one.
fn name_id(tx: &mut dyn Sql, name: &str) -> Result<Option<i64>, Fail> {
    let rows = tx.query("SELECT id FROM history_names WHERE name = ?1", &[Arg::text(name)])?;
    rows.first().map(|r| r.int(0)).transpose()
}

impl RunDb {
    /// Stores samples, all or none, in one transaction. Samples whose value is not finite are
    /// left out (SQLite cannot hold a NaN); a second sample of a name at the same millisecond
    /// replaces the first. Returns how many were stored.
    pub fn add_samples(&self, samples: &[Sample]) -> Result<usize, DbError> {
        let samples: Vec<&Sample> = samples.iter().filter(|s| s.value.is_finite()).collect();
        if samples.is_empty() {
            return Ok(0);
        }
        self.transact(Mode::Write, |tx| {
            let mut ids = name_ids(tx)?;
            let mut new: Vec<&str> =
                samples.iter().map(|s| s.name.as_str()).filter(|n| !ids.contains_key(*n)).collect();
            new.sort_unstable();
            new.dedup();
            if !new.is_empty() {
                let rows: Vec<Vec<Arg<'_>>> = new.iter().map(|n| vec![Arg::text(n)]).collect();
                tx.execute_each("INSERT INTO history_names (name) VALUES (?1) ON CONFLICT (name) DO NOTHING", &rows)?;
                ids = name_ids(tx)?;
            }
            let mut rows = Vec::with_capacity(samples.len());
            for s in &samples {
                // A name with a NUL is stored with U+FFFD in its place (as all text is).
                let id = ids
                    .get(&s.name)
                    .or_else(|| ids.get(&s.name.replace('\0', "\u{FFFD}")))
                    .copied()
                    .ok_or_else(|| Fail::Unreadable(format!("the history name `{}` has no number", s.name)))?;
                rows.push(vec![Arg::Int(id), Arg::count(s.t_ms), Arg::Real(s.value)]);
            }
            tx.execute_each(
                "INSERT INTO history (name_id, t_ms, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name_id, t_ms) DO UPDATE SET value = excluded.value",
                &rows,
            )?;
            Ok(rows.len())
        })
    }

    /// Every name the history holds, sorted.
    pub fn history_names(&self) -> Result<Vec<String>, DbError> {
        self.transact(Mode::Read, |tx| {
            let rows = tx.query("SELECT name FROM history_names ORDER BY name", &[])?;
            rows.iter().map(|r| r.text(0)).collect()
        })
    }

    /// The samples of `query.name` in `[query.from_ms, query.to_ms]`, oldest first: every
    /// sample when there are at most `query.points` (at least 1), else one point per time
    /// bucket (`bucket_ms` wide, at most `query.points` of them) with the bucket's mean,
    /// minimum, maximum and count, computed by the database. `None` when the history has no
    /// such name.
    pub fn history(&self, query: &HistoryQuery) -> Result<Option<HistorySeries>, DbError> {
        let (from, to) = (query.from_ms, query.to_ms);
        let points = query.points.max(1) as u64;
        self.transact(Mode::Read, |tx| {
            let Some(id) = name_id(tx, &query.name)? else { return Ok(None) };
            let mut series =
                HistorySeries { name: query.name.clone(), from_ms: from, to_ms: to, bucket_ms: 0, points: Vec::new() };
            if from > to {
                return Ok(Some(series));
            }
            let range = [Arg::Int(id), Arg::count(from), Arg::count(to)];
            let count =
                tx.query("SELECT COUNT(*) FROM history WHERE name_id = ?1 AND t_ms >= ?2 AND t_ms <= ?3", &range)?;
            let count = count.first().map_or(Ok(0), |r| r.count(0))?;
            if count <= points {
                let rows = tx.query(
                    "SELECT t_ms, value FROM history WHERE name_id = ?1 AND t_ms >= ?2 AND t_ms <= ?3 ORDER BY t_ms",
                    &range,
                )?;
                for r in &rows {
                    let value = r.real(1)?;
                    series.points.push(HistoryPoint { t_ms: r.count(0)?, value, min: value, max: value, count: 1 });
                }
                return Ok(Some(series));
            }
            // Buckets of equal width over the range, at most `points` of them.
            let width = (to - from) / points + 1;
            series.bucket_ms = width;
            let rows = tx.query(
                "SELECT (t_ms - ?2) / ?4 AS bucket, MIN(t_ms), MAX(t_ms), COUNT(*), AVG(value), MIN(value), MAX(value)
                 FROM history WHERE name_id = ?1 AND t_ms >= ?2 AND t_ms <= ?3
                 GROUP BY bucket ORDER BY bucket",
                &[Arg::Int(id), Arg::count(from), Arg::count(to), Arg::count(width)],
            )?;
            for r in &rows {
                let (first, last) = (r.count(1)?, r.count(2)?);
                series.points.push(HistoryPoint {
                    t_ms: first + (last - first) / 2,
                    value: r.real(4)?,
                    min: r.real(5)?,
                    max: r.real(6)?,
                    count: r.count(3)?,
                });
            }
            Ok(Some(series))
        })
    }

    /// Deletes every sample older than `before_ms` (Unix ms), name by name along the key, and
    /// the names left without a sample. Returns how many samples were deleted.
    pub fn delete_history_before(&self, before_ms: u64) -> Result<u64, DbError> {
        self.transact(Mode::Write, |tx| {
            let ids = name_ids(tx)?;
            let mut deleted = 0;
            for id in ids.values() {
                deleted += tx.execute(
                    "DELETE FROM history WHERE name_id = ?1 AND t_ms < ?2",
                    &[Arg::Int(*id), Arg::count(before_ms)],
                )?;
            }
            tx.execute(
                "DELETE FROM history_names WHERE NOT EXISTS (SELECT 1 FROM history WHERE history.name_id = history_names.id)",
                &[],
            )?;
            Ok(deleted)
        })
    }
}

#[cfg(test)]
mod tests {
    //! Each test runs against SQLite and against a real PostgreSQL server.

    use super::*;
    use crate::testing::{Backend, TestDb};

    fn query(name: &str, from_ms: u64, to_ms: u64, points: usize) -> HistoryQuery {
        HistoryQuery { name: name.into(), from_ms, to_ms, points }
    }

    fn samples_are_stored_listed_and_read_back(backend: Backend) {
        let Some(t) = TestDb::new(backend, "history_samples") else { return };
        let db = t.open();
        assert_eq!(db.history_names().unwrap(), Vec::<String>::new());
        let stored = db
            .add_samples(&[
                Sample::new(1000, "evm.events", 10.0),
                Sample::new(1000, "bu-0.detail.throttled", 0.0),
                Sample::new(2000, "evm.events", 20.5),
                Sample::new(2000, "bu-0.detail.throttled", 1.0),
                Sample::new(2000, "hv/state.voltage", f64::NAN),
                Sample::new(3000, "evm.events", -1e300),
            ])
            .unwrap();
        assert_eq!(stored, 5, "the NaN is left out");
        assert_eq!(db.add_samples(&[]).unwrap(), 0);
        // The same name at the same millisecond: the later value wins.
        db.add_samples(&[Sample::new(3000, "evm.events", 30.0), Sample::new(4000, "evm.events", 40.0)]).unwrap();
        assert_eq!(db.history_names().unwrap(), vec!["bu-0.detail.throttled", "evm.events"]);
        let s = db.history(&query("evm.events", 0, u64::MAX, 100)).unwrap().unwrap();
        assert_eq!(s.bucket_ms, 0, "few samples come back as they are");
        let got: Vec<(u64, f64, u64)> = s.points.iter().map(|p| (p.t_ms, p.value, p.count)).collect();
        assert_eq!(got, vec![(1000, 10.0, 1), (2000, 20.5, 1), (3000, 30.0, 1), (4000, 40.0, 1)]);
        assert!(s.points.iter().all(|p| p.min == p.value && p.max == p.value));
        let inside = db.history(&query("evm.events", 2000, 3000, 100)).unwrap().unwrap();
        assert_eq!(inside.points.iter().map(|p| p.t_ms).collect::<Vec<_>>(), vec![2000, 3000], "inclusive range");
        assert_eq!((inside.from_ms, inside.to_ms, inside.name.as_str()), (2000, 3000, "evm.events"));
        assert!(db.history(&query("evm.events", 5000, 9000, 100)).unwrap().unwrap().points.is_empty());
        assert!(db.history(&query("evm.events", 3000, 2000, 100)).unwrap().unwrap().points.is_empty());
        assert_eq!(db.history(&query("nobody.events", 0, u64::MAX, 100)).unwrap(), None);
        assert_eq!(db.history(&query("hv/state.voltage", 0, u64::MAX, 100)).unwrap(), None, "never stored");
    }

    fn a_week_of_samples_is_down_sampled_to_at_most_the_points_asked_for(backend: Backend) {
        let Some(t) = TestDb::new(backend, "history_downsample") else { return };
        let db = t.open();
        // A week, one sample a minute: a saw tooth 0 … 99.
        let t0 = 1_700_000_000_000u64;
        let n = 7 * 24 * 60;
        let samples: Vec<Sample> =
            (0..n).map(|i| Sample::new(t0 + i * 60_000, "ru-0.mb_per_s", (i % 100) as f64)).collect();
        for chunk in samples.chunks(2000) {
            db.add_samples(chunk).unwrap();
        }
        let to = t0 + (n - 1) * 60_000;
        let s = db.history(&query("ru-0.mb_per_s", t0, to, 500)).unwrap().unwrap();
        assert!(s.bucket_ms > 0);
        assert!(s.points.len() <= 500 && s.points.len() >= 400, "{} points", s.points.len());
        assert_eq!(s.points.iter().map(|p| p.count).sum::<u64>(), n, "every sample is in one bucket");
        assert!(s.points.windows(2).all(|w| w[0].t_ms < w[1].t_ms), "oldest first");
        assert!(s.points.iter().all(|p| p.t_ms >= t0 && p.t_ms <= to));
        // A bucket of about 20 minutes sees most of the saw tooth: its minimum, maximum and mean
        // are those of its samples.
        let first = &s.points[0];
        let own: Vec<f64> = (0..first.count).map(|i| (i % 100) as f64).collect();
        assert_eq!(first.min, 0.0);
        assert_eq!(first.max, own.iter().copied().fold(f64::MIN, f64::max));
        let mean = own.iter().sum::<f64>() / own.len() as f64;
        assert!((first.value - mean).abs() < 1e-9, "{} vs {mean}", first.value);
        assert_eq!(first.t_ms, t0 + (first.count - 1) * 60_000 / 2);
        // One point for the whole week.
        let one = db.history(&query("ru-0.mb_per_s", t0, to, 1)).unwrap().unwrap();
        assert_eq!(one.points.len(), 1);
        assert_eq!((one.points[0].min, one.points[0].max, one.points[0].count), (0.0, 99.0, n));
        // As many points as samples: every sample.
        let all = db.history(&query("ru-0.mb_per_s", t0, to, n as usize)).unwrap().unwrap();
        assert_eq!((all.bucket_ms, all.points.len()), (0, n as usize));
    }

    fn samples_older_than_the_retention_are_deleted_with_names_left_empty(backend: Backend) {
        let Some(t) = TestDb::new(backend, "history_retention") else { return };
        let db = t.open();
        db.add_samples(&[
            Sample::new(1000, "old.events", 1.0),
            Sample::new(1000, "kept.events", 1.0),
            Sample::new(2000, "kept.events", 2.0),
            Sample::new(3000, "kept.events", 3.0),
        ])
        .unwrap();
        assert_eq!(db.delete_history_before(2000).unwrap(), 2);
        assert_eq!(db.history_names().unwrap(), vec!["kept.events"], "a name without samples goes");
        let s = db.history(&query("kept.events", 0, u64::MAX, 10)).unwrap().unwrap();
        assert_eq!(s.points.iter().map(|p| p.t_ms).collect::<Vec<_>>(), vec![2000, 3000]);
        assert_eq!(db.delete_history_before(0).unwrap(), 0);
        // A name that went comes back with its next sample.
        db.add_samples(&[Sample::new(5000, "old.events", 5.0)]).unwrap();
        assert_eq!(db.history(&query("old.events", 0, u64::MAX, 10)).unwrap().unwrap().points.len(), 1);
    }

    crate::for_each_backend!(
        samples_are_stored_listed_and_read_back,
        a_week_of_samples_is_down_sampled_to_at_most_the_points_asked_for,
        samples_older_than_the_retention_are_deleted_with_names_left_empty,
    );
}
