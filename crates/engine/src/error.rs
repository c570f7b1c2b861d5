//! The engine's error types, one per operation.

/// What a task's `action` returns when it fails: any error, with its cause chain.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A scheduler could not start, or stopped because of an error.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// A task's action failed; the scheduler stops at once and reports which task and why.
    #[error("task `{task}` of scheduler `{scheduler}` failed: {source}")]
    Task {
        /// The scheduler's name.
        scheduler: String,
        /// The failing task's name.
        task: String,
        /// What the task reported.
        #[source]
        source: BoxError,
    },
    /// A task panicked: the scheduler thread is gone.
    #[error("scheduler `{scheduler}` panicked: {message}")]
    Panicked {
        /// The scheduler's name.
        scheduler: String,
        /// The panic message.
        message: String,
    },
    /// The operating system refused to create the thread.
    #[error("cannot start the thread of scheduler `{scheduler}`: {source}")]
    Thread {
        /// The scheduler's name.
        scheduler: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Pinning to the requested CPUs failed (outside the process's allowed set, beyond what
    /// the affinity call takes, or not supported on this platform).
    #[error("cannot pin scheduler `{scheduler}` to CPUs {cpus}: {reason}")]
    Pin {
        /// The scheduler's name.
        scheduler: String,
        /// The CPUs asked for (the kernel's list form).
        cpus: String,
        /// Why ([`daqflow_wire::affinity::PinError`] in words).
        reason: String,
    },
}

/// The event manager could not store a fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InsertError {
    /// Not enough free pages (or fragment slots) now: retry after fragments were removed. An
    /// input task's `poll` checks [`EventManager::has_room`](crate::EventManager::has_room) first
    /// so this is back-pressure, not loss.
    #[error("event manager full: {needed} pages needed, {free} free")]
    Full {
        /// Pages the fragment needs.
        needed: usize,
        /// Pages free.
        free: usize,
    },
    /// The fragment is larger than a page and than the budget for large fragments: it can never
    /// be stored. Configure larger pages or a larger `large_bytes`.
    #[error(
        "fragment of {len} bytes exceeds the page size ({page_size} B) and the large-fragment budget ({large_bytes} B)"
    )]
    TooLarge {
        /// The fragment's length.
        len: usize,
        /// The page size.
        page_size: usize,
        /// The budget for fragments larger than a page.
        large_bytes: usize,
    },
}

/// A data control message could not be decoded. The sender cannot be trusted: close its link.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// The frame's kind is not a data control message.
    #[error("frame kind {0} is not a data control message")]
    UnknownKind(u16),
    /// The payload's length does not match its count of entries.
    #[error("{kind} message: payload of {len} bytes does not hold {count} entries of {entry} bytes")]
    BadLength {
        /// The message kind's name.
        kind: &'static str,
        /// The payload length.
        len: usize,
        /// The count in the payload.
        count: u32,
        /// Bytes per entry.
        entry: usize,
    },
}

/// A profile dump could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Reading or writing the file failed.
    #[error("profile file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a daqflow profile, or is damaged.
    #[error("profile file {path}: {reason}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// A configuration (of an event manager, of the test bed) cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A size or count is zero or too large; the message names the key.
    #[error("{0}")]
    Invalid(String),
}
