//! The run's record: opening it, closing it with its accounting, what follows the end of a job.

use super::*;

impl Sequencer {
    pub(super) fn on_run_opened(&mut self, r: Result<u32, OperatorError>, now: Now, out: &mut Vec<Output>) {
        let Some(job) = self.job.as_mut() else { return };
        if !matches!(job.step, Step::Opening { .. }) {
            return;
        }
        match r {
            Ok(run) => {
                self.run = Some(run);
                self.run_started_ms = Some(now.wall_ms);
                self.last_summary = None;
                self.changes.clear();
                for v in self.views.values_mut() {
                    v.earlier.clear();
                    v.samples.clear();
                    v.recent_restarts = 0;
                }
                job.step = Step::Starting { run, stage: 0, started: Vec::new() };
                self.advance(now, out);
            }
            Err(e) => {
                let job = self.job.take().expect("a job");
                self.end_job(job, Err(e), out);
            }
        }
    }

    /// What the operator needs to close run `run`.
    pub(super) fn close_run(&self, run: u32, summaries: BTreeMap<String, Stats>, errors: Vec<String>) -> Output {
        let mut components = Vec::new();
        let mut data = Vec::new();
        for spec in &self.file.components {
            let v = &self.views[&spec.name];
            let died =
                (!v.alive && v.state.is_some()).then(|| v.exit.clone().unwrap_or_else(|| "its process ended".into()));
            components.push(ComponentRun {
                name: spec.name.clone(),
                kind: spec.kind.clone(),
                role: spec.role,
                summary: summaries.get(&spec.name).cloned(),
                last_stats: v.stats.clone(),
                earlier: v.earlier.clone(),
                died,
                failed: (v.alive && v.state == Some(ComponentState::Error)).then(|| v.error.clone()).flatten(),
                data: None,
            });
            if let Some(files) = spec.data_files
                && let Ok(params) = self.resolved_params(spec)
                && let Some(dir) = files(&params)
            {
                if let Some(c) = components.last_mut() {
                    c.data = Some(dir.clone());
                }
                data.push((spec.name.clone(), dir));
            }
        }
        let started_ms = self.run_started_ms.unwrap_or(0);
        let overrides = self.overrides_flat();
        let degraded = self.dropped.iter().map(|(name, why)| format!("{name}: {why}")).collect();
        let changes = self.changes.clone();
        Output::CloseRun(Box::new(CloseRun { run, started_ms, components, data, errors, overrides, degraded, changes }))
    }

    pub(super) fn on_run_closed(&mut self, summary: Box<RunSummary>, now: Now, out: &mut Vec<Output>) {
        self.run_started_ms = None;
        self.last_summary = Some(summary.clone());
        let dropped = std::mem::take(&mut self.dropped);
        let Some(mut job) = self.job.take() else { return };
        let Step::Closing { then } = std::mem::replace(&mut job.step, Step::Respawning) else {
            self.job = Some(job);
            return;
        };
        match then {
            AfterClose::StartFailed(e) => {
                self.target = SystemState::Configured;
                self.end_job(job, Err(e), out);
            }
            AfterClose::Stopped => {
                self.target = SystemState::Configured;
                tracing::info!(
                    run = summary.run,
                    events = summary.events,
                    lost = summary.lost,
                    "run {}",
                    summary.state.name()
                );
                self.end_job(job, Ok(TransitionResult::Stopped(summary)), out);
                // The components the run went without come back for the next run.
                for name in dropped.into_keys() {
                    if !self.views[&name].joined() || self.views[&name].state == Some(ComponentState::Error) {
                        tracing::info!(component = %name, "starting {name} again after the run it was lost to");
                        if let Some(v) = self.views.get_mut(&name) {
                            v.restarts += 1;
                            v.stats = Stats::default();
                            v.samples.clear();
                        }
                        let why = "lost to the run before".to_owned();
                        self.restarts
                            .insert(name.clone(), Restart { step: RestartStep::Spawning, target: self.target, why });
                        out.push(Output::Spawn { name });
                    }
                }
            }
            AfterClose::Reset => {
                self.respawn_dead(&mut job, now, out);
                self.job = Some(job);
                self.advance(now, out);
            }
        }
    }

    /// With no transition under way: a transition that waited, else the policies of the
    /// components that died or failed.
    pub(super) fn after_job(&mut self, now: Now, out: &mut Vec<Output>) {
        if self.restarts.is_empty() {
            if !self.restart_failures.is_empty() && self.run_open() {
                let reasons = std::mem::take(&mut self.restart_failures);
                self.begin(None, Transition::Stop, reasons, now, out);
                return;
            }
            self.restart_failures.clear();
            // The transitions that waited, in order, until one is under way (one refused at
            // once lets the next go).
            while let Some((ticket, t)) = self.queue.pop_front() {
                self.begin(Some(ticket), t, Vec::new(), now, out);
                if self.job.is_some() {
                    return;
                }
            }
        }
        if self.job.is_some() {
            return;
        }
        self.check_failures(now, out);
        if self.job.is_none() {
            self.check_disks(now, out);
        }
    }
}
