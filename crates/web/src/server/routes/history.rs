//! `GET /api/history` and `GET /api/history/names`: the history of slow values
//! ([`Backend::history`](crate::Backend::history)).

use std::sync::Arc;

use daqflow_api::HistoryQuery;

use super::{Call, Reply, Shared, answer, backend_call, backend_error, check_parameters, now_ms, number_param, param};
use crate::http::{Request, Response};

/// The query parameters of `GET /api/history`.
pub(super) const HISTORY_PARAMETERS: [&str; 4] = ["name", "from", "to", "points"];

/// The query of `GET /api/history?name=NAME&from=MS&to=MS&points=N`: `to` defaults to now,
/// `from` to an hour before `to`, `points` to [`HistoryQuery::DEFAULT_POINTS`].
pub(super) fn history_query(request: &Request, now_ms: u64) -> Result<HistoryQuery, Response> {
    check_parameters(request, &HISTORY_PARAMETERS)?;
    let Some(name) = param(request, "name") else {
        return Err(Response::error(
            400,
            "the query parameter `name` (the value's name, e.g. `evm.events_per_s`) is missing; \
             GET /api/history/names lists them",
        ));
    };
    let to_ms = number_param(request, "to")?.unwrap_or(now_ms);
    let from_ms = number_param(request, "from")?.unwrap_or(to_ms.saturating_sub(HistoryQuery::DEFAULT_RANGE_MS));
    if from_ms > to_ms {
        return Err(Response::error(400, format!("`from` ({from_ms}) is after `to` ({to_ms})")));
    }
    let points = number_param(request, "points")?.unwrap_or(HistoryQuery::DEFAULT_POINTS);
    if !(1..=HistoryQuery::MAX_POINTS).contains(&points) {
        return Err(Response::error(400, format!("`points` must be 1 … {}, not {points}", HistoryQuery::MAX_POINTS)));
    }
    Ok(HistoryQuery { name: name.to_owned(), from_ms, to_ms, points })
}

/// `GET /api/history?name=NAME&from=MS&to=MS&points=N`.
pub(super) async fn history_series(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    let query = match history_query(call.request, now_ms()) {
        Ok(q) => q,
        Err(r) => return r.into(),
    };
    let name = query.name.clone();
    match backend_call(shared, move |b| b.history(&query)).await {
        Ok(Ok(Some(series))) => Response::json(200, &series).into(),
        Ok(Ok(None)) => {
            Response::error(404, format!("the history has no value `{name}` (GET /api/history/names lists the names)"))
                .into()
        }
        Ok(Err(e)) => backend_error(e).into(),
        Err(r) => r.into(),
    }
}

/// `GET /api/history/names`.
pub(super) async fn history_names(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    if let Err(r) = check_parameters(call.request, &[]) {
        return r.into();
    }
    answer(backend_call(shared, |b| b.history_names()).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(target: &str) -> Request {
        let bytes = format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n");
        let limits = crate::http::Limits { max_head: 16 * 1024, max_body: 1024 };
        match crate::http::parse_request(bytes.as_bytes(), &limits) {
            Ok(crate::http::Progress::Done(r, _)) => r,
            other => panic!("{other:?}"),
        }
    }

    fn refusal(target: &str) -> String {
        let r = history_query(&request(target), 10_000_000).expect_err("refused");
        assert_eq!(r.status, 400);
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        body["error"].as_str().unwrap().to_owned()
    }

    #[test]
    fn the_history_query_has_defaults_and_refuses_what_it_cannot_take() {
        let q = history_query(&request("/api/history?name=evm.events"), 10_000_000).unwrap();
        assert_eq!(
            q,
            HistoryQuery {
                name: "evm.events".into(),
                from_ms: 10_000_000 - 3_600_000,
                to_ms: 10_000_000,
                points: HistoryQuery::DEFAULT_POINTS
            }
        );
        let q = history_query(&request("/api/history?name=hv%2Fstate.v&from=5&to=9&points=2"), 1).unwrap();
        assert_eq!((q.name.as_str(), q.from_ms, q.to_ms, q.points), ("hv/state.v", 5, 9, 2));
        assert!(refusal("/api/history").contains("`name`"));
        assert!(refusal("/api/history?name=").contains("`name`"));
        assert_eq!(refusal("/api/history?name=a&from=9&to=5"), "`from` (9) is after `to` (5)");
        assert_eq!(refusal("/api/history?name=a&points=0"), "`points` must be 1 … 10000, not 0");
        assert_eq!(refusal("/api/history?name=a&points=10001"), "`points` must be 1 … 10000, not 10001");
        assert!(refusal("/api/history?name=a&from=yesterday").contains("`from` must be a non-negative integer"));
        assert!(refusal("/api/history?name=a&step=5").starts_with("unknown query parameter `step`"));
        assert!(refusal("/api/history?name=a&name=b").contains("`name` is given more than once"));
    }
}
