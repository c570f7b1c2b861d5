//! The operator's console (`daqflow run`): commands typed on standard input, one per line.
//!
//! - Commands run in the order typed, one at a time, on a thread of their own, so that the
//!   console keeps reading while a transition is under way: `status` is answered at once (with
//!   the components the transition waits for), and a command typed meanwhile says what it waits
//!   for and runs next.
//! - Every run that ends prints its summary, whoever ended it: `stop` or `quit` here, the web
//!   UI, a policy (a component that failed, with its first error line), a `reset`, a signal.
//! - The end of standard input (nohup, cron, CI, `< /dev/null`) means **no console** when
//!   something else can still drive or end the system (a run `--start` took, which a signal
//!   ends; a web UI): the operator says so once on standard error and goes on until Ctrl-C or
//!   SIGTERM (without a web UI: until the run ends). Otherwise it means `quit`.
//!
//! - Ctrl-C and SIGTERM ([`Interrupts`]): a command under way finishes, a run in progress is
//!   stopped with its summary; a standard input that ends because its terminal is gone is a
//!   hangup (`--on-hangup`).
//!
//! The exit status is 0 when every run summarised was perfect (nothing lost or unknown, every
//! file good, no error), else 1. Every line goes through `say!`: a terminal that is gone never
//! breaks the console.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daqflow_api::{RunSummary, Transition, TransitionResult};
use daqflow_runcontrol::operator::Operator;
use serde_json::Value;

use super::{acknowledge_from_console, print_alarms, print_summary, stop_run, summary_of};
use crate::terminal::{Interrupts, say, say_err};

/// What the console prints summaries with and remembers of them.
struct Shared {
    op: Operator,
    interrupts: Interrupts,
    web_url: Option<String>,
    /// The runs whose summary was printed.
    summarised: Mutex<BTreeSet<u32>>,
    /// The runs whose start was printed.
    announced: Mutex<BTreeSet<u32>>,
    /// Whether every run summarised was perfect.
    all_ok: Mutex<bool>,
    /// The command under way on the commands' thread, and since when.
    busy: Mutex<Option<(String, Instant)>>,
}

impl Shared {
    /// Prints `summary` once per run.
    fn summarise(&self, summary: &RunSummary) {
        if !self.summarised.lock().unwrap_or_else(|p| p.into_inner()).insert(summary.run) {
            return;
        }
        let (ok, _) = print_summary(summary, &self.op, self.web_url.as_deref());
        *self.all_ok.lock().unwrap_or_else(|p| p.into_inner()) &= ok;
    }

    fn summarised(&self, run: u32) -> bool {
        self.summarised.lock().unwrap_or_else(|p| p.into_inner()).contains(&run)
    }

    /// Notes that `run` started; whether it was new.
    fn announce(&self, run: u32) -> bool {
        self.announced.lock().unwrap_or_else(|p| p.into_inner()).insert(run)
    }

    fn busy(&self) -> Option<(String, Instant)> {
        self.busy.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A line for the commands' thread.
enum Job {
    Line(String),
    /// Standard input ended (after every line before it).
    EndOfInput,
}

/// What the commands' thread says back.
enum Said {
    /// `quit` (or the end of input that means it) is done: the run stopped and summarised.
    Quit,
    /// The end of input means no console.
    NoConsole,
}

/// The console: until `quit`, the end of input that means it, a signal, or (with no console and
/// no web UI) the end of the run. `started`: `--start` took a run. Whether every run it
/// summarised was perfect.
pub(super) fn run(
    op: &Operator,
    web_url: Option<String>,
    started: bool,
    interrupts: &Interrupts,
) -> anyhow::Result<bool> {
    let shared = Arc::new(Shared {
        op: op.clone(),
        interrupts: interrupts.clone(),
        web_url,
        summarised: Mutex::new(BTreeSet::new()),
        announced: Mutex::new(BTreeSet::new()),
        all_ok: Mutex::new(true),
        busy: Mutex::new(None),
    });
    let (line_tx, lines) = channel::<Option<String>>();
    std::thread::Builder::new().name("console".into()).spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) => {
                    if line_tx.send(Some(l)).is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = line_tx.send(None);
    })?;
    let (job_tx, jobs) = channel::<Job>();
    let (said_tx, said) = channel::<Said>();
    let no_console_means_go_on = started || shared.web_url.is_some();
    {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("console-commands".into())
            .spawn(move || commands(&shared, &jobs, &said_tx, no_console_means_go_on))?;
    }
    let mut stdin_open = true;
    let mut no_console = false;
    // The run being followed (open), to summarise it when it ends by anything but this console.
    let mut following = op.run_open().then(|| op.run_number()).flatten();
    if let Some(run) = following {
        shared.announce(run);
    }
    interrupts.doing("the end to begin");
    loop {
        if interrupts.requested() {
            // Ctrl-C, SIGTERM or a hangup: a command under way finishes, then the run in
            // progress is stopped, with its summary (a transition the web UI asked for finishes
            // first too).
            if let Some((what, _)) = shared.busy() {
                say!("`{what}` is under way: it ends first");
                interrupts.doing(format!("`{what}`, under way, to end"));
            }
            while shared.busy().is_some() {
                std::thread::sleep(Duration::from_millis(50));
            }
            op.wait_idle();
            if op.run_open()
                && let Some(run) = op.run_number()
                && !shared.summarised(run)
            {
                shared.summarise(&stop_run(op, run, interrupts)?);
            }
            break;
        }
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(line)) => {
                if line.trim() == "status" {
                    print_status(op);
                } else if !line.trim().is_empty() {
                    if let Some((what, since)) = shared.busy() {
                        say!("`{}` waits: {}", line.trim(), under_way(op, &what, since));
                    }
                    let _ = job_tx.send(Job::Line(line));
                }
            }
            Ok(None) => {
                stdin_open = false;
                // A terminal that is gone is a hangup (`--on-hangup`): ended, or no console.
                if interrupts.input_ended() {
                    say_err!("daqflow: the terminal is gone: no console from here on (--on-hangup keep)");
                    no_console = true;
                } else if !interrupts.requested() {
                    let _ = job_tx.send(Job::EndOfInput);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                if stdin_open {
                    stdin_open = false;
                    if !interrupts.requested() {
                        let _ = job_tx.send(Job::EndOfInput);
                    }
                }
            }
        }
        match said.try_recv() {
            Ok(Said::Quit) => break,
            Ok(Said::NoConsole) => no_console = true,
            Err(_) => {}
        }
        // Runs that end by anything but this console's commands (the web UI, a policy), and
        // runs started from the web UI, are followed here while no command is under way.
        if shared.busy().is_some() {
            continue;
        }
        let open = op.run_open().then(|| op.run_number()).flatten();
        if let Some(run) = following
            && open != Some(run)
        {
            if !shared.summarised(run) {
                let summary = summary_of(op, run)?;
                match &summary.error {
                    Some(e) => say!("run {run} ended: {e}"),
                    None => say!("run {run} was stopped from outside the console (the web UI)"),
                }
                shared.summarise(&summary);
            }
            following = None;
        }
        if following.is_none()
            && let Some(run) = open
        {
            if shared.announce(run) {
                say!("run {run} started from outside the console (the web UI)");
            }
            following = Some(run);
        }
        if no_console && shared.web_url.is_none() && following.is_none() && !op.run_open() {
            say_err!("daqflow: the run ended and nothing can start another (no console, no web UI): the operator ends");
            break;
        }
    }
    let ok = *shared.all_ok.lock().unwrap_or_else(|p| p.into_inner());
    Ok(ok)
}

/// What is under way, for a command that waits for it: the command, the system's phase, the
/// components it waits for and for how long.
fn under_way(op: &Operator, what: &str, since: Instant) -> String {
    let waiting = op.waiting_for();
    let who = if waiting.is_empty() {
        String::new()
    } else {
        let names: Vec<String> = waiting.iter().map(|(n, verb)| format!("{n} ({verb})")).collect();
        format!(", waiting for {}", names.join(", "))
    };
    format!("`{what}` is under way ({}{who}, {:.0} s so far)", op.state().name(), since.elapsed().as_secs_f64())
}

/// `status`: the live status as JSON, without the rate plot, with what a transition under way
/// waits for.
fn print_status(op: &Operator) {
    let mut v = serde_json::to_value(op.status()).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.remove("rates");
        let waiting: Vec<Value> =
            op.waiting_for().into_iter().map(|(n, verb)| serde_json::json!({"component": n, "for": verb})).collect();
        m.insert("waiting_for".into(), Value::Array(waiting));
    }
    say!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
}

/// The commands' thread: each line in turn, until `quit` or the end of input that means it.
fn commands(shared: &Shared, jobs: &Receiver<Job>, said: &Sender<Said>, no_console_means_go_on: bool) {
    let set_busy = |what: Option<String>| {
        *shared.busy.lock().unwrap_or_else(|p| p.into_inner()) = what.map(|w| (w, Instant::now()));
    };
    while let Ok(job) = jobs.recv() {
        let line = match job {
            Job::Line(l) => l,
            Job::EndOfInput if no_console_means_go_on => {
                let until = if shared.web_url.is_some() {
                    "until Ctrl-C or SIGTERM; the web UI drives the system meanwhile"
                } else {
                    "until Ctrl-C or SIGTERM, or until the run ends"
                };
                say_err!(
                    "daqflow: standard input ended: no console from here on; the operator goes on {until} (each run's \
                     summary is printed when it ends)"
                );
                let _ = said.send(Said::NoConsole);
                continue;
            }
            Job::EndOfInput => {
                // Nothing else can drive the system: the end of input is `quit`.
                set_busy(Some("quit".into()));
                if let Err(e) = quit(shared, "standard input ended") {
                    say!("quit: {e}");
                }
                set_busy(None);
                let _ = said.send(Said::Quit);
                return;
            }
        };
        let verb = line.split_whitespace().next().unwrap_or("").to_owned();
        set_busy(Some(line.trim().to_owned()));
        let quitting = matches!(verb.as_str(), "quit" | "exit");
        if quitting {
            if let Err(e) = quit(shared, &verb) {
                say!("{verb}: {e}");
            }
        } else {
            command(shared, &line);
        }
        set_busy(None);
        if quitting {
            let _ = said.send(Said::Quit);
            return;
        }
    }
}

/// `quit` (`why`): a run in progress is stopped, with its summary.
fn quit(shared: &Shared, why: &str) -> anyhow::Result<()> {
    let op = &shared.op;
    if op.run_open()
        && let Some(run) = op.run_number()
    {
        say!("{why}: stopping run {run}");
        shared.summarise(&stop_run(op, run, &shared.interrupts)?);
    }
    Ok(())
}

/// One command other than `quit` and `status`.
fn command(shared: &Shared, line: &str) {
    let op = &shared.op;
    let mut words = line.split_whitespace();
    let verb = words.next().unwrap_or("");
    let transition = match verb {
        "" => return,
        "status" => return print_status(op),
        "alarms" => return print_alarms(op),
        "ack" => {
            match words.next() {
                Some(name) => acknowledge_from_console(op, name),
                None => say!("usage: ack ALARM (see `alarms`)"),
            }
            return;
        }
        "set" | "unset" => {
            let rest: Vec<&str> = words.collect();
            let (target, value) = match (verb, rest.join(" ").split_once('=')) {
                ("set", Some((t, v))) => (t.trim().to_owned(), Some(daqflow_component::process::parse_value(v.trim()))),
                ("unset", None) if rest.len() == 1 => (rest[0].to_owned(), None),
                _ => {
                    say!("usage: set NAME.KEY=VALUE (live, or for the next configure), unset NAME.KEY");
                    return;
                }
            };
            let Some((component, key)) = target.split_once('.') else {
                say!("{verb} {target}: expected NAME.KEY (a component's parameter)");
                return;
            };
            match op.set(component, key, value) {
                Ok(all) => say!(
                    "{target} set; parameters over the system file's: {}",
                    serde_json::to_string(&all).unwrap_or_default()
                ),
                Err(e) => say!("{verb}: {e}"),
            }
            return;
        }
        "repeat" => {
            match words.next().map(str::parse::<u32>) {
                Some(Ok(n)) => match op.repeat(n) {
                    Ok(all) => say!(
                        "the configuration of run {n} for the next configure: parameters set {}",
                        serde_json::to_string(&all).unwrap_or_default()
                    ),
                    Err(e) => say!("repeat: {e}"),
                },
                _ => say!("usage: repeat RUN (while Initial: run RUN's parameters for the next configure)"),
            }
            return;
        }
        // The web API's rules for the run number (from 1), through the same parser.
        "start" => {
            let body = match words.next() {
                None => String::new(),
                Some(n) => match n.parse::<u64>() {
                    Ok(n) => format!("{{\"run\": {n}}}"),
                    Err(_) => {
                        say!("usage: start [RUN] (RUN: a run number never used, 1 to 4294967295)");
                        return;
                    }
                },
            };
            match Transition::parse("start", body.as_bytes()) {
                Ok(t) => t,
                Err(e) => {
                    say!("{e}");
                    return;
                }
            }
        }
        other => match Transition::parse(other, b"") {
            Ok(t) => t,
            Err(e) => {
                say!("{e}; or set NAME.KEY=VALUE, unset NAME.KEY, status, alarms, ack ALARM, quit");
                return;
            }
        },
    };
    let open_before = op.run_open().then(|| op.run_number()).flatten();
    match op.transition(transition) {
        Ok(TransitionResult::Stopped(summary)) => shared.summarise(&summary),
        Ok(TransitionResult::Started(run)) => {
            shared.announce(run);
            say!("run {run} started");
        }
        Ok(_) => say!("{verb}: done; state {}", op.state()),
        Err(e) => say!("{verb}: {e}"),
    }
    // A reset during a run closes it (as failed): its summary too.
    if let Some(run) = open_before
        && !op.run_open()
        && !shared.summarised(run)
        && let Ok(summary) = summary_of(op, run)
    {
        if let Some(e) = &summary.error {
            say!("run {run} ended: {e}");
        }
        shared.summarise(&summary);
    }
}
