//! Transitions as jobs: a request, its steps by stage, and the end of the job (a configure undone when it fails).

use super::*;

/// The replies a step waited for, each with the component that sent it.
type Replies = Vec<(String, Result<Answer, OperatorError>)>;

impl Sequencer {
    pub(super) fn on_tick(&mut self, now: Now, out: &mut Vec<Output>) {
        let due: Vec<(u64, bool)> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline <= now.mono || p.resend_at.is_some_and(|t| t <= now.mono))
            .map(|(&id, p)| (id, p.deadline <= now.mono))
            .collect();
        // Of the requests to one component that wait to be delivered again, only the oldest
        // goes in one round: the next ones once it was delivered (a component that joins again
        // registers its commands one by one, and must take them in the order they were sent).
        let mut oldest_waiting: BTreeMap<&str, u64> = BTreeMap::new();
        for (&id, p) in self.pending.iter().filter(|(_, p)| p.resend_at.is_some()) {
            oldest_waiting.entry(p.name.as_str()).or_insert(id);
        }
        let oldest_waiting: BTreeMap<String, u64> =
            oldest_waiting.into_iter().map(|(n, id)| (n.to_owned(), id)).collect();
        for (id, expired) in due {
            let Some(p) = self.pending.get(&id) else { continue };
            let alive = self.views.get(&p.name).is_some_and(|v| v.alive);
            if !expired && p.resend_at.is_some() && alive && oldest_waiting.get(&p.name).is_some_and(|&o| o != id) {
                continue;
            }
            if p.resend_at.is_some() && (expired || !alive) {
                self.fail_request(id, "not on the control plane".into(), now, out);
            } else if expired {
                let reason = format!("no answer within {:.0} s", p.timeout.as_secs_f64());
                self.fail_request(id, reason, now, out);
            } else if let Some(p) = self.pending.get_mut(&id) {
                p.resend_at = None;
                out.push(Output::Send { to: p.name.clone(), request: p.request.clone() });
            }
        }
        let late_join =
            self.job.as_ref().and_then(|j| j.joining.iter().find(|(_, d)| **d <= now.mono).map(|(n, _)| n.clone()));
        if let Some(name) = late_join {
            let reason = format!("did not join the control plane within {:.0} s", self.config.timeout.as_secs_f64());
            self.fail_join(&name, reason, out);
        }
        let late_restarts: Vec<String> = self
            .restarts
            .iter()
            .filter(|(_, r)| matches!(r.step, RestartStep::Joining { deadline } if deadline <= now.mono))
            .map(|(n, _)| n.clone())
            .collect();
        for name in late_restarts {
            let reason = format!("did not join the control plane within {:.0} s", self.config.timeout.as_secs_f64());
            self.restart_failed(&name, reason, now, out);
        }
        for (name, r) in self.restarts.iter_mut() {
            if matches!(r.step, RestartStep::Waiting { until } if until <= now.mono) {
                r.step = RestartStep::Spawning;
                out.push(Output::Spawn { name: name.clone() });
            }
        }
    }

    pub(super) fn launch(&mut self, ticket: u64, now: Now, out: &mut Vec<Output>) {
        if self.job.is_some() {
            out.push(Output::Done { ticket, result: Err(OperatorError::Busy(self.state().name().into())) });
            return;
        }
        let mut job = Job {
            ticket: Some(ticket),
            transition: None,
            step: Step::Launching,
            batch: Batch::default(),
            joining: BTreeMap::new(),
        };
        for c in &self.file.components {
            job.joining.insert(c.name.clone(), now.mono + self.config.timeout);
            out.push(Output::Spawn { name: c.name.clone() });
        }
        self.job = Some(job);
        self.advance(now, out);
    }

    pub(super) fn shutdown(&mut self, ticket: u64, now: Now, out: &mut Vec<Output>) {
        let closing = || OperatorError::Setup("the operator is shutting down".into());
        if let Some(job) = self.job.take() {
            self.end_job(job, Err(closing()), out);
        }
        for (t, _) in std::mem::take(&mut self.queue) {
            out.push(Output::Done { ticket: t, result: Err(closing()) });
        }
        self.restarts.clear();
        for p in std::mem::take(&mut self.pending).into_values() {
            if let Owner::Live(LiveSet { ticket, .. }) = p.owner {
                out.push(Output::Done { ticket, result: Err(closing()) });
            }
        }
        let mut job = Job {
            ticket: Some(ticket),
            transition: None,
            step: Step::ShuttingDown,
            batch: Batch::default(),
            joining: BTreeMap::new(),
        };
        let names: Vec<String> = self.file.components.iter().rev().map(|c| c.name.clone()).collect();
        for name in names {
            if self.views[&name].alive {
                self.send_for(&mut job.batch, &name, Command::Reset, self.config.shutdown_timeout, now, out);
            }
        }
        self.job = Some(job);
        self.advance(now, out);
    }

    pub(super) fn request(&mut self, ticket: u64, transition: Transition, now: Now, out: &mut Vec<Output>) {
        if let Some(job) = &self.job {
            let under_way = job
                .transition
                .map_or(if matches!(job.step, Step::ShuttingDown) { "shutdown" } else { "launch" }, |t| {
                    t.phase().name()
                });
            out.push(Output::Done { ticket, result: Err(OperatorError::Busy(under_way.into())) });
            return;
        }
        if !self.restarts.is_empty() {
            // A component is being brought back: the transition waits for it.
            self.queue.push_back((ticket, transition));
            return;
        }
        self.begin(Some(ticket), transition, Vec::new(), now, out);
    }

    /// Begins a transition (`errors`: why a stop was asked for by a policy).
    pub(super) fn begin(
        &mut self,
        ticket: Option<u64>,
        t: Transition,
        errors: Vec<String>,
        now: Now,
        out: &mut Vec<Output>,
    ) {
        let state = self.state();
        if !t.allowed_in(state) {
            let e = OperatorError::IllegalTransition { command: t.name().into(), state: state.name().into() };
            if let Some(ticket) = ticket {
                out.push(Output::Done { ticket, result: Err(e) });
            }
            return;
        }
        if matches!(t, Transition::Reset) {
            // A reset gives every component its restarts back.
            for v in self.views.values_mut() {
                v.recent_restarts = 0;
            }
        }
        let step = match t {
            Transition::Configure => {
                self.results.clear();
                match self.file.configure_order() {
                    Ok(order) => Step::Configuring { order, next: 0 },
                    Err(e) => {
                        if let Some(ticket) = ticket {
                            out.push(Output::Done { ticket, result: Err(OperatorError::Setup(e)) });
                        }
                        return;
                    }
                }
            }
            Transition::Start { run } => Step::Opening { requested: run },
            Transition::Pause => {
                Step::Staged { verb: Verb::Pause, stages: self.file.stages(false), stage: 0, first_error: None }
            }
            Transition::Resume => {
                Step::Staged { verb: Verb::Resume, stages: self.file.stages(true), stage: 0, first_error: None }
            }
            Transition::Stop => match self.run.filter(|_| self.run_open()) {
                // A paused source holds the fragments of events triggered before the pause, which
                // the builders wait for: it resumes first (the trigger stays paused).
                Some(run)
                    if state == SystemState::Paused
                        && self.file.components.iter().any(|c| c.role == daqflow_component::Role::Trigger) =>
                {
                    self.drain_throttled_writers(now, out);
                    Step::ReadingOut { run, stage: 0, errors }
                }
                Some(run) => {
                    self.drain_throttled_writers(now, out);
                    Step::Stopping { run, stage: 0, summaries: BTreeMap::new(), errors }
                }
                None => {
                    self.target = SystemState::Configured;
                    if let Some(ticket) = ticket {
                        let e = OperatorError::IllegalTransition {
                            command: "stop".into(),
                            state: "Configured (no run)".into(),
                        };
                        out.push(Output::Done { ticket, result: Err(e) });
                    }
                    return;
                }
            },
            Transition::Reset => match self.run.filter(|_| self.run_open()) {
                Some(run) => {
                    out.push(self.close_run(run, BTreeMap::new(), vec!["reset during the run".into()]));
                    Step::Closing { then: AfterClose::Reset }
                }
                None => Step::Respawning,
            },
        };
        tracing::info!("{} of the system begins", t.name());
        let mut job = Job { ticket, transition: Some(t), step, batch: Batch::default(), joining: BTreeMap::new() };
        if let Step::Opening { requested } = job.step {
            out.push(Output::OpenRun { requested });
        }
        if matches!(job.step, Step::Respawning) {
            self.respawn_dead(&mut job, now, out);
        }
        self.job = Some(job);
        self.advance(now, out);
    }

    /// Reset: the processes that died are started again first.
    pub(super) fn respawn_dead(&mut self, job: &mut Job, now: Now, out: &mut Vec<Output>) {
        for c in &self.file.components {
            if !self.views[&c.name].alive {
                job.joining.insert(c.name.clone(), now.mono + self.config.timeout);
                out.push(Output::Spawn { name: c.name.clone() });
            }
        }
    }

    /// Takes the job's next steps while nothing is awaited.
    pub(super) fn advance(&mut self, now: Now, out: &mut Vec<Output>) {
        let Some(mut job) = self.job.take() else { return };
        loop {
            if !job.batch.waiting.is_empty() || !job.joining.is_empty() {
                self.job = Some(job);
                return;
            }
            match self.step(&mut job, now, out) {
                Flow::Continue => {}
                Flow::Wait => {
                    self.job = Some(job);
                    return;
                }
                Flow::Finished(result) => {
                    self.end_job(job, result, out);
                    return;
                }
            }
        }
    }

    /// One step of the job: takes the replies of the last batch, sends the next one.
    pub(super) fn step(&mut self, job: &mut Job, now: Now, out: &mut Vec<Output>) -> Flow {
        let replies = std::mem::take(&mut job.batch.replies);
        match &job.step {
            Step::Launching | Step::ShuttingDown => Flow::Finished(Ok(TransitionResult::Done)),
            Step::Configuring { .. } => self.configuring(job, replies, now, out),
            Step::Undoing { .. } => self.undoing(job, replies, now, out),
            Step::Opening { .. } | Step::Closing { .. } => Flow::Wait,
            Step::Starting { .. } => self.starting(job, replies, now, out),
            Step::Unwinding { .. } => self.unwinding(job, replies, now, out),
            Step::Staged { .. } => self.staged(job, replies, now, out),
            Step::ReadingOut { .. } => self.reading_out(job, replies, now, out),
            Step::Stopping { .. } => self.stopping(job, replies, now, out),
            Step::Respawning => {
                // After respawning, everything is reset.
                job.step =
                    Step::Staged { verb: Verb::Reset, stages: self.file.stages(false), stage: 0, first_error: None };
                Flow::Continue
            }
        }
    }

    /// Configure, one component after the other in the configure order; a failure undoes what
    /// was configured.
    fn configuring(&mut self, job: &mut Job, replies: Replies, now: Now, out: &mut Vec<Output>) -> Flow {
        let timeout = self.config.timeout;
        let Step::Configuring { order, next } = &mut job.step else {
            unreachable!("`configuring` runs for Step::Configuring")
        };
        for (name, r) in replies {
            match r {
                Ok(Answer::Info(info)) => {
                    self.results.insert(name, Value::Object(info));
                }
                Ok(_) => {
                    self.results.insert(name, json!({}));
                }
                Err(e) => {
                    self.target = SystemState::Initial;
                    // One that did not answer is told to reset without waiting for
                    // it; one the request never reached has nothing to undo.
                    let (silent, unreached) = match &e {
                        OperatorError::Component { component, reason, .. } if reason.starts_with("no answer") => {
                            (Some(component.clone()), None)
                        }
                        OperatorError::Component { component, reason, .. } if reason == "not on the control plane" => {
                            (None, self.spec_index(component))
                        }
                        _ => (None, None),
                    };
                    let configured = order[..*next].iter().copied().filter(|i| Some(*i) != unreached).collect();
                    job.step = Step::Undoing { failure: e, configured, silent, stage: 0, errors: Vec::new() };
                    return Flow::Continue;
                }
            }
        }
        let Some(&i) = order.get(*next) else {
            self.target = SystemState::Configured;
            let infos: BTreeMap<String, Info> =
                self.results.iter().map(|(k, v)| (k.clone(), v.as_object().cloned().unwrap_or_default())).collect();
            return Flow::Finished(Ok(TransitionResult::Configured(infos)));
        };
        *next += 1;
        let spec = self.file.components[i].clone();
        match self.resolved_params(&spec) {
            Ok(config) => {
                self.configured.insert(spec.name.clone(), config.clone());
                self.send_for(
                    &mut job.batch,
                    &spec.name,
                    Command::Configure { config: Some(config) },
                    timeout,
                    now,
                    out,
                );
                Flow::Continue
            }
            Err(e) => {
                self.target = SystemState::Initial;
                let configured = order[..*next - 1].to_vec();
                job.step = Step::Undoing { failure: e, configured, silent: None, stage: 0, errors: Vec::new() };
                Flow::Continue
            }
        }
    }

    /// Reset what a failed configure had configured, stage by stage.
    fn undoing(&mut self, job: &mut Job, replies: Replies, now: Now, out: &mut Vec<Output>) -> Flow {
        let timeout = self.config.timeout;
        let Step::Undoing { failure, configured, silent, stage, errors } = &mut job.step else {
            unreachable!("`undoing` runs for Step::Undoing")
        };
        for (name, r) in replies {
            if let Err(e) = r {
                errors.push(format!("{name}: {e}"));
            }
        }
        let stages = self.file.stages(false);
        let Some(idx) = stages.get(*stage) else {
            let failure = std::mem::replace(failure, OperatorError::Setup(String::new()));
            let names: Vec<String> =
                self.names(configured).into_iter().filter(|n| Some(n) != silent.as_ref()).collect();
            let silent = silent.as_ref().map(|n| (n.as_str(), self.config.logs.join(format!("{n}.log"))));
            let silent = silent.as_ref().map(|(n, log)| (*n, log.as_path()));
            return Flow::Finished(Err(undone(failure, &names, errors, silent)));
        };
        *stage += 1;
        for &i in idx.iter().filter(|i| configured.contains(i)) {
            let name = self.file.components[i].name.clone();
            if !self.views[&name].alive {
                continue;
            }
            if silent.as_deref() == Some(name.as_str()) {
                // It takes the reset once it is done with the configure it did not
                // answer in time: nobody waits for that.
                self.send(&name, Command::Reset, Owner::Late, timeout, now, out);
            } else {
                self.send_for(&mut job.batch, &name, Command::Reset, timeout, now, out);
            }
        }
        Flow::Continue
    }

    /// Start, stage by stage; a failure unwinds what was started.
    fn starting(&mut self, job: &mut Job, replies: Replies, now: Now, out: &mut Vec<Output>) -> Flow {
        let timeout = self.config.timeout;
        let Step::Starting { run, stage, started } = &mut job.step else {
            unreachable!("`starting` runs for Step::Starting")
        };
        let run = *run;
        let mut failure = None;
        for (name, r) in replies {
            match r {
                Ok(_) => started.extend(self.spec_index(&name)),
                Err(e) => {
                    tracing::error!("start of {name} failed: {e}");
                    failure.get_or_insert(e);
                }
            }
        }
        if let Some(failure) = failure {
            let started = std::mem::take(started);
            job.step = Step::Unwinding { run, stage: 0, started, failure, summaries: BTreeMap::new() };
            return Flow::Continue;
        }
        let stages = self.file.stages(true);
        let Some(names) = stages.get(*stage).map(|s| self.names(s)) else {
            self.target = SystemState::Running;
            tracing::info!(run, "run started");
            return Flow::Finished(Ok(TransitionResult::Started(run)));
        };
        *stage += 1;
        for name in names {
            self.send_for(&mut job.batch, &name, Command::Start { run }, timeout, now, out);
        }
        Flow::Continue
    }

    /// Stop what a failed start had started, stage by stage, then close the run.
    fn unwinding(&mut self, job: &mut Job, replies: Replies, now: Now, out: &mut Vec<Output>) -> Flow {
        let stop_timeout = self.config.stop_timeout;
        let Step::Unwinding { run, stage, started, failure, summaries } = &mut job.step else {
            unreachable!("`unwinding` runs for Step::Unwinding")
        };
        for (name, r) in replies {
            if let Ok(Answer::Summary(s)) = r {
                summaries.insert(name, s);
            }
        }
        let stages = self.file.stages(false);
        let Some(stage_idx) = stages.get(*stage) else {
            let (run, summaries) = (*run, std::mem::take(summaries));
            let failure = std::mem::replace(failure, OperatorError::Setup(String::new()));
            out.push(self.close_run(run, summaries, vec![failure.to_string()]));
            job.step = Step::Closing { then: AfterClose::StartFailed(failure) };
            return Flow::Wait;
        };
        *stage += 1;
        let names = self.names(&stage_idx.iter().copied().filter(|i| started.contains(i)).collect::<Vec<_>>());
        for name in names {
            self.send_for(&mut job.batch, &name, Command::Stop { last_event: None }, stop_timeout, now, out);
        }
        Flow::Continue
    }

    /// Pause, resume or reset, stage by stage.
    fn staged(&mut self, job: &mut Job, replies: Replies, now: Now, out: &mut Vec<Output>) -> Flow {
        let timeout = self.config.timeout;
        let Step::Staged { verb, stages, stage, first_error } = &mut job.step else {
            unreachable!("`staged` runs for Step::Staged")
        };
        for (_, r) in replies {
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        }
        let verb = *verb;
        let Some(mut names) = stages.get(*stage).map(|s| self.names(s)) else {
            let failed = first_error.take();
            self.target = match (verb, failed.is_some()) {
                (Verb::Pause, false) | (Verb::Resume, true) => SystemState::Paused,
                (Verb::Pause, true) | (Verb::Resume, false) => SystemState::Running,
                _ => SystemState::Initial,
            };
            return Flow::Finished(failed.map_or(Ok(TransitionResult::Done), Err));
        };
        *stage += 1;
        names.retain(|n| !self.dropped.contains_key(n));
        let command = match verb {
            Verb::Pause => Command::Pause,
            Verb::Resume => Command::Resume,
            _ => Command::Reset,
        };
        for name in names {
            self.send_for(&mut job.batch, &name, command.clone(), timeout, now, out);
        }
        Flow::Continue
    }

    /// Resume the paused components (not the trigger) to read out what was triggered before a
    /// stop.
    fn reading_out(&mut self, job: &mut Job, replies: Replies, now: Now, out: &mut Vec<Output>) -> Flow {
        let timeout = self.config.timeout;
        let Step::ReadingOut { run, stage, errors } = &mut job.step else {
            unreachable!("`reading_out` runs for Step::ReadingOut")
        };
        for (name, r) in replies {
            if let Err(e) = r {
                errors.push(format!("{name}: resuming to read out what was triggered: {e}"));
            }
        }
        let stages = self.file.stages(true);
        let Some(idx) = stages.get(*stage) else {
            let (run, errors) = (*run, std::mem::take(errors));
            job.step = Step::Stopping { run, stage: 0, summaries: BTreeMap::new(), errors };
            return Flow::Continue;
        };
        *stage += 1;
        for &i in idx {
            let spec = &self.file.components[i];
            let v = &self.views[&spec.name];
            if spec.role == daqflow_component::Role::Trigger
                || self.dropped.contains_key(&spec.name)
                || !v.alive
                || v.state != Some(ComponentState::Paused)
            {
                continue;
            }
            let name = spec.name.clone();
            self.send_for(&mut job.batch, &name, Command::Resume, timeout, now, out);
        }
        Flow::Continue
    }

    /// Stop, stage by stage, each with its `stop_arg`; then close the run.
    fn stopping(&mut self, job: &mut Job, replies: Replies, now: Now, out: &mut Vec<Output>) -> Flow {
        let stop_timeout = self.config.stop_timeout;
        let Step::Stopping { run, stage, summaries, errors } = &mut job.step else {
            unreachable!("`stopping` runs for Step::Stopping")
        };
        for (name, r) in replies {
            match r {
                Ok(Answer::Summary(s)) => {
                    summaries.insert(name, s);
                }
                Ok(_) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        let stages = self.file.stages(false);
        let Some(idx) = stages.get(*stage) else {
            let (run, summaries, errors) = (*run, std::mem::take(summaries), std::mem::take(errors));
            out.push(self.close_run(run, summaries, errors));
            job.step = Step::Closing { then: AfterClose::Stopped };
            return Flow::Wait;
        };
        *stage += 1;
        let refs = self.references(summaries);
        for &i in idx {
            let spec = &self.file.components[i];
            let v = &self.views[&spec.name];
            let in_run =
                matches!(v.state, Some(ComponentState::Running | ComponentState::Paused | ComponentState::Error));
            if self.dropped.contains_key(&spec.name) {
                continue; // the run went on without it: its death is not the stop's
            }
            if !v.alive || !in_run {
                if !v.alive && v.state.is_some() {
                    errors.push(format!("{}: not running ({})", spec.name, v.exit.clone().unwrap_or_default()));
                }
                continue;
            }
            let last_event = match &spec.stop_arg {
                None => None,
                Some(a) => match resolve(&toml::Value::String(a.clone()), &refs) {
                    Ok(toml::Value::Integer(n)) => u64::try_from(n).ok(),
                    Ok(toml::Value::String(s)) => s.trim().parse::<u64>().ok(),
                    Ok(_) => None,
                    Err(e) => {
                        errors.push(format!("{}: stop_arg: {e}", spec.name));
                        None
                    }
                },
            };
            let name = spec.name.clone();
            self.send_for(&mut job.batch, &name, Command::Stop { last_event }, stop_timeout, now, out);
        }
        Flow::Continue
    }

    pub(super) fn names(&self, idx: &[usize]) -> Vec<String> {
        idx.iter().map(|&i| self.file.components[i].name.clone()).collect()
    }

    /// Ends a job: its answer, the last error.
    pub(super) fn end_job(&mut self, job: Job, result: Result<TransitionResult, OperatorError>, out: &mut Vec<Output>) {
        // Requests still awaited by the job are forgotten (their replies will find nothing).
        self.pending.retain(|_, p| p.owner != Owner::Job);
        if let Some(t) = job.transition {
            match &result {
                Ok(_) => tracing::info!("{} of the system done: {}", t.name(), self.state()),
                // The caller's mistake (a run number used before): no error of the system's.
                Err(e @ OperatorError::Invalid(_)) => tracing::warn!("{} of the system refused: {e}", t.name()),
                Err(e) => tracing::error!("{} of the system failed: {e}", t.name()),
            }
            if let Err(e) = &result {
                if !matches!(e, OperatorError::Invalid(_)) {
                    self.last_error = Some(e.to_string());
                }
            } else if let Ok(TransitionResult::Stopped(s)) = &result {
                if s.error.is_some() {
                    self.last_error = s.error.clone();
                }
            } else if matches!(t, Transition::Start { .. }) {
                self.last_error = None;
            }
        }
        if let Some(ticket) = job.ticket {
            out.push(Output::Done { ticket, result });
        }
    }
}

/// The error of a configure that failed with `failure` and was undone: the components it had
/// configured (`reset`) were reset, so that the system is Initial again (`errors`: the resets
/// that failed too); `silent`: the component that did not answer, told to reset too, and its
/// log.
pub(super) fn undone(
    failure: OperatorError,
    reset: &[String],
    errors: &[String],
    silent: Option<(&str, &std::path::Path)>,
) -> OperatorError {
    let told = silent.map(|(n, _)| format!("{n} told to reset once it is done")).unwrap_or_default();
    let and = if told.is_empty() { String::new() } else { format!(", {told}") };
    let undo = match (reset.is_empty(), errors.is_empty()) {
        (true, _) if told.is_empty() => "nothing was configured yet: configure again".to_owned(),
        (true, _) => format!("configure undone: {told}; configure again"),
        (false, true) => format!("configure undone: {} reset to Initial{and}; configure again", reset.join(", ")),
        (false, false) => format!(
            "configure undone: {} reset{and}, but {}; reset the system before configuring again",
            reset.join(", "),
            errors.join("; ")
        ),
    };
    let see = silent.map(|(_, log)| format!("; see {}", log.display())).unwrap_or_default();
    match failure {
        OperatorError::Component { component, command, reason } => {
            OperatorError::Component { component, command, reason: format!("{reason}{see} ({undo})") }
        }
        OperatorError::Invalid(e) => OperatorError::Invalid(format!("{e} ({undo})")),
        OperatorError::Setup(e) => OperatorError::Setup(format!("{e} ({undo})")),
        other => other,
    }
}
