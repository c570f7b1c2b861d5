//! The typed schema of a kind's configuration: every key with its type, range, unit, default,
//! the states in which it may change after configure (a live parameter) and one line of doc,
//! and what the kind's `configure` returns for others to refer to (`${name.key}`).
//!
//! One schema per kind is the one place these facts live. From it come
//! - the check of a configuration before the kind's factory sees it ([`Schema::check`]:
//!   unknown keys with the known key they were probably meant to be, types, ranges; every
//!   problem at once, each naming its key), at configure and in `daqflow run --check`;
//! - the check of a live value, by the same rule, before the component takes it
//!   ([`Key::check_json`], used by the [`Driver`](crate::Driver));
//! - the `--check` of references to what another component gives ([`Schema::output`]);
//! - the web UI's Parameters form, Python's parameters and the docs' tables of keys
//!   ([`Schema::to_markdown`]; `daqflow component --schema KIND`), which a test holds equal to
//!   the docs.
//!
//! The kind's serde configuration struct stays what the component reads; a test per kind holds
//! the two equal ([`Schema::struct_problems`]), and the defaults come from the struct
//! ([`Schema::defaults_from`]).
//!
//! ```
//! use daqflow_component::schema::{Key, Schema};
//! use daqflow_component::State;
//! let schema = Schema::new("hv")
//!     .key(Key::integer("channel", 0, 63, "The supply's channel.").required())
//!     .key(Key::float("volts", 0.0, 2000.0, "The set point.").unit("V").live(&[State::Configured, State::Paused]))
//!     .output(Key::integer("channel", 0, 63, "The channel, for others' parameters."));
//! let config: toml::Table = "channel = 3\nvolts = 2500\nvolt = 1".parse().unwrap();
//! let problems = schema.check(&config);
//! assert_eq!(problems, [
//!     "`volt`: no such key; did you mean `volts`?",
//!     "`volts` = 2500 is out of range: 0 … 2000 V",
//! ]);
//! let volts = schema.key_named("volts").unwrap();
//! assert!(volts.check_json(&serde_json::json!(1e300)).is_err());
//! assert_eq!(volts.check_json(&serde_json::json!(1200)).unwrap(), toml::Value::Float(1200.0));
//! ```

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::State;
use crate::checks::{SEPARATOR, check_address};

/// Every state a configured component can be in: a live parameter that may change whenever
/// the component is configured (`Key::live(ANY_STATE)`).
pub const ANY_STATE: &[State] = &[State::Configured, State::Running, State::Paused];

/// The live boolean key of a data writer whose disk has a reserve above its throttling high
/// mark (the `recorder`'s): set `true` in a run, the writer writes into that reserve now,
/// throttled or not, until the run ends. The operator sets it, before the producers' stop, on
/// every writer throttled by its disk when a run stops (for a full disk, `[system]
/// disk_full_stop_s`, or by hand) whose kind declares the key live; `set` may not.
pub const DRAIN_INTO_RESERVE_KEY: &str = "drain_into_reserve";

/// The type of a key's value, with its range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Type {
    /// `true` or `false`.
    Bool,
    /// A whole number in `min ..= max`.
    Integer {
        /// The smallest value.
        min: i64,
        /// The largest value.
        max: i64,
    },
    /// A finite number in `min ..= max` (a whole number is taken too).
    Float {
        /// The smallest value.
        min: f64,
        /// The largest value.
        max: f64,
    },
    /// A text, not empty unless `empty`.
    Text {
        /// Whether the empty text is allowed.
        #[serde(default)]
        empty: bool,
    },
    /// `HOST:PORT`: an IP address or a host name, a port 0 … 65535.
    Address,
    /// `HOST:PORT[,HOST:PORT…]`: a control server and its spares.
    Addresses,
    /// A path of this host's filesystem (not empty).
    Path,
    /// One of these words.
    Choice {
        /// The words.
        values: Vec<String>,
    },
    /// A list of values of one type.
    List {
        /// The type of each element.
        of: Box<Type>,
    },
    /// A table of the kind's own shape, not checked here (the kind checks it).
    Table,
    /// A set of CPUs a process or a thread is pinned to (`[0, 1]`): not empty, no CPU twice,
    /// each one the checking process may use (`sched_getaffinity`: the operator's in
    /// `daqflow run --check`, the component's own at configure).
    Cpus,
}

impl Type {
    /// Checks one value; `Err` says what is wrong, after the key (`= 5 is out of range: …`).
    pub fn check(&self, value: &toml::Value, unit: Option<&str>) -> Result<(), String> {
        let unit = unit.map(|u| format!(" {u}")).unwrap_or_default();
        let shown = show(value);
        match (self, value) {
            (Type::Bool, toml::Value::Boolean(_)) => Ok(()),
            (Type::Integer { min, max }, toml::Value::Integer(v)) => {
                if (min..=max).contains(&v) {
                    Ok(())
                } else {
                    Err(format!("= {v} is out of range: {} … {}{unit}", number(*min as f64), number(*max as f64)))
                }
            }
            (Type::Float { min, max }, toml::Value::Integer(_) | toml::Value::Float(_)) => {
                let v = value.as_float().unwrap_or_else(|| value.as_integer().unwrap_or_default() as f64);
                if v.is_finite() && (min..=max).contains(&&v) {
                    Ok(())
                } else {
                    Err(format!("= {shown} is out of range: {} … {}{unit}", number(*min), number(*max)))
                }
            }
            (Type::Text { empty }, toml::Value::String(s)) => {
                if *empty || !s.trim().is_empty() {
                    Ok(())
                } else {
                    Err("must not be empty".into())
                }
            }
            (Type::Path, toml::Value::String(s)) => {
                if s.trim().is_empty() {
                    Err("must not be empty".into())
                } else {
                    Ok(())
                }
            }
            (Type::Address, toml::Value::String(s)) => {
                check_address(s).map_err(|why| format!("= {s:?} is not an address: {why}"))
            }
            (Type::Addresses, toml::Value::String(s)) => {
                match s.split(',').map(str::trim).find_map(|a| check_address(a).err()) {
                    None => Ok(()),
                    Some(why) => Err(format!("= {s:?} is not an address or a list of them: {why}")),
                }
            }
            (Type::Choice { values }, toml::Value::String(s)) => {
                if values.iter().any(|v| v == s) {
                    Ok(())
                } else {
                    Err(format!("= {s:?} is not one of {}", words(values)))
                }
            }
            (Type::List { of }, toml::Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    of.check(item, None).map_err(|e| format!("[{i}] {e}"))?;
                }
                Ok(())
            }
            (Type::Table, toml::Value::Table(_)) => Ok(()),
            (Type::Cpus, toml::Value::Array(items)) => check_cpus(items).map(|_| ()),
            _ => Err(format!("= {shown} is not {}", self.article())),
        }
    }

    /// What the type is, with an article (`an integer`, `an address HOST:PORT`, …).
    pub fn article(&self) -> String {
        match self {
            Type::Bool => "true or false".into(),
            Type::Integer { .. } => "an integer".into(),
            Type::Float { .. } => "a number".into(),
            Type::Text { .. } => "a text".into(),
            Type::Address => "an address HOST:PORT".into(),
            Type::Addresses => "an address HOST:PORT or a list of them".into(),
            Type::Path => "a path".into(),
            Type::Choice { values } => format!("one of {}", words(values)),
            Type::List { of } => format!("a list of {}", plural(&of.article())),
            Type::Table => "a table".into(),
            Type::Cpus => "a list of CPU numbers".into(),
        }
    }

    /// The values it takes, as the docs' tables show them (`0 … 10⁹`, `` `fixed`, `lognormal` ``).
    pub fn range_text(&self) -> String {
        match self {
            Type::Bool => "`true`, `false`".into(),
            Type::Integer { min, max } => format!("{} … {}", pretty_int(*min), pretty_int(*max)),
            Type::Float { min, max } => format!("{} … {}", pretty(*min), pretty(*max)),
            Type::Text { empty: false } => "text".into(),
            Type::Text { empty: true } => "text (may be empty)".into(),
            Type::Address => "`HOST:PORT`".into(),
            Type::Addresses => "`HOST:PORT[,HOST:PORT…]`".into(),
            Type::Path => "path".into(),
            Type::Choice { values } => values.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", "),
            Type::List { of } => format!("list of {}", of.range_text()),
            Type::Table => "table".into(),
            Type::Cpus => "CPUs `[0, 1]`".into(),
        }
    }

    /// A value of the type, standing in for one the check cannot know yet (a reference to
    /// what another component gives, in `daqflow run --check`).
    pub fn placeholder(&self) -> toml::Value {
        match self {
            Type::Bool => toml::Value::Boolean(false),
            Type::Integer { min, max } => toml::Value::Integer((*min).max(0).min(*max)),
            Type::Float { min, max } => toml::Value::Float(min.max(0.0).min(*max)),
            Type::Text { .. } | Type::Path => toml::Value::String("placeholder".into()),
            Type::Address | Type::Addresses => toml::Value::String("127.0.0.1:9".into()),
            Type::Choice { values } => toml::Value::String(values.first().cloned().unwrap_or_default()),
            Type::List { .. } => toml::Value::Array(Vec::new()),
            Type::Table => toml::Value::Table(toml::Table::new()),
            Type::Cpus => toml::Value::Array(vec![toml::Value::Integer(
                daqflow_wire::affinity::allowed().map_or(0, |a| a.cpus()[0] as i64),
            )]),
        }
    }
}

/// A configuration's list of CPUs (`cpus = [0, 1]`) as a set the checking process may use:
/// `Err` says what is wrong, after the key (`= [999] names CPU 999, outside the CPUs …`).
pub fn check_cpus(items: &[toml::Value]) -> Result<daqflow_wire::affinity::CpuSet, String> {
    use daqflow_wire::affinity::{self, CpuSet};
    let shown = show(&toml::Value::Array(items.to_vec()));
    let numbers: Option<Vec<i64>> = items.iter().map(toml::Value::as_integer).collect();
    let numbers = numbers.ok_or_else(|| format!("= {shown} is not a list of CPU numbers"))?;
    let set = CpuSet::from_integers(numbers).map_err(|e| format!("= {shown} {e}"))?;
    if let Ok(allowed) = affinity::allowed() {
        set.check_within(&allowed, "the process checking it").map_err(|e| format!("= {shown} {e}"))?;
    }
    Ok(set)
}

/// One key of a kind's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Key {
    /// The key as in the configuration; dotted for a key of a nested table (`size.kind`).
    pub name: String,
    /// Its type and range.
    #[serde(flatten)]
    pub ty: Type,
    /// The unit of a number (`Hz`, `bytes`, `ms`, `%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// Its value when not given (`None`: none, the key is unset unless given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<toml::Value>,
    /// Whether a configuration must give it.
    #[serde(default)]
    pub required: bool,
    /// The states in which it may change after configure (a live parameter); empty: only
    /// before configure.
    #[serde(default)]
    pub live: Vec<State>,
    /// Whether it is an identity: no two components of the kind in one system may have the
    /// same value (its default counts), which `daqflow run --check` refuses.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unique: bool,
    /// What it means, in one line.
    pub doc: String,
}

impl Key {
    /// A key of type `ty`.
    pub fn new(name: &str, ty: Type, doc: &str) -> Key {
        Key {
            name: name.to_owned(),
            ty,
            unit: None,
            default: None,
            required: false,
            live: Vec::new(),
            unique: false,
            doc: doc.to_owned(),
        }
    }
    /// `true` or `false`.
    pub fn bool(name: &str, doc: &str) -> Key {
        Key::new(name, Type::Bool, doc)
    }
    /// A whole number in `min ..= max`.
    pub fn integer(name: &str, min: i64, max: i64, doc: &str) -> Key {
        Key::new(name, Type::Integer { min, max }, doc)
    }
    /// A number in `min ..= max`.
    pub fn float(name: &str, min: f64, max: f64, doc: &str) -> Key {
        Key::new(name, Type::Float { min, max }, doc)
    }
    /// A text that is not empty.
    pub fn text(name: &str, doc: &str) -> Key {
        Key::new(name, Type::Text { empty: false }, doc)
    }
    /// `HOST:PORT`.
    pub fn address(name: &str, doc: &str) -> Key {
        Key::new(name, Type::Address, doc)
    }
    /// A path.
    pub fn path(name: &str, doc: &str) -> Key {
        Key::new(name, Type::Path, doc)
    }
    /// A set of CPUs ([`Type::Cpus`]): a thread role's `*_cpus`.
    pub fn cpus(name: &str, doc: &str) -> Key {
        Key::new(name, Type::Cpus, doc)
    }
    /// One of `values`.
    pub fn choice(name: &str, values: &[&str], doc: &str) -> Key {
        Key::new(name, Type::Choice { values: values.iter().map(|v| (*v).to_owned()).collect() }, doc)
    }
    /// With a unit.
    pub fn unit(mut self, unit: &str) -> Key {
        self.unit = Some(unit.to_owned());
        self
    }
    /// Required.
    pub fn required(mut self) -> Key {
        self.required = true;
        self
    }
    /// With a default (usually taken from the configuration struct: [`Schema::defaults_from`]).
    pub fn default_value(mut self, value: impl Into<toml::Value>) -> Key {
        self.default = Some(value.into());
        self
    }
    /// An identity: no two components of the kind in one system may share its value.
    pub fn unique(mut self) -> Key {
        self.unique = true;
        self
    }

    /// A live parameter in `states`.
    pub fn live(mut self, states: &[State]) -> Key {
        self.live = states.to_vec();
        self
    }

    /// Checks a value of this key; `Err` names the key.
    pub fn check(&self, value: &toml::Value) -> Result<(), String> {
        self.ty.check(value, self.unit.as_deref()).map_err(|e| format!("`{}` {e}", self.name))
    }

    /// Checks a value given as JSON (a live parameter, the web form) by the same rule as the
    /// configuration; returns it as the configuration's value (a whole number for a number key
    /// becomes a float).
    pub fn check_json(&self, value: &serde_json::Value) -> Result<toml::Value, String> {
        let v = json_to_toml(value).map_err(|e| format!("`{}` {e}", self.name))?;
        self.normalize(v)
    }

    /// Checks a value and returns it as the key's type holds it (a whole number for a number
    /// key becomes a float).
    pub fn normalize(&self, value: toml::Value) -> Result<toml::Value, String> {
        self.check(&value)?;
        Ok(match (&self.ty, value) {
            (Type::Float { .. }, toml::Value::Integer(i)) => toml::Value::Float(i as f64),
            (_, v) => v,
        })
    }
}

/// The typed schema of a kind's configuration (the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Schema {
    /// The kind.
    pub kind: String,
    /// Every key, in the order the docs show them.
    pub keys: Vec<Key>,
    /// What `configure` returns, by key: what others refer to as `${name.key}`.
    #[serde(default)]
    pub outputs: Vec<Key>,
    /// What the kind's stop summary gives besides the standard counters (its `detail`), by key:
    /// what a `stop_arg` may refer to (`${evm.last_event}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub summary: Vec<Key>,
}

impl Schema {
    /// An empty schema of `kind`.
    pub fn new(kind: &str) -> Schema {
        Schema { kind: kind.to_owned(), keys: Vec::new(), outputs: Vec::new(), summary: Vec::new() }
    }

    /// With one more key.
    pub fn key(mut self, key: Key) -> Schema {
        self.keys.push(key);
        self
    }

    /// With more keys.
    pub fn keys(mut self, keys: impl IntoIterator<Item = Key>) -> Schema {
        self.keys.extend(keys);
        self
    }

    /// With one more output of `configure` (its type and doc; its default and range unused).
    pub fn output(mut self, key: Key) -> Schema {
        self.outputs.push(key);
        self
    }

    /// With one more key of its stop summary's `detail` (for a `stop_arg`).
    pub fn summary(mut self, key: Key) -> Schema {
        self.summary.push(key);
        self
    }

    /// The key `name` (dotted for a nested one).
    pub fn key_named(&self, name: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.name == name)
    }

    /// The output `name` of `configure`.
    pub fn output_named(&self, name: &str) -> Option<&Key> {
        self.outputs.iter().find(|k| k.name == name)
    }

    /// The live parameters.
    pub fn live_keys(&self) -> impl Iterator<Item = &Key> {
        self.keys.iter().filter(|k| !k.live.is_empty())
    }

    /// Takes each key's default from `defaults` (the configuration struct's `Default`,
    /// serialized): the defaults live in one place, the struct.
    pub fn defaults_from<T: Serialize>(mut self, defaults: &T) -> Schema {
        let table = toml::Table::try_from(defaults).unwrap_or_default();
        let flat = flatten(&table);
        for key in &mut self.keys {
            if key.default.is_none()
                && !key.required
                && let Some(v) = flat.iter().find(|(n, _)| *n == key.name).map(|(_, v)| (*v).clone())
            {
                key.default = Some(v);
            }
        }
        self
    }

    /// Every problem of a configuration, each naming its key: keys the kind does not have
    /// (with the known key it was probably meant to be), values of the wrong type or out of
    /// range, required keys missing. Empty: the table fits the schema. Rules between keys are
    /// the kind's to check.
    pub fn check(&self, table: &toml::Table) -> Vec<String> {
        let mut problems = Vec::new();
        self.check_table("", table, &mut problems);
        for key in self.keys.iter().filter(|k| k.required) {
            if lookup(table, &key.name).is_none() {
                problems.push(format!("`{}` is required: {}", key.name, key.doc));
            }
        }
        problems
    }

    /// [`Schema::check`] as the error a component's configuration gives
    /// (`configuration: NAME: problem; problem`).
    pub fn check_config(&self, name: &str, table: &toml::Table) -> Result<(), crate::ComponentError> {
        let problems = self.check(table);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(crate::ComponentError::Config(format!("{name}: {}", problems.join(SEPARATOR))))
        }
    }

    fn check_table(&self, prefix: &str, table: &toml::Table, problems: &mut Vec<String>) {
        for (k, v) in table {
            let name = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            if let Some(key) = self.key_named(&name) {
                if let Err(e) = key.check(v) {
                    problems.push(e);
                }
            } else if let (toml::Value::Table(inner), true) = (v, self.has_table(&name)) {
                self.check_table(&name, inner, problems);
            } else if self.has_table(&name) {
                problems.push(format!("`{name}` = {} is not a table", show(v)));
            } else {
                problems.push(self.unknown(&name));
            }
        }
    }

    /// Checks the value of one key (dotted), or of a whole nested table (`size` =
    /// `{kind = "fixed", bytes = 512}`), by the rule of [`Schema::check`]; returns it as the
    /// schema holds it ([`Key::normalize`]).
    pub fn check_value(&self, name: &str, value: toml::Value) -> Result<toml::Value, String> {
        if let Some(key) = self.key_named(name) {
            return key.normalize(value);
        }
        if self.has_table(name) {
            let toml::Value::Table(t) = &value else {
                return Err(format!("`{name}` = {} is not a table", show(&value)));
            };
            let mut problems = Vec::new();
            self.check_table(name, t, &mut problems);
            return if problems.is_empty() { Ok(value) } else { Err(problems.join(SEPARATOR)) };
        }
        Err(self.unknown(name))
    }

    fn has_table(&self, name: &str) -> bool {
        let prefix = format!("{name}.");
        self.keys.iter().any(|k| k.name.starts_with(&prefix))
    }

    /// The problem of an unknown key: the known key it was probably meant to be, or the keys
    /// of its table.
    pub fn unknown(&self, name: &str) -> String {
        let names: Vec<&str> = self.keys.iter().map(|k| k.name.as_str()).collect();
        match closest(name, &names) {
            Some(near) => format!("`{name}`: no such key; did you mean `{near}`?"),
            None => {
                let parent = name.rsplit_once('.').map(|(p, _)| format!("{p}.")).unwrap_or_default();
                let siblings: Vec<&str> = names
                    .iter()
                    .filter(|n| n.starts_with(&parent) && !n[parent.len()..].contains('.'))
                    .copied()
                    .collect();
                format!("`{name}`: no such key of a {} (its keys: {})", self.kind, siblings.join(", "))
            }
        }
    }

    /// The configuration `table` with every string holding a `${…}` reference replaced by a
    /// value of its key's type (`daqflow run --check`, where what others give is not known yet).
    pub fn with_placeholders(&self, table: &toml::Table, is_reference: &dyn Fn(&str) -> bool) -> toml::Table {
        fn walk(s: &Schema, prefix: &str, t: &mut toml::Table, is_reference: &dyn Fn(&str) -> bool) {
            for (k, v) in t.iter_mut() {
                let name = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                match v {
                    toml::Value::String(text) if is_reference(text) => {
                        *v = s
                            .key_named(&name)
                            .map_or(toml::Value::String("127.0.0.1:9".into()), |key| key.ty.placeholder());
                    }
                    toml::Value::Table(inner) => walk(s, &name, inner, is_reference),
                    toml::Value::Array(items) => {
                        let element = s.key_named(&name).and_then(|key| match &key.ty {
                            Type::List { of } => Some(of.placeholder()),
                            _ => None,
                        });
                        for item in items.iter_mut() {
                            match item {
                                // A list of tables (a dispatcher's `outputs`): the kind checks
                                // their keys; a reference in them stands for an address.
                                toml::Value::Table(inner) => walk(s, &name, inner, is_reference),
                                toml::Value::String(text) if is_reference(text) => {
                                    *item =
                                        element.clone().unwrap_or_else(|| toml::Value::String("127.0.0.1:9".into()));
                                }
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut out = table.clone();
        walk(self, "", &mut out, is_reference);
        out
    }

    /// Where the schema and the configuration struct `T` disagree (for a test per kind):
    /// keys of `defaults` (`T::default()`, serialized) the schema lacks, keys of the schema
    /// `T` does not take (each given alone with a value of its type, the struct must not call
    /// it unknown), and defaults that differ.
    pub fn struct_problems<T: Serialize + serde::de::DeserializeOwned>(&self, defaults: &T) -> Vec<String> {
        let mut problems = Vec::new();
        let table = match toml::Table::try_from(defaults) {
            Ok(t) => t,
            Err(e) => return vec![format!("the defaults do not serialize: {e}")],
        };
        let flat = flatten(&table);
        for (name, value) in &flat {
            match self.key_named(name) {
                None if self.has_table(name) => {}
                None => problems.push(format!("`{name}` is in the struct, not in the schema")),
                Some(key) if !key.required && key.default.as_ref() != Some(*value) => problems.push(format!(
                    "`{name}`: the schema's default {:?} is not the struct's {}",
                    key.default.as_ref().map(show),
                    show(value)
                )),
                Some(_) => {}
            }
        }
        for key in &self.keys {
            if !flat.iter().any(|(n, _)| *n == key.name) && key.default.is_some() {
                problems.push(format!("`{}` has a default in the schema, none in the struct", key.name));
            }
            let mut probe = toml::Table::new();
            insert(&mut probe, &key.name, key.default.clone().unwrap_or_else(|| key.ty.placeholder()));
            if let Err(e) = probe.try_into::<T>()
                && e.message().contains("unknown field")
            {
                problems.push(format!("`{}` is in the schema, not in the struct: {}", key.name, e.message().trim()));
            }
        }
        problems
    }

    /// The docs' table of the keys: key, default, range, live, meaning.
    pub fn to_markdown(&self) -> String {
        let mut out = String::from("| key | default | values | live | meaning |\n| --- | --- | --- | --- | --- |\n");
        for k in &self.keys {
            let default = match (&k.default, k.required) {
                (_, true) => "required".to_owned(),
                (Some(v), _) => format!("`{}`", show(v)),
                (None, _) => "none".to_owned(),
            };
            let range = match &k.unit {
                Some(u) => format!("{} {u}", k.ty.range_text()),
                None => k.ty.range_text(),
            };
            let live = if k.live.is_empty() {
                String::new()
            } else {
                k.live.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
            };
            let unique = if k.unique { " Unique in the system." } else { "" };
            out.push_str(&format!(
                "| `{}` | {default} | {range} | {live} | {}{unique} |\n",
                k.name,
                k.doc.replace('|', "\\|")
            ));
        }
        if !self.outputs.is_empty() {
            out.push_str("\n| configure gives | meaning |\n| --- | --- |\n");
            for o in &self.outputs {
                out.push_str(&format!("| `${{NAME.{}}}` | {} |\n", o.name, o.doc.replace('|', "\\|")));
            }
        }
        out
    }
}

/// A JSON value as a configuration's (TOML) value: `null` has none and is refused; a number
/// stays an integer where it is one. The one conversion of JSON values into configuration
/// values (live parameters, the web form, overrides).
pub fn json_to_toml(v: &serde_json::Value) -> Result<toml::Value, String> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => return Err("needs a value (null has none)".into()),
        Value::Bool(b) => toml::Value::Boolean(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => toml::Value::Integer(i),
            (None, Some(f)) if n.is_f64() && f.is_finite() => toml::Value::Float(f),
            _ => return Err(format!("= {n} is out of the range of numbers a configuration holds")),
        },
        Value::String(s) => toml::Value::String(s.clone()),
        Value::Array(a) => toml::Value::Array(a.iter().map(json_to_toml).collect::<Result<_, _>>()?),
        Value::Object(m) => toml::Value::Table(
            m.iter().map(|(k, v)| json_to_toml(v).map(|v| (k.clone(), v))).collect::<Result<_, _>>()?,
        ),
    })
}

/// The dotted keys of a table's leaves (a nested table's keys as `table.key`).
fn flatten(table: &toml::Table) -> Vec<(String, &toml::Value)> {
    fn walk<'a>(prefix: &str, t: &'a toml::Table, out: &mut Vec<(String, &'a toml::Value)>) {
        for (k, v) in t {
            let name = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            match v {
                toml::Value::Table(inner) => walk(&name, inner, out),
                _ => out.push((name, v)),
            }
        }
    }
    let mut out = Vec::new();
    walk("", table, &mut out);
    out
}

fn lookup<'a>(table: &'a toml::Table, dotted: &str) -> Option<&'a toml::Value> {
    let mut parts = dotted.split('.');
    let mut v = table.get(parts.next()?)?;
    for p in parts {
        v = v.as_table()?.get(p)?;
    }
    Some(v)
}

fn insert(table: &mut toml::Table, dotted: &str, value: toml::Value) {
    let mut parts: Vec<&str> = dotted.split('.').collect();
    let last = parts.pop().unwrap_or_default();
    let mut t = table;
    for p in parts {
        let entry = t.entry(p.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(inner) = entry else { return };
        t = inner;
    }
    t.insert(last.to_owned(), value);
}

/// A value as written in a configuration (`500`, `"fixed"`, `[1, 2]`).
fn show(v: &toml::Value) -> String {
    match v {
        toml::Value::Float(f) => number(*f),
        toml::Value::Table(t) if t.is_empty() => "{}".into(),
        other => other.to_string(),
    }
}

/// A number without a needless fraction (`1000000000`, `0.5`).
fn number(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else if v.is_finite() && v != 0.0 && (v.abs() >= 1e15 || v.abs() < 1e-4) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// A whole number as the docs write it (`2³⁰`, `10⁹`, `2⁶³ − 1`).
fn pretty_int(v: i64) -> String {
    match v {
        i64::MAX => "2⁶³ − 1".into(),
        _ if v == i64::from(u32::MAX) => "2³² − 1".into(),
        _ => pretty(v as f64),
    }
}

/// A number as the docs write it: powers of two from 2¹⁰ and of ten from 10⁶ as such.
fn pretty(v: f64) -> String {
    const SUPERSCRIPT: [char; 10] = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];
    let sup =
        |n: u32| n.to_string().chars().map(|c| SUPERSCRIPT[c.to_digit(10).unwrap_or(0) as usize]).collect::<String>();
    if v.is_finite() && v.fract() == 0.0 && v >= 1024.0 {
        let i = v as u64;
        if i.is_power_of_two() {
            return format!("2{}", sup(i.trailing_zeros()));
        }
        if v >= 1e6 {
            let e = v.log10().round() as i32;
            if 10f64.powi(e) == v {
                return format!("10{}", sup(e as u32));
            }
        }
    }
    number(v)
}

fn words(values: &[String]) -> String {
    values.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", ")
}

fn plural(article: &str) -> String {
    let bare = article.trim_start_matches("an ").trim_start_matches("a ");
    format!("{bare}s")
}

/// The known name `written` is most likely a misspelling of, if any: at most one edit for a
/// word of up to 4 letters, two for a longer one (case aside; a swap of two neighbours is one
/// edit), or a word of 4 letters or more that one contains. The one "did you mean" of daqflow's
/// messages (keys, kinds, tables).
pub fn closest<'a>(written: &str, known: &[&'a str]) -> Option<&'a str> {
    let lower = written.to_ascii_lowercase();
    let near = |k: &str| {
        let limit = if k.chars().count() <= 4 { 1 } else { 2 };
        distance(&k.to_ascii_lowercase(), &lower) <= limit
    };
    let contains = |k: &str| {
        let k = k.to_ascii_lowercase();
        lower.len() >= 4 && k.len() >= 4 && (k.contains(&lower) || lower.contains(&k))
    };
    known
        .iter()
        .copied()
        .filter(|k| near(k))
        .min_by_key(|k| distance(&k.to_ascii_lowercase(), &lower))
        .or_else(|| known.iter().copied().find(|k| contains(k)))
}

/// The edit distance of two words: insertions, deletions, substitutions and swaps of two
/// neighbours.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// The names of a set of keys, sorted (for messages).
pub fn names<'a>(keys: impl IntoIterator<Item = &'a Key>) -> Vec<&'a str> {
    let set: BTreeSet<&str> = keys.into_iter().map(|k| k.name.as_str()).collect();
    set.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Schema {
        Schema::new("source")
            .key(Key::integer("source_id", 0, u32::MAX.into(), "The source id."))
            .key(Key::float("rate_hz", 0.0, 1e9, "Fragments per second.").unit("Hz").live(ANY_STATE))
            .key(Key::address("ru", "The RU."))
            .key(Key::choice("size.kind", &["fixed", "lognormal"], "The model."))
            .key(Key::integer("size.bytes", 0, 1 << 30, "Fixed size.").unit("bytes"))
            .key(Key::text("station", "A station.").required())
    }

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    #[test]
    fn every_problem_names_its_key_and_unknown_keys_name_the_one_meant() {
        let p =
            schema().check(&table("source_id = -1\nrate_hx = 5\nru = 'nowhere'\n[size]\nkind = 'gauss'\nbites = 3"));
        assert_eq!(
            p,
            [
                "`rate_hx`: no such key; did you mean `rate_hz`?",
                "`ru` = \"nowhere\" is not an address: HOST:PORT expected",
                "`size.bites`: no such key; did you mean `size.bytes`?",
                "`size.kind` = \"gauss\" is not one of `fixed`, `lognormal`",
                "`source_id` = -1 is out of range: 0 … 4294967295",
                "`station` is required: A station.",
            ]
        );
        assert!(schema().check(&table("station = 'x'\nrate_hz = 10\n[size]\nbytes = 512")).is_empty());
        assert_eq!(schema().check(&table("station = 'x'\nsize = 3")), ["`size` = 3 is not a table"]);
        assert_eq!(
            schema().check(&table("station = 'x'\nzzz = 3")),
            ["`zzz`: no such key of a source (its keys: source_id, rate_hz, ru, station)"]
        );
    }

    #[test]
    fn a_live_value_is_checked_by_the_configuration_s_rule() {
        let s = schema();
        let rate = s.key_named("rate_hz").unwrap();
        assert_eq!(rate.check_json(&serde_json::json!(500)).unwrap(), toml::Value::Float(500.0));
        for bad in [
            serde_json::json!(1e300),
            serde_json::json!(1_000_000_001),
            serde_json::json!(-1),
            serde_json::json!("fast"),
        ] {
            let e = rate.check_json(&bad).unwrap_err();
            assert!(e.starts_with("`rate_hz` = "), "{e}");
        }
        assert_eq!(
            rate.check_json(&serde_json::json!(1e300)).unwrap_err(),
            "`rate_hz` = 1e300 is out of range: 0 … 1000000000 Hz"
        );
        assert_eq!(rate.check_json(&serde_json::Value::Null).unwrap_err(), "`rate_hz` needs a value (null has none)");
        assert!(s.key_named("source_id").unwrap().check_json(&serde_json::json!(1.5)).is_err());
    }

    #[test]
    fn references_stand_in_with_a_value_of_their_key_s_type() {
        let t = table("source_id = '${x.id}'\nru = '${ru-0.listen}'\nstation = 'a'");
        let p = schema().with_placeholders(&t, &|s: &str| s.contains("${"));
        assert_eq!(p["source_id"], toml::Value::Integer(0));
        assert_eq!(p["ru"].as_str(), Some("127.0.0.1:9"));
        assert!(schema().check(&p).is_empty());
    }

    #[test]
    fn references_in_a_list_of_tables_stand_in_too() {
        let s = Schema::new("dispatcher")
            .key(Key::new("outputs", Type::List { of: Box::new(Type::Table) }, "Outputs."))
            .key(Key::new("ports", Type::List { of: Box::new(Type::Integer { min: 1, max: 9 }) }, "Ports."));
        let t = table("outputs = [{ downstream = '${log.listen}', mode = 'sampling' }]\nports = ['${a.port}', 3]");
        let p = s.with_placeholders(&t, &|s: &str| s.contains("${"));
        assert_eq!(p["outputs"][0]["downstream"].as_str(), Some("127.0.0.1:9"));
        assert_eq!(p["outputs"][0]["mode"].as_str(), Some("sampling"));
        assert_eq!(p["ports"][0], toml::Value::Integer(1));
        assert_eq!(p["ports"][1], toml::Value::Integer(3));
    }

    #[test]
    fn the_docs_table_shows_ranges_units_and_live_states() {
        let md = schema().defaults_from(&toml::toml! { rate_hz = 0.0 }).to_markdown();
        assert!(
            md.contains("| `rate_hz` | `0` | 0 … 10⁹ Hz | Configured, Running, Paused | Fragments per second. |"),
            "{md}"
        );
        assert!(md.contains("| `size.bytes` | none | 0 … 2³⁰ bytes |  | Fixed size. |"), "{md}");
        assert!(md.contains("| `station` | required | text |  | A station. |"), "{md}");
    }

    #[test]
    fn a_schema_round_trips_as_json() {
        let s = schema();
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains(r#"{"name":"rate_hz","type":"float","min":0.0,"max":1000000000.0,"unit":"Hz","required":false,"live":["Configured","Running","Paused"],"doc":"Fragments per second."}"#), "{json}");
        assert_eq!(serde_json::from_str::<Schema>(&json).unwrap(), s);
    }

    #[test]
    fn near_names_are_found_and_far_ones_are_not() {
        assert_eq!(closest("lisen", &["listen", "evm"]), Some("listen"));
        assert_eq!(closest("compnent", &["component", "system"]), Some("component"));
        assert_eq!(closest("xyz", &["listen", "evm"]), None);
        assert_eq!(closest("sorce", &["source", "sink", "ru"]), Some("source"));
        assert_eq!(closest("detector", &["source", "sink"]), None);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("ab", "ba"), 1);
    }
}
