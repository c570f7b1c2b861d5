//! What goes to the components and what comes back: requests and their replies, statuses, the processes' spawns and exits.

use super::*;

impl Sequencer {
    pub(super) fn send(
        &mut self,
        name: &str,
        command: Command,
        owner: Owner,
        timeout: Duration,
        now: Now,
        out: &mut Vec<Output>,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let request = Request { id, reply_to: Some(self.config.reply_to.clone()), command };
        let verb = request.command.verb();
        self.pending.insert(
            id,
            Pending {
                name: name.to_owned(),
                verb,
                request: request.clone(),
                timeout,
                deadline: now.mono + timeout,
                resend_at: None,
                owner,
            },
        );
        if self.pending.values().any(|p| p.name == name && p.resend_at.is_some()) {
            // An earlier request to it waits to be delivered again (it was off the control
            // plane): this one goes after it, so that it takes them in order.
            if let Some(p) = self.pending.get_mut(&id) {
                p.resend_at = Some(now.mono);
            }
        } else {
            out.push(Output::Send { to: name.to_owned(), request });
        }
        id
    }

    pub(super) fn send_for(
        &mut self,
        batch: &mut Batch,
        name: &str,
        command: Command,
        timeout: Duration,
        now: Now,
        out: &mut Vec<Output>,
    ) {
        let id = self.send(name, command, Owner::Job, timeout, now, out);
        batch.waiting.insert(id, name.to_owned());
    }

    /// Ends request `id` with `result` and lets its owner go on.
    pub(super) fn finish_request(
        &mut self,
        id: u64,
        result: Result<Answer, OperatorError>,
        now: Now,
        out: &mut Vec<Output>,
    ) {
        let Some(p) = self.pending.remove(&id) else { return };
        match p.owner {
            Owner::Job => {
                let Some(job) = self.job.as_mut() else { return };
                if job.batch.waiting.remove(&id).is_some() {
                    job.batch.replies.push((p.name, result));
                    if job.batch.waiting.is_empty() {
                        self.advance(now, out);
                    }
                }
            }
            Owner::Late => {
                if let Err(e) = result {
                    tracing::warn!("{e}");
                }
            }
            Owner::Restart(name) => self.restart_step_done(&name, result, now, out),
            Owner::Live(set) => self.live_done(&p.name, set, result, now, out),
        }
    }

    pub(super) fn fail_request(&mut self, id: u64, reason: String, now: Now, out: &mut Vec<Output>) {
        let Some(p) = self.pending.get(&id) else { return };
        let e = OperatorError::Component { component: p.name.clone(), command: p.verb.name().into(), reason };
        self.finish_request(id, Err(e), now, out);
    }

    /// Takes a status; whether the component joined the control plane with it. Only a status
    /// of the incarnation launched last is taken (others are logged once each), and of those
    /// one newer than the last taken ([`ComponentStatus::is_newer_than`]: a number far ahead
    /// of the real ones, forged or corrupted, does not hide them).
    pub(super) fn take_status(&mut self, s: &ComponentStatus) -> bool {
        let Some(v) = self.views.get_mut(&s.name) else { return false };
        if !v.alive || Some(s.pid) == v.stale_pid {
            return false;
        }
        if s.incarnation != v.incarnation {
            if !v.foreign.contains(&s.incarnation) && v.foreign.len() < FOREIGN_LOGGED {
                v.foreign.push(s.incarnation);
                let shown = |i: Option<u64>| i.map_or_else(|| "none".to_owned(), |i| i.to_string());
                tracing::warn!(
                    component = %s.name,
                    "ignoring the statuses of {} that name incarnation {} (pid {}): the operator launched incarnation {}",
                    s.name,
                    shown(s.incarnation),
                    s.pid,
                    shown(v.incarnation)
                );
            }
            return false;
        }
        if v.state.is_some() && !s.is_newer_than(v.seq) {
            return false; // older than what we have
        }
        if v.state.is_some() && s.seq > v.seq.saturating_add(daqflow_component::SEQ_WINDOW) && !v.jump_logged {
            v.jump_logged = true;
            tracing::warn!(
                component = %s.name,
                "a status of {} jumps from number {} to {}: taken, but it does not hide the next real ones (logged once)",
                s.name,
                v.seq,
                s.seq
            );
        }
        let was = v.joined();
        v.state = Some(s.state.into());
        v.run = s.run;
        v.since_ms = s.since_ms;
        v.error = s.error.clone();
        v.pid = Some(s.pid);
        v.cpus = s.cpus.clone();
        v.seq = s.seq;
        !was && v.joined()
    }

    pub(super) fn on_status(&mut self, s: ComponentStatus, now: Now, out: &mut Vec<Output>) {
        if self.take_status(&s) {
            self.joined(&s.name, now, out);
        }
    }

    pub(super) fn joined(&mut self, name: &str, now: Now, out: &mut Vec<Output>) {
        if let Some(job) = self.job.as_mut()
            && job.joining.remove(name).is_some()
            && job.joining.is_empty()
        {
            self.advance(now, out);
        }
        if let Some(r) = self.restarts.get(name)
            && matches!(r.step, RestartStep::Joining { .. })
        {
            self.restart_step_done(name, Ok(Answer::Nothing), now, out);
        }
    }

    pub(super) fn on_reply(&mut self, r: CommandReply, now: Now, out: &mut Vec<Output>) {
        let Some(p) = self.pending.get(&r.id) else {
            tracing::debug!(id = r.id, component = %r.status.name, "a reply nobody waits for (late, or not ours)");
            return;
        };
        if p.name != r.status.name || p.verb != r.command {
            tracing::warn!(
                id = r.id,
                "a reply from {} to {} does not match request {} ({} to {})",
                r.status.name,
                r.command,
                r.id,
                p.verb,
                p.name
            );
            return;
        }
        let (id, name, verb) = (r.id, p.name.clone(), p.verb);
        // The reply's status is the component's right after the command, maybe newer than
        // what `NAME/state` brought so far.
        if self.take_status(&r.status) {
            self.joined(&name, now, out);
        }
        let result = r.result().map_err(|reason| OperatorError::Component {
            component: name,
            command: verb.name().into(),
            reason: reason.to_string(),
        });
        self.finish_request(id, result, now, out);
    }

    pub(super) fn on_spawned(&mut self, name: &str, pid: u32, incarnation: Option<u64>, now: Now) {
        if let Some(v) = self.views.get_mut(name) {
            v.alive = true;
            v.exit = None;
            v.pid = Some(pid);
            v.state = None;
            v.seq = 0;
            v.incarnation = incarnation;
            v.foreign.clear();
            v.jump_logged = false;
            v.since_ms = now.wall_ms;
        }
        if let Some(r) = self.restarts.get_mut(name)
            && matches!(r.step, RestartStep::Spawning)
        {
            r.step = RestartStep::Joining { deadline: now.mono + self.config.timeout };
        }
    }

    pub(super) fn on_spawn_failed(&mut self, name: &str, error: String, now: Now, out: &mut Vec<Output>) {
        tracing::error!(component = %name, "starting {name} failed: {error}");
        if self.job.as_ref().is_some_and(|j| j.joining.contains_key(name)) {
            self.fail_join(name, error.clone(), out);
        }
        if self.restarts.contains_key(name) {
            self.restart_failed(name, error, now, out);
        }
    }

    pub(super) fn on_exited(&mut self, name: &str, status: String, now: Now, out: &mut Vec<Output>) {
        let Some(v) = self.views.get_mut(name) else { return };
        v.stale_pid = v.pid;
        v.alive = false;
        v.exit = Some(status.clone());
        v.state = Some(ComponentState::Dead);
        v.since_ms = now.wall_ms;
        tracing::error!(component = %name, "the process of {name} ended: {status}");
        let ids: Vec<u64> = self.pending.iter().filter(|(_, p)| p.name == name).map(|(&id, _)| id).collect();
        for id in ids {
            self.fail_request(id, format!("the process ended ({status})"), now, out);
        }
        let see =
            format!("the process ended ({status}); see {}", self.config.logs.join(format!("{name}.log")).display());
        if self.job.as_ref().is_some_and(|j| j.joining.contains_key(name)) {
            self.fail_join(name, see.clone(), out);
        }
        if self.restarts.get(name).is_some_and(|r| !matches!(r.step, RestartStep::Commanding(_))) {
            self.restart_failed(name, see, now, out);
        }
    }

    /// A process the job waits for did not join: the job fails.
    pub(super) fn fail_join(&mut self, name: &str, reason: String, out: &mut Vec<Output>) {
        let Some(job) = self.job.take() else { return };
        let command = if job.transition.is_some() { "reset" } else { "launch" };
        let e = OperatorError::Component { component: name.to_owned(), command: command.into(), reason };
        self.end_job(job, Err(e), out);
    }

    /// After a stall of the operator's own: every deadline it waits for moves by `gap`.
    pub(super) fn forgive(&mut self, gap: Duration) {
        for p in self.pending.values_mut() {
            p.deadline += gap;
            if let Some(t) = p.resend_at.as_mut() {
                *t += gap;
            }
        }
        if let Some(job) = self.job.as_mut() {
            for d in job.joining.values_mut() {
                *d += gap;
            }
        }
        for r in self.restarts.values_mut() {
            if let RestartStep::Joining { deadline } = &mut r.step {
                *deadline += gap;
            }
        }
    }
}
