//! # daqflow-engine: the data-plane runtime
//!
//! What runs inside a daqflow data-plane process, after the ATLAS DAQ-Unit (prototype −1) and its
//! generic I/O module:
//!
//! - [`Task`]s with a cheap [`Task::poll`] that says whether their [`Task::action`] has work, run
//!   round-robin by a [`Scheduler`] on one thread: data-driven, no system call on the busy path,
//!   an [`IdleStrategy`] (spin, then yield, then park) for the idle one, optional pinning to a
//!   core, a [`StopHandle`], and per-task counters (polls, successful polls, actions);
//! - software FIFOs ([`fifo()`]) between tasks and between schedulers;
//! - the [`EventManager`]: fragments by event id in pages of a preallocated pool, with
//!   back-pressure instead of allocation when full;
//! - grouped data control [`messages`]: accept (L2A), reject (L2R), region of interest (ROI) and
//!   discard;
//! - time-stamp [`profile`]-ing: one counter read per stamp into a per-thread ring, nothing at
//!   all when off; `daqflow profile` draws the paper's histograms and sequence diagrams.
//!
//! The paper's measurement set-up built from these parts (ROBs, a TRG deciding accept / reject /
//! ROI 1:100:10, an EBIF-like collector) is a benchmark fixture, not part of this library: it
//! lives beside the benchmarks, in the `daqflow` binary (`crates/cli/src/bench/testbed.rs`), and
//! runs as `daqflow engine testbed` and in `daqflow bench engine`. The event builder
//! (`daqflow-evb`) is the same data flow with real processes.
//!
//! ```
//! use daqflow_engine::{fifo, task, Scheduler, IdleStrategy};
//!
//! // A producer task pushes numbers into a FIFO; a consumer task sums them and stops the scheduler.
//! let (tx, rx) = fifo::<u64>(64);
//! let mut s = Scheduler::new("doc").with_idle(IdleStrategy::LAZY);
//! let stop = s.stop_handle();
//! s.add(task::from_fn("produce", (tx, 0u64), |(tx, next)| *next < 1000 && !tx.is_full(), |(tx, next)| {
//!     tx.push(*next).map_err(|_| "FIFO full")?;
//!     *next += 1;
//!     Ok(())
//! }));
//! s.add(task::from_fn("consume", (rx, 0u64), |(rx, _)| !rx.is_empty(), move |(rx, sum)| {
//!     *sum += rx.pop()?;
//!     if *sum == 999 * 1000 / 2 {
//!         stop.stop();
//!     }
//!     Ok(())
//! }));
//! let report = s.run().unwrap();
//! assert_eq!(report.tasks[1].actions, 1000);
//! ```
//!
//! See `docs/engine.md` for the task model, idle strategies, when to pin, and how to profile.

#![warn(missing_docs)]

pub mod error;
pub mod event_manager;
pub mod fifo;
pub mod messages;
pub mod profile;
pub mod readiness;
pub mod scheduler;
pub mod task;

pub use error::{BoxError, ConfigError, InsertError, MessageError, ProfileError, SchedulerError};
pub use event_manager::{EventManager, EventManagerConfig};
pub use fifo::fifo;
pub use scheduler::{Counters, IdleStrategy, Report, Running, Scheduler, StopHandle, TaskStats, Waker};
pub use task::{Module, Task};
