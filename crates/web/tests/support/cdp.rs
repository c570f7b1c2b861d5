//! A small driver of headless Chromium over the Chrome DevTools Protocol (CDP), for tests of
//! the web UI: it launches the browser, opens a page and evaluates JavaScript, clicks elements
//! with real mouse events and waits for conditions, each wait bounded.
//!
//! Self-contained (std and `serde_json` only, with its own minimal websocket client), so that
//! another crate's tests can use it too:
//!
//! ```ignore
//! #[path = "../../web/tests/support/cdp.rs"]
//! mod cdp;
//!
//! let Some(binary) = cdp::chromium_or_skip("my_ui_test") else { return };
//! let mut browser = cdp::Browser::launch(&binary).unwrap();
//! browser.navigate("http://127.0.0.1:8080/").unwrap();
//! browser.click("#btn-take").unwrap();
//! browser.wait_text("#system-state", "Running").unwrap();
//! ```
//!
//! The browser is found by [`find_chromium`]: `$DAQFLOW_CHROMIUM`, else `chromium`,
//! `chromium-browser`, `google-chrome`, `google-chrome-stable` on `PATH`. Without one,
//! [`chromium_or_skip`] fails the test when `CI` is set (CI installs Chromium) and skips it
//! otherwise.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// How long any one step may take before the driver gives up.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// The browser binary: `$DAQFLOW_CHROMIUM` if set, else the first of `chromium`,
/// `chromium-browser`, `google-chrome`, `google-chrome-stable` found on `PATH`.
pub fn find_chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("DAQFLOW_CHROMIUM").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    for name in ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"] {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if is_executable(&candidate) {
                return Some(candidate);
            }
        }
    }
    None
}

fn is_executable(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        path.is_file()
    }
}

/// The browser for test `test`; without one, panics if the environment variable `CI` is set,
/// else prints why the test is skipped and returns None.
pub fn chromium_or_skip(test: &str) -> Option<PathBuf> {
    if let Some(binary) = find_chromium() {
        return Some(binary);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{test}: no Chromium found (chromium, chromium-browser, google-chrome on PATH, or $DAQFLOW_CHROMIUM); \
             CI must install it (see .ci/run)"
        );
    }
    // Written to stderr directly, not with eprintln!, so that the test harness does not
    // capture it: a skipped test should say so.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: no Chromium found (chromium, chromium-browser, google-chrome on PATH, or \
         $DAQFLOW_CHROMIUM). Install it (Debian: apt-get install chromium) to run this test."
    );
    None
}

/// A minimal websocket client (RFC 6455): text frames out (masked), text frames in
/// (fragmented or not), pings answered; enough for CDP.
struct WebSocket {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    rng: u64,
}

impl WebSocket {
    /// Connects to `ws://HOST:PORT/PATH`.
    fn connect(url: &str) -> Result<WebSocket, String> {
        let rest = url.strip_prefix("ws://").ok_or_else(|| format!("not a ws:// URL: {url}"))?;
        let (host, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
        let stream = TcpStream::connect(host).map_err(|e| format!("connecting to {host}: {e}"))?;
        stream.set_read_timeout(Some(STEP_TIMEOUT)).map_err(|e| e.to_string())?;
        stream.set_write_timeout(Some(STEP_TIMEOUT)).map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
        let seed = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
        let mut ws = WebSocket {
            reader: BufReader::new(stream),
            writer: writer.try_clone().map_err(|e| e.to_string())?,
            rng: seed,
        };
        let key = ws.handshake_key();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        writer.write_all(request.as_bytes()).map_err(|e| format!("websocket handshake: {e}"))?;
        let mut status = String::new();
        ws.reader.read_line(&mut status).map_err(|e| format!("websocket handshake: {e}"))?;
        if status.split(' ').nth(1) != Some("101") {
            return Err(format!("websocket handshake refused: {}", status.trim()));
        }
        loop {
            let mut line = String::new();
            ws.reader.read_line(&mut line).map_err(|e| format!("websocket handshake: {e}"))?;
            if line.trim().is_empty() {
                break;
            }
        }
        Ok(ws)
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64: masking keys need not be secret here, only vary.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn handshake_key(&mut self) -> String {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.next_random().to_le_bytes());
        bytes[8..].copy_from_slice(&self.next_random().to_le_bytes());
        base64(&bytes)
    }

    fn send_frame(&mut self, opcode: u8, payload: &[u8]) -> Result<(), String> {
        let mut frame = Vec::with_capacity(payload.len() + 14);
        frame.push(0x80 | opcode);
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n <= u16::MAX as usize => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = (self.next_random() as u32).to_be_bytes();
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.writer.write_all(&frame).map_err(|e| format!("websocket write: {e}"))
    }

    fn send_text(&mut self, text: &str) -> Result<(), String> {
        self.send_frame(0x1, text.as_bytes())
    }

    /// The next whole text (or binary) message.
    fn read_message(&mut self) -> Result<String, String> {
        let mut message = Vec::new();
        loop {
            let mut head = [0u8; 2];
            self.reader.read_exact(&mut head).map_err(|e| format!("websocket read: {e}"))?;
            let fin = head[0] & 0x80 != 0;
            let opcode = head[0] & 0x0f;
            let masked = head[1] & 0x80 != 0;
            let mut length = u64::from(head[1] & 0x7f);
            if length == 126 {
                let mut b = [0u8; 2];
                self.reader.read_exact(&mut b).map_err(|e| format!("websocket read: {e}"))?;
                length = u64::from(u16::from_be_bytes(b));
            } else if length == 127 {
                let mut b = [0u8; 8];
                self.reader.read_exact(&mut b).map_err(|e| format!("websocket read: {e}"))?;
                length = u64::from_be_bytes(b);
            }
            if length > 256 * 1024 * 1024 {
                return Err(format!("websocket frame of {length} bytes"));
            }
            let mut mask = [0u8; 4];
            if masked {
                self.reader.read_exact(&mut mask).map_err(|e| format!("websocket read: {e}"))?;
            }
            let mut payload = vec![0u8; length as usize];
            self.reader.read_exact(&mut payload).map_err(|e| format!("websocket read: {e}"))?;
            if masked {
                for (i, b) in payload.iter_mut().enumerate() {
                    *b ^= mask[i % 4];
                }
            }
            match opcode {
                0x0..=0x2 => {
                    message.extend_from_slice(&payload);
                    if fin {
                        return String::from_utf8(message).map_err(|e| format!("websocket message not UTF-8: {e}"));
                    }
                }
                0x8 => return Err("the browser closed the DevTools connection".into()),
                0x9 => self.send_frame(0xA, &payload)?,
                _ => {}
            }
        }
    }
}

fn base64(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut count) = (0u32, 0);
    for c in text.bytes().filter(|&c| c != b'=' && !c.is_ascii_whitespace()) {
        bits = bits << 6 | u32::from(value(c).ok_or("invalid base64")?);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    Ok(out)
}

/// A headless Chromium with one page, driven over CDP. Dropping it kills the browser and
/// removes its temporary profile.
pub struct Browser {
    child: Child,
    profile: PathBuf,
    ws: WebSocket,
    next_id: u64,
    session: Option<String>,
    stderr_tail: Arc<Mutex<Vec<String>>>,
    /// JavaScript exceptions and `console.error` calls seen on the page.
    pub page_errors: Vec<String>,
}

impl Browser {
    /// Starts `binary` headless with a fresh profile and opens a blank page.
    pub fn launch(binary: &Path) -> Result<Browser, String> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let profile = std::env::temp_dir().join(format!("daqflow-cdp-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&profile).map_err(|e| format!("creating {}: {e}", profile.display()))?;
        let mut child = Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-sync",
                "--disable-component-update",
                "--mute-audio",
                "--window-size=1280,900",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;

        // Chromium prints `DevTools listening on ws://…` on stderr; keep reading it all (a full
        // pipe would block the browser) and keep the last lines for error messages.
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let tail = Arc::new(Mutex::new(Vec::new()));
        let (url_tx, url_rx) = mpsc::channel();
        let tail_writer = tail.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.split("DevTools listening on ").nth(1) {
                    let _ = url_tx.send(url.trim().to_owned());
                }
                let mut t = tail_writer.lock().unwrap_or_else(|p| p.into_inner());
                t.push(line);
                if t.len() > 40 {
                    t.remove(0);
                }
            }
        });
        let tail_text = |tail: &Arc<Mutex<Vec<String>>>| tail.lock().unwrap_or_else(|p| p.into_inner()).join("\n");
        let url = match url_rx.recv_timeout(STEP_TIMEOUT) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_dir_all(&profile);
                return Err(format!("Chromium did not print its DevTools address; its stderr:\n{}", tail_text(&tail)));
            }
        };
        let ws = match WebSocket::connect(&url) {
            Ok(ws) => ws,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_dir_all(&profile);
                return Err(e);
            }
        };
        let mut browser =
            Browser { child, profile, ws, next_id: 0, session: None, stderr_tail: tail, page_errors: Vec::new() };
        let target = browser.browser_call("Target.createTarget", json!({"url": "about:blank"}))?;
        let target_id = target["targetId"].as_str().ok_or("no targetId")?.to_owned();
        let attached =
            browser.browser_call("Target.attachToTarget", json!({"targetId": target_id, "flatten": true}))?;
        browser.session = Some(attached["sessionId"].as_str().ok_or("no sessionId")?.to_owned());
        browser.call("Page.enable", json!({}))?;
        browser.call("Runtime.enable", json!({}))?;
        Ok(browser)
    }

    /// The last lines Chromium wrote on stderr.
    pub fn stderr_tail(&self) -> String {
        self.stderr_tail.lock().unwrap_or_else(|p| p.into_inner()).join("\n")
    }

    fn send(&mut self, method: &str, params: Value, session: Option<String>) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            message["sessionId"] = Value::String(s);
        }
        self.ws.send_text(&message.to_string())?;
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            if Instant::now() > deadline {
                return Err(format!("no answer to {method} within {STEP_TIMEOUT:?}"));
            }
            let text = self.ws.read_message()?;
            let reply: Value = serde_json::from_str(&text).map_err(|e| format!("CDP message not JSON: {e}"))?;
            if reply["id"].as_u64() == Some(id) {
                if let Some(error) = reply.get("error") {
                    return Err(format!("{method} failed: {error}"));
                }
                return Ok(reply["result"].clone());
            }
            self.note_event(&reply);
        }
    }

    /// Keeps the page's errors from the events that come between answers.
    fn note_event(&mut self, event: &Value) {
        match event["method"].as_str() {
            Some("Runtime.exceptionThrown") => {
                let details = &event["params"]["exceptionDetails"];
                let text =
                    details["exception"]["description"].as_str().or(details["text"].as_str()).unwrap_or("exception");
                self.page_errors.push(text.to_owned());
            }
            Some("Runtime.consoleAPICalled") if event["params"]["type"] == "error" => {
                let args: Vec<String> = event["params"]["args"]
                    .as_array()
                    .map(|a| a.iter().map(|v| v["value"].to_string()).collect())
                    .unwrap_or_default();
                self.page_errors.push(format!("console.error: {}", args.join(" ")));
            }
            _ => {}
        }
    }

    /// A command to the browser itself.
    pub fn browser_call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.send(method, params, None)
    }

    /// A command to the page.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let session = self.session.clone();
        self.send(method, params, session)
    }

    /// Loads `url` and waits for the document to be complete.
    pub fn navigate(&mut self, url: &str) -> Result<(), String> {
        let result = self.call("Page.navigate", json!({"url": url}))?;
        if let Some(error) = result.get("errorText").and_then(Value::as_str) {
            return Err(format!("loading {url}: {error}"));
        }
        self.wait_for(&format!("{url} to load"), "document.readyState === 'complete'")?;
        Ok(())
    }

    /// Evaluates a JavaScript expression (promises awaited) and returns its value.
    pub fn eval(&mut self, expression: &str) -> Result<Value, String> {
        let result = self
            .call("Runtime.evaluate", json!({"expression": expression, "returnByValue": true, "awaitPromise": true}))?;
        if let Some(details) = result.get("exceptionDetails") {
            let text = details["exception"]["description"].as_str().or(details["text"].as_str()).unwrap_or("exception");
            return Err(format!("evaluating `{expression}`: {text}"));
        }
        Ok(result["result"]["value"].clone())
    }

    /// Polls `expression` until it is truthy (at most [`STEP_TIMEOUT`]); returns its value.
    pub fn wait_for(&mut self, what: &str, expression: &str) -> Result<Value, String> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let last = match self.eval(expression) {
                Ok(v) if truthy(&v) => return Ok(v),
                Ok(v) => v,
                Err(e) => Value::String(e),
            };
            if Instant::now() > deadline {
                return Err(format!(
                    "timed out after {STEP_TIMEOUT:?} waiting for {what} (`{expression}` gave {last})"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The text of the first element matching `selector` (None if there is none).
    pub fn text(&mut self, selector: &str) -> Result<Option<String>, String> {
        let s = serde_json::to_string(selector).map_err(|e| e.to_string())?;
        let v = self.eval(&format!(
            "(() => {{ const e = document.querySelector({s}); return e ? e.textContent : null; }})()"
        ))?;
        Ok(v.as_str().map(str::to_owned))
    }

    /// Waits until the text of `selector` is `expected` (trimmed).
    pub fn wait_text(&mut self, selector: &str, expected: &str) -> Result<(), String> {
        let s = serde_json::to_string(selector).map_err(|e| e.to_string())?;
        let want = serde_json::to_string(expected).map_err(|e| e.to_string())?;
        self.wait_for(
            &format!("{selector} to read {expected:?}"),
            &format!(
                "(() => {{ const e = document.querySelector({s}); return !!e && e.textContent.trim() === {want}; }})()"
            ),
        )
        .map(drop)
    }

    /// Clicks the element matching `selector` with real mouse events at its centre, after
    /// waiting until it exists, is visible and is enabled.
    pub fn click(&mut self, selector: &str) -> Result<(), String> {
        let s = serde_json::to_string(selector).map_err(|e| e.to_string())?;
        let point = self.wait_for(
            &format!("{selector} to be clickable"),
            &format!(
                "(() => {{ const e = document.querySelector({s}); if (!e || e.disabled) return null; \
                 e.scrollIntoView({{block: 'center', inline: 'center'}}); const r = e.getBoundingClientRect(); \
                 if (r.width === 0 || r.height === 0) return null; \
                 return {{x: r.left + r.width / 2, y: r.top + r.height / 2}}; }})()"
            ),
        )?;
        let (x, y) = (point["x"].as_f64().unwrap_or(0.0), point["y"].as_f64().unwrap_or(0.0));
        self.call("Input.dispatchMouseEvent", json!({"type": "mouseMoved", "x": x, "y": y}))?;
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "buttons": 1, "clickCount": 1}),
            )?;
        }
        Ok(())
    }

    /// The browser's cookies for `url` (`Network.getCookies`: HttpOnly ones included), each
    /// `{"name", "value", "httpOnly", "sameSite", "path", …}`.
    pub fn cookies(&mut self, url: &str) -> Result<Vec<Value>, String> {
        let r = self.call("Network.getCookies", json!({"urls": [url]}))?;
        Ok(r["cookies"].as_array().cloned().unwrap_or_default())
    }

    /// Sets the value of the input matching `selector` (as typing it would, with an `input`
    /// event).
    pub fn fill(&mut self, selector: &str, text: &str) -> Result<(), String> {
        let s = serde_json::to_string(selector).map_err(|e| e.to_string())?;
        let t = serde_json::to_string(text).map_err(|e| e.to_string())?;
        let found = self.eval(&format!(
            "(() => {{ const e = document.querySelector({s}); if (!e) return false; e.value = {t}; \
             e.dispatchEvent(new Event('input', {{bubbles: true}})); return true; }})()"
        ))?;
        if found == Value::Bool(true) { Ok(()) } else { Err(format!("no {selector} to fill")) }
    }

    /// A PNG screenshot of the page (for debugging a failing test).
    pub fn screenshot(&mut self) -> Result<Vec<u8>, String> {
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}))?;
        base64_decode(shot["data"].as_str().ok_or("no screenshot data")?)
    }

    /// Whether the element matching `selector` is disabled (None if there is none).
    pub fn is_disabled(&mut self, selector: &str) -> Result<Option<bool>, String> {
        let s = serde_json::to_string(selector).map_err(|e| e.to_string())?;
        let v = self
            .eval(&format!("(() => {{ const e = document.querySelector({s}); return e ? !!e.disabled : null; }})()"))?;
        Ok(v.as_bool())
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.ws.send_frame(0x8, &[]);
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Helper processes may still be letting go of the profile: try a few times.
        for _ in 0..10 {
            if std::fs::remove_dir_all(&self.profile).is_ok() || !self.profile.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_rfc_examples() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(b"foob"), "Zm9vYg==");
        assert_eq!(super::base64(b"foobar"), "Zm9vYmFy");
        for text in [&b""[..], b"f", b"fo", b"foo", b"foob", b"fooba", b"foobar"] {
            assert_eq!(super::base64_decode(&super::base64(text)).unwrap(), text);
        }
    }
}
