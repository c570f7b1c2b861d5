//! The generator: the source of a chain (DAQ-Middleware's "source" component of figs. 4–9). At
//! `start` it connects to `downstream` and sends a begin marker, then chunks of `chunk_bytes`
//! with sequence numbers 1, 2, 3, …, free-running or at `rate_hz`; `stop` ends the stream with
//! an end marker that says how many chunks and bytes were sent.
//!
//! The data is one pattern buffer, sent by reference for every chunk with a fresh header (and
//! its CRC, computed once): the generator costs the chain as little as the paper's source did,
//! so that what is measured is the chain.
//!
//! ```no_run
//! use daqflow_chain::generator::{Generator, GeneratorConfig};
//! use daqflow_component::Component;
//! let mut g = Generator::new("gen", GeneratorConfig { downstream: "127.0.0.1:7301".into(), ..Default::default() });
//! g.configure()?;
//! g.start(1)?;
//! std::thread::sleep(std::time::Duration::from_secs(1));
//! let summary = g.stop(None)?; // {"chunks", "bytes", "mb_per_s", …}
//! # let _ = summary;
//! # Ok::<(), daqflow_component::ComponentError>(())
//! ```

mod config;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use daqflow_transport::{Connection, RetryPolicy};
use serde_json::{Value, json};

pub use self::config::GeneratorConfig;
use super::link::{Cut, Live, Outlet, abandon_thread, end_thread, resolve, spawn};
use super::protocol::{CHUNK_HEADER_LEN, ChunkHeader, FLAG_CRC, KIND_CHUNK, begin_frame, end_frame};
use daqflow_component::Component;
use daqflow_component::ComponentError;

/// The generator component.
pub struct Generator {
    name: String,
    config: GeneratorConfig,
    live: Arc<Live>,
    thread: Option<JoinHandle<Value>>,
    run: Option<u32>,
}

/// Builds a generator named `name` from its configuration table (the registry's entry for the
/// `generator` kind): the keys are checked, every problem named.
pub fn factory(name: &str, table: toml::Table) -> Result<Box<dyn Component>, daqflow_component::ComponentError> {
    let c: GeneratorConfig = daqflow_component::parse_config(name, table)?;
    c.check(name)?;
    Ok(Box::new(Generator::new(name, c)))
}

impl Generator {
    /// A generator named `name`.
    pub fn new(name: &str, config: GeneratorConfig) -> Generator {
        Generator { name: name.into(), config, live: Live::new(), thread: None, run: None }
    }
}

impl Component for Generator {
    fn kind(&self) -> &str {
        "generator"
    }

    fn configure(&mut self) -> Result<Value, ComponentError> {
        self.config.validate(&self.name)?;
        Ok(json!({ "chunk_bytes": self.config.chunk_bytes }))
    }

    fn start(&mut self, run: u32) -> Result<(), ComponentError> {
        let c = &self.config;
        let addr = resolve(&self.name, "downstream", &c.downstream)?;
        let policy = RetryPolicy::for_duration(Duration::from_millis(c.connect_timeout_ms));
        let conn = Connection::connect_with_retry(&[addr], &c.tuning().options(), &policy)
            .map_err(|e| ComponentError::Failed(format!("{}: downstream: {e}", self.name)))?;
        self.live = Live::new();
        let (name, config, live) = (self.name.clone(), self.config.clone(), self.live.clone());
        let outlet = Outlet::new(conn, config.send_queue_bytes);
        self.thread = Some(spawn(&self.name, "send", move || produce(&name, &config, run, outlet, &live))?);
        self.run = Some(run);
        Ok(())
    }

    /// Ends the stream after chunk `arg` (if more were sent already: at once) with an end
    /// marker, and returns `{"chunks", "bytes", "mb_per_s", "seconds", "error"}`.
    fn stop(&mut self, arg: Option<u64>) -> Result<Value, ComponentError> {
        let Some(thread) = self.thread.take() else { return Ok(json!({ "chunks": 0, "bytes": 0, "mb_per_s": 0.0 })) };
        let sent = self.live.chunks.load(Ordering::SeqCst);
        self.live.stop_at.store(arg.unwrap_or(sent), Ordering::SeqCst);
        self.live.paused.store(false, Ordering::SeqCst);
        Ok(end_thread(thread, &self.live, Duration::from_millis(self.config.stop_timeout_ms)))
    }

    fn pause(&mut self) -> Result<(), ComponentError> {
        self.live.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn resume(&mut self) -> Result<(), ComponentError> {
        self.live.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    fn reset(&mut self) -> Result<(), ComponentError> {
        abandon_thread(self.thread.take(), &self.live);
        Ok(())
    }

    /// `chunks`, `bytes`, `seconds`, `chunks_per_s`, `mb_per_s`, `recent_chunks_per_s`,
    /// `recent_mb_per_s`, `chunk_bytes`, `run`.
    fn stats(&self) -> Value {
        let mut m = self.live.stats();
        m.insert("chunk_bytes".into(), json!(self.config.chunk_bytes));
        m.insert("run".into(), json!(self.run));
        Value::Object(m)
    }

    fn failure(&self) -> Option<String> {
        self.live.failure()
    }
}

impl Drop for Generator {
    fn drop(&mut self) {
        let _ = self.reset();
    }
}

/// The pattern of the generator's data: a byte counter, so that a corrupted or shifted chunk
/// does not look like a good one.
fn pattern(len: usize) -> Bytes {
    (0..len).map(|i| (i as u8) ^ ((i >> 8) as u8)).collect::<Vec<u8>>().into()
}

/// The sending thread: begin marker, chunks until told to stop, end marker.
fn produce(name: &str, config: &GeneratorConfig, run: u32, mut out: Outlet, live: &Live) -> Value {
    let data = pattern(config.chunk_bytes);
    let crc = if config.check { ChunkHeader::for_data(0, &data, true).crc } else { 0 };
    let flags = if config.check { FLAG_CRC } else { 0 };
    let len = data.len() as u32;
    let frame_len = CHUNK_HEADER_LEN + data.len();
    let started = Instant::now();
    let mut sent: u64 = 0;
    let mut bytes: u64 = 0;
    // Pacing restarts from here after a pause.
    let mut paced_from: Option<(Instant, u64)> = None;
    let result: Result<(), Cut> = (|| {
        out.wait_room(super::protocol::BEGIN_LEN, &live.abandon)?;
        out.send(begin_frame(run))?;
        loop {
            if sent >= live.stop_at.load(Ordering::Relaxed) {
                return Ok(());
            }
            if live.abandon.load(Ordering::Relaxed) {
                return Err(Cut::Abandoned);
            }
            if live.paused.load(Ordering::Relaxed) {
                out.push()?;
                std::thread::sleep(Duration::from_millis(1));
                paced_from = None;
                continue;
            }
            if config.rate_hz > 0.0 {
                let (t0, n0) = *paced_from.get_or_insert((Instant::now(), sent));
                let due = t0 + Duration::from_secs_f64((sent - n0) as f64 / config.rate_hz);
                let now = Instant::now();
                if due > now {
                    out.push()?;
                    // Short steps, so that a stop is seen promptly.
                    std::thread::sleep((due - now).min(Duration::from_millis(5)));
                    continue;
                }
            }
            out.wait_room(frame_len, &live.abandon)?;
            let header = ChunkHeader { sequence: sent + 1, len, crc };
            out.send_prefixed(KIND_CHUNK, flags, &header.encode(), data.clone())?;
            sent += 1;
            bytes += data.len() as u64;
            live.publish(sent, bytes);
            if config.rate_hz > 0.0 {
                // Paced chunks leave at once instead of waiting for a full write.
                out.push()?;
            }
        }
    })();
    let error = match result {
        Ok(()) => {
            let ended = out.wait_room(super::protocol::END_LEN, &live.abandon).and_then(|()| {
                out.send(end_frame(sent, bytes))?;
                out.finish(&live.abandon)
            });
            match ended {
                Ok(()) => None,
                Err(Cut::Abandoned) => Some(format!(
                    "downstream {} stopped reading: the stream was cut after chunk {sent}, before its end marker",
                    out.conn.peer_addr()
                )),
                Err(Cut::Failed(e)) => Some(format!("ending the stream after chunk {sent}: {e}")),
            }
        }
        Err(Cut::Abandoned) => Some(format!(
            "downstream {} stopped reading: the stream was cut after chunk {sent}, before its end marker",
            out.conn.peer_addr()
        )),
        Err(Cut::Failed(e)) => Some(format!("sending chunk {}: {e}", sent + 1)),
    };
    live.publish(sent, bytes);
    if let Some(e) = &error {
        live.fail(name, e.clone());
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    json!({
        "component": name,
        "kind": "generator",
        "run": run,
        "chunks": sent,
        "bytes": bytes,
        "chunk_bytes": config.chunk_bytes,
        "seconds": secs,
        "mb_per_s": bytes as f64 / secs / 1e6,
        "error": error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Message, StreamCheck, StreamEvent};
    use daqflow_transport::{ConnectionOptions, Listener};

    fn listener() -> Listener {
        Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectionOptions::for_protocol(crate::protocol::PROTOCOL))
            .unwrap()
    }

    #[test]
    fn sends_begin_numbered_chunks_with_crcs_and_an_end_marker() {
        let l = listener();
        // Paced, so that the stop (after chunk 50) comes before the generator got that far,
        // however slow this thread is on a loaded machine.
        let config = GeneratorConfig {
            downstream: l.local_addr().to_string(),
            chunk_bytes: 3000,
            rate_hz: 20.0,
            ..Default::default()
        };
        let mut g = Generator::new("gen", config);
        g.configure().unwrap();
        g.start(4).unwrap();
        let mut conn = l.accept().unwrap();
        conn.admit();
        let summary = g.stop(Some(50)).unwrap();
        assert_eq!((summary["chunks"].as_u64(), summary["bytes"].as_u64()), (Some(50), Some(150_000)), "{summary}");
        assert!(summary["error"].is_null(), "{summary}");
        let mut check = StreamCheck::new(4, true);
        loop {
            let f = conn.recv().unwrap();
            if let Ok(Message::Chunk { header, has_crc }) = Message::decode(&f) {
                assert!(has_crc && header.len == 3000);
            }
            if check.on_frame(&f).unwrap() == StreamEvent::End {
                break;
            }
        }
        assert!(conn.recv().unwrap_err().is_clean_close());
        assert_eq!((check.chunks(), check.sequence_errors(), check.crc_errors(), check.crc_checked()), (50, 0, 0, 50));
        assert_eq!(check.end(), Some((50, 150_000)));
    }

    #[test]
    fn without_check_the_chunks_carry_no_crc_and_rate_hz_paces_them() {
        let l = listener();
        let config = GeneratorConfig {
            downstream: l.local_addr().to_string(),
            chunk_bytes: 100,
            check: false,
            rate_hz: 1000.0,
            ..Default::default()
        };
        let mut g = Generator::new("gen", config);
        g.start(1).unwrap();
        let mut conn = l.accept().unwrap();
        conn.admit();
        // Paced chunks leave one by one: they arrive before the stop.
        let mut check = StreamCheck::new(1, true);
        while check.chunks() < 5 {
            check.on_frame(&conn.recv().unwrap()).unwrap();
        }
        assert_eq!(check.crc_checked(), 0);
        let stats = g.stats();
        assert!(stats["chunks"].as_u64().unwrap() >= 5 && stats["chunk_bytes"] == 100, "{stats}");
        g.stop(None).unwrap();
    }

    #[test]
    fn a_downstream_that_does_not_read_is_cut_at_stop_after_the_timeout() {
        let l = listener();
        let config = GeneratorConfig {
            downstream: l.local_addr().to_string(),
            chunk_bytes: 1 << 20,
            stop_timeout_ms: 200,
            send_queue_bytes: 4 << 20,
            ..Default::default()
        };
        let mut g = Generator::new("gen", config);
        g.start(1).unwrap();
        let _conn = l.accept().unwrap(); // never read
        std::thread::sleep(Duration::from_millis(100));
        let summary = g.stop(None).unwrap();
        let e = summary["error"].as_str().unwrap_or_default();
        assert!(e.contains("stopped reading") && e.contains("before its end marker"), "{summary}");
    }

    #[test]
    fn bad_configurations_are_refused() {
        let e = |c: GeneratorConfig| Generator::new("g", c).configure().unwrap_err().to_string();
        assert!(e(GeneratorConfig::default()).contains("`downstream` is required"));
        let d = || GeneratorConfig { downstream: "127.0.0.1:1".into(), ..Default::default() };
        assert!(e(GeneratorConfig { chunk_bytes: 0, ..d() }).contains("`chunk_bytes` = 0 is out of range"));
        assert!(e(GeneratorConfig { rate_hz: -1.0, ..d() }).contains("rate_hz"));
        assert!(
            e(GeneratorConfig { downstream: "nowhere".into(), ..d() })
                .contains("`downstream` = \"nowhere\" is not an address")
        );
        let mut g = Generator::new("g", GeneratorConfig { connect_timeout_ms: 0, ..d() });
        assert!(g.start(1).unwrap_err().to_string().contains("g: downstream: could not connect"));
    }
}
