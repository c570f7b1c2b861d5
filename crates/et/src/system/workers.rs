//! The ET process's own threads besides the control socket: the conductor (events sent to
//! closure stations, whose closures live in this process), the reaper of large events' buffers,
//! and the watchdog (dead attachments recovered, idle stations flushed).

use super::*;

/// Serves one of the system's own queues until the system stops: takes up to 256 events at a
/// time (waking at least every 200 ms to notice a stop) and hands them to `handle`.
pub(super) fn serve_system_queue(system: Weak<SystemInner>, queue: fn(&Pool) -> u32, handle: fn(&SystemInner, &[u32])) {
    let mut idx = Vec::new();
    loop {
        let Some(s) = system.upgrade() else { return };
        let q = queue(&s.pool);
        idx.clear();
        let stop = || s.stop.load(Ordering::Acquire);
        let got = s.pool.queue(q).pop(
            256,
            &mut idx,
            Block::Until(Some(Instant::now() + Duration::from_millis(200))),
            OWNER_SYSTEM,
            &stop,
        );
        if stop() {
            return;
        }
        if got.is_ok() {
            handle(&s, &idx);
        }
    }
}

/// Routes events sent to closure stations: the closures live in this process.
pub(super) fn conductor(system: Weak<SystemInner>) {
    serve_system_queue(system, Pool::conductor_queue, |s, idx| {
        for &i in idx {
            let batch = s.held_batch(&[i], false);
            // SAFETY: the conductor holds the event.
            let from = unsafe { (*s.pool.desc(i)).route_from } as usize;
            route_and_push(&s.pool, 0, Some(from), &batch, &ProcessEnv(s), OWNER_SYSTEM);
        }
    })
}

/// Frees the buffers of large events that came back to GrandCentral.
pub(super) fn temp_reaper(system: Weak<SystemInner>) {
    serve_system_queue(system, Pool::temp_queue, |s, idx| {
        {
            let mut st = s.state();
            for &i in idx {
                // SAFETY: the reaper holds the event.
                let d = unsafe { &mut *s.pool.desc(i) };
                st.remove_temp(d.temp_id);
                d.temp_id = 0;
                d.flags &= !FLAG_TEMP;
            }
        }
        s.pool.queue(0).push(idx, Lane::Low, OWNER_SYSTEM);
    })
}

/// Heartbeat of the system; liveness of the attachments; stragglers in removed stations.
pub(super) fn watchdog(system: Weak<SystemInner>) {
    let me = sys::getpid();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let Some(s) = system.upgrade() else { return };
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        s.pool.header().heartbeat.fetch_add(1, Ordering::Release);
        let timeout = s.config.heartbeat_timeout;
        let mut dead = Vec::new();
        let mut stuck = Vec::new();
        {
            let mut st = s.state();
            for (i, m) in st.attachments.iter_mut().enumerate() {
                let Some(m) = m else { continue };
                let beat = s.pool.attachment(i as u32).heartbeat.load(Ordering::Acquire);
                if beat != m.last_beat {
                    m.last_beat = beat;
                    m.last_change = Instant::now();
                }
                match m.holder {
                    Holder::Local { pid, .. } if pid != me => {
                        if !sys::pid_alive(pid) {
                            dead.push((i as u32, m.generation));
                        } else if m.last_change.elapsed() > timeout {
                            stuck.push((i as u32, pid));
                        }
                    }
                    Holder::Remote { .. } if m.last_change.elapsed() > timeout => dead.push((i as u32, m.generation)),
                    _ => {}
                }
            }
        }
        for (att, pid) in stuck {
            // A stopped process may hold a queue lock that everyone needs: it is killed, and its
            // events come back through the usual recovery when its connection closes.
            tracing::warn!(system = %s.config.name, attachment = att, pid, "attachment's process stopped heartbeating; killing it");
            sys::kill(pid);
        }
        // By generation: a slot that its connection freed and a new holder took since the
        // scan above is not this dead attachment any more.
        for (att, generation) in dead {
            s.detach(att, generation, true);
        }
        s.sweep_temps();
        // Events pushed into a station removed, or left by its last attachment, under a
        // putter's feet flow on.
        for slot in 1..s.pool.layout.max_stations {
            let rec = s.pool.station(slot);
            if s.pool.queue(slot).len_bound() == 0 {
                continue;
            }
            match rec.state.load(Ordering::Acquire) {
                STATION_FREE => s.drain_station(slot),
                STATION_ACTIVE if rec.attachments.load(Ordering::Acquire) == 0 => s.flush_idle(slot),
                _ => {}
            }
        }
    }
}
