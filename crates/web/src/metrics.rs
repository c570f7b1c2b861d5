//! The web server's own counters, named once here; they go to `/metrics` (after the backend's)
//! and to the `web` object of `/api/status`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Requests answered (including refused ones).
pub(crate) const REQUESTS_TOTAL: &str = "daqflow_web_requests_total";
/// Open event streams (`/api/events` and `/api/listen`).
pub(crate) const SSE_CLIENTS: &str = "daqflow_web_sse_clients";

/// The counters.
#[derive(Debug, Default)]
pub(crate) struct WebMetrics {
    requests_total: AtomicU64,
    sse_clients: AtomicUsize,
}

impl WebMetrics {
    /// Counts one request.
    pub fn request(&self) {
        self.requests_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an event stream opening.
    pub fn sse_opened(&self) {
        self.sse_clients.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an event stream closing.
    pub fn sse_closed(&self) {
        self.sse_clients.fetch_sub(1, Ordering::Relaxed);
    }

    /// Requests so far.
    pub fn requests_total(&self) -> u64 {
        self.requests_total.load(Ordering::Relaxed)
    }

    /// Event streams open now.
    pub fn sse_clients(&self) -> usize {
        self.sse_clients.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition of the counters.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP {REQUESTS_TOTAL} HTTP requests the web server answered.");
        let _ = writeln!(out, "# TYPE {REQUESTS_TOTAL} counter");
        let _ = writeln!(out, "{REQUESTS_TOTAL} {}", self.requests_total());
        let _ = writeln!(out, "# HELP {SSE_CLIENTS} Open server-sent-event streams.");
        let _ = writeln!(out, "# TYPE {SSE_CLIENTS} gauge");
        let _ = writeln!(out, "{SSE_CLIENTS} {}", self.sse_clients());
        out
    }
}
