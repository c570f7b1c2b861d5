//! Authentication of every connection: the handshake that comes before any protocol frame.
//!
//! Every daqflow TCP connection starts with three frames, whatever protocol follows:
//!
//! ```text
//! server → client   CHALLENGE  version, "token required" flag, server nonce, protocol name
//! client → server   RESPONSE   version, "proof present" flag, client nonce, client proof, protocol name
//! server → client   ACCEPT     server proof            (or REFUSE: reason, message; then close)
//! ```
//!
//! A proof is HMAC-SHA256 keyed with the system token over a label (`client` or `server`), the
//! protocol name and both nonces. The client proves it knows the token without sending it, and
//! the server proves it back: a process that squats a port cannot learn the token, and a client
//! that has a token never talks to a server that cannot prove the same token (a server without a
//! token refuses a response that carries a proof, rather than accepting it with a zero proof).
//! Without a token on either side the handshake still runs (it names the protocol, so a client
//! that dialled the wrong port gets a clear error) and accepts anyone.
//!
//! Until the handshake is over a connection accepts frames of at most [`HANDSHAKE_MAX_FRAME`]
//! bytes, and a listener gives a peer [`ConnectionOptions::handshake_timeout`] to complete it,
//! with at most [`ConnectionOptions::max_pending_handshakes`] under way (the oldest is dropped
//! for a newcomer), so that strangers cannot make a listener hold memory or slots. Accepted
//! connections then take frames of at most [`ConnectionOptions::hello_max_frame_bytes`] until
//! the protocol has read the peer's hello and raises the limits
//! ([`Connection::set_frame_limits`](crate::Connection::set_frame_limits)).
//!
//! `docs/security.md` gives the byte layouts and what each port accepts from whom.
//!
//! ```
//! use daqflow_transport::{auth::Token, Connection, ConnectionOptions, Listener};
//! let token = Token::generate();
//! let opts = ConnectionOptions { token: Some(token.clone()), ..ConnectionOptions::for_protocol("example") };
//! let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), opts.clone()).unwrap();
//! let addr = listener.local_addr();
//! let client = std::thread::spawn(move || Connection::connect(addr, &opts).map(drop));
//! let conn = listener.accept().unwrap(); // returned only once the client proved the token
//! client.join().unwrap().unwrap();
//!
//! // A client with another token is refused, and learns why.
//! let stranger = ConnectionOptions { token: Some(Token::generate()), ..ConnectionOptions::for_protocol("example") };
//! let t = std::thread::spawn(move || Connection::connect(addr, &stranger).map(drop));
//! assert!(listener.accept_timeout(std::time::Duration::from_millis(300)).unwrap().is_none());
//! assert!(t.join().unwrap().unwrap_err().to_string().contains("token"));
//! # drop(conn);
//! ```
//!
//! [`ConnectionOptions::handshake_timeout`]: crate::ConnectionOptions::handshake_timeout
//! [`ConnectionOptions::max_pending_handshakes`]: crate::ConnectionOptions::max_pending_handshakes
//! [`ConnectionOptions::hello_max_frame_bytes`]: crate::ConnectionOptions::hello_max_frame_bytes

use std::fmt;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};

use bytes::{Bytes, BytesMut};
use daqflow_wire::codec::{Reader, Writer};
use daqflow_wire::frame::Frame;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Frame kind of the server's challenge, the first frame on every connection.
pub const KIND_CHALLENGE: u16 = 0xFF01;
/// Frame kind of the client's response.
pub const KIND_RESPONSE: u16 = 0xFF02;
/// Frame kind of the server's acceptance: the connection is the protocol's from the next frame.
pub const KIND_ACCEPT: u16 = 0xFF03;
/// Frame kind of the server's refusal; the server closes the connection after it.
pub const KIND_REFUSE: u16 = 0xFF04;
/// Version of the handshake spoken by this build.
pub const HANDSHAKE_VERSION: u16 = 1;
/// Largest payload of a handshake frame; a larger one ends the connection.
pub const HANDSHAKE_MAX_FRAME: u32 = 512;
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a proof (HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// Longest protocol name.
pub const MAX_PROTOCOL_LEN: usize = 64;
/// Longest token, in bytes.
pub const MAX_TOKEN_LEN: usize = 1024;

const FLAG_TOKEN: u8 = 1;

/// A shared secret: the system token. Its `Debug` shows nothing of it, and comparing two
/// tokens takes the same time whatever they hold.
#[derive(Clone)]
pub struct Token(Arc<[u8]>);

/// A token could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The text is empty (after trimming white space).
    #[error("the token is empty")]
    Empty,
    /// The text is too long.
    #[error("the token is {0} bytes long; at most {MAX_TOKEN_LEN} are accepted")]
    TooLong(usize),
    /// The text holds white space or control characters inside.
    #[error("the token holds white space or control characters")]
    BadCharacter,
    /// The token file could not be read or written.
    #[error("token file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// Other users may read the token file.
    #[error("token file {path} may be read by other users (mode {mode:03o}); `chmod 600 {path}` and try again")]
    Exposed {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The system has no source of random numbers.
    #[error("no random numbers for a token: {0}")]
    Random(String),
}

impl Token {
    /// A token from its text: printable characters without white space, at most
    /// [`MAX_TOKEN_LEN`] bytes; white space around it is trimmed.
    pub fn new(text: &str) -> Result<Token, TokenError> {
        let t = text.trim();
        if t.is_empty() {
            return Err(TokenError::Empty);
        }
        if t.len() > MAX_TOKEN_LEN {
            return Err(TokenError::TooLong(t.len()));
        }
        if t.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(TokenError::BadCharacter);
        }
        Ok(Token(Arc::from(t.as_bytes())))
    }

    /// A new random token: 256 bits from the operating system, as 64 hexadecimal digits.
    ///
    /// # Panics
    /// If the operating system gives no random numbers (see [`Token::try_generate`]).
    pub fn generate() -> Token {
        Token::try_generate().expect("the operating system gives no random numbers")
    }

    /// A new random token, or why none could be made.
    pub fn try_generate() -> Result<Token, TokenError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| TokenError::Random(e.to_string()))?;
        Ok(Token(Arc::from(hex(&raw).as_bytes())))
    }

    /// Reads a token file: its content without surrounding white space. The file must not be
    /// readable by group or others (as with ssh keys): a token anyone can read protects nothing.
    pub fn from_file(path: &Path) -> Result<Token, TokenError> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display().to_string();
        let io = |source| TokenError::Io { path: shown.clone(), source };
        let meta = std::fs::metadata(path).map_err(io)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(TokenError::Exposed { path: shown, mode });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Token::new(&text)
    }

    /// Writes the token to `path` (mode 0600, replacing the file at once: a reader sees the
    /// old token or the new one, never a part).
    pub fn write_file(&self, path: &Path) -> Result<(), TokenError> {
        use std::os::unix::fs::OpenOptionsExt;
        let shown = path.display().to_string();
        let io = |source| TokenError::Io { path: shown.clone(), source };
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io)?;
        f.write_all(&self.0).and_then(|()| f.write_all(b"\n")).and_then(|()| f.sync_all()).map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// The token's bytes (the HMAC key).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The token's text, to hand it to a child process (`DAQFLOW_TOKEN`) or write it: the only
    /// way to see the secret.
    pub fn reveal(&self) -> &str {
        // Made from a `&str` or from hexadecimal digits only.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(…)")
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        let (a, b) = (self.as_bytes(), other.as_bytes());
        // Constant time for equal lengths; lengths are not secret.
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl Eq for Token {}

static PROCESS_TOKEN: RwLock<Option<Token>> = RwLock::new(None);

/// Sets the token of this process: [`ConnectionOptions::default`](crate::ConnectionOptions)
/// (and every protocol's options built from it) takes it from now on. The `daqflow` command sets
/// it once at start from `--token-file` or `DAQFLOW_TOKEN_FILE`, so that every connection of a
/// component process authenticates with its system's token.
pub fn set_process_token(token: Option<Token>) {
    *PROCESS_TOKEN.write().unwrap_or_else(|p| p.into_inner()) = token;
}

/// The token of this process, if one was set.
pub fn process_token() -> Option<Token> {
    PROCESS_TOKEN.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Why a handshake failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The server requires the system token and this end has none.
    #[error(
        "{peer} requires the system token and this process has none (give it with --token-file FILE or DAQFLOW_TOKEN_FILE)"
    )]
    TokenRequired {
        /// The server.
        peer: SocketAddr,
    },
    /// The token does not match the other end's.
    #[error("{peer}: wrong token (the two ends do not hold the same system token)")]
    WrongToken {
        /// The other end.
        peer: SocketAddr,
    },
    /// The server could not prove that it holds our token: it has none, or another one.
    #[error("{peer} does not prove the system token (it runs without one, or with another): refusing to talk to it")]
    ServerUnproven {
        /// The server.
        peer: SocketAddr,
    },
    /// The two ends speak different protocols: the client dialled the wrong port.
    #[error("{peer} speaks `{theirs}`, this end speaks `{ours}`: wrong port?")]
    ProtocolMismatch {
        /// The other end.
        peer: SocketAddr,
        /// Our protocol.
        ours: String,
        /// Theirs.
        theirs: String,
    },
    /// The other end refused for another reason.
    #[error("{peer} refused the connection: {message}")]
    Refused {
        /// The other end.
        peer: SocketAddr,
        /// Its reason.
        message: String,
    },
    /// A handshake frame was malformed (or the peer does not speak daqflow).
    #[error("{peer}: bad handshake: {detail}")]
    Malformed {
        /// The other end.
        peer: SocketAddr,
        /// What was wrong.
        detail: String,
    },
    /// The handshake did not complete in time.
    #[error("{peer}: no handshake within {millis} ms")]
    Timeout {
        /// The other end.
        peer: SocketAddr,
        /// The time allowed, in milliseconds.
        millis: u64,
    },
    /// The connection failed during the handshake.
    #[error("{peer}: connection failed during the handshake: {detail}")]
    Io {
        /// The other end.
        peer: SocketAddr,
        /// What happened.
        detail: String,
    },
}

impl AuthError {
    /// Whether trying again cannot help (a wrong or missing token, the wrong port), as opposed
    /// to a connection that failed or a server too busy to answer.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            AuthError::TokenRequired { .. }
                | AuthError::WrongToken { .. }
                | AuthError::ServerUnproven { .. }
                | AuthError::ProtocolMismatch { .. }
        )
    }
}

/// The client's side of the handshake on a plain blocking stream, for programs that speak a
/// daqflow protocol without this crate's connections (tests, tools, a client in another
/// language follows the same steps). On success the stream carries the protocol's frames.
///
/// ```no_run
/// use std::time::Duration;
/// let mut s = std::net::TcpStream::connect("127.0.0.1:7000")?;
/// daqflow_transport::auth::handshake_std(&mut s, "dialog-control", None, Duration::from_secs(5))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn handshake_std(
    stream: &mut std::net::TcpStream,
    protocol: &'static str,
    token: Option<&Token>,
    timeout: std::time::Duration,
) -> Result<(), AuthError> {
    use std::io::Read;
    let peer = stream.peer_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let io = |e: std::io::Error| AuthError::Io { peer, detail: e.to_string() };
    let old = stream.read_timeout().map_err(io)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    let read_frame = |stream: &mut std::net::TcpStream| -> Result<Frame, AuthError> {
        let mut h = [0u8; daqflow_wire::frame::FRAME_HEADER_LEN];
        stream.read_exact(&mut h).map_err(io)?;
        let header = daqflow_wire::frame::FrameHeader::decode(&h, HANDSHAKE_MAX_FRAME)
            .map_err(|e| AuthError::Malformed { peer, detail: e.to_string() })?;
        let mut payload = vec![0u8; header.len as usize];
        stream.read_exact(&mut payload).map_err(io)?;
        Ok(Frame { kind: header.kind, flags: header.flags, channel: header.channel, payload: payload.into() })
    };
    let creds = Credentials { protocol, token: token.cloned() };
    let challenge = read_frame(stream)?;
    let (client, response) = ClientSide::on_challenge(creds, peer, &challenge)?;
    let mut wire = BytesMut::new();
    daqflow_wire::frame::FrameCodec::default().encode(&response, &mut wire);
    stream.write_all(&wire).map_err(io)?;
    let answer = read_frame(stream)?;
    client.on_answer(peer, &answer)?;
    stream.set_read_timeout(old).map_err(io)?;
    Ok(())
}

/// Why a server refused, in a `REFUSE` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum RefuseReason {
    WrongToken = 1,
    TokenRequired = 2,
    Protocol = 3,
    Version = 4,
    Malformed = 5,
    /// The client sent a proof, but this server has no token: it cannot check the proof nor
    /// prove one back, and a client that holds a token must not take it for authenticated.
    NoTokenHere = 6,
}

/// What both ends know before the handshake.
#[derive(Debug, Clone)]
pub(crate) struct Credentials {
    pub(crate) protocol: &'static str,
    pub(crate) token: Option<Token>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    if getrandom::fill(&mut n).is_err() {
        // No randomness: a nonce from the clock and a counter still never repeats in this
        // process, which is what a challenge needs.
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        n[..8].copy_from_slice(&t.to_le_bytes());
        n[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    }
    n
}

fn mac(token: &Token, label: &str, protocol: &str, server: &[u8; NONCE_LEN], client: &[u8; NONCE_LEN]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token.as_bytes()).expect("HMAC takes keys of any length");
    m.update(b"daqflow-auth-1 ");
    m.update(label.as_bytes());
    m.update(&[0]);
    m.update(protocol.as_bytes());
    m.update(&[0]);
    m.update(server);
    m.update(client);
    m
}

/// The proof of `label` (`client` or `server`).
pub fn proof(
    token: &Token,
    label: &str,
    protocol: &str,
    server: &[u8; NONCE_LEN],
    client: &[u8; NONCE_LEN],
) -> [u8; PROOF_LEN] {
    mac(token, label, protocol, server, client).finalize().into_bytes().into()
}

fn verify(
    token: &Token,
    label: &str,
    protocol: &str,
    server: &[u8; NONCE_LEN],
    client: &[u8; NONCE_LEN],
    got: &[u8],
) -> bool {
    mac(token, label, protocol, server, client).verify_slice(got).is_ok()
}

/// The server's side of one handshake.
#[derive(Debug)]
pub(crate) struct ServerSide {
    creds: Credentials,
    nonce: [u8; NONCE_LEN],
}

impl ServerSide {
    /// Starts a handshake: the state and the challenge to send.
    pub(crate) fn start(creds: Credentials) -> (ServerSide, Frame) {
        let nonce = nonce();
        let mut w = Writer::with_capacity(24 + creds.protocol.len());
        w.u16(HANDSHAKE_VERSION);
        w.u8(if creds.token.is_some() { FLAG_TOKEN } else { 0 });
        w.u8(0);
        w.bytes(&nonce);
        w.short_text(&creds.protocol[..creds.protocol.len().min(MAX_PROTOCOL_LEN)]);
        (ServerSide { creds, nonce }, Frame::new(KIND_CHALLENGE, w.finish()))
    }

    /// Checks the client's response: the `ACCEPT` to send, or the `REFUSE` and why.
    pub(crate) fn on_response(&self, peer: SocketAddr, frame: &Frame) -> Result<Frame, (Frame, AuthError)> {
        let refuse = |reason: RefuseReason, message: String, error: AuthError| {
            let mut w = Writer::with_capacity(3 + message.len());
            w.u8(reason as u8);
            // Within the handshake's frame limit.
            let mut end = message.len().min(400);
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            w.text(&message[..end]);
            Err((Frame::new(KIND_REFUSE, w.finish()), error))
        };
        let malformed = |detail: &str| {
            refuse(
                RefuseReason::Malformed,
                format!("bad handshake: {detail}"),
                AuthError::Malformed { peer, detail: detail.to_owned() },
            )
        };
        if frame.kind != KIND_RESPONSE {
            return malformed(&format!("expected RESPONSE (kind {KIND_RESPONSE:#06x}), got kind {:#06x}", frame.kind));
        }
        let mut f = Reader::new("RESPONSE", &frame.payload);
        let fields = (|| {
            let v = (
                f.u16("version")?,
                f.u8("flags")?,
                f.u8("reserved")?,
                f.array::<NONCE_LEN>("nonce")?,
                f.array::<PROOF_LEN>("proof")?,
                f.short_text("protocol")?,
            );
            f.finish()?;
            Ok::<_, daqflow_wire::codec::CodecError>(v)
        })();
        let (version, flags, _, client_nonce, client_proof, protocol) = match fields {
            Ok(v) => v,
            Err(e) => return malformed(&e.to_string()),
        };
        if version != HANDSHAKE_VERSION {
            return refuse(
                RefuseReason::Version,
                format!("handshake version {version} is not spoken here (this end speaks {HANDSHAKE_VERSION})"),
                AuthError::Malformed { peer, detail: format!("handshake version {version}") },
            );
        }
        if protocol != self.creds.protocol {
            return refuse(
                RefuseReason::Protocol,
                format!("this port speaks `{}`, not `{protocol}`", self.creds.protocol),
                AuthError::ProtocolMismatch { peer, ours: self.creds.protocol.into(), theirs: protocol },
            );
        }
        let mut server_proof = [0u8; PROOF_LEN];
        if self.creds.token.is_none() && flags & FLAG_TOKEN != 0 {
            // Answering ACCEPT (with a zero proof) would leave a client that does not check
            // the proof believing that the server holds its token.
            return refuse(
                RefuseReason::NoTokenHere,
                "this port runs without a system token: it cannot check a proof nor prove the token back".into(),
                AuthError::ServerUnproven { peer },
            );
        }
        if let Some(token) = &self.creds.token {
            if flags & FLAG_TOKEN == 0 {
                return refuse(
                    RefuseReason::TokenRequired,
                    "this port requires the system token".into(),
                    AuthError::TokenRequired { peer },
                );
            }
            if !verify(token, "client", &protocol, &self.nonce, &client_nonce, &client_proof) {
                return refuse(RefuseReason::WrongToken, "wrong token".into(), AuthError::WrongToken { peer });
            }
            server_proof = proof(token, "server", &protocol, &self.nonce, &client_nonce);
        }
        Ok(Frame::new(KIND_ACCEPT, Bytes::copy_from_slice(&server_proof)))
    }
}

/// The client's side of one handshake, after it answered the challenge.
#[derive(Debug)]
pub(crate) struct ClientSide {
    creds: Credentials,
    server_nonce: [u8; NONCE_LEN],
    client_nonce: [u8; NONCE_LEN],
}

impl ClientSide {
    /// Answers the server's challenge: the state and the response to send.
    pub(crate) fn on_challenge(
        creds: Credentials,
        peer: SocketAddr,
        frame: &Frame,
    ) -> Result<(ClientSide, Frame), AuthError> {
        let malformed = |detail: String| AuthError::Malformed { peer, detail };
        if frame.kind != KIND_CHALLENGE {
            return Err(malformed(format!(
                "expected a CHALLENGE (kind {KIND_CHALLENGE:#06x}) first, got kind {:#06x}: the server does not speak this version of daqflow",
                frame.kind
            )));
        }
        let mut f = Reader::new("CHALLENGE", &frame.payload);
        let fields = (|| {
            Ok::<_, daqflow_wire::codec::CodecError>((
                f.u16("version")?,
                f.u8("flags")?,
                f.u8("reserved")?,
                f.array::<NONCE_LEN>("nonce")?,
                f.short_text("protocol")?,
            ))
        })();
        let (version, flags, _, server_nonce, protocol) = fields.map_err(|e| malformed(e.to_string()))?;
        if version != HANDSHAKE_VERSION {
            return Err(malformed(format!("handshake version {version} (this end speaks {HANDSHAKE_VERSION})")));
        }
        if protocol != creds.protocol {
            return Err(AuthError::ProtocolMismatch { peer, ours: creds.protocol.into(), theirs: protocol });
        }
        let required = flags & FLAG_TOKEN != 0;
        match (&creds.token, required) {
            (None, true) => return Err(AuthError::TokenRequired { peer }),
            (Some(_), false) => return Err(AuthError::ServerUnproven { peer }),
            _ => {}
        }
        let client_nonce = nonce();
        let client_proof = match &creds.token {
            Some(t) => proof(t, "client", creds.protocol, &server_nonce, &client_nonce),
            None => [0u8; PROOF_LEN],
        };
        let mut w = Writer::with_capacity(56 + creds.protocol.len());
        w.u16(HANDSHAKE_VERSION);
        w.u8(if creds.token.is_some() { FLAG_TOKEN } else { 0 });
        w.u8(0);
        w.bytes(&client_nonce);
        w.bytes(&client_proof);
        w.short_text(&creds.protocol[..creds.protocol.len().min(MAX_PROTOCOL_LEN)]);
        Ok((ClientSide { creds, server_nonce, client_nonce }, Frame::new(KIND_RESPONSE, w.finish())))
    }

    /// Checks the server's answer.
    pub(crate) fn on_answer(&self, peer: SocketAddr, frame: &Frame) -> Result<(), AuthError> {
        match frame.kind {
            KIND_ACCEPT => {
                if frame.payload.len() != PROOF_LEN {
                    return Err(AuthError::Malformed { peer, detail: "ACCEPT of the wrong length".into() });
                }
                match &self.creds.token {
                    Some(t) => {
                        if verify(
                            t,
                            "server",
                            self.creds.protocol,
                            &self.server_nonce,
                            &self.client_nonce,
                            &frame.payload,
                        ) {
                            Ok(())
                        } else {
                            Err(AuthError::ServerUnproven { peer })
                        }
                    }
                    None => Ok(()),
                }
            }
            KIND_REFUSE => {
                let mut f = Reader::new("REFUSE", &frame.payload);
                let reason = f.u8("reason").ok();
                let message = f.text("message").unwrap_or_default();
                Err(match reason {
                    Some(1) => AuthError::WrongToken { peer },
                    Some(2) => AuthError::TokenRequired { peer },
                    Some(6) => AuthError::ServerUnproven { peer },
                    _ => AuthError::Refused { peer, message },
                })
            }
            other => {
                Err(AuthError::Malformed { peer, detail: format!("expected ACCEPT or REFUSE, got kind {other:#06x}") })
            }
        }
    }
}

/// Entry points for the fuzz targets in `fuzz/`: the handshake's decoders on frames from a
/// peer, without a socket. Not part of the API (hidden from the documentation; only with the
/// cargo feature `fuzzing`, which `fuzz/` turns on).
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    fn peer() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 9))
    }

    /// The server's side: a fresh challenge for `protocol`, then its check of the client's
    /// `response`: the `ACCEPT` to send, or the `REFUSE` to send and why.
    pub fn server_response(
        protocol: &'static str,
        token: Option<&Token>,
        response: &Frame,
    ) -> Result<Frame, (Frame, AuthError)> {
        let (server, _challenge) = ServerSide::start(Credentials { protocol, token: token.cloned() });
        server.on_response(peer(), response)
    }

    /// The client's side: its `RESPONSE` to `challenge`, then its check of the server's
    /// `answer` (`ACCEPT` or `REFUSE`).
    pub fn client(
        protocol: &'static str,
        token: Option<&Token>,
        challenge: &Frame,
        answer: &Frame,
    ) -> Result<Frame, AuthError> {
        let (client, response) =
            ClientSide::on_challenge(Credentials { protocol, token: token.cloned() }, peer(), challenge)?;
        client.on_answer(peer(), answer)?;
        Ok(response)
    }

    /// A whole handshake in memory: the `CHALLENGE`, the `RESPONSE` and the server's answer
    /// (`ACCEPT`, or `REFUSE` when the tokens differ), for seed corpora.
    pub fn exchange(protocol: &'static str, server: Option<&Token>, client: Option<&Token>) -> [Frame; 3] {
        let (s, challenge) = ServerSide::start(Credentials { protocol, token: server.cloned() });
        let response =
            match ClientSide::on_challenge(Credentials { protocol, token: client.cloned() }, peer(), &challenge) {
                Ok((_, response)) => response,
                Err(_) => Frame::new(KIND_RESPONSE, Bytes::new()),
            };
        let answer = match s.on_response(peer(), &response) {
            Ok(f) | Err((f, _)) => f,
        };
        [challenge, response, answer]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> SocketAddr {
        "127.0.0.1:9".parse().unwrap()
    }

    fn creds(token: Option<&Token>) -> Credentials {
        Credentials { protocol: "test", token: token.cloned() }
    }

    /// Runs a whole handshake between the two sides' state machines.
    fn handshake(server: Option<&Token>, client: Option<&Token>) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let (s, challenge) = ServerSide::start(creds(server));
        let (c, response) = match ClientSide::on_challenge(creds(client), peer(), &challenge) {
            Ok(x) => x,
            Err(e) => return (Ok(()), Err(e)),
        };
        match s.on_response(peer(), &response) {
            Ok(accept) => (Ok(()), c.on_answer(peer(), &accept)),
            Err((refuse, e)) => (Err(e), c.on_answer(peer(), &refuse)),
        }
    }

    #[test]
    fn the_same_token_on_both_ends_is_accepted_and_proven_both_ways() {
        let t = Token::generate();
        assert_eq!(handshake(Some(&t), Some(&t)), (Ok(()), Ok(())));
        assert_eq!(handshake(None, None), (Ok(()), Ok(())));
    }

    #[test]
    fn a_wrong_or_missing_token_is_refused_and_a_server_without_one_is_not_trusted() {
        let (a, b) = (Token::generate(), Token::generate());
        assert_eq!(
            handshake(Some(&a), Some(&b)),
            (Err(AuthError::WrongToken { peer: peer() }), Err(AuthError::WrongToken { peer: peer() }))
        );
        assert_eq!(handshake(Some(&a), None).1, Err(AuthError::TokenRequired { peer: peer() }));
        assert_eq!(handshake(None, Some(&a)).1, Err(AuthError::ServerUnproven { peer: peer() }));
    }

    #[test]
    fn a_server_without_a_token_refuses_a_response_that_carries_a_proof() {
        // A client that ignores the challenge's flags and proves its token anyway (daqflow's
        // own stops at the challenge: `ServerUnproven`) is refused with reason 6, not accepted
        // with a zero proof. Its response is made here against another server's challenge.
        let t = Token::generate();
        let (_, challenge) = ServerSide::start(creds(Some(&t)));
        let (client, response) = ClientSide::on_challenge(creds(Some(&t)), peer(), &challenge).unwrap();
        let (tokenless, _) = ServerSide::start(creds(None));
        let (refusal, error) = tokenless.on_response(peer(), &response).unwrap_err();
        assert_eq!(error, AuthError::ServerUnproven { peer: peer() });
        assert_eq!((refusal.kind, refusal.payload[0]), (KIND_REFUSE, 6));
        let mut f = Reader::new("REFUSE", &refusal.payload[1..]);
        assert!(f.text("message").unwrap().contains("without a system token"));
        // The client reading the refusal learns that the server cannot prove the token.
        assert_eq!(client.on_answer(peer(), &refusal), Err(AuthError::ServerUnproven { peer: peer() }));
        // Without a proof, a server without a token still accepts anyone.
        assert_eq!(handshake(None, None), (Ok(()), Ok(())));
    }

    #[test]
    fn a_server_that_does_not_know_the_token_cannot_fake_its_proof() {
        let t = Token::generate();
        let (_, challenge) = ServerSide::start(creds(Some(&t)));
        let (c, response) = ClientSide::on_challenge(creds(Some(&t)), peer(), &challenge).unwrap();
        // A squatter relaying the challenge cannot compute the server proof without the token.
        let squatter = ServerSide { creds: creds(Some(&Token::generate())), nonce: [0; NONCE_LEN] };
        let accept = Frame::new(KIND_ACCEPT, Bytes::copy_from_slice(&[7u8; PROOF_LEN]));
        assert_eq!(c.on_answer(peer(), &accept), Err(AuthError::ServerUnproven { peer: peer() }));
        assert!(squatter.on_response(peer(), &response).is_err());
    }

    #[test]
    fn a_client_of_another_protocol_learns_it_dialled_the_wrong_port() {
        let (_, challenge) = ServerSide::start(Credentials { protocol: "dialog", token: None });
        let e = ClientSide::on_challenge(Credentials { protocol: "et", token: None }, peer(), &challenge).unwrap_err();
        assert!(e.to_string().contains("speaks `dialog`"), "{e}");
        assert!(e.is_permanent());
    }

    #[test]
    fn the_handshake_kinds_are_in_the_auth_range_of_the_registry() {
        for k in [KIND_CHALLENGE, KIND_RESPONSE, KIND_ACCEPT, KIND_REFUSE] {
            assert!(daqflow_wire::kinds::AUTH.contains(k), "{k:#06x}");
        }
    }

    #[test]
    fn tokens_never_show_in_debug_output_and_compare_by_content() {
        let t = Token::new("  s3cret-value\n").unwrap();
        assert_eq!(format!("{t:?}"), "Token(…)");
        assert_eq!(t, Token::new("s3cret-value").unwrap());
        assert_ne!(t, Token::new("s3cret-valuf").unwrap());
        assert!(matches!(Token::new(" "), Err(TokenError::Empty)));
        assert!(matches!(Token::new("a b"), Err(TokenError::BadCharacter)));
        assert_eq!(Token::generate().as_bytes().len(), 64);
    }

    #[test]
    fn a_token_file_readable_by_others_is_refused_and_written_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("daqflow-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        let t = Token::generate();
        t.write_file(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(Token::from_file(&path).unwrap(), t);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(Token::from_file(&path), Err(TokenError::Exposed { mode: 0o644, .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_token_file_is_read_without_the_white_space_around_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("daqflow-token-ws-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        // What `write_file` writes: the token and one newline; the key is the token alone.
        let t = Token::generate();
        t.write_file(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), [t.as_bytes(), b"\n"].concat());
        assert_eq!(Token::from_file(&path).unwrap().as_bytes(), t.as_bytes());
        // Any white space around it, as an editor or `echo` leaves it, is not part of it.
        std::fs::write(&path, " \t\r\nabc123\r\n\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Token::from_file(&path).unwrap().as_bytes(), b"abc123");
        std::fs::write(&path, "abc 123\n").unwrap();
        assert!(matches!(Token::from_file(&path), Err(TokenError::BadCharacter)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn garbage_responses_are_refused_never_a_panic() {
        let (s, _) = ServerSide::start(creds(Some(&Token::generate())));
        for len in 0..80 {
            for fill in [0u8, 0xff, 0x20] {
                let f = Frame::new(KIND_RESPONSE, Bytes::from(vec![fill; len]));
                assert!(s.on_response(peer(), &f).is_err());
            }
        }
        for len in 0..40 {
            let f = Frame::new(KIND_CHALLENGE, Bytes::from(vec![1u8; len]));
            let _ = ClientSide::on_challenge(creds(None), peer(), &f);
        }
    }
}
