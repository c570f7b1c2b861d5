//! # daqflow-component: the contract every component process follows
//!
//! Every long-running daqflow process is a **component** (DAQ-Middleware's components, iFDAQ's
//! slaves): a name, a kind, and one state machine, the same for every kind:
//!
//! ```text
//! Initial ──configure──▶ Configured ──start(run)──▶ Running ──pause──▶ Paused
//!    ▲                      │  ▲                      │  ▲               │
//!    └──────reset───────────┘  └────────stop──────────┘  └────resume─────┘
//! any state ──fault──▶ Error ──reset──▶ Initial
//! ```
//!
//! This crate holds that contract and nothing of any subsystem: the [`State`]s, the
//! [`Component`] trait a kind implements (only what happens in each transition), the [`Driver`]
//! that is the state machine (it refuses illegal transitions before any hook runs, builds the
//! component from its configuration on `configure`, and goes to Error when a hook fails or the
//! component reports a failure during the run), the [`Registry`] of kinds a binary runs, and
//! [`checks`], the range checks every kind's configuration goes through. The event builder, the
//! ET system, the chain and run control implement or drive it; the `daqflow` binary registers the
//! standard kinds.
//!
//! ```
//! use daqflow_component::{Component, ComponentError, Driver, Registry, State};
//! use serde_json::{json, Value};
//!
//! struct Counter { n: u64 }
//! impl Component for Counter {
//!     fn kind(&self) -> &str { "counter" }
//!     fn start(&mut self, _run: u32) -> Result<(), ComponentError> { self.n = 0; Ok(()) }
//!     fn stop(&mut self, _arg: Option<u64>) -> Result<Value, ComponentError> { Ok(json!({"events": self.n})) }
//!     fn stats(&self) -> Value { json!({"events": self.n}) }
//! }
//!
//! let mut registry = Registry::new();
//! registry.add("counter", |_name, _config| Ok(Box::new(Counter { n: 0 })));
//! let mut driver = Driver::new(registry, "counter", "c-1", toml::Table::new());
//! driver.configure(None)?;
//! driver.start(7)?;
//! assert_eq!(driver.state(), State::Running);
//! assert!(driver.configure(None).is_err()); // refused: configure while running
//! let summary = driver.stop(None)?;
//! assert_eq!(summary["events"], 0);
//! assert_eq!(driver.state(), State::Configured); // after stop, every kind is ready for the next run
//! # Ok::<(), ComponentError>(())
//! ```
#![warn(missing_docs)]

pub mod checks;
mod component;
mod error;
mod state;

pub use component::{Component, Driver, Factory, Registry, merge, parse_config};
pub use error::ComponentError;
pub use state::State;
