//! Writes the seed corpus `fuzz/corpus/<target>/`: a few valid inputs per target, made by the
//! crates' own encoders, so that the fuzzer starts from inputs that reach deep into each
//! decoder. Run from `fuzz/` after a format changes: `cargo run --example seeds`.

use std::path::Path;

use bytes::Bytes;
use daqflow_dialog::protocol::{LostReason, Message as Dialog, RefuseReason, ServiceLocation};
use daqflow_evb::protocol::{KIND_FRAGMENT, KIND_SUPER_FRAGMENT, Message as Evb, Role, Trigger};
use daqflow_fuzz::wire;
use daqflow_wire::frame::Frame;
use daqflow_wire::{Event, EventId, EventInfo, Fragment, FragmentInfo, SuperFragment, SuperFragmentFlags};

fn write(target: &str, name: &str, data: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("corpus directory");
    std::fs::write(dir.join(name), data).expect("seed written");
}

fn fragments(event: u64) -> Vec<Fragment> {
    [10u32, 11]
        .iter()
        .map(|&source_id| {
            let info = FragmentInfo { source_id, event_id: EventId(event), run_number: 7, ..Default::default() };
            Fragment::parse(Fragment::encode(&info, b"adc counts")).expect("a fragment")
        })
        .collect()
}

fn super_fragment(event: u64) -> SuperFragment {
    SuperFragment::parse(SuperFragment::assemble(0, EventId(event), SuperFragmentFlags::default(), &fragments(event)))
        .expect("a super-fragment")
}

fn event(id: u64) -> Bytes {
    Event::assemble(
        &EventInfo { bu_id: 3, event_id: EventId(id), run_number: 7, ..Default::default() },
        &[super_fragment(id)],
    )
}

fn main() {
    // frame: a shape byte (limits, read size), then frames of a large kind and a small one.
    let frames = [
        Frame::new(3, Bytes::from(vec![1u8; 1000])).with_channel(7).with_flags(1),
        Frame::new(9, Bytes::from_static(b"small")),
        Frame::new(3, Bytes::new()),
    ];
    for shape in [0x23u8, 0xf3] {
        let mut data = vec![shape];
        data.extend(wire(&frames));
        write("frame", &format!("frames-{shape:02x}"), &data);
    }

    // handshake: a whole exchange without a token and with one (challenge, response, answer),
    // and the client's view (challenge, answer).
    use daqflow_transport::auth::{Token, fuzzing::exchange};
    let token = Token::new("fuzzing-token").expect("a valid token");
    let [c, r, a] = exchange("et", None, None);
    write("handshake", "no-token-response", &wire(std::slice::from_ref(&r)));
    write("handshake", "no-token-client", &wire(&[c, a]));
    let [c, r, a] = exchange("et", Some(&token), Some(&token));
    write("handshake", "token-response", &wire(std::slice::from_ref(&r)));
    write("handshake", "token-client", &wire(&[c, a]));
    let [c, _, a] = exchange("et", Some(&token), None);
    write("handshake", "refused-client", &wire(&[c, a]));

    // dialog: a process's connection, its services and commands, a peer's subscription.
    let control = [
        Dialog::ConnectToControlServer {
            version: 1,
            name: "ru-1".into(),
            pid: 42,
            host: "127.0.0.1".into(),
            port: 7001,
            start_time_ns: 5,
        },
        Dialog::SuccessfullyConnected { server: "dialog".into(), heartbeat_interval_ms: 500, lost_after_ms: 3000 },
        Dialog::ConnectRefused { reason: RefuseReason::NameTaken, message: "taken".into() },
        Dialog::Heartbeat { seq: 9 },
        Dialog::RegisterService { request: 1, name: "ru-1/state".into() },
        Dialog::ServiceRefused { request: 1, owner: "ru-2".into(), owner_addr: "127.0.0.1:1".into() },
        Dialog::RequestService { sub: 2, name: "ru-1/stats".into() },
        Dialog::InfoService {
            sub: 2,
            name: "ru-1/stats".into(),
            location: ServiceLocation::Process { name: "ru-1".into(), host: "127.0.0.1".into(), port: 7001 },
        },
        Dialog::InfoService { sub: 3, name: "x/y".into(), location: ServiceLocation::NotProvided },
        Dialog::SendCommand { request: 4, name: "all/stop".into(), data: Bytes::from_static(b"{\"run\":1}") },
        Dialog::CommandMessage { name: "all/stop".into(), from: "operator".into(), data: Bytes::from_static(b"1") },
        Dialog::LostSender { process: "bu-1".into(), reason: LostReason::Heartbeat },
        Dialog::Disconnect,
    ];
    let peer = [
        Dialog::PeerHello { version: 3, name: "bu-1".into(), host: "127.0.0.1".into(), port: 7002 },
        Dialog::SubscribeService { sub: 5, key: [7; 16], name: "ru-1/state".into() },
        Dialog::SubscriptionProof { sub: 5, key: [7; 16] },
        Dialog::ServiceMessage { sub: 5, initial: true, seq: 1, data: Bytes::from_static(b"Running") },
        Dialog::ServiceUnknown { sub: 6, key: [8; 16], name: "ru-9/state".into() },
        Dialog::UnsubscribeService { sub: 5, key: [7; 16] },
        Dialog::PeerBye,
    ];
    write("dialog", "control", &wire(&control.iter().map(Dialog::to_frame).collect::<Vec<_>>()));
    write("dialog", "peer", &wire(&peer.iter().map(Dialog::to_frame).collect::<Vec<_>>()));

    // evb: an RU's and a BU's conversations with the EVM, a source's fragments, an RU's
    // super-fragment to a BU.
    let hello =
        |role, id| Evb::Hello { role, id, run: 7, name: format!("{role:?}-{id}"), addr: String::new(), generation: 0 };
    let evm = [
        hello(Role::Bu, 1),
        Evb::RuList { run: 7, generation: 0, rus: vec![(0, "127.0.0.1:7100".into()), (1, "127.0.0.1:7101".into())] },
        Evb::Request { credits: 8, done: vec![1, 2, 3] },
        Evb::Triggers {
            rus: vec![0, 1],
            triggers: vec![Trigger { event_id: 4, trigger_type: 1, flags: Trigger::REASSIGNED, timestamp: 99 }],
        },
        Evb::RunEnd { last_event: 4 },
    ];
    let ru = [
        hello(Role::Ru, 0),
        Evb::Assign { bu: 1, events: vec![4, 5] },
        Evb::BuGone { bu: 1, generation: 0 },
        Evb::End { last_event: 5 },
        Evb::Abort { reason: "a BU died".into() },
    ];
    write("evb", "evm-bu", &wire(&evm.iter().map(Evb::to_frame).collect::<Vec<_>>()));
    write("evb", "evm-ru", &wire(&ru.iter().map(Evb::to_frame).collect::<Vec<_>>()));
    let mut source = vec![hello(Role::Source, 10).to_frame()];
    source.extend(fragments(4).into_iter().map(|f| Frame::new(KIND_FRAGMENT, f.into_bytes())));
    source.push(Evb::End { last_event: 4 }.to_frame());
    write("evb", "source-ru", &wire(&source));
    let bu = [
        Evb::Hello { role: Role::Bu, id: 1, run: 7, name: "bu-1".into(), addr: String::new(), generation: 2 }
            .to_frame(),
        Frame::new(KIND_SUPER_FRAGMENT, super_fragment(4).as_bytes().clone()),
    ];
    write("evb", "ru-bu", &wire(&bu));

    // chain: a run's stream, with and without CRCs.
    use daqflow_chain::protocol::{ChunkHeader, begin_frame, chunk_frame, end_frame};
    let chunk = |seq, data: &[u8], crc| chunk_frame(&ChunkHeader::for_data(seq, data, crc), crc, data);
    let stream = [
        begin_frame(1),
        chunk(1, b"first chunk", true),
        chunk(2, b"second", false),
        chunk(4, b"", true),
        end_frame(4, 17),
    ];
    write("chain", "stream", &wire(&stream));

    // wire_views: a fragment, a super-fragment, an event.
    write("wire_views", "fragment", fragments(4)[0].as_bytes());
    write("wire_views", "super-fragment", super_fragment(4).as_bytes());
    write("wire_views", "event", &event(4));

    // data_file: a closed file of three events, and the same file cut short.
    let dir = std::env::temp_dir().join(format!("daqflow-fuzz-seeds-{}", std::process::id()));
    let mut writer = daqflow_wire::file::FileWriter::new(daqflow_wire::file::FileWriterConfig {
        sync_on_close: false,
        ..daqflow_wire::file::FileWriterConfig::new(&dir, 7)
    })
    .expect("a file writer");
    for id in 1..=3 {
        writer.write_event(EventId(id), &event(id)).expect("an event written");
    }
    let closed = writer.finish().expect("the file closed");
    let file = std::fs::read(&closed[0].path).expect("the file read");
    write("data_file", "closed", &file);
    write("data_file", "cut-short", &file[..file.len() * 2 / 3]);
    std::fs::remove_dir_all(&dir).expect("temporary directory removed");

    // et_server, et_client: request and answer sequences of the remote protocol.
    use daqflow_et::remote::fuzzing::{seed_answers, seed_requests};
    for (i, frames) in seed_requests().iter().enumerate() {
        write("et_server", &format!("requests-{i}"), &wire(frames));
    }
    let system = daqflow_et::EtSystem::create(daqflow_et::SystemConfig::new(
        format!("fuzz-seeds-{}", std::process::id()),
        10,
        256,
    ))
    .expect("an ET system");
    for (i, frames) in seed_answers(&system.snapshot()).iter().enumerate() {
        write("et_client", &format!("answers-{i}"), &wire(frames));
    }
    drop(system);

    // http: the requests the web UI and scripts send.
    let requests: [&[u8]; 3] = [
        b"GET /api/status?since=3&name=ru%2D1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nCookie: daqflow-session=abc\r\n\r\n",
        b"POST /api/transition HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nX-Daqflow-Client: 1\r\nContent-Type: application/json\r\nContent-Length: 23\r\nExpect: 100-continue\r\n\r\n{\"transition\":\"start\"}\n",
        b"GET /?token=0123456789abcdef HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    ];
    for (i, r) in requests.iter().enumerate() {
        write("http", &format!("request-{i}"), r);
    }

    // system_file: the demo's system and a small one.
    write("system_file", "demo.toml", include_bytes!("../../crates/cli/src/demo.toml"));
    write(
        "system_file",
        "small.toml",
        b"[system]\nname = \"small\"\ncontrol = \"127.0.0.1:0\"\n\n[[component]]\nname = \"gen\"\nkind = \"generator\"\n[component.params]\nchunk_bytes = 4096\n\n[[component]]\nname = \"sink\"\nkind = \"sink\"\nstart_order = -1\n[component.params]\nsource = \"${gen.address}\"\n",
    );
}
