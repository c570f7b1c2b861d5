//! Events as users handle them.

use std::marker::PhantomData;

use crate::config::Priority;

/// Where an event's bytes are.
pub(crate) enum Data {
    /// In shared memory (the pool, or a temporary buffer the attachment keeps mapped).
    Shared(*mut u8),
    /// A copy (remote attachments): the bytes received, copied on the first write.
    Remote { received: bytes::Bytes, owned: Option<Vec<u8>> },
}

/// An event an attachment handed out: fill it (producer) or read it (consumer), then put it
/// back. It borrows the attachment it came from and cannot outlive it.
pub struct Event<'a> {
    pub(crate) idx: u32,
    pub(crate) len: usize,
    pub(crate) cap: usize,
    pub(crate) control: [i32; 4],
    pub(crate) priority: Priority,
    pub(crate) corrupt: bool,
    pub(crate) temp_id: u32,
    pub(crate) data: Data,
    /// The header (length, control, priority) changed.
    pub(crate) dirty_header: bool,
    /// The data changed (remote: must be sent back).
    pub(crate) dirty_data: bool,
    /// The attachment that owns it.
    pub(crate) att: u32,
    pub(crate) _life: PhantomData<&'a ()>,
}

// SAFETY: an event is owned by exactly one attachment at a time (the ET ownership protocol):
// no other thread or process touches its memory while it is held, so moving the handle to
// another thread is sound.
unsafe impl Send for Event<'_> {}

impl std::fmt::Debug for Event<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("index", &self.idx)
            .field("len", &self.len)
            .field("control", &self.control)
            .field("priority", &self.priority)
            .finish()
    }
}

impl Event<'_> {
    /// The event's index in the pool (stable for the event's life in the system).
    pub fn index(&self) -> u32 {
        self.idx
    }

    /// The length of its data.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no data.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most data it can hold.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Its data (`len` bytes).
    pub fn data(&self) -> &[u8] {
        match &self.data {
            // SAFETY: the buffer has `cap >= len` bytes and is owned by this event's attachment
            // (nobody else touches it) for as long as the event lives.
            Data::Shared(p) => unsafe { std::slice::from_raw_parts(*p, self.len) },
            Data::Remote { received, owned: None } => &received[..self.len.min(received.len())],
            Data::Remote { owned: Some(v), .. } => &v[..self.len.min(v.len())],
        }
    }

    /// Its whole buffer (`capacity` bytes), to write into; then set the length.
    pub fn buffer_mut(&mut self) -> &mut [u8] {
        self.dirty_data = true;
        match &mut self.data {
            // SAFETY: as in `data`, with exclusive access through `&mut self`.
            Data::Shared(p) => unsafe { std::slice::from_raw_parts_mut(*p, self.cap) },
            Data::Remote { received, owned } => {
                let v = owned.get_or_insert_with(|| received.to_vec());
                if v.len() < self.cap {
                    v.resize(self.cap, 0);
                }
                v
            }
        }
    }

    /// Sets the length of its data (at most the capacity).
    pub fn set_len(&mut self, len: usize) -> Result<(), crate::EtError> {
        if len > self.cap {
            return Err(crate::EtError::Refused(format!("length {len} exceeds the event's capacity {}", self.cap)));
        }
        if len != self.len {
            self.len = len;
            self.dirty_header = true;
        }
        Ok(())
    }

    /// Copies `data` into the event and sets its length.
    pub fn write(&mut self, data: &[u8]) -> Result<(), crate::EtError> {
        if data.len() > self.cap {
            return Err(crate::EtError::Refused(format!(
                "{} bytes exceed the event's capacity {}",
                data.len(),
                self.cap
            )));
        }
        match &mut self.data {
            Data::Shared(_) => crate::copy::copy_into(self.buffer_mut(), data),
            // A remote event keeps just the bytes written (not a capacity-sized buffer).
            Data::Remote { owned, .. } => {
                self.dirty_data = true;
                let v = owned.get_or_insert_with(Vec::new);
                v.clear();
                v.extend_from_slice(data);
            }
        }
        self.set_len(data.len())
    }

    /// A remote event's data (`len` bytes, zeros where never written), without a copy
    /// where possible.
    pub(crate) fn into_remote_bytes(self) -> bytes::Bytes {
        let len = self.len;
        match self.data {
            Data::Remote { owned: Some(mut v), .. } => {
                v.resize(len, 0);
                bytes::Bytes::from(v)
            }
            Data::Remote { received, owned: None } if received.len() >= len => received.slice(..len),
            Data::Remote { received, owned: None } => {
                let mut v = received.to_vec();
                v.resize(len, 0);
                bytes::Bytes::from(v)
            }
            // SAFETY: as in `data`.
            Data::Shared(p) => bytes::Bytes::copy_from_slice(unsafe { std::slice::from_raw_parts(p, len) }),
        }
    }

    /// The control integers (set by producers, used by station selection).
    pub fn control(&self) -> [i32; 4] {
        self.control
    }

    /// Sets the control integers.
    pub fn set_control(&mut self, control: [i32; 4]) {
        self.control = control;
        self.dirty_header = true;
    }

    /// The priority.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// Sets the priority.
    pub fn set_priority(&mut self, p: Priority) {
        self.priority = p;
        self.dirty_header = true;
    }

    /// Whether the event was recovered from an attachment that died while holding it: its
    /// data may be half written.
    pub fn is_possibly_corrupt(&self) -> bool {
        self.corrupt
    }

    /// Whether it lives in a temporary buffer (it is larger than the pool's event size).
    pub fn is_large(&self) -> bool {
        self.temp_id != 0
    }
}

/// An attachment to a station: the same calls for a process on the ET system's machine (shared
/// memory, no copy) and for one elsewhere (TCP, events copied in batches). Every call takes and
/// returns batches.
pub trait Attachment {
    /// The station attached to.
    fn station(&self) -> &str;

    /// Up to `n` new events of at least `size` bytes from GrandCentral, to fill and put
    /// (producers; an attachment to any station may produce). Larger than the pool's event size
    /// gets a temporary buffer. Appends to `out`; returns how many.
    fn new_events_into<'a>(
        &'a self,
        n: usize,
        size: usize,
        wait: crate::Wait,
        out: &mut Vec<Event<'a>>,
    ) -> Result<usize, crate::EtError>;

    /// Up to `n` events from the station's input list (consumers). Appends to `out`; returns
    /// how many (0 only with `Wait::NoWait`).
    fn get_events_into<'a>(
        &'a self,
        n: usize,
        wait: crate::Wait,
        out: &mut Vec<Event<'a>>,
    ) -> Result<usize, crate::EtError>;

    /// Hands events on to the next stations. Drains `events`.
    fn put_events<'a>(&'a self, events: &mut Vec<Event<'a>>) -> Result<(), crate::EtError>;

    /// Returns events straight to GrandCentral. Drains `events`.
    fn dump_events<'a>(&'a self, events: &mut Vec<Event<'a>>) -> Result<(), crate::EtError>;

    /// [`Attachment::new_events_into`] returning a new vector.
    fn new_events(&self, n: usize, size: usize, wait: crate::Wait) -> Result<Vec<Event<'_>>, crate::EtError> {
        let mut v = Vec::with_capacity(n.min(1024));
        self.new_events_into(n, size, wait, &mut v)?;
        Ok(v)
    }

    /// [`Attachment::get_events_into`] returning a new vector.
    fn get_events(&self, n: usize, wait: crate::Wait) -> Result<Vec<Event<'_>>, crate::EtError> {
        let mut v = Vec::with_capacity(n.min(1024));
        self.get_events_into(n, wait, &mut v)?;
        Ok(v)
    }
}
