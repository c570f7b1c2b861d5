//! HTTP/1.1 messages without I/O: the request parser (fed the bytes received so far, it says
//! "need more" or returns one whole request and how many bytes it used) and the response
//! serializer. The connection loop in `server.rs` does the reading and writing.
//!
//! The parser refuses rather than guesses: a head over the size limit is a 431, a declared body
//! over the limit a 413 (before the body is read), `Transfer-Encoding` a 501, anything malformed
//! a 400. It never panics, whatever the bytes (property-tested below).

use std::fmt::Write as _;

/// At most this many header fields in one request (more is a 431).
pub(crate) const MAX_HEADER_FIELDS: usize = 100;
/// The longest method name accepted.
const MAX_METHOD_LEN: usize = 32;

/// Size limits of one request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Request line plus header fields plus the blank line, in bytes.
    pub max_head: usize,
    /// Body (Content-Length), in bytes.
    pub max_body: usize,
}

/// The protocol version of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// HTTP/1.0: the connection closes after the response unless asked otherwise.
    Http10,
    /// HTTP/1.1: the connection stays open unless asked otherwise.
    Http11,
}

/// One parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    /// The method, as sent (methods are case-sensitive).
    pub method: String,
    /// The path, percent-decoded (`+` stays `+`).
    pub path: String,
    /// The query parameters in order, percent-decoded, `+` read as a space.
    pub query: Vec<(String, String)>,
    /// The protocol version.
    pub version: Version,
    /// The header fields in order (names as sent, values trimmed).
    pub headers: Vec<(String, String)>,
    /// The body (empty without Content-Length).
    pub body: Vec<u8>,
}

impl Request {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The first value of query parameter `name`.
    pub fn query(&self, name: &str) -> Option<&str> {
        self.query.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Whether the client asked to close the connection after this request (HTTP/1.0 closes
    /// unless it asked to keep it alive).
    pub fn wants_close(&self) -> bool {
        let has = |token: &str| {
            self.headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
                .any(|(_, v)| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        };
        match self.version {
            Version::Http11 => has("close"),
            Version::Http10 => !has("keep-alive"),
        }
    }
}

/// What the parser made of the bytes so far.
#[derive(Debug)]
pub(crate) enum Progress {
    /// Not a whole request yet. `expect_continue`: the head is complete, asks for
    /// `100 Continue` and its body has not all arrived.
    NeedMore { expect_continue: bool },
    /// One whole request, and how many bytes of the buffer it used.
    Done(Request, usize),
}

/// Why a request was refused; each maps to one status code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HttpError {
    /// The head did not end within the limit.
    #[error("the request head is larger than {limit} bytes")]
    HeadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// Too many header fields.
    #[error("the request has more than {limit} header fields")]
    TooManyHeaders {
        /// The limit.
        limit: usize,
    },
    /// The declared body is over the limit.
    #[error("the request body of {length} bytes is larger than the limit of {limit} bytes")]
    BodyTooLarge {
        /// The declared Content-Length.
        length: u64,
        /// The limit.
        limit: usize,
    },
    /// The request line is not `METHOD SP /target SP HTTP/1.x`.
    #[error("malformed request line: {0}")]
    RequestLine(&'static str),
    /// A header field is not `name: value`.
    #[error("malformed header field: {0}")]
    HeaderField(&'static str),
    /// Not HTTP/1.0 or HTTP/1.1.
    #[error("unsupported HTTP version `{0}` (HTTP/1.1 and HTTP/1.0 are)")]
    Version(String),
    /// Content-Length is not a number, or given twice with different values.
    #[error("invalid Content-Length")]
    ContentLength,
    /// A Transfer-Encoding (chunked bodies are not supported).
    #[error("Transfer-Encoding is not supported: send the body with a Content-Length")]
    TransferEncoding,
    /// A `%` not followed by two hex digits, or a decoded text that is not UTF-8.
    #[error("invalid percent-encoding in the request target")]
    PercentEncoding,
}

impl HttpError {
    /// The status code of the response that refuses the request.
    pub fn status(&self) -> u16 {
        match self {
            HttpError::HeadTooLarge { .. } | HttpError::TooManyHeaders { .. } => 431,
            HttpError::BodyTooLarge { .. } => 413,
            HttpError::Version(_) => 505,
            HttpError::TransferEncoding => 501,
            HttpError::RequestLine(_)
            | HttpError::HeaderField(_)
            | HttpError::ContentLength
            | HttpError::PercentEncoding => 400,
        }
    }
}

/// A token character (RFC 9110 `tchar`): method and header names.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses one request from the start of `buf` (the bytes received so far on a connection).
pub(crate) fn parse_request(buf: &[u8], limits: &Limits) -> Result<Progress, HttpError> {
    // Empty lines before a request line are ignored (RFC 9112 §2.2).
    let mut start = 0;
    while start < buf.len() && (buf[start] == b'\r' || buf[start] == b'\n') {
        start += 1;
    }
    // Find the blank line that ends the head, looking no further than the limit.
    let window = &buf[..buf.len().min(limits.max_head)];
    let mut lines: Vec<&[u8]> = Vec::new();
    let mut line_start = start;
    let mut head_end = None;
    for (i, &b) in window.iter().enumerate().skip(start) {
        if b != b'\n' {
            continue;
        }
        let mut line = &window[line_start..i];
        if let [rest @ .., b'\r'] = line {
            line = rest;
        }
        line_start = i + 1;
        if line.is_empty() {
            head_end = Some(i + 1);
            break;
        }
        if lines.len() > MAX_HEADER_FIELDS {
            return Err(HttpError::TooManyHeaders { limit: MAX_HEADER_FIELDS });
        }
        lines.push(line);
    }
    let Some(head_end) = head_end else {
        if buf.len() >= limits.max_head {
            return Err(HttpError::HeadTooLarge { limit: limits.max_head });
        }
        return Ok(Progress::NeedMore { expect_continue: false });
    };
    let Some((request_line, field_lines)) = lines.split_first() else {
        // Only blank lines so far: the `while` above consumed them all, so this is unreachable,
        // but an answer is cheaper than a proof.
        return Ok(Progress::NeedMore { expect_continue: false });
    };

    let (method, target, version) = parse_request_line(request_line)?;
    let mut headers = Vec::with_capacity(field_lines.len());
    for line in field_lines {
        headers.push(parse_header_field(line)?);
    }

    let mut content_length: Option<u64> = None;
    let mut expect_continue = false;
    for (name, value) in &headers {
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::TransferEncoding);
        }
        if name.eq_ignore_ascii_case("content-length") {
            // `Content-Length: 5, 5` is allowed by RFC 9110 §8.6 when the values agree.
            for part in value.split(',') {
                let part = part.trim();
                if part.is_empty() || part.len() > 19 || !part.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(HttpError::ContentLength);
                }
                let n: u64 = part.parse().map_err(|_| HttpError::ContentLength)?;
                if content_length.is_some_and(|c| c != n) {
                    return Err(HttpError::ContentLength);
                }
                content_length = Some(n);
            }
        }
        if name.eq_ignore_ascii_case("expect") && value.eq_ignore_ascii_case("100-continue") {
            expect_continue = true;
        }
    }
    let length = content_length.unwrap_or(0);
    if length > limits.max_body as u64 {
        return Err(HttpError::BodyTooLarge { length, limit: limits.max_body });
    }
    // `length` ≤ max_body, a usize: the conversion is exact.
    let length = length as usize;
    let (path, query) = parse_target(target)?;
    let Some(end) = head_end.checked_add(length) else {
        return Err(HttpError::BodyTooLarge { length: length as u64, limit: limits.max_body });
    };
    if buf.len() < end {
        return Ok(Progress::NeedMore { expect_continue: expect_continue && length > 0 });
    }
    let request = Request { method, path, query, version, headers, body: buf[head_end..end].to_vec() };
    Ok(Progress::Done(request, end))
}

fn parse_request_line(line: &[u8]) -> Result<(String, &[u8], Version), HttpError> {
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::RequestLine("expected `METHOD /path HTTP/1.1`"));
    };
    if method.is_empty() || method.len() > MAX_METHOD_LEN || !method.iter().copied().all(is_tchar) {
        return Err(HttpError::RequestLine("invalid method"));
    }
    if target.first() != Some(&b'/') || !target.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(HttpError::RequestLine("the target must be a path starting with `/`"));
    }
    let version = match version {
        b"HTTP/1.1" => Version::Http11,
        b"HTTP/1.0" => Version::Http10,
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor] if major.is_ascii_digit() && minor.is_ascii_digit() => {
            return Err(HttpError::Version(String::from_utf8_lossy(version).into_owned()));
        }
        _ => return Err(HttpError::RequestLine("expected HTTP/1.1 or HTTP/1.0 at the end")),
    };
    // A method is all tchars, so ASCII.
    Ok((String::from_utf8_lossy(method).into_owned(), target, version))
}

fn parse_header_field(line: &[u8]) -> Result<(String, String), HttpError> {
    if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
        return Err(HttpError::HeaderField("folded (multi-line) fields are not accepted"));
    }
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return Err(HttpError::HeaderField("no `:`"));
    };
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    if name.is_empty() || !name.iter().copied().all(is_tchar) {
        return Err(HttpError::HeaderField("invalid field name"));
    }
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(HttpError::HeaderField("control character in a field value"));
    }
    let value = value.trim_ascii();
    Ok((String::from_utf8_lossy(name).into_owned(), String::from_utf8_lossy(value).into_owned()))
}

type Query = Vec<(String, String)>;

fn parse_target(target: &[u8]) -> Result<(String, Query), HttpError> {
    let (path, query) = match target.iter().position(|&b| b == b'?') {
        Some(q) => (&target[..q], &target[q + 1..]),
        None => (target, &b""[..]),
    };
    let path = percent_decode(path, false)?;
    let mut pairs = Vec::new();
    for pair in query.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (name, value) = match pair.iter().position(|&b| b == b'=') {
            Some(e) => (&pair[..e], &pair[e + 1..]),
            None => (pair, &b""[..]),
        };
        pairs.push((percent_decode(name, true)?, percent_decode(value, true)?));
    }
    Ok((path, pairs))
}

/// Decodes `%XX` escapes (and `+` as a space when `plus_is_space`, as in query strings); the
/// result must be UTF-8.
pub(crate) fn percent_decode(input: &[u8], plus_is_space: bool) -> Result<String, HttpError> {
    let hex = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    };
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        match input[i] {
            b'%' => {
                let hi = input.get(i + 1).copied().and_then(hex);
                let lo = input.get(i + 2).copied().and_then(hex);
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(HttpError::PercentEncoding);
                };
                out.push(hi << 4 | lo);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| HttpError::PercentEncoding)
}

/// Encodes everything but unreserved characters (RFC 3986) as `%XX` (the round trip of the
/// fuzzing hooks and the tests).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn percent_encode(input: &str) -> String {
    let mut out = String::with_capacity(input.len());
    for b in input.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The reason phrase of a status code.
pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        303 => "See Other",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// One response with a body of known length.
#[derive(Debug, Clone)]
pub(crate) struct Response {
    /// The status code.
    pub status: u16,
    /// Header fields besides Content-Length, Connection and the common ones.
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// A response with this content type and body.
    pub fn new(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Response {
        Response { status, headers: vec![("Content-Type", content_type.to_owned())], body: body.into() }
    }

    /// A JSON response: `value`'s serde form. A value that cannot be written as JSON (a map
    /// with keys that are not strings, a path that is not UTF-8) is a 500 saying so.
    pub fn json(status: u16, value: &impl serde::Serialize) -> Response {
        match serde_json::to_vec(value) {
            Ok(mut body) => {
                body.push(b'\n');
                Response::new(status, "application/json", body)
            }
            Err(e) => {
                tracing::error!("web: an answer cannot be written as JSON: {e}");
                Response::error(500, format!("the answer cannot be written as JSON: {e}"))
            }
        }
    }

    /// An error response: `{"error": message}`.
    pub fn error(status: u16, message: impl Into<String>) -> Response {
        Response::json(status, &serde_json::json!({ "error": message.into() }))
    }

    /// Adds a header field.
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    /// The bytes to send; `close` adds `Connection: close`.
    pub fn to_bytes(&self, close: bool) -> Vec<u8> {
        let mut head = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (name, value) in &self.headers {
            let _ = write!(head, "{name}: {value}\r\n");
        }
        if !self.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("cache-control")) {
            head.push_str("Cache-Control: no-store\r\n");
        }
        head.push_str("X-Content-Type-Options: nosniff\r\n");
        let _ = write!(head, "Content-Length: {}\r\n", self.body.len());
        if close {
            head.push_str("Connection: close\r\n");
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

/// Entry point for the fuzz target in `fuzz/`: the request parser on the bytes a client sent.
/// Not part of the API (hidden from the documentation; only with the cargo feature `fuzzing`,
/// which `fuzz/` turns on).
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// What the parser makes of `buf` with a head of at most `max_head` bytes and a body of at
    /// most `max_body`: `Ok(None)` if it needs more bytes, `Ok(Some(used))` for a whole
    /// request of `used` bytes, or the status code of the refusal.
    ///
    /// # Panics
    /// If a whole request is not parsed back the same once written again (round trip), or the
    /// parser claims more bytes than it was given.
    pub fn parse(buf: &[u8], max_head: usize, max_body: usize) -> Result<Option<usize>, u16> {
        let limits = Limits { max_head, max_body };
        match parse_request(buf, &limits) {
            Ok(Progress::NeedMore { .. }) => Ok(None),
            Ok(Progress::Done(request, used)) => {
                assert!(used <= buf.len(), "the parser used {used} of {} bytes", buf.len());
                assert!(request.body.len() <= max_body);
                let again = write(&request);
                match parse_request(&again, &Limits { max_head: again.len() + 1, max_body }) {
                    Ok(Progress::Done(back, n)) => {
                        assert_eq!(n, again.len(), "a written request is parsed whole");
                        assert_eq!(back, request, "a request round-trips");
                    }
                    other => panic!("a written request does not parse back: {other:?}"),
                }
                let _ = request.wants_close();
                Ok(Some(used))
            }
            Err(e) => Err(e.status()),
        }
    }

    /// `request` as a client would send it (path and query percent-encoded).
    fn write(request: &Request) -> Vec<u8> {
        let mut target: String = request.path.split('/').map(percent_encode).collect::<Vec<_>>().join("/");
        for (i, (k, v)) in request.query.iter().enumerate() {
            target.push(if i == 0 { '?' } else { '&' });
            target.push_str(&percent_encode(k));
            target.push('=');
            target.push_str(&percent_encode(v));
        }
        let version = match request.version {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        };
        let mut out = format!("{} {target} {version}\r\n", request.method).into_bytes();
        for (name, value) in &request.headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&request.body);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: Limits = Limits { max_head: 16 * 1024, max_body: 1024 * 1024 };

    fn done(bytes: &[u8]) -> (Request, usize) {
        match parse_request(bytes, &LIMITS) {
            Ok(Progress::Done(r, n)) => (r, n),
            other => panic!("expected a request, got {other:?}"),
        }
    }

    fn refused(bytes: &[u8]) -> HttpError {
        match parse_request(bytes, &LIMITS) {
            Err(e) => e,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_get_with_query_parses() {
        let bytes = b"GET /api/logs?process=ru-1&text=disk+full%21&x HTTP/1.1\r\nHost: a\r\n\r\nrest";
        let (r, n) = done(bytes);
        assert_eq!(n, bytes.len() - "rest".len());
        assert_eq!(r.method, "GET");
        assert_eq!(r.path, "/api/logs");
        assert_eq!(r.query("process"), Some("ru-1"));
        assert_eq!(r.query("text"), Some("disk full!"));
        assert_eq!(r.query("x"), Some(""));
        assert_eq!(r.header("HOST"), Some("a"));
        assert!(!r.wants_close());
    }

    #[test]
    fn a_post_waits_for_its_body_and_asks_for_continue() {
        let head = b"POST /api/command HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n";
        assert!(matches!(parse_request(head, &LIMITS), Ok(Progress::NeedMore { expect_continue: true })));
        let mut all = head.to_vec();
        all.extend_from_slice(b"{}\r\n");
        let (r, n) = done(&all);
        assert_eq!((r.body.as_slice(), n), (&b"{}\r\n"[..], all.len()));
    }

    #[test]
    fn bare_newlines_and_leading_blank_lines_are_accepted() {
        let (r, _) = done(b"\r\n\nGET / HTTP/1.0\nConnection: keep-alive\n\n");
        assert_eq!(r.version, Version::Http10);
        assert!(!r.wants_close());
        let (r, _) = done(b"GET / HTTP/1.0\r\n\r\n");
        assert!(r.wants_close());
    }

    #[test]
    fn refusals_carry_the_right_status() {
        assert_eq!(refused(b"GET / HTTP/2.0\r\n\r\n").status(), 505);
        assert_eq!(refused(b"GET / FTP\r\n\r\n").status(), 400);
        assert_eq!(refused(b"GET  / HTTP/1.1\r\n\r\n").status(), 400);
        assert_eq!(refused(b"GET http://x/ HTTP/1.1\r\n\r\n").status(), 400);
        assert_eq!(refused(b"G(T / HTTP/1.1\r\n\r\n").status(), 400);
        assert_eq!(refused(b"GET / HTTP/1.1\r\nNo colon\r\n\r\n").status(), 400);
        assert_eq!(refused(b"GET / HTTP/1.1\r\nA: b\r\n  folded\r\n\r\n").status(), 400);
        assert_eq!(refused(b"GET /%zz HTTP/1.1\r\n\r\n").status(), 400);
        assert_eq!(refused(b"GET /%ff HTTP/1.1\r\n\r\n").status(), 400);
        assert_eq!(refused(b"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n").status(), 400);
        assert_eq!(refused(b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").status(), 400);
        assert_eq!(refused(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").status(), 501);
        assert_eq!(refused(b"POST / HTTP/1.1\r\nContent-Length: 1048577\r\n\r\n").status(), 413);
        assert_eq!(refused(b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n").status(), 400);
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=MAX_HEADER_FIELDS {
            many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(refused(&many).status(), 431);
        let mut big = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
        big.resize(LIMITS.max_head + 10, b'a');
        assert_eq!(refused(&big).status(), 431);
        // Agreeing duplicates are fine.
        let (r, _) = done(b"POST / HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\nab");
        assert_eq!(r.body, b"ab");
    }

    #[test]
    fn a_head_just_under_the_limit_is_accepted() {
        let mut req = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
        req.resize(LIMITS.max_head - 4, b'a');
        req.extend_from_slice(b"\r\n\r\n");
        assert_eq!(req.len(), LIMITS.max_head);
        done(&req);
    }

    fn tchar_string(max: usize) -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop::sample::select(
                b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`|~".to_vec(),
            ),
            1..max,
        )
        .prop_map(|v| String::from_utf8(v).unwrap_or_default())
    }

    #[derive(Debug, Clone)]
    struct Generated {
        method: String,
        segments: Vec<String>,
        query: Vec<(String, String)>,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        http10: bool,
        bare_lf: bool,
    }

    fn generated() -> impl Strategy<Value = Generated> {
        (
            tchar_string(10),
            proptest::collection::vec(any::<String>(), 0..4),
            proptest::collection::vec((any::<String>(), any::<String>()), 0..4),
            proptest::collection::vec(
                (tchar_string(20), "[!-~]([ !-~]{0,40}[!-~])?").prop_filter("no framing headers", |(n, _)| {
                    !["content-length", "transfer-encoding", "expect"].iter().any(|h| n.eq_ignore_ascii_case(h))
                }),
                0..8,
            ),
            proptest::collection::vec(any::<u8>(), 0..300),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(method, segments, query, headers, body, http10, bare_lf)| Generated {
                method,
                segments,
                query,
                headers,
                body,
                http10,
                bare_lf,
            })
    }

    fn serialize(g: &Generated) -> Vec<u8> {
        let eol = if g.bare_lf { "\n" } else { "\r\n" };
        let mut target = String::new();
        for s in &g.segments {
            target.push('/');
            target.push_str(&percent_encode(s));
        }
        if target.is_empty() {
            target.push('/');
        }
        if !g.query.is_empty() {
            target.push('?');
            let pairs: Vec<String> =
                g.query.iter().map(|(n, v)| format!("{}={}", percent_encode(n), percent_encode(v))).collect();
            target.push_str(&pairs.join("&"));
        }
        let version = if g.http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        let mut text = format!("{} {target} {version}{eol}", g.method);
        for (n, v) in &g.headers {
            text.push_str(&format!("{n}: {v}{eol}"));
        }
        if !g.body.is_empty() {
            text.push_str(&format!("Content-Length: {}{eol}", g.body.len()));
        }
        text.push_str(eol);
        let mut bytes = text.into_bytes();
        bytes.extend_from_slice(&g.body);
        bytes
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = parse_request(&bytes, &LIMITS);
            let _ = parse_request(&bytes, &Limits { max_head: 64, max_body: 8 });
        }

        #[test]
        fn mangled_requests_never_panic(g in generated(), cut in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let mut bytes = serialize(&g);
            let i = cut.index(bytes.len());
            bytes[i] = byte;
            let _ = parse_request(&bytes, &LIMITS);
            bytes.truncate(i);
            let _ = parse_request(&bytes, &LIMITS);
        }

        #[test]
        fn generated_requests_round_trip(g in generated(), trailer in proptest::collection::vec(any::<u8>(), 0..20)) {
            let bytes = serialize(&g);
            // Every strict prefix asks for more.
            for cut in 0..bytes.len() {
                let progress = parse_request(&bytes[..cut], &LIMITS);
                prop_assert!(matches!(progress, Ok(Progress::NeedMore { .. })), "prefix {cut}: {progress:?}");
            }
            let mut with_trailer = bytes.clone();
            with_trailer.extend_from_slice(&trailer);
            let Ok(Progress::Done(r, used)) = parse_request(&with_trailer, &LIMITS) else {
                panic!("not parsed: {:?}", parse_request(&with_trailer, &LIMITS));
            };
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(&r.method, &g.method);
            let path: String = g.segments.iter().map(|s| format!("/{s}")).collect();
            prop_assert_eq!(r.path, if path.is_empty() { "/".to_owned() } else { path });
            prop_assert_eq!(&r.query, &g.query);
            prop_assert_eq!(r.version, if g.http10 { Version::Http10 } else { Version::Http11 });
            prop_assert_eq!(&r.headers[..g.headers.len()], &g.headers[..]);
            prop_assert_eq!(&r.body, &g.body);
        }
    }
}
