//! The history of slow values (`GET /api/history`): every number of every component's
//! statistics (`COMPONENT.KEY`, the names of [`Stats::values`](crate::Stats::values)), the
//! operator's own (`system.KEY`) and those of the services a system file names, sampled into
//! the run database at a set interval. A query asks for one name over a time range and at most
//! a number of points; a range holding more samples than that comes back down-sampled, one
//! point per time bucket with the bucket's mean, minimum and maximum.

use serde::{Deserialize, Serialize};

/// What `GET /api/history` asks: one slow value over `[from_ms, to_ms]`, at most `points`
/// points.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryQuery {
    /// The value's name: `COMPONENT.KEY` (`evm.events_per_s`), `system.KEY`, or a service's
    /// `SERVICE.PATH` (`hv/state.voltage`).
    pub name: String,
    /// From (Unix ms, inclusive).
    pub from_ms: u64,
    /// To (Unix ms, inclusive).
    pub to_ms: u64,
    /// At most this many points (1 … [`HistoryQuery::MAX_POINTS`]).
    pub points: usize,
}

impl HistoryQuery {
    /// The most points one query returns.
    pub const MAX_POINTS: usize = 10_000;
    /// Points returned when the query does not say.
    pub const DEFAULT_POINTS: usize = 1000;
    /// The time range when the query does not say: the last hour (ms).
    pub const DEFAULT_RANGE_MS: u64 = 3_600_000;
}

/// One point of a history: one sample, or the samples of one time bucket.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HistoryPoint {
    /// When (Unix ms): the sample's time, or the middle of the first and last sample of the
    /// bucket.
    pub t_ms: u64,
    /// The value, or the bucket's mean.
    pub value: f64,
    /// The bucket's smallest value (the value for one sample).
    pub min: f64,
    /// The bucket's largest value (the value for one sample).
    pub max: f64,
    /// How many samples the point stands for.
    pub count: u64,
}

/// The answer to a [`HistoryQuery`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistorySeries {
    /// The value's name.
    pub name: String,
    /// The range asked for (Unix ms).
    pub from_ms: u64,
    /// The range asked for (Unix ms).
    pub to_ms: u64,
    /// The width of a bucket (ms) when the samples were down-sampled; 0 when every sample is
    /// a point of its own.
    pub bucket_ms: u64,
    /// The points, oldest first.
    pub points: Vec<HistoryPoint>,
}
