//! The [`Component`] trait and the [`Driver`]: the state machine of the [crate docs](crate).

use crate::schema::Schema;
use crate::{Answer, Command, ComponentError, Info, Registry, State, Stats, Verb};

/// What a component does in each transition. Every hook but `start` and `stop` has a default
/// that does nothing, so a component implements only what it needs; the [`Driver`] checks the
/// state before calling, so a hook never sees an illegal transition.
pub trait Component: Send {
    /// Initial → Configured: check the configuration, bind listening sockets, open what the
    /// run needs. Returns what others need to know (e.g. `{"listen": "127.0.0.1:7101"}`); the
    /// operator can put these values into other components' parameters (`${name.listen}`).
    fn configure(&mut self) -> Result<Info, ComponentError> {
        Ok(Info::new())
    }
    /// Configured → Running: take run `run`.
    fn start(&mut self, run: u32) -> Result<(), ComponentError>;
    /// Running or Paused → Configured: end the run and return its summary, the final
    /// [`Stats`]. A source produces up to event `last_event` first.
    fn stop(&mut self, last_event: Option<u64>) -> Result<Stats, ComponentError>;
    /// Running → Paused.
    fn pause(&mut self) -> Result<(), ComponentError> {
        Ok(())
    }
    /// Paused → Running.
    fn resume(&mut self) -> Result<(), ComponentError> {
        Ok(())
    }
    /// Any → Initial: stop whatever runs, release everything.
    fn reset(&mut self) -> Result<(), ComponentError> {
        Ok(())
    }
    /// Live counters, published in `NAME/stats` once a second.
    fn stats(&self) -> Stats {
        Stats::default()
    }
    /// Why the component failed during the run, if it did; the driver then reports Error.
    fn failure(&self) -> Option<String> {
        None
    }
    /// Changes live parameter `key` to `value`. The [`Driver`] calls it only for a key the
    /// kind's [schema](crate::schema) declares live, in one of its states, with a value it
    /// checked by the same rule as the configuration (type and range). A value the component
    /// still cannot take is refused with an error that names the key; the component stays in
    /// its state and keeps the old value.
    fn set(&mut self, key: &str, value: &toml::Value) -> Result<(), ComponentError> {
        let _ = value;
        Err(ComponentError::Refused(format!("`{key}` cannot change after configure")))
    }
}

/// Deserializes a component's configuration table into its config struct, with an error that
/// names the component and the key.
pub fn parse_config<T: serde::de::DeserializeOwned>(name: &str, table: toml::Table) -> Result<T, ComponentError> {
    table.try_into().map_err(|e: toml::de::Error| ComponentError::Config(format!("{name}: {}", e.message().trim())))
}

/// Runs one component through the state machine.
pub struct Driver {
    registry: Registry,
    kind: String,
    name: String,
    base: toml::Table,
    component: Option<Box<dyn Component>>,
    state: State,
    run: Option<u32>,
    /// The run the component's counters count: from its start until the component is built
    /// anew (configure) or dropped (reset); after the stop they are that run's last.
    counting: Option<u32>,
    error: Option<String>,
}

impl Driver {
    /// A driver in state Initial for a component of `kind` named `name`, with the base
    /// configuration `base` (what `--config` and `--set` gave).
    pub fn new(registry: Registry, kind: &str, name: &str, base: toml::Table) -> Driver {
        Driver {
            registry,
            kind: kind.to_owned(),
            name: name.to_owned(),
            base,
            component: None,
            state: State::Initial,
            run: None,
            counting: None,
            error: None,
        }
    }

    /// The component's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The component's kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The state; Error as soon as the component reports a failure during a run.
    pub fn state(&self) -> State {
        if matches!(self.state, State::Running | State::Paused) && self.failure().is_some() {
            State::Error
        } else {
            self.state
        }
    }

    /// The run taken (Running, Paused) or last taken.
    pub fn run(&self) -> Option<u32> {
        self.run
    }

    /// Why the component is in Error, if it is.
    pub fn failure(&self) -> Option<String> {
        self.error.clone().or_else(|| self.component.as_ref().and_then(|c| c.failure()))
    }

    fn refuse(&self, command: Verb) -> ComponentError {
        ComponentError::IllegalTransition { command, state: self.state() }
    }

    fn fail(&mut self, e: ComponentError) -> ComponentError {
        if !matches!(e, ComponentError::IllegalTransition { .. }) {
            self.state = State::Error;
            self.error = Some(e.to_string());
        }
        e
    }

    /// Initial → Configured. `overrides` (from the operator) are merged over the base
    /// configuration, key by key; the component is built anew from the result.
    pub fn configure(&mut self, overrides: Option<toml::Table>) -> Result<Info, ComponentError> {
        if !Verb::Configure.allowed_in(self.state()) {
            return Err(self.refuse(Verb::Configure));
        }
        let mut table = self.base.clone();
        if let Some(o) = overrides {
            merge(&mut table, o);
        }
        let mut c = match self.registry.make(&self.kind, &self.name, table) {
            Ok(c) => c,
            Err(e) => return Err(self.fail(e)),
        };
        match c.configure() {
            Ok(info) => {
                self.component = Some(c);
                self.state = Verb::Configure.transition().map_or(State::Configured, |(_, to)| to);
                self.counting = None;
                Ok(info)
            }
            Err(e) => {
                let _ = c.reset();
                Err(self.fail(e))
            }
        }
    }

    /// Runs the hook of transition `verb` ([`Verb::transition`], the one table): refused
    /// outside its states, its target state on success, Error on failure.
    fn hook<T>(
        &mut self,
        verb: Verb,
        f: impl FnOnce(&mut dyn Component) -> Result<T, ComponentError>,
    ) -> Result<T, ComponentError> {
        let Some((_, to)) = verb.transition().filter(|_| verb.allowed_in(self.state())) else {
            return Err(self.refuse(verb));
        };
        // Stopped after it failed in its run: it stays in Error, with why.
        let failed_in_run = self.state() == State::Error && self.state.in_run();
        let Some(c) = self.component.as_mut() else { return Err(self.refuse(verb)) };
        match f(c.as_mut()) {
            Ok(v) if failed_in_run => {
                self.error = self.failure();
                self.state = State::Error;
                Ok(v)
            }
            Ok(v) => {
                self.state = to;
                Ok(v)
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Configured → Running.
    pub fn start(&mut self, run: u32) -> Result<(), ComponentError> {
        self.hook(Verb::Start, |c| c.start(run))?;
        self.run = Some(run);
        self.counting = Some(run);
        Ok(())
    }

    /// Running or Paused → Configured, with the run's summary. A component that failed
    /// during the run (state Error) can be stopped too, to collect what it has.
    pub fn stop(&mut self, last_event: Option<u64>) -> Result<Stats, ComponentError> {
        self.hook(Verb::Stop, |c| c.stop(last_event))
    }

    /// Running → Paused.
    pub fn pause(&mut self) -> Result<(), ComponentError> {
        self.hook(Verb::Pause, |c| c.pause())
    }

    /// Paused → Running.
    pub fn resume(&mut self) -> Result<(), ComponentError> {
        self.hook(Verb::Resume, |c| c.resume())
    }

    /// Any state → Initial: the component is reset and dropped.
    pub fn reset(&mut self) -> Result<(), ComponentError> {
        let r = match self.component.take() {
            Some(mut c) => c.reset(),
            None => Ok(()),
        };
        self.state = State::Initial;
        self.error = None;
        self.counting = None;
        r
    }

    /// Live counters (zero before configure), stamped with the time they were read
    /// ([`Stats::at_ms`], just after the kind returned them) and the run they count
    /// ([`Stats::run`]: from the component's start until it is configured anew or reset).
    pub fn stats(&self) -> Stats {
        let mut stats = self.component.as_ref().map_or_else(Stats::default, |c| c.stats());
        stats.at_ms = Some(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        );
        stats.run = self.counting;
        stats
    }

    /// Runs a command: the one place where a command becomes a transition.
    pub fn execute(&mut self, command: Command) -> Result<Answer, ComponentError> {
        match command {
            Command::Configure { config } => self.configure(config).map(Answer::Info),
            Command::Start { run } => self.start(run).map(|()| Answer::Run(run)),
            Command::Pause => self.pause().map(|()| Answer::Nothing),
            Command::Resume => self.resume().map(|()| Answer::Nothing),
            Command::Stop { last_event } => self.stop(last_event).map(Answer::Summary),
            Command::Reset => self.reset().map(|()| Answer::Nothing),
            Command::Set { key, value } => self.set(&key, &value).map(|_| Answer::Nothing),
        }
    }

    /// The typed schema of the component's kind, if it declares one.
    pub fn schema(&self) -> Option<&Schema> {
        self.registry.kind(&self.kind).and_then(|k| k.schema.as_deref())
    }

    /// Changes live parameter `key`: refused (the state unchanged) when the component is not
    /// configured, its kind's schema does not declare the key live, or not in this state, or
    /// the value is not of the key's type and range, checked by the same rule as the
    /// configuration before the component sees it. Returns the value taken.
    pub fn set(&mut self, key: &str, value: &serde_json::Value) -> Result<toml::Value, ComponentError> {
        let state = self.state();
        let schema = self.registry.kind(&self.kind).and_then(|k| k.schema.clone());
        let live: Vec<String> = schema
            .as_ref()
            .map(|s| s.live_keys().map(|k| format!("{} ({})", k.name, names(&k.live))).collect())
            .unwrap_or_default();
        let list = if live.is_empty() {
            format!("{} ({}) has no live parameters", self.name, self.kind)
        } else {
            format!("the live parameters of {} are: {}", self.name, live.join(", "))
        };
        let Some(c) = self.component.as_mut().filter(|_| state != State::Error) else {
            return Err(ComponentError::Refused(format!(
                "`{key}` cannot change while {}: parameters set while Initial apply at configure",
                state.name()
            )));
        };
        let Some(k) = schema.as_ref().and_then(|s| s.key_named(key)) else {
            let unknown = match &schema {
                Some(s) => s.unknown(key),
                None => format!("`{key}`: the kind declares no parameters"),
            };
            return Err(ComponentError::Refused(format!("{unknown}; {list}")));
        };
        if k.live.is_empty() {
            return Err(ComponentError::Refused(format!("`{key}` cannot change after configure; {list}")));
        }
        if !k.live.contains(&state) {
            return Err(ComponentError::Refused(format!(
                "`{key}` can change only while {}, not while {}",
                names(&k.live),
                state.name()
            )));
        }
        let value = k.check_json(value).map_err(ComponentError::Refused)?;
        c.set(key, &value)?;
        Ok(value)
    }
}

fn names(states: &[State]) -> String {
    states.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(mut c) = self.component.take() {
            if matches!(self.state, State::Running | State::Paused) {
                let _ = c.stop(None);
            }
            let _ = c.reset();
        }
    }
}

/// Merges `over` into `base`: tables merge key by key, anything else replaces.
pub fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Kind, Role};

    struct Probe {
        fail_start: bool,
    }
    impl Component for Probe {
        fn start(&mut self, _run: u32) -> Result<(), ComponentError> {
            if self.fail_start { Err(ComponentError::Failed("no hardware".into())) } else { Ok(()) }
        }
        fn stop(&mut self, _last_event: Option<u64>) -> Result<Stats, ComponentError> {
            Ok(Stats::counted(3, 30))
        }
    }

    fn driver() -> Driver {
        let mut r = Registry::new();
        r.add(Kind::new("probe", "a probe", Role::Other, |_, t| {
            Ok(Box::new(Probe { fail_start: t.get("fail_start").and_then(|v| v.as_bool()).unwrap_or(false) }))
        }));
        Driver::new(r, "probe", "p", toml::Table::new())
    }

    #[test]
    fn illegal_transitions_are_refused_with_the_state() {
        let mut d = driver();
        for (what, r) in [
            ("start", d.start(1).err()),
            ("stop", d.stop(None).err()),
            ("pause", d.pause().err()),
            ("resume", d.resume().err()),
        ] {
            let e = r.unwrap_or_else(|| panic!("{what} accepted in Initial"));
            assert_eq!(e.to_string(), format!("cannot {what} in state Initial"));
        }
        d.configure(None).unwrap();
        assert!(matches!(
            d.configure(None),
            Err(ComponentError::IllegalTransition { command: Verb::Configure, state: State::Configured })
        ));
        d.start(3).unwrap();
        assert!(d.resume().is_err());
        d.pause().unwrap();
        assert_eq!(d.state(), State::Paused);
        assert!(d.pause().is_err());
        d.resume().unwrap();
        assert_eq!(d.execute(Command::Stop { last_event: None }).unwrap(), Answer::Summary(Stats::counted(3, 30)));
        assert_eq!(d.state(), State::Configured);
        assert_eq!(d.run(), Some(3));
        d.reset().unwrap();
        assert_eq!(d.state(), State::Initial);
    }

    #[test]
    fn a_failing_hook_puts_the_component_in_error_until_reset() {
        let mut d = driver();
        let mut o = toml::Table::new();
        o.insert("fail_start".into(), toml::Value::Boolean(true));
        d.configure(Some(o)).unwrap();
        assert!(d.start(1).is_err());
        assert_eq!(d.state(), State::Error);
        assert_eq!(d.failure().as_deref(), Some("no hardware"));
        assert!(d.configure(None).is_err());
        d.reset().unwrap();
        assert_eq!(d.failure(), None);
        // Reconfigured without the override: starts.
        d.configure(None).unwrap();
        d.start(2).unwrap();
    }

    #[test]
    fn an_unknown_kind_is_named_with_the_known_ones() {
        let mut d = Driver::new(Registry::new(), "nope", "x", toml::Table::new());
        let e = d.configure(None).unwrap_err().to_string();
        assert!(e.contains("unknown component kind `nope`"), "{e}");
        assert_eq!(d.state(), State::Error);
    }

    #[test]
    fn overrides_merge_nested_tables() {
        let mut base: toml::Table = "a = 1\n[size]\nkind = 'fixed'\nbytes = 10".parse().unwrap();
        merge(&mut base, "b = 2\n[size]\nbytes = 20".parse().unwrap());
        assert_eq!(base["size"]["kind"].as_str(), Some("fixed"));
        assert_eq!(base["size"]["bytes"].as_integer(), Some(20));
        assert_eq!(base["b"].as_integer(), Some(2));
    }
}
