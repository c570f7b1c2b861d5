//! `--metrics ADDR` with real processes: `daqflow et start`, `daqflow control-server` and
//! `daqflow component` each serve Prometheus metrics by themselves, scraped here with a plain
//! TCP stream; the figures move as the processes work, garbage gets an error answer and the
//! process goes on, and an address in use is a clear error.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::Proc;

fn unique(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

/// A free address on 127.0.0.1 (bound and let go: nobody else takes it in between here).
fn free_addr() -> String {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string()
}

/// Sends `request` and reads the whole answer, retrying the connection while the process
/// starts.
fn exchange(addr: &str, request: &[u8]) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut tcp = loop {
        match TcpStream::connect(addr) {
            Ok(t) => break t,
            Err(e) => {
                assert!(Instant::now() < deadline, "nobody listens on {addr}: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    tcp.write_all(request).unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).unwrap();
    String::from_utf8(answer).unwrap()
}

/// `GET /metrics`: the body of a 200 answer in the text format.
fn scrape(addr: &str) -> String {
    let answer = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: prometheus\r\n\r\n");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head: {answer:?}"));
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    body.to_owned()
}

/// The value of `series` (`name{labels}` exactly as written) in `text`.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Scrapes until `series` satisfies `ok`; returns the last text.
fn until(addr: &str, series: &str, what: &str, ok: impl Fn(f64) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = scrape(addr);
        if value(&text, series).is_some_and(&ok) {
            return text;
        }
        assert!(Instant::now() < deadline, "{series} never {what}:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn et_start_serves_its_pool_stations_and_attachments_and_the_counts_move() {
    let name = unique("metrics-et");
    let metrics = free_addr();
    let mut et = Proc::spawn(&[
        "et",
        "start",
        "--name",
        &name,
        "--events",
        "200",
        "--event-size",
        "1024",
        "--metrics",
        &metrics,
    ]);
    et.expect(&format!("ready {name}"));
    let sys = format!("system=\"{name}\"");
    let gc = format!("{{{sys},station=\"GRAND_CENTRAL\"}}");
    let text = scrape(&metrics);
    assert_eq!(value(&text, &format!("daqflow_et_events{{{sys}}}")), Some(200.0), "{text}");
    assert_eq!(value(&text, &format!("daqflow_et_free_events{{{sys}}}")), Some(200.0), "{text}");
    assert_eq!(value(&text, &format!("daqflow_et_attachments{{{sys}}}")), Some(0.0), "{text}");
    assert!(text.contains("# TYPE daqflow_et_station_events_in_total counter\n"), "{text}");
    let before = value(&text, &format!("daqflow_et_station_events_out_total{gc}")).expect("GrandCentral's count");

    // A consumer's station takes what a producer puts.
    let mut consumer = Proc::spawn(&[
        "et",
        "consume",
        "--name",
        &name,
        "--station",
        "mon",
        "--create",
        "blocking",
        "--count",
        "300",
        "--json",
    ]);
    let mon = format!("{{{sys},station=\"mon\"}}");
    until(&metrics, &format!("daqflow_et_station_attachments{mon}"), "1", |v| v == 1.0);
    let mut producer =
        Proc::spawn(&["et", "produce", "--name", &name, "--count", "300", "--size", "100", "--batch", "10"]);
    assert_eq!(producer.wait_exit(), 0);
    assert_eq!(consumer.wait_exit(), 0);
    let text = until(&metrics, &format!("daqflow_et_station_events_in_total{mon}"), "300", |v| v == 300.0);
    assert_eq!(value(&text, &format!("daqflow_et_station_events_out_total{mon}")), Some(300.0), "{text}");
    assert!(value(&text, &format!("daqflow_et_station_events_out_total{gc}")).unwrap() >= before + 300.0, "{text}");
    assert_eq!(value(&text, &format!("daqflow_et_station_queued{mon}")), Some(0.0), "{text}");
    until(&metrics, &format!("daqflow_et_free_events{{{sys}}}"), "200 again", |v| v == 200.0);

    // A consumer holding events shows as an attachment with what it holds. (Attached before the
    // events come: a station nobody is attached to lets them flow past.)
    until(&metrics, &format!("daqflow_et_attachments{{{sys}}}"), "0", |v| v == 0.0);
    let _holder =
        Proc::spawn(&["et", "consume", "--name", &name, "--station", "mon", "--count", "5", "--batch", "5", "--hold"]);
    until(&metrics, &format!("daqflow_et_station_attachments{mon}"), "1 again", |v| v == 1.0);
    let mut producer =
        Proc::spawn(&["et", "produce", "--name", &name, "--count", "5", "--size", "100", "--batch", "5"]);
    assert_eq!(producer.wait_exit(), 0);
    let text = until(&metrics, &format!("daqflow_et_free_events{{{sys}}}"), "195", |v| v == 195.0);
    let held: Vec<&str> = text.lines().filter(|l| l.starts_with("daqflow_et_attachment_held_events{")).collect();
    assert!(held.iter().any(|l| l.contains("station=\"mon\"") && l.ends_with(" 5")), "{text}");
    assert!(et.child.try_wait().unwrap().is_none(), "the ET system lives");
}

#[test]
fn garbage_gets_an_error_answer_and_the_process_goes_on() {
    let name = unique("metrics-garbage");
    let metrics = free_addr();
    let mut et =
        Proc::spawn(&["et", "start", "--name", &name, "--events", "50", "--event-size", "256", "--metrics", &metrics]);
    et.expect(&format!("ready {name}"));
    let status = |a: &str| a.get(..12).unwrap_or(a).to_owned();
    assert_eq!(
        status(&exchange(&metrics, b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03 tls?\r\n\r\n")),
        "HTTP/1.1 400"
    );
    assert_eq!(status(&exchange(&metrics, b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n")), "HTTP/1.1 400");
    assert_eq!(status(&exchange(&metrics, b"GET /admin HTTP/1.1\r\n\r\n")), "HTTP/1.1 404");
    assert_eq!(status(&exchange(&metrics, b"DELETE /metrics HTTP/1.1\r\n\r\n")), "HTTP/1.1 405");
    assert_eq!(status(&exchange(&metrics, &vec![b'x'; 100_000])), "HTTP/1.1 431");
    // Connections that say nothing do not keep others out.
    let silent: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&metrics).unwrap()).collect();
    let text = scrape(&metrics);
    assert!(text.contains(&format!("daqflow_et_events{{system=\"{name}\"}} 50\n")), "{text}");
    drop(silent);
    assert!(et.child.try_wait().unwrap().is_none(), "the ET system lives");
}

#[test]
fn an_address_in_use_is_a_clear_error_not_a_panic() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let name = unique("metrics-taken");
    for args in [
        vec!["et", "start", "--name", &name, "--events", "10", "--event-size", "256", "--metrics", &addr],
        vec!["control-server", "--listen", "127.0.0.1:0", "--metrics", &addr],
        vec!["component", "sink", "--name", "s", "--set", "listen=127.0.0.1:0", "--metrics", &addr],
    ] {
        let mut p = Proc::spawn(&args);
        assert_eq!(p.wait_exit(), 2, "{args:?}");
        let err = p.stderr_lines().join("\n");
        assert!(err.contains(&format!("cannot serve metrics on {addr}")), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn the_control_server_serves_its_directory_and_counts_a_process_lost_for_want_of_heartbeats() {
    let metrics = free_addr();
    let mut cs = Proc::spawn(&[
        "control-server",
        "--listen",
        "127.0.0.1:0",
        "--heartbeat-interval",
        "200ms",
        "--lost-after",
        "1s",
        "--metrics",
        &metrics,
    ]);
    let addr = cs.expect("listening on ").trim_start_matches("listening on ").to_owned();
    let srv = format!("server=\"{addr}\"");
    let text = scrape(&metrics);
    assert_eq!(value(&text, &format!("daqflow_dialog_processes{{{srv}}}")), Some(0.0), "{text}");
    assert_eq!(value(&text, &format!("daqflow_dialog_processes_lost_total{{{srv},reason=\"heartbeat\"}}")), Some(0.0));

    let sink =
        Proc::spawn(&["component", "sink", "--name", "lonely-sink", "--control", &addr, "--set", "listen=127.0.0.1:0"]);
    let mut listener = Proc::spawn(&["dialog", "--control", &addr, "listen", "lonely-sink/state"]);
    let text = until(&metrics, &format!("daqflow_dialog_processes{{{srv}}}"), "2", |v| v == 2.0);
    let text = if value(&text, &format!("daqflow_dialog_subscriptions{{{srv}}}")).unwrap_or(0.0) >= 1.0 {
        text
    } else {
        until(&metrics, &format!("daqflow_dialog_subscriptions{{{srv}}}"), "≥ 1", |v| v >= 1.0)
    };
    assert!(value(&text, &format!("daqflow_dialog_services{{{srv}}}")).unwrap() >= 3.0, "state, stats, log: {text}");
    assert!(value(&text, &format!("daqflow_dialog_commands{{{srv}}}")).unwrap() >= 1.0, "{text}");
    let age = value(&text, &format!("daqflow_dialog_heartbeat_age_seconds{{{srv},process=\"lonely-sink\"}}"));
    assert!(age.is_some_and(|a| (0.0..30.0).contains(&a)), "{text}");

    // The sink stops answering (SIGSTOP): declared lost for want of heartbeats.
    sink.signal(libc::SIGSTOP);
    let text =
        until(&metrics, &format!("daqflow_dialog_processes_lost_total{{{srv},reason=\"heartbeat\"}}"), "1", |v| {
            v == 1.0
        });
    assert_eq!(value(&text, &format!("daqflow_dialog_processes{{{srv}}}")), Some(1.0), "{text}");
    sink.signal(libc::SIGKILL);
    listener.signal(libc::SIGTERM);
    listener.wait_exit();
    assert!(cs.child.try_wait().unwrap().is_none(), "the control server lives");
}

#[test]
fn a_component_serves_its_state_run_and_counters_in_the_operators_names() {
    let (sink_metrics, gen_metrics, data) = (free_addr(), free_addr(), free_addr());
    let name = unique("metrics-sink");
    let mut sink = Proc::spawn(&[
        "component",
        "sink",
        "--name",
        &name,
        "--set",
        &format!("listen={data}"),
        "--metrics",
        &sink_metrics,
    ]);
    let labels = format!("component=\"{name}\",kind=\"sink\"");
    let text = until(&sink_metrics, &format!("daqflow_component_up{{{labels}}}"), "1", |v| v == 1.0);
    assert_eq!(value(&text, &format!("daqflow_component_state{{{labels},state=\"Initial\"}}")), Some(1.0), "{text}");
    assert_eq!(value(&text, &format!("daqflow_component_run{{{labels}}}")), Some(0.0), "{text}");
    sink.send("configure");
    sink.expect("\"state\":\"Configured\"");
    sink.send("start 7");
    sink.expect("\"state\":\"Running\"");
    let text = scrape(&sink_metrics);
    assert_eq!(value(&text, &format!("daqflow_component_state{{{labels},state=\"Running\"}}")), Some(1.0), "{text}");
    assert_eq!(value(&text, &format!("daqflow_component_run{{{labels}}}")), Some(7.0), "{text}");

    let gen_name = unique("metrics-gen");
    let _generator = Proc::spawn(&[
        "component",
        "generator",
        "--name",
        &gen_name,
        "--set",
        &format!("downstream={data}"),
        "--set",
        "chunk_bytes=1024",
        "--set",
        "rate_hz=2000",
        "--start",
        "7",
        "--metrics",
        &gen_metrics,
    ]);
    let gen_labels = format!("component=\"{gen_name}\",kind=\"generator\"");
    until(&gen_metrics, &format!("daqflow_component_events_total{{{gen_labels}}}"), "> 0", |v| v > 0.0);
    let first = until(&sink_metrics, &format!("daqflow_component_events_total{{{labels}}}"), "> 0", |v| v > 0.0);
    let n = value(&first, &format!("daqflow_component_events_total{{{labels}}}")).unwrap();
    let text = until(&sink_metrics, &format!("daqflow_component_events_total{{{labels}}}"), "growing", |v| v > n);
    assert!(value(&text, &format!("daqflow_component_bytes_total{{{labels}}}")).unwrap() > 0.0, "{text}");
    assert!(text.contains("# TYPE daqflow_component_events_total counter\n"), "{text}");
    assert!(text.lines().any(|l| l.starts_with(&format!("daqflow_component_stat{{{labels},stat=\""))), "{text}");

    sink.send("stop");
    sink.expect("\"state\":\"Configured\"");
    until(&sink_metrics, &format!("daqflow_component_state{{{labels},state=\"Configured\"}}"), "1", |v| v == 1.0);
}

#[test]
fn a_component_the_operator_launches_serves_at_the_address_of_its_system_file_entry() {
    use daqflow_runcontrol::operator::{Operator, OperatorOptions};
    use daqflow_runcontrol::system::SystemFile;
    let dir = tempfile::tempdir().unwrap();
    let metrics = free_addr();
    let text = format!(
        "[system]\nname = \"t\"\ncontrol = \"127.0.0.1:0\"\ndata = \"{}\"\ntimeout_s = 20\n\n\
         [[component]]\nname = \"sink\"\nkind = \"sink\"\nmetrics = \"{metrics}\"\n\
         [component.params]\nlisten = \"127.0.0.1:0\"\n",
        dir.path().display()
    );
    let file = SystemFile::parse(&text, &daqflow::registry::standard()).unwrap_or_else(|e| panic!("{e}"));
    let op = Operator::launch(OperatorOptions::new(file, env!("CARGO_BIN_EXE_daqflow").into()))
        .unwrap_or_else(|e| panic!("launch: {e}"));
    let labels = "component=\"sink\",kind=\"sink\"";
    until(&metrics, &format!("daqflow_component_state{{{labels},state=\"Initial\"}}"), "1", |v| v == 1.0);
    op.configure().unwrap();
    until(&metrics, &format!("daqflow_component_state{{{labels},state=\"Configured\"}}"), "1", |v| v == 1.0);
    op.shutdown();
}
