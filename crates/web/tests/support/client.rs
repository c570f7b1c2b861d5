//! A small blocking HTTP/1.1 client and server-sent-events reader over std's TcpStream, for
//! the tests (every read bounded by a generous timeout).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    /// The `error` text of an error reply.
    pub fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or_else(|| panic!("no error text: {}", self.text())).to_owned()
    }
    /// The `Set-Cookie` header that sets cookie `name`, whole (value and attributes).
    pub fn set_cookie(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("set-cookie"))
            .map(|(_, v)| v.as_str())
            .find(|v| v.split(';').next().and_then(|p| p.split_once('=')).is_some_and(|(n, _)| n.trim() == name))
    }
    /// The value a `Set-Cookie` header gives cookie `name`.
    pub fn cookie(&self, name: &str) -> Option<String> {
        let header = self.set_cookie(name)?;
        let pair = header.split(';').next()?;
        Some(pair.split_once('=')?.1.trim().to_owned())
    }
}

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "daqflow_session";

/// A client of the web server as a script or a browser is one: it keeps the session cookie the
/// server gives it, and sends `X-Daqflow-Client` (a value of its own, which must never show up
/// anywhere else) with every POST.
#[derive(Debug, Clone)]
pub struct Client {
    pub addr: SocketAddr,
    /// The session cookie's value, if the server gave one.
    pub session: Option<String>,
    /// What this client sends in `X-Daqflow-Client`.
    pub header: String,
}

fn unique_header() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("hdr-{:x}-{}", nanos, N.fetch_add(1, Ordering::Relaxed))
}

impl Client {
    /// A client without a session.
    pub fn new(addr: SocketAddr) -> Client {
        Client { addr, session: None, header: unique_header() }
    }

    /// A client that loaded the UI's page (`GET /`) and keeps the session cookie it got, if any
    /// (without an access token: an anonymous session; with one: none).
    pub fn visit(addr: SocketAddr) -> Client {
        let mut c = Client::new(addr);
        let page = c.get("/");
        assert_eq!(page.status, 200, "GET /: {}", page.text());
        c.session = page.cookie(SESSION_COOKIE);
        c
    }

    /// A client logged in with `token` (`POST /api/login`); panics unless it got a session.
    pub fn login(addr: SocketAddr, token: &str) -> Client {
        let mut c = Client::new(addr);
        let r = c.post("/api/login", &serde_json::json!({ "token": token }).to_string());
        assert_eq!(r.status, 200, "login: {}", r.text());
        c.session = Some(r.cookie(SESSION_COOKIE).unwrap_or_else(|| panic!("no session cookie: {:?}", r.headers)));
        c
    }

    /// The header fields this client sends with `method`.
    pub fn headers(&self, method: &str) -> Vec<(String, String)> {
        let mut h = Vec::new();
        if let Some(s) = &self.session {
            h.push(("Cookie".to_owned(), format!("{SESSION_COOKIE}={s}")));
        }
        if method == "POST" {
            h.push(("X-Daqflow-Client".to_owned(), self.header.clone()));
        }
        h
    }

    pub fn request(&self, method: &str, path: &str, extra: &[(&str, &str)], body: Option<&str>) -> Reply {
        let mut headers = self.headers(method);
        headers.extend(extra.iter().map(|(n, v)| (n.to_string(), v.to_string())));
        send(self.addr, method, path, &headers, body)
    }

    pub fn get(&self, path: &str) -> Reply {
        self.request("GET", path, &[], None)
    }

    pub fn post(&self, path: &str, body: &str) -> Reply {
        self.request("POST", path, &[], Some(body))
    }

    /// Opens an event stream with this client's session.
    pub fn events(&self, path: &str) -> Sse {
        let headers: Vec<(String, String)> = self.headers("GET");
        let refs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        Sse::open_with(self.addr, path, &refs)
    }
}

/// One request with these header fields (besides Host, Connection: close and, with a body or
/// for a POST, Content-Type and Content-Length) on a new connection.
pub fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(String, String)], body: Option<&str>) -> Reply {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    head.push_str(body);
    raw(addr, head.as_bytes())
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect_timeout(&addr, TIMEOUT).expect("connect");
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(TIMEOUT)).unwrap();
    stream
}

/// Reads one response (head, then the body by Content-Length, else to the end).
pub fn read_reply(reader: &mut impl BufRead) -> Reply {
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    let status: u16 =
        line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (n, v) = line.split_once(':').expect("header field");
        headers.push((n.trim().to_owned(), v.trim().to_owned()));
    }
    let length =
        headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("content-length")).map(|(_, v)| v.parse().unwrap());
    let mut body = Vec::new();
    match length {
        _ if status < 200 || status == 204 || status == 304 => {}
        Some(n) => {
            body.resize(n, 0);
            reader.read_exact(&mut body).expect("body");
        }
        None => {
            reader.read_to_end(&mut body).expect("body");
        }
    }
    Reply { status, headers, body }
}

/// Sends raw bytes on a new connection and reads the reply.
pub fn raw(addr: SocketAddr, bytes: &[u8]) -> Reply {
    let mut stream = connect(addr);
    stream.write_all(bytes).expect("write");
    read_reply(&mut BufReader::new(stream))
}

/// A GET without a session on a new connection (`Connection: close`).
pub fn get(addr: SocketAddr, path: &str) -> Reply {
    send(addr, "GET", path, &[], None)
}

/// Polls `f` until it returns Some, for at most [`TIMEOUT`].
pub fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server-sent-events stream.
pub struct Sse {
    reader: BufReader<TcpStream>,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The body of a refusal (a status other than 200).
    pub refusal: Vec<u8>,
}

/// One event.
#[derive(Debug, Clone)]
pub struct Event {
    pub name: String,
    pub data: String,
}

impl Event {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.data))
    }
}

impl Sse {
    /// Opens `path` as an event stream.
    pub fn open(addr: SocketAddr, path: &str) -> Sse {
        Sse::open_with(addr, path, &[])
    }

    /// Opens `path` as an event stream, with these header fields too. A refusal (not 200) is
    /// read whole: `status`, `headers`, and its body in `refusal`.
    pub fn open_with(addr: SocketAddr, path: &str, extra: &[(&str, &str)]) -> Sse {
        let mut stream = connect(addr);
        let mut head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n");
        for (n, v) in extra {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).expect("status line");
        let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status");
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("header");
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (n, v) = line.split_once(':').expect("header field");
            headers.push((n.trim().to_owned(), v.trim().to_owned()));
        }
        let mut refusal = Vec::new();
        if status != 200 {
            let length = headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            refusal.resize(length, 0);
            reader.read_exact(&mut refusal).expect("the refusal's body");
        }
        Sse { reader, status, headers, refusal }
    }

    /// The next event (None at the end of the stream).
    pub fn next(&mut self) -> Option<Event> {
        let mut name = String::from("message");
        let mut data: Vec<String> = Vec::new();
        let mut any = false;
        loop {
            let mut line = String::new();
            match self.reader.read_line(&mut line) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => panic!("reading the event stream: {e}"),
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if any && !data.is_empty() {
                    return Some(Event { name, data: data.join("\n") });
                }
                name = "message".into();
                data.clear();
                any = false;
                continue;
            }
            any = true;
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => name = value.to_owned(),
                "data" => data.push(value.to_owned()),
                _ => {}
            }
        }
    }

    /// The next event named `name`, skipping others.
    pub fn next_named(&mut self, name: &str) -> Event {
        loop {
            match self.next() {
                Some(e) if e.name == name => return e,
                Some(_) => {}
                None => panic!("the stream ended before a `{name}` event"),
            }
        }
    }

    /// Skips events until one named `name` satisfies `f`.
    pub fn wait_for(&mut self, name: &str, mut f: impl FnMut(&Value) -> bool) -> Value {
        loop {
            let e = self.next_named(name);
            let v = e.json();
            if f(&v) {
                return v;
            }
        }
    }
}
