//! A small blocking HTTP/1.1 client and server-sent-events reader over std's TcpStream, for
//! the tests (every read bounded by a generous timeout).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
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

/// One request on a new connection (`Connection: close`).
pub fn request(addr: SocketAddr, method: &str, path: &str, client: Option<&str>, body: Option<&str>) -> Reply {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(c) = client {
        head.push_str(&format!("X-Daqflow-Client: {c}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    head.push_str(body);
    raw(addr, head.as_bytes())
}

pub fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path, None, None)
}

pub fn post(addr: SocketAddr, path: &str, client: &str, body: &str) -> Reply {
    request(addr, "POST", path, Some(client), Some(body))
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
        let mut stream = connect(addr);
        write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n").unwrap();
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
        Sse { reader, status, headers }
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
