//! The control socket the local processes talk to: who may connect (the owner, root and the
//! allowed users), and one thread per connection serving its requests (attachments, stations,
//! large events).

use super::*;

/// Serves the local processes' control connections.
pub(super) fn control_server(system: Weak<SystemInner>, listener: UnixListener) {
    for conn in listener.incoming() {
        let Some(s) = system.upgrade() else { return };
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(conn) = conn else { continue };
        // The kernel says who is on the other end: a client cannot name another process to be
        // watched (and killed when it stops heartbeating), nor pretend to be another user.
        let peer = match sys::peer_cred(&conn) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(system = %s.config.name, error = %e, "control connection without peer credentials; closing it");
                continue;
            }
        };
        if !s.accepts_uid(peer.uid) {
            refuse(&s, conn, peer);
            continue;
        }
        let id = s.next_conn.fetch_add(1, Ordering::Relaxed);
        let w = system.clone();
        let _ = std::thread::Builder::new().name("et-client".into()).spawn(move || serve_client(w, conn, id, peer.pid));
    }
}

/// Tells a process of a user the system does not accept why, and closes its connection: it gets
/// no descriptor and nothing else (abstract sockets have no file permissions, so this check is
/// what keeps other users from mapping the memory).
pub(super) fn refuse(s: &SystemInner, conn: UnixStream, peer: sys::PeerCred) {
    tracing::warn!(
        system = %s.config.name,
        pid = peer.pid,
        uid = peer.uid,
        "refused a local connection from another user (allowed: uid {}, root, allowed_uids {:?})",
        s.owner_uid,
        s.config.allowed_uids
    );
    let e = EtError::AccessDenied { name: s.config.name.clone(), owner: s.owner_uid, uid: peer.uid };
    // A short message into the empty send buffer of a new socket: it does not block; the
    // timeout only bounds the unexpected.
    let _ = conn.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = ipc::send(&conn, &Response::Error(e), None);
}

pub(super) fn serve_client(system: Weak<SystemInner>, sock: UnixStream, conn: u64, pid: u32) {
    let mut hello = false;
    // The attachments this connection made: (slot, generation).
    let mut mine: Vec<(u32, u32)> = Vec::new();
    loop {
        let req = match ipc::recv::<Request>(&sock, ipc::MAX_REQUEST) {
            Ok((r, _)) => r,
            Err(e) => {
                if e.kind() != io::ErrorKind::UnexpectedEof {
                    tracing::debug!(error = %e, "control connection ended");
                }
                break;
            }
        };
        let Some(s) = system.upgrade() else { return };
        let mut fd = None;
        let resp = match req {
            Request::Hello { pid: p } => {
                if p != pid {
                    tracing::debug!(said = p, peer = pid, "client's Hello names another pid; using the kernel's");
                }
                hello = true;
                fd = Some(s.memfd.as_raw_fd());
                Response::Hello { name: s.config.name.clone(), pool_len: s.pool.layout.total as u64 }
            }
            _ if !hello => Response::Error(EtError::Protocol("the first request must be Hello".into())),
            Request::Attach { station } => match s.attach(&station, Holder::Local { conn, pid }) {
                Ok((attachment, station, generation)) => {
                    mine.push((attachment, generation));
                    Response::Attached { attachment, station }
                }
                Err(e) => Response::Error(e),
            },
            Request::Detach { attachment } => {
                if let Some(p) = mine.iter().position(|&(a, _)| a == attachment) {
                    let (_, generation) = mine.swap_remove(p);
                    s.detach(attachment, generation, false);
                }
                Response::Done
            }
            Request::CreateStation { name, config, position } => match s.create_station(&name, config, position) {
                Ok(_) => Response::Done,
                Err(e) => Response::Error(e),
            },
            Request::RemoveStation { name } => s.remove_station(&name).map_or_else(Response::Error, |_| Response::Done),
            Request::Configure { name, config } => {
                s.configure_station(&name, config).map_or_else(Response::Error, |_| Response::Done)
            }
            Request::AdmitLarge { attachment, .. } | Request::NewTemp { attachment, .. }
                if !mine.iter().any(|&(a, _)| a == attachment) =>
            {
                Response::Error(EtError::Protocol(format!("no attachment {attachment} on this connection")))
            }
            Request::AdmitLarge { attachment, count, size } => s
                .admit_large(
                    attachment,
                    count.min(u64::from(u32::MAX)) as usize,
                    usize::try_from(size).unwrap_or(usize::MAX),
                )
                .map_or_else(Response::Error, |_| Response::Done),
            Request::NewTemp { attachment, event, size } => {
                match s.new_temp(attachment, event, usize::try_from(size).unwrap_or(usize::MAX)) {
                    Ok((temp, f, map)) => {
                        let r = Response::Temp { temp, size: map.len() as u64 };
                        let _ = ipc::send(&sock, &r, Some(f.as_raw_fd()));
                        continue;
                    }
                    Err(e) => Response::Error(e),
                }
            }
            Request::TempFd { temp } => match s.temp(temp) {
                Ok((f, map)) => {
                    let r = Response::Temp { temp, size: map.len() as u64 };
                    let _ = ipc::send(&sock, &r, Some(f.as_raw_fd()));
                    continue;
                }
                Err(e) => Response::Error(e),
            },
            Request::Status => Response::Status(Box::new(s.snapshot())),
        };
        if ipc::send(&sock, &resp, fd).is_err() {
            break;
        }
    }
    // The connection closed: a process that did not detach died. Its events come back.
    if let Some(s) = system.upgrade() {
        for (att, generation) in mine {
            s.detach(att, generation, true);
        }
    }
}
