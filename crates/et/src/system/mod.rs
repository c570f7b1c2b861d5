//! The ET system process: the pool, GrandCentral and the stations, the attachments, recovery,
//! large events, the conductor for closure stations, and the control socket local processes
//! talk to. Remote access and discovery are in [`crate::remote`].

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::{
    EventView, GRAND_CENTRAL, Position, Priority, RestoreMode, SelectFn, Selection, StationConfig, SystemConfig,
};
use crate::error::{EtError, Limit};
use crate::ipc::{self, Request, Response};
use crate::local::{Backend, LocalAttachment, route_and_push};
use crate::monitor::{AttachmentStatus, Snapshot, StationStatus};
use crate::pool::{
    ATT_ACTIVE, ATT_DEAD, ATT_FREE, FLAG_CORRUPT, FLAG_TEMP, Layout, MAX_STATIONS, OWNER_ATTACHMENT, OWNER_RETURNING,
    OWNER_SYSTEM, Pool, STATION_ACTIVE, STATION_FREE,
};
use crate::queue::{Block, Lane};
use crate::routing::RouteEnv;
use crate::sys::{self, Mapping};

mod control;
mod workers;

use control::control_server;
#[cfg(test)]
use control::refuse;
use workers::{conductor, temp_reaper, watchdog};

/// Who uses an attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// A process on this machine, through control connection `conn`.
    Local { conn: u64, pid: u32 },
    /// The ET process itself.
    InProcess,
    /// A remote client, served by this process through TCP connection `conn`.
    Remote { conn: u64 },
}

impl Holder {
    /// The connection the attachment was made through (none for the ET process's own).
    fn conn(&self) -> Option<u64> {
        match self {
            Holder::Local { conn, .. } | Holder::Remote { conn } => Some(*conn),
            Holder::InProcess => None,
        }
    }
}

#[derive(Debug)]
struct AttMeta {
    station: u32,
    holder: Holder,
    last_beat: u64,
    last_change: Instant,
    /// The slot's generation for this attachment (`AttachmentRecord::generation`): a detach
    /// that names another generation is for an attachment that has already ended.
    generation: u32,
}

struct StationMeta {
    name: String,
    group: u32,
    closure: Option<SelectFn>,
}

/// The temporary buffer of a large event.
struct Temp {
    fd: OwnedFd,
    map: Arc<Mapping>,
    /// The event it was made for.
    event: u32,
}

pub(crate) struct State {
    stations: Vec<Option<StationMeta>>,
    chain: Vec<u32>,
    /// Where each removed station stood in the chain: events found in its input list later
    /// continue from that position (the stations that followed it), not from the start.
    removed_at: HashMap<u32, usize>,
    next_group: u32,
    attachments: Vec<Option<AttMeta>>,
    temps: HashMap<u32, Temp>,
    next_temp: u32,
    /// Bytes of the temporary buffers (their mapped sizes).
    temp_bytes: u64,
}

impl State {
    fn remove_temp(&mut self, id: u32) {
        if let Some(t) = self.temps.remove(&id) {
            self.temp_bytes -= t.map.len() as u64;
        }
    }
}

pub(crate) struct SystemInner {
    pub(crate) config: SystemConfig,
    pub(crate) pool: Pool,
    memfd: OwnedFd,
    state: Mutex<State>,
    pub(crate) stop: AtomicBool,
    pub(crate) next_conn: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) remote_addr: Mutex<Option<std::net::SocketAddr>>,
    /// The user the ET process runs as: the system's owner.
    owner_uid: u32,
}

/// An ET system, running in this process: create it, then let processes attach (locally by its
/// name, remotely by TCP). Dropping it stops it.
///
/// ```no_run
/// use daqflow_et::{Attachment, EtClient, EtSystem, Position, StationConfig, SystemConfig, Wait};
/// let system = EtSystem::create(SystemConfig::new("daq", 3000, 4096))?;
/// system.create_station("recorder", StationConfig::default(), Position::End)?;
/// // In another process (or this one):
/// let client = EtClient::connect("daq")?;
/// let producer = client.attach("GRAND_CENTRAL")?;
/// let mut batch = producer.new_events(100, 64, Wait::Sleep)?;
/// for e in &mut batch { e.write(b"event data")?; }
/// producer.put_events(&mut batch)?;
/// let consumer = client.attach("recorder")?;
/// let mut got = consumer.get_events(100, Wait::Sleep)?;
/// consumer.put_events(&mut got)?; // on to the next station, or back to GrandCentral
/// # Ok::<(), daqflow_et::EtError>(())
/// ```
pub struct EtSystem {
    pub(crate) inner: Arc<SystemInner>,
}

impl std::fmt::Debug for EtSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtSystem").field("name", &self.inner.config.name).finish()
    }
}

impl SystemInner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn station_slot(st: &State, name: &str) -> Option<u32> {
        st.stations.iter().position(|s| s.as_ref().is_some_and(|m| m.name == name)).map(|p| p as u32)
    }

    pub(crate) fn create_station(&self, name: &str, config: StationConfig, position: Position) -> Result<u32, EtError> {
        if name.is_empty() || name.len() > 64 || name == GRAND_CENTRAL {
            return Err(EtError::Refused(format!(
                "{name:?} cannot be a station name (1 to 64 bytes, not {GRAND_CENTRAL})"
            )));
        }
        if config.cue == 0 && !config.blocking {
            return Err(EtError::Refused("a non-blocking station needs a cue of at least 1".into()));
        }
        if let Selection::Range { index, .. } | Selection::MaskAny { index, .. } | Selection::MaskAll { index, .. } =
            config.selection
            && index > 3
        {
            return Err(EtError::Refused(format!("control integer {index} does not exist (0 to 3)")));
        }
        let mut st = self.state();
        if Self::station_slot(&st, name).is_some() {
            return Err(EtError::StationExists(name.into()));
        }
        let max = self.pool.layout.max_stations as usize;
        let Some(slot) = (1..max).find(|&s| st.stations[s].is_none()) else {
            return Err(EtError::Refused(format!("the system has room for {} stations", max - 1)));
        };
        let slot = slot as u32;
        // Where in the chain, and which group.
        let (at, group) = match &position {
            Position::End => (st.chain.len(), 0),
            Position::First => (0, 0),
            Position::After(other) => {
                let o = Self::station_slot(&st, other).ok_or_else(|| EtError::NoSuchStation(other.clone()))?;
                if o == 0 {
                    (0, 0)
                } else {
                    let p = st.chain.iter().position(|&s| s == o).unwrap_or(st.chain.len());
                    let g = st.stations[o as usize].as_ref().map_or(0, |m| m.group);
                    let mut q = p + 1;
                    while g != 0
                        && q < st.chain.len()
                        && st.stations[st.chain[q] as usize].as_ref().is_some_and(|m| m.group == g)
                    {
                        q += 1;
                    }
                    (q, 0)
                }
            }
            Position::ParallelWith(other) => {
                let o = Self::station_slot(&st, other).ok_or_else(|| EtError::NoSuchStation(other.clone()))?;
                if o == 0 {
                    return Err(EtError::Refused("GrandCentral cannot be in a parallel group".into()));
                }
                let p = st.chain.iter().position(|&s| s == o).unwrap_or(st.chain.len());
                let mut g = st.stations[o as usize].as_ref().map_or(0, |m| m.group);
                if g == 0 {
                    st.next_group += 1;
                    g = st.next_group;
                    if let Some(m) = st.stations[o as usize].as_mut() {
                        m.group = g;
                    }
                    self.pool.station(o).group.store(g, Ordering::Release);
                }
                let mut q = p + 1;
                while q < st.chain.len() && st.stations[st.chain[q] as usize].as_ref().is_some_and(|m| m.group == g) {
                    q += 1;
                }
                (q, g)
            }
        };
        let rec = self.pool.station(slot);
        rec.attachments.store(0, Ordering::Release);
        rec.prescale_counter.store(0, Ordering::Release);
        rec.rr_counter.store(0, Ordering::Release);
        rec.events_in.store(0, Ordering::Release);
        rec.events_out.store(0, Ordering::Release);
        rec.group.store(group, Ordering::Release);
        self.pool.set_station_name(slot, name);
        self.pool.store_config(slot, &config);
        let closure = match &config.selection {
            Selection::Closure(f) => Some(f.clone()),
            _ => None,
        };
        rec.state.store(STATION_ACTIVE, Ordering::Release);
        st.stations[slot as usize] = Some(StationMeta { name: name.to_owned(), group, closure });
        st.removed_at.remove(&slot);
        st.chain.insert(at, slot);
        self.pool.set_chain(&st.chain);
        tracing::info!(system = %self.config.name, station = name, position = at + 1, "station created");
        Ok(slot)
    }

    pub(crate) fn remove_station(&self, name: &str) -> Result<(), EtError> {
        let slot = {
            let mut st = self.state();
            let slot = Self::station_slot(&st, name).ok_or_else(|| EtError::NoSuchStation(name.into()))?;
            if slot == 0 {
                return Err(EtError::Refused("GrandCentral cannot be removed".into()));
            }
            if self.pool.station(slot).attachments.load(Ordering::Acquire) > 0 {
                return Err(EtError::Refused(format!("station `{name}` has attachments; detach them first")));
            }
            let pos = st.chain.iter().position(|&s| s == slot).unwrap_or(0);
            st.removed_at.insert(slot, pos);
            st.chain.retain(|&s| s != slot);
            self.pool.set_chain(&st.chain);
            st.stations[slot as usize] = None;
            slot
        };
        // Putters that read the old chain may still push here: drain now and again shortly
        // (the watchdog keeps draining free stations, in case).
        self.drain_station(slot);
        std::thread::sleep(Duration::from_millis(20));
        self.drain_station(slot);
        self.pool.station(slot).state.store(STATION_FREE, Ordering::Release);
        tracing::info!(system = %self.config.name, station = name, "station removed");
        Ok(())
    }

    /// Routes the events waiting in station `slot`'s input list onward (the station is gone):
    /// to the stations that followed it in the chain.
    fn drain_station(&self, slot: u32) {
        let pos = self.state().removed_at.get(&slot).copied().unwrap_or(0);
        let mut idx = Vec::new();
        let q = self.pool.queue(slot);
        while q.pop(1024, &mut idx, Block::No, OWNER_SYSTEM, &|| false).is_ok() {
            let batch = self.held_batch(&idx, false);
            route_and_push(&self.pool, 0, Some(pos), &batch, &ProcessEnv(self), OWNER_SYSTEM);
            idx.clear();
        }
    }

    /// (index, control, high priority, large) of events the ET process holds; marks them
    /// possibly corrupt if asked.
    fn held_batch(&self, idx: &[u32], corrupt: bool) -> Vec<(u32, [i32; 4], bool, bool)> {
        idx.iter()
            .map(|&i| {
                // SAFETY: the ET process holds these events (owner OWNER_SYSTEM).
                let d = unsafe { &mut *self.pool.desc(i) };
                if corrupt {
                    d.flags |= FLAG_CORRUPT;
                }
                (i, d.control, d.priority == 1, d.flags & FLAG_TEMP != 0)
            })
            .collect()
    }

    pub(crate) fn configure_station(&self, name: &str, mut config: StationConfig) -> Result<(), EtError> {
        let mut st = self.state();
        let slot = Self::station_slot(&st, name).ok_or_else(|| EtError::NoSuchStation(name.into()))?;
        if slot == 0 {
            return Err(EtError::Refused("GrandCentral has no configuration".into()));
        }
        let meta = st.stations[slot as usize].as_mut().expect("slot found by name");
        match &config.selection {
            Selection::Closure(f) => meta.closure = Some(f.clone()),
            _ => meta.closure = None,
        }
        // Keep the group policy consistent with the station's group.
        if meta.group == 0 {
            config.group_policy = Default::default();
        }
        self.pool.store_config(slot, &config);
        Ok(())
    }

    /// Attaches `holder` to `station`: (attachment slot, station slot, the slot's generation).
    pub(crate) fn attach(&self, station: &str, holder: Holder) -> Result<(u32, u32, u32), EtError> {
        let mut st = self.state();
        let slot = Self::station_slot(&st, station).ok_or_else(|| EtError::NoSuchStation(station.into()))?;
        let rec = self.pool.station(slot);
        if rec.single_user.load(Ordering::Acquire) != 0 && rec.attachments.load(Ordering::Acquire) > 0 {
            return Err(EtError::Refused(format!("station `{station}` takes a single attachment and has one")));
        }
        if let Some(conn) = holder.conn() {
            let max = self.config.max_attachments_per_connection;
            let mine = st.attachments.iter().flatten().filter(|m| m.holder.conn() == Some(conn)).count() as u64;
            if mine >= u64::from(max) {
                return Err(EtError::OverLimit {
                    limit: Limit::AttachmentsPerConnection,
                    requested: mine + 1,
                    max: u64::from(max),
                });
            }
        }
        // Not a slot whose id a queue lock still holds: its holder died there, and the repair
        // (which reads the dead holder's pid from the slot's record) has not run yet.
        let held = self.lock_holders();
        let Some(att) = (0..st.attachments.len())
            .find(|&i| st.attachments[i].is_none() && !held.contains(&(OWNER_ATTACHMENT + i as u32)))
        else {
            return Err(EtError::Refused(format!(
                "the system has room for {} attachments",
                self.config.max_attachments
            )));
        };
        let a = self.pool.attachment(att as u32);
        a.station.store(slot, Ordering::Release);
        a.pid.store(
            match holder {
                Holder::Local { pid, .. } => pid,
                _ => sys::getpid(),
            },
            Ordering::Release,
        );
        for c in [&a.heartbeat, &a.held, &a.got, &a.put, &a.dumped] {
            c.store(0, Ordering::Release);
        }
        let generation = a.generation.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        a.state.store(ATT_ACTIVE, Ordering::Release);
        rec.attachments.fetch_add(1, Ordering::AcqRel);
        st.attachments[att] =
            Some(AttMeta { station: slot, holder, last_beat: 0, last_change: Instant::now(), generation });
        tracing::debug!(system = %self.config.name, station, attachment = att, ?holder, "attached");
        Ok((att as u32, slot, generation))
    }

    /// Repairs every queue whose lock a dead process holds (docs/et.md, "When a process dies
    /// holding a lock"): the events its pusher had marked queued there without filling their
    /// slots are pushed there by the ET process, which finishes the put the dead one began (and
    /// counts them in); returns how many queues it repaired. Called for each detach and on every
    /// watchdog tick (a process whose connection closed may not be dead yet at its detach).
    pub(crate) fn repair_queues(&self) -> usize {
        let me = sys::getpid();
        let dead = |v: u32| self.locker_dead(v, me);
        let mut repaired = 0;
        for q in 0..self.pool.layout.max_stations + 2 {
            let queue = self.pool.queue(q);
            if !queue.needs_repair(&dead) {
                continue;
            }
            let back = queue.repair(OWNER_SYSTEM, &dead);
            queue.push(&back, Lane::Low, OWNER_SYSTEM);
            if q > 0 && q < self.pool.layout.max_stations {
                self.pool.station(q).events_in.fetch_add(back.len() as u64, Ordering::Relaxed);
            }
            tracing::warn!(system = %self.config.name, queue = q, events = back.len(), "repaired a queue whose lock a dead process held; its half-put events were put");
            repaired += 1;
        }
        repaired
    }

    /// The ids in the queues' lock words now (holders mid-call, or dead ones not yet repaired).
    fn lock_holders(&self) -> Vec<u32> {
        (0..self.pool.layout.max_stations + 2)
            .flat_map(|q| {
                let queue = self.pool.queue(q);
                [queue.push_lock.load(Ordering::Acquire), queue.pop_lock.load(Ordering::Acquire)]
            })
            .filter(|&v| v != 0)
            .collect()
    }

    /// Whether the holder of a queue lock whose word is `v` is a dead process (the ET process,
    /// `me`, never is; nor is an attachment whose process is unknown or alive).
    fn locker_dead(&self, v: u32, me: u32) -> bool {
        let a = v & 0x0fff_ffff;
        if v == OWNER_SYSTEM || v & 0xf000_0000 != OWNER_ATTACHMENT || a >= self.pool.layout.max_attachments {
            return false;
        }
        let pid = self.pool.attachment(a).pid.load(Ordering::Acquire);
        pid != 0 && pid != me && sys::pid_gone(pid)
    }

    /// Ends attachment `att`: its events go where its station's restore mode says (marked
    /// possibly corrupt if the holder died), and its slot is freed. Idempotent, and only for
    /// `generation`: a slot already freed and given to a new attachment (whose detach raced
    /// with this one: a watchdog and a closing connection, say) keeps its new attachment.
    pub(crate) fn detach(&self, att: u32, generation: u32, died: bool) {
        let meta = {
            let mut st = self.state();
            match st.attachments.get_mut(att as usize) {
                Some(slot) if slot.as_ref().is_some_and(|m| m.generation == generation) => {
                    slot.take().expect("checked just above")
                }
                _ => return,
            }
        };
        let a = self.pool.attachment(att);
        // Fence: from now on the holder's calls fail.
        a.state.store(ATT_DEAD, Ordering::Release);
        // A queue whose lock a dead process holds (this attachment's, or another's whose process
        // died with it) is repaired first.
        self.repair_queues();
        // What it held becomes the ET process's.
        let mine = OWNER_ATTACHMENT + att;
        let held: Vec<u32> = (0..self.pool.layout.events)
            .filter(|&i| {
                self.pool.owner(i).compare_exchange(mine, OWNER_SYSTEM, Ordering::AcqRel, Ordering::Acquire).is_ok()
            })
            .collect();
        // Events it had put back to GrandCentral and kept to push in a group: free.
        let returning = OWNER_RETURNING + att;
        let freed: Vec<u32> = (0..self.pool.layout.events)
            .filter(|&i| {
                self.pool
                    .owner(i)
                    .compare_exchange(returning, OWNER_SYSTEM, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            })
            .collect();
        self.pool.queue(0).push(&freed, Lane::Low, OWNER_SYSTEM);
        let station = meta.station;
        let rec = self.pool.station(station);
        rec.attachments.fetch_sub(1, Ordering::AcqRel);
        if !held.is_empty() {
            let batch = self.held_batch(&held, died);
            let restore = self.pool.load_config(station).restore;
            let others = rec.attachments.load(Ordering::Acquire) > 0;
            let station_alive = rec.state.load(Ordering::Acquire) == STATION_ACTIVE;
            let into_input = station != 0
                && station_alive
                && (restore == RestoreMode::Input || (restore == RestoreMode::Redistribute && others));
            // Redistribute, in a parallel group, with no other attachment here: to the group's
            // other members (routed again from the group's first member).
            let group_start = match (restore, others, station_alive) {
                (RestoreMode::Redistribute, false, true) => self.group_start(station),
                _ => None,
            };
            if restore == RestoreMode::GrandCentral || station == 0 {
                route_and_push(&self.pool, 0, Some(usize::MAX), &batch, &ProcessEnv(self), OWNER_SYSTEM);
            } else if let Some(start) = group_start {
                route_and_push(&self.pool, station, Some(start), &batch, &ProcessEnv(self), OWNER_SYSTEM);
            } else if into_input {
                #[allow(clippy::type_complexity)]
                let (h, l): (Vec<&(u32, [i32; 4], bool, bool)>, Vec<_>) = batch.iter().partition(|x| x.2);
                let q = self.pool.queue(station);
                q.push(&h.iter().map(|x| x.0).collect::<Vec<_>>(), Lane::High, OWNER_SYSTEM);
                q.push(&l.iter().map(|x| x.0).collect::<Vec<_>>(), Lane::Low, OWNER_SYSTEM);
                // They entered the input list again: counted in again, so that events out (which
                // counts them a second time when they are taken) never exceeds events in.
                rec.events_in.fetch_add(batch.len() as u64, Ordering::Relaxed);
            } else {
                route_and_push(&self.pool, station, None, &batch, &ProcessEnv(self), OWNER_SYSTEM);
            }
            let level = if died { tracing::Level::WARN } else { tracing::Level::DEBUG };
            if level == tracing::Level::WARN {
                tracing::warn!(system = %self.config.name, attachment = att, events = held.len(), ?restore, "attachment lost; its events were restored");
            }
        }
        a.held.store(0, Ordering::Release);
        a.state.store(ATT_FREE, Ordering::Release);
        if station != 0 && rec.attachments.load(Ordering::Acquire) == 0 {
            self.flush_idle(station);
        }
    }

    /// Frees temporary buffers whose event is free in GrandCentral: a large event always returns
    /// through the reaper, which frees its buffer first, so such a buffer belongs to nobody (its
    /// holder died between asking for it and marking the event large, or put the event without
    /// marking it).
    fn sweep_temps(&self) {
        let mut st = self.state();
        let orphans: Vec<u32> = st
            .temps
            .iter()
            .filter(|(_, t)| self.pool.owner(t.event).load(Ordering::Acquire) == 0)
            .map(|(&id, _)| id)
            .collect();
        for id in orphans {
            tracing::debug!(system = %self.config.name, temp = id, "freeing a large-event buffer nobody names");
            st.remove_temp(id);
        }
    }

    /// Whether a local process of user `uid` may connect: the system's owner, root (who can read
    /// any process's memory anyway), and the users of `allowed_uids`.
    pub(crate) fn accepts_uid(&self, uid: u32) -> bool {
        uid == self.owner_uid || uid == 0 || self.config.allowed_uids.contains(&uid)
    }

    /// Passes the events queued at station `slot`, which has no attachment any more, on to the
    /// stations after it (an idle station lets events flow past).
    ///
    /// A member of a parallel group whose restore mode is `Redistribute` hands them to the
    /// group's other members instead (routed again from the group's first member), also when it
    /// keeps its events while idle, as long as another member is attached: what none of them
    /// takes comes back to it (kept) or flows on after the group.
    fn flush_idle(&self, slot: u32) {
        let redistribute = match self.pool.load_config(slot).restore {
            RestoreMode::Redistribute => self.group_start(slot).filter(|_| self.group_attached(slot)),
            _ => None,
        };
        if redistribute.is_none() && self.pool.station(slot).keep_idle.load(Ordering::Acquire) != 0 {
            return;
        }
        let mut idx = Vec::new();
        let q = self.pool.queue(slot);
        // At most what is queued now: events routed back here are not taken again.
        let mut left = q.len_bound() as usize;
        while left > 0
            && self.pool.station(slot).attachments.load(Ordering::Acquire) == 0
            && q.pop(left.min(1024), &mut idx, Block::No, OWNER_SYSTEM, &|| false).is_ok()
        {
            left = left.saturating_sub(idx.len());
            let batch = self.held_batch(&idx, false);
            self.pool.station(slot).events_out.fetch_add(idx.len() as u64, Ordering::Relaxed);
            route_and_push(&self.pool, slot, redistribute, &batch, &ProcessEnv(self), OWNER_SYSTEM);
            idx.clear();
        }
    }

    /// The chain position of the first member of station `slot`'s parallel group; `None` when
    /// it is in no group (or not in the chain).
    fn group_start(&self, slot: u32) -> Option<usize> {
        let group = self.pool.station(slot).group.load(Ordering::Acquire);
        if group == 0 {
            return None;
        }
        let mut chain = Vec::new();
        self.pool.chain(&mut chain);
        chain.iter().position(|&s| self.pool.station(s).group.load(Ordering::Acquire) == group)
    }

    /// Whether another member of station `slot`'s parallel group has an attachment.
    fn group_attached(&self, slot: u32) -> bool {
        let group = self.pool.station(slot).group.load(Ordering::Acquire);
        let mut chain = Vec::new();
        self.pool.chain(&mut chain);
        chain.iter().any(|&s| {
            let rec = self.pool.station(s);
            s != slot
                && group != 0
                && rec.group.load(Ordering::Acquire) == group
                && rec.attachments.load(Ordering::Acquire) > 0
        })
    }

    /// Checks that `n` more large events of `size` bytes, for attachment `att`, fit every limit
    /// now: before any event is taken for them.
    pub(crate) fn admit_large(&self, att: u32, n: usize, size: usize) -> Result<(), EtError> {
        let st = self.state();
        self.check_large(&st, att, n.min(self.pool.layout.events as usize) as u64, size).map(|_| ())
    }

    /// The limits on large events, for `n` more of `size` bytes held by `att`: the size each
    /// buffer would map, or the first limit they go over.
    fn check_large(&self, st: &State, att: u32, n: u64, size: usize) -> Result<usize, EtError> {
        let c = &self.config;
        let max_size = c.max_event_bytes.max(self.pool.layout.event_size);
        let over = |limit, requested: u64, max: u64| Err(EtError::OverLimit { limit, requested, max });
        let mapped = match size.checked_next_multiple_of(4096) {
            Some(m) if size <= max_size => m,
            _ => return over(Limit::EventBytes, size as u64, max_size as u64),
        };
        let mine = OWNER_ATTACHMENT + att;
        let held = st.temps.values().filter(|t| self.pool.owner(t.event).load(Ordering::Acquire) == mine).count();
        let per_att = u64::from(c.max_temp_per_attachment);
        if held as u64 + n > per_att {
            return over(Limit::TempEventsPerAttachment, held as u64 + n, per_att);
        }
        let max_temps = u64::from(c.max_temp_events);
        if st.temps.len() as u64 + n > max_temps {
            return over(Limit::TempEvents, st.temps.len() as u64 + n, max_temps);
        }
        let bytes = st.temp_bytes.saturating_add(n.saturating_mul(mapped as u64));
        if bytes > c.max_temp_bytes {
            return over(Limit::TempBytes, bytes, c.max_temp_bytes);
        }
        Ok(mapped)
    }

    /// A temporary buffer of at least `size` bytes for event `event`, which attachment `att`
    /// holds: (id, a descriptor of its memory file, its mapping in this process). The memory file
    /// is sized, not filled: its pages are allocated as they are written.
    pub(crate) fn new_temp(&self, att: u32, event: u32, size: usize) -> Result<(u32, OwnedFd, Arc<Mapping>), EtError> {
        let mut st = self.state();
        let mine = OWNER_ATTACHMENT + att;
        if event >= self.pool.layout.events || self.pool.owner(event).load(Ordering::Acquire) != mine {
            return Err(EtError::NotOwned { idx: event });
        }
        if st.temps.values().any(|t| t.event == event) {
            return Err(EtError::Refused(format!("event {event} has a large-event buffer already")));
        }
        let mapped = self.check_large(&st, att, 1, size)?;
        let fd = sys::memfd(&format!("daqflow-et-large/{}", self.config.name), mapped as u64)
            .map_err(|e| EtError::io("creating a large event", e))?;
        let map = Arc::new(Mapping::map_lazy(&fd, mapped).map_err(|e| EtError::io("mapping a large event", e))?);
        let dup = fd.try_clone().map_err(|e| EtError::io("duplicating a descriptor", e))?;
        st.next_temp = st.next_temp.wrapping_add(1).max(1);
        while st.temps.contains_key(&st.next_temp) {
            st.next_temp = st.next_temp.wrapping_add(1).max(1);
        }
        let id = st.next_temp;
        st.temp_bytes += mapped as u64;
        st.temps.insert(id, Temp { fd, map: map.clone(), event });
        Ok((id, dup, map))
    }

    pub(crate) fn temp(&self, id: u32) -> Result<(OwnedFd, Arc<Mapping>), EtError> {
        let st = self.state();
        let t = st.temps.get(&id).ok_or_else(|| EtError::Refused(format!("no large event buffer {id}")))?;
        Ok((t.fd.try_clone().map_err(|e| EtError::io("duplicating a descriptor", e))?, t.map.clone()))
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let st = self.state();
        let mut stations = Vec::new();
        let (queued, held) = self.pool.owner_counts();
        for &slot in std::iter::once(&0).chain(st.chain.iter()) {
            let Some(meta) = st.stations[slot as usize].as_ref() else { continue };
            let rec = self.pool.station(slot);
            stations.push(StationStatus {
                name: meta.name.clone(),
                group: (meta.group != 0).then_some(meta.group),
                config: self.pool.load_config(slot),
                closure: meta.closure.is_some(),
                queued: queued[slot as usize],
                events_in: rec.events_in.load(Ordering::Relaxed),
                events_out: rec.events_out.load(Ordering::Relaxed),
                attachments: rec.attachments.load(Ordering::Relaxed),
            });
        }
        let attachments = st
            .attachments
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                let m = m.as_ref()?;
                let a = self.pool.attachment(i as u32);
                Some(AttachmentStatus {
                    id: i as u32,
                    station: st.stations[m.station as usize].as_ref().map_or_else(String::new, |s| s.name.clone()),
                    pid: a.pid.load(Ordering::Relaxed),
                    remote: matches!(m.holder, Holder::Remote { .. }),
                    held: held.get(i).copied().unwrap_or(0),
                    got: a.got.load(Ordering::Relaxed),
                    put: a.put.load(Ordering::Relaxed),
                    dumped: a.dumped.load(Ordering::Relaxed),
                })
            })
            .collect();
        let in_transit = queued[self.pool.conductor_queue() as usize] + queued[self.pool.temp_queue() as usize];
        Snapshot {
            name: self.config.name.clone(),
            pid: sys::getpid(),
            events: self.pool.layout.events,
            event_size: self.pool.layout.event_size,
            free_events: queued[0],
            temp_events: st.temps.len() as u32,
            temp_bytes: st.temp_bytes,
            in_transit,
            stations,
            attachments,
            remote: self.remote_addr.lock().unwrap_or_else(|p| p.into_inner()).map(|a| a.to_string()),
            time_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        }
    }
}

/// Routing inside the ET process: shared-memory counters, and the closures it holds.
pub(crate) struct ProcessEnv<'a>(pub(crate) &'a SystemInner);

impl RouteEnv for ProcessEnv<'_> {
    fn prescale_tick(&self, slot: u32) -> u64 {
        self.0.pool.station(slot).prescale_counter.fetch_add(1, Ordering::Relaxed)
    }
    fn round_robin(&self, slot: u32) -> u64 {
        self.0.pool.station(slot).rr_counter.fetch_add(1, Ordering::Relaxed)
    }
    fn closure(&self, slot: u32, idx: u32) -> Option<bool> {
        let (f, temp) = {
            let st = self.0.state();
            let f = st.stations.get(slot as usize)?.as_ref()?.closure.clone()?;
            // SAFETY: the conductor holds the event while it routes it.
            let d = unsafe { *self.0.pool.desc(idx) };
            let temp = (d.flags & FLAG_TEMP != 0).then(|| st.temps.get(&d.temp_id).map(|t| t.map.clone())).flatten();
            (f, temp)
        };
        // SAFETY: the event is held by the ET process (the conductor) while the closure runs.
        let d = unsafe { *self.0.pool.desc(idx) };
        let (ptr, cap) = match &temp {
            Some(m) => (m.base(), m.len()),
            None => (self.0.pool.data(idx), self.0.pool.layout.event_size),
        };
        // SAFETY: as above; the buffer holds at least `cap` bytes and the length is clamped.
        let data = unsafe { std::slice::from_raw_parts(ptr, (d.len as usize).min(cap)) };
        let view = EventView {
            control: d.control,
            priority: if d.priority == 1 { Priority::High } else { Priority::Low },
            data,
        };
        Some(f(&view))
    }
}

/// The in-process backend: attachments made by the ET process itself.
pub(crate) struct InProcess {
    pub(crate) system: Arc<SystemInner>,
}

impl Backend for InProcess {
    fn pool(&self) -> &Pool {
        &self.system.pool
    }
    fn system_name(&self) -> &str {
        &self.system.config.name
    }
    fn admit_large(&self, att: u32, n: usize, size: usize) -> Result<(), EtError> {
        self.system.admit_large(att, n, size)
    }
    fn new_temp(&self, att: u32, event: u32, size: usize) -> Result<(u32, Arc<Mapping>), EtError> {
        self.system.new_temp(att, event, size).map(|(id, _fd, map)| (id, map))
    }
    fn temp(&self, id: u32) -> Result<Arc<Mapping>, EtError> {
        self.system.temp(id).map(|(_, m)| m)
    }
    fn detach(&self, att: u32, generation: u32) {
        self.system.detach(att, generation, false);
    }
    fn is_dead(&self) -> bool {
        self.system.stop.load(Ordering::Acquire)
    }
}

impl EtSystem {
    /// Creates the system: the shared memory, GrandCentral with every event, the control
    /// socket (by name, in the abstract namespace), and the threads that keep it running.
    pub fn create(config: SystemConfig) -> Result<EtSystem, EtError> {
        if config.name.is_empty() || config.name.len() > 100 || config.name.contains('/') {
            return Err(EtError::Refused(format!("{:?} cannot be an ET system name", config.name)));
        }
        if config.events == 0 || config.event_size == 0 {
            return Err(EtError::Refused("an ET system needs at least one event of at least one byte".into()));
        }
        if config.events > crate::pool::MAX_EVENTS {
            return Err(EtError::Refused(format!(
                "an ET system has at most {} events ({} asked)",
                crate::pool::MAX_EVENTS,
                config.events
            )));
        }
        if let Ok(allowed) = daqflow_wire::affinity::allowed() {
            for (key, cpus) in [("conductor_cpus", &config.conductor_cpus), ("server_cpus", &config.server_cpus)] {
                if let Some(Err(e)) = cpus.as_ref().map(|c| c.check_within(&allowed, "this process")) {
                    return Err(EtError::Refused(format!("`{key}` {e}")));
                }
            }
        }
        let max_stations = config.max_stations.clamp(2, MAX_STATIONS);
        let addr = ipc::address(&config.name).map_err(|e| EtError::io("naming the control socket", e))?;
        let listener = match UnixListener::bind_addr(&addr) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => return Err(EtError::NameTaken(config.name.clone())),
            Err(e) => return Err(EtError::io("binding the control socket", e)),
        };
        let layout = Layout::new(config.events, config.event_size, max_stations, config.max_attachments.max(1));
        let memfd = sys::memfd(&format!("daqflow-et-{}", config.name), layout.total as u64)
            .map_err(|e| EtError::io("creating shared memory", e))?;
        let map = Mapping::map(&memfd, layout.total).map_err(|e| EtError::io("mapping shared memory", e))?;
        let pool = Pool::create(map, layout, &config.name).map_err(|e| EtError::io("initializing shared memory", e))?;
        // GrandCentral: slot 0, holding every event.
        pool.set_station_name(0, GRAND_CENTRAL);
        pool.store_config(0, &StationConfig::default());
        pool.station(0).state.store(STATION_ACTIVE, Ordering::Release);
        let all: Vec<u32> = (0..config.events).collect();
        pool.queue(0).push(&all, Lane::Low, OWNER_SYSTEM);
        pool.header().state.store(1, Ordering::Release);
        let mut stations: Vec<Option<StationMeta>> = (0..MAX_STATIONS).map(|_| None).collect();
        stations[0] = Some(StationMeta { name: GRAND_CENTRAL.into(), group: 0, closure: None });
        let inner = Arc::new(SystemInner {
            pool,
            memfd,
            state: Mutex::new(State {
                stations,
                chain: Vec::new(),
                removed_at: HashMap::new(),
                next_group: 0,
                attachments: (0..config.max_attachments.max(1)).map(|_| None).collect(),
                temps: HashMap::new(),
                next_temp: 0,
                temp_bytes: 0,
            }),
            stop: AtomicBool::new(false),
            next_conn: AtomicU64::new(1),
            threads: Mutex::new(Vec::new()),
            remote_addr: Mutex::new(None),
            owner_uid: sys::geteuid(),
            config,
        });
        let mut threads = Vec::new();
        // Pinned as each thread's first act; the sets were checked against the process's
        // allowed set above, so a failure here is the OS's (logged, the thread runs unpinned).
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            let cpus = if name == "conductor" {
                inner.config.conductor_cpus.clone()
            } else {
                inner.config.server_cpus.clone()
            };
            let thread = format!("et-{name}");
            std::thread::Builder::new()
                .name(thread.clone())
                .spawn(move || {
                    if let Some(cpus) = cpus
                        && let Err(e) = daqflow_wire::affinity::pin_current_thread(&cpus)
                    {
                        tracing::warn!("{thread}: not pinned to CPUs {cpus}: {e}");
                    }
                    f()
                })
                .map_err(|e| EtError::io("starting a thread", e))
        };
        {
            let w = Arc::downgrade(&inner);
            threads.push(spawn("control", Box::new(move || control_server(w, listener)))?);
        }
        {
            let w = Arc::downgrade(&inner);
            threads.push(spawn("conductor", Box::new(move || conductor(w)))?);
        }
        {
            let w = Arc::downgrade(&inner);
            threads.push(spawn("large-events", Box::new(move || temp_reaper(w)))?);
        }
        {
            let w = Arc::downgrade(&inner);
            threads.push(spawn("watchdog", Box::new(move || watchdog(w)))?);
        }
        if let Some(addr) = inner.config.listen {
            let listener = crate::remote::server::bind(addr, &inner.config, &inner.pool.layout)?;
            *inner.remote_addr.lock().unwrap_or_else(|p| p.into_inner()) = Some(listener.local_addr());
            let w = Arc::downgrade(&inner);
            threads.push(spawn("remote", Box::new(move || crate::remote::server::serve(w, listener)))?);
        }
        if let Some(port) = inner.config.discovery_port {
            let sock = crate::remote::discovery::bind(port)?;
            let w = Arc::downgrade(&inner);
            threads.push(spawn("discovery", Box::new(move || crate::remote::discovery::answer(w, sock)))?);
        }
        *inner.threads.lock().unwrap_or_else(|p| p.into_inner()) = threads;
        tracing::info!(
            system = %inner.config.name,
            events = inner.config.events,
            event_size = inner.config.event_size,
            shared_memory_mb = layout.total as f64 / 1e6,
            "ET system started"
        );
        Ok(EtSystem { inner })
    }

    /// The system's name.
    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    /// The remote-access TCP address, if remote access is on.
    pub fn remote_addr(&self) -> Option<std::net::SocketAddr> {
        *self.inner.remote_addr.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a station; here, in the system's process, its selection may be a closure.
    pub fn create_station(&self, name: &str, config: StationConfig, position: Position) -> Result<(), EtError> {
        self.inner.create_station(name, config, position).map(|_| ())
    }

    /// Removes a station without attachments; its waiting events flow on.
    pub fn remove_station(&self, name: &str) -> Result<(), EtError> {
        self.inner.remove_station(name)
    }

    /// Changes a station's configuration while it runs.
    pub fn configure_station(&self, name: &str, config: StationConfig) -> Result<(), EtError> {
        self.inner.configure_station(name, config)
    }

    /// Attaches this process to a station (no socket involved).
    pub fn attach(&self, station: &str) -> Result<LocalAttachment, EtError> {
        let (att, slot, _) = self.inner.attach(station, Holder::InProcess)?;
        Ok(LocalAttachment::new(Arc::new(InProcess { system: self.inner.clone() }), att, slot, station.to_owned()))
    }

    /// The system's state now.
    pub fn snapshot(&self) -> Snapshot {
        self.inner.snapshot()
    }

    /// Waits until the system stops (`stop()` from another thread, or never).
    pub fn wait(&self) {
        while !self.inner.stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the system: attachments get errors, every thread ends, the memory is freed when
    /// the last process unmaps it.
    pub fn stop(&self) {
        if self.inner.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        self.inner.pool.header().state.store(2, Ordering::Release);
        for q in 0..self.inner.pool.layout.max_stations + 2 {
            self.inner.pool.queue(q).wake_all();
        }
        // Unblock the control socket's accept loop.
        if let Ok(addr) = ipc::address(&self.inner.config.name) {
            let _ = UnixStream::connect_addr(&addr);
        }
        if let Some(a) = *self.inner.remote_addr.lock().unwrap_or_else(|p| p.into_inner()) {
            let _ = std::net::TcpStream::connect_timeout(&a, Duration::from_millis(200));
        }
        let threads = std::mem::take(&mut *self.inner.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
        tracing::info!(system = %self.inner.config.name, "ET system stopped");
    }
}

impl Drop for EtSystem {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{Attachment, EtClient, Wait};

    fn system(test: &str, tweak: impl FnOnce(&mut SystemConfig)) -> EtSystem {
        let mut c = SystemConfig::new(format!("sys-{test}-{}", std::process::id()), 20, 1024);
        tweak(&mut c);
        EtSystem::create(c).unwrap()
    }

    /// Whether a thread of this process named `name` may run on `cpus` alone (other tests'
    /// systems have threads of the same names, unpinned).
    fn a_thread_pinned(name: &str, cpus: &str) -> bool {
        std::fs::read_dir("/proc/self/task").unwrap().flatten().any(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            comm.trim() == name
                && status
                    .lines()
                    .any(|l| l.starts_with("Cpus_allowed_list:") && l.split_whitespace().nth(1) == Some(cpus))
        })
    }

    #[test]
    fn the_conductor_and_the_serving_threads_are_pinned_to_their_roles_cpus() {
        use daqflow_wire::affinity::{CpuSet, allowed};
        let cpus = allowed().unwrap().cpus();
        let (first, last) = (CpuSet::single(cpus[0]).unwrap(), CpuSet::single(*cpus.last().unwrap()).unwrap());
        let s = system("pinned", |c| {
            c.conductor_cpus = Some(last.clone());
            c.server_cpus = Some(first.clone());
        });
        // The threads pin themselves first thing: wait for the kernel to show it.
        let deadline = Instant::now() + Duration::from_secs(10);
        // (Unpinned threads may run on every CPU: on a one-CPU machine this cannot tell.)
        while !a_thread_pinned("et-conductor", &last.to_string()) || !a_thread_pinned("et-control", &first.to_string())
        {
            assert!(Instant::now() < deadline, "the ET system's threads were not pinned");
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(s);
        // A CPU this process may not use: refused before anything is created.
        let mut c = SystemConfig::new(format!("sys-unpinnable-{}", std::process::id()), 20, 1024);
        c.conductor_cpus = Some(CpuSet::single(1000).unwrap());
        let Err(e) = EtSystem::create(c) else { panic!("a CPU outside the allowed set was taken") };
        assert!(
            e.to_string().contains("`conductor_cpus` names CPU 1000, outside the CPUs this process may use"),
            "{e}"
        );
    }

    /// A raw control connection that has said hello.
    fn raw(system: &EtSystem) -> UnixStream {
        let sock = UnixStream::connect_addr(&ipc::address(system.name()).unwrap()).unwrap();
        ipc::send(&sock, &Request::Hello { pid: 0 }, None).unwrap();
        let (r, fd) = ipc::recv::<Response>(&sock, ipc::MAX_RESPONSE).unwrap();
        assert!(matches!(r, Response::Hello { .. }) && fd.is_some());
        sock
    }

    fn ask(sock: &UnixStream, req: &Request) -> Response {
        ipc::send(sock, req, None).unwrap();
        ipc::recv::<Response>(sock, ipc::MAX_RESPONSE).unwrap().0
    }

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn only_the_owner_root_and_allowed_users_may_connect() {
        let s = system("uids", |c| c.allowed_uids = vec![4242]);
        let me = sys::geteuid();
        assert!(s.inner.accepts_uid(me));
        assert!(s.inner.accepts_uid(0), "root reads any memory anyway");
        assert!(s.inner.accepts_uid(4242));
        let stranger = if me == 65534 { 65533 } else { 65534 };
        assert!(!s.inner.accepts_uid(stranger));
    }

    #[test]
    fn a_large_event_buffer_is_made_only_for_an_event_its_attachment_holds_and_within_the_limits() {
        let s = system("temp-owner", |c| c.max_event_bytes = 1 << 20);
        let a = s.attach(GRAND_CENTRAL).unwrap();
        let b = s.attach(GRAND_CENTRAL).unwrap();
        let held = a.new_events(1, 10, Wait::NoWait).unwrap();
        let idx = held[0].index();
        assert!(matches!(s.inner.new_temp(b.id(), idx, 100_000), Err(EtError::NotOwned { .. })));
        assert!(matches!(s.inner.new_temp(a.id(), 20, 100_000), Err(EtError::NotOwned { idx: 20 })));
        assert!(matches!(
            s.inner.new_temp(a.id(), idx, 2 << 20),
            Err(EtError::OverLimit { limit: Limit::EventBytes, .. })
        ));
        assert!(matches!(
            s.inner.new_temp(a.id(), idx, usize::MAX),
            Err(EtError::OverLimit { limit: Limit::EventBytes, .. })
        ));
        assert_eq!(s.snapshot().temp_events, 0, "nothing made for the refused ones");
        s.inner.new_temp(a.id(), idx, 100_000).unwrap();
        assert!(matches!(s.inner.new_temp(a.id(), idx, 100_000), Err(EtError::Refused(_))), "one per event");
        assert_eq!((s.snapshot().temp_events, s.snapshot().temp_bytes), (1, 102_400));
    }

    #[test]
    fn large_event_buffers_take_memory_only_as_they_are_written() {
        let s = system("lazy", |_| {});
        let producer = s.attach(GRAND_CENTRAL).unwrap();
        let mut events = producer.new_events(2, 32 << 20, Wait::NoWait).unwrap();
        let allocated =
            || -> u64 { s.inner.state().temps.values().map(|t| sys::allocated_bytes(&t.fd).unwrap()).sum() };
        assert_eq!(s.snapshot().temp_bytes, 2 * (32 << 20));
        assert_eq!(allocated(), 0, "asking for 64 MiB of large events takes no memory");
        events[1].write(&vec![1u8; 1 << 20]).unwrap();
        let written = allocated();
        assert!((1 << 20..=2 << 20).contains(&written), "1 MiB written: {written} bytes allocated");
        producer.put_events(&mut events).unwrap();
        wait_until("the buffers freed", || s.snapshot().temp_events == 0);
        assert_eq!(s.snapshot().temp_bytes, 0);
    }

    #[test]
    fn a_buffer_no_event_names_is_freed_once_its_event_is_free_again() {
        let s = system("orphan", |_| {});
        let producer = s.attach(GRAND_CENTRAL).unwrap();
        let mut held = producer.new_events(1, 10, Wait::NoWait).unwrap();
        // As a process that died between asking for the buffer and marking its event large.
        s.inner.new_temp(producer.id(), held[0].index(), 100_000).unwrap();
        producer.dump_events(&mut held).unwrap();
        assert_eq!(s.snapshot().free_events, 20);
        wait_until("the buffer freed", || s.snapshot().temp_events == 0);
        assert_eq!(s.snapshot().temp_bytes, 0);
    }

    #[test]
    fn control_requests_before_hello_are_refused() {
        let s = system("no-hello", |_| {});
        let sock = UnixStream::connect_addr(&ipc::address(s.name()).unwrap()).unwrap();
        for req in [Request::Status, Request::Attach { station: GRAND_CENTRAL.into() }] {
            match ask(&sock, &req) {
                Response::Error(EtError::Protocol(m)) => assert!(m.contains("Hello"), "{m}"),
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        assert!(s.snapshot().attachments.is_empty());
    }

    #[test]
    fn a_control_request_longer_than_64_kib_closes_the_connection_unread() {
        let s = system("long", |_| {});
        let sock = raw(&s);
        let mut long = (ipc::MAX_REQUEST as u32 + 1).to_le_bytes().to_vec();
        long.extend_from_slice(b"{");
        sys::send_with_fd(&sock, &long, None).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut byte = [0u8; 1];
        let got = sys::recv_with_fd(&sock, &mut byte);
        // Closed with the rest of the request unread: end of stream, or a reset.
        let closed = |e: io::Error| matches!(e.kind(), io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset);
        assert!(got.is_err_and(closed), "closed without an answer");
        // The system serves others as before.
        let client = EtClient::connect(s.name()).unwrap();
        assert_eq!(client.snapshot().unwrap().events, 20);
    }

    #[test]
    fn large_event_requests_name_an_attachment_of_their_own_connection() {
        let s = system("their-own", |_| {});
        let client = EtClient::connect(s.name()).unwrap();
        let theirs = client.attach(GRAND_CENTRAL).unwrap();
        let sock = raw(&s);
        let requests = [
            Request::NewTemp { attachment: theirs.id(), event: 0, size: 100_000 },
            Request::AdmitLarge { attachment: theirs.id(), count: 1, size: 100_000 },
        ];
        for req in requests {
            match ask(&sock, &req) {
                Response::Error(EtError::Protocol(m)) => assert!(m.contains("no attachment"), "{m}"),
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        let Response::Attached { attachment, .. } = ask(&sock, &Request::Attach { station: GRAND_CENTRAL.into() })
        else {
            panic!("attach refused")
        };
        // Its own attachment, but an event it does not hold.
        match ask(&sock, &Request::NewTemp { attachment, event: 3, size: 100_000 }) {
            Response::Error(EtError::NotOwned { idx: 3 }) => {}
            other => panic!("expected a refusal, got {other:?}"),
        }
        match ask(&sock, &Request::AdmitLarge { attachment, count: 2, size: 1 << 30 }) {
            Response::Error(EtError::OverLimit { limit: Limit::EventBytes, .. }) => {}
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(s.snapshot().temp_events, 0);
    }

    #[test]
    fn a_stranger_is_told_why_and_gets_no_descriptor() {
        // A stand-in for a process of another user: the refusal itself, on a socket pair.
        let s = system("refuse", |_| {});
        let (ours, theirs) = UnixStream::pair().unwrap();
        refuse(&s.inner, ours, sys::PeerCred { pid: 1, uid: 65534 });
        let (r, fd) = ipc::recv::<Response>(&theirs, ipc::MAX_RESPONSE).unwrap();
        assert!(fd.is_none());
        match r {
            Response::Error(e @ EtError::AccessDenied { uid: 65534, .. }) => {
                assert!(e.to_string().contains("--allow-uid 65534"), "{e}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let mut byte = [0u8; 1];
        assert!(sys::recv_with_fd(&theirs, &mut byte).is_err(), "and the connection is closed");
    }
}
