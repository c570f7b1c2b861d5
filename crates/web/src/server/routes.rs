//! The route table: every route of the UI and the API, declared once in [`ROUTES`] with its
//! method, its path, who may call it ([`Access`]) and its handler. [`dispatch`] uses it for
//! everything: it finds the route of a request (404 without one, 405 with `Allow` when only the
//! method is wrong), checks the caller (Host, Origin, `X-Daqflow-Client`, session, control) as
//! the route's access says, and calls the handler. `docs/web.md`'s route list is checked
//! against the table by a unit test below, both ways.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use daqflow_api::{LogQuery, Severity, Transition};
use serde_json::{Map, Value, json};

use super::{Broadcast, Reply, Shared, backend_call, now_ms, sse_event};
use crate::BackendError;
use crate::access::origin_matches;
use crate::control::Holder;
use crate::http::{Request, Response, Version};
use crate::metrics::Refusal;
use crate::session::{constant_time_eq, label, set_cookie};
use crate::ui;

mod history;
use history::{history_names, history_series};
mod alarms;
use alarms::{alarms_ack, alarms_status};

/// The header every POST must carry. Browsers send a custom header cross-origin only after a
/// CORS preflight, which this server never grants: so a page of another site cannot POST here.
/// Its value is not an identity (the session is).
pub(crate) const CLIENT_HEADER: &str = "X-Daqflow-Client";
/// The query parameters of `GET /api/logs`: the fields of [`LogQuery`] (a unit test keeps them
/// the same).
const LOG_PARAMETERS: [&str; 6] = ["since_ms", "until_ms", "process", "min_severity", "text", "limit"];
/// Default and maximum `limit` of `/api/runs`.
const RUNS_DEFAULT_LIMIT: usize = 50;
const RUNS_MAX_LIMIT: usize = 10_000;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Anyone, from any page: the UI's files, which hold nothing (no `Origin` check).
    Page,
    /// Anyone, from this server's pages or from no page (the login).
    Anyone,
    /// Watchers: anyone, or with `token_to_watch` only a session logged in with the token.
    Watch,
    /// A session that may act: logged in with the token (without a token, any session).
    Session,
    /// The session that controls the run.
    Controller,
}

#[cfg(test)]
impl Access {
    /// What the "needs" column of `docs/web.md`'s route list says.
    fn needs(self) -> &'static str {
        match self {
            Access::Page | Access::Anyone => "nothing",
            Access::Watch => "watching",
            Access::Session => "a session that may act",
            Access::Controller => "the controller",
        }
    }
}

/// A request on its way to its handler, its caller checked.
struct Call<'a> {
    request: &'a Request,
    /// The values of the route's `{…}` path segments, in order.
    params: Vec<&'a str>,
    /// The caller's live session, if it has one; for [`Access::Session`] and
    /// [`Access::Controller`] routes, one that may act.
    session: Option<String>,
    peer: SocketAddr,
}

impl Call<'_> {
    /// The session of a caller that may act (the route's access checked it).
    fn acting(&self) -> Result<&str, Response> {
        self.session.as_deref().ok_or_else(|| Response::error(403, "this needs a session that may act"))
    }

    /// The route's first `{…}` path segment.
    fn param(&self) -> &str {
        self.params.first().copied().unwrap_or_default()
    }
}

/// What answers a route.
type Handler = for<'a> fn(&'a Arc<Shared>, &'a Call<'a>) -> Pin<Box<dyn Future<Output = Reply> + Send + 'a>>;

/// One route.
pub(crate) struct Route {
    /// `GET` or `POST`.
    method: &'static str,
    /// The path: literal segments, and `{name}` segments that match any one non-empty segment
    /// (handed to the handler).
    path: &'static str,
    /// Who may call it.
    access: Access,
    /// What answers it.
    handler: Handler,
}

impl Route {
    /// The values of the `{…}` segments if `path` is this route's.
    fn matches<'p>(&self, path: &'p str) -> Option<Vec<&'p str>> {
        let mut params = Vec::new();
        let mut given = path.split('/');
        for pattern in self.path.split('/') {
            let segment = given.next()?;
            if pattern.starts_with('{') && pattern.ends_with('}') {
                if segment.is_empty() {
                    return None;
                }
                params.push(segment);
            } else if pattern != segment {
                return None;
            }
        }
        given.next().is_none().then_some(params)
    }
}

/// A route: `route!("GET", "/api/status", Watch, status)` with `async fn status(&Arc<Shared>,
/// &Call) -> Reply`.
macro_rules! route {
    ($method:literal, $path:literal, $access:ident, $handler:ident) => {
        Route {
            method: $method,
            path: $path,
            access: Access::$access,
            handler: |shared, call| Box::pin($handler(shared, call)),
        }
    };
}

/// Every route the server answers, in `docs/web.md`'s order.
static ROUTES: &[Route] = &[
    route!("GET", "/", Page, ui_file),
    route!("GET", "/index.html", Page, ui_file),
    route!("GET", "/app.js", Page, ui_file),
    route!("GET", "/style.css", Page, ui_file),
    route!("POST", "/api/login", Anyone, login),
    route!("GET", "/api/status", Watch, status),
    route!("GET", "/api/events", Watch, events),
    route!("GET", "/api/control", Watch, control),
    route!("POST", "/api/control/take", Session, take_control),
    route!("POST", "/api/control/release", Session, release_control),
    route!("POST", "/api/transition/{name}", Controller, transition),
    route!("POST", "/api/command", Controller, command),
    route!("POST", "/api/set", Controller, set),
    route!("POST", "/api/repeat", Controller, repeat),
    route!("GET", "/api/processes", Watch, processes),
    route!("GET", "/api/listen", Session, listen),
    route!("GET", "/api/logs", Watch, logs),
    route!("GET", "/api/runs", Watch, runs),
    route!("GET", "/api/runs/{n}", Watch, run),
    route!("GET", "/api/histograms", Watch, histograms),
    route!("GET", "/api/et", Watch, et),
    route!("GET", "/api/schema", Watch, schemas),
    route!("GET", "/api/history", Watch, history_series),
    route!("GET", "/api/history/names", Watch, history_names),
    route!("GET", "/api/alarms", Watch, alarms_status),
    route!("POST", "/api/alarms/ack", Controller, alarms_ack),
    route!("GET", "/metrics", Watch, metrics),
];

/// Answers one request: finds its route, checks the caller, calls the handler.
pub(super) async fn dispatch(shared: &Arc<Shared>, request: &Request, peer: SocketAddr) -> Reply {
    let host = match check_host(shared, request) {
        Ok(h) => h,
        Err(response) => {
            shared.metrics.refused(Refusal::BadHost, 1);
            tracing::debug!(%peer, "web: refused a request for another Host");
            return response.into();
        }
    };
    let path = request.path.as_str();
    let mut allowed: Vec<&str> = Vec::new();
    let mut found = None;
    for route in ROUTES {
        if let Some(params) = route.matches(path) {
            if route.method == request.method {
                found = Some((route, params));
                break;
            }
            if !allowed.contains(&route.method) {
                allowed.push(route.method);
            }
        }
    }
    let Some((route, params)) = found else {
        if allowed.is_empty() {
            return Response::error(404, format!("no such resource: {path} (the API is described in docs/web.md)"))
                .into();
        }
        let allow = allowed.join(", ");
        return Response::error(405, format!("{} is not allowed on {path} (allowed: {allow})", request.method))
            .with_header("Allow", allow)
            .into();
    };
    if route.access != Access::Page
        && let Err(response) = check_origin(request, host)
    {
        shared.metrics.refused(Refusal::BadOrigin, 1);
        tracing::debug!(%peer, "web: refused a request from another origin");
        return response.into();
    }
    if request.method == "POST" && request.header(CLIENT_HEADER).is_none() {
        return Response::error(
            400,
            format!("a POST needs the header {CLIENT_HEADER} (any value, e.g. `{CLIENT_HEADER}: 1`); see docs/web.md"),
        )
        .into();
    }
    let mut session = shared.caller(request);
    shared.expire_control();
    match route.access {
        Access::Page | Access::Anyone => {}
        Access::Watch => {
            if shared.options.token_to_watch && !shared.may_act(session.as_deref()) {
                shared.metrics.refused(Refusal::NoSession, 1);
                return Response::error(
                    403,
                    format!(
                        "this server lets only sessions logged in with the web token watch: {}",
                        login_hint(shared)
                    ),
                )
                .into();
            }
        }
        Access::Session | Access::Controller => {
            let id = match need_session(shared, session.as_deref()) {
                Ok(id) => id,
                Err(response) => return response.into(),
            };
            if route.access == Access::Controller
                && let Err(response) = require_control(shared, &id)
            {
                return response.into();
            }
            session = Some(id);
        }
    }
    let call = Call { request, params, session, peer };
    (route.handler)(shared, &call).await
}

// ---- who may call ------------------------------------------------------------------------

/// The `Host` check: 400 without one (HTTP/1.1), 421 when it names another host.
fn check_host<'r>(shared: &Shared, request: &'r Request) -> Result<Option<&'r str>, Response> {
    let mut hosts = request.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("host")).map(|(_, v)| v.as_str());
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(Response::error(400, "more than one Host header field"));
    }
    match host {
        None if request.version == Version::Http10 => Ok(None),
        None => Err(Response::error(400, "an HTTP/1.1 request needs a Host header field")),
        Some(h) if shared.hosts.allows(h) => Ok(Some(h)),
        Some(h) => Err(Response::error(
            421,
            format!(
                "this server does not answer for the Host `{h}`: use the address it printed (or 127.0.0.1, \
                 localhost, [::1] with its port), or add the name to the web server's allowed hosts"
            ),
        )),
    }
}

/// The `Origin` check: a request sent by a page of another origin is refused.
fn check_origin(request: &Request, host: Option<&str>) -> Result<(), Response> {
    let mut origins = request.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("origin")).map(|(_, v)| v.as_str());
    let Some(origin) = origins.next() else { return Ok(()) };
    if origins.next().is_none() && host.is_some_and(|h| origin_matches(origin, h)) {
        return Ok(());
    }
    Err(Response::error(
        403,
        format!(
            "the request comes from a page of another origin (Origin `{origin}`); only this server's own pages \
             may act on it or open its event streams"
        ),
    ))
}

/// What a client without a (logged-in) session is told.
fn login_hint(shared: &Shared) -> String {
    if shared.token_required() {
        "open the URL the operator printed (http://HOST:PORT/?token=…), or POST /api/login with \
         {\"token\": \"…\"} and send the cookie daqflow_session it sets"
            .to_owned()
    } else {
        "load the UI (GET /) or POST /api/login to get a session, and send the cookie daqflow_session it sets"
            .to_owned()
    }
}

/// The caller's session if it may act; else a 403 that says how to get one.
fn need_session(shared: &Shared, session: Option<&str>) -> Result<String, Response> {
    match session {
        Some(id) if shared.may_act(Some(id)) => Ok(id.to_owned()),
        _ => {
            shared.metrics.refused(Refusal::NoSession, 1);
            let what = if shared.token_required() {
                "this needs a session logged in with the web token (without one you may only watch)"
            } else {
                "this needs a session"
            };
            Err(Response::error(403, format!("{what}: {}", login_hint(shared))))
        }
    }
}

/// Refuses a request of a session that does not control.
fn require_control(shared: &Shared, session: &str) -> Result<(), Response> {
    let clients = shared.clients();
    match clients.control.holder() {
        Some(h) if h.session == session => Ok(()),
        Some(h) => Err(holder_refusal(
            403,
            format!(
                "you do not control the run: {} does; take control first (POST /api/control/take, \
                 with \"force\": true to take it over)",
                label(h.label)
            ),
            h,
        )),
        None => Err(Response::error(
            403,
            "you do not control the run: nobody does; take control first (POST /api/control/take)",
        )),
    }
}

fn holder_refusal(status: u16, message: String, holder: &Holder) -> Response {
    Response::json(status, &json!({ "error": message, "holder": label(holder.label), "since_ms": holder.since_ms }))
}

// ---- what requests carry -----------------------------------------------------------------

/// The JSON body of a request (`null` when empty).
fn json_body(request: &Request) -> Result<Value, Response> {
    if request.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&request.body)
        .map_err(|e| Response::error(400, format!("the request body is not valid JSON: {e}")))
}

/// The JSON body of a request that takes an object with the fields `known` (`shape` shows it
/// in error messages); an empty body or `null` is an empty object.
fn object_body(request: &Request, known: &[&str], shape: &str) -> Result<Map<String, Value>, Response> {
    let map = match json_body(request)? {
        Value::Null => Map::new(),
        Value::Object(map) => map,
        other => {
            let kind = match other {
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                _ => "an array",
            };
            return Err(Response::error(400, format!("the body must be a JSON object, {shape}, not {kind}")));
        }
    };
    if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
        let fields = if known.is_empty() {
            "none".to_owned()
        } else {
            known.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
        };
        return Err(Response::error(400, format!("unknown field `{unknown}` in the body (known: {fields}): {shape}")));
    }
    Ok(map)
}

/// Refuses query parameters a route does not take, and a parameter given twice.
fn check_parameters(request: &Request, known: &[&str]) -> Result<(), Response> {
    let mut unknown: Vec<&str> = Vec::new();
    for (name, _) in &request.query {
        if !known.contains(&name.as_str()) && !unknown.contains(&name.as_str()) {
            unknown.push(name);
        }
    }
    if !unknown.is_empty() {
        let list = |names: &[&str]| names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
        let s = if unknown.len() == 1 { "" } else { "s" };
        return Err(Response::error(
            400,
            format!("unknown query parameter{s} {} (known: {})", list(&unknown), list(known)),
        ));
    }
    if let Some(twice) = known.iter().find(|k| request.query.iter().filter(|(n, _)| n == *k).count() > 1) {
        return Err(Response::error(400, format!("the query parameter `{twice}` is given more than once")));
    }
    Ok(())
}

/// A non-empty query parameter.
fn param<'a>(request: &'a Request, name: &str) -> Option<&'a str> {
    request.query(name).filter(|v| !v.is_empty())
}

fn number_param<T: std::str::FromStr>(request: &Request, name: &str) -> Result<Option<T>, Response> {
    match param(request, name) {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| Response::error(400, format!("`{name}` must be a non-negative integer, not `{v}`"))),
    }
}

/// The message browser's query, from the query string of `GET /api/logs`; its `limit` is
/// always given (the default, or at most [`LogQuery::MAX_LIMIT`]).
fn log_query(request: &Request) -> Result<LogQuery, Response> {
    check_parameters(request, &LOG_PARAMETERS)?;
    let min_severity = match param(request, "min_severity") {
        None => None,
        Some(s) => Some(Severity::parse(s).ok_or_else(|| {
            let names: Vec<&str> = Severity::ALL.iter().map(|s| s.name()).collect();
            Response::error(400, format!("`min_severity` must be one of {}, not `{s}`", names.join(", ")))
        })?),
    };
    let mut query = LogQuery {
        since_ms: number_param(request, "since_ms")?,
        until_ms: number_param(request, "until_ms")?,
        process: param(request, "process").map(str::to_owned),
        min_severity,
        text: param(request, "text").map(str::to_owned),
        limit: number_param(request, "limit")?,
    };
    query.limit = Some(query.limit());
    Ok(query)
}

/// A backend error as a response: its status, `{"error": text}`.
fn backend_error(e: BackendError) -> Response {
    Response::error(e.status(), e.text())
}

/// The answer to a backend call that returns a value or a [`BackendError`].
fn answer<T: serde::Serialize>(result: Result<Result<T, BackendError>, Response>) -> Reply {
    match result {
        Ok(Ok(value)) => Response::json(200, &value),
        Ok(Err(e)) => backend_error(e),
        Err(r) => r,
    }
    .into()
}

// ---- handlers ----------------------------------------------------------------------------

/// `GET /`, `/index.html`, `/app.js`, `/style.css`; `GET /?token=T` logs in.
async fn ui_file(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    let Some(asset) = ui::asset(&call.request.path) else {
        return Response::error(404, format!("no such file: {}", call.request.path)).into();
    };
    let is_page = asset.content_type.starts_with("text/html");
    let mut status = 200;
    if let (true, Some(token)) = (is_page, call.request.query("token")) {
        if token_is_right(shared, token) {
            return token_login(shared, call.session.as_deref()).into();
        }
        // A wrong or stale token (an earlier start's URL): refused, counted, logged and held
        // back as any wrong login, but a browser gets the page (with status 403), which sees
        // the token in its address, says why it was refused and offers the login form.
        status = 403;
    }
    let mut r = Response::new(status, asset.content_type, asset.body).with_header("Cache-Control", "no-cache");
    if is_page {
        r = r
            .with_header("Content-Security-Policy", ui::CONTENT_SECURITY_POLICY)
            .with_header("X-Frame-Options", "DENY")
            .with_header("Referrer-Policy", "no-referrer");
        // Without a token, the page's first visit gets an anonymous session.
        if !shared.token_required() && call.session.is_none() {
            match shared.new_session() {
                Ok((id, _)) => r = r.with_header("Set-Cookie", set_cookie(&id)),
                Err(e) => return e.into(),
            }
        }
    }
    if status == 403 {
        return shared.login_failed(call.peer, r);
    }
    r.into()
}

/// Whether `given` is the access token (always true without one).
fn token_is_right(shared: &Shared, given: &str) -> bool {
    shared.options.access_token.as_ref().is_none_or(|t| constant_time_eq(t.as_bytes(), given.as_bytes()))
}

/// A login with a wrong token: counted, logged, refused after a while
/// ([`Shared::login_failed`]).
fn login_refused(shared: &Arc<Shared>, peer: SocketAddr) -> Reply {
    shared.login_failed(
        peer,
        Response::error(
            403,
            "wrong token: use the one the operator printed in its web UI URL (also in <data dir>/web-token)",
        ),
    )
}

/// The session a successful login gives: the caller's own if it already may act, else a new one.
fn login_session(shared: &Shared, session: Option<&str>) -> Result<(String, u64), Response> {
    if let Some(id) = session
        && shared.may_act(Some(id))
        && let Some(n) = shared.label_of(id)
    {
        return Ok((id.to_owned(), n));
    }
    let (id, n) = shared.new_session()?;
    tracing::info!(client = label(n), "web: a client logged in");
    Ok((id, n))
}

/// `GET /?token=T` with the right token: the session cookie, and a redirect to `/` that takes
/// the token out of the address bar.
fn token_login(shared: &Shared, session: Option<&str>) -> Response {
    match login_session(shared, session) {
        Ok((id, _)) => Response::new(303, "text/plain; charset=utf-8", "logged in; go to /\n")
            .with_header("Location", "/")
            .with_header("Set-Cookie", set_cookie(&id))
            .with_header("Referrer-Policy", "no-referrer"),
        Err(r) => r,
    }
}

/// `POST /api/login` `{"token": "…"}`.
async fn login(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    const SHAPE: &str = "{\"token\": \"…\"}";
    let body = match object_body(call.request, &["token"], SHAPE) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    let given = match body.get("token") {
        Some(Value::String(t)) => Some(t.as_str()),
        None | Some(Value::Null) => None,
        Some(_) => return Response::error(400, format!("`token` must be a string: {SHAPE}")).into(),
    };
    if shared.token_required() {
        let Some(given) = given else {
            return Response::error(400, format!("the body must give the web token: {SHAPE}")).into();
        };
        if !token_is_right(shared, given) {
            return login_refused(shared, call.peer);
        }
    }
    match login_session(shared, call.session.as_deref()) {
        Ok((id, n)) => Response::json(200, &json!({ "me": label(n), "may_control": true }))
            .with_header("Set-Cookie", set_cookie(&id))
            .into(),
        Err(r) => r.into(),
    }
}

/// `GET /api/status`.
async fn status(shared: &Arc<Shared>, _call: &Call<'_>) -> Reply {
    match shared.status().await {
        Ok(status) => Response::json(200, &status).into(),
        Err(r) => r.into(),
    }
}

/// `GET /api/events`.
async fn events(_shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    Reply::Events { session: call.session.clone() }
}

/// `GET /api/control`.
async fn control(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    Response::json(200, &shared.control_json(call.session.as_deref())).into()
}

/// `POST /api/control/take` `{"force": false}`.
async fn take_control(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    let session = match call.acting() {
        Ok(s) => s,
        Err(r) => return r.into(),
    };
    const SHAPE: &str = "{\"force\": false}";
    let force = match object_body(call.request, &["force"], SHAPE) {
        Ok(body) => match body.get("force") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(f)) => *f,
            Some(_) => return Response::error(400, format!("`force` must be true or false: {SHAPE}")).into(),
        },
        Err(r) => return r.into(),
    };
    let result = {
        let mut clients = shared.clients();
        let Some(n) = clients.sessions.get(session, Instant::now()).map(|s| s.label) else {
            return Response::error(403, format!("your session just ended: {}", login_hint(shared))).into();
        };
        clients.control.take(session, n, force, now_ms()).map(|changed| (changed, n))
    };
    match result {
        Ok((changed, n)) => {
            if changed {
                tracing::info!(client = label(n), force, "web: a client took control");
                shared.publish_control();
            }
            Response::json(200, &shared.control_json(Some(session))).into()
        }
        Err(holder) => holder_refusal(
            409,
            format!(
                "{} controls since {} (Unix ms); take over with \"force\": true",
                label(holder.label),
                holder.since_ms
            ),
            &holder,
        )
        .into(),
    }
}

/// `POST /api/control/release`.
async fn release_control(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    let session = match call.acting() {
        Ok(s) => s,
        Err(r) => return r.into(),
    };
    let result = shared.clients().control.release(session);
    match result {
        Ok(changed) => {
            if changed {
                tracing::info!(client = shared.label_of(session).map(label), "web: a client released control");
                shared.publish_control();
            }
            Response::json(200, &shared.control_json(Some(session))).into()
        }
        Err(holder) => {
            holder_refusal(403, format!("you do not control: {} does; it may release", label(holder.label)), &holder)
                .into()
        }
    }
}

/// `POST /api/transition/{name}`: the transition, parsed by [`Transition::parse`]; its result
/// or its error, also sent to every event stream.
async fn transition(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    let transition = match Transition::parse(call.param(), &call.request.body) {
        Ok(t) => t,
        Err(e) => return Response::error(400, e.to_string()).into(),
    };
    let name = transition.name();
    let client = call.session.as_deref().and_then(|s| shared.label_of(s)).map(label).unwrap_or_default();
    tracing::info!(client, ?transition, "web: transition");
    shared.poke.notify_one();
    let result = backend_call(shared, move |b| b.transition(transition)).await;
    shared.poke.notify_one();
    let result = match result {
        Ok(Ok(done)) => serde_json::to_value(done).map_err(|e| {
            tracing::error!("web: the result of {name} cannot be written as JSON: {e}");
            BackendError::Failed(format!("{name} was done, but its result cannot be written as JSON: {e}"))
        }),
        Ok(Err(e)) => Err(e),
        Err(r) => {
            let event = json!({"transition": name, "client": client, "ok": false, "error": "the backend failed"});
            let _ = shared.events.send(Broadcast::Event(sse_event("transition", &event.to_string()).into()));
            return r.into();
        }
    };
    let (response, event) = match result {
        Ok(result) => (
            Response::json(200, &json!({"transition": name, "result": result})),
            json!({"transition": name, "client": client, "ok": true, "result": result}),
        ),
        Err(e) => (
            Response::json(e.status(), &json!({"transition": name, "error": e.text()})),
            json!({"transition": name, "client": client, "ok": false, "error": e.text()}),
        ),
    };
    let _ = shared.events.send(Broadcast::Event(sse_event("transition", &event.to_string()).into()));
    response.into()
}

/// `POST /api/command` `{"name": COMMAND, "data": TEXT}`.
async fn command(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    const SHAPE: &str = "{\"name\": COMMAND, \"data\": TEXT}";
    let body = match object_body(call.request, &["name", "data"], SHAPE) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    let name = match body.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        None | Some(Value::Null) => {
            return Response::error(400, format!("`name` (the command) is missing: {SHAPE}")).into();
        }
        Some(_) => return Response::error(400, format!("`name` must be a non-empty string: {SHAPE}")).into(),
    };
    let data = match body.get("data") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    tracing::info!(client = call.session.as_deref().and_then(|s| shared.label_of(s)).map(label), name, "web: command");
    let command = name.clone();
    match backend_call(shared, move |b| b.send_command(&command, &data)).await {
        Ok(Ok(received)) => Response::json(200, &json!({"name": name, "received": received})).into(),
        Ok(Err(e)) => backend_error(e).into(),
        Err(r) => r.into(),
    }
}

/// `POST /api/set` `{"component": NAME, "key": KEY, "value": VALUE}`: a parameter for the next
/// configure (`value` null: back to the system file's).
async fn set(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    const SHAPE: &str = "{\"component\": NAME, \"key\": KEY, \"value\": VALUE}";
    let body = match object_body(call.request, &["component", "key", "value"], SHAPE) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    let text = |field: &str| match body.get(field) {
        Some(Value::String(n)) if !n.is_empty() => Ok(n.clone()),
        None | Some(Value::Null) => Err(Response::error(400, format!("`{field}` is missing: {SHAPE}"))),
        Some(_) => Err(Response::error(400, format!("`{field}` must be a non-empty string: {SHAPE}"))),
    };
    let (component, key) = match (text("component"), text("key")) {
        (Ok(c), Ok(k)) => (c, k),
        (Err(r), _) | (_, Err(r)) => return r.into(),
    };
    let value = match body.get("value") {
        None => {
            return Response::error(400, format!("`value` is missing (null takes the setting back): {SHAPE}")).into();
        }
        Some(Value::Null) => None,
        Some(v) => Some(v.clone()),
    };
    tracing::info!(
        client = call.session.as_deref().and_then(|s| shared.label_of(s)).map(label),
        component,
        key,
        value = ?value,
        "web: set"
    );
    shared.poke.notify_one();
    let result = backend_call(shared, move |b| b.set(&component, &key, value)).await;
    shared.poke.notify_one();
    match result {
        Ok(Ok(overrides)) => Response::json(200, &json!({ "overrides": overrides })).into(),
        Ok(Err(e)) => backend_error(e).into(),
        Err(r) => r.into(),
    }
}

/// `POST /api/repeat` `{"run": N}`: run N's configuration for the next configure
/// (`docs/operator-guide.md`, "Provenance").
async fn repeat(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    const SHAPE: &str = "{\"run\": N} with N from 1 to 4294967295";
    let body = match object_body(call.request, &["run"], SHAPE) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    let run = match body.get("run").map(|v| v.as_u64().map(u32::try_from)) {
        Some(Some(Ok(n))) if n > 0 => n,
        None => return Response::error(400, format!("`run` is missing: {SHAPE}")).into(),
        Some(_) => return Response::error(400, format!("`run` must be a run number: {SHAPE}")).into(),
    };
    tracing::info!(client = call.session.as_deref().and_then(|s| shared.label_of(s)).map(label), run, "web: repeat");
    shared.poke.notify_one();
    let result = backend_call(shared, move |b| b.repeat(run)).await;
    shared.poke.notify_one();
    match result {
        Ok(Ok(overrides)) => Response::json(200, &json!({ "run": run, "overrides": overrides })).into(),
        Ok(Err(e)) => backend_error(e).into(),
        Err(r) => r.into(),
    }
}

/// `GET /api/processes`.
async fn processes(shared: &Arc<Shared>, _call: &Call<'_>) -> Reply {
    answer(backend_call(shared, |b| b.processes()).await)
}

/// `GET /api/listen?service=NAME`.
async fn listen(_shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    if let Err(r) = check_parameters(call.request, &["service"]) {
        return r.into();
    }
    match param(call.request, "service") {
        Some(service) => Reply::Listen { service: service.to_owned(), session: call.session.clone() },
        None => Response::error(400, "the query parameter `service` (the service's name) is missing").into(),
    }
}

/// `GET /api/logs?…`.
async fn logs(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    let query = match log_query(call.request) {
        Ok(q) => q,
        Err(r) => return r.into(),
    };
    answer(backend_call(shared, move |b| b.logs(&query)).await)
}

/// `GET /api/runs?limit=N`.
async fn runs(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    let limit = match check_parameters(call.request, &["limit"]).and_then(|()| number_param(call.request, "limit")) {
        Ok(l) => l.unwrap_or(RUNS_DEFAULT_LIMIT).min(RUNS_MAX_LIMIT),
        Err(r) => return r.into(),
    };
    answer(backend_call(shared, move |b| b.runs(limit)).await)
}

/// `GET /api/runs/{n}`.
async fn run(shared: &Arc<Shared>, call: &Call<'_>) -> Reply {
    let run = call.param();
    let Ok(number) = run.parse::<u32>() else {
        return Response::error(400, format!("`{run}` is not a run number")).into();
    };
    match backend_call(shared, move |b| b.run(number)).await {
        Ok(Ok(Some(detail))) => Response::json(200, &detail).into(),
        Ok(Ok(None)) => Response::error(404, format!("no run {number} in the run database")).into(),
        Ok(Err(e)) => backend_error(e).into(),
        Err(r) => r.into(),
    }
}

/// `GET /api/histograms`.
async fn histograms(shared: &Arc<Shared>, _call: &Call<'_>) -> Reply {
    match backend_call(shared, |b| b.histograms()).await {
        Ok(v) => Response::json(200, &v).into(),
        Err(r) => r.into(),
    }
}

/// `GET /api/schema`: every component's typed schema, by name.
async fn schemas(shared: &Arc<Shared>, _call: &Call<'_>) -> Reply {
    match backend_call(shared, |b| b.schemas()).await {
        Ok(v) => Response::json(200, &v).into(),
        Err(r) => r.into(),
    }
}

/// `GET /api/et`.
async fn et(shared: &Arc<Shared>, _call: &Call<'_>) -> Reply {
    match backend_call(shared, |b| b.et()).await {
        Ok(v) => Response::json(200, &v).into(),
        Err(r) => r.into(),
    }
}

/// `GET /metrics`: the status in Prometheus' format, then the web server's own counters.
async fn metrics(shared: &Arc<Shared>, _call: &Call<'_>) -> Reply {
    let export = |b: &dyn crate::Backend| {
        let mut text = b.status().to_prometheus();
        if let Ok(alarms) = b.alarms() {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&alarms.to_prometheus());
        }
        text
    };
    match backend_call(shared, move |b| export(b)).await {
        Ok(mut text) => {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&shared.metrics.prometheus());
            Response::new(200, "text/plain; version=0.0.4; charset=utf-8", text).into()
        }
        Err(r) => r.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// `docs/web.md`'s route list: (method, path, needs) of every row of the table under
    /// `## Routes`, one entry per path of a row (`` `/`, `/index.html` ``), queries dropped.
    fn documented_routes() -> BTreeSet<(String, String, String)> {
        let doc = include_str!("../../../../docs/web.md");
        let section = doc.split("\n## Routes\n").nth(1).expect("docs/web.md has a `## Routes` section");
        let mut routes = BTreeSet::new();
        for line in section.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')) {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let [method, paths, _what, needs] = cells[..] else { panic!("a row of four cells: {line}") };
            if method == "method" || method.starts_with("---") {
                continue;
            }
            for path in paths.split(", ") {
                let path = path.trim_matches('`');
                let path = path.split('?').next().unwrap_or(path);
                routes.insert((method.to_owned(), path.to_owned(), needs.to_owned()));
            }
        }
        routes
    }

    #[test]
    fn the_route_table_and_the_documented_route_list_are_the_same() {
        let table: BTreeSet<(String, String, String)> =
            ROUTES.iter().map(|r| (r.method.to_owned(), r.path.to_owned(), r.access.needs().to_owned())).collect();
        assert_eq!(table.len(), ROUTES.len(), "a route is in the table twice");
        let documented = documented_routes();
        let undocumented: Vec<_> = table.difference(&documented).collect();
        let unrouted: Vec<_> = documented.difference(&table).collect();
        assert!(undocumented.is_empty(), "routes missing from docs/web.md's route list: {undocumented:?}");
        assert!(unrouted.is_empty(), "routes of docs/web.md the server does not have: {unrouted:?}");
    }

    #[test]
    fn every_ui_file_has_a_route_open_to_any_page_and_nothing_else_is() {
        for route in ROUTES {
            assert_eq!(route.access == Access::Page, ui::asset(route.path).is_some(), "{}", route.path);
        }
        for path in ["/index.html", "/app.js", "/style.css"] {
            assert!(ROUTES.iter().any(|r| r.path == path), "{path}");
        }
    }

    #[test]
    fn paths_match_literally_and_braces_take_one_segment() {
        let route = |path: &str| ROUTES.iter().find(|r| r.path == path).unwrap();
        assert_eq!(route("/api/runs/{n}").matches("/api/runs/12"), Some(vec!["12"]));
        for other in ["/api/runs/", "/api/runs", "/api/runs/12/x", "/api/runs/12/"] {
            assert_eq!(route("/api/runs/{n}").matches(other), None, "{other}");
        }
        assert_eq!(route("/api/runs").matches("/api/runs"), Some(vec![]));
        assert_eq!(route("/api/runs").matches("/api/runs/"), None);
        assert_eq!(route("/").matches("/"), Some(vec![]));
        assert_eq!(route("/").matches("/x"), None);
    }

    #[test]
    fn the_log_parameters_are_the_fields_of_the_log_query() {
        let Value::Object(fields) = serde_json::to_value(LogQuery::default()).unwrap() else { panic!() };
        let fields: BTreeSet<&str> = fields.keys().map(String::as_str).collect();
        assert_eq!(fields, LOG_PARAMETERS.into_iter().collect::<BTreeSet<_>>());
    }

    fn request(target: &str) -> Request {
        let bytes = format!("GET {target} HTTP/1.1\r\nHost: h\r\n\r\n");
        let limits = crate::http::Limits { max_head: 16 * 1024, max_body: 1024 };
        match crate::http::parse_request(bytes.as_bytes(), &limits) {
            Ok(crate::http::Progress::Done(r, _)) => r,
            other => panic!("{other:?}"),
        }
    }

    fn refusal(r: Result<LogQuery, Response>) -> (u16, String) {
        let r = r.expect_err("refused");
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        (r.status, body["error"].as_str().unwrap().to_owned())
    }

    #[test]
    fn the_log_query_string_becomes_the_one_log_query() {
        let q =
            log_query(&request("/api/logs?process=bu-1&min_severity=WARNING&text=a+b&limit=99999&since_ms=")).unwrap();
        assert_eq!(
            q,
            LogQuery {
                process: Some("bu-1".into()),
                min_severity: Some(Severity::Warn),
                text: Some("a b".into()),
                limit: Some(LogQuery::MAX_LIMIT),
                ..LogQuery::default()
            }
        );
        assert_eq!(log_query(&request("/api/logs")).unwrap().limit, Some(LogQuery::DEFAULT_LIMIT));
        let (status, e) = refusal(log_query(&request("/api/logs?colour=red&min_severity=info&size=2")));
        assert_eq!(status, 400);
        assert!(e.starts_with("unknown query parameters `colour`, `size` (known: `since_ms`"), "{e}");
        let (status, e) = refusal(log_query(&request("/api/logs?min_severity=loud")));
        assert_eq!(status, 400);
        assert_eq!(e, "`min_severity` must be one of trace, debug, info, warn, error, not `loud`");
        let (_, e) = refusal(log_query(&request("/api/logs?until_ms=soon")));
        assert!(e.contains("until_ms"), "{e}");
        let (_, e) = refusal(log_query(&request("/api/logs?process=a&process=b")));
        assert!(e.contains("`process` is given more than once"), "{e}");
    }
}
