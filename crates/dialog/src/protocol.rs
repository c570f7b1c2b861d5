//! The DIALOG protocol: the messages exchanged between processes and the control server, and
//! between providers and subscribers. Each message is one [frame](daqflow_wire::frame) whose
//! `kind` is the message type; the payload layouts are in `docs/dialog.md`.
//!
//! Decoding never panics: a malformed payload is a [`ProtocolError`] and the connection that
//! sent it is closed.

use bytes::{BufMut, Bytes, BytesMut};
use daqflow_wire::codec::{CodecError, Reader, Writer};
use daqflow_wire::frame::Frame;

/// Version of the protocol spoken by this build, sent in every handshake. Version 2: the
/// shared secret is proven by the transport's handshake before any DIALOG message (`docs/security.md`),
/// no longer sent in `CONNECT_TO_CONTROL_SERVER` and `PEER_HELLO`. Version 3: a subscription
/// carries a random key that its provider proves it received (`SUBSCRIPTION_PROOF`) before the
/// subscriber takes any value of it: values are taken only from the process the control server
/// named, whatever a `PEER_HELLO` claims.
pub const PROTOCOL_VERSION: u16 = 3;

/// A subscription's key: 16 random bytes chosen by the subscriber, sent only to the provider
/// the control server named (in `SUBSCRIBE_SERVICE`, on a connection the subscriber opened to
/// that provider's address), and proven by the provider in `SUBSCRIPTION_PROOF` on each
/// connection it sends the subscription's values on.
pub type SubscriptionKey = [u8; 16];

/// The protocol name of connections to the control server, in the transport's handshake.
pub const CONTROL_PROTOCOL: &str = "dialog-control";
/// The protocol name of connections between processes, in the transport's handshake.
pub const PEER_PROTOCOL: &str = "dialog-peer";

/// Message kinds (the frame `kind`). The names of the paper's message headers are kept.
pub mod kind {
    /// Process → control server: the handshake.
    pub const CONNECT_TO_CONTROL_SERVER: u16 = 1;
    /// Control server → process: the handshake succeeded.
    pub const SUCCESSFULLY_CONNECTED: u16 = 2;
    /// Control server → process: the handshake was refused; the connection is closed.
    pub const CONNECT_REFUSED: u16 = 3;
    /// Either way: a message came from a peer that has not completed the handshake.
    pub const NOT_CONNECTED: u16 = 4;
    /// Process → control server, at regular intervals.
    pub const HEARTBEAT: u16 = 5;
    /// Control server → process: answers a heartbeat.
    pub const HEARTBEAT_ACK: u16 = 6;
    /// Process → control server: provide a service.
    pub const REGISTER_SERVICE: u16 = 7;
    /// Control server → process: the service is registered.
    pub const SERVICE_REGISTERED: u16 = 8;
    /// Control server → process: the service is provided by another process.
    pub const SERVICE_REFUSED: u16 = 9;
    /// Process → control server: stop providing a service.
    pub const UNREGISTER_SERVICE: u16 = 10;
    /// Process → control server: subscribe to a service (where is it?).
    pub const REQUEST_SERVICE: u16 = 11;
    /// Control server → process: where a requested service is (or that nobody provides it yet).
    pub const INFO_SERVICE: u16 = 12;
    /// Process → control server: forget a request.
    pub const CANCEL_REQUEST: u16 = 13;
    /// Process → control server: accept a command.
    pub const REGISTER_COMMAND: u16 = 14;
    /// Process → control server: stop accepting a command.
    pub const UNREGISTER_COMMAND: u16 = 15;
    /// Process → control server: deliver a command to every process that registered it.
    pub const SEND_COMMAND: u16 = 16;
    /// Control server → process: how many processes a command was delivered to.
    pub const COMMAND_SENT: u16 = 17;
    /// Control server → process: a command for it.
    pub const COMMAND_MESSAGE: u16 = 18;
    /// Control server → subscriber: a process it subscribed from is lost.
    pub const LOST_SENDER: u16 = 19;
    /// Control server → provider: a process that subscribed from it is lost.
    pub const LOST_RECEIVER: u16 = 20;
    /// Control server → process: you were declared lost and are disconnected.
    pub const CONNECTION_LOST: u16 = 21;
    /// Provider → subscriber (or control server → subscriber for `dialog/…`): a service
    /// value. Channel: the subscription id; flag bit 0: the current value sent on subscribing.
    pub const SERVICE_MESSAGE: u16 = 22;
    /// Subscriber → provider: start sending a service.
    pub const SUBSCRIBE_SERVICE: u16 = 23;
    /// Subscriber → provider: stop sending a service.
    pub const UNSUBSCRIBE_SERVICE: u16 = 24;
    /// First message on a connection between two processes.
    pub const PEER_HELLO: u16 = 25;
    /// Provider → subscriber: the provider does not provide that service (stale directory).
    pub const SERVICE_UNKNOWN: u16 = 26;
    /// Process → control server: leaving cleanly.
    pub const DISCONNECT: u16 = 27;
    /// Last message on a connection between two processes closed on purpose (idle, exit).
    pub const PEER_BYE: u16 = 28;
    /// Provider → subscriber: the subscription's key, proving that this connection comes from
    /// the process the subscriber sent `SUBSCRIBE_SERVICE` to; before the subscription's first
    /// value on every connection.
    pub const SUBSCRIPTION_PROOF: u16 = 29;
    /// Control server → control server of the same system (on a control connection, instead of
    /// `CONNECT_TO_CONTROL_SERVER`): how many processes do you serve? Answered `SERVER_STATUS`.
    pub const SERVER_PROBE: u16 = 30;
    /// Control server → control server: the answer to `SERVER_PROBE`.
    pub const SERVER_STATUS: u16 = 31;
}

/// Flag of a `SERVICE_MESSAGE`: the value is the current one, sent on subscribing.
pub const FLAG_INITIAL: u8 = 1;

/// Why a handshake was refused. (Value 1, a wrong shared secret, is no longer sent: the
/// transport's handshake refuses a wrong token before any DIALOG message.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RefuseReason {
    /// Another live process has this name.
    NameTaken = 2,
    /// The protocol version is not spoken by the server.
    Version = 3,
    /// The name is not a valid process name.
    BadName = 4,
}

impl RefuseReason {
    fn read(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(match r.u8("reason")? {
            2 => RefuseReason::NameTaken,
            3 => RefuseReason::Version,
            4 => RefuseReason::BadName,
            other => return Err(r.bad_value("reason", other.into())),
        })
    }
}

/// Why a process was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LostReason {
    /// No heartbeat within the check interval: the process died or is stuck.
    Heartbeat = 1,
    /// Its connection closed without a goodbye (crash, kill, network).
    ConnectionClosed = 2,
    /// It said goodbye.
    Disconnected = 3,
}

impl LostReason {
    fn read(r: &mut Reader<'_>) -> Result<Self, CodecError> {
        Ok(match r.u8("reason")? {
            1 => LostReason::Heartbeat,
            2 => LostReason::ConnectionClosed,
            3 => LostReason::Disconnected,
            other => return Err(r.bad_value("reason", other.into())),
        })
    }
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Heartbeat => "no heartbeat",
            LostReason::ConnectionClosed => "connection closed",
            LostReason::Disconnected => "disconnected",
        })
    }
}

/// Where a requested service is, in an `INFO_SERVICE`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ServiceLocation {
    /// Nobody provides it yet; the request stays queued in the control server.
    NotProvided,
    /// Its provider stopped providing it (unregistered); the request stays queued.
    Withdrawn,
    /// A process provides it; subscribe at its listening address.
    Process {
        /// The provider's name.
        name: String,
        /// Its host (address as text).
        host: String,
        /// Its listening port.
        port: u16,
    },
    /// The control server provides it (`dialog/…`) and sends it on the control connection.
    ControlServer,
}

/// A protocol message. See `docs/dialog.md` for the layouts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)] // fields are documented with the message kinds and in docs/dialog.md
pub enum Message {
    ConnectToControlServer { version: u16, name: String, pid: u32, host: String, port: u16, start_time_ns: u64 },
    SuccessfullyConnected { server: String, heartbeat_interval_ms: u32, lost_after_ms: u32 },
    ConnectRefused { reason: RefuseReason, message: String },
    NotConnected { message: String },
    Heartbeat { seq: u64 },
    HeartbeatAck { seq: u64 },
    RegisterService { request: u32, name: String },
    ServiceRegistered { request: u32 },
    ServiceRefused { request: u32, owner: String, owner_addr: String },
    UnregisterService { name: String },
    RequestService { sub: u32, name: String },
    InfoService { sub: u32, name: String, location: ServiceLocation },
    CancelRequest { sub: u32 },
    RegisterCommand { name: String },
    UnregisterCommand { name: String },
    SendCommand { request: u32, name: String, data: Bytes },
    CommandSent { request: u32, delivered: u32 },
    CommandMessage { name: String, from: String, data: Bytes },
    LostSender { process: String, reason: LostReason },
    LostReceiver { process: String, reason: LostReason },
    ConnectionLost { message: String },
    ServiceMessage { sub: u32, initial: bool, seq: u64, data: Bytes },
    SubscribeService { sub: u32, key: SubscriptionKey, name: String },
    UnsubscribeService { sub: u32, key: SubscriptionKey },
    PeerHello { version: u16, name: String, host: String, port: u16 },
    ServiceUnknown { sub: u32, key: SubscriptionKey, name: String },
    Disconnect,
    PeerBye,
    SubscriptionProof { sub: u32, key: SubscriptionKey },
    ServerProbe { processes: u32, started_ns: u64 },
    ServerStatus { processes: u32, started_ns: u64 },
}

/// A payload that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The frame kind is not a DIALOG message.
    #[error("unknown message kind {0}")]
    UnknownKind(u16),
    /// The payload is short, long, or has a field of an undefined value.
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// The message name of a kind, for errors.
fn what(kind: u16) -> &'static str {
    use kind::*;
    match kind {
        CONNECT_TO_CONTROL_SERVER => "CONNECT_TO_CONTROL_SERVER",
        SUCCESSFULLY_CONNECTED => "SUCCESSFULLY_CONNECTED",
        CONNECT_REFUSED => "CONNECT_REFUSED",
        NOT_CONNECTED => "NOT_CONNECTED",
        HEARTBEAT => "HEARTBEAT",
        HEARTBEAT_ACK => "HEARTBEAT_ACK",
        REGISTER_SERVICE => "REGISTER_SERVICE",
        SERVICE_REGISTERED => "SERVICE_REGISTERED",
        SERVICE_REFUSED => "SERVICE_REFUSED",
        UNREGISTER_SERVICE => "UNREGISTER_SERVICE",
        REQUEST_SERVICE => "REQUEST_SERVICE",
        INFO_SERVICE => "INFO_SERVICE",
        CANCEL_REQUEST => "CANCEL_REQUEST",
        REGISTER_COMMAND => "REGISTER_COMMAND",
        UNREGISTER_COMMAND => "UNREGISTER_COMMAND",
        SEND_COMMAND => "SEND_COMMAND",
        COMMAND_SENT => "COMMAND_SENT",
        COMMAND_MESSAGE => "COMMAND_MESSAGE",
        LOST_SENDER => "LOST_SENDER",
        LOST_RECEIVER => "LOST_RECEIVER",
        CONNECTION_LOST => "CONNECTION_LOST",
        SERVICE_MESSAGE => "SERVICE_MESSAGE",
        SUBSCRIBE_SERVICE => "SUBSCRIBE_SERVICE",
        UNSUBSCRIBE_SERVICE => "UNSUBSCRIBE_SERVICE",
        PEER_HELLO => "PEER_HELLO",
        SERVICE_UNKNOWN => "SERVICE_UNKNOWN",
        DISCONNECT => "DISCONNECT",
        PEER_BYE => "PEER_BYE",
        SUBSCRIPTION_PROOF => "SUBSCRIPTION_PROOF",
        SERVER_PROBE => "SERVER_PROBE",
        SERVER_STATUS => "SERVER_STATUS",
        _ => "DIALOG message",
    }
}

impl Message {
    /// The frame kind of this message.
    pub fn kind(&self) -> u16 {
        use kind::*;
        match self {
            Message::ConnectToControlServer { .. } => CONNECT_TO_CONTROL_SERVER,
            Message::SuccessfullyConnected { .. } => SUCCESSFULLY_CONNECTED,
            Message::ConnectRefused { .. } => CONNECT_REFUSED,
            Message::NotConnected { .. } => NOT_CONNECTED,
            Message::Heartbeat { .. } => HEARTBEAT,
            Message::HeartbeatAck { .. } => HEARTBEAT_ACK,
            Message::RegisterService { .. } => REGISTER_SERVICE,
            Message::ServiceRegistered { .. } => SERVICE_REGISTERED,
            Message::ServiceRefused { .. } => SERVICE_REFUSED,
            Message::UnregisterService { .. } => UNREGISTER_SERVICE,
            Message::RequestService { .. } => REQUEST_SERVICE,
            Message::InfoService { .. } => INFO_SERVICE,
            Message::CancelRequest { .. } => CANCEL_REQUEST,
            Message::RegisterCommand { .. } => REGISTER_COMMAND,
            Message::UnregisterCommand { .. } => UNREGISTER_COMMAND,
            Message::SendCommand { .. } => SEND_COMMAND,
            Message::CommandSent { .. } => COMMAND_SENT,
            Message::CommandMessage { .. } => COMMAND_MESSAGE,
            Message::LostSender { .. } => LOST_SENDER,
            Message::LostReceiver { .. } => LOST_RECEIVER,
            Message::ConnectionLost { .. } => CONNECTION_LOST,
            Message::ServiceMessage { .. } => SERVICE_MESSAGE,
            Message::SubscribeService { .. } => SUBSCRIBE_SERVICE,
            Message::UnsubscribeService { .. } => UNSUBSCRIBE_SERVICE,
            Message::PeerHello { .. } => PEER_HELLO,
            Message::ServiceUnknown { .. } => SERVICE_UNKNOWN,
            Message::Disconnect => DISCONNECT,
            Message::PeerBye => PEER_BYE,
            Message::SubscriptionProof { .. } => SUBSCRIPTION_PROOF,
            Message::ServerProbe { .. } => SERVER_PROBE,
            Message::ServerStatus { .. } => SERVER_STATUS,
        }
    }

    /// The frame carrying this message.
    pub fn to_frame(&self) -> Frame {
        if let Message::ServiceMessage { sub, initial, seq, data } = self {
            return service_message(*sub, *initial, *seq, data);
        }
        let mut w = Writer::with_capacity(64);
        let mut channel = 0;
        match self {
            Message::ConnectToControlServer { version, name, pid, host, port, start_time_ns } => {
                w.u16(*version);
                w.text(name);
                w.u32(*pid);
                w.text(host);
                w.u16(*port);
                w.u64(*start_time_ns);
            }
            Message::SuccessfullyConnected { server, heartbeat_interval_ms, lost_after_ms } => {
                w.text(server);
                w.u32(*heartbeat_interval_ms);
                w.u32(*lost_after_ms);
            }
            Message::ConnectRefused { reason, message } => {
                w.u8(*reason as u8);
                w.text(message);
            }
            Message::NotConnected { message } | Message::ConnectionLost { message } => w.text(message),
            Message::Heartbeat { seq } | Message::HeartbeatAck { seq } => w.u64(*seq),
            Message::RegisterService { request, name } => {
                w.u32(*request);
                w.text(name);
            }
            Message::ServiceRegistered { request } => w.u32(*request),
            Message::ServiceRefused { request, owner, owner_addr } => {
                w.u32(*request);
                w.text(owner);
                w.text(owner_addr);
            }
            Message::UnregisterService { name }
            | Message::RegisterCommand { name }
            | Message::UnregisterCommand { name } => w.text(name),
            Message::RequestService { sub, name } => {
                channel = *sub;
                w.text(name);
            }
            Message::SubscribeService { sub, key, name } | Message::ServiceUnknown { sub, key, name } => {
                channel = *sub;
                w.bytes(key);
                w.text(name);
            }
            Message::UnsubscribeService { sub, key } | Message::SubscriptionProof { sub, key } => {
                channel = *sub;
                w.bytes(key);
            }
            Message::InfoService { sub, name, location } => {
                channel = *sub;
                w.text(name);
                match location {
                    ServiceLocation::NotProvided => w.u8(0),
                    ServiceLocation::Withdrawn => w.u8(3),
                    ServiceLocation::ControlServer => w.u8(2),
                    ServiceLocation::Process { name, host, port } => {
                        w.u8(1);
                        w.text(name);
                        w.text(host);
                        w.u16(*port);
                    }
                }
            }
            Message::CancelRequest { sub } => channel = *sub,
            Message::SendCommand { request, name, data } => {
                w.u32(*request);
                w.text(name);
                w.bytes(data);
            }
            Message::CommandSent { request, delivered } => {
                w.u32(*request);
                w.u32(*delivered);
            }
            Message::CommandMessage { name, from, data } => {
                w.text(name);
                w.text(from);
                w.bytes(data);
            }
            Message::LostSender { process, reason } | Message::LostReceiver { process, reason } => {
                w.text(process);
                w.u8(*reason as u8);
            }
            Message::PeerHello { version, name, host, port } => {
                w.u16(*version);
                w.text(name);
                w.text(host);
                w.u16(*port);
            }
            Message::ServerProbe { processes, started_ns } | Message::ServerStatus { processes, started_ns } => {
                w.u32(*processes);
                w.u64(*started_ns);
            }
            Message::Disconnect | Message::PeerBye => {}
            Message::ServiceMessage { .. } => unreachable!("handled above"),
        }
        Frame::new(self.kind(), w.finish()).with_channel(channel)
    }

    /// Decodes a frame. `SERVICE_MESSAGE` payloads are sliced, not copied.
    pub fn from_frame(frame: &Frame) -> Result<Message, ProtocolError> {
        use kind::*;
        let k = frame.kind;
        let mut r = Reader::new(what(k), &frame.payload);
        let ch = frame.channel;
        let rest = |r: &Reader<'_>| frame.payload.slice(r.position()..);
        let m = match k {
            CONNECT_TO_CONTROL_SERVER => Message::ConnectToControlServer {
                version: r.u16("version")?,
                name: r.text("name")?,
                pid: r.u32("pid")?,
                host: r.text("host")?,
                port: r.u16("port")?,
                start_time_ns: r.u64("start time")?,
            },
            SUCCESSFULLY_CONNECTED => Message::SuccessfullyConnected {
                server: r.text("server")?,
                heartbeat_interval_ms: r.u32("heartbeat interval")?,
                lost_after_ms: r.u32("lost after")?,
            },
            CONNECT_REFUSED => {
                Message::ConnectRefused { reason: RefuseReason::read(&mut r)?, message: r.text("message")? }
            }
            NOT_CONNECTED => Message::NotConnected { message: r.text("message")? },
            HEARTBEAT => Message::Heartbeat { seq: r.u64("seq")? },
            HEARTBEAT_ACK => Message::HeartbeatAck { seq: r.u64("seq")? },
            REGISTER_SERVICE => Message::RegisterService { request: r.u32("request")?, name: r.text("name")? },
            SERVICE_REGISTERED => Message::ServiceRegistered { request: r.u32("request")? },
            SERVICE_REFUSED => Message::ServiceRefused {
                request: r.u32("request")?,
                owner: r.text("owner")?,
                owner_addr: r.text("owner address")?,
            },
            UNREGISTER_SERVICE => Message::UnregisterService { name: r.text("name")? },
            REQUEST_SERVICE => Message::RequestService { sub: ch, name: r.text("name")? },
            INFO_SERVICE => {
                let name = r.text("name")?;
                let location = match r.u8("status")? {
                    0 => ServiceLocation::NotProvided,
                    1 => ServiceLocation::Process {
                        name: r.text("provider")?,
                        host: r.text("host")?,
                        port: r.u16("port")?,
                    },
                    2 => ServiceLocation::ControlServer,
                    3 => ServiceLocation::Withdrawn,
                    other => return Err(r.bad_value("status", other.into()).into()),
                };
                Message::InfoService { sub: ch, name, location }
            }
            CANCEL_REQUEST => Message::CancelRequest { sub: ch },
            REGISTER_COMMAND => Message::RegisterCommand { name: r.text("name")? },
            UNREGISTER_COMMAND => Message::UnregisterCommand { name: r.text("name")? },
            SEND_COMMAND => {
                let request = r.u32("request")?;
                let name = r.text("name")?;
                let data = rest(&r);
                return Ok(Message::SendCommand { request, name, data });
            }
            COMMAND_SENT => Message::CommandSent { request: r.u32("request")?, delivered: r.u32("delivered")? },
            COMMAND_MESSAGE => {
                let name = r.text("name")?;
                let from = r.text("from")?;
                let data = rest(&r);
                return Ok(Message::CommandMessage { name, from, data });
            }
            LOST_SENDER => Message::LostSender { process: r.text("process")?, reason: LostReason::read(&mut r)? },
            LOST_RECEIVER => Message::LostReceiver { process: r.text("process")?, reason: LostReason::read(&mut r)? },
            CONNECTION_LOST => Message::ConnectionLost { message: r.text("message")? },
            SERVICE_MESSAGE => {
                let seq = r.u64("seq")?;
                return Ok(Message::ServiceMessage {
                    sub: ch,
                    initial: frame.flags & FLAG_INITIAL != 0,
                    seq,
                    data: frame.payload.slice(8..),
                });
            }
            SUBSCRIBE_SERVICE => Message::SubscribeService { sub: ch, key: r.array("key")?, name: r.text("name")? },
            UNSUBSCRIBE_SERVICE => Message::UnsubscribeService { sub: ch, key: r.array("key")? },
            PEER_HELLO => Message::PeerHello {
                version: r.u16("version")?,
                name: r.text("name")?,
                host: r.text("host")?,
                port: r.u16("port")?,
            },
            SERVICE_UNKNOWN => Message::ServiceUnknown { sub: ch, key: r.array("key")?, name: r.text("name")? },
            DISCONNECT => Message::Disconnect,
            PEER_BYE => Message::PeerBye,
            SUBSCRIPTION_PROOF => Message::SubscriptionProof { sub: ch, key: r.array("key")? },
            SERVER_PROBE => Message::ServerProbe { processes: r.u32("processes")?, started_ns: r.u64("start time")? },
            SERVER_STATUS => Message::ServerStatus { processes: r.u32("processes")?, started_ns: r.u64("start time")? },
            other => return Err(ProtocolError::UnknownKind(other)),
        };
        r.finish()?;
        Ok(m)
    }
}

/// The protocol version a handshake frame (`CONNECT_TO_CONTROL_SERVER` or `PEER_HELLO`) names,
/// when it is another than [`PROTOCOL_VERSION`]. The version is the first field of both in every
/// version, so a receiver can tell a peer of another version from a malformed one even when the
/// rest of the payload has another layout (version 1's `CONNECT_TO_CONTROL_SERVER` carried the
/// shared secret): the control server answers it `CONNECT_REFUSED` with reason 3 (version)
/// instead of closing the connection as malformed.
pub fn other_version(frame: &Frame) -> Option<u16> {
    if frame.kind != kind::CONNECT_TO_CONTROL_SERVER && frame.kind != kind::PEER_HELLO {
        return None;
    }
    let bytes = frame.payload.get(..2)?;
    let version = u16::from_le_bytes([bytes[0], bytes[1]]);
    (version != PROTOCOL_VERSION).then_some(version)
}

/// The frame of a `SERVICE_MESSAGE` to subscription `sub` carrying update `seq` of `data`.
pub fn service_message(sub: u32, initial: bool, seq: u64, data: &[u8]) -> Frame {
    let mut b = BytesMut::with_capacity(8 + data.len());
    b.put_u64_le(seq);
    b.put_slice(data);
    Frame::new(kind::SERVICE_MESSAGE, b.freeze()).with_channel(sub).with_flags(if initial { FLAG_INITIAL } else { 0 })
}

/// Whether `name` is a valid process, service or command name: 1 to 200 characters among
/// ASCII letters, digits and `- _ . : / @ +`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'/' | b'@' | b'+'))
}

/// Names starting with this are the control server's own (its directory services); no
/// process may provide such a service or register such a command.
pub const RESERVED_PREFIX: &str = "dialog/";

/// Whether `name` is reserved for the control server ([`RESERVED_PREFIX`]).
pub fn reserved_name(name: &str) -> bool {
    name.starts_with(RESERVED_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn another_version_is_told_from_a_malformed_handshake() {
        // Version 1, then a name and a secret this version's layout does not have.
        let v1 = Frame::new(kind::CONNECT_TO_CONTROL_SERVER, Bytes::from_static(&[1, 0, 2, 0, b'h', b'v', 1, 0, b's']));
        assert!(Message::from_frame(&v1).is_err());
        assert_eq!(other_version(&v1), Some(1));
        let hello = Frame::new(kind::PEER_HELLO, Bytes::from_static(&[7, 0]));
        assert_eq!(other_version(&hello), Some(7));
        let ours = Message::ConnectToControlServer {
            version: PROTOCOL_VERSION,
            name: "ru-1".into(),
            pid: 1,
            host: "127.0.0.1".into(),
            port: 1,
            start_time_ns: 0,
        };
        assert_eq!(other_version(&ours.to_frame()), None);
        assert_eq!(other_version(&Message::Heartbeat { seq: 1 }.to_frame()), None);
        assert_eq!(other_version(&Frame::new(kind::CONNECT_TO_CONTROL_SERVER, Bytes::from_static(&[1]))), None);
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-z0-9/_.-]{1,20}"
    }

    fn message() -> impl Strategy<Value = Message> {
        let data = proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from);
        let reason = prop_oneof![
            Just(LostReason::Heartbeat),
            Just(LostReason::ConnectionClosed),
            Just(LostReason::Disconnected)
        ];
        let location = prop_oneof![
            Just(ServiceLocation::NotProvided),
            Just(ServiceLocation::Withdrawn),
            Just(ServiceLocation::ControlServer),
            (name(), name(), any::<u16>()).prop_map(|(name, host, port)| ServiceLocation::Process { name, host, port }),
        ];
        prop_oneof![
            (any::<u16>(), name(), any::<u32>(), name(), any::<u16>(), any::<u64>()).prop_map(
                |(version, name, pid, host, port, start_time_ns)| Message::ConnectToControlServer {
                    version,
                    name,
                    pid,
                    host,
                    port,
                    start_time_ns,
                }
            ),
            (name(), any::<u32>(), any::<u32>()).prop_map(|(server, heartbeat_interval_ms, lost_after_ms)| {
                Message::SuccessfullyConnected { server, heartbeat_interval_ms, lost_after_ms }
            }),
            name().prop_map(|message| Message::ConnectRefused { reason: RefuseReason::NameTaken, message }),
            name().prop_map(|message| Message::NotConnected { message }),
            any::<u64>().prop_map(|seq| Message::Heartbeat { seq }),
            any::<u64>().prop_map(|seq| Message::HeartbeatAck { seq }),
            (any::<u32>(), name()).prop_map(|(request, name)| Message::RegisterService { request, name }),
            any::<u32>().prop_map(|request| Message::ServiceRegistered { request }),
            (any::<u32>(), name(), name()).prop_map(|(request, owner, owner_addr)| Message::ServiceRefused {
                request,
                owner,
                owner_addr
            }),
            name().prop_map(|name| Message::UnregisterService { name }),
            (any::<u32>(), name()).prop_map(|(sub, name)| Message::RequestService { sub, name }),
            (any::<u32>(), name(), location).prop_map(|(sub, name, location)| Message::InfoService {
                sub,
                name,
                location
            }),
            any::<u32>().prop_map(|sub| Message::CancelRequest { sub }),
            name().prop_map(|name| Message::RegisterCommand { name }),
            name().prop_map(|name| Message::UnregisterCommand { name }),
            (any::<u32>(), name(), data.clone()).prop_map(|(request, name, data)| Message::SendCommand {
                request,
                name,
                data
            }),
            (any::<u32>(), any::<u32>()).prop_map(|(request, delivered)| Message::CommandSent { request, delivered }),
            (name(), name(), data.clone()).prop_map(|(name, from, data)| Message::CommandMessage { name, from, data }),
            (name(), reason.clone()).prop_map(|(process, reason)| Message::LostSender { process, reason }),
            (name(), reason).prop_map(|(process, reason)| Message::LostReceiver { process, reason }),
            name().prop_map(|message| Message::ConnectionLost { message }),
            (any::<u32>(), any::<bool>(), any::<u64>(), data)
                .prop_map(|(sub, initial, seq, data)| Message::ServiceMessage { sub, initial, seq, data }),
            (any::<u32>(), any::<SubscriptionKey>(), name()).prop_map(|(sub, key, name)| Message::SubscribeService {
                sub,
                key,
                name
            }),
            (any::<u32>(), any::<SubscriptionKey>()).prop_map(|(sub, key)| Message::UnsubscribeService { sub, key }),
            (any::<u16>(), name(), name(), any::<u16>()).prop_map(|(version, name, host, port)| Message::PeerHello {
                version,
                name,
                host,
                port
            }),
            (any::<u32>(), any::<SubscriptionKey>(), name()).prop_map(|(sub, key, name)| Message::ServiceUnknown {
                sub,
                key,
                name
            }),
            Just(Message::Disconnect),
            Just(Message::PeerBye),
            (any::<u32>(), any::<SubscriptionKey>()).prop_map(|(sub, key)| Message::SubscriptionProof { sub, key }),
            (any::<u32>(), any::<u64>())
                .prop_map(|(processes, started_ns)| Message::ServerProbe { processes, started_ns }),
            (any::<u32>(), any::<u64>())
                .prop_map(|(processes, started_ns)| Message::ServerStatus { processes, started_ns }),
        ]
    }

    proptest! {
        #[test]
        fn every_message_round_trips(m in message()) {
            let frame = m.to_frame();
            prop_assert_eq!(frame.kind, m.kind());
            prop_assert_eq!(Message::from_frame(&frame).unwrap(), m);
        }

        #[test]
        fn random_payloads_never_panic(kind in 0u16..40, flags in any::<u8>(), channel in any::<u32>(), payload in proptest::collection::vec(any::<u8>(), 0..80)) {
            let frame = Frame::new(kind, Bytes::from(payload)).with_flags(flags).with_channel(channel);
            let _ = Message::from_frame(&frame);
        }

        #[test]
        fn truncated_messages_are_errors_not_panics(m in message(), cut in any::<proptest::sample::Index>()) {
            let frame = m.to_frame();
            let n = frame.payload.len();
            if n > 0 {
                let short = Frame { payload: frame.payload.slice(..cut.index(n)), ..frame.clone() };
                // Messages ending in free-form data may still decode; none may panic.
                let _ = Message::from_frame(&short);
            }
        }
    }

    #[test]
    fn every_kind_is_in_the_dialog_range_of_the_registry() {
        use kind::*;
        for k in [CONNECT_TO_CONTROL_SERVER, SERVICE_MESSAGE, PEER_HELLO, PEER_BYE, SUBSCRIPTION_PROOF] {
            assert!(daqflow_wire::kinds::DIALOG.contains(k), "{k}");
        }
        // The messages are numbered 1 … 31 without gaps.
        for k in 1..=SERVER_STATUS {
            assert_ne!(what(k), "DIALOG message", "kind {k} has no name");
        }
    }

    #[test]
    fn names() {
        assert!(valid_name("ru-1/stats"));
        assert!(valid_name("dialog/processes"));
        assert!(!valid_name(""));
        assert!(!valid_name("has space"));
        assert!(!valid_name(&"x".repeat(201)));
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut f = Message::Heartbeat { seq: 1 }.to_frame();
        let mut p = BytesMut::from(&f.payload[..]);
        p.put_u8(0);
        f.payload = p.freeze();
        assert!(matches!(Message::from_frame(&f), Err(ProtocolError::Codec(CodecError::Trailing { .. }))));
    }
}
