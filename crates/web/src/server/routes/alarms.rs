//! The alarms' routes: `GET /api/alarms` and `POST /api/alarms/ack` (`docs/web.md`).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Call, Reply, Shared, answer, backend_call, backend_error, label, object_body};
use crate::http::Response;

/// The longest `who` accepted, in characters.
const WHO_MAX: usize = 100;

/// `GET /api/alarms`: every alarm with its state, and the recent alarm events.
pub(super) async fn alarms_status(shared: &Arc<Shared>, _call: &Call<'_>) -> Reply {
    answer(backend_call(shared, |b| b.alarms()).await)
}

/// `POST /api/alarms/ack` `{"name": ALARM, "who": PERSON}` (`who` optional): the controller
/// acknowledges an alarm; the event records `who` and the session's label.
pub(super) async fn alarms_ack(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    const SHAPE: &str = "{\"name\": ALARM, \"who\": PERSON (optional)}";
    let body = match object_body(call.request, &["name", "who"], SHAPE) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    let name = match body.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        None | Some(Value::Null) => return Response::error(400, format!("`name` is missing: {SHAPE}")).into(),
        Some(_) => return Response::error(400, format!("`name` must be a non-empty string: {SHAPE}")).into(),
    };
    let person = match body.get("who") {
        None | Some(Value::Null) => None,
        Some(Value::String(w)) if w.trim().is_empty() => None,
        Some(Value::String(w)) if w.chars().count() <= WHO_MAX && !w.chars().any(char::is_control) => {
            Some(w.trim().to_owned())
        }
        Some(_) => {
            return Response::error(
                400,
                format!("`who` must be a name of at most {WHO_MAX} characters, none of them control characters"),
            )
            .into();
        }
    };
    let client = call.session.as_deref().and_then(|s| shared.label_of(s)).map(label);
    let who = match (person, client) {
        (Some(p), Some(c)) => format!("{p} ({c}, {})", call.peer.ip()),
        (Some(p), None) => format!("{p} ({})", call.peer.ip()),
        (None, Some(c)) => format!("{c} ({})", call.peer.ip()),
        (None, None) => call.peer.ip().to_string(),
    };
    tracing::info!(alarm = name, who, "web: acknowledge alarm");
    let result = backend_call(shared, move |b| b.acknowledge_alarm(&name, &who)).await;
    match result {
        Ok(Ok(alarm)) => Response::json(200, &json!({ "alarm": alarm })).into(),
        Ok(Err(e)) => backend_error(e).into(),
        Err(r) => r.into(),
    }
}
