//! # daqflow-dialog: the control plane
//!
//! daqflow's implementation of DIALOG, the communication library of the COMPASS iFDAQ (Bai et al.,
//! "The Communication Library DIALOG for iFDAQ of the COMPASS Experiment", 2017; its words and
//! where they are in the code: `docs/architecture.md`). Processes exchange **named services** (a
//! provider publishes values, subscribers receive each one) and **commands** (delivered to every
//! process that registered the command's name). A **control server** keeps the directory: which
//! processes run where, who provides each service, who subscribes, who accepts each command; it
//! watches every process's **heartbeat**.
//!
//! - A subscriber asks the control server where a service is, then gets its values **straight
//!   from the provider**, over a connection of their own: service updates never pass through
//!   the control server.
//! - Processes start **in any order**: a request for a service nobody provides yet waits in the
//!   control server; when a provider dies and a spare provides the service, subscribers move to
//!   it by themselves; when the control server dies, processes keep retrying (the primary
//!   address, then spares) and register everything again when one answers. Provider →
//!   subscriber connections keep delivering meanwhile.
//! - A process silent for the heartbeat check interval is declared lost: its services become
//!   unavailable and its partners are told (lost sender, lost receiver).
//! - Service names are unique: registering one that another live process provides fails with
//!   an error naming that process.
//!
//! ```no_run
//! use daqflow_dialog::{Dialog, ServiceEvent};
//!
//! // A provider: one line to join, one to provide.
//! let ru = Dialog::connect("127.0.0.1:7000", "ru-1")?;
//! let state = ru.provide("ru-1/state")?;
//! state.update(br#"{"state":"Configured"}"#)?;
//!
//! // A subscriber in another process: the current value first, then every update.
//! let gui = Dialog::connect("127.0.0.1:7000", "gui")?;
//! let _sub = gui.subscribe("ru-1/state", |event| match event {
//!     ServiceEvent::Update { data, .. } => println!("ru-1 is {}", String::from_utf8_lossy(&data)),
//!     ServiceEvent::Lost { provider, cause } => println!("lost {provider}: {cause}"),
//!     _ => {}
//! })?;
//! # Ok::<(), daqflow_dialog::DialogError>(())
//! ```
//!
//! The protocol and the failure behaviour are specified in `docs/dialog.md`.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod client;
mod config;
pub mod directory;
mod error;
pub mod protocol;
mod server;
mod sync;

pub use client::{
    Client, CommandMessage, CommandRegistration, LostCause, Service, ServiceEvent, ServiceOptions, Subscription,
};
pub use config::{
    CONTROL_ENV, DEFAULT_CONTROL, DialogConfig, ServerConfig, control_addrs_from_env, default_listen,
    parse_control_addrs,
};
pub use daqflow_transport::WhenFull;
pub use daqflow_transport::auth::Token;
pub use directory::{CommandInfo, LostCounts, ProcessInfo, ServiceInfo};
pub use error::{DialogError, ServerError};
pub use server::{ControlServer, ServerHandle, ServerView};
pub use sync::Dialog;
