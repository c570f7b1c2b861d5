//! Chain components with named, typed ports written in Python (`daqflow.PortComponent`,
//! `python/daqflow/ports.py`): DAQ-Middleware's component model, where the user writes only
//! what happens to each chunk. The ports, their connections, the chain's stream protocol (begin
//! and end markers, sequence numbers, CRC32C), the joining of end markers and the state machine
//! are [`daqflow_chain::ports`]'s, run by the same process loop as every component; this file
//! makes a Python object a [`Logic`].
//!
//! Each chunk reaches Python as a read-only `memoryview` of the bytes received (no copy); the
//! `out` object a hook gets sends on the output ports (any bytes-like object; without the GIL
//! while the output's queue is full). `out` is lent for the call only: the real outputs go back
//! to the component when the hook returns, and a send after that raises.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use daqflow_chain::ports::{InPort, Logic, OutPort, Outputs as ChainOutputs};
use daqflow_component::{ComponentError, Registry};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::component::{ProcessArgs, hook_error, schema_of};
use crate::{Buffer, Error, Store};

/// The outputs lent to a Python hook: `Some` during the call only.
type Slot = Arc<Mutex<Option<ChainOutputs>>>;

/// The `out` of `on_chunk` and `end`: sends chunks on the component's output ports.
#[pyclass(module = "daqflow._native", name = "Outputs", frozen)]
pub struct PyOutputs {
    slot: Slot,
    names: Vec<String>,
}

#[pymethods]
impl PyOutputs {
    /// Sends `data` (any bytes-like object) as the next chunk on output port `port`; waits,
    /// without the GIL, while the port's queue is full (nothing is dropped).
    fn send(&self, py: Python<'_>, port: &str, data: &Bound<'_, PyAny>) -> PyResult<()> {
        if !self.names.iter().any(|n| n == port) {
            return Err(PyValueError::new_err(format!(
                "no output port `{port}` (its outputs: {})",
                if self.names.is_empty() { "none".to_owned() } else { self.names.join(", ") }
            )));
        }
        let copied: Vec<u8>;
        let slice: &[u8] = match data.cast::<PyBytes>() {
            Ok(b) => b.as_bytes(),
            Err(_) => {
                copied = pyo3::buffer::PyBuffer::<u8>::get(data)?.to_vec(py)?;
                &copied
            }
        };
        let slot = self.slot.clone();
        let sent = py.detach(move || {
            let mut lent = slot.lock().unwrap_or_else(|p| p.into_inner());
            match lent.as_mut() {
                Some(out) => out.send(port, slice),
                None => {
                    Err("`out` is lent to on_chunk() and end() only while they run: keep no reference to it".into())
                }
            }
        });
        sent.map_err(Error::new_err)
    }

    /// The names of the output ports.
    #[getter]
    fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    fn __repr__(&self) -> String {
        format!("Outputs({})", self.names.join(", "))
    }
}

/// A Python object (a `daqflow.PortComponent`) as the logic of a port component.
struct PyLogic {
    object: Py<PyAny>,
    inputs: Vec<InPort>,
    outputs: Vec<OutPort>,
    /// The `out` handed to the hooks, made once.
    out: Py<PyOutputs>,
    slot: Slot,
}

impl PyLogic {
    /// Lends `out` to the Python method `method` for the call (the slot holds it meanwhile).
    fn lend(
        &self,
        out: &mut ChainOutputs,
        what: &str,
        call: impl for<'py> FnOnce(Python<'py>, &Bound<'py, PyAny>, &Bound<'py, PyOutputs>) -> PyResult<Bound<'py, PyAny>>,
    ) -> Result<(), String> {
        let lent = std::mem::replace(out, ChainOutputs::placeholder());
        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(lent);
        let result = Python::attach(|py| {
            call(py, self.object.bind(py), self.out.bind(py)).map(drop).map_err(|e| hook_error(py, what, e).to_string())
        });
        // Back before anything else: a send another Python thread makes meanwhile finishes
        // first (the lock), and one after this fails.
        let back = self.slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(back) = back {
            *out = back;
        }
        result
    }
}

impl Logic for PyLogic {
    fn inputs(&self) -> Vec<InPort> {
        self.inputs.clone()
    }

    fn outputs(&self) -> Vec<OutPort> {
        self.outputs.clone()
    }

    fn begin(&mut self, run: u32) -> Result<(), String> {
        Python::attach(|py| {
            self.object
                .bind(py)
                .call_method1("_df_begin", (run,))
                .map(drop)
                .map_err(|e| hook_error(py, "begin()", e).to_string())
        })
    }

    fn on_chunk(&mut self, input: &str, data: Bytes, out: &mut ChainOutputs) -> Result<(), String> {
        self.lend(out, "on_chunk()", |py, object, out| {
            let view = Buffer::view(py, Store::Shared(data))?;
            object.call_method1("_df_on_chunk", (input, view, out))
        })
    }

    fn end(&mut self, out: &mut ChainOutputs) -> Result<(), String> {
        self.lend(out, "end()", |_, object, out| object.call_method1("_df_end", (out,)))
    }

    fn failure(&self) -> Option<String> {
        Python::attach(|py| self.object.bind(py).call_method0("_df_failure").ok()?.extract::<Option<String>>().ok()?)
    }

    fn detail(&self) -> serde_json::Value {
        let json = Python::attach(|py| -> PyResult<Option<String>> {
            let out = self.object.bind(py).call_method0("_df_detail")?;
            if out.is_none() { Ok(None) } else { out.extract::<String>().map(Some) }
        });
        match json {
            Ok(Some(text)) => serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
            Ok(None) => serde_json::Value::Null,
            Err(e) => {
                Python::attach(|py| drop(hook_error(py, "detail()", e)));
                serde_json::Value::Null
            }
        }
    }
}

/// A port's `(name, data type)` as a Python class declares it.
fn ports<T>(declared: Vec<(String, Option<String>)>, make: fn(&str, Option<&str>) -> T) -> Vec<T> {
    declared.iter().map(|(n, t)| make(n, t.as_deref())).collect()
}

/// Runs a Python port component as a daqflow component process until it ends; returns whether
/// it failed. `inputs` and `outputs` are the class's ports (`(name, data type or None)`);
/// `factory(name, config_json)` makes the object (a `daqflow.PortComponent`) at every
/// configure from its own keys (the configuration less the port keys); `process` and `schema`
/// are `_run_component`'s.
#[pyfunction]
#[pyo3(signature = (factory, *, kind, inputs, outputs, process, schema=None))]
pub fn _run_port_component(
    py: Python<'_>,
    factory: Py<PyAny>,
    kind: String,
    inputs: Vec<(String, Option<String>)>,
    outputs: Vec<(String, Option<String>)>,
    process: ProcessArgs,
    schema: Option<String>,
) -> PyResult<bool> {
    let inputs = ports(inputs, |n, t| t.map_or_else(|| InPort::new(n), |t| InPort::typed(n, t)));
    let outputs = ports(outputs, |n, t| t.map_or_else(|| OutPort::new(n), |t| OutPort::typed(n, t)));
    check_ports(&kind, &inputs, &outputs)?;
    let schema = schema
        .map(|json| schema_of(&kind, &json))
        .transpose()?
        .map(|own| daqflow_chain::ports::port_schema(own, &inputs, &outputs));
    let options = process.options(kind.clone())?;
    let kind_name: &'static str = Box::leak(kind.into_boxed_str());
    let names: Vec<String> = outputs.iter().map(|o| o.name.clone()).collect();
    let mut port_kind = daqflow_chain::ports::kind(
        kind_name,
        "a chain component with ports, written in Python",
        move |component, own| {
            let json = serde_json::to_string(&own)
                .map_err(|e| ComponentError::Config(format!("{component}: the configuration as JSON: {e}")))?;
            Python::attach(|py| {
                let object = factory.bind(py).call1((component, json)).map(Bound::unbind).map_err(|e| {
                    let e = hook_error(py, "making the component", e);
                    ComponentError::Config(e.to_string())
                })?;
                let slot: Slot = Arc::new(Mutex::new(None));
                let out = Py::new(py, PyOutputs { slot: slot.clone(), names: names.clone() })
                    .map_err(|e| ComponentError::Config(format!("{component}: {e}")))?;
                Ok(PyLogic { object, inputs: inputs.clone(), outputs: outputs.clone(), out, slot })
            })
        },
    );
    if let Some(schema) = schema {
        port_kind = port_kind.schema(schema);
    }
    let mut registry = Registry::new();
    registry.add(port_kind);
    crate::component::init_logging();
    let result = py.detach(|| daqflow_component::process::run(registry, options));
    result.map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}

/// The ports a class declares: at least one input, names unique within each direction, each a
/// key's word (the port keys are `listen.NAME` and `downstream.NAME`).
fn check_ports(kind: &str, inputs: &[InPort], outputs: &[OutPort]) -> PyResult<()> {
    if inputs.is_empty() {
        return Err(PyValueError::new_err(format!("{kind}: `inputs` declares no input port (at least one)")));
    }
    let word = |n: &str| {
        !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    for (direction, names) in [
        ("input", inputs.iter().map(|p| p.name.as_str()).collect::<Vec<_>>()),
        ("output", outputs.iter().map(|p| p.name.as_str()).collect()),
    ] {
        for (i, n) in names.iter().enumerate() {
            if !word(n) {
                return Err(PyValueError::new_err(format!(
                    "{kind}: {direction} port {n:?}: a name of letters, digits, `_` and `-` (1 to 64)"
                )));
            }
            if names[..i].contains(n) {
                return Err(PyValueError::new_err(format!("{kind}: {direction} port `{n}` is declared twice")));
            }
        }
    }
    for p in inputs {
        if p.name == "listen" {
            return Err(PyValueError::new_err(format!(
                "{kind}: input port `listen`: the name is taken (`${{NAME.listen}}` is the first input's address)"
            )));
        }
    }
    Ok(())
}
