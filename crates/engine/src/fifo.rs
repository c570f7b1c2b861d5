//! Software FIFOs between tasks and between schedulers: bounded, lock-free,
//! single-producer/single-consumer queues with batch (chunk) operations.
//!
//! These are [`rtrb`]'s ring buffers, re-exported: a well-kept crate that does exactly this
//! (cache-padded head and tail, cached indices so a push or pop touches the other side's cache
//! line only when the cached view runs out). `daqflow bench engine` measures it in the ROB loop.
//!
//! A consumer task polls `!consumer.is_empty()` (or `slots() >= n`); a producer task polls
//! `producer.slots() > 0` — a full FIFO is back-pressure: the producing task simply does not run.
//! Across schedulers, give the producer the consumer scheduler's [`Waker`](crate::Waker) and call
//! it after a push so a parked consumer wakes at once.
//!
//! ```
//! let (mut tx, mut rx) = daqflow_engine::fifo::<u64>(4);
//! tx.push_entire_slice(&[1, 2, 3]).unwrap();
//! assert_eq!(tx.slots(), 1);
//! let chunk = rx.read_chunk(3).unwrap();
//! assert_eq!(chunk.into_iter().collect::<Vec<_>>(), vec![1, 2, 3]);
//! ```

pub use rtrb::chunks::ChunkError;
pub use rtrb::{Consumer, PopError, Producer, PushError, RingBuffer};

/// A FIFO of `capacity` slots: the producer and the consumer end.
pub fn fifo<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    RingBuffer::new(capacity)
}
