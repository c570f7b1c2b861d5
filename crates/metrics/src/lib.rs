//! # daqflow-metrics: Prometheus metrics for every daqflow process
//!
//! Every long-running daqflow process (an ET system, a control server, a component, the
//! operator's web server) can be scraped by Prometheus. This crate is what they share, and
//! nothing else: no daqflow type, no async runtime, no HTTP framework.
//!
//! - [`Exposition`]: Prometheus' text exposition format (version 0.0.4), the one formatter of
//!   the workspace: `# HELP` and `# TYPE` once per family, label values escaped, integers
//!   exact, `NaN` and `±Inf` spelled as Prometheus reads them.
//! - [`MetricsServer`]: a minimal HTTP/1.1 listener on `std::net`, one thread, that answers
//!   `GET /metrics` (and `HEAD`) with what a render function gives, `404` for any other path,
//!   `405` for any other method and `400`, `408` or `431` for a request that is not one. A
//!   request head is at most [`Limits::max_request_bytes`] and must arrive whole within
//!   [`Limits::request_timeout`]; at most [`Limits::max_connections`] are served at a time, a
//!   connection over that gets `503`. One request per connection (`Connection: close`).
//!   Whatever a client sends, the listener answers or closes that connection and goes on.
//!
//! What each process exports (the metric names) is documented in `docs/operator-guide.md`,
//! "Monitoring with Prometheus", and the web server's in `docs/web.md`, "Metrics".
//!
//! ```
//! use std::io::{Read, Write};
//! use daqflow_metrics::{Exposition, Limits, MetricType, MetricsServer};
//!
//! let render = || {
//!     let mut e = Exposition::new();
//!     e.family("daqflow_example_events_total", "Events seen.", MetricType::Counter)
//!         .sample(&[("station", "mon \"1\"")], 42u64);
//!     e.into_string()
//! };
//! assert_eq!(
//!     render(),
//!     concat!(
//!         "# HELP daqflow_example_events_total Events seen.\n",
//!         "# TYPE daqflow_example_events_total counter\n",
//!         "daqflow_example_events_total{station=\"mon \\\"1\\\"\"} 42\n",
//!     )
//! );
//!
//! let server = MetricsServer::bind("127.0.0.1:0", Limits::default(), render)?;
//! let mut tcp = std::net::TcpStream::connect(server.local_addr())?;
//! tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
//! let mut answer = String::new();
//! tcp.read_to_string(&mut answer)?;
//! assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"));
//! assert!(answer.ends_with("daqflow_example_events_total{station=\"mon \\\"1\\\"\"} 42\n"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod exposition;
mod http;

pub use exposition::{Exposition, Family, MetricType, Value, escape_label_value};
pub use http::{BindError, Limits, Method, MetricsServer, Request, RequestError, parse_request};
