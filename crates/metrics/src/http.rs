//! A minimal HTTP/1.1 listener for `GET /metrics`, on `std::net`: one accepting thread and one
//! short-lived thread per connection, each bounded in bytes, time and number.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The path served.
const PATH: &str = "/metrics";

/// The content type of the text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a client may cost the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The longest request head (request line and headers) in bytes; longer gets `431`.
    pub max_request_bytes: usize,
    /// How long a request head may take to arrive from the connection's opening (longer gets
    /// `408`), and how long writing the answer may take.
    pub request_timeout: Duration,
    /// Connections served at a time; one more gets `503` at once.
    pub max_connections: usize,
}

impl Default for Limits {
    /// 8 KiB, 5 s, 16 connections.
    fn default() -> Limits {
        Limits { max_request_bytes: 8 << 10, request_timeout: Duration::from_secs(5), max_connections: 16 }
    }
}

/// Why the listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The address could not be bound (in use, not this host's, a port below 1024…).
    #[error(
        "cannot serve metrics on {addr}: {source} (is another process listening there? choose another --metrics address)"
    )]
    Bind {
        /// The address asked for.
        addr: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The listener's thread could not be started.
    #[error("starting the metrics listener's thread: {0}")]
    Thread(std::io::Error),
}

/// Why a request could not be read or understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The head is longer than [`Limits::max_request_bytes`] (answered `431`).
    #[error("the request head is longer than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The head did not arrive whole in time (answered `408`).
    #[error("the request did not arrive whole within {0:?}")]
    Timeout(Duration),
    /// The connection ended before the head was whole (answered `400` if anything came).
    #[error("the connection ended before the request was whole")]
    Closed,
    /// Not an HTTP/1 request (answered `400`).
    #[error("not an HTTP/1 request: {0}")]
    Malformed(&'static str),
}

/// A request's method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `HEAD`: the answer without its body.
    Head,
    /// Anything else (answered `405`).
    Other(String),
}

/// A request head, as far as the listener reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Its method.
    pub method: Method,
    /// Its path, without the query.
    pub path: String,
}

/// Reads a request head: the request line (`METHOD SP TARGET SP HTTP/1.x`, `\r\n` or `\n`) and
/// header lines (`NAME: VALUE`) up to an empty line or the end of `head`. Never panics.
///
/// ```
/// use daqflow_metrics::{Method, parse_request};
/// let r = parse_request(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
/// assert_eq!((r.method, r.path.as_str()), (Method::Get, "/metrics"));
/// assert!(parse_request(b"\x16\x03\x01 hello").is_err());
/// ```
pub fn parse_request(head: &[u8]) -> Result<Request, RequestError> {
    let text = std::str::from_utf8(head).map_err(|_| RequestError::Malformed("not UTF-8"))?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(RequestError::Malformed("the request line is not METHOD TARGET VERSION"));
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(RequestError::Malformed("the method is not a word in capitals"));
    }
    if !target.starts_with('/') || target.bytes().any(|b| b.is_ascii_control()) {
        return Err(RequestError::Malformed("the target is not a path"));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(RequestError::Malformed("the version is not HTTP/1.0 or HTTP/1.1"));
    }
    for line in lines.take_while(|l| !l.is_empty()) {
        let Some((name, _)) = line.split_once(':') else {
            return Err(RequestError::Malformed("a header line without `:`"));
        };
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
            return Err(RequestError::Malformed("a header name is empty or holds white space"));
        }
    }
    let method = match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        other => Method::Other(other.to_owned()),
    };
    let path = target.split_once('?').map_or(target, |(p, _)| p).to_owned();
    Ok(Request { method, path })
}

/// The end of a head in `buf`, searching from `from`: the index after the empty line.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let from = from.saturating_sub(3);
    (from..buf.len()).find_map(|i| {
        if buf[i..].starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else if buf[i..].starts_with(b"\n\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

/// Reads a request head from `stream` within `limits`.
fn read_head(stream: &mut TcpStream, limits: &Limits) -> Result<Vec<u8>, RequestError> {
    let deadline = Instant::now() + limits.request_timeout;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Err(RequestError::Timeout(limits.request_timeout));
        }
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Err(RequestError::Closed),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(RequestError::Timeout(limits.request_timeout));
            }
            Err(_) => return Err(RequestError::Closed),
        };
        let before = head.len();
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&head, before) {
            if end > limits.max_request_bytes {
                return Err(RequestError::TooLarge { limit: limits.max_request_bytes });
            }
            head.truncate(end);
            return Ok(head);
        }
        if head.len() > limits.max_request_bytes {
            return Err(RequestError::TooLarge { limit: limits.max_request_bytes });
        }
    }
}

/// The renderer a server calls for each scrape.
type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// An HTTP listener serving `GET /metrics` on a thread of its own until dropped.
///
/// ```
/// use daqflow_metrics::{Limits, MetricsServer};
/// let server = MetricsServer::bind("127.0.0.1:0", Limits::default(), || String::new())?;
/// let busy = MetricsServer::bind(server.local_addr(), Limits::default(), || String::new());
/// assert!(busy.unwrap_err().to_string().contains("cannot serve metrics on 127.0.0.1:"));
/// # Ok::<(), daqflow_metrics::BindError>(())
/// ```
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl MetricsServer {
    /// Binds `addr` (`HOST:PORT`; port 0 picks a free one) and serves on a new thread: each
    /// `GET /metrics` gets what `render` returns at that moment.
    pub fn bind<A, F>(addr: A, limits: Limits, render: F) -> Result<MetricsServer, BindError>
    where
        A: ToSocketAddrs + std::fmt::Display,
        F: Fn() -> String + Send + Sync + 'static,
    {
        let listener = TcpListener::bind(&addr).map_err(|source| BindError::Bind { addr: addr.to_string(), source })?;
        let local = listener.local_addr().map_err(|source| BindError::Bind { addr: addr.to_string(), source })?;
        let stop = Arc::new(AtomicBool::new(false));
        let render: Render = Arc::new(render);
        let s = stop.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || accept_loop(listener, limits, render, s))
            .map_err(BindError::Thread)?;
        Ok(MetricsServer { addr: local, stop })
    }

    /// The address it listens on (with the port chosen, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accepting thread so that it sees the flag and closes the listener.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() { [127, 0, 0, 1].into() } else { std::net::Ipv6Addr::LOCALHOST.into() });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
    }
}

fn accept_loop(listener: TcpListener, limits: Limits, render: Render, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut stream) = conn else {
            // Out of file descriptors and the like: keep serving the connections we have.
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        if active.load(Ordering::Acquire) >= limits.max_connections {
            let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
            let _ = stream.write_all(&answer(503, "text/plain", b"busy: too many connections\n", false));
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let guard = Active(active.clone());
        let render = render.clone();
        let spawned = std::thread::Builder::new().name("metrics-conn".into()).spawn(move || {
            let _guard = guard;
            serve(stream, &limits, &render);
        });
        if spawned.is_err() {
            // The guard went with the closure and was dropped: the count is right.
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Counts a connection being served until dropped.
struct Active(Arc<AtomicUsize>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An HTTP/1.1 answer that closes the connection.
fn answer(status: u16, content_type: &str, body: &[u8], head_only: bool) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "Service Unavailable",
    };
    let allow = if status == 405 { "Allow: GET, HEAD\r\n" } else { "" };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

fn serve(mut stream: TcpStream, limits: &Limits, render: &Render) {
    let _ = stream.set_write_timeout(Some(limits.request_timeout));
    let reply = match read_head(&mut stream, limits).and_then(|h| parse_request(&h)) {
        Ok(Request { method: Method::Other(_), .. }) => {
            answer(405, "text/plain", b"only GET and HEAD are served here\n", false)
        }
        Ok(Request { method, path }) => {
            let head_only = method == Method::Head;
            if path == PATH {
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| render())) {
                    Ok(text) => answer(200, CONTENT_TYPE, text.as_bytes(), head_only),
                    Err(_) => answer(500, "text/plain", b"the metrics could not be rendered\n", head_only),
                }
            } else {
                answer(404, "text/plain", b"not found: the metrics are at /metrics\n", head_only)
            }
        }
        Err(RequestError::Closed) => return,
        Err(e @ RequestError::TooLarge { .. }) => answer(431, "text/plain", format!("{e}\n").as_bytes(), false),
        Err(e @ RequestError::Timeout(_)) => answer(408, "text/plain", format!("{e}\n").as_bytes(), false),
        Err(e @ RequestError::Malformed(_)) => answer(400, "text/plain", format!("{e}\n").as_bytes(), false),
    };
    if stream.write_all(&reply).is_err() {
        return;
    }
    // Close gently: what the client sent beyond the head is read away first (briefly), so
    // that closing does not reset the connection before the answer arrives.
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < 64 << 10 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        tcp.write_all(bytes).unwrap();
        let mut out = Vec::new();
        let _ = tcp.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    fn status(answer: &str) -> &str {
        answer.get(9..12).unwrap_or(answer)
    }

    #[test]
    fn requests_are_read_and_refused_as_they_should_be() {
        let ok = |head: &[u8]| parse_request(head).unwrap();
        assert_eq!(ok(b"GET /metrics HTTP/1.1\r\n\r\n"), Request { method: Method::Get, path: "/metrics".into() });
        assert_eq!(ok(b"HEAD /metrics HTTP/1.0\n\n").method, Method::Head);
        assert_eq!(
            ok(b"POST /x?y HTTP/1.1\r\nA: b\r\n\r\n"),
            Request { method: Method::Other("POST".into()), path: "/x".into() }
        );
        for bad in [
            &b""[..],
            b"GET\r\n\r\n",
            b"GET /metrics\r\n\r\n",
            b"GET  /metrics HTTP/1.1\r\n\r\n",
            b"get /metrics HTTP/1.1\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/2\r\n\r\n",
            b"GET /metrics HTTP/1.1 x\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nbad name: x\r\n\r\n",
            b"GET /m\x01 HTTP/1.1\r\n\r\n",
            b"GET /\xff HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(parse_request(bad), Err(RequestError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest", 0), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nrest", 10), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n", 0), None);
    }

    #[test]
    fn the_listener_answers_every_kind_of_request_and_goes_on() {
        let limits = Limits { max_request_bytes: 256, request_timeout: Duration::from_millis(300), max_connections: 8 };
        let server = MetricsServer::bind("127.0.0.1:0", limits, || "daqflow_x 1\n".to_owned()).unwrap();
        let addr = server.local_addr();
        let got = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(status(&got), "200", "{got}");
        assert!(got.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\ndaqflow_x 1\n"), "{got}");
        let head = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 200 OK\r\n")
                && head.ends_with("Content-Length: 12\r\nConnection: close\r\n\r\n"),
            "{head}"
        );
        assert_eq!(status(&exchange(addr, b"GET / HTTP/1.1\r\n\r\n")), "404");
        let post = exchange(addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
        assert_eq!(status(&post), "405");
        assert!(post.contains("Allow: GET, HEAD\r\n"));
        assert_eq!(status(&exchange(addr, b"\x16\x03\x01\x02\x00 garbage\r\n\r\n")), "400");
        assert_eq!(status(&exchange(addr, &[b'A'; 1000])), "431");
        // Half a request, then silence: answered 408 once the time is up.
        assert_eq!(status(&exchange(addr, b"GET /metrics HTTP/1.1\r\n")), "408");
        // A client that connects and says nothing while others are served.
        let silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        assert_eq!(status(&exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n")), "200");
        drop(silent);
        // Closed without a byte: nothing to answer, and the next one is served.
        drop(TcpStream::connect(addr).unwrap());
        assert_eq!(status(&exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n")), "200");
    }

    #[test]
    fn a_connection_over_the_limit_is_answered_busy() {
        let limits = Limits { max_request_bytes: 256, request_timeout: Duration::from_secs(5), max_connections: 1 };
        let server = MetricsServer::bind("127.0.0.1:0", limits, String::new).unwrap();
        let held = TcpStream::connect(server.local_addr()).unwrap();
        // The accepting thread counts the held one before it takes the next.
        let mut busy = String::new();
        for _ in 0..100 {
            busy = exchange(server.local_addr(), b"GET /metrics HTTP/1.1\r\n\r\n");
            if status(&busy) == "503" {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(status(&busy), "503", "{busy}");
        drop(held);
    }

    #[test]
    fn a_render_that_panics_is_answered_500_and_the_listener_goes_on() {
        let server = MetricsServer::bind("127.0.0.1:0", Limits::default(), || panic!("a bug")).unwrap();
        assert_eq!(status(&exchange(server.local_addr(), b"GET /metrics HTTP/1.1\r\n\r\n")), "500");
        assert_eq!(status(&exchange(server.local_addr(), b"GET /x HTTP/1.1\r\n\r\n")), "404");
    }

    #[test]
    fn a_dropped_server_frees_its_port() {
        let server = MetricsServer::bind("127.0.0.1:0", Limits::default(), String::new).unwrap();
        let addr = server.local_addr();
        drop(server);
        let mut again = None;
        for _ in 0..100 {
            match MetricsServer::bind(addr, Limits::default(), String::new) {
                Ok(s) => {
                    again = Some(s);
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        assert!(again.is_some(), "the port stayed taken");
    }

    proptest! {
        /// Random bytes never panic the parser.
        #[test]
        fn random_bytes_never_panic_the_parser(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_request(&bytes);
            let _ = head_end(&bytes, bytes.len() / 2);
        }

        /// A request made of plausible pieces, mutated: parsed or refused, never a panic, and
        /// a well-formed one is read back as written.
        #[test]
        fn plausible_requests_are_read_back_or_refused(
            method in "[A-Z]{1,7}|[a-z]{1,3}|",
            path in "/[a-z/?=&%.]{0,20}|[a-z]{0,5}",
            version in "HTTP/1\\.[01]|HTTP/[0-9]\\.?[0-9]?|",
            headers in proptest::collection::vec("[A-Za-z-]{1,8}:? ?[ -~]{0,12}", 0..4),
            cut in 0usize..200,
        ) {
            let mut text = format!("{method} {path} {version}\r\n");
            for h in &headers {
                text.push_str(h);
                text.push_str("\r\n");
            }
            text.push_str("\r\n");
            let r = parse_request(text.as_bytes());
            let well_formed = !method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase())
                && path.starts_with('/') && (version == "HTTP/1.1" || version == "HTTP/1.0")
                && headers.iter().all(|h| h.split_once(':').is_some_and(|(n, _)| !n.is_empty() && !n.contains(' ')));
            prop_assert_eq!(r.is_ok(), well_formed, "{:?}: {:?}", text, r);
            if let Ok(r) = r {
                prop_assert_eq!(r.path.as_str(), path.split('?').next().unwrap());
            }
            let _ = parse_request(&text.as_bytes()[..cut.min(text.len())]);
        }
    }
}
