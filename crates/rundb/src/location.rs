//! Where the run database is: an SQLite file, or a PostgreSQL database named by a URL
//! (`postgres://USER@HOST:PORT/DBNAME`), with the URL's password kept out of everything
//! printed.
//!
//! A password can be in the URL (`postgres://USER:PASSWORD@…`), but is better kept out of the
//! system file: without one in the URL, the password is taken from the environment variable
//! `PGPASSWORD`, else from the password file `PGPASSFILE` (default `~/.pgpass`, lines
//! `HOST:PORT:DBNAME:USER:PASSWORD` with `*` matching anything, readable by its owner only), as
//! PostgreSQL's own tools do.
//!
//! ```
//! use daqflow_rundb::Location;
//! use std::path::Path;
//! let db = Location::parse("postgres://daq:secret@db.example:5432/runs").unwrap();
//! assert_eq!(db.to_string(), "postgres://daq:***@db.example:5432/runs");
//! let file = Location::parse("runs.sqlite").unwrap().under(Path::new("/data"));
//! assert_eq!(file.to_string(), "/data/runs.sqlite");
//! ```

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a database location was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LocationError {
    /// The location is empty.
    #[error("the run database's location is empty: give an SQLite file or a postgres:// URL")]
    Empty,
    /// A `postgres://` URL that PostgreSQL's URL syntax refuses (the text shown has its password
    /// replaced by `***`).
    #[error("{url} is not a PostgreSQL URL (postgres://USER@HOST:PORT/DBNAME): {reason}")]
    BadUrl {
        /// The URL, its password redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A `postgres://` URL that names no user or no database.
    #[error("{url} names no {missing}: write postgres://USER@HOST:PORT/DBNAME")]
    Incomplete {
        /// The URL, its password redacted.
        url: String,
        /// `user` or `database`.
        missing: &'static str,
    },
}

/// Where the run database is.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    /// An SQLite file, created with its directory if missing.
    Sqlite(PathBuf),
    /// A PostgreSQL database; the tables are created if missing.
    Postgres(PostgresUrl),
}

/// A `postgres://` or `postgresql://` URL, checked. Shown (`Display`, `Debug`) with its password
/// replaced by `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresUrl {
    text: String,
}

impl Location {
    /// Reads a location: a text starting with `postgres://` or `postgresql://` is a PostgreSQL
    /// URL, anything else an SQLite file.
    pub fn parse(text: &str) -> Result<Location, LocationError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(LocationError::Empty);
        }
        if is_postgres_url(text) {
            return PostgresUrl::parse(text).map(Location::Postgres);
        }
        Ok(Location::Sqlite(PathBuf::from(text)))
    }

    /// A relative SQLite file is taken relative to `dir`; a URL or an absolute path is left as it
    /// is.
    pub fn under(self, dir: &Path) -> Location {
        match self {
            Location::Sqlite(p) if p.is_relative() => Location::Sqlite(dir.join(p)),
            other => other,
        }
    }

    /// The location as written, to hand to another process of the system (the message logger's
    /// `database`): the file's path, or the URL with its password if it has one. Never print it:
    /// print the location itself, which is redacted.
    pub fn to_config_value(&self) -> String {
        match self {
            Location::Sqlite(p) => p.to_string_lossy().into_owned(),
            Location::Postgres(u) => u.text.clone(),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Sqlite(p) => write!(f, "{}", p.display()),
            Location::Postgres(u) => u.fmt(f),
        }
    }
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Sqlite(p) => f.debug_tuple("Sqlite").field(p).finish(),
            Location::Postgres(u) => f.debug_tuple("Postgres").field(u).finish(),
        }
    }
}

impl PostgresUrl {
    fn parse(text: &str) -> Result<PostgresUrl, LocationError> {
        let config: postgres::Config = text
            .parse()
            .map_err(|e: postgres::Error| LocationError::BadUrl { url: redact_url(text), reason: e.to_string() })?;
        let missing = if config.get_user().is_none_or(str::is_empty) {
            Some("user")
        } else if config.get_dbname().is_none_or(str::is_empty) {
            Some("database")
        } else {
            None
        };
        if let Some(missing) = missing {
            return Err(LocationError::Incomplete { url: redact_url(text), missing });
        }
        Ok(PostgresUrl { text: text.to_owned() })
    }

    /// The client configuration: the URL's settings, the password from `PGPASSWORD` or the
    /// password file if the URL has none, a connect timeout of 10 s and the application name
    /// `daqflow` unless the URL sets them.
    pub(crate) fn config(&self) -> postgres::Config {
        self.config_from(std::env::var("PGPASSWORD").ok(), password_file)
    }

    /// [`PostgresUrl::config`] with the environment's password and the password file's text
    /// given.
    pub(crate) fn config_from(
        &self,
        env_password: Option<String>,
        password_file: impl FnOnce() -> Option<String>,
    ) -> postgres::Config {
        // The text was parsed when this value was made.
        let mut config: postgres::Config = self.text.parse().unwrap_or_default();
        if config.get_password().is_none() {
            let found = match env_password.filter(|p| !p.is_empty()) {
                Some(p) => Some(p),
                None => password_file().and_then(|text| pgpass_lookup(&text, &self.key(&config))),
            };
            if let Some(p) = found {
                config.password(p);
            }
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        if config.get_application_name().is_none() {
            config.application_name("daqflow");
        }
        config
    }

    /// Host, port, database and user, as the password file matches them.
    fn key(&self, config: &postgres::Config) -> [String; 4] {
        let host = match config.get_hosts().first() {
            Some(postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "localhost".to_owned(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432).to_string();
        [
            host,
            port,
            config.get_dbname().unwrap_or_default().to_owned(),
            config.get_user().unwrap_or_default().to_owned(),
        ]
    }
}

impl fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.text))
    }
}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact_url(&self.text))
    }
}

fn is_postgres_url(text: &str) -> bool {
    ["postgres://", "postgresql://"].iter().any(|p| text.get(..p.len()).is_some_and(|s| s.eq_ignore_ascii_case(p)))
}

/// A URL with the password of its user part, and any `password=` parameter, replaced by `***`.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else { return url.to_owned() };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let mut out = String::from(&url[..scheme_end]);
    match authority.rfind('@') {
        Some(at) => {
            let (userinfo, host) = authority.split_at(at);
            match userinfo.split_once(':') {
                Some((user, _)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                None => out.push_str(userinfo),
            }
            out.push_str(host);
        }
        None => out.push_str(authority),
    }
    match tail.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let params: Vec<Cow<'_, str>> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => Cow::Owned(format!("{k}=***")),
                    _ => Cow::Borrowed(p),
                })
                .collect();
            out.push_str(&params.join("&"));
        }
        None => out.push_str(tail),
    }
    out
}

/// A text (a system file) with the password of every PostgreSQL URL in it redacted
/// ([`redact_url`]); a URL ends at white space or a quote.
pub fn redact_text(text: &str) -> Cow<'_, str> {
    let lower = text.to_ascii_lowercase();
    let mut starts: Vec<usize> = ["postgres://", "postgresql://"]
        .iter()
        .flat_map(|p| lower.match_indices(p).map(|(i, _)| i).collect::<Vec<_>>())
        .collect();
    if starts.is_empty() {
        return Cow::Borrowed(text);
    }
    starts.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut done = 0;
    for start in starts {
        if start < done {
            continue;
        }
        let len =
            text[start..].find(|c: char| c.is_whitespace() || c == '"' || c == '\'').unwrap_or(text.len() - start);
        out.push_str(&text[done..start]);
        out.push_str(&redact_url(&text[start..start + len]));
        done = start + len;
    }
    out.push_str(&text[done..]);
    Cow::Owned(out)
}

/// The password file's text: `PGPASSFILE`, else `~/.pgpass`; none if missing, or if others may
/// read it (PostgreSQL's tools ignore such a file too).
fn password_file() -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = match std::env::var_os("PGPASSFILE") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".pgpass"),
    };
    let meta = std::fs::metadata(&path).ok()?;
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!("password file {} is ignored: others may read it (chmod 600 it)", path.display());
        return None;
    }
    std::fs::read_to_string(&path).ok()
}

/// The password of the first line of a password file (`HOST:PORT:DBNAME:USER:PASSWORD`, `*`
/// matches anything, `\:` and `\\` escape) that matches `key` (host, port, database, user).
pub(crate) fn pgpass_lookup(text: &str, key: &[String; 4]) -> Option<String> {
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let mut fields = vec![String::new()];
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => fields.last_mut()?.push(chars.next().unwrap_or('\\')),
                ':' if fields.len() < 5 => fields.push(String::new()),
                c => fields.last_mut()?.push(c),
            }
        }
        if fields.len() == 5 && fields.iter().zip(key).all(|(f, k)| f == "*" || f == k) {
            return fields.pop();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_and_texts_are_redacted() {
        assert_eq!(redact_url("postgres://u:p%40ss@h:5/db?sslmode=disable"), "postgres://u:***@h:5/db?sslmode=disable");
        assert_eq!(
            redact_url("postgresql://u@h/db?password=x&application_name=a"),
            "postgresql://u@h/db?password=***&application_name=a"
        );
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
        assert_eq!(redact_url("postgres://u:a:b@c@h/db"), "postgres://u:***@h/db");
        let text = "database = \"postgres://daq:s3cret@db:5432/runs\"\n# also POSTGRESQL://x:y@z/w\nname = 'x'";
        let redacted = redact_text(text);
        assert!(!redacted.contains("s3cret") && !redacted.contains(":y@"), "{redacted}");
        assert!(redacted.contains("postgres://daq:***@db:5432/runs\"") && redacted.contains("POSTGRESQL://x:***@z/w"));
        assert!(matches!(redact_text("no url"), Cow::Borrowed(_)));
    }

    #[test]
    fn locations_are_files_or_checked_urls_and_never_show_the_password() {
        assert_eq!(Location::parse(" runs.sqlite ").unwrap(), Location::Sqlite("runs.sqlite".into()));
        assert_eq!(Location::parse("").unwrap_err(), LocationError::Empty);
        let url = Location::parse("postgres://daq:hunter2@127.0.0.1:6543/runs").unwrap();
        assert_eq!(url.clone().under(Path::new("/d")), url);
        assert_eq!(url.to_config_value(), "postgres://daq:hunter2@127.0.0.1:6543/runs");
        assert!(!format!("{url} {url:?}").contains("hunter2"));
        let e = Location::parse("postgres://daq:hunter2@127.0.0.1:notaport/runs").unwrap_err();
        assert!(matches!(e, LocationError::BadUrl { .. }) && !e.to_string().contains("hunter2"), "{e}");
        let e = Location::parse("postgresql://daq:hunter2@127.0.0.1").unwrap_err();
        assert_eq!(e, LocationError::Incomplete { url: "postgresql://daq:***@127.0.0.1".into(), missing: "database" });
        let e = Location::parse("postgres://127.0.0.1/runs").unwrap_err();
        assert!(e.to_string().contains("no user"), "{e}");
    }

    #[test]
    fn the_password_file_is_matched_field_by_field_with_wildcards_and_escapes() {
        let key = ["db".to_owned(), "5432".to_owned(), "runs".to_owned(), "daq".to_owned()];
        let text = "# comment\nother:5432:runs:daq:no\ndb:*:runs:daq:pa\\:ss\\\\word\n*:*:*:*:fallback\n";
        assert_eq!(pgpass_lookup(text, &key).as_deref(), Some("pa:ss\\word"));
        let key2 = ["x".to_owned(), "1".to_owned(), "y".to_owned(), "z".to_owned()];
        assert_eq!(pgpass_lookup(text, &key2).as_deref(), Some("fallback"));
        assert_eq!(pgpass_lookup("db:5432:runs\n", &key), None);
        assert_eq!(pgpass_lookup("db:5432:runs:daq:pass:with:colons", &key).as_deref(), Some("pass:with:colons"));
    }
}
