//! # daqflow-wire: the binary formats of daqflow
//!
//! Everything daqflow puts on a wire or on a disk, with no network I/O inside:
//!
//! - [`Fragment`]: the data of one event from one source (a front-end stream), with a CRC32C of
//!   its payload. A [`SuperFragment`] is a readout unit's fragments of one event; an [`Event`] is
//!   the builder unit's header followed by the super-fragments of every readout unit (the CMS
//!   event builder's two-step building, see "Performance of the CMS Event Builder", 2017, and
//!   `docs/architecture.md`).
//! - [`frame`]: the framing of every TCP protocol (length, kind, flags, channel, payload);
//!   [`kinds`]: the registry that gives every protocol a range of frame kinds of its own;
//!   [`codec`]: the reader and writer every protocol encodes and decodes its payloads with.
//! - [`file`](mod@file): the data file format, a [`FileWriter`](file::FileWriter) that rotates by size and a
//!   [`FileReader`](file::FileReader) that verifies every CRC and recovers files cut short.
//! - [`crc`]: CRC32C, hardware accelerated.
//! - [`affinity`]: core pinning, a typed [`CpuSet`](affinity::CpuSet) and the OS's affinity
//!   call (the one place a process or a thread is pinned).
//! - [`sink`]: [`EventSink`](sink::EventSink), where a builder's events go (data files, an ET
//!   system, nothing).
//!
//! All integers are little-endian; every header is a fixed size, 8-byte aligned, and starts with
//! a magic number and a version. Views over [`bytes::Bytes`] hand out payloads without copying.
//! Decoding never panics: every malformed input is a typed error. The byte layouts are in
//! `docs/formats.md`.
//!
//! ```
//! use daqflow_wire::*;
//!
//! // Two sources produce fragments of event 42; readout unit 0 packs them.
//! let fragments: Vec<Fragment> = [10u32, 11]
//!     .iter()
//!     .map(|&source_id| {
//!         let info = FragmentInfo { source_id, event_id: EventId(42), run_number: 7, ..Default::default() };
//!         Fragment::parse(Fragment::encode(&info, b"adc counts")).unwrap()
//!     })
//!     .collect();
//! let sf = SuperFragment::parse(SuperFragment::assemble(0, EventId(42), SuperFragmentFlags::default(), &fragments)).unwrap();
//!
//! // Builder unit 3 builds the event and checks it.
//! let info = EventInfo { bu_id: 3, event_id: EventId(42), run_number: 7, ..Default::default() };
//! let event = Event::parse(Event::assemble(&info, &[sf])).unwrap();
//! assert!(event.check().unwrap().is_clean());
//! for sf in event.super_fragments() {
//!     for fragment in sf.unwrap().fragments() {
//!         assert_eq!(&fragment.unwrap().payload()[..], b"adc counts");
//!     }
//! }
//! ```
#![warn(missing_docs)]

pub mod affinity;
pub mod codec;
pub mod crc;
mod error;
mod event;
pub mod file;
mod fragment;
pub mod frame;
mod header;
pub mod kinds;
mod le;
pub mod sink;
mod super_fragment;

pub use error::{CrcMismatch, DecodeError};
pub use event::{
    EVENT_HEADER_LEN, EVENT_MAGIC, EVENT_VERSION, Event, EventCheck, EventFlags, EventHeader, EventInfo, SuperFragments,
};
pub use fragment::{
    FRAGMENT_HEADER_LEN, FRAGMENT_MAGIC, FRAGMENT_VERSION, Fragment, FragmentFlags, FragmentHeader, FragmentInfo,
    MAX_FRAGMENT_PAYLOAD,
};
pub use frame::{Frame, FrameCodec, FrameError, FrameHeader};
pub use header::Counted;
pub use le::pad8;
pub use super_fragment::{
    Fragments, SUPER_FRAGMENT_HEADER_LEN, SUPER_FRAGMENT_MAGIC, SUPER_FRAGMENT_VERSION, SuperFragment,
    SuperFragmentFlags, SuperFragmentHeader,
};

/// The number of an event (a level-1 trigger), unique within a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EventId(pub u64);

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<u64> for EventId {
    fn from(v: u64) -> Self {
        EventId(v)
    }
}
