//! # daqflow-et: the Event Transfer system
//!
//! daqflow's implementation of the ET system of Jefferson Lab's CODA (Timmer et al., "Data
//! Distribution Manager"; its words and where they are in the code: `docs/architecture.md`): a pool
//! of event buffers in shared memory flows through a chain of **stations**. Producers take empty
//! events from **GrandCentral**, fill them and put them; each station's consumers get the events
//! its selection takes, use them in place, and put them on; events leaving the last station return
//! to GrandCentral.
//!
//! - **Local attachments** work on the shared memory directly: a batch of events costs one
//!   lock on the queue's pushers' or poppers' side (a compare-and-swap on a line only that side
//!   writes, holding the locker's id, so that the ET process repairs a queue whose locker died),
//!   no copy, and no round trip to the ET process (the putting process routes its events itself;
//!   waiting consumers sleep on futexes). See `docs/et.md`.
//! - **Stations** are blocking or non-blocking (with a cue), select all events, by control
//!   integers with wildcards, by built-in predicates, or by a closure (stations created in the ET
//!   process), with a prescale; they may form **parallel groups**; settings change while
//!   running; high-priority events go first.
//! - **Large events** get temporary buffers (anonymous memory files: nothing is ever left in
//!   `/dev/shm`) that take memory only as they are written, freed when they return to
//!   GrandCentral, within limits on their size, number and bytes ([`Limit`]).
//! - **Access**: only the ET process's user, root and the users it is told to accept
//!   ([`SystemConfig::allowed_uids`]) may connect locally and map the memory.
//! - **Recovery**: a process that dies holding events (or stops heartbeating) gets them taken
//!   back, marked possibly corrupt, and sent where its station's restore mode says; users see a
//!   dead ET system as an error within a bounded time and can attach again.
//! - **Remote access** serves the same [`Attachment`] API over TCP, with **discovery** by name.
//!
//! ```no_run
//! use daqflow_et::{Attachment, EtClient, EtSystem, Position, Selection, StationConfig, SystemConfig, Wait};
//!
//! // The ET system (usually `daqflow et start --name daq …` in its own process).
//! let system = EtSystem::create(SystemConfig::new("daq", 3000, 8192))?;
//! let only_physics = StationConfig { selection: Selection::Match([Some(1), None, None, None]), ..Default::default() };
//! system.create_station("monitor", only_physics, Position::End)?;
//!
//! // A producer, in any process on the machine.
//! let client = EtClient::connect("daq")?;
//! let producer = client.attach("GRAND_CENTRAL")?;
//! let mut events = producer.new_events(100, 1024, Wait::Sleep)?;
//! for e in &mut events {
//!     e.write(b"raw detector data")?;
//!     e.set_control([1, 0, 0, 0]); // trigger type 1: physics
//! }
//! producer.put_events(&mut events)?;
//!
//! // A consumer.
//! let consumer = client.attach("monitor")?;
//! let mut got = consumer.get_events(100, Wait::Sleep)?;
//! let bytes: usize = got.iter().map(|e| e.len()).sum();
//! consumer.put_events(&mut got)?;
//! # let _ = bytes;
//! # Ok::<(), daqflow_et::EtError>(())
//! ```
#![warn(missing_docs)]

mod bridge;
mod client;
pub mod components;
pub mod config;
mod copy;
mod error;
mod event;
mod ipc;
mod local;
mod monitor;
mod pool;
mod queue;
pub mod remote;
mod routing;
pub mod sink;
mod sys;
mod system;

pub use bridge::{BridgeStats, bridge};
pub use client::EtClient;
pub use config::{
    DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_TEMP_BYTES, EventView, GRAND_CENTRAL, GroupPolicy, Position, Priority,
    RestoreMode, SelectFn, Selection, StationConfig, SystemConfig, Wait,
};
pub use copy::copy_into;
pub use error::{EtError, Limit};
pub use event::{Attachment, Event};
pub use local::LocalAttachment;
pub use monitor::{AttachmentStatus, Snapshot, StationStatus};
pub use pool::MAX_STATIONS;
pub use remote::client::{RemoteAttachment, RemoteClient};
pub use system::EtSystem;
