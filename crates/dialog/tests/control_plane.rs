//! The control plane's scenarios with a real control server and real clients over sockets on
//! 127.0.0.1 (processes are in-process here; `crates/cli/tests/dialog_processes.rs` repeats the
//! crash scenarios with real processes, SIGKILL and SIGSTOP).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use daqflow_dialog::protocol::{CONTROL_PROTOCOL, Message, PEER_PROTOCOL, kind};
use daqflow_dialog::*;
use daqflow_transport::{Connection, ConnectionOptions};
use daqflow_wire::frame::Frame;

/// A control server on a runtime of its own, so that it can be killed and restarted.
struct TestServer {
    rt: tokio::runtime::Runtime,
    handle: Option<ServerHandle>,
    addr: SocketAddr,
}

impl TestServer {
    fn start(config: ServerConfig) -> TestServer {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let handle = rt.block_on(ControlServer::start(config)).unwrap();
        let addr = handle.local_addr();
        TestServer { rt, handle: Some(handle), addr }
    }

    fn fast() -> ServerConfig {
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            heartbeat_interval: Duration::from_millis(100),
            lost_after: Duration::from_millis(600),
            ..ServerConfig::default()
        }
    }

    /// Stops it as if it had died: every connection drops.
    fn kill(&mut self) {
        let h = self.handle.take();
        let _guard = self.rt.enter();
        drop(h);
    }

    /// Starts it again on the same address.
    fn restart(&mut self, config: ServerConfig) {
        let config = ServerConfig { listen: self.addr, ..config };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.rt.block_on(ControlServer::start(config.clone())) {
                Ok(h) => {
                    self.handle = Some(h);
                    return;
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("restart: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    fn processes(&self) -> Vec<ProcessInfo> {
        self.handle.as_ref().map(|h| h.processes()).unwrap_or_default()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn config(name: &str, control: &[SocketAddr]) -> DialogConfig {
    let mut c = DialogConfig::new(name, control.to_vec());
    c.retry.initial = Duration::from_millis(20);
    c.retry.max = Duration::from_millis(200);
    c.lost_after = Duration::from_millis(600);
    c
}

fn join(name: &str, control: &[SocketAddr]) -> Dialog {
    let d = Dialog::start(config(name, control)).unwrap();
    assert!(d.wait_connected(Duration::from_secs(10)), "{name} did not connect");
    d
}

type Events = Arc<Mutex<Vec<ServiceEvent>>>;

fn collector() -> (Events, impl FnMut(ServiceEvent) + Send + 'static) {
    let events: Events = Arc::default();
    let e = events.clone();
    (events, move |ev| e.lock().unwrap().push(ev))
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn updates(events: &Events) -> Vec<(Vec<u8>, u64, bool)> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            ServiceEvent::Update { data, seq, initial } => Some((data.to_vec(), *seq, *initial)),
            _ => None,
        })
        .collect()
}

fn losses(events: &Events) -> Vec<(String, LostCause)> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            ServiceEvent::Lost { provider, cause } => Some((provider.clone(), *cause)),
            _ => None,
        })
        .collect()
}

#[test]
fn connect_handshake_lists_the_process_in_the_directory() {
    let server = TestServer::start(TestServer::fast());
    let ru = join("ru-1", &[server.addr]);
    let _state = ru.provide("ru-1/state").unwrap();
    let _cmd = ru.register_command("ru-1/configure", |_| {}).unwrap();
    let gui = join("gui", &[server.addr]);
    let procs = gui.processes(Duration::from_secs(10)).unwrap();
    let p = procs.iter().find(|p| p.name == "ru-1").expect("ru-1 listed");
    assert_eq!(p.pid, std::process::id());
    assert_eq!(p.port, ru.client().listen_addr().port());
    assert_eq!(p.host, "127.0.0.1");
    assert_eq!(p.provides, ["ru-1/state"]);
    assert_eq!(p.commands, ["ru-1/configure"]);
    assert!(procs.iter().any(|p| p.name == "gui" && p.subscribes == ["dialog/processes"]));
}

#[test]
fn a_message_from_an_unconnected_peer_is_ignored_and_answered_not_connected() {
    let server = TestServer::start(TestServer::fast());
    let opts = ConnectionOptions { token: None, ..ConnectionOptions::for_protocol(CONTROL_PROTOCOL) };
    let mut raw = Connection::connect(server.addr, &opts).unwrap();
    raw.send(Message::RegisterService { request: 1, name: "sneaky".into() }.to_frame()).unwrap();
    raw.flush().unwrap();
    let reply = raw.recv_timeout(Duration::from_secs(10)).unwrap().expect("an answer");
    assert_eq!(reply.kind, kind::NOT_CONNECTED);
    assert!(server.processes().is_empty(), "nothing was registered for the unconnected peer");
    let gui = join("gui", &[server.addr]);
    let _svc = gui.provide("sneaky").expect("the unconnected registration was ignored");
}

#[test]
fn a_subscriber_gets_the_current_value_first_then_every_update_in_order() {
    let server = TestServer::start(TestServer::fast());
    let provider = join("provider", &[server.addr]);
    let svc = provider.provide("counter").unwrap();
    svc.update(b"v0").unwrap();
    let subscriber = join("subscriber", &[server.addr]);
    let (events, handler) = collector();
    let _sub = subscriber.subscribe("counter", handler).unwrap();
    wait_until("initial value", || !updates(&events).is_empty());
    for i in 1..=500u32 {
        svc.update(format!("v{i}").as_bytes()).unwrap();
    }
    wait_until("500 updates", || updates(&events).len() == 501);
    let got = updates(&events);
    assert_eq!(got[0], (b"v0".to_vec(), 1, true));
    for (i, (data, seq, initial)) in got.iter().enumerate().skip(1) {
        assert_eq!((data.as_slice(), *seq, *initial), (format!("v{i}").as_bytes(), i as u64 + 1, false));
    }
    assert_eq!(svc.subscriber_count(), 1);
}

#[test]
fn a_request_before_the_provider_exists_is_satisfied_when_it_appears() {
    let server = TestServer::start(TestServer::fast());
    let subscriber = join("early-bird", &[server.addr]);
    let (events, handler) = collector();
    let sub = subscriber.subscribe("late/service", handler).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(updates(&events).is_empty());
    assert_eq!(sub.provider(), None);
    let provider = join("late", &[server.addr]);
    let svc = provider.provide("late/service").unwrap();
    wait_until("subscriber attached", || svc.subscriber_count() == 1);
    svc.update(b"finally").unwrap();
    wait_until("update", || updates(&events).len() == 1);
    assert_eq!(updates(&events)[0].0, b"finally");
    assert_eq!(sub.provider().as_deref(), Some("late"));
}

#[test]
fn a_command_is_delivered_to_every_process_that_registered_it() {
    let server = TestServer::start(TestServer::fast());
    /// (receiving process, sender, payload) of each delivery.
    type Deliveries = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;
    let got: Deliveries = Arc::default();
    let mut procs = Vec::new();
    for name in ["ru-1", "ru-2", "bu-1"] {
        let d = join(name, &[server.addr]);
        let g = got.clone();
        let n = name.to_owned();
        let reg = d
            .register_command("all/stop", move |c| g.lock().unwrap().push((n.clone(), c.from.clone(), c.data.to_vec())))
            .unwrap();
        procs.push((d, reg));
    }
    let operator = join("operator", &[server.addr]);
    // Registration is asynchronous: wait until the control server lists all three.
    wait_until("three registrants", || {
        server.processes().iter().filter(|p| p.commands.contains(&"all/stop".to_string())).count() == 3
    });
    assert_eq!(operator.send_command("all/stop", b"run 7").unwrap(), 3);
    wait_until("three deliveries", || got.lock().unwrap().len() == 3);
    let mut g = got.lock().unwrap().clone();
    g.sort();
    assert_eq!(
        g,
        [
            ("bu-1".into(), "operator".into(), b"run 7".to_vec()),
            ("ru-1".into(), "operator".into(), b"run 7".to_vec()),
            ("ru-2".into(), "operator".into(), b"run 7".to_vec())
        ]
    );
    assert_eq!(operator.send_command("nobody/listens", b"").unwrap(), 0);
}

#[test]
fn names_under_dialog_are_refused_to_clients_with_a_clear_error() {
    let server = TestServer::start(TestServer::fast());
    let p = join("p", &[server.addr]);
    for err in [p.provide("dialog/mine").unwrap_err(), p.register_command("dialog/mine", |_| {}).unwrap_err()] {
        assert_eq!(err, DialogError::Reserved("dialog/mine".into()));
        assert!(err.to_string().contains("names starting with `dialog/` are the control server's"), "{err}");
    }
    let _cmd = p.register_command("p/mine", |_| {}).unwrap();
    wait_until("the command registered", || {
        server.processes().iter().any(|q| q.name == "p" && q.commands == ["p/mine"] && q.provides.is_empty())
    });
}

#[test]
fn a_duplicate_service_is_refused_naming_its_owner_and_nothing_is_half_registered() {
    let server = TestServer::start(TestServer::fast());
    let owner = join("owner", &[server.addr]);
    let _svc = owner.provide("unique").unwrap();
    let intruder = join("intruder", &[server.addr]);
    let err = intruder.provide("unique").unwrap_err();
    assert!(matches!(&err, DialogError::ServiceTaken { owner, .. } if owner == "owner"), "{err}");
    assert!(err.to_string().contains("already provided by `owner` on 127.0.0.1:"), "{err}");
    // The intruder holds nothing: it can provide other services, and the directory agrees.
    let _other = intruder.provide("other").unwrap();
    let p = server.processes().into_iter().find(|p| p.name == "intruder").unwrap();
    assert_eq!(p.provides, ["other"]);
    assert!(matches!(owner.provide("unique"), Err(DialogError::AlreadyProvided(_))));
}

#[test]
fn a_wrong_or_missing_token_is_refused_and_the_process_is_told_why() {
    let token = Token::new("s3cret").unwrap();
    let server = TestServer::start(ServerConfig { token: Some(token.clone()), ..TestServer::fast() });
    let mut c = config("mallory", &[server.addr]);
    c.token = Some(Token::new("guess").unwrap());
    let bad = Dialog::start(c).unwrap();
    assert!(!bad.wait_connected(Duration::from_millis(800)));
    let why = bad.client().connection_problem().expect("a reason");
    assert!(why.contains("wrong token"), "{why}");
    let mut c = config("nobody", &[server.addr]);
    c.token = None;
    let none = Dialog::start(c).unwrap();
    assert!(!none.wait_connected(Duration::from_millis(800)));
    assert!(none.client().connection_problem().expect("a reason").contains("requires the system token"));
    let mut c = config("alice", &[server.addr]);
    c.token = Some(token);
    let good = Dialog::start(c).unwrap();
    assert!(good.wait_connected(Duration::from_secs(10)));
    assert_eq!(good.client().connection_problem(), None);
    assert_eq!(server.processes().iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["alice"]);
}

#[test]
fn a_process_of_another_protocol_version_is_refused_with_reason_version_not_as_malformed() {
    let server = TestServer::start(TestServer::fast());
    let opts = ConnectionOptions { token: None, ..ConnectionOptions::for_protocol(CONTROL_PROTOCOL) };
    // Version 1's CONNECT_TO_CONTROL_SERVER carried the shared secret after the name: a layout
    // this version cannot read. Then one of a later version with this version's layout.
    let mut v1 = daqflow_wire::codec::Writer::with_capacity(64);
    v1.u16(1);
    v1.text("old-timer");
    v1.text("the shared secret");
    v1.u32(42);
    v1.text("127.0.0.1");
    v1.u16(4000);
    v1.u64(0);
    // Then version 2 (this layout, without subscription keys) and a later version.
    let later = daqflow_dialog::protocol::PROTOCOL_VERSION + 1;
    let same_layout = |version: u16| {
        Message::ConnectToControlServer {
            version,
            name: "newcomer".into(),
            pid: 43,
            host: "127.0.0.1".into(),
            port: 4001,
            start_time_ns: 0,
        }
        .to_frame()
    };
    let tries = [
        (1, Frame::new(kind::CONNECT_TO_CONTROL_SERVER, v1.finish())),
        (2, same_layout(2)),
        (later, same_layout(later)),
    ];
    for (version, frame) in tries {
        let mut raw = Connection::connect(server.addr, &opts).unwrap();
        raw.send(frame).unwrap();
        raw.flush().unwrap();
        let reply = raw.recv_timeout(Duration::from_secs(10)).unwrap().expect("an answer, not a closed connection");
        match Message::from_frame(&reply).unwrap() {
            Message::ConnectRefused { reason, message } => {
                assert_eq!(reason, daqflow_dialog::protocol::RefuseReason::Version, "{message}");
                assert!(message.contains(&format!("protocol version {version} is not supported")), "{message}");
            }
            other => panic!("version {version}: expected CONNECT_REFUSED, got {other:?}"),
        }
        // Then the server closes the connection.
        let end = loop {
            match raw.recv_timeout(Duration::from_secs(10)) {
                Ok(Some(_)) => continue,
                other => break other,
            }
        };
        assert!(end.is_err(), "version {version}: the server closed the connection: {end:?}");
    }
    assert!(server.processes().is_empty());
}

#[test]
fn a_provider_that_leaves_is_reported_lost_and_a_spare_takes_over() {
    let server = TestServer::start(TestServer::fast());
    let primary = join("primary", &[server.addr]);
    let svc = primary.provide("hv/state").unwrap();
    svc.update(b"primary on").unwrap();
    let subscriber = join("watcher", &[server.addr]);
    let (events, handler) = collector();
    let _sub = subscriber.subscribe("hv/state", handler).unwrap();
    wait_until("initial value", || updates(&events).len() == 1);
    drop(svc);
    drop(primary);
    wait_until("lost", || !losses(&events).is_empty());
    assert_eq!(losses(&events)[0].0, "primary");
    let spare = join("spare", &[server.addr]);
    let svc = spare.provide("hv/state").unwrap();
    svc.update(b"spare on").unwrap();
    wait_until("spare's value", || updates(&events).len() == 2);
    // As the current value if the subscription reached the spare after the update, as an
    // update if before: either way the first value from the spare, its update 1.
    let (data, seq, _) = updates(&events)[1].clone();
    assert_eq!((data.as_slice(), seq), (&b"spare on"[..], 1));
}

#[test]
fn the_control_server_restarting_makes_everyone_register_again_and_links_keep_delivering() {
    let mut server = TestServer::start(TestServer::fast());
    let provider = join("ru-1", &[server.addr]);
    let svc = provider.provide("ru-1/stats").unwrap();
    let _cmd = provider.register_command("ru-1/configure", |_| {}).unwrap();
    let subscriber = join("monitor", &[server.addr]);
    let (events, handler) = collector();
    let _sub = subscriber.subscribe("ru-1/stats", handler).unwrap();
    wait_until("subscribed", || svc.subscriber_count() == 1);
    svc.update(b"before").unwrap();
    wait_until("before", || updates(&events).len() == 1);

    server.kill();
    wait_until("both notice", || !provider.is_connected() && !subscriber.is_connected());
    // The established provider → subscriber connection keeps delivering.
    svc.update(b"during").unwrap();
    wait_until("during", || updates(&events).len() == 2);

    server.restart(TestServer::fast());
    wait_until("both back", || provider.is_connected() && subscriber.is_connected());
    wait_until("everything registered again", || {
        let procs = server.processes();
        let ru = procs.iter().find(|p| p.name == "ru-1");
        let mon = procs.iter().find(|p| p.name == "monitor");
        matches!((ru, mon), (Some(r), Some(m))
            if r.provides == ["ru-1/stats"] && r.commands == ["ru-1/configure"] && m.subscribes == ["ru-1/stats"])
    });
    svc.update(b"after").unwrap();
    wait_until("after", || updates(&events).len() == 3);
    let got: Vec<Vec<u8>> = updates(&events).into_iter().map(|u| u.0).collect();
    assert_eq!(got, [b"before".to_vec(), b"during".to_vec(), b"after".to_vec()]);
    assert!(losses(&events).is_empty(), "the provider was never lost: {:?}", losses(&events));
    assert_eq!(svc.subscriber_count(), 1, "no duplicate subscription after the restart");
}

#[test]
fn the_second_control_server_address_is_used_when_the_first_is_down() {
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let spare = TestServer::start(TestServer::fast());
    let d = join("p", &[down, spare.addr]);
    assert!(d.is_connected());
    assert_eq!(spare.processes()[0].name, "p");
}

#[test]
fn an_idle_connection_is_closed_and_opened_again_when_needed() {
    let server = TestServer::start(TestServer::fast());
    let mut c = config("provider", &[server.addr]);
    c.idle_timeout = Duration::from_millis(200);
    let provider = Dialog::start(c).unwrap();
    assert!(provider.wait_connected(Duration::from_secs(10)));
    let svc = provider.provide("slow/service").unwrap();
    let subscriber = join("subscriber", &[server.addr]);
    let (events, handler) = collector();
    let _sub = subscriber.subscribe("slow/service", handler).unwrap();
    wait_until("subscribed", || svc.subscriber_count() == 1);
    svc.update(b"one").unwrap();
    wait_until("one", || updates(&events).len() == 1);
    assert_eq!(provider.client().open_links(), 1);
    wait_until("idle link closed", || provider.client().open_links() == 0);
    svc.update(b"two").unwrap();
    wait_until("two", || updates(&events).len() == 2);
    assert_eq!(provider.client().open_links(), 1);
    assert!(losses(&events).is_empty(), "closing an idle connection is not a loss");
    assert_eq!(svc.subscriber_count(), 1);
}

#[test]
fn garbage_on_every_listening_socket_leaves_the_processes_serving_others() {
    use std::io::Write;
    let server = TestServer::start(TestServer::fast());
    let provider = join("provider", &[server.addr]);
    let svc = provider.provide("svc").unwrap();
    let subscriber = join("subscriber", &[server.addr]);
    let (events, handler) = collector();
    let _sub = subscriber.subscribe("svc", handler).unwrap();
    wait_until("subscribed", || svc.subscriber_count() == 1);
    for target in [server.addr, provider.client().listen_addr(), subscriber.client().listen_addr()] {
        let mut s = std::net::TcpStream::connect(target).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut s2 = std::net::TcpStream::connect(target).unwrap();
        s2.write_all(&[0x44, 0x51, 1, 0, 99, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 2, 3]).unwrap(); // a frame of unknown kind
    }
    for i in 0..20u32 {
        svc.update(&i.to_le_bytes()).unwrap();
    }
    wait_until("updates still flow", || updates(&events).len() == 20);
    let late = join("late-comer", &[server.addr]);
    assert_eq!(late.send_command("x", b"").unwrap(), 0, "the control server still serves");
}

#[test]
fn a_subscriber_that_leaves_is_removed_from_the_providers_list() {
    let server = TestServer::start(TestServer::fast());
    let provider = join("provider", &[server.addr]);
    let svc = provider.provide("svc").unwrap();
    {
        let subscriber = join("short-lived", &[server.addr]);
        let _sub = subscriber.subscribe("svc", |_| {}).unwrap();
        wait_until("subscribed", || svc.subscriber_count() == 1);
    }
    wait_until("unsubscribed", || svc.subscriber_count() == 0);
    svc.update(b"nobody listens").unwrap();
}

#[test]
fn updates_from_a_command_handler_work() {
    // A component's typical pattern: a command changes its state service from the handler.
    let server = TestServer::start(TestServer::fast());
    let comp = Arc::new(join("comp", &[server.addr]));
    let state = Arc::new(comp.provide("comp/state").unwrap());
    let s2 = state.clone();
    let _cmd = comp.register_command("comp/start", move |c| s2.update(&c.data).unwrap()).unwrap();
    let watcher = join("watcher", &[server.addr]);
    let (events, handler) = collector();
    let _sub = watcher.subscribe("comp/state", handler).unwrap();
    wait_until("subscribed", || state.subscriber_count() == 1);
    wait_until("registered", || server.processes().iter().any(|p| p.commands == ["comp/start"]));
    assert_eq!(watcher.send_command("comp/start", b"Running").unwrap(), 1);
    wait_until("state", || updates(&events).iter().any(|u| u.0 == b"Running"));
}

#[test]
fn a_subscriber_that_stops_consuming_blocks_a_lossless_service_but_not_a_lossy_one() {
    let server = TestServer::start(TestServer::fast());
    let mut c = config("provider", &[server.addr]);
    c.connection.send_queue_bytes = 64 << 10;
    let provider = Dialog::start(c).unwrap();
    assert!(provider.wait_connected(Duration::from_secs(10)));
    let lossy = provider.provide_with("stats", ServiceOptions { when_full: WhenFull::Fail }).unwrap();
    let lossless = Arc::new(provider.provide("state").unwrap());
    let subscriber = join("stuck-gui", &[server.addr]);
    // Handlers that never return once they get a value: the process lives and heartbeats, but
    // consumes nothing more.
    let gate = Arc::new(Mutex::new(()));
    let hold = gate.lock().unwrap();
    let (g1, g2) = (gate.clone(), gate.clone());
    let _s1 = subscriber.subscribe("stats", move |_| drop(g1.lock().unwrap_or_else(|p| p.into_inner()))).unwrap();
    let _s2 = subscriber.subscribe("state", move |_| drop(g2.lock().unwrap_or_else(|p| p.into_inner()))).unwrap();
    wait_until("subscribed", || lossy.subscriber_count() == 1 && lossless.subscriber_count() == 1);
    let big = vec![7u8; 32 << 10];
    // The lossy service never blocks: updates the subscriber cannot take are counted.
    for _ in 0..2000 {
        lossy.update(&big).unwrap();
    }
    assert!(lossy.dropped() > 0, "some updates were skipped");
    assert_eq!(lossy.subscriber_count(), 1, "the subscriber is stuck, not dead: it still heartbeats");
    // The lossless one blocks once the subscriber's queue and socket are full.
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (finished_tx, finished) = std::sync::mpsc::channel();
    {
        let (svc, done) = (lossless.clone(), done.clone());
        std::thread::spawn(move || {
            for _ in 0..2000 {
                svc.update(&vec![1u8; 32 << 10]).unwrap();
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let _ = finished_tx.send(());
        });
    }
    std::thread::sleep(Duration::from_millis(500));
    let stalled = done.load(std::sync::atomic::Ordering::Relaxed);
    assert!(stalled < 2000, "the lossless service must wait for its subscriber");
    // Release the subscriber: everything arrives and the provider finishes.
    drop(hold);
    finished.recv_timeout(Duration::from_secs(60)).expect("the provider finishes once the subscriber consumes");
    assert_eq!(lossless.seq(), 2000);
}

#[test]
fn a_stranger_cannot_subscribe_to_a_provider_nor_inject_values_into_a_subscriber() {
    let token = Token::generate();
    let server = TestServer::start(ServerConfig { token: Some(token.clone()), ..TestServer::fast() });
    let join_with_token = |name: &str| {
        let mut c = config(name, &[server.addr]);
        c.token = Some(token.clone());
        let d = Dialog::start(c).unwrap();
        assert!(d.wait_connected(Duration::from_secs(10)));
        d
    };
    let provider = join_with_token("ru-1");
    let svc = provider.provide("ru-1/state").unwrap();
    svc.update(br#"{"state":"Running"}"#).unwrap();
    let operator = join_with_token("operator");
    let (events, handler) = collector();
    let _sub = operator.subscribe("ru-1/state", handler).unwrap();
    wait_until("subscribed", || svc.subscriber_count() == 1 && updates(&events).len() == 1);
    // A stranger (no token, or a guessed one) at the provider's and at the subscriber's peer port.
    for target in [provider.client().listen_addr(), operator.client().listen_addr()] {
        for guess in [None, Some(Token::new("guess").unwrap())] {
            let opts = ConnectionOptions { token: guess, ..ConnectionOptions::for_protocol(PEER_PROTOCOL) };
            let err = Connection::connect(target, &opts).unwrap_err();
            assert!(matches!(err, daqflow_transport::ConnectError::Auth(_)), "{err}");
        }
    }
    // The forged value never arrives; the real provider's still do.
    svc.update(br#"{"state":"Paused"}"#).unwrap();
    wait_until("the real update", || updates(&events).len() == 2);
    std::thread::sleep(Duration::from_millis(200));
    let got: Vec<Vec<u8>> = updates(&events).into_iter().map(|u| u.0).collect();
    assert_eq!(got, [br#"{"state":"Running"}"#.to_vec(), br#"{"state":"Paused"}"#.to_vec()]);
    assert_eq!(svc.subscriber_count(), 1);
}

/// A process that names itself after a provider in its `PEER_HELLO` (a stranger on a control
/// plane without a token, or a token holder) cannot make a subscriber take a value, lose its
/// provider, or ask the control server again: values are taken only over a connection that
/// proved the subscription's key, which only the named provider received.
#[test]
fn a_peer_naming_itself_after_the_provider_cannot_make_a_subscriber_take_a_value() {
    for token in [None, Some(daqflow_transport::auth::Token::generate())] {
        let server = TestServer::start(ServerConfig { token: token.clone(), ..TestServer::fast() });
        let join_as = |name: &str| {
            let mut c = config(name, &[server.addr]);
            c.token = token.clone();
            let d = Dialog::start(c).unwrap();
            assert!(d.wait_connected(Duration::from_secs(10)));
            d
        };
        let provider = join_as("ru-1");
        let svc = provider.provide("ru-1/state").unwrap();
        svc.update(br#"{"state":"Running"}"#).unwrap();
        let operator = join_as("operator");
        let (events, handler) = collector();
        let _sub = operator.subscribe("ru-1/state", handler).unwrap();
        wait_until("subscribed", || svc.subscriber_count() == 1 && updates(&events).len() == 1);
        // The forger: the provider's name and its real address, a guessed key, values numbered
        // far ahead on every subscription id, a "service unknown", and an end without goodbye.
        let real = provider.client().listen_addr();
        let opts = ConnectionOptions { token: token.clone(), ..ConnectionOptions::for_protocol(PEER_PROTOCOL) };
        let mut raw = Connection::connect(operator.client().listen_addr(), &opts).unwrap();
        let hello = Message::PeerHello {
            version: daqflow_dialog::protocol::PROTOCOL_VERSION,
            name: "ru-1".into(),
            host: real.ip().to_string(),
            port: real.port(),
        };
        raw.send(hello.to_frame()).unwrap();
        for sub in 1..=20 {
            raw.send(Message::SubscriptionProof { sub, key: [0; 16] }.to_frame()).unwrap();
            let forged = br#"{"state":"Error"}"#.to_vec().into();
            raw.send(Message::ServiceMessage { sub, initial: false, seq: 1_000_000_000, data: forged }.to_frame())
                .unwrap();
            raw.send(Message::ServiceUnknown { sub, key: [0; 16], name: "ru-1/state".into() }.to_frame()).unwrap();
        }
        raw.flush().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        drop(raw);
        std::thread::sleep(Duration::from_millis(300));
        // The real provider's values go on arriving, and nothing else happened.
        svc.update(br#"{"state":"Paused"}"#).unwrap();
        wait_until("the real update", || updates(&events).last().is_some_and(|u| u.0 == br#"{"state":"Paused"}"#));
        std::thread::sleep(Duration::from_millis(200));
        // Only real values, in order (a wrong proof makes the subscriber subscribe again, so
        // the provider may send its current value once more, flagged initial, same counter).
        let got = updates(&events);
        for (data, seq, initial) in &got[..got.len() - 1] {
            assert_eq!((&data[..], *seq, *initial), (&br#"{"state":"Running"}"#[..], 1, true), "token {token:?}");
        }
        assert_eq!(got.last().unwrap(), &(br#"{"state":"Paused"}"#.to_vec(), 2, false), "token {token:?}");
        let lost = events.lock().unwrap().iter().filter(|e| matches!(e, ServiceEvent::Lost { .. })).count();
        assert_eq!(lost, 0, "a forger's closed connection is not the provider's death");
        assert_eq!(svc.subscriber_count(), 1);
    }
}

#[test]
fn without_a_token_a_peer_must_still_say_hello_before_anything_and_may_send_only_small_frames() {
    let server = TestServer::start(TestServer::fast());
    let provider = join("provider", &[server.addr]);
    let svc = provider.provide("guarded").unwrap();
    let opts = ConnectionOptions { token: None, ..ConnectionOptions::for_protocol(PEER_PROTOCOL) };
    let mut raw = Connection::connect(provider.client().listen_addr(), &opts).unwrap();
    raw.send(Message::SubscribeService { sub: 1, key: [0; 16], name: "guarded".into() }.to_frame()).unwrap();
    raw.flush().unwrap();
    let reply = raw.recv_timeout(Duration::from_secs(10)).unwrap().expect("an answer");
    assert_eq!(reply.kind, kind::NOT_CONNECTED);
    // A large frame before the hello closes the connection (nothing of it is kept).
    raw.send(Frame::new(kind::SERVICE_MESSAGE, bytes::Bytes::from(vec![0u8; 1 << 20]))).unwrap();
    let _ = raw.flush();
    let end = loop {
        match raw.recv_timeout(Duration::from_secs(10)) {
            Ok(Some(_)) => continue,
            other => break other,
        }
    };
    assert!(end.is_err(), "the provider closed the connection: {end:?}");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(svc.subscriber_count(), 0);
}

#[test]
fn a_slow_command_handler_does_not_make_the_process_look_dead() {
    let server = TestServer::start(TestServer::fast());
    let comp = join("slow-configure", &[server.addr]);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    let _cmd = comp
        .register_command("slow/configure", move |_| {
            // Five times the time after which a silent process is declared lost.
            std::thread::sleep(Duration::from_secs(3));
            d.store(true, std::sync::atomic::Ordering::Release);
        })
        .unwrap();
    let operator = join("operator", &[server.addr]);
    wait_until("registered", || server.processes().iter().any(|p| p.commands == ["slow/configure"]));
    assert_eq!(operator.send_command("slow/configure", b"").unwrap(), 1);
    wait_until("configured", || done.load(std::sync::atomic::Ordering::Acquire));
    assert!(server.processes().iter().any(|p| p.name == "slow-configure"), "never declared lost");
    assert!(comp.is_connected());
}

/// After a partition heals, a system's processes may be split between two of its control
/// servers. The server that serves fewer of them (here the primary, left with one) ends, and
/// its process moves to the other: one directory again.
#[test]
fn of_two_control_servers_serving_a_split_system_the_one_with_fewer_processes_ends() {
    let spare = TestServer::start(TestServer::fast());
    let primary = TestServer::start(ServerConfig { siblings: vec![spare.addr], ..TestServer::fast() });
    // Two processes on the spare (their list names only it, as if the primary were cut off
    // from them), one on the primary that knows both.
    let ru = join("ru-1", &[spare.addr]);
    let bu = join("bu-1", &[spare.addr]);
    let operator = join("operator", &[primary.addr, spare.addr]);
    assert_eq!(operator.client().control_server(), Some(primary.addr));
    let mut primary = primary;
    let handle = primary.handle.take().unwrap();
    let ended = primary.rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(15), handle.wait()).await.expect("the primary ends")
    });
    match ended {
        Err(ServerError::Split { sibling, here, there }) => assert_eq!((sibling, here, there), (spare.addr, 1, 2)),
        other => panic!("expected a split, got {other:?}"),
    }
    wait_until("the operator moved to the spare", || operator.client().control_server() == Some(spare.addr));
    let mut names: Vec<String> = spare.processes().into_iter().map(|p| p.name).collect();
    names.sort();
    assert_eq!(names, ["bu-1", "operator", "ru-1"]);
    drop((ru, bu));
}
