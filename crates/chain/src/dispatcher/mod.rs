//! The dispatcher: one input, several outputs (DAQ-Middleware's "dispatcher", which hands
//! the gatherer's data to a logger and a monitor). `configure` binds `listen`; `start`
//! connects to every output and accepts the upstream; each chunk then goes to every output
//! (`policy = "copy"`) or to one output in turn (`policy = "round_robin"`).
//!
//! Each output is declared **blocking** or **sampling**. A blocking output (a logger) loses
//! nothing: when its queue is full the dispatcher stops reading its input, and back-pressure
//! travels up the chain. A sampling output (a monitor) never holds the input up: when its
//! queue (`queue_bytes`, 256 KiB by default; its socket's send buffer too) is full, the chunk is dropped for that output and
//! counted. A sampling output whose connection breaks is given up for the rest of the run
//! (its chunks counted as dropped, the reason in its detail); a blocking one that breaks fails
//! the dispatcher.
//!
//! Every output receives a stream of its own that a sink or a logger checks like any other:
//! the begin marker, the chunks it was given numbered 1, 2, 3, … (the header's sequence number
//! is rewritten, the data and its CRC go on as they came, without a copy), and an end marker
//! that counts what that output was given. The input's end marker is so copied to every
//! output; it ends the dispatcher's run. The stop summary accounts for every chunk received:
//! with `copy`, for each output, passed + dropped = received; with `round_robin`, the sum over
//! the outputs of passed + dropped = received.
//!
//! ```no_run
//! use daqflow_chain::dispatcher::{Dispatcher, DispatcherConfig, DispatcherDetail, Mode, OutputConfig};
//! use daqflow_component::Component;
//! let outputs = vec![
//!     OutputConfig { downstream: "127.0.0.1:7302".into(), mode: Mode::Blocking, queue_bytes: None },
//!     OutputConfig { downstream: "127.0.0.1:7303".into(), mode: Mode::Sampling, queue_bytes: None },
//! ];
//! let mut d = Dispatcher::new("dispatch", DispatcherConfig { outputs, ..Default::default() });
//! let listen = d.configure()?["listen"].as_str().unwrap().to_owned(); // the upstream connects here
//! d.start(1)?;
//! // … the generator runs and stops …
//! let summary = d.stop(None)?; // waits for the end marker to reach every output
//! let detail: DispatcherDetail = summary.detail_as().unwrap();
//! assert_eq!(detail.outputs[0].dropped, 0); // the blocking output lost nothing
//! # let _ = listen;
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```

mod config;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use daqflow_transport::{Connection, Listener, RecvError, RetryPolicy};
use daqflow_wire::frame::Frame;
use serde::{Deserialize, Serialize};

pub use self::config::{
    DEFAULT_SAMPLING_QUEUE_BYTES, DispatcherConfig, MAX_OUTPUTS, Mode, OutputConfig, Policy, schema,
};
use super::link::{
    BATCH, Cut, Live, Outlet, TICK, Work, Worker, accept, bind, read, resolve, wait_any, worker_component,
};
use super::protocol::{CHUNK_HEADER_LEN, ChunkHeader, KIND_CHUNK, Message, StreamCheck, StreamEvent, end_frame};
use crate::repeater::Broken;
use daqflow_component::{Component, ComponentError, Info, Kind, Role, Stats};

/// The dispatcher component (its hooks are the chain's one worker's: the thread, the stop, the
/// report).
pub struct Dispatcher(Worker<Dispatching>);

/// What one output was given, published by the dispatching thread.
#[derive(Default)]
struct OutputCounters {
    passed: AtomicU64,
    bytes: AtomicU64,
    dropped: AtomicU64,
    dropped_bytes: AtomicU64,
    broken: std::sync::Mutex<Option<String>>,
}

/// What one output of a dispatcher was given (an element of [`DispatcherDetail::outputs`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OutputDetail {
    /// The output's address.
    pub downstream: String,
    /// Blocking or sampling.
    pub mode: Mode,
    /// Chunks passed to it.
    pub passed: u64,
    /// Their data bytes.
    pub bytes: u64,
    /// Chunks meant for it and dropped because its queue was full (sampling outputs only).
    pub dropped: u64,
    /// Their data bytes.
    pub dropped_bytes: u64,
    /// Why a sampling output was given up during the run, if it was.
    pub broken: Option<String>,
}

/// The dispatcher's own figures, the `detail` of its [`Stats`]; its `events` are the chunks
/// received from its input, its `bytes` their data bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DispatcherDetail {
    /// The address it listens on (after configure).
    pub listen: Option<String>,
    /// The upstream's address, once it connected.
    pub upstream: Option<String>,
    /// Copy or round robin.
    pub policy: Policy,
    /// Seconds from the first chunk received to the latest.
    pub seconds: f64,
    /// Chunks received per second over `seconds`.
    pub mean_events_per_s: f64,
    /// Megabytes (10⁶ bytes) received per second over `seconds`.
    pub mean_mb_per_s: f64,
    /// Each output's figures, in the order of `outputs`.
    pub outputs: Vec<OutputDetail>,
    /// Chunks passed, summed over the outputs.
    pub passed: u64,
    /// Chunks dropped, summed over the (sampling) outputs.
    pub dropped: u64,
    /// Input chunks whose sequence number was not the one expected.
    pub sequence_errors: u64,
    /// Chunks the input's end marker announced, once it came.
    pub chunks_announced: Option<u64>,
    /// Chunks announced by the input's end marker that did not arrive.
    pub missing: u64,
    /// Whether the end marker came (and was passed to every output).
    pub end_seen: bool,
    /// Why the run failed or was cut, if it was.
    pub error: Option<String>,
}

/// Builds a dispatcher named `name` from its configuration table (the registry's entry for
/// the `dispatcher` kind): the keys are checked, every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, ComponentError> {
    let c: DispatcherConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    Ok(Box::new(Dispatcher::new(name, c)))
}

/// The `dispatcher` kind: outside the event accounting; it starts after its outputs and
/// before its upstream, and stops after its upstream and before its outputs (the repeater's
/// stages).
pub fn kind() -> Kind {
    Kind::new(
        "dispatcher",
        "passes a chain's chunks from one input to several outputs: copied to all or round robin, each output blocking or sampling",
        Role::Other,
        factory,
    )
    .stages(3, 4)
    .schema(config::schema())
}

impl Dispatcher {
    /// A dispatcher named `name`.
    pub fn new(name: &str, config: DispatcherConfig) -> Dispatcher {
        Dispatcher(Worker::new(name, Dispatching { config, listener: None, outputs: Arc::new(Vec::new()) }))
    }
}

/// What a dispatcher does; [`Worker`] runs it.
struct Dispatching {
    config: DispatcherConfig,
    listener: Option<Arc<Listener>>,
    outputs: Arc<Vec<OutputCounters>>,
}

impl Work for Dispatching {
    const THREAD: &'static str = "dispatch";

    /// Binds `listen`; answers `{"listen": ADDR}`.
    fn configure(&mut self, name: &str) -> Result<Info, ComponentError> {
        self.config.validate(name)?;
        let (listener, answer) =
            bind(name, &self.config.listen, self.config.advertise.as_deref(), self.config.tuning())?;
        self.listener = Some(listener);
        Ok(answer)
    }

    /// Connects every output, then accepts the upstream.
    fn start(&mut self, name: &str, run: u32, live: &Arc<Live>) -> Result<Box<dyn FnOnce() + Send>, ComponentError> {
        let c = &self.config;
        let listener = self.listener.clone().ok_or_else(|| ComponentError::Failed("not configured".into()))?;
        let policy = RetryPolicy::for_duration(Duration::from_millis(c.connect_timeout_ms));
        let mut outs = Vec::with_capacity(c.outputs.len());
        for (i, o) in c.outputs.iter().enumerate() {
            let addr = resolve(name, &format!("outputs[{i}].downstream"), &o.downstream)?;
            let queue = o.queue_bytes(c.send_queue_bytes);
            let mut tuning = c.tuning();
            tuning.send_queue_bytes = queue;
            if o.mode == Mode::Sampling && tuning.socket_buffer_bytes.is_none() {
                tuning.socket_buffer_bytes = Some(config::SAMPLING_SOCKET_BUFFER_BYTES);
            }
            let conn = Connection::connect_with_retry(&[addr], &tuning.options(), &policy)
                .map_err(|e| ComponentError::Failed(format!("{name}: output {i} ({}): {e}", o.downstream)))?;
            outs.push(Out {
                outlet: Outlet::new(conn, queue),
                mode: o.mode,
                sequence: 0,
                bytes: 0,
                dropped: 0,
                dropped_bytes: 0,
                broken: None,
            });
        }
        self.outputs = Arc::new(c.outputs.iter().map(|_| OutputCounters::default()).collect());
        let (name, live, counters, policy) = (name.to_owned(), live.clone(), self.outputs.clone(), c.policy);
        Ok(Box::new(move || dispatch(&name, run, policy, &listener, outs, &live, &counters)))
    }

    /// How long `stop` waits for the end marker to reach every output.
    fn stop_timeout(&self) -> Duration {
        Duration::from_millis(self.config.stop_timeout_ms)
    }

    /// Chunks received, their bytes, the rates; a [`DispatcherDetail`] with each output's
    /// passed and dropped chunks.
    fn report(&self, live: &Live, summary: bool) -> Stats {
        let (stats, flow) = live.counted(summary);
        let received = stats.events;
        let outputs: Vec<OutputDetail> = self
            .config
            .outputs
            .iter()
            .zip(self.outputs.iter())
            .map(|(o, c)| OutputDetail {
                downstream: o.downstream.clone(),
                mode: o.mode,
                passed: c.passed.load(Ordering::Relaxed),
                bytes: c.bytes.load(Ordering::Relaxed),
                dropped: c.dropped.load(Ordering::Relaxed),
                dropped_bytes: c.dropped_bytes.load(Ordering::Relaxed),
                broken: read(&c.broken),
            })
            .collect();
        let end = read(&live.end);
        stats.with_detail(&DispatcherDetail {
            listen: self.listener.as_ref().map(|l| l.local_addr().to_string()),
            upstream: read(&live.upstream),
            policy: self.config.policy,
            seconds: flow.seconds,
            mean_events_per_s: flow.mean_events_per_s,
            mean_mb_per_s: flow.mean_mb_per_s,
            passed: outputs.iter().map(|o| o.passed).sum(),
            dropped: outputs.iter().map(|o| o.dropped).sum(),
            outputs,
            sequence_errors: live.sequence_errors.load(Ordering::Relaxed),
            chunks_announced: end.map(|(last, _)| last),
            missing: end.map_or(0, |(last, _)| last.saturating_sub(received)),
            end_seen: end.is_some(),
            error: live.failure(),
        })
    }

    fn release(&mut self) {
        self.listener = None;
    }
}

worker_component!(Dispatcher);

/// One output as the dispatching thread holds it: its connection and the stream it was given.
struct Out {
    outlet: Outlet,
    mode: Mode,
    /// Sequence number of the last chunk passed to it (its own numbering).
    sequence: u64,
    /// Data bytes passed to it.
    bytes: u64,
    dropped: u64,
    dropped_bytes: u64,
    /// Why a sampling output was given up.
    broken: Option<String>,
}

impl Out {
    /// Whether a frame of `len` payload bytes can be queued now (a broken output takes
    /// nothing, and is never waited for).
    fn has_room(&self, len: usize) -> bool {
        self.broken.is_some() || self.outlet.has_room(len)
    }

    /// Writes what the socket takes; a sampling output that fails is given up, a blocking one
    /// fails the run.
    fn push(&mut self, index: usize) -> Result<bool, Cut> {
        if self.broken.is_some() {
            return Ok(false);
        }
        match self.outlet.push() {
            Ok(p) => Ok(p),
            Err(Cut::Failed(e)) if self.mode == Mode::Sampling => {
                self.give_up(e);
                Ok(true)
            }
            Err(Cut::Failed(e)) => Err(Cut::Failed(format!("output {index} ({}): {e}", self.outlet.conn.peer_addr()))),
            Err(c) => Err(c),
        }
    }

    fn give_up(&mut self, why: String) {
        tracing::warn!(output = %self.outlet.conn.peer_addr(), "sampling output given up: {why}");
        self.broken = Some(why);
    }

    /// Queues `frame` if the output is alive.
    fn send(&mut self, index: usize, frame: Frame) -> Result<(), Cut> {
        if self.broken.is_some() {
            return Ok(());
        }
        match self.outlet.send(frame) {
            Ok(()) => Ok(()),
            Err(Cut::Failed(e)) if self.mode == Mode::Sampling => {
                self.give_up(e);
                Ok(())
            }
            Err(Cut::Failed(e)) => Err(Cut::Failed(format!("output {index} ({}): {e}", self.outlet.conn.peer_addr()))),
            Err(c) => Err(c),
        }
    }

    /// Passes the chunk in `frame` (header `header`) on with this output's next sequence
    /// number, or drops it when a sampling output has no room.
    fn offer(&mut self, index: usize, frame: &Frame, header: ChunkHeader) -> Result<(), Cut> {
        let len = u64::from(header.len);
        if self.broken.is_some() || !self.outlet.has_room(frame.payload.len()) {
            self.dropped += 1;
            self.dropped_bytes += len;
            return Ok(());
        }
        let renumbered = ChunkHeader { sequence: self.sequence + 1, ..header };
        let data = frame.payload.slice(CHUNK_HEADER_LEN..);
        match self.outlet.send_prefixed(KIND_CHUNK, frame.flags, &renumbered.encode(), data) {
            Ok(()) => {
                self.sequence += 1;
                self.bytes += len;
                Ok(())
            }
            Err(Cut::Failed(e)) if self.mode == Mode::Sampling => {
                self.give_up(e);
                self.dropped += 1;
                self.dropped_bytes += len;
                Ok(())
            }
            Err(Cut::Failed(e)) => Err(Cut::Failed(format!("output {index} ({}): {e}", self.outlet.conn.peer_addr()))),
            Err(c) => Err(c),
        }
    }

    fn publish(&self, c: &OutputCounters) {
        c.passed.store(self.sequence, Ordering::Relaxed);
        c.bytes.store(self.bytes, Ordering::Relaxed);
        c.dropped.store(self.dropped, Ordering::Relaxed);
        c.dropped_bytes.store(self.dropped_bytes, Ordering::Relaxed);
        if self.broken.is_some() {
            *c.broken.lock().unwrap_or_else(|p| p.into_inner()) = self.broken.clone();
        }
    }
}

/// The dispatching thread: accept the upstream, dispatch until the end marker has reached
/// every output. What it did is in `live` and `counters`, a failure too.
fn dispatch(
    name: &str,
    run: u32,
    policy: Policy,
    listener: &Listener,
    mut outs: Vec<Out>,
    live: &Live,
    counters: &[OutputCounters],
) {
    let mut check = StreamCheck::new(run, false);
    let mut upstream: Option<String> = None;
    let result: Result<(), Broken> = (|| {
        let up = match accept(listener, live, run, name) {
            Ok(Some(c)) => c,
            Ok(None) => return Err(Cut::Abandoned.into()),
            Err(e) => return Err(Broken::Upstream(e)),
        };
        upstream = Some(up.peer_addr().to_string());
        *live.upstream.lock().unwrap_or_else(|p| p.into_inner()) = upstream.clone();
        dispatch_frames(up, policy, &mut outs, &mut check, live, counters)?;
        finish(&mut outs, live, counters).map_err(Broken::from)
    })();
    live.observe(&check);
    for (o, c) in outs.iter().zip(counters) {
        o.publish(c);
    }
    let error = match result {
        Ok(()) => None,
        Err(Broken::Cut(Cut::Abandoned)) if check.end().is_some() => {
            Some("an output stopped reading: the end marker was not passed on in time".to_owned())
        }
        Err(Broken::Cut(Cut::Abandoned)) => Some(match &upstream {
            None => "stopped before an upstream connected".to_owned(),
            Some(u) => {
                format!("stopped before the end marker came from upstream {u} ({} chunks received)", check.chunks())
            }
        }),
        Err(Broken::Cut(Cut::Failed(e))) => Some(e),
        Err(Broken::Upstream(e)) => Some(e),
    };
    if let Some(e) = error {
        live.fail(name, e);
    }
}

/// Receives frames and hands them to the outputs, until the end marker is queued for every
/// output.
fn dispatch_frames(
    mut up: Connection,
    policy: Policy,
    outs: &mut [Out],
    check: &mut StreamCheck,
    live: &Live,
    counters: &[OutputCounters],
) -> Result<(), Broken> {
    let peer = up.peer_addr();
    let mut pending: Option<Frame> = None;
    // The output the next chunk goes to (round robin).
    let mut turn = 0usize;
    loop {
        if live.abandon.load(Ordering::Relaxed) {
            return Err(Cut::Abandoned.into());
        }
        let mut progress = false;
        for _ in 0..BATCH {
            let frame = match pending.take() {
                Some(f) => f,
                None => match up.try_recv() {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(RecvError::Closed { .. }) => {
                        return Err(Broken::Upstream(format!(
                            "upstream {peer} closed the connection without an end marker after chunk {}",
                            check.chunks()
                        )));
                    }
                    Err(e) => return Err(Broken::Upstream(format!("upstream: {e}"))),
                },
            };
            // A chunk waits for room in the blocking outputs it goes to; a marker for room in
            // every output (markers are never dropped).
            let is_chunk = frame.kind == KIND_CHUNK;
            let len = frame.payload.len();
            let waits = |i: usize, o: &Out| {
                let target = !is_chunk || policy == Policy::Copy || i == turn;
                target && (!is_chunk || o.mode == Mode::Blocking) && !o.has_room(len)
            };
            if outs.iter().enumerate().any(|(i, o)| waits(i, o)) {
                pending = Some(frame);
                break;
            }
            let event = check
                .on_frame(&frame)
                .map_err(|e| Broken::Upstream(format!("upstream {peer} sent {e}; connection closed")))?;
            progress = true;
            match Message::decode(&frame) {
                Ok(Message::Chunk { header, .. }) => match policy {
                    Policy::Copy => {
                        for (i, o) in outs.iter_mut().enumerate() {
                            o.offer(i, &frame, header)?;
                        }
                    }
                    Policy::RoundRobin => {
                        outs[turn].offer(turn, &frame, header)?;
                        turn = (turn + 1) % outs.len();
                    }
                },
                Ok(Message::Begin { .. }) => {
                    for (i, o) in outs.iter_mut().enumerate() {
                        o.send(i, frame.clone())?;
                    }
                }
                Ok(Message::End { .. }) => {
                    for (i, o) in outs.iter_mut().enumerate() {
                        o.send(i, end_frame(o.sequence, o.bytes))?;
                    }
                }
                // The check above decoded it already.
                Err(_) => {}
            }
            if event == StreamEvent::End {
                return Ok(());
            }
        }
        live.observe(check);
        for (i, o) in outs.iter_mut().enumerate() {
            progress |= o.push(i)?;
            o.publish(&counters[i]);
        }
        if !progress {
            let read = pending.is_none().then(|| up.as_raw_fd());
            let writes: Vec<_> = outs
                .iter()
                .filter(|o| o.broken.is_none() && o.outlet.conn.queued_bytes() > 0)
                .map(|o| o.outlet.conn.as_raw_fd())
                .collect();
            wait_any(read, &writes, TICK).map_err(|e| Broken::Upstream(format!("waiting for data: {e}")))?;
        }
    }
}

/// Writes what every output still holds, then closes each: its peer sees a clean end after
/// its end marker.
fn finish(outs: &mut [Out], live: &Live, counters: &[OutputCounters]) -> Result<(), Cut> {
    loop {
        if live.abandon.load(Ordering::Relaxed) {
            return Err(Cut::Abandoned);
        }
        let mut progress = false;
        for (i, o) in outs.iter_mut().enumerate() {
            progress |= o.push(i)?;
            o.publish(&counters[i]);
        }
        let writes: Vec<_> = outs
            .iter()
            .filter(|o| o.broken.is_none() && o.outlet.conn.queued_bytes() > 0)
            .map(|o| o.outlet.conn.as_raw_fd())
            .collect();
        if writes.is_empty() {
            break;
        }
        if !progress {
            wait_any(None, &writes, TICK).map_err(|e| Cut::Failed(e.to_string()))?;
        }
    }
    for (i, o) in outs.iter_mut().enumerate() {
        if o.broken.is_none()
            && let Err(e) = o.outlet.conn.close()
        {
            if o.mode == Mode::Sampling {
                o.give_up(e.to_string());
                o.publish(&counters[i]);
            } else {
                return Err(Cut::Failed(format!("output {i} ({}): {e}", o.outlet.conn.peer_addr())));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::{Generator, GeneratorConfig};
    use crate::protocol::PROTOCOL;
    use crate::sink::{Sink, SinkConfig, SinkDetail};
    use daqflow_transport::ConnectionOptions;

    fn sink() -> (Sink, String) {
        let mut s = Sink::new("sink", SinkConfig::default());
        let listen = s.configure().unwrap()["listen"].as_str().unwrap().to_owned();
        s.start(1).unwrap();
        (s, listen)
    }

    fn output(downstream: &str, mode: Mode) -> OutputConfig {
        OutputConfig { downstream: downstream.into(), mode, queue_bytes: None }
    }

    /// A dispatcher to `outputs`, started, and a generator feeding it `chunk_bytes` chunks.
    /// Paced at `rate_hz`, so that the chunk `stop` asks for is still to come.
    fn chain(outputs: Vec<OutputConfig>, policy: Policy, chunk_bytes: usize, rate_hz: f64) -> (Dispatcher, Generator) {
        let mut d = Dispatcher::new("dispatch", DispatcherConfig { outputs, policy, ..Default::default() });
        let listen = d.configure().unwrap()["listen"].as_str().unwrap().to_owned();
        d.start(1).unwrap();
        let config = GeneratorConfig { downstream: listen, chunk_bytes, rate_hz, ..Default::default() };
        let mut g = Generator::new("gen", config);
        g.configure().unwrap();
        g.start(1).unwrap();
        (d, g)
    }

    fn sink_summary(s: &mut Sink) -> (u64, SinkDetail) {
        let summary = s.stop(None).unwrap();
        let d: SinkDetail = summary.detail_as().unwrap();
        assert!(d.end_seen && d.error.is_none(), "{d:?}");
        assert_eq!((d.sequence_errors, d.crc_errors, d.missing), (0, 0, 0), "{d:?}");
        (summary.events, d)
    }

    #[test]
    fn copy_gives_every_chunk_to_every_output_with_the_end_marker() {
        let (mut a, la) = sink();
        let (mut b, lb) = sink();
        let (mut d, mut g) =
            chain(vec![output(&la, Mode::Blocking), output(&lb, Mode::Blocking)], Policy::Copy, 1000, 5000.0);
        assert_eq!(g.stop(Some(500)).unwrap().events, 500);
        let summary = d.stop(None).unwrap();
        let detail: DispatcherDetail = summary.detail_as().unwrap();
        assert!(detail.end_seen && detail.error.is_none(), "{detail:?}");
        assert_eq!((summary.events, detail.passed, detail.dropped, detail.missing), (500, 1000, 0, 0), "{detail:?}");
        for o in &detail.outputs {
            assert_eq!((o.passed, o.bytes, o.dropped), (500, 500_000, 0), "{o:?}");
        }
        for s in [&mut a, &mut b] {
            let (events, sd) = sink_summary(s);
            assert_eq!((events, sd.chunks_announced, sd.bytes_announced), (500, Some(500), Some(500_000)));
        }
    }

    #[test]
    fn round_robin_gives_each_chunk_to_one_output_in_turn() {
        let sinks: Vec<(Sink, String)> = (0..3).map(|_| sink()).collect();
        let outputs = sinks.iter().map(|(_, l)| output(l, Mode::Blocking)).collect();
        let (mut d, mut g) = chain(outputs, Policy::RoundRobin, 100, 5000.0);
        g.stop(Some(1000)).unwrap();
        let detail: DispatcherDetail = d.stop(None).unwrap().detail_as().unwrap();
        assert!(detail.end_seen && detail.error.is_none(), "{detail:?}");
        let passed: Vec<u64> = detail.outputs.iter().map(|o| o.passed).collect();
        assert_eq!(passed, [334, 333, 333], "{detail:?}");
        for ((mut s, _), n) in sinks.into_iter().zip(passed) {
            let (events, sd) = sink_summary(&mut s);
            assert_eq!((events, sd.chunks_announced), (n, Some(n)), "each output's own stream, numbered 1 … n");
        }
    }

    /// A consumer that takes `per_frame` for each frame it reads, and gives up after
    /// `give_up_after` frames if set; returns the frames it read.
    fn slow_reader(per_frame: Duration, give_up_after: Option<usize>) -> (String, std::thread::JoinHandle<Vec<Frame>>) {
        let listener =
            Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectionOptions::for_protocol(PROTOCOL)).unwrap();
        let addr = listener.local_addr().to_string();
        let reader = std::thread::spawn(move || {
            let mut c = listener.accept().unwrap();
            c.admit();
            let mut got = Vec::new();
            while let Ok(f) = c.recv() {
                got.push(f);
                if give_up_after == Some(got.len()) {
                    return got;
                }
                std::thread::sleep(per_frame);
            }
            got
        });
        (addr, reader)
    }

    #[test]
    fn a_slow_sampling_output_drops_and_counts_and_never_holds_the_blocking_one_up() {
        let (mut logger, ll) = sink();
        let (ml, monitor) = slow_reader(Duration::from_millis(10), None);
        let outputs = vec![
            output(&ll, Mode::Blocking),
            OutputConfig { downstream: ml, mode: Mode::Sampling, queue_bytes: Some(256 << 10) },
        ];
        let (mut d, mut g) = chain(outputs, Policy::Copy, 64 << 10, 5000.0);
        let n = 3000;
        assert_eq!(g.stop(Some(n)).unwrap().events, n);
        let detail: DispatcherDetail = d.stop(None).unwrap().detail_as().unwrap();
        assert!(detail.end_seen && detail.error.is_none(), "{detail:?}");
        let (log, mon) = (&detail.outputs[0], &detail.outputs[1]);
        assert_eq!((log.passed, log.dropped), (n, 0), "{detail:?}");
        assert!(mon.dropped > 0, "the slow monitor dropped: {detail:?}");
        assert_eq!(mon.passed + mon.dropped, n, "every chunk accounted for: {detail:?}");
        assert_eq!(sink_summary(&mut logger).0, n);
        let frames = monitor.join().unwrap();
        let chunks = frames.iter().filter(|f| f.kind == KIND_CHUNK).count() as u64;
        assert_eq!(chunks, mon.passed);
        let Ok(Message::End { last_sequence, .. }) = Message::decode(frames.last().unwrap()) else { panic!() };
        assert_eq!(last_sequence, mon.passed, "the monitor's own end marker counts what it was given");
    }

    #[test]
    fn a_sampling_output_that_goes_away_is_given_up_and_the_run_goes_on() {
        let (mut logger, ll) = sink();
        let (ml, monitor) = slow_reader(Duration::ZERO, Some(5));
        let outputs = vec![output(&ll, Mode::Blocking), output(&ml, Mode::Sampling)];
        let (mut d, mut g) = chain(outputs, Policy::Copy, 4096, 20_000.0);
        monitor.join().unwrap();
        let n = 20_000;
        g.stop(Some(n)).unwrap();
        let detail: DispatcherDetail = d.stop(None).unwrap().detail_as().unwrap();
        assert!(detail.end_seen && detail.error.is_none(), "{detail:?}");
        let mon = &detail.outputs[1];
        assert!(mon.broken.is_some(), "{detail:?}");
        assert_eq!(mon.passed + mon.dropped, n, "{detail:?}");
        assert_eq!(sink_summary(&mut logger).0, n);
    }

    #[test]
    fn a_blocking_output_that_goes_away_fails_the_dispatcher_naming_it() {
        let (ml, reader) = slow_reader(Duration::ZERO, Some(5));
        let (mut d, mut g) = chain(vec![output(&ml, Mode::Blocking)], Policy::Copy, 4096, 20_000.0);
        reader.join().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while d.failure().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let f = d.failure().expect("the dispatcher failed");
        assert!(f.contains("output 0"), "{f}");
        let _ = g.reset();
        d.stop(None).unwrap();
    }
}
