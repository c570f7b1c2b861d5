//! For tests (feature `testing`): a real PostgreSQL server started by the tests themselves, and
//! test databases of either backend, so that one test body runs against SQLite and PostgreSQL.
//!
//! The server is made with `initdb` in a temporary directory and started with `pg_ctl` on a
//! free port of 127.0.0.1 (its socket in the same directory), with a password for the role
//! `daqflow`. As root (PostgreSQL refuses to run as root) it runs as the user `postgres`
//! through `runuser`. The binaries are looked for under `/usr/lib/postgresql/*/bin`, then in
//! `PATH`. A watchdog process stops the server and removes the directory when the test process
//! ends, however it ends (a panic, an abort, a kill): [`shared`] starts one server per test
//! binary, and each test takes a database of its own ([`TestDb::new`]).
//!
//! Without PostgreSQL installed, the tests of the PostgreSQL backend fail if the environment
//! variable `CI` is set (CI installs it: `.ci/run`), and otherwise print why and pass without
//! running.
//!
//! ```no_run
//! use daqflow_rundb::testing::{Backend, TestDb};
//! fn runs_are_numbered(backend: Backend) {
//!     let Some(db) = TestDb::new(backend, "runs_are_numbered") else { return };
//!     assert_eq!(db.open().begin_run("s", "", None).unwrap(), 1);
//! }
//! daqflow_rundb::for_each_backend!(runs_are_numbered);
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{Location, RunDb};

/// The role the tests' server is made with (a superuser) and its password.
pub const USER: &str = "daqflow";
const PASSWORD: &str = "daqflow-test-secret";

/// A backend to run a test against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// An SQLite file in a temporary directory.
    Sqlite,
    /// A new database on the test binary's PostgreSQL server ([`shared`]).
    Postgres,
}

/// Runs each named test function (`fn NAME(backend: Backend)`) as two tests, `NAME::sqlite` and
/// `NAME::postgres`.
#[macro_export]
macro_rules! for_each_backend {
    ($($test:ident),* $(,)?) => {
        $(
            mod $test {
                #[test]
                fn sqlite() {
                    super::$test($crate::testing::Backend::Sqlite)
                }
                #[test]
                fn postgres() {
                    super::$test($crate::testing::Backend::Postgres)
                }
            }
        )*
    };
}

/// A database for one test: an SQLite file in a directory removed on drop, or a database of its
/// own on the shared PostgreSQL server.
pub struct TestDb {
    location: Location,
    server: Option<&'static PgServer>,
    name: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// A new, empty database for the test `name`; `None` when PostgreSQL is not installed and
    /// the environment variable `CI` is not set (the reason is printed). Panics if PostgreSQL
    /// is installed but does not start, or is missing while `CI` is set.
    pub fn new(backend: Backend, name: &str) -> Option<TestDb> {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary directory: {e}"));
                Some(TestDb {
                    location: Location::Sqlite(dir.path().join(format!("{name}.sqlite"))),
                    server: None,
                    name: name.to_owned(),
                    _dir: Some(dir),
                })
            }
            Backend::Postgres => {
                let server = shared()?;
                let (name, url) = server.create_database(name);
                let location = Location::parse(&url).unwrap_or_else(|e| panic!("{e}"));
                Some(TestDb { location, server: Some(server), name, _dir: None })
            }
        }
    }

    /// Where it is: what a system file's `database` says.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The database's name (PostgreSQL) or file stem (SQLite).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The location as a system file would say it with the password kept out (PostgreSQL:
    /// the URL without it; give [`TestDb::password`] in `PGPASSWORD`).
    pub fn location_without_password(&self) -> String {
        match self.server {
            Some(server) => server.url(&self.name, false),
            None => self.location.to_config_value(),
        }
    }

    /// The password of a PostgreSQL database.
    pub fn password(&self) -> Option<&'static str> {
        self.server.map(PgServer::password)
    }

    /// Opens it.
    pub fn open(&self) -> RunDb {
        RunDb::connect(&self.location).unwrap_or_else(|e| panic!("opening the test database: {e}"))
    }

    /// Ends every server connection to this database, as a restart of the server would
    /// (PostgreSQL only; returns how many were ended).
    pub fn break_connections(&self) -> u64 {
        let Some(server) = self.server else { return 0 };
        let mut admin = server.admin();
        let rows = admin
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                &[&self.name],
            )
            .unwrap_or_else(|e| panic!("ending the connections to {}: {e}", self.name));
        rows.len() as u64
    }
}

/// Why PostgreSQL cannot run here, if it cannot.
fn not_installed() -> Option<String> {
    if binaries().is_none() {
        return Some(
            "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin or in PATH".into(),
        );
    }
    let no_user = || !Command::new("id").arg("postgres").output().is_ok_and(|o| o.status.success());
    if is_root() && no_user() {
        return Some("running as root, and there is no user `postgres` to run the server as".into());
    }
    None
}

/// `true` when the test may use PostgreSQL; `false` (after saying why) when it is not
/// installed and `CI` is not set; a panic when it is not installed and `CI` is set.
fn installed() -> bool {
    let Some(why) = not_installed() else { return true };
    if std::env::var_os("CI").is_some() {
        panic!(
            "PostgreSQL is needed for this test and CI is set: {why} (.ci/run installs the Debian package `postgresql`)"
        );
    }
    eprintln!("SKIPPED: the PostgreSQL backend's test did not run: {why} (install the Debian package `postgresql`)");
    false
}

fn start_or_panic() -> PgServer {
    PgServer::start().unwrap_or_else(|e| panic!("starting the tests' PostgreSQL server: {e}"))
}

/// The test binary's PostgreSQL server, started by the first test that asks; `None` when
/// PostgreSQL is not installed and `CI` is not set.
pub fn shared() -> Option<&'static PgServer> {
    static SERVER: OnceLock<PgServer> = OnceLock::new();
    installed().then(|| SERVER.get_or_init(start_or_panic))
}

/// A PostgreSQL server for one test alone (one that stops and starts it); `None` as for
/// [`shared`].
pub fn private() -> Option<PgServer> {
    installed().then(start_or_panic)
}

/// A PostgreSQL server for tests, stopped and removed when dropped or when the process ends.
pub struct PgServer {
    port: u16,
    dir: PathBuf,
    bin: PathBuf,
    /// Ends the server and removes `dir` when its standard input closes.
    watchdog: Option<Child>,
}

/// The directory of PostgreSQL's server binaries: the newest `/usr/lib/postgresql/N/bin`, else
/// the one of `initdb` in `PATH`.
fn binaries() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    std::env::split_paths(&std::env::var_os("PATH")?).find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The command line prefix that runs a server binary: as `postgres` through `runuser` when root.
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(mut c: Command, what: &str) -> Result<(), String> {
    let out = c.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("finding a free port: {e}"))
}

impl PgServer {
    /// Makes and starts a server of its own (most tests share one: [`shared`]). The error says
    /// what is missing or what failed.
    pub fn start() -> Result<PgServer, String> {
        if let Some(why) = not_installed() {
            return Err(why);
        }
        let bin = binaries().ok_or("no PostgreSQL server binaries")?;
        let dir = tempfile::Builder::new()
            .prefix("daqflow-pg-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?
            .keep();
        // From here on the watchdog removes the directory, whatever happens.
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(concat!(
                "cat >/dev/null; ",
                "$RUN \"$BIN/pg_ctl\" -D \"$DIR/data\" -m immediate -w stop >/dev/null 2>&1; ",
                "rm -rf \"$DIR\""
            ))
            .env("RUN", if is_root() { "runuser -u postgres --" } else { "" })
            .env("BIN", &bin)
            .env("DIR", &dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the watchdog: {e}"))?;
        let mut server = PgServer { port: 0, dir, bin, watchdog: Some(watchdog) };
        server.init()?;
        let mut last = String::new();
        for _ in 0..5 {
            server.port = free_port()?;
            match server.start_again() {
                Ok(()) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn init(&self) -> Result<(), String> {
        let pwfile = self.dir.join("pwfile");
        std::fs::File::create(&pwfile)
            .and_then(|mut f| f.write_all(PASSWORD.as_bytes()))
            .map_err(|e| format!("writing {}: {e}", pwfile.display()))?;
        if is_root() {
            run(
                {
                    let mut c = Command::new("chown");
                    c.args(["-R", "postgres:"]).arg(&self.dir);
                    c
                },
                "chown",
            )?;
        }
        let mut initdb = as_server_user(&self.bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-U", USER, "--auth=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync"])
            .arg(format!("--pwfile={}", pwfile.display()));
        run(initdb, "initdb")
    }

    /// Starts the server again after [`PgServer::stop`], on the same port.
    pub fn start_again(&self) -> Result<(), String> {
        let mut c = as_server_user(&self.bin.join("pg_ctl"));
        c.arg("-D").arg(self.dir.join("data")).args(["-w", "-t", "60", "-l"]).arg(self.dir.join("log")).arg("-o").arg(
            format!(
                "-k {} -h 127.0.0.1 -p {} -c fsync=off -c full_page_writes=off -c max_connections=200",
                self.dir.display(),
                self.port
            ),
        );
        c.arg("start");
        run(c, "pg_ctl start").map_err(|e| {
            let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
            format!("{e}\nserver log:\n{log}")
        })
    }

    /// Stops the server (`pg_ctl stop -m fast`): its clients lose their connections.
    pub fn stop(&self) -> Result<(), String> {
        let mut c = as_server_user(&self.bin.join("pg_ctl"));
        c.arg("-D").arg(self.dir.join("data")).args(["-m", "fast", "-w", "stop"]);
        run(c, "pg_ctl stop")
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `db` as the role [`USER`], with the password in it when
    /// `with_password`.
    pub fn url(&self, db: &str, with_password: bool) -> String {
        let password = if with_password { format!(":{PASSWORD}") } else { String::new() };
        format!("postgres://{USER}{password}@127.0.0.1:{}/{db}", self.port)
    }

    /// The role's password.
    pub fn password(&self) -> &'static str {
        PASSWORD
    }

    /// A connection to the server's `postgres` database.
    fn admin(&self) -> postgres::Client {
        let url = self.url("postgres", true);
        postgres::Client::connect(&url, postgres::NoTls)
            .unwrap_or_else(|e| panic!("connecting to the test server: {e}"))
    }

    /// Creates a new, empty database for the test `name`: its name (unique in this process) and
    /// its URL with the password.
    pub fn create_database(&self, name: &str) -> (String, String) {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let stem: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
            .take(40)
            .collect();
        let db = format!("{stem}_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        self.admin()
            .batch_execute(&format!("CREATE DATABASE \"{db}\""))
            .unwrap_or_else(|e| panic!("creating the test database {db}: {e}"));
        let url = self.url(&db, true);
        (db, url)
    }

    /// Creates a new, empty database for the test `name` and opens it.
    pub fn open_new_database(&self, name: &str) -> RunDb {
        let (_, url) = self.create_database(name);
        let location = Location::parse(&url).unwrap_or_else(|e| panic!("{e}"));
        RunDb::connect(&location).unwrap_or_else(|e| panic!("opening the test database: {e}"))
    }
}

impl Drop for PgServer {
    /// Closes the watchdog's input and waits until it stopped the server and removed the
    /// directory.
    fn drop(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            drop(w.stdin.take());
            let _ = w.wait();
        }
    }
}
