//! Components of your own in the chain: DAQ-Middleware's component model, where users
//! "merely implement the component logic". A [`Logic`] declares named, typed input and output
//! ports ([`InPort`], [`OutPort`]) and says what to do with each chunk; [`kind`] makes it a
//! component kind that the system file connects and the same state machine drives as every
//! other: `configure` binds one listening address per input port and answers each (`${NAME.PORT}`
//! in the system file, and `${NAME.listen}` for the first), `start` connects every output port to
//! its `downstream.PORT`, and the run ends when every input's end marker has come.
//!
//! The streams follow the chain's protocol ([`crate::protocol`]): each output port sends the
//! begin marker (with its data type's tag), its chunks numbered 1, 2, 3, … with their CRC32C,
//! and one end marker counting them. Where streams **join** (several input ports), the end
//! markers are merged: the outputs' end markers go out once every input has ended, after
//! [`Logic::end`]. An input port with a data type refuses a stream of another type (an untyped
//! stream, such as the generator's, is taken); a stream **splits** by sending to several
//! outputs, each with its own end marker. Each input is received by a thread of its own and
//! handed to the logic, one chunk at a time, in the order of each input.
//!
//! The keys every such kind takes, besides its own (the [`PortConfig`]): `listen.PORT` (default
//! `127.0.0.1:0`) and `downstream.PORT` (required for every output port), `connect_timeout_ms`,
//! `stop_timeout_ms`, `send_queue_bytes`. The kind's own keys are the rest of the table.
//!
//! ```
//! use bytes::Bytes;
//! use daqflow_chain::ports::{InPort, Logic, OutPort, Outputs};
//!
//! /// Passes on the chunks whose first byte is even, counts the others.
//! struct EvenFilter { rejected: u64 }
//!
//! impl Logic for EvenFilter {
//!     fn inputs(&self) -> Vec<InPort> { vec![InPort::typed("raw", "adc")] }
//!     fn outputs(&self) -> Vec<OutPort> { vec![OutPort::typed("accepted", "adc")] }
//!     fn on_chunk(&mut self, _input: &str, data: Bytes, out: &mut Outputs) -> Result<(), String> {
//!         if data.first().is_some_and(|b| b % 2 == 0) { out.send("accepted", &data) } else { self.rejected += 1; Ok(()) }
//!     }
//! }
//! let kind = daqflow_chain::ports::kind("even_filter", "passes even chunks", |_name, _table| Ok(EvenFilter { rejected: 0 }));
//! assert_eq!(kind.name, "even_filter");
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use daqflow_transport::{Connection, Listener, RetryPolicy};
use serde::{Deserialize, Serialize};

use crate::link::{Cut, Live, Outlet, TICK, Tuning, abandon_thread, bind, end_thread_and, read, resolve, spawn};
use crate::protocol::{ChunkHeader, KIND_CHUNK, begin_frame_typed, data_type_tag, end_frame};
use daqflow_component::schema::{Key, Schema};
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

/// An input port: a name, and the type of data it takes (`None`: any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPort {
    /// Its name: the key of its `listen.NAME` and of its address in the configure answer.
    pub name: String,
    /// The data type it takes; a stream of another type is refused.
    pub data_type: Option<String>,
}

impl InPort {
    /// An input port that takes any stream.
    pub fn new(name: &str) -> InPort {
        InPort { name: name.into(), data_type: None }
    }
    /// An input port that takes streams of `data_type` (and untyped ones).
    pub fn typed(name: &str, data_type: &str) -> InPort {
        InPort { name: name.into(), data_type: Some(data_type.into()) }
    }
}

/// An output port: a name, and the type of data it sends (`None`: untyped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutPort {
    /// Its name: the key of its `downstream.NAME`.
    pub name: String,
    /// The data type it sends, in its begin marker.
    pub data_type: Option<String>,
}

impl OutPort {
    /// An untyped output port.
    pub fn new(name: &str) -> OutPort {
        OutPort { name: name.into(), data_type: None }
    }
    /// An output port sending data of `data_type`.
    pub fn typed(name: &str, data_type: &str) -> OutPort {
        OutPort { name: name.into(), data_type: Some(data_type.into()) }
    }
}

/// The logic of a component of your own: its ports, and what it does with each chunk.
pub trait Logic: Send + 'static {
    /// Its input ports (at least one).
    fn inputs(&self) -> Vec<InPort>;
    /// Its output ports (none for a component that ends the chain).
    fn outputs(&self) -> Vec<OutPort>;
    /// A run begins (before any chunk).
    fn begin(&mut self, _run: u32) -> Result<(), String> {
        Ok(())
    }
    /// A chunk arrived on input port `input`; `out` sends chunks on the output ports. An error
    /// fails the component with its text.
    fn on_chunk(&mut self, input: &str, data: Bytes, out: &mut Outputs) -> Result<(), String>;
    /// Every input has ended (their end markers are merged here); the outputs' end markers go
    /// out after it.
    fn end(&mut self, _out: &mut Outputs) -> Result<(), String> {
        Ok(())
    }
    /// Figures of its own for its statistics' `detail.logic`.
    fn detail(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// Why the logic failed outside a call (a thread of its own), if it did: the component is
    /// then in Error with this text. Asked between chunks.
    fn failure(&self) -> Option<String> {
        None
    }
}

/// The port keys every component of [`kind`] takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PortConfig {
    /// Address of each input port (default `127.0.0.1:0`: a free port, which `configure` gives).
    pub listen: BTreeMap<String, String>,
    /// Address of the component each output port feeds, `HOST:PORT`; required for every output.
    pub downstream: BTreeMap<String, String>,
    /// How long (ms) `start` retries connecting each output.
    pub connect_timeout_ms: u64,
    /// How long (ms) `stop` waits for every input's end marker (and the outputs to drain).
    pub stop_timeout_ms: u64,
    /// Most bytes waiting for each output; beyond, the logic waits (nothing is dropped).
    pub send_queue_bytes: usize,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            listen: BTreeMap::new(),
            downstream: BTreeMap::new(),
            connect_timeout_ms: 10_000,
            stop_timeout_ms: 10_000,
            send_queue_bytes: crate::DEFAULT_SEND_QUEUE_BYTES,
        }
    }
}

const PORT_KEYS: [&str; 5] = ["listen", "downstream", "connect_timeout_ms", "stop_timeout_ms", "send_queue_bytes"];

impl PortConfig {
    /// Splits a component's table into the port keys and the rest (the logic's own keys).
    pub fn split(name: &str, mut table: toml::Table) -> Result<(PortConfig, toml::Table), ComponentError> {
        let mut ports = toml::Table::new();
        for k in PORT_KEYS {
            if let Some(v) = table.remove(k) {
                ports.insert(k.into(), v);
            }
        }
        let config: PortConfig = ports.try_into().map_err(|e| ComponentError::Config(format!("{name}: {e}")))?;
        Ok((config, table))
    }

    /// Checks the ports of `logic` against the configuration: every output has its downstream,
    /// no address names a port the logic lacks.
    fn check(&self, name: &str, inputs: &[InPort], outputs: &[OutPort]) -> Result<(), ComponentError> {
        let mut c = daqflow_component::checks::Checks::new(name);
        if inputs.is_empty() {
            c.problem("listen", "the component declares no input port");
        }
        for o in outputs {
            match self.downstream.get(&o.name) {
                None => c.problem(&format!("downstream.{}", o.name), "is required (HOST:PORT)"),
                Some(a) => c.address(&format!("downstream.{}", o.name), a),
            }
        }
        for (k, a) in &self.listen {
            if !inputs.iter().any(|i| &i.name == k) {
                let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
                c.problem(&format!("listen.{k}"), format!("names no input port (its inputs: {})", names.join(", ")));
            }
            c.address(&format!("listen.{k}"), a);
        }
        for k in self.downstream.keys() {
            if !outputs.iter().any(|o| &o.name == k) {
                let names: Vec<&str> = outputs.iter().map(|o| o.name.as_str()).collect();
                c.problem(
                    &format!("downstream.{k}"),
                    format!("names no output port (its outputs: {})", names.join(", ")),
                );
            }
        }
        c.finish()
    }

    fn tuning(&self) -> Tuning {
        Tuning {
            send_queue_bytes: self.send_queue_bytes,
            recv_chunk_bytes: crate::DEFAULT_RECV_CHUNK_BYTES,
            socket_buffer_bytes: None,
        }
    }
}

/// A component kind `name` running the logic `make` builds from its own keys (the table less
/// the [`PortConfig`] keys); outside the event accounting, with the repeater's stages (after
/// its outputs' components on start, before them on stop).
pub fn kind<L: Logic>(
    name: &'static str,
    about: &'static str,
    make: impl Fn(&str, toml::Table) -> Result<L, ComponentError> + Send + Sync + 'static,
) -> Kind {
    Kind::new(name, about, Role::Other, move |component, table| {
        let (ports, own) = PortConfig::split(component, table)?;
        let logic = make(component, own)?;
        ports.check(component, &logic.inputs(), &logic.outputs())?;
        Ok(Box::new(PortComponent::new(component, ports, logic)) as Box<dyn Component>)
    })
    .stages(3, 4)
}

/// The whole `main` of a component program of your own: logs to standard error (and the
/// `NAME/log` service), reads `--name NAME --control ADDR --set KEY=VALUE …` and runs the
/// component of `registry` (the run loop of `daqflow_component::process`, which takes the
/// system token from `DAQFLOW_TOKEN_FILE` or `DAQFLOW_TOKEN`, as the operator gives it). Returns the exit
/// status: 0, 1 if the component failed, 2 if it could not run.
pub fn run_process(program: &str, registry: daqflow_component::Registry) -> i32 {
    daqflow_component::log::init("info");
    let options = daqflow_component::process::Options::from_args(program, std::env::args().skip(1));
    match options.and_then(|o| daqflow_component::process::run(registry, o)) {
        Ok(failed) => i32::from(failed),
        Err(e) => {
            eprintln!("{program}: {e}");
            2
        }
    }
}

/// Sends chunks on a component's output ports (given to [`Logic::on_chunk`] and [`Logic::end`]).
pub struct Outputs {
    ports: Vec<(OutPort, Outlet)>,
    counters: Arc<Vec<PortCounters>>,
    live: Arc<Live>,
    sent: Vec<(u64, u64)>,
}

impl Outputs {
    /// Sends `data` as the next chunk on output port `port`; waits while its queue is full
    /// (nothing is dropped). An error names the port.
    pub fn send(&mut self, port: &str, data: &[u8]) -> Result<(), String> {
        let i =
            self.ports.iter().position(|(p, _)| p.name == port).ok_or_else(|| format!("no output port `{port}`"))?;
        let (sequence, bytes) = &mut self.sent[i];
        let header = ChunkHeader::for_data(*sequence + 1, data, true);
        let outlet = &mut self.ports[i].1;
        let failed = |c: Cut| match c {
            Cut::Abandoned => format!("output `{port}`: stopped while waiting for room"),
            Cut::Failed(e) => format!("output `{port}`: {e}"),
        };
        outlet.wait_room(crate::protocol::CHUNK_HEADER_LEN + data.len(), &self.live.abandon).map_err(failed)?;
        outlet
            .send_prefixed(KIND_CHUNK, crate::protocol::FLAG_CRC, &header.encode(), Bytes::copy_from_slice(data))
            .map_err(failed)?;
        *sequence += 1;
        *bytes += data.len() as u64;
        self.counters[i].chunks.store(*sequence, Ordering::Relaxed);
        self.counters[i].bytes.store(*bytes, Ordering::Relaxed);
        outlet.push().map_err(failed)?;
        Ok(())
    }

    /// The names of the output ports.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.ports.iter().map(|(p, _)| p.name.as_str())
    }

    /// Outputs with no port: what a binding to another language leaves in the logic's place
    /// while it lends the real ones to a call (`std::mem::replace`); a send on it fails,
    /// naming the port.
    pub fn placeholder() -> Outputs {
        Outputs { ports: Vec::new(), counters: Arc::new(Vec::new()), live: Live::new(), sent: Vec::new() }
    }
}

/// A schema of a component of your own with these ports: `own` (its kind's own keys) with the
/// port keys every such kind takes (`listen.PORT` for each input, `downstream.PORT`, required,
/// for each output, `connect_timeout_ms`, `stop_timeout_ms`, `send_queue_bytes`), and what
/// `configure` answers (`listen` and each input's name: addresses), so that `daqflow run
/// --check` checks every key and `${NAME.PORT}`.
pub fn port_schema(own: Schema, inputs: &[InPort], outputs: &[OutPort]) -> Schema {
    let d = PortConfig::default();
    let typed = |t: &Option<String>| t.as_deref().map(|t| format!(" (data type `{t}`)")).unwrap_or_default();
    let mut schema = own;
    for p in inputs {
        schema = schema.key(Key::address(
            &format!("listen.{}", p.name),
            &format!(
                "The address input `{}`{} listens on; default 127.0.0.1:0, a free port (configure gives it as \
                 `${{NAME.{}}}`).",
                p.name,
                typed(&p.data_type),
                p.name
            ),
        ));
    }
    for p in outputs {
        schema = schema.key(
            Key::address(
                &format!("downstream.{}", p.name),
                &format!(
                    "The address of the component output `{}`{} feeds; connected at `start`.",
                    p.name,
                    typed(&p.data_type)
                ),
            )
            .required(),
        );
    }
    schema = schema
        .key(
            Key::integer("connect_timeout_ms", 1, 86_400_000, "How long `start` retries connecting each output.")
                .unit("ms")
                .default_value(d.connect_timeout_ms as i64),
        )
        .key(
            Key::integer("stop_timeout_ms", 1, 86_400_000, "How long `stop` waits for every input's end marker.")
                .unit("ms")
                .default_value(d.stop_timeout_ms as i64),
        )
        .key(
            Key::integer(
                "send_queue_bytes",
                4096,
                1 << 34,
                "Most bytes waiting for each output; beyond, the logic waits.",
            )
            .unit("bytes")
            .default_value(d.send_queue_bytes as i64),
        )
        .output(Key::address("listen", "The address of its first input."));
    for p in inputs {
        schema = schema.output(Key::address(&p.name, &format!("The address of its input `{}`.", p.name)));
    }
    schema
}

#[derive(Default)]
struct PortCounters {
    chunks: AtomicU64,
    bytes: AtomicU64,
}

/// What a port of a [`PortComponent`] did (an element of [`PortsDetail`]'s lists).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PortDetail {
    /// The port's name.
    pub name: String,
    /// Its address: the bound one of an input, the downstream of an output.
    pub address: Option<String>,
    /// Chunks received (input) or sent (output).
    pub chunks: u64,
    /// Their data bytes.
    pub bytes: u64,
    /// Whether the end marker came (input) or was sent (output).
    pub end: bool,
}

/// The figures of a component of your own, the `detail` of its [`Stats`]; its `events` are
/// the chunks received on all inputs, its `bytes` theirs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PortsDetail {
    /// Each input port.
    pub inputs: Vec<PortDetail>,
    /// Each output port.
    pub outputs: Vec<PortDetail>,
    /// What the logic reports ([`Logic::detail`]).
    pub logic: serde_json::Value,
    /// Why the run failed, if it did.
    pub error: Option<String>,
}

/// A [`Logic`] as a component (what [`kind`] makes).
pub struct PortComponent<L: Logic> {
    name: String,
    config: PortConfig,
    inputs: Vec<InPort>,
    outputs: Vec<OutPort>,
    logic: Arc<Mutex<L>>,
    listeners: Vec<Arc<Listener>>,
    /// The component's own flags and failure; one `Live` per input for its counters.
    live: Arc<Live>,
    input_live: Vec<Arc<Live>>,
    output_counters: Arc<Vec<PortCounters>>,
    ended: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl<L: Logic> PortComponent<L> {
    /// A component named `name` running `logic`.
    pub fn new(name: &str, config: PortConfig, logic: L) -> PortComponent<L> {
        let (inputs, outputs) = (logic.inputs(), logic.outputs());
        PortComponent {
            name: name.into(),
            config,
            inputs,
            outputs,
            logic: Arc::new(Mutex::new(logic)),
            listeners: Vec::new(),
            live: Live::new(),
            input_live: Vec::new(),
            output_counters: Arc::new(Vec::new()),
            ended: Arc::new(AtomicU64::new(0)),
            thread: None,
        }
    }

    fn report(&self, summary: bool) -> Stats {
        let (mut chunks, mut bytes) = (0, 0);
        let inputs: Vec<PortDetail> = self
            .inputs
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let live = self.input_live.get(i);
                let c = live.map_or(0, |l| l.chunks.load(Ordering::Relaxed));
                let b = live.map_or(0, |l| l.bytes.load(Ordering::Relaxed));
                chunks += c;
                bytes += b;
                PortDetail {
                    name: p.name.clone(),
                    address: self.listeners.get(i).map(|l| l.local_addr().to_string()),
                    chunks: c,
                    bytes: b,
                    end: live.is_some_and(|l| read(&l.end).is_some()),
                }
            })
            .collect();
        let outputs = self
            .outputs
            .iter()
            .enumerate()
            .map(|(i, p)| PortDetail {
                name: p.name.clone(),
                address: self.config.downstream.get(&p.name).cloned(),
                chunks: self.output_counters.get(i).map_or(0, |c| c.chunks.load(Ordering::Relaxed)),
                bytes: self.output_counters.get(i).map_or(0, |c| c.bytes.load(Ordering::Relaxed)),
                end: self.ended.load(Ordering::Relaxed) == 1,
            })
            .collect();
        let logic = self.logic.try_lock().map(|l| l.detail()).unwrap_or(serde_json::Value::Null);
        let error = self.failure();
        let _ = summary;
        Stats::counted(chunks, bytes).with_detail(&PortsDetail { inputs, outputs, logic, error })
    }
}

/// What an input's thread hands to the logic thread.
enum FromInput {
    Chunk(usize, Bytes),
    /// The input's stream ended (its end marker came), or failed (its `Live` says why).
    Ended(usize),
}

impl<L: Logic> Component for PortComponent<L> {
    /// Binds every input port; answers `{"PORT": ADDR, …, "listen": ADDR of the first}`.
    fn configure(&mut self) -> Result<Info, ComponentError> {
        self.config.check(&self.name, &self.inputs, &self.outputs)?;
        let mut answer = Info::new();
        self.listeners.clear();
        for p in &self.inputs {
            let listen = self.config.listen.get(&p.name).map_or("127.0.0.1:0", String::as_str);
            let (listener, a) = bind(&self.name, listen, None, self.config.tuning())?;
            let addr = a.get("listen").cloned().unwrap_or_default();
            if answer.is_empty() {
                answer.insert("listen".into(), addr.clone());
            }
            answer.insert(p.name.clone(), addr);
            self.listeners.push(listener);
        }
        Ok(answer)
    }

    fn start(&mut self, run: u32) -> Result<(), ComponentError> {
        if self.listeners.len() != self.inputs.len() {
            return Err(ComponentError::Failed("not configured".into()));
        }
        let policy = RetryPolicy::for_duration(Duration::from_millis(self.config.connect_timeout_ms));
        let mut ports = Vec::new();
        for p in &self.outputs {
            let key = format!("downstream.{}", p.name);
            let addr = resolve(&self.name, &key, self.config.downstream.get(&p.name).map_or("", String::as_str))?;
            let conn = Connection::connect_with_retry(&[addr], &self.config.tuning().options(), &policy)
                .map_err(|e| ComponentError::Failed(format!("{}: output `{}`: {e}", self.name, p.name)))?;
            ports.push((p.clone(), Outlet::new(conn, self.config.send_queue_bytes)));
        }
        self.live = Live::new();
        self.input_live = self.inputs.iter().map(|_| Live::new()).collect();
        self.output_counters = Arc::new(self.outputs.iter().map(|_| PortCounters::default()).collect());
        self.ended = Arc::new(AtomicU64::new(0));
        let (tx, rx) = sync_channel::<FromInput>(1024);
        let mut threads = Vec::new();
        for (i, p) in self.inputs.iter().enumerate() {
            let (tx, listener, live, name) = (
                tx.clone(),
                self.listeners[i].clone(),
                self.input_live[i].clone(),
                format!("{}.{}", self.name, p.name),
            );
            let data_type = p.data_type.clone();
            threads.push(spawn(&self.name, &format!("in-{}", p.name), move || {
                receive(i, &name, run, data_type.as_deref(), &listener, &live, &tx)
            })?);
        }
        let mut out = Outputs {
            ports,
            counters: self.output_counters.clone(),
            live: self.live.clone(),
            sent: vec![(0, 0); self.outputs.len()],
        };
        let (name, live, inputs_live, logic, ended) =
            (self.name.clone(), self.live.clone(), self.input_live.clone(), self.logic.clone(), self.ended.clone());
        let names: Vec<String> = self.inputs.iter().map(|p| p.name.clone()).collect();
        self.thread = Some(spawn(&self.name, "logic", move || {
            let result = drive(run, &names, &rx, &mut out, &live, &inputs_live, &logic);
            // Failed: said at once, and the inputs end (a thread waiting for room in the
            // channel gets an error once it is dropped), before they are joined.
            if let Err(e) = &result {
                live.fail(&name, e.clone());
                for l in &inputs_live {
                    l.abandon.store(true, Ordering::SeqCst);
                }
            }
            drop(rx);
            for t in threads {
                let _ = t.join();
            }
            if result.is_ok() {
                ended.store(1, Ordering::Relaxed);
            }
        })?);
        Ok(())
    }

    /// Waits (at most `stop_timeout_ms`) for every input's end marker and the outputs' end
    /// markers to be written; the summary's detail is a [`PortsDetail`].
    fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> {
        if let Some(thread) = self.thread.take() {
            let patience = Duration::from_millis(self.config.stop_timeout_ms);
            let abandon_inputs = {
                let inputs = self.input_live.clone();
                move || inputs.iter().for_each(|l| l.abandon.store(true, Ordering::SeqCst))
            };
            // The inputs are abandoned with the logic once the patience is over: the logic
            // thread joins them.
            let r = end_thread_and(&self.name, thread, &self.live, patience, abandon_inputs);
            r?;
        }
        Ok(self.report(true))
    }

    fn reset(&mut self) -> Result<(), ComponentError> {
        for l in &self.input_live {
            l.quiet.store(true, Ordering::SeqCst);
            l.abandon.store(true, Ordering::SeqCst);
        }
        abandon_thread(self.thread.take(), &self.live);
        self.listeners.clear();
        Ok(())
    }

    fn stats(&self) -> Stats {
        self.report(false)
    }

    fn failure(&self) -> Option<String> {
        self.live
            .failure()
            .or_else(|| self.input_live.iter().find_map(|l| l.failure()))
            .or_else(|| self.logic.try_lock().ok().and_then(|l| l.failure()))
    }
}

impl<L: Logic> Drop for PortComponent<L> {
    fn drop(&mut self) {
        let _ = self.reset();
    }
}

/// An input's thread: its stream's chunks to the logic thread, then `Ended`.
fn receive(
    i: usize,
    name: &str,
    run: u32,
    data_type: Option<&str>,
    listener: &Listener,
    live: &Live,
    tx: &SyncSender<FromInput>,
) {
    crate::receiver::receive_chunks(name, run, true, data_type, listener, live, |_, data| {
        tx.send(FromInput::Chunk(i, data)).map_err(|_| "the component's logic has ended".to_owned())
    });
    let _ = tx.send(FromInput::Ended(i));
}

/// The logic thread: begin markers out, every chunk to the logic, and once every input has
/// ended, [`Logic::end`] and the end markers out.
fn drive<L: Logic>(
    run: u32,
    names: &[String],
    rx: &Receiver<FromInput>,
    out: &mut Outputs,
    live: &Live,
    inputs: &[Arc<Live>],
    logic: &Mutex<L>,
) -> Result<(), String> {
    let lock = || logic.lock().unwrap_or_else(|p| p.into_inner());
    lock().begin(run)?;
    for (p, outlet) in &mut out.ports {
        let tag = p.data_type.as_deref().map_or(0, data_type_tag);
        outlet
            .send(begin_frame_typed(run, tag))
            .map_err(|_| format!("output `{}`: sending the begin marker", p.name))?;
    }
    let mut open = names.len();
    while open > 0 {
        if live.abandon.load(Ordering::Relaxed) {
            return Err(format!("stopped before every input ended ({open} of {} still open)", names.len()));
        }
        match rx.recv_timeout(TICK) {
            Ok(FromInput::Chunk(i, data)) => lock().on_chunk(&names[i], data, out)?,
            Ok(FromInput::Ended(i)) => {
                if let Some(e) = inputs[i].failure() {
                    return Err(format!("input `{}`: {e}", names[i]));
                }
                open -= 1;
            }
            Err(RecvTimeoutError::Timeout) => {
                for (_, o) in &mut out.ports {
                    let _ = o.push();
                }
            }
            Err(RecvTimeoutError::Disconnected) => return Err("every input thread ended".into()),
        }
    }
    lock().end(out)?;
    for (i, (p, outlet)) in out.ports.iter_mut().enumerate() {
        let (sequence, bytes) = out.sent[i];
        let failed = |c: Cut| match c {
            Cut::Abandoned => format!("output `{}`: stopped before its end marker was written", p.name),
            Cut::Failed(e) => format!("output `{}`: {e}", p.name),
        };
        outlet.wait_room(crate::protocol::END_LEN, &live.abandon).map_err(failed)?;
        outlet.send(end_frame(sequence, bytes)).map_err(failed)?;
        outlet.finish(&live.abandon).map_err(failed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::{Generator, GeneratorConfig};
    use crate::sink::{Sink, SinkConfig, SinkDetail};

    /// Two inputs joined into one output, chunks tagged with the input they came from.
    struct Merge {
        seen: BTreeMap<String, u64>,
    }

    impl Logic for Merge {
        fn inputs(&self) -> Vec<InPort> {
            vec![InPort::new("left"), InPort::typed("right", "adc")]
        }
        fn outputs(&self) -> Vec<OutPort> {
            vec![OutPort::typed("merged", "adc")]
        }
        fn on_chunk(&mut self, input: &str, data: Bytes, out: &mut Outputs) -> Result<(), String> {
            *self.seen.entry(input.to_owned()).or_default() += 1;
            out.send("merged", &data)
        }
        fn detail(&self) -> serde_json::Value {
            serde_json::json!(self.seen)
        }
    }

    fn generator(downstream: &str) -> Generator {
        let config =
            GeneratorConfig { downstream: downstream.into(), chunk_bytes: 100, rate_hz: 2000.0, ..Default::default() };
        let mut g = Generator::new("gen", config);
        g.configure().unwrap();
        g.start(1).unwrap();
        g
    }

    #[test]
    fn two_inputs_join_into_one_stream_with_one_end_marker() {
        let mut sink = Sink::new("sink", SinkConfig::default());
        let to_sink = sink.configure().unwrap()["listen"].as_str().unwrap().to_owned();
        sink.start(1).unwrap();
        let table: toml::Table = format!("downstream.merged = '{to_sink}'").parse().unwrap();
        let kind = kind("merge", "joins two streams", |_, _| Ok(Merge { seen: BTreeMap::new() }));
        let mut c = (kind.factory)("merge-1", table).unwrap();
        let answer = c.configure().unwrap();
        let (left, right) = (answer["left"].as_str().unwrap().to_owned(), answer["right"].as_str().unwrap().to_owned());
        assert_eq!(answer["listen"], answer["left"]);
        c.start(1).unwrap();
        assert_eq!(generator(&left).stop(Some(100)).unwrap().events, 100);
        std::thread::sleep(Duration::from_millis(100));
        assert!(c.stats().detail["outputs"][0]["end"] == false, "one input still open: no end marker yet");
        assert_eq!(generator(&right).stop(Some(50)).unwrap().events, 50);
        let summary = c.stop(None).unwrap();
        let d: PortsDetail = summary.detail_as().unwrap();
        assert!(d.error.is_none(), "{d:?}");
        assert_eq!((summary.events, d.outputs[0].chunks, d.outputs[0].end), (150, 150, true), "{d:?}");
        assert_eq!(d.logic, serde_json::json!({"left": 100, "right": 50}));
        let s = sink.stop(None).unwrap();
        let sd: SinkDetail = s.detail_as().unwrap();
        assert!(sd.end_seen && sd.error.is_none(), "{sd:?}");
        assert_eq!((s.events, sd.chunks_announced, sd.sequence_errors, sd.crc_errors), (150, Some(150), 0, 0));
    }

    #[test]
    fn an_input_refuses_a_stream_of_another_type() {
        struct Picky;
        impl Logic for Picky {
            fn inputs(&self) -> Vec<InPort> {
                vec![InPort::typed("in", "tdc")]
            }
            fn outputs(&self) -> Vec<OutPort> {
                Vec::new()
            }
            fn on_chunk(&mut self, _: &str, _: Bytes, _: &mut Outputs) -> Result<(), String> {
                Ok(())
            }
        }
        let mut c = PortComponent::new("picky", PortConfig::default(), Picky);
        let listen: std::net::SocketAddr = c.configure().unwrap()["in"].as_str().unwrap().parse().unwrap();
        c.start(1).unwrap();
        let opts = daqflow_transport::ConnectionOptions::for_protocol(crate::protocol::PROTOCOL);
        let mut up = Connection::connect(listen, &opts).unwrap();
        up.send(begin_frame_typed(1, data_type_tag("adc"))).unwrap();
        up.flush().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while c.failure().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let f = c.failure().expect("refused");
        assert!(f.contains(&format!("this input takes `tdc` (tag {:#010x})", data_type_tag("tdc"))), "{f}");
    }

    #[test]
    fn a_logic_that_fails_while_its_upstream_keeps_sending_ends_at_once_and_stop_says_why() {
        struct Fails;
        impl Logic for Fails {
            fn inputs(&self) -> Vec<InPort> {
                vec![InPort::new("in")]
            }
            fn outputs(&self) -> Vec<OutPort> {
                Vec::new()
            }
            fn on_chunk(&mut self, _: &str, _: Bytes, _: &mut Outputs) -> Result<(), String> {
                Err("no calibration".into())
            }
        }
        let config = PortConfig { stop_timeout_ms: 60_000, ..PortConfig::default() };
        let mut c = PortComponent::new("fails", config, Fails);
        let listen = c.configure().unwrap()["in"].as_str().unwrap().to_owned();
        c.start(1).unwrap();
        // Fast enough to fill the channel to the logic (1024 chunks) many times over.
        let mut g = Generator::new(
            "gen",
            GeneratorConfig { downstream: listen, chunk_bytes: 64, rate_hz: 1e6, ..Default::default() },
        );
        g.configure().unwrap();
        g.start(1).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while c.failure().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(c.failure().is_some_and(|f| f.contains("no calibration")), "{:?}", c.failure());
        std::thread::sleep(Duration::from_millis(300));
        // Its stop does not wait for the 60 s patience: the logic thread has ended.
        let t = std::time::Instant::now();
        let summary = c.stop(None).unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "stop took {:?}", t.elapsed());
        let d: PortsDetail = summary.detail_as().unwrap();
        assert!(d.error.is_some_and(|e| e.contains("no calibration")));
        let _ = g.stop(Some(1));
    }

    #[test]
    fn a_port_schema_has_the_port_keys_and_checks_them() {
        let own = Schema::new("cut").key(Key::integer("threshold", 0, 65535, "The cut."));
        let schema = port_schema(own, &[InPort::typed("raw", "adc")], &[OutPort::new("accepted")]);
        let table: toml::Table =
            "threshold = 3\ndownstream.accepted = '127.0.0.1:7000'\nlisten.raw = '127.0.0.1:0'".parse().unwrap();
        assert!(schema.check(&table).is_empty(), "{:?}", schema.check(&table));
        let bad: toml::Table = "threshold = 70000\ndownstream.acepted = '127.0.0.1:7000'".parse().unwrap();
        let problems = schema.check(&bad).join("\n");
        assert!(problems.contains("threshold"), "{problems}");
        assert!(problems.contains("downstream.accepted"), "{problems}");
        assert!(schema.output_named("raw").is_some() && schema.output_named("listen").is_some());
    }

    #[test]
    fn the_ports_keys_are_checked_against_the_logic_s_ports() {
        let kind = kind("merge", "joins", |_, _| Ok(Merge { seen: BTreeMap::new() }));
        let table: toml::Table = "listen.middle = '127.0.0.1:0'\ndownstream.merge = '127.0.0.1:1'".parse().unwrap();
        let e = (kind.factory)("m", table).err().unwrap().to_string();
        assert!(e.contains("`downstream.merged` is required"), "{e}");
        assert!(e.contains("`listen.middle` names no input port (its inputs: left, right)"), "{e}");
        assert!(e.contains("`downstream.merge` names no output port (its outputs: merged)"), "{e}");
    }
}
