//! The two backends behind one small interface: the queries of `lib.rs` are written once, with
//! numbered placeholders `?1`, `?2`, … (PostgreSQL gets them as `$1`, `$2`, …), arguments that
//! are 64-bit integers or text, and rows read back as integers or text. Only the schema (and
//! the lock that numbers runs) is written per dialect.

use std::borrow::Cow;

use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

/// The SQL dialect of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

/// The tables in SQLite: `INTEGER PRIMARY KEY` is the row id (`logs.id` counts by itself);
/// every integer column holds 64 bits. The rollback journal, not the write-ahead log: the
/// WAL's index is a shared-memory mapping, which fails with SIGBUS, not an error, when the
/// kernel refuses a write into it (its `-shm` file made immutable); see the crate's docs.
pub(crate) const SQLITE_SCHEMA: &str = "
PRAGMA journal_mode = DELETE;
CREATE TABLE IF NOT EXISTS runs (
    run INTEGER PRIMARY KEY,
    system TEXT NOT NULL,
    started_ms INTEGER NOT NULL,
    stopped_ms INTEGER,
    state TEXT NOT NULL,
    config TEXT NOT NULL,
    events INTEGER,
    recorded INTEGER,
    lost INTEGER,
    bytes INTEGER,
    error TEXT,
    summary TEXT
);
CREATE TABLE IF NOT EXISTS run_components (
    run INTEGER NOT NULL,
    component TEXT NOT NULL,
    kind TEXT NOT NULL,
    counters TEXT NOT NULL,
    PRIMARY KEY (run, component)
);
CREATE TABLE IF NOT EXISTS run_files (
    run INTEGER NOT NULL,
    component TEXT NOT NULL,
    path TEXT NOT NULL,
    events INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS logs (
    id INTEGER PRIMARY KEY,
    t_ms INTEGER NOT NULL,
    process TEXT NOT NULL,
    severity TEXT NOT NULL,
    rank INTEGER NOT NULL,
    target TEXT NOT NULL,
    message TEXT NOT NULL,
    seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS logs_t ON logs (t_ms);
CREATE INDEX IF NOT EXISTS logs_process ON logs (process, t_ms);
";

/// The same tables in PostgreSQL: `BIGINT` for every integer, `BIGSERIAL` for `logs.id`. Made in
/// one transaction under an advisory lock, so that two processes opening a new database at once
/// do not trip over each other's `CREATE TABLE`.
pub(crate) const POSTGRES_SCHEMA: &str = "
BEGIN;
SELECT pg_advisory_xact_lock(7233184783426232387);
CREATE TABLE IF NOT EXISTS runs (
    run BIGINT PRIMARY KEY,
    system TEXT NOT NULL,
    started_ms BIGINT NOT NULL,
    stopped_ms BIGINT,
    state TEXT NOT NULL,
    config TEXT NOT NULL,
    events BIGINT,
    recorded BIGINT,
    lost BIGINT,
    bytes BIGINT,
    error TEXT,
    summary TEXT
);
CREATE TABLE IF NOT EXISTS run_components (
    run BIGINT NOT NULL,
    component TEXT NOT NULL,
    kind TEXT NOT NULL,
    counters TEXT NOT NULL,
    PRIMARY KEY (run, component)
);
CREATE TABLE IF NOT EXISTS run_files (
    run BIGINT NOT NULL,
    component TEXT NOT NULL,
    path TEXT NOT NULL,
    events BIGINT NOT NULL,
    bytes BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS logs (
    id BIGSERIAL PRIMARY KEY,
    t_ms BIGINT NOT NULL,
    process TEXT NOT NULL,
    severity TEXT NOT NULL,
    rank BIGINT NOT NULL,
    target TEXT NOT NULL,
    message TEXT NOT NULL,
    seq BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS logs_t ON logs (t_ms);
CREATE INDEX IF NOT EXISTS logs_process ON logs (process, t_ms);
COMMIT;
";

impl Dialect {
    /// The statement that makes the numbering of runs one at a time, run inside the transaction
    /// that numbers a run. SQLite needs none: a write transaction (`BEGIN IMMEDIATE`) already
    /// excludes every other writer. PostgreSQL's would let two transactions read the same
    /// `MAX(run)`; this lock lets readers of `runs` go on.
    pub(crate) fn lock_runs(self) -> Option<&'static str> {
        match self {
            Dialect::Sqlite => None,
            Dialect::Postgres => Some("LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE"),
        }
    }

    /// The query in this dialect's placeholders.
    fn text<'a>(self, sql: &'a str) -> Cow<'a, str> {
        match self {
            Dialect::Sqlite => Cow::Borrowed(sql),
            Dialect::Postgres => Cow::Owned(dollar_placeholders(sql)),
        }
    }
}

/// `?N` → `$N` (the queries hold no `?` in string literals).
fn dollar_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

/// A value handed to a query.
#[derive(Debug, Clone)]
pub(crate) enum Arg<'a> {
    /// A 64-bit integer.
    Int(i64),
    /// Text, or NULL.
    Text(Option<Cow<'a, str>>),
    /// A 64-bit floating-point number (the history's values).
    Real(f64),
}

impl<'a> Arg<'a> {
    /// Text; a NUL character (which PostgreSQL's text cannot hold) is stored as U+FFFD in both
    /// backends.
    pub(crate) fn text(s: &'a str) -> Arg<'a> {
        Arg::Text(Some(if s.contains('\0') { Cow::Owned(s.replace('\0', "\u{FFFD}")) } else { Cow::Borrowed(s) }))
    }

    /// Text or NULL.
    pub(crate) fn opt_text(s: Option<&'a str>) -> Arg<'a> {
        match s {
            Some(s) => Arg::text(s),
            None => Arg::Text(None),
        }
    }

    /// The same value, owning its text.
    pub(crate) fn into_owned(self) -> Arg<'static> {
        match self {
            Arg::Int(n) => Arg::Int(n),
            Arg::Text(s) => Arg::Text(s.map(|s| Cow::Owned(s.into_owned()))),
            Arg::Real(x) => Arg::Real(x),
        }
    }

    /// An unsigned counter, held at `i64::MAX` (9.2 × 10¹⁸) if larger: the columns are signed
    /// 64-bit integers in both backends.
    pub(crate) fn count(n: u64) -> Arg<'a> {
        Arg::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

impl ToSql for Arg<'_> {
    fn to_sql(&self, ty: &Type, out: &mut bytes::BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Arg::Int(n) => n.to_sql(ty, out),
            Arg::Text(s) => s.as_deref().to_sql(ty, out),
            Arg::Real(x) => x.to_sql(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <i64 as ToSql>::accepts(ty) || <&str as ToSql>::accepts(ty) || <f64 as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(match self {
            Arg::Int(n) => (*n).into(),
            Arg::Text(Some(s)) => s.as_ref().into(),
            Arg::Text(None) => rusqlite::types::Null.into(),
            Arg::Real(x) => (*x).into(),
        })
    }
}

/// A value read from a row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cell {
    Null,
    Int(i64),
    Text(String),
    Real(f64),
}

/// A row read back.
#[derive(Debug, Clone)]
pub(crate) struct Row(pub(crate) Vec<Cell>);

impl Row {
    fn cell(&self, i: usize) -> Result<&Cell, Fail> {
        self.0.get(i).ok_or_else(|| Fail::Unreadable(format!("a row without column {i}")))
    }

    /// Column `i` as an integer, or NULL.
    pub(crate) fn opt_int(&self, i: usize) -> Result<Option<i64>, Fail> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::Int(n) => Ok(Some(*n)),
            Cell::Text(t) => Err(Fail::Unreadable(format!("column {i} holds text ({t:?}) where a number belongs"))),
            Cell::Real(x) => Err(Fail::Unreadable(format!("column {i} holds a real ({x}) where an integer belongs"))),
        }
    }

    /// Column `i` as an integer.
    pub(crate) fn int(&self, i: usize) -> Result<i64, Fail> {
        self.opt_int(i)?.ok_or_else(|| Fail::Unreadable(format!("column {i} is NULL where a number belongs")))
    }

    /// Column `i` as a counter (a negative number, which daqflow never writes, reads as 0).
    pub(crate) fn count(&self, i: usize) -> Result<u64, Fail> {
        Ok(u64::try_from(self.int(i)?).unwrap_or(0))
    }

    /// Column `i` as a counter, or NULL.
    pub(crate) fn opt_count(&self, i: usize) -> Result<Option<u64>, Fail> {
        Ok(self.opt_int(i)?.map(|n| u64::try_from(n).unwrap_or(0)))
    }

    /// Column `i` as text, or NULL.
    pub(crate) fn opt_text(&self, i: usize) -> Result<Option<String>, Fail> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::Text(t) => Ok(Some(t.clone())),
            Cell::Int(n) => Err(Fail::Unreadable(format!("column {i} holds a number ({n}) where text belongs"))),
            Cell::Real(x) => Err(Fail::Unreadable(format!("column {i} holds a number ({x}) where text belongs"))),
        }
    }

    /// Column `i` as a floating-point number (an integer is converted).
    pub(crate) fn real(&self, i: usize) -> Result<f64, Fail> {
        match self.cell(i)? {
            Cell::Real(x) => Ok(*x),
            Cell::Int(n) => Ok(*n as f64),
            Cell::Null => Err(Fail::Unreadable(format!("column {i} is NULL where a number belongs"))),
            Cell::Text(t) => Err(Fail::Unreadable(format!("column {i} holds text ({t:?}) where a number belongs"))),
        }
    }

    /// Column `i` as text.
    pub(crate) fn text(&self, i: usize) -> Result<String, Fail> {
        self.opt_text(i)?.ok_or_else(|| Fail::Unreadable(format!("column {i} is NULL where text belongs")))
    }
}

/// Why a query failed, before the database's location is attached.
#[derive(Debug)]
pub(crate) enum Fail {
    Sqlite(rusqlite::Error),
    Postgres(postgres::Error),
    Unreadable(String),
}

impl From<rusqlite::Error> for Fail {
    fn from(e: rusqlite::Error) -> Fail {
        Fail::Sqlite(e)
    }
}

impl From<postgres::Error> for Fail {
    fn from(e: postgres::Error) -> Fail {
        Fail::Postgres(e)
    }
}

/// A transaction of either backend: what the queries of `lib.rs` run on.
pub(crate) trait Sql {
    /// The dialect, for the few statements that differ.
    fn dialect(&self) -> Dialect;
    /// Runs a statement; the rows it changed.
    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, Fail>;
    /// Runs one statement once for each list of arguments, prepared once.
    fn execute_each(&mut self, sql: &str, rows: &[Vec<Arg<'_>>]) -> Result<(), Fail>;
    /// Runs a query; its rows.
    fn query(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, Fail>;
}

/// A transaction of SQLite.
pub(crate) struct SqliteTx<'c>(pub(crate) rusqlite::Transaction<'c>);

impl Sql for SqliteTx<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, Fail> {
        Ok(self.0.prepare_cached(sql)?.execute(rusqlite::params_from_iter(args))? as u64)
    }

    fn execute_each(&mut self, sql: &str, rows: &[Vec<Arg<'_>>]) -> Result<(), Fail> {
        let mut st = self.0.prepare_cached(sql)?;
        for args in rows {
            st.execute(rusqlite::params_from_iter(args))?;
        }
        Ok(())
    }

    fn query(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, Fail> {
        let mut st = self.0.prepare_cached(sql)?;
        let columns = st.column_count();
        let mut rows = st.query(rusqlite::params_from_iter(args))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let mut cells = Vec::with_capacity(columns);
            for i in 0..columns {
                use rusqlite::types::ValueRef;
                cells.push(match r.get_ref(i)? {
                    ValueRef::Null => Cell::Null,
                    ValueRef::Integer(n) => Cell::Int(n),
                    ValueRef::Text(t) => Cell::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Real(x) => Cell::Real(x),
                    ValueRef::Blob(_) => return Err(Fail::Unreadable(format!("column {i} holds a blob"))),
                });
            }
            out.push(Row(cells));
        }
        Ok(out)
    }
}

/// A connection to PostgreSQL inside a transaction (begun and ended by the caller).
pub(crate) struct PostgresTx<'c>(pub(crate) &'c mut postgres::Client);

fn pg_args<'a>(args: &'a [Arg<'_>]) -> Vec<&'a (dyn ToSql + Sync)> {
    args.iter().map(|a| a as &(dyn ToSql + Sync)).collect()
}

impl Sql for PostgresTx<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, Fail> {
        Ok(self.0.execute(Dialect::Postgres.text(sql).as_ref(), &pg_args(args))?)
    }

    fn execute_each(&mut self, sql: &str, rows: &[Vec<Arg<'_>>]) -> Result<(), Fail> {
        let st = self.0.prepare(&Dialect::Postgres.text(sql))?;
        for args in rows {
            self.0.execute(&st, &pg_args(args))?;
        }
        Ok(())
    }

    fn query(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, Fail> {
        let rows = self.0.query(Dialect::Postgres.text(sql).as_ref(), &pg_args(args))?;
        rows.iter()
            .map(|r| {
                (0..r.len())
                    .map(|i| {
                        let ty = r.columns()[i].type_();
                        Ok(if *ty == Type::INT8 {
                            r.try_get::<_, Option<i64>>(i)?.map_or(Cell::Null, Cell::Int)
                        } else if *ty == Type::INT4 {
                            r.try_get::<_, Option<i32>>(i)?.map_or(Cell::Null, |n| Cell::Int(n.into()))
                        } else if *ty == Type::INT2 {
                            r.try_get::<_, Option<i16>>(i)?.map_or(Cell::Null, |n| Cell::Int(n.into()))
                        } else if *ty == Type::FLOAT8 {
                            r.try_get::<_, Option<f64>>(i)?.map_or(Cell::Null, Cell::Real)
                        } else if *ty == Type::FLOAT4 {
                            r.try_get::<_, Option<f32>>(i)?.map_or(Cell::Null, |x| Cell::Real(x.into()))
                        } else if <String as postgres::types::FromSql>::accepts(ty) {
                            r.try_get::<_, Option<String>>(i)?.map_or(Cell::Null, Cell::Text)
                        } else {
                            return Err(Fail::Unreadable(format!("column {i} has the type {ty}")));
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Row)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_for_postgres() {
        assert_eq!(dollar_placeholders("a = ?1 AND b LIKE ?12 ESCAPE '\\'"), "a = $1 AND b LIKE $12 ESCAPE '\\'");
        assert_eq!(Dialect::Sqlite.text("x = ?1"), "x = ?1");
    }

    #[test]
    fn counters_beyond_the_signed_range_are_held_at_its_top() {
        assert!(matches!(Arg::count(u64::MAX), Arg::Int(i64::MAX)));
        assert!(matches!(Arg::count(i64::MAX as u64), Arg::Int(i64::MAX)));
        assert!(matches!(Arg::count(7), Arg::Int(7)));
        let row = Row(vec![Cell::Int(-1), Cell::Null, Cell::Text("x".into())]);
        assert_eq!(row.count(0).unwrap(), 0);
        assert_eq!(row.opt_count(1).unwrap(), None);
        assert!(row.int(1).is_err() && row.int(2).is_err() && row.text(0).is_err() && row.text(3).is_err());
        assert!(matches!(Arg::text("a\0b"), Arg::Text(Some(Cow::Owned(s))) if s == "a\u{FFFD}b"));
    }
}
