//! The control channel between an ET system and the processes on its machine: requests and
//! answers as length-prefixed JSON over a Unix socket in the abstract namespace (no file in
//! any filesystem), with memory-file descriptors passed alongside (SCM_RIGHTS).

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::config::{Position, StationConfig};
use crate::monitor::Snapshot;
use crate::sys;

/// Largest request the ET process reads: requests are a station's name and configuration at
/// most (a few hundred bytes), and the buffer is allocated before the JSON is read.
pub(crate) const MAX_REQUEST: usize = 64 << 10;

/// Largest answer a client reads (a snapshot lists every station and attachment).
pub(crate) const MAX_RESPONSE: usize = 16 << 20;

/// The socket address of ET system `name`.
pub(crate) fn address(name: &str) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("daqflow-et/{name}").as_bytes())
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Request {
    Hello {
        pid: u32,
    },
    Attach {
        station: String,
    },
    Detach {
        attachment: u32,
    },
    CreateStation {
        name: String,
        config: StationConfig,
        position: Position,
    },
    RemoveStation {
        name: String,
    },
    Configure {
        name: String,
        config: StationConfig,
    },
    /// Whether `count` large events of `size` bytes fit the limits now (asked before taking
    /// events for them).
    AdmitLarge {
        attachment: u32,
        count: u64,
        size: u64,
    },
    /// A temporary buffer for `event`, held by `attachment` (of this connection).
    NewTemp {
        attachment: u32,
        event: u32,
        size: u64,
    },
    TempFd {
        temp: u32,
    },
    Status,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Response {
    /// With the pool's memory file.
    Hello {
        name: String,
        pool_len: u64,
    },
    Attached {
        attachment: u32,
        station: u32,
    },
    Done,
    /// With the temporary buffer's memory file.
    Temp {
        temp: u32,
        size: u64,
    },
    Status(Box<Snapshot>),
    Error(crate::EtError),
}

pub(crate) fn send(sock: &UnixStream, msg: &impl Serialize, fd: Option<RawFd>) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&body);
    sys::send_with_fd(sock, &buf, fd)
}

/// Reads one message of at most `max` bytes (a longer one is refused before anything is
/// allocated for it).
pub(crate) fn recv<T: DeserializeOwned>(sock: &UnixStream, max: usize) -> io::Result<(T, Option<OwnedFd>)> {
    let mut len = [0u8; 4];
    let fd1 = sys::recv_with_fd(sock, &mut len)?;
    let n = u32::from_le_bytes(len) as usize;
    if n > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("control message of {n} bytes, more than {max}"),
        ));
    }
    let mut body = vec![0u8; n];
    let fd2 = if n > 0 { sys::recv_with_fd(sock, &mut body)? } else { None };
    let msg = serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok((msg, fd1.or(fd2)))
}
