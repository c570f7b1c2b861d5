//! The system file's parameters as the sequencer resolves and changes them: references between components, live values set during a run, the checks of keys and values.

use super::*;

impl Sequencer {
    pub(super) fn spec_index(&self, name: &str) -> Option<usize> {
        self.file.components.iter().position(|c| c.name == name)
    }

    /// The values `${NAME.KEY}` refers to: configure results, `system`, and `extra`.
    pub(super) fn references(&self, extra: &BTreeMap<String, Stats>) -> HashMap<String, Value> {
        let mut r = self.results.clone();
        r.insert("system".into(), Value::Object(self.system.clone()));
        for (name, stats) in extra {
            // A stop summary: its counters and its kind's figures, side by side.
            let mut m = match serde_json::to_value(stats) {
                Ok(Value::Object(m)) => m,
                _ => serde_json::Map::new(),
            };
            if let Value::Object(d) = &stats.detail {
                for (k, v) in d {
                    m.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            r.insert(name.clone(), Value::Object(m));
        }
        r
    }

    /// Sets (or takes back) a parameter for the next configure.
    pub(super) fn set(&mut self, component: &str, key: &str, value: Option<toml::Value>) -> Result<(), OperatorError> {
        let state = self.state();
        if self.job.is_some() || state != SystemState::Initial {
            return Err(OperatorError::Invalid(format!(
                "parameters are set while the system is Initial (they apply at the next configure); it is {}: reset it first",
                state.name()
            )));
        }
        let value = self.check_key(component, key, value, false)?;
        let entry = self.overrides.entry(component.to_owned()).or_default();
        match value {
            Some(v) => {
                tracing::info!(component, key, value = %v, "parameter set for the next configure");
                entry.insert(key.to_owned(), v);
            }
            None => {
                entry.remove(key);
                tracing::info!(component, key, "parameter set back to the system file's");
            }
        }
        self.overrides.retain(|_, m| !m.is_empty());
        Ok(())
    }

    /// Sends a live parameter to its component (answered when it replies).
    pub(super) fn set_live(
        &mut self,
        ticket: u64,
        component: &str,
        key: &str,
        value: Option<toml::Value>,
        now: Now,
        out: &mut Vec<Output>,
    ) -> Result<(), OperatorError> {
        let state = self.state();
        if self.job.is_some() || !matches!(state, SystemState::Configured | SystemState::Running | SystemState::Paused)
        {
            return Err(OperatorError::Invalid(format!(
                "parameters change while the system is Initial (for the next configure) or, the live ones, while \
                 Configured, Running or Paused; it is {}",
                state.name()
            )));
        }
        let value = self.check_key(component, key, value, true)?;
        let Some(value) = value else {
            return Err(OperatorError::Invalid(format!(
                "`{component}.{key}` can be taken back only while Initial; set it to a value instead"
            )));
        };
        let v = &self.views[component];
        if self.restarts.contains_key(component) || self.dropped.contains_key(component) || !v.joined() {
            return Err(OperatorError::Invalid(format!(
                "{component} is {}: it takes no parameter now",
                if self.dropped.contains_key(component) {
                    "out of the run".into()
                } else {
                    v.shown().name().to_owned()
                }
            )));
        }
        let json = serde_json::to_value(&value).unwrap_or(Value::Null);
        let owner = Owner::Live(LiveSet { ticket, key: key.to_owned(), value });
        self.send(component, Command::Set { key: key.to_owned(), value: json }, owner, self.config.timeout, now, out);
        Ok(())
    }

    /// A live parameter's reply: the ticket's answer; the value kept and the change recorded.
    pub(super) fn live_done(
        &mut self,
        component: &str,
        LiveSet { ticket, key, value }: LiveSet,
        result: Result<Answer, OperatorError>,
        now: Now,
        out: &mut Vec<Output>,
    ) {
        let result = match result {
            Ok(_) => {
                let run = self.run.filter(|_| self.run_open());
                tracing::info!(
                    component,
                    key = %key,
                    value = %value,
                    run = run.unwrap_or(0),
                    "live parameter {component}.{key} = {value}{}",
                    run.map(|r| format!(" in run {r}")).unwrap_or_default()
                );
                let json = serde_json::to_value(&value).unwrap_or(Value::Null);
                if run.is_some() {
                    self.changes.push(ParameterChange {
                        t_ms: now.wall_ms,
                        component: component.to_owned(),
                        key: key.clone(),
                        value: json,
                    });
                }
                // What the component now runs with, for the record of the runs to come.
                if let Some(params) = self.configured.get_mut(component) {
                    set_dotted(params, &key, value.clone());
                }
                self.overrides.entry(component.to_owned()).or_default().insert(key, value);
                Ok(TransitionResult::Done)
            }
            // The component's refusal is the caller's mistake (400), with the component's reason.
            Err(OperatorError::Component { component, reason, .. })
                if !reason.starts_with("no answer")
                    && !reason.starts_with("the process")
                    && reason != "not on the control plane" =>
            {
                Err(OperatorError::Invalid(format!("{component}: {reason}")))
            }
            Err(e) => Err(e),
        };
        out.push(Output::Done { ticket, result });
    }

    /// Checks that `component` is one and `key` a parameter name it could have.
    pub(super) fn check_key(
        &self,
        component: &str,
        key: &str,
        value: Option<toml::Value>,
        live: bool,
    ) -> Result<Option<toml::Value>, OperatorError> {
        let Some(i) = self.spec_index(component) else {
            let names: Vec<&str> = self.file.components.iter().map(|c| c.name.as_str()).collect();
            return Err(OperatorError::Invalid(format!(
                "no component `{component}` (the system's: {})",
                names.join(", ")
            )));
        };
        if key.is_empty() || key.split('.').any(str::is_empty) || key.len() > 200 {
            return Err(OperatorError::Invalid(format!(
                "`{key}` is not a parameter name (dotted for nested keys: size.mean)"
            )));
        }
        if key.split('.').next() == Some(SYSTEM_DIGEST_KEY) {
            return Err(OperatorError::Invalid(format!(
                "`{SYSTEM_DIGEST_KEY}` is set by the operator (the system file's digest), not by `set`"
            )));
        }
        if key == DRAIN_INTO_RESERVE_KEY {
            return Err(OperatorError::Invalid(format!(
                "`{DRAIN_INTO_RESERVE_KEY}` is set by the operator, not by `set`: a stop while a writer is throttled \
                 by its disk tells it to drain into its disk's reserve"
            )));
        }
        // The key must not cross a value that is not a table in the system file's parameters.
        let mut table = &self.file.components[i].params;
        let parts: Vec<&str> = key.split('.').collect();
        for (n, p) in parts[..parts.len() - 1].iter().enumerate() {
            match table.get(*p) {
                Some(toml::Value::Table(t)) => table = t,
                Some(_) => {
                    return Err(OperatorError::Invalid(format!(
                        "`{component}.{}` is not a table: `{key}` cannot be set",
                        parts[..=n].join(".")
                    )));
                }
                None => break,
            }
        }
        // The kind's schema, where this binary knows it: the key must exist (and be live for a
        // live change), the value be of its type and range: the rule configure applies.
        let published = self.published.get(component);
        let Some(schema) = self.file.components[i].schema.as_deref().or(published.map(|s| &**s)) else {
            return Ok(value);
        };
        let live_key = schema.key_named(key).filter(|k| !k.live.is_empty());
        if live && live_key.is_none() {
            let keys: Vec<String> = schema
                .live_keys()
                // The operator's own (refused above), not one to offer.
                .filter(|k| k.name != DRAIN_INTO_RESERVE_KEY)
                .map(|k| format!("{} ({})", k.name, k.live.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")))
                .collect();
            let list = if keys.is_empty() {
                format!("{component} ({}) has no live parameters", schema.kind)
            } else {
                format!("the live parameters of {component} are: {}", keys.join(", "))
            };
            let why = match schema.key_named(key) {
                Some(_) => format!("`{key}` cannot change after configure"),
                None => schema.unknown(key),
            };
            return Err(OperatorError::Invalid(format!("{component}: {why}; {list}")));
        }
        match value {
            None if schema.key_named(key).is_some() => Ok(None),
            None => schema
                .check_value(key, toml::Value::Table(Default::default()))
                .map(|_| None)
                .map_err(|e| OperatorError::Invalid(format!("{component}: {e}"))),
            Some(v) => {
                schema.check_value(key, v).map(Some).map_err(|e| OperatorError::Invalid(format!("{component}: {e}")))
            }
        }
    }

    /// Every override as `COMPONENT.KEY` → its value in JSON.
    pub(super) fn overrides_flat(&self) -> BTreeMap<String, Value> {
        let mut flat = BTreeMap::new();
        for (component, keys) in &self.overrides {
            for (key, value) in keys {
                flat.insert(format!("{component}.{key}"), serde_json::to_value(value).unwrap_or(Value::Null));
            }
        }
        flat
    }

    /// A component's parameters with the overrides set over them and their references
    /// resolved.
    pub(super) fn resolved_params(&self, spec: &ComponentSpec) -> Result<toml::Table, OperatorError> {
        let refs = self.references(&BTreeMap::new());
        let mut params = spec.params.clone();
        for (key, value) in self.overrides.get(&spec.name).into_iter().flatten() {
            let mut parts: Vec<&str> = key.split('.').collect();
            let last = parts.pop().unwrap_or_default();
            let mut t = &mut params;
            for p in parts {
                let entry = t.entry(p.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
                match entry {
                    toml::Value::Table(inner) => t = inner,
                    _ => {
                        return Err(OperatorError::Invalid(format!(
                            "{}: `{key}` crosses a value that is not a table",
                            spec.name
                        )));
                    }
                }
            }
            t.insert(last.to_owned(), value.clone());
        }
        match resolve(&toml::Value::Table(params), &refs) {
            Ok(toml::Value::Table(mut t)) => {
                // The system file's digest, for the headers of the component's data files.
                if spec.system_digest
                    && let Some(Value::String(digest)) = self.system.get("digest")
                {
                    t.insert(SYSTEM_DIGEST_KEY.to_owned(), toml::Value::String(digest.clone()));
                }
                Ok(t)
            }
            Ok(_) => Ok(toml::Table::new()),
            Err(reason) => {
                Err(OperatorError::Component { component: spec.name.clone(), command: "configure".into(), reason })
            }
        }
    }
}

/// Sets the dotted `key` (`size.mean`) of `table` to `value`, making the tables on the way (a
/// value that is not a table on the way is replaced by one).
pub(super) fn set_dotted(table: &mut toml::Table, key: &str, value: toml::Value) {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap_or_default();
    let mut t = table;
    for p in parts {
        let entry = t.entry(p.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        let Some(inner) = entry.as_table_mut() else { return };
        t = inner;
    }
    t.insert(last.to_owned(), value);
}
