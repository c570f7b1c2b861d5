//! `daqflow control-server` and `daqflow dialog …`: the DIALOG GUI's functions for terminals.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use daqflow_component::{Answer, CommandReply, Outcome, Request, State, Verb};
use daqflow_dialog::{
    ControlServer, Dialog, DialogConfig, DialogError, ServerConfig, ServiceEvent, parse_control_addrs,
};

/// Parses `250ms`, `2s`, `1.5s`, `1m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.find(|c: char| c.is_ascii_alphabetic()).map_or((s, "s"), |i| s.split_at(i));
    let v: f64 = num.trim().parse().map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 2s, 1m)"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        _ => return Err(format!("{s:?}: unit must be ms, s or m")),
    };
    if !(0.0..1e9).contains(&secs) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Arguments of `daqflow control-server`.
#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on (use 0.0.0.0:7000 to accept processes from other hosts).
    #[arg(long, default_value = "127.0.0.1:7000")]
    pub listen: std::net::SocketAddr,
    /// Heartbeat interval told to processes.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// A process silent for this long is declared lost.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub lost_after: Duration,
    /// This server is one of several its processes are given (a primary and spares): when it
    /// finds that it did not run for about --lost-after (stopped, or a host under heavy load),
    /// its processes have moved to another one, and it ends (exit status 1) rather than serve a
    /// second directory beside theirs. The operator gives it to each control server of a system
    /// with spares. Without it, a server that did not run gives its processes a new grace
    /// period and goes on.
    #[arg(long)]
    pub end_after_stall: bool,
    /// The other control servers of this system (its primary or spares), comma-separated:
    /// every second this one asks each how many processes it serves, and when the system's
    /// processes are split between two of them (after a network partition healed) the one
    /// serving fewer ends (exit status 1) so that they join the other. The operator gives it
    /// to each server of a system with spares whose ports are fixed.
    #[arg(long, value_name = "HOST:PORT,…", value_delimiter = ',')]
    pub siblings: Vec<std::net::SocketAddr>,
    /// Read the system token from the first line of standard input (what the operator does
    /// when it starts a control server on another host over ssh). The server then ends when
    /// its standard input ends (the operator ended) or, with --lease, when no further line came
    /// for that long (the operator writes one every second).
    #[arg(long)]
    pub token_stdin: bool,
    /// With --token-stdin: seconds without a line on standard input after which the server
    /// ends (its operator's host or the network to it is gone); 0: never.
    #[arg(long, default_value_t = 0.0, value_parser = crate::component_cmd::parse_lease)]
    pub lease: f64,
    /// Serve Prometheus metrics at http://ADDR/metrics (processes, services, subscriptions,
    /// heartbeat ages, processes lost: docs/operator-guide.md, "Monitoring with Prometheus").
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
}

pub const SERVER_AFTER_HELP: &str = "\
The control server keeps the directory of processes, services, commands and subscriptions,
forwards commands, and watches heartbeats. Service data never passes through it. It prints
`listening on ADDR` on stdout once ready, and runs until interrupted (Ctrl-C, SIGTERM).

Examples:
  daqflow control-server
  daqflow control-server --listen 0.0.0.0:7000 --token-file /etc/daqflow/token
  daqflow control-server --listen 127.0.0.1:7001      # a spare: give clients --control a,b
  daqflow control-server --metrics 127.0.0.1:9100     # Prometheus: http://127.0.0.1:9100/metrics

A server that did not run for longer than its heartbeat interval (stopped, a host under heavy
load) declares nobody lost for it: every process gets a full --lost-after from when it runs
again. With --end-after-stall (a primary or spare of several) it ends instead once it did not
run for about --lost-after, since its processes have moved to another server. With --siblings
(the other servers of the system) it asks each every second how many processes it serves, and
ends when the processes are split between them and the other serves more (a healed network
partition). With --token-stdin (how the operator starts a server on another host over ssh) the
first input line is the token, and the server ends when its input ends or, with --lease S, when
no line came for S seconds.";

pub fn run_server(args: &ServerArgs) -> anyhow::Result<ExitCode> {
    // The token (`daqflow --token-file`) is the process's: ServerConfig::default() takes it,
    // unless it comes on standard input.
    let mut config = ServerConfig {
        listen: args.listen,
        heartbeat_interval: args.heartbeat_interval,
        lost_after: args.lost_after,
        end_after_stall: args.end_after_stall,
        siblings: args.siblings.clone(),
        ..ServerConfig::default()
    };
    let mut operator_gone = None;
    if args.token_stdin {
        let mut input = std::io::stdin().lock();
        let token = crate::component_cmd::read_token_line(&mut input)?;
        daqflow_transport::auth::set_process_token(Some(token.clone()));
        config.token = Some(token);
        operator_gone = Some(watch_operator_input(args.lease));
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let server = ControlServer::start(config).await?;
        let _metrics = match args.metrics {
            Some(addr) => {
                let (view, name) = (server.view(), server.local_addr().to_string());
                let what = format!("control server {name}");
                Some(crate::metrics::serve(addr, &what, move || crate::metrics::control_server(&name, &view))?)
            }
            None => None,
        };
        println!("listening on {}", server.local_addr());
        std::io::stdout().flush()?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let gone = async {
            match operator_gone {
                Some(mut rx) => rx.recv().await.unwrap_or_else(|| "standard input ended".into()),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
            why = gone => {
                eprintln!("daqflow: {why}: ending");
                return anyhow::Ok(ExitCode::FAILURE);
            }
            ended = server.wait() => {
                if let Err(e) = ended {
                    eprintln!("daqflow: {e}");
                    return anyhow::Ok(ExitCode::FAILURE);
                }
            }
        }
        tracing::info!("control server stopping");
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

/// Watches standard input after the token's line (`--token-stdin`): says why the server must
/// end once it ends (the operator ended) or, with a lease, once no line came for that long
/// (the operator writes one every second; its host or the network to it is gone).
fn watch_operator_input(lease_s: f64) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let start = std::time::Instant::now();
    let last_ms = Arc::new(AtomicU64::new(0));
    let ended = Arc::new(AtomicBool::new(false));
    let (last2, ended2) = (last_ms.clone(), ended.clone());
    std::thread::spawn(move || {
        let mut line = String::new();
        let mut input = std::io::stdin().lock();
        loop {
            line.clear();
            match input.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => last2.store(start.elapsed().as_millis() as u64, Ordering::Relaxed),
            }
        }
        ended2.store(true, Ordering::Relaxed);
    });
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(100));
            if ended.load(Ordering::Relaxed) {
                let _ = tx.send("standard input ended (the operator that started this control server is gone)".into());
                return;
            }
            let silent = start.elapsed().as_secs_f64() - last_ms.load(Ordering::Relaxed) as f64 / 1000.0;
            if lease_s > 0.0 && silent > lease_s {
                let _ = tx
                    .send(format!("nothing from the operator for {silent:.0} s, longer than the lease of {lease_s} s"));
                return;
            }
        }
    });
    rx
}

/// Arguments of `daqflow dialog`.
#[derive(clap::Args, Debug)]
pub struct DialogArgs {
    /// Control server address(es), primary first then spares, comma-separated. Without it: the
    /// control servers of the operator whose data directory `daqflow --data DIR` names (read
    /// from DIR/operator.lock), else of the one whose token `--token-file DIR/token` is (when
    /// DIR/operator.lock is there), else 127.0.0.1:7000.
    #[arg(long, global = true, env = "DAQFLOW_CONTROL", value_name = "HOST:PORT,…")]
    pub control: Option<String>,
    /// Process name to join as (default: derived from the command and the pid).
    #[arg(long, global = true)]
    pub name: Option<String>,
    #[command(subcommand)]
    pub command: DialogCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum DialogCommand {
    /// List the processes: address, port, pid, provided and subscribed services, commands.
    Ls {
        /// Only processes where a field contains this text (case-insensitive).
        #[arg(long)]
        filter: Option<String>,
        /// Print the directory as JSON.
        #[arg(long)]
        json: bool,
        /// How long to wait for the control server.
        #[arg(long, default_value = "5s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Print each update of a service as one line as it arrives (and `lost …` lines); keeps
    /// listening across provider restarts.
    Listen {
        /// The service.
        service: String,
        /// Exit after this many updates.
        #[arg(long)]
        count: Option<u64>,
        /// Prefix each line with the update counter and `*` for the current value.
        #[arg(long)]
        seq: bool,
    },
    /// Send a command to every process that registered it. A component command (NAME/VERB or
    /// all/VERB: configure, start, pause, resume, stop, reset, set) asks every component for its
    /// reply and prints each; the exit status is 0 only when every one did it.
    Send {
        /// The command.
        command: String,
        /// Its payload (text). For a component command: empty, a number (the run for start,
        /// the last event for stop), or the request's JSON.
        #[arg(default_value = "")]
        payload: String,
        /// How long to wait for the components' replies.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        timeout: Duration,
        /// Send the payload as it is and only count the processes it reached (no replies).
        #[arg(long)]
        raw: bool,
    },
    /// Provide a service and publish each line read from stdin as a value.
    Publish {
        /// The service.
        service: String,
    },
    /// A process that provides, subscribes and accepts commands, printing everything it sees
    /// (for trying a system out and for tests).
    Peer {
        /// Services to provide; stdin lines `SERVICE VALUE` publish.
        #[arg(long)]
        provide: Vec<String>,
        /// Services to subscribe to.
        #[arg(long)]
        subscribe: Vec<String>,
        /// Commands to accept.
        #[arg(long)]
        command: Vec<String>,
    },
}

pub const DIALOG_AFTER_HELP: &str = "\
Which control server: --control (or DAQFLOW_CONTROL) when given; else, with `daqflow --data DIR`,
the one of the operator (daqflow demo, daqflow run) using the data directory DIR, as it wrote in
DIR/operator.lock, with the token DIR/token (--token-file wins); else, with --token-file
DIR/token, the operator of DIR when DIR/operator.lock is there; else 127.0.0.1:7000.

Examples:
  daqflow --data daqflow-demo dialog ls           the demo's processes (daqflow demo prints this)
  daqflow dialog ls
  daqflow dialog ls --filter ru-1
  daqflow dialog listen ru-1/stats
  daqflow dialog send all/stop                         # each component's reply; exit 1 if one refused
  daqflow dialog send evm/start 12                     # the run for start; the last event for stop
  daqflow dialog send hv-1/ramp 1200                   # any other command: counts who got it
  echo '{\"state\":\"Running\"}' | daqflow dialog publish test/state
  daqflow dialog --control host1:7000,host2:7000 ls     # primary and spare control servers";

/// Where the tools look for a control server when neither `--control` nor a data directory
/// says.
pub const DEFAULT_CONTROL: &str = "127.0.0.1:7000";

/// The control servers to join: `--control`; else those of the operator of the data directory
/// (`daqflow --data DIR`, else the directory of `--token-file DIR/token` when it holds an
/// operator's lock file); else [`DEFAULT_CONTROL`].
pub fn control_servers(
    control: Option<&str>,
    data: Option<&std::path::Path>,
    token_file: Option<&std::path::Path>,
) -> anyhow::Result<String> {
    use daqflow_runcontrol::operator::lock::{Holder, LOCK_FILE, holder};
    if let Some(c) = control {
        return Ok(c.to_owned());
    }
    let (dir, how) = match (data, token_file.and_then(std::path::Path::parent)) {
        (Some(d), _) => (d, "--data"),
        (None, Some(d)) if d.join(LOCK_FILE).exists() => (d, "--token-file"),
        _ => return Ok(DEFAULT_CONTROL.to_owned()),
    };
    let shown = dir.display();
    match holder(dir)? {
        Holder::Running(info) if !info.control.is_empty() => Ok(info.control.join(",")),
        Holder::Running(info) => anyhow::bail!(
            "{how} {shown}: its operator ({info}) has not started its control server yet; try again in a moment"
        ),
        Holder::Starting => anyhow::bail!("{how} {shown}: its operator is starting; try again in a moment"),
        Holder::Died(Some(info)) => anyhow::bail!(
            "{how} {shown}: its operator ({info}) is no longer running: it ended without releasing the directory (killed, or it crashed)"
        ),
        Holder::Died(None) => anyhow::bail!("{how} {shown}: its operator is no longer running"),
        Holder::Nobody if dir.is_dir() => {
            anyhow::bail!(
                "{how} {shown}: no operator is running there (start one: daqflow demo, daqflow run SYSTEM.toml)"
            )
        }
        Holder::Nobody => anyhow::bail!("{how} {shown}: there is no such directory"),
    }
}

fn config(args: &DialogArgs, default_name: &str, control: &str) -> anyhow::Result<DialogConfig> {
    let control = parse_control_addrs(control)?;
    let name = args.name.clone().unwrap_or_else(|| format!("{default_name}-{}", std::process::id()));
    // The token (`daqflow --token-file`) is the process's: DialogConfig::new takes it.
    Ok(DialogConfig::new(name, control))
}

fn out_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn printable(data: &[u8]) -> String {
    String::from_utf8_lossy(data).replace('\n', "\\n")
}

/// An error of a call that needs the control server, with why it could not be reached (a
/// wrong or missing token says so, rather than a bare timeout).
fn with_problem(dialog: &Dialog, what: &str, e: impl std::fmt::Display) -> anyhow::Error {
    match dialog.client().connection_problem() {
        Some(p) => anyhow::anyhow!("{what}: {e}: {p}"),
        None => anyhow::anyhow!("{what}: {e}"),
    }
}

/// `daqflow dialog …`; `data` and `token_file` are `daqflow --data`, `daqflow --token-file`.
pub fn run(
    args: &DialogArgs,
    data: Option<&std::path::Path>,
    token_file: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    let control = control_servers(args.control.as_deref(), data, token_file)?;
    let joining = |default_name: &str| config(args, default_name, &control);
    match &args.command {
        DialogCommand::Ls { filter, json, timeout } => {
            let dialog = Dialog::start(joining("dialog-ls")?)?;
            let mut procs =
                dialog.processes(*timeout).map_err(|e| with_problem(&dialog, "reading the directory", e))?;
            if let Some(f) = filter {
                let f = f.to_lowercase();
                procs.retain(|p| {
                    let fields = [p.name.clone(), p.host.clone(), p.port.to_string(), p.pid.to_string()];
                    fields
                        .iter()
                        .chain(&p.provides)
                        .chain(&p.subscribes)
                        .chain(&p.commands)
                        .any(|s| s.to_lowercase().contains(&f))
                });
            }
            let me = dialog.client().name().to_owned();
            procs.retain(|p| p.name != me);
            if *json {
                out_line(&serde_json::to_string_pretty(&procs)?);
            } else {
                print_table(&procs);
            }
            Ok(ExitCode::SUCCESS)
        }
        DialogCommand::Listen { service, count, seq } => {
            let dialog = Dialog::start(joining("dialog-listen")?)?;
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let limit = *count;
            let show_seq = *seq;
            let s2 = seen.clone();
            let _sub = dialog.subscribe(service, move |e| match e {
                ServiceEvent::Update { data, seq, initial } => {
                    if show_seq {
                        out_line(&format!("{seq}{} {}", if initial { "*" } else { "" }, printable(&data)));
                    } else {
                        out_line(&printable(&data));
                    }
                    let n = s2.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    if limit.is_some_and(|l| n >= l) {
                        let _ = tx.send(());
                    }
                }
                ServiceEvent::Lost { provider, cause } => {
                    out_line(&format!("lost: provider {provider} ({cause}); waiting for a provider"))
                }
                _ => {}
            })?;
            if limit.is_some() {
                let _ = rx.recv();
            } else {
                // Until interrupted.
                loop {
                    std::thread::park();
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        DialogCommand::Send { command, payload, timeout, raw } => {
            let dialog = Dialog::start(joining("dialog-send")?)?;
            match component_verb(command).filter(|_| !raw) {
                Some(verb) => send_to_components(&dialog, command, verb, payload, *timeout),
                None => {
                    let n = dialog
                        .send_command(command, payload.as_bytes())
                        .map_err(|e| with_problem(&dialog, &format!("sending `{command}`"), e))?;
                    if n == 0 {
                        return Ok(nobody(command));
                    }
                    out_line(&format!("delivered to {n} process(es)"));
                    Ok(ExitCode::SUCCESS)
                }
            }
        }
        DialogCommand::Publish { service } => {
            let dialog = Dialog::start(joining("dialog-publish")?)?;
            let svc = match dialog.provide(service) {
                Ok(s) => s,
                Err(e @ DialogError::ServiceTaken { .. }) => {
                    eprintln!("daqflow: error: {e}");
                    return Ok(ExitCode::from(1));
                }
                Err(e) => return Err(e.into()),
            };
            eprintln!("providing {service}; each line on stdin is published");
            for line in std::io::stdin().lock().lines() {
                svc.update(line?.as_bytes())?;
            }
            // Leave as a process (subscribers: LOST_SENDER, "disconnected") before the service
            // is dropped: dropping it first would withdraw it (INFO_SERVICE status 3).
            dialog.shutdown();
            drop(svc);
            Ok(ExitCode::SUCCESS)
        }
        DialogCommand::Peer { provide, subscribe, command } => {
            run_peer(joining("dialog-peer")?, provide, subscribe, command)
        }
    }
}

fn run_peer(
    config: DialogConfig,
    provide: &[String],
    subscribe: &[String],
    commands: &[String],
) -> anyhow::Result<ExitCode> {
    let dialog = Arc::new(Dialog::start(config)?);
    let mut services = std::collections::HashMap::new();
    for name in provide {
        match dialog.provide(name) {
            Ok(s) => {
                services.insert(name.clone(), Arc::new(s));
            }
            Err(e) => {
                eprintln!("daqflow: error: {e}");
                return Ok(ExitCode::from(1));
            }
        }
    }
    let mut keep = Vec::new();
    for name in subscribe {
        let n = name.clone();
        keep.push(dialog.subscribe(name, move |e| match e {
            ServiceEvent::Update { data, seq, initial } => {
                out_line(&format!("update {n} {seq}{} {}", if initial { "*" } else { "" }, printable(&data)))
            }
            ServiceEvent::Lost { provider, cause } => out_line(&format!("lost {n} {provider} ({cause})")),
            _ => {}
        })?);
    }
    let mut regs = Vec::new();
    for name in commands {
        regs.push(dialog.register_command(name, |c| {
            out_line(&format!("command {} from {} {}", c.name, c.from, printable(&c.data)))
        })?);
    }
    // Report subscriber counts as they change (shows the control server's LOST_RECEIVER).
    {
        let services = services.clone();
        std::thread::spawn(move || {
            let mut last = std::collections::HashMap::new();
            loop {
                for (name, s) in &services {
                    let n = s.subscriber_count();
                    if last.insert(name.clone(), n) != Some(n) {
                        out_line(&format!("subscribers {name} {n}"));
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }
    dialog.wait_connected(Duration::from_secs(30));
    out_line(&format!("ready {}", dialog.client().name()));
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let (name, value) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match services.get(name) {
            Some(s) => s.update(value.as_bytes())?,
            None => eprintln!("not providing {name}"),
        }
    }
    // Leave as a process: subscribers are told "disconnected", not "service withdrawn".
    dialog.shutdown();
    drop(keep);
    drop(regs);
    Ok(ExitCode::SUCCESS)
}

/// The exit of a command nobody registered.
fn nobody(command: &str) -> ExitCode {
    eprintln!("daqflow: command `{command}` was delivered to no process (nobody registered it)");
    ExitCode::from(1)
}

/// The component verb of a command `NAME/VERB` or `all/VERB` (the component protocol,
/// docs/operator-guide.md), if it is one.
fn component_verb(command: &str) -> Option<Verb> {
    let (target, verb) = command.rsplit_once('/')?;
    if target.is_empty() || target.contains('/') {
        return None;
    }
    Verb::parse(verb)
}

/// Sends a component command as a request that asks for replies, and reports each component's:
/// exit status 0 only when every process the command reached did it.
fn send_to_components(
    dialog: &Dialog,
    command: &str,
    verb: Verb,
    payload: &str,
    timeout: Duration,
) -> anyhow::Result<ExitCode> {
    let mut request = Request::decode(verb, payload.as_bytes()).map_err(|e| {
        anyhow::anyhow!(
            "`{command}`: {e}. A component command's payload is empty, a number (the run for start, the last \
             event for stop) or the request's JSON (docs/operator-guide.md, \"The component protocol\"); \
             --raw sends it as it is"
        )
    })?;
    if let Some(to) = &request.reply_to {
        // The request names where its replies go: they are not ours to wait for.
        let n = dialog
            .send_command(command, payload.as_bytes())
            .map_err(|e| with_problem(dialog, &format!("sending `{command}`"), e))?;
        if n == 0 {
            return Ok(nobody(command));
        }
        out_line(&format!("delivered to {n} process(es); their replies go to `{to}`"));
        return Ok(ExitCode::SUCCESS);
    }
    let me = dialog.client().name().to_owned();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    // Registered before the command is sent, on the same connection: the control server takes
    // it before it forwards the command (docs/dialog.md, "When a command registration takes
    // effect"), so no reply can miss it.
    let _replies = dialog.register_command(&format!("{me}/reply"), move |c| {
        let _ = tx.send(c.data.to_vec());
    })?;
    request.id = (u64::from(std::process::id()) << 20) | u64::from(std::time::UNIX_EPOCH.elapsed()?.subsec_micros());
    request.reply_to = Some(me.clone());
    let (_, body) = request.encode();
    let n =
        dialog.send_command(command, &body).map_err(|e| with_problem(dialog, &format!("sending `{command}`"), e))?;
    if n == 0 {
        return Ok(nobody(command));
    }
    let deadline = std::time::Instant::now() + timeout;
    let mut replies: Vec<CommandReply> = Vec::new();
    while replies.len() < n as usize {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(data) = rx.recv_timeout(left) else { break };
        match serde_json::from_slice::<CommandReply>(&data) {
            Ok(reply) if reply.id == request.id => {
                out_line(&reply_line(&reply));
                replies.push(reply);
            }
            Ok(_) => {}
            Err(e) => eprintln!("daqflow: a reply that cannot be read ({e}): {}", printable(&data)),
        }
    }
    let done = replies.iter().filter(|r| matches!(r.outcome, Outcome::Ok(_))).count();
    let refused = replies.len() - done;
    let silent = n as usize - replies.len();
    let mut summary = format!("`{command}` reached {n} process(es): {done} did it, {refused} refused or failed");
    if silent > 0 {
        // Name them: the registrants of the command that sent no reply.
        let answered: std::collections::BTreeSet<&str> = replies.iter().map(|r| r.status.name.as_str()).collect();
        let names: Vec<String> = dialog
            .processes(Duration::from_secs(5))
            .map(|procs| {
                procs
                    .into_iter()
                    .filter(|p| p.name != me && p.commands.iter().any(|c| c == command))
                    .map(|p| p.name)
                    .filter(|name| !answered.contains(name.as_str()))
                    .collect()
            })
            .unwrap_or_default();
        let who = if names.is_empty() { String::new() } else { format!(" ({})", names.join(", ")) };
        summary.push_str(&format!(
            ", {silent} did not answer within {timeout:?}{who}: not a component, or busy (a longer --timeout waits more)"
        ));
    }
    if done == n as usize {
        out_line(&summary);
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("daqflow: {summary}");
        Ok(ExitCode::from(1))
    }
}

/// One component's reply as a line: `NAME: done, now STATE (ANSWER)`, `NAME: refused (STATE): WHY`
/// or `NAME: failed, now Error: WHY`.
fn reply_line(reply: &CommandReply) -> String {
    let s = &reply.status;
    match &reply.outcome {
        Outcome::Ok(answer) => {
            let what = match answer {
                Answer::Nothing => String::new(),
                Answer::Run(run) => format!(" (run {run})"),
                Answer::Info(info) => format!(" ({})", serde_json::to_string(info).unwrap_or_default()),
                Answer::Summary(stats) => format!(" ({} events)", stats.events),
            };
            format!("{}: done, now {}{what}", s.name, s.state.name())
        }
        Outcome::Error(why) if s.state == State::Error => format!("{}: failed, now Error: {why}", s.name),
        Outcome::Error(why) => format!("{}: refused ({}): {why}", s.name, s.state.name()),
    }
}

fn print_table(procs: &[daqflow_dialog::ProcessInfo]) {
    let header = ["NAME", "ADDRESS", "PORT", "PID", "PROVIDES", "SUBSCRIBES", "COMMANDS"];
    let rows: Vec<[String; 7]> = procs
        .iter()
        .map(|p| {
            [
                p.name.clone(),
                p.host.clone(),
                p.port.to_string(),
                p.pid.to_string(),
                p.provides.join(","),
                p.subscribes.join(","),
                p.commands.join(","),
            ]
        })
        .collect();
    // Padded by hand: a format width (`{c:<w$}`) panics beyond 65535, and names, services and
    // command lists of any length come from the control plane. Widths count characters.
    let width = |s: &str| s.chars().count();
    let widths: Vec<usize> =
        (0..7).map(|c| rows.iter().map(|r| width(&r[c])).chain([header[c].len()]).max().unwrap_or(0)).collect();
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, &w)| {
                let mut cell = c.clone();
                cell.extend(std::iter::repeat_n(' ', w.saturating_sub(width(c))));
                cell
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    out_line(line(&header.map(String::from)).trim_end());
    for r in &rows {
        out_line(line(r).trim_end());
    }
    if procs.is_empty() {
        out_line("(no processes)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3h").is_err());
    }
}
