//! What the EVM, RU and BU components have in common, once: a run is one engine scheduler
//! running the kind's I/O module (and, for a BU, its builder threads' schedulers), told to end
//! by a flag, joined at `stop` for the summary it leaves, abandoned at `reset`, profiled per run
//! when asked. A kind's struct holds a [`Unit`] with what is its own (`X`: the BU's builder
//! counters, the EVM's last event) and writes only its configuration and its I/O module.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use daqflow_component::{ComponentError, Stats, Verb};
use daqflow_engine::profile::ThreadStamps;
use daqflow_engine::{Running, Scheduler};

use crate::EvbError;
use crate::common::{Profiling, read};

/// What a run shares between the component and its I/O module: the flags the module reads and
/// what it publishes; `extra` is the kind's own.
#[derive(Default)]
pub(crate) struct RunShared<X> {
    /// The component was told to stop: the module ends the run its way (the EVM drains).
    pub(crate) stop: AtomicBool,
    /// The run is paused.
    pub(crate) paused: AtomicBool,
    /// The live counters, published by the module.
    pub(crate) live: Mutex<Stats>,
    /// Why the run failed here, if it did.
    pub(crate) failure: Mutex<Option<String>>,
    /// The run's summary, left by the module as it ends.
    pub(crate) summary: Mutex<Option<Stats>>,
    /// The kind's own.
    pub(crate) extra: X,
}

/// The run-time part of an event-builder component (see the module's documentation).
pub(crate) struct Unit<X> {
    name: String,
    /// This run's shared state (a fresh one per run).
    pub(crate) shared: Arc<RunShared<X>>,
    running: Option<Running>,
    run: u32,
    /// Time-stamp profiling (`profile = PATH`), set up at configure.
    profiling: Option<Profiling>,
}

impl<X: Default + Send + Sync + 'static> Unit<X> {
    /// The unit of component `name`, not running.
    pub(crate) fn new(name: &str) -> Unit<X> {
        Unit { name: name.into(), shared: Arc::default(), running: None, run: 0, profiling: None }
    }

    /// The component's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// At configure: profile each run to `path` (rings of `stamps` time stamps), or not.
    pub(crate) fn profile(&mut self, path: Option<&std::path::Path>, stamps: usize) {
        self.profiling = Profiling::new(&self.name, path, stamps);
    }

    /// Makes run `run`'s shared state, with the kind's own `extra`.
    pub(crate) fn begin(&mut self, run: u32, extra: X) -> Arc<RunShared<X>> {
        self.run = run;
        self.shared = Arc::new(RunShared { extra, ..Default::default() });
        self.shared.clone()
    }

    /// A scheduler for this run named `NAME-ROLE`, with the idle strategy, pinned to `cpus`,
    /// profiled when asked.
    pub(crate) fn scheduler(
        &self,
        role: &str,
        idle: daqflow_engine::IdleStrategy,
        cpus: &Option<Vec<usize>>,
    ) -> Result<Scheduler, EvbError> {
        let mut s = Scheduler::new(format!("{}-{role}", self.name))
            .with_idle(idle)
            .pinned_to_cpus(crate::common::cpu_set(cpus)?);
        if let Some(p) = &self.profiling {
            s = p.scheduler(s);
        }
        Ok(s)
    }

    /// Runs the run's I/O scheduler.
    pub(crate) fn spawn(&mut self, s: Scheduler) -> Result<(), ComponentError> {
        self.running = Some(s.spawn().map_err(|e| EvbError::Failed(e.to_string()))?);
        Ok(())
    }

    /// Ends the run: tells the module to stop, waits for it, writes the profile (with the
    /// threads `more` adds, a BU's builders), and answers the summary the module left.
    pub(crate) fn stop(&mut self, more: impl FnOnce(&X) -> Vec<ThreadStamps>) -> Result<Stats, ComponentError> {
        let Some(running) = self.running.take() else {
            return Err(ComponentError::out_of_order(Verb::Stop, "no run is taken"));
        };
        self.shared.stop.store(true, Ordering::SeqCst);
        let report = running.join().map_err(|e| EvbError::Failed(e.to_string()))?;
        if let Some(p) = &self.profiling {
            let mut threads: Vec<ThreadStamps> = report.stamps.into_iter().collect();
            threads.extend(more(&self.shared.extra));
            p.write(self.run, threads)?;
        }
        let summary = read(&self.shared.summary);
        Ok(summary.ok_or_else(|| EvbError::Failed(format!("{} ended without a summary", self.name)))?)
    }

    /// Pauses or resumes the run (`command` names which, for the error without one).
    pub(crate) fn pause(&mut self, command: Verb, paused: bool) -> Result<(), ComponentError> {
        if self.running.is_none() {
            return Err(ComponentError::out_of_order(command, "no run is taken"));
        }
        self.shared.paused.store(paused, Ordering::SeqCst);
        Ok(())
    }

    /// Abandons the run, if one is taken: with `wait`, the module ends it its way (the EVM
    /// tells everyone the run's end), else it is stopped at once.
    pub(crate) fn reset(&mut self, wait: bool) {
        if let Some(r) = self.running.take() {
            self.shared.stop.store(true, Ordering::SeqCst);
            let _ = if wait { r.join() } else { r.stop() };
        }
    }

    /// The live counters as last published.
    pub(crate) fn live(&self) -> Stats {
        read(&self.shared.live)
    }

    /// Why the run failed, if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        read(&self.shared.failure)
    }
}
