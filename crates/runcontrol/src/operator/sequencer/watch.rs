//! What the sequencer watches while a run goes on: full disks, failed components and their restarts.

use super::*;

impl Sequencer {
    /// A data writer throttled by its disk for longer than `disk_full_stop_s` in a running
    /// run: its disk is full for good, and the run stops (the normal stop, producers first)
    /// with the error `disk full: …`, which the run's record keeps. A writer whose kind
    /// declares the live key [`DRAIN_INTO_RESERVE_KEY`] (the recorder) is first told to drain
    /// into its disk's reserve, so that what is in flight towards it (in ET, in the builder
    /// units) drains while the producers stop.
    pub(super) fn check_disks(&mut self, now: Now, out: &mut Vec<Output>) {
        let limit = self.file.system.disk_full_stop_s;
        if limit <= 0.0 || !self.run_open() || self.state() != SystemState::Running {
            return;
        }
        let mut full = Vec::new();
        for spec in &self.file.components {
            if !matches!(spec.role, daqflow_component::Role::Recorder | daqflow_component::Role::Builder) {
                continue;
            }
            let v = &self.views[&spec.name];
            let detail = &v.stats.detail;
            let throttled_for = detail["throttled_for_s"].as_f64().unwrap_or(0.0);
            // Counters of this run only (a writer's last counters of the run before may say it
            // ended throttled).
            if !v.alive || v.stats.run != self.run || detail["throttled"] != true || throttled_for < limit {
                continue;
            }
            let directory = spec
                .data_files
                .and_then(|files| self.resolved_params(spec).ok().and_then(|p| files(&p)))
                .map(|d| format!(" of {}", d.display()))
                .unwrap_or_default();
            let space = match (detail["disk_free_bytes"].as_u64(), detail["disk_used_pct"].as_f64()) {
                (Some(free), Some(used)) => format!(" ({:.1} MiB free, {used:.1} % used)", free as f64 / 1048576.0),
                _ => String::new(),
            };
            let drains = if self.has_reserve(spec) {
                format!(
                    "; `{}` was told to write what was in flight into its disk's reserve above throttle_high_pct",
                    spec.name
                )
            } else {
                String::new()
            };
            full.push(format!(
                "disk full: `{}` was throttled by the filesystem{directory}{space} for {throttled_for:.0} s, longer \
                 than disk_full_stop_s = {limit}; the run was stopped, producers first{drains}",
                spec.name
            ));
        }
        if full.is_empty() {
            return;
        }
        for why in &full {
            tracing::error!("{why}");
        }
        self.begin(None, Transition::Stop, full, now, out);
    }

    /// Whether `spec` is a data writer whose kind declares the live key
    /// [`DRAIN_INTO_RESERVE_KEY`] while Running: its disk has a reserve above its high mark.
    pub(super) fn has_reserve(&self, spec: &ComponentSpec) -> bool {
        let published = self.published.get(&spec.name);
        spec.schema
            .as_deref()
            .or(published.map(|s| &**s))
            .and_then(|s| s.key_named(DRAIN_INTO_RESERVE_KEY))
            .is_some_and(|k| k.live.contains(&daqflow_component::State::Running))
    }

    /// At the start of a run's stop: every data writer throttled by its disk now (its
    /// counters of this run say so) whose disk has a reserve ([`Self::has_reserve`]) is told
    /// to write into it (`DRAIN_INTO_RESERVE_KEY = true`), before the producers' stop, so that
    /// what is in flight towards it (in ET, in the builder units) drains while they stop.
    /// Nobody waits for the answer (a refusal is logged); it reaches the writer before its stop.
    pub(super) fn drain_throttled_writers(&mut self, now: Now, out: &mut Vec<Output>) {
        let mut drain = Vec::new();
        for spec in &self.file.components {
            let v = &self.views[&spec.name];
            if v.alive && v.stats.run == self.run && v.stats.detail["throttled"] == true && self.has_reserve(spec) {
                drain.push(spec.name.clone());
            }
        }
        for name in drain {
            tracing::warn!(
                component = %name,
                "{name}.{DRAIN_INTO_RESERVE_KEY} = true: the run stops while {name} is throttled by its disk; what is \
                 in flight goes into its disk's reserve above throttle_high_pct"
            );
            let command = Command::Set { key: DRAIN_INTO_RESERVE_KEY.to_owned(), value: Value::Bool(true) };
            self.send(&name, command, Owner::Late, self.config.timeout, now, out);
        }
    }

    pub(super) fn check_failures(&mut self, now: Now, out: &mut Vec<Output>) {
        let mut fresh: Vec<(String, Policy, String)> = Vec::new();
        for c in &self.file.components {
            if self.restarts.contains_key(&c.name) || self.dropped.contains_key(&c.name) {
                continue;
            }
            let v = &self.views[&c.name];
            let failing = (!v.alive && v.state.is_some()) || v.state == Some(ComponentState::Error);
            if !failing {
                continue;
            }
            let key = v.since_ms ^ (u64::from(v.restarts) << 48) ^ u64::from(v.alive);
            if self.handled.get(&c.name) == Some(&key) {
                continue;
            }
            let why = v.exit.clone().or(v.error.clone()).unwrap_or_else(|| "failed".into());
            fresh.push((c.name.clone(), c.policy, why));
        }
        if fresh.is_empty() {
            return;
        }
        let in_run = matches!(self.target, SystemState::Running | SystemState::Paused);
        let cap = self.file.system.restart_max;
        // What each failure leads to: a restart, or the component is lost to the run (then the
        // run goes on without it, or stops).
        let mut restart = Vec::new();
        let mut lost = Vec::new();
        for (name, policy, why) in &fresh {
            match policy {
                Policy::Restart if self.views[name].recent_restarts < cap => restart.push((name.clone(), why.clone())),
                Policy::Restart => {
                    lost.push((name.clone(), format!("{why}; not restarted again: {cap} restarts, the cap")))
                }
                Policy::Expendable | Policy::Stop => lost.push((name.clone(), why.clone())),
            }
        }
        let (dropped, stop_reasons) = if in_run { self.lose(&lost) } else { (Vec::new(), Vec::new()) };
        // The run is going to stop — a component it cannot go on without failed, or a restart
        // failed — once the restarts under way end: nothing more is restarted into it (a
        // restart that fails again and again would otherwise keep the stop waiting for ever).
        let stopping = !stop_reasons.is_empty() || (!self.restart_failures.is_empty() && self.run_open());
        if stopping && !self.restarts.is_empty() {
            return;
        }
        for (name, ..) in &fresh {
            let v = &self.views[name];
            let key = v.since_ms ^ (u64::from(v.restarts) << 48) ^ u64::from(v.alive);
            self.handled.insert(name.clone(), key);
        }
        if !stop_reasons.is_empty() {
            for why in &stop_reasons {
                tracing::error!("{why}; stopping the run");
            }
            self.begin(None, Transition::Stop, stop_reasons, now, out);
            return;
        }
        for (name, why) in dropped {
            tracing::warn!(component = %name, "{name} failed ({why}); the run goes on without it");
            self.dropped.insert(name, why);
        }
        for (name, why) in restart {
            self.restart_later(name, why, now, out);
        }
    }

    /// Components lost to the run (`name`, why): those the run goes on without (policy
    /// `expendable`, or a group that keeps its minimum), and the reasons to stop the run.
    pub(super) fn lose(&self, lost: &[(String, String)]) -> (Vec<(String, String)>, Vec<String>) {
        let mut dropped = Vec::new();
        let mut stop = Vec::new();
        let gone: Vec<&str> = lost.iter().map(|(n, _)| n.as_str()).collect();
        for (name, why) in lost {
            let spec = &self.file.components[self.spec_index(name).unwrap_or(0)];
            if let Some(g) = self.file.group_of(name) {
                let left =
                    g.members.iter().filter(|m| !self.dropped.contains_key(*m) && !gone.contains(&m.as_str())).count();
                if left >= g.min {
                    dropped.push((
                        name.clone(),
                        format!(
                            "{why} (group `{}` keeps {left} of {} members, its minimum is {})",
                            g.name,
                            g.members.len(),
                            g.min
                        ),
                    ));
                } else {
                    stop.push(format!(
                        "{name} failed: {why}; group `{}` has {left} of its {} members left, fewer than its minimum {}",
                        g.name,
                        g.members.len(),
                        g.min
                    ));
                }
            } else if spec.policy == Policy::Expendable {
                dropped.push((name.clone(), format!("{why} (expendable)")));
            } else {
                stop.push(format!("{name} failed: {why}"));
            }
        }
        (dropped, stop)
    }

    /// Restarts `name`: at once the first time since the last run began, then after a back-off
    /// that doubles each time.
    pub(super) fn restart_later(&mut self, name: String, why: String, now: Now, out: &mut Vec<Output>) {
        let in_run_now = self.run_open();
        let system = &self.file.system;
        let Some(v) = self.views.get_mut(&name) else { return };
        let delay = match v.recent_restarts {
            0 => 0.0,
            n => (system.restart_backoff_s * 2f64.powi(n.min(30) as i32 - 1)).min(system.restart_backoff_max_s),
        };
        v.restarts += 1;
        v.recent_restarts += 1;
        // The counters of the life that ended still count for the run; the new life publishes
        // its own from 0.
        let last = std::mem::take(&mut v.stats);
        v.samples.clear();
        if in_run_now {
            v.earlier.push(last);
        }
        let step = if delay > 0.0 {
            tracing::warn!(component = %name, "{name} failed ({why}); restarting it in {delay:.1} s (policy restart, restart {} of at most {})", v.recent_restarts, system.restart_max);
            RestartStep::Waiting { until: now.mono + Duration::from_secs_f64(delay) }
        } else {
            tracing::warn!(component = %name, "{name} failed ({why}); restarting it (policy restart, restart {} of at most {})", v.recent_restarts, system.restart_max);
            out.push(Output::Spawn { name: name.clone() });
            RestartStep::Spawning
        };
        self.restarts.insert(name, Restart { step, target: self.target, why });
    }

    /// The next step of a restart after `result`.
    pub(super) fn restart_step_done(
        &mut self,
        name: &str,
        result: Result<Answer, OperatorError>,
        now: Now,
        out: &mut Vec<Output>,
    ) {
        let Some(r) = self.restarts.get(name) else { return };
        let target = r.target;
        let done_verb = match (&r.step, result) {
            (_, Err(e)) => {
                self.restart_failed(name, e.to_string(), now, out);
                return;
            }
            (RestartStep::Joining { .. }, Ok(_)) => None,
            (RestartStep::Commanding(v), Ok(a)) => {
                if let (Verb::Configure, Answer::Info(info)) = (v, a) {
                    self.results.insert(name.to_owned(), Value::Object(info));
                }
                Some(*v)
            }
            (RestartStep::Spawning | RestartStep::Waiting { .. }, Ok(_)) => return,
        };
        // From Initial (a new process) to the system's state, by the components' table.
        let goal = match target {
            SystemState::Configured => State::Configured,
            SystemState::Running => State::Running,
            SystemState::Paused => State::Paused,
            _ => State::Initial,
        };
        let path = Verb::path(State::Initial, goal).unwrap_or_default();
        let next = match done_verb {
            None => path.first(),
            Some(done) => path.iter().skip_while(|v| **v != done).nth(1),
        };
        let command = match next.copied() {
            None => {
                self.restarts.remove(name);
                tracing::info!(component = %name, "{name} restarted and back in state {target}");
                return;
            }
            Some(Verb::Configure) => {
                let Some(i) = self.spec_index(name) else { return };
                match self.resolved_params(&self.file.components[i].clone()) {
                    Ok(config) => {
                        self.configured.insert(name.to_owned(), config.clone());
                        Command::Configure { config: Some(config) }
                    }
                    Err(e) => {
                        self.restart_failed(name, e.to_string(), now, out);
                        return;
                    }
                }
            }
            Some(Verb::Start) => Command::Start { run: self.run.unwrap_or(0) },
            Some(Verb::Pause) => Command::Pause,
            Some(Verb::Resume) => Command::Resume,
            Some(Verb::Stop) => Command::Stop { last_event: None },
            Some(Verb::Reset | Verb::Set) => Command::Reset,
        };
        if let Some(r) = self.restarts.get_mut(name) {
            r.step = RestartStep::Commanding(command.verb());
        }
        self.send(name, command, Owner::Restart(name.to_owned()), self.config.timeout, now, out);
    }

    pub(super) fn restart_failed(&mut self, name: &str, error: String, _now: Now, _out: &mut Vec<Output>) {
        let Some(r) = self.restarts.remove(name) else { return };
        self.pending.retain(|_, p| p.owner != Owner::Restart(name.to_owned()));
        tracing::error!(component = %name, "restarting {name} failed: {error}");
        if matches!(r.target, SystemState::Running | SystemState::Paused) {
            let why = format!("{} and could not be restarted: {error}", r.why);
            if self.file.group_of(name).is_none() {
                self.restart_failures.push(format!("{name} failed ({}) and could not be restarted: {error}", r.why));
            } else {
                let (dropped, stop) = self.lose(&[(name.to_owned(), why)]);
                for (_, why) in dropped {
                    tracing::warn!(component = %name, "the run goes on without {name}: {why}");
                    self.dropped.insert(name.to_owned(), why);
                }
                self.restart_failures.extend(stop);
            }
        }
    }
}
