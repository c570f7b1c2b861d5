//! The web server's own counters, named once here; they go to `/metrics` (after the backend's)
//! and to the `web` object of `/api/status`.

use daqflow_metrics::{Exposition, MetricType};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Requests answered (including refused ones).
pub(crate) const REQUESTS_TOTAL: &str = "daqflow_web_requests_total";
/// Open event streams (`/api/events` and `/api/listen`).
pub(crate) const SSE_CLIENTS: &str = "daqflow_web_sse_clients";
/// Requests refused and connections closed, by reason.
pub(crate) const REFUSED_TOTAL: &str = "daqflow_web_refused_total";

/// Why a request was refused or a connection closed (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The `Host` header is missing or names another host (DNS rebinding).
    BadHost,
    /// The `Origin` header names another origin (a cross-site request).
    BadOrigin,
    /// A login with a wrong token.
    LoginFailure,
    /// A request that needs a (logged-in) session came without one.
    NoSession,
    /// A request did not arrive whole within the request timeout.
    Timeout,
    /// A connection idle or incomplete the longest was closed to make room for a newcomer.
    Evicted,
    /// A connection was refused (503): no room.
    Busy,
}

impl Refusal {
    const ALL: [Refusal; 7] = [
        Refusal::BadHost,
        Refusal::BadOrigin,
        Refusal::LoginFailure,
        Refusal::NoSession,
        Refusal::Timeout,
        Refusal::Evicted,
        Refusal::Busy,
    ];

    /// The `reason` label's value.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::BadHost => "bad_host",
            Refusal::BadOrigin => "bad_origin",
            Refusal::LoginFailure => "login_failure",
            Refusal::NoSession => "no_session",
            Refusal::Timeout => "timeout",
            Refusal::Evicted => "evicted",
            Refusal::Busy => "busy",
        }
    }
}

/// The counters.
#[derive(Debug, Default)]
pub(crate) struct WebMetrics {
    requests_total: AtomicU64,
    sse_clients: AtomicUsize,
    refused: [AtomicU64; Refusal::ALL.len()],
}

impl WebMetrics {
    /// Counts one request.
    pub fn request(&self) {
        self.requests_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `n` refusals for `reason`.
    pub fn refused(&self, reason: Refusal, n: usize) {
        self.refused[reason as usize].fetch_add(n as u64, Ordering::Relaxed);
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
        let mut e = Exposition::new();
        e.family(REQUESTS_TOTAL, "HTTP requests the web server answered.", MetricType::Counter)
            .sample(&[], self.requests_total());
        e.family(SSE_CLIENTS, "Open server-sent-event streams.", MetricType::Gauge).sample(&[], self.sse_clients());
        let mut refused = e.family(
            REFUSED_TOTAL,
            "Requests the web server refused and connections it closed, by reason.",
            MetricType::Counter,
        );
        for reason in Refusal::ALL {
            refused.sample(&[("reason", reason.label())], self.refused[reason as usize].load(Ordering::Relaxed));
        }
        e.into_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_under_their_reason() {
        let m = WebMetrics::default();
        m.refused(Refusal::Timeout, 2);
        m.refused(Refusal::Busy, 1);
        let text = m.prometheus();
        assert!(text.contains("daqflow_web_refused_total{reason=\"timeout\"} 2\n"), "{text}");
        assert!(text.contains("daqflow_web_refused_total{reason=\"busy\"} 1\n"), "{text}");
        assert!(text.contains("daqflow_web_refused_total{reason=\"bad_host\"} 0\n"), "{text}");
        for r in Refusal::ALL {
            assert_eq!(Refusal::ALL[r as usize], r);
        }
    }
}
