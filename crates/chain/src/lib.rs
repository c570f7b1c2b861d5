//! # daqflow-chain: the data plane of DAQ-Middleware
//!
//! The component chain of DAQ-Middleware (Sendai et al., "Performance measurement of
//! DAQ-Middleware", figs. 4–9): a [`generator`](generator::Generator) sends chunks of data
//! through any number of [`repeater`](repeater::Repeater)s to a [`sink`](sink::Sink), each a
//! component of its own process, connected by [`daqflow_transport`] framed TCP.
//!
//! ```text
//!  generator ──chunks──▶ repeater ──▶ repeater ──▶ … ──▶ sink
//!  (downstream=R1)       (listen, downstream=R2)         (listen)
//! ```
//!
//! The stream of a run ([`protocol`]) is a begin marker with the run number, chunks with
//! sequence numbers 1, 2, 3, … (a 16-byte header and `chunk_bytes` of data, the data's CRC32C
//! with `check = true`), and an end marker that says how many chunks and bytes were sent. A
//! repeater passes every frame on without copying its payload; the sink checks and counts
//! everything and accounts for every chunk.
//!
//! Besides, the paper's other standard components, each a kind of its own process: a
//! [`gatherer`](gatherer::Gatherer) (reads readout links, raw TCP cut by [`framing`], data files
//! or a source, into one stream), a [`dispatcher`](dispatcher::Dispatcher) (one input, several outputs: each chunk copied to
//! all or to one in turn; each output blocking, losing nothing, or sampling, dropping what it
//! cannot take and counting it), a [`logger`](logger::Logger) (every chunk a record of a
//! daqflow data file) and a [`chain_monitor`](chain_monitor::ChainMonitor) (histograms of the
//! chunks it is given). [`ports`] is the model for components of your own: named, typed input
//! and output ports, the logic per chunk, the rest the framework's. [`framing`] cuts a raw readout link's byte stream into events by a
//! length field in their headers.
//!
//! ```text
//!                               ┌─blocking──▶ logger   (files)
//!  generator ──▶ dispatcher ────┤
//!                               └─sampling──▶ chain_monitor (histograms; drops counted)
//! ```
//!
//! Configure the receivers first (their `listen` addresses go into the senders'
//! `downstream`), start them in any order, and stop the **generator first**: its end marker
//! then flows down the chain and each repeater's and the sink's `stop` returns as soon as the
//! marker has passed (each waits at most `stop_timeout_ms` for it).
//!
//! Each kind's `kind()` is its line in a registry. The stop summaries are [`Stats`]: `events`
//! are chunks (sent, passed on, received), `bytes` their data bytes, and `detail` the kind's
//! own figures ([`GeneratorDetail`](generator::GeneratorDetail),
//! [`RepeaterDetail`](repeater::RepeaterDetail), [`SinkDetail`](sink::SinkDetail)).
//!
//! [`Stats`]: daqflow_component::Stats
//!
//! ```
//! use daqflow_chain::sink::SinkDetail;
//! use daqflow_component::{Driver, Registry, State};
//!
//! let standard = || {
//!     let mut r = Registry::new();
//!     r.add(daqflow_chain::generator::kind()).add(daqflow_chain::repeater::kind()).add(daqflow_chain::sink::kind());
//!     r
//! };
//! let table = |s: &str| s.parse::<toml::Table>().unwrap();
//! let mut sink = Driver::new(standard(), "sink", "sink", toml::Table::new());
//! let listen = sink.configure(None)?["listen"].as_str().unwrap().to_owned();
//! let mut repeater = Driver::new(standard(), "repeater", "rep", table(&format!("downstream = '{listen}'")));
//! let listen = repeater.configure(None)?["listen"].as_str().unwrap().to_owned();
//! // Paced at 5 kHz: chunk 1000 is still to come when `stop` asks for it.
//! let config = format!("downstream = '{listen}'\nchunk_bytes = 4096\nrate_hz = 5000.0");
//! let mut generator = Driver::new(standard(), "generator", "gen", table(&config));
//! generator.configure(None)?;
//! for d in [&mut sink, &mut repeater, &mut generator] {
//!     d.start(1)?;
//! }
//! let sent = generator.stop(Some(1000))?; // exactly 1000 chunks, then the end marker
//! repeater.stop(None)?;
//! let got = sink.stop(None)?;
//! assert_eq!((sent.events, got.events), (1000, 1000));
//! let detail: SinkDetail = got.detail_as().unwrap();
//! assert_eq!((detail.sequence_errors, detail.crc_errors, detail.end_seen), (0, 0, true));
//! assert_eq!(sink.state(), State::Configured);
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```

#![warn(missing_docs)]

pub mod chain_monitor;
pub mod dispatcher;
pub mod framing;
pub mod gatherer;
pub mod generator;
mod link;
pub mod logger;
pub mod ports;
pub mod protocol;
mod receiver;
pub mod repeater;
pub mod sink;

/// Largest `chunk_bytes`: a chunk and its header fit in the transport's largest frame.
pub const MAX_CHUNK_BYTES: usize = daqflow_wire::frame::DEFAULT_MAX_FRAME_LEN as usize - protocol::CHUNK_HEADER_LEN;

/// Default bound of a sender's queue (`send_queue_bytes`).
pub const DEFAULT_SEND_QUEUE_BYTES: usize = 16 << 20;

/// Default size of a receiver's read buffers (`recv_chunk_bytes`): 4 MiB, against the
/// transport's 256 KiB. Through generator → repeater → sink, 4 MiB buffers moved 64 KiB chunks
/// 20% faster and 1 MiB chunks 5% faster than 256 KiB buffers (fewer reads, and fewer partial
/// frames moved to the front of a fresh buffer), and 4 KiB chunks 4% slower (the buffer no
/// longer stays in the L2 cache); `docs/performance.md`, chain.
pub const DEFAULT_RECV_CHUNK_BYTES: usize = 4 << 20;
