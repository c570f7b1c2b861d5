//! The operator's terminal (`daqflow run`, `daqflow demo`): output that a terminal gone cannot
//! break, and what its signals do (docs/operator-guide.md, "Ctrl-C, SIGTERM and a closed
//! terminal").
//!
//! - The first Ctrl-C (SIGINT) or SIGTERM ends the system in order: a transition under way
//!   finishes, a run in progress is stopped (producers first) and recorded with its summary,
//!   every component resets and ends. It says what it will do.
//! - The second says what the end waits for, and what a third would cost.
//! - The third ends the operator at once (exit status 130): every component gets SIGTERM (its
//!   parent-death signal) and stops by itself; an open run stays open in the run database.
//! - A closed terminal (SIGHUP, or its input ending as a hung-up terminal's does) does what
//!   `--on-hangup` says: `stop` is the first Ctrl-C, `keep` goes on without the terminal.
//!
//! The components run in process groups (a local `daqflow component`) or sessions (ssh, a
//! user's program) of their own (`daqflow_runcontrol`'s supervisor), so the terminal's signals
//! reach the operator alone. Every print to the terminal goes through
//! [`say!`]: a write that fails (EIO from a terminal that is gone, EPIPE) is dropped, never a
//! panic, so a closed terminal can break neither the stop nor the run's record.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use daqflow_api::SystemState;
use daqflow_runcontrol::operator::Operator;

/// `println!` that never panics: the line is dropped when standard output cannot take it (a
/// terminal that is gone answers EIO, a closed pipe EPIPE).
macro_rules! say {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout());
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `print!` that never panics (see [`say!`]), flushed.
macro_rules! say_inline {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = write!(out, $($arg)*);
        let _ = out.flush();
    }};
}

/// `eprintln!` that never panics (see [`say!`]).
macro_rules! say_err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub(crate) use {say, say_err, say_inline};

/// What a closed terminal (SIGHUP) does.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hangup {
    /// End in order, as the first Ctrl-C does.
    Stop,
    /// Go on without the terminal (the web UI, SIGINT or SIGTERM end it).
    Keep,
}

/// The exit status after a third Ctrl-C (128 + SIGINT, as a shell reports a process that
/// SIGINT ended).
pub const EXIT_AT_ONCE: i32 = 130;

static INTERRUPTS: AtomicU32 = AtomicU32::new(0);
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);
static HANGUPS: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if sig == libc::SIGHUP {
        HANGUPS.fetch_add(1, Ordering::SeqCst);
    } else {
        LAST_SIGNAL.store(sig, Ordering::SeqCst);
        INTERRUPTS.fetch_add(1, Ordering::SeqCst);
    }
}

/// The operator's signals, counted and acted on by a thread of their own (the main thread may
/// be waiting for a transition meanwhile).
#[derive(Clone)]
pub struct Interrupts {
    shared: Arc<Shared>,
}

struct Shared {
    hangup: Hangup,
    /// The first request to end came (Ctrl-C, SIGTERM, a hangup under `stop`).
    requested: AtomicBool,
    /// The terminal is gone and the operator goes on (`keep`).
    detached: AtomicBool,
    /// How many requests to end came (a hangup counts once, as the first).
    level: AtomicU32,
    /// Whether standard input was a terminal at the start.
    stdin_tty: bool,
    /// SIGHUP was ignored at the start (`nohup`): a closed terminal changes nothing.
    hangup_ignored: bool,
    op: Mutex<Option<Operator>>,
    /// What the session does when no transition is under way (`verifying the files of run 3`).
    doing: Mutex<String>,
}

impl Interrupts {
    /// Installs the handlers of SIGINT, SIGTERM and SIGHUP and starts the thread that acts on
    /// them. Call it first: a signal before it would end the process at once.
    pub fn install(hangup: Hangup) -> anyhow::Result<Interrupts> {
        let hangup_ignored = ignored(libc::SIGHUP);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SIGHUP ignored from the start (`nohup`) stays ignored.
            if sig == libc::SIGHUP && hangup_ignored {
                continue;
            }
            // SAFETY: an all-zero sigaction is a valid value to fill in; `on_signal` is
            // async-signal-safe (atomic operations only) and lives for the whole program;
            // sigaction only replaces the disposition of this signal.
            let r = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(sig, &action, std::ptr::null_mut())
            };
            if r != 0 {
                anyhow::bail!("installing the handler of signal {sig}: {}", std::io::Error::last_os_error());
            }
        }
        let shared = Arc::new(Shared {
            hangup,
            requested: AtomicBool::new(false),
            detached: AtomicBool::new(false),
            level: AtomicU32::new(0),
            stdin_tty: std::io::stdin().is_terminal(),
            hangup_ignored,
            op: Mutex::new(None),
            doing: Mutex::new("starting the system".into()),
        });
        let interrupts = Interrupts { shared };
        let watcher = interrupts.clone();
        std::thread::Builder::new().name("signals".into()).spawn(move || watcher.watch())?;
        Ok(interrupts)
    }

    /// The operator the signals end (its state says what the end does and waits for).
    pub fn attach(&self, op: &Operator) {
        *lock(&self.shared.op) = Some(op.clone());
    }

    /// Says what the session does now, for a second Ctrl-C while no transition is under way.
    pub fn doing(&self, what: impl Into<String>) {
        *lock(&self.shared.doing) = what.into();
    }

    /// Whether the system is to end (the first Ctrl-C or SIGTERM, or a hangup under `stop`).
    pub fn requested(&self) -> bool {
        self.shared.requested.load(Ordering::SeqCst)
    }

    /// Whether the terminal is gone and the operator goes on without it (`--on-hangup keep`).
    pub fn detached(&self) -> bool {
        self.shared.detached.load(Ordering::SeqCst)
    }

    /// Standard input ended: when it was a terminal that is gone (hung up: it no longer answers
    /// as a terminal), this is a hangup, and whether the session goes on without it.
    pub fn input_ended(&self) -> bool {
        if self.shared.stdin_tty && !std::io::stdin().is_terminal() {
            self.hang_up();
        }
        self.detached()
    }

    fn watch(&self) {
        let (mut interrupts, mut hangups) = (0, 0);
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let h = HANGUPS.load(Ordering::SeqCst);
            if h != hangups {
                hangups = h;
                self.hang_up();
            }
            let n = INTERRUPTS.load(Ordering::SeqCst);
            while interrupts < n {
                interrupts += 1;
                let name = match LAST_SIGNAL.load(Ordering::SeqCst) {
                    libc::SIGTERM => "SIGTERM",
                    _ => "Ctrl-C",
                };
                let level = self.shared.level.fetch_add(1, Ordering::SeqCst) + 1;
                self.act(level, name);
            }
        }
    }

    /// The terminal is gone: the `--on-hangup` policy (once).
    fn hang_up(&self) {
        if self.shared.hangup_ignored {
            return;
        }
        match self.shared.hangup {
            Hangup::Stop => {
                if self.shared.level.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                    // The request first: nothing after it (a log record) can keep it from the
                    // main thread.
                    self.act(1, "the terminal closed (SIGHUP)");
                    tracing::warn!("the terminal closed (SIGHUP): ending in order (--on-hangup stop)");
                }
            }
            Hangup::Keep => {
                if !self.shared.detached.swap(true, Ordering::SeqCst) {
                    tracing::warn!(
                        "the terminal closed (SIGHUP): the operator goes on without it (--on-hangup keep); the web \
                         UI drives the system, SIGINT or SIGTERM (kill -INT {}) end it in order",
                        std::process::id()
                    );
                }
            }
        }
    }

    /// The `level`th request to end, by `name` (`Ctrl-C`, `SIGTERM`, …).
    fn act(&self, level: u32, name: &str) {
        let op = lock(&self.shared.op).clone();
        let tty = std::io::stdout().is_terminal();
        // After the terminal echoed ^C, on a line of its own.
        let nl = if tty { "\n" } else { "" };
        match level {
            1 => {
                self.shared.requested.store(true, Ordering::SeqCst);
                say!("{nl}{name}: ending in order: {}.", plan(op.as_ref()));
                say!("  (Ctrl-C again says what the end waits for; a third Ctrl-C ends at once.)");
            }
            2 => {
                let waiting =
                    op.as_ref().and_then(Operator::waiting_text).unwrap_or_else(|| lock(&self.shared.doing).clone());
                say!("{nl}{name} again: still ending in order, waiting for {waiting}.");
                say!("  A third Ctrl-C ends at once: {}", cost(op.as_ref()));
            }
            _ => {
                say!("{nl}{name} a third time: ending at once. {}", cost(op.as_ref()));
                tracing::warn!("ending at once ({name} a third time): {}", cost(op.as_ref()));
                let _ = std::io::stdout().flush();
                std::process::exit(EXIT_AT_ONCE);
            }
        }
    }
}

/// Whether signal `sig` is ignored (its disposition inherited from whoever started us).
fn ignored(sig: libc::c_int) -> bool {
    // SAFETY: sigaction with no new action only reads the disposition into `old`, an all-zero
    // (valid) value that lives across the call.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

use daqflow_component::sync::lock;

/// What the ordered end will do, from the operator's state.
fn plan(op: Option<&Operator>) -> String {
    let Some(op) = op else {
        return "the system being started starts first, then every component ends".into();
    };
    let state = op.state();
    let system = &op.file().system;
    let run = op.run_number().filter(|_| op.run_open());
    let end = "every component resets and ends";
    if op.waiting_text().is_some_and(|w| w.starts_with("the start of the system")) {
        return format!("the components being started join first (at most {:.0} s), then {end}", system.timeout_s);
    }
    let phase = match state {
        SystemState::Configuring => Some("configure"),
        SystemState::Starting => Some("start"),
        SystemState::Pausing => Some("pause"),
        SystemState::Resuming => Some("resume"),
        SystemState::Stopping => Some("stop"),
        SystemState::Resetting => Some("reset"),
        _ => None,
    };
    let drain = "producers first, the consumers drain last: nothing in flight is lost";
    match (phase, run) {
        (Some("stop"), Some(run)) => format!(
            "the stop of run {run} under way finishes ({drain}; each stage at most {:.0} s) and records the run with its \
             summary, then {end}",
            system.stop_timeout_s
        ),
        (Some(phase), _) => {
            let stop = match run {
                Some(run) => format!("run {run} is stopped ({drain}) and recorded with its summary, then "),
                None if phase == "start" => {
                    format!("the run it starts is stopped ({drain}) and recorded with its summary, then ")
                }
                None => String::new(),
            };
            format!(
                "the {phase} under way finishes first (each of its steps at most {:.0} s), then {stop}{end}",
                system.timeout_s
            )
        }
        (None, Some(run)) => format!("run {run} is stopped ({drain}) and recorded with its summary, then {end}"),
        (None, None) => format!("no run is open; {end}"),
    }
}

/// What ending at once costs, from the operator's state.
fn cost(op: Option<&Operator>) -> String {
    match op.and_then(|op| op.run_number().filter(|_| op.run_open())) {
        Some(run) => format!(
            "run {run} is not stopped in order: every component gets SIGTERM and stops by itself, closing its files, \
             but the events between components are lost and not counted, and run {run} stays open in the run \
             database until the next operator on this data directory marks it abandoned."
        ),
        None => "no run is open, so no data is lost; every component gets SIGTERM and ends by itself, without \
                 resetting in order."
            .into(),
    }
}
