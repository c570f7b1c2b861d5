//! Copying event data into the pool.
//!
//! Large events are written with non-temporal (streaming) stores: the bytes go to memory
//! without first reading each destination cache line into this core's cache (the "read for
//! ownership" an ordinary store does) and without evicting the writer's working data. A
//! producer hands its events to other processes, so keeping them in its own cache buys
//! nothing; over a pool larger than the cache the streaming copy moves about twice the bytes
//! per second of the platform `memcpy` (`daqflow bench et`, `docs/performance.md`). Small
//! events, which stay in cache for their consumer, use `memcpy`.

/// Writes of at least this many bytes stream (below it, `memcpy` into cache wins).
pub(crate) const STREAM_MIN: usize = 32 * 1024;

/// Copies `src` into the start of `dst` (which must be at least as long; panics otherwise), as
/// [`Event::write`](crate::Event::write) does: streaming stores from 32 KiB up on x86-64,
/// `memcpy` below. For data handed to another process or core that this one will not read
/// again.
///
/// ```
/// let mut dst = vec![0u8; 100_000];
/// daqflow_et::copy_into(&mut dst, &[7u8; 65_536]);
/// assert!(dst[..65_536].iter().all(|&b| b == 7) && dst[65_536] == 0);
/// ```
pub fn copy_into(dst: &mut [u8], src: &[u8]) {
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    if src.len() >= STREAM_MIN {
        // SAFETY: `dst` and `src` are valid for `src.len()` bytes (same length, checked by the
        // slicing above) and cannot overlap (`dst` is borrowed mutably).
        unsafe { stream_copy(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
        return;
    }
    dst.copy_from_slice(src);
}

/// Copies with SSE2 streaming stores (SSE2 is part of every x86-64 CPU).
///
/// # Safety
/// `dst` and `src` must be valid for `len` bytes and must not overlap.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // Ordinary copy up to a 16-byte aligned destination, streaming 64 bytes at a time, then
    // the tail.
    let head = ((16 - (dst as usize & 15)) & 15).min(len);
    // SAFETY: `head <= len`, for which the caller guarantees both pointers valid and disjoint.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    while i + 64 <= len {
        // SAFETY: `i + 64 <= len`, so every access is inside both buffers; `dst + i` is 16-byte
        // aligned (i starts at the aligning `head` and grows by 64), as `_mm_stream_si128`
        // requires; the loads are unaligned loads.
        unsafe {
            let a = _mm_loadu_si128(src.add(i).cast::<__m128i>());
            let b = _mm_loadu_si128(src.add(i + 16).cast::<__m128i>());
            let c = _mm_loadu_si128(src.add(i + 32).cast::<__m128i>());
            let d = _mm_loadu_si128(src.add(i + 48).cast::<__m128i>());
            _mm_stream_si128(dst.add(i).cast::<__m128i>(), a);
            _mm_stream_si128(dst.add(i + 16).cast::<__m128i>(), b);
            _mm_stream_si128(dst.add(i + 32).cast::<__m128i>(), c);
            _mm_stream_si128(dst.add(i + 48).cast::<__m128i>(), d);
        }
        i += 64;
    }
    // SAFETY: `i <= len`: the tail is inside both buffers.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i) };
    // Streaming stores are weakly ordered: fence them before the event is handed on (the
    // queue's lock release then publishes them to the consumer).
    // SAFETY: `sfence` has no preconditions.
    unsafe { _mm_sfence() };
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        /// Every length (around and above the streaming threshold) and every alignment of
        /// either side copies exactly the bytes, and nothing past them.
        #[test]
        fn copies_exactly(len in 0usize..(STREAM_MIN * 3), dst_off in 0usize..64, src_off in 0usize..64, seed: u8) {
            let len = if len % 3 == 0 { STREAM_MIN + len % 200 } else { len };
            let src: Vec<u8> = (0..len + src_off).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect();
            let mut dst = vec![0xAAu8; len + dst_off + 32];
            copy_into(&mut dst[dst_off..], &src[src_off..]);
            prop_assert!(dst[..dst_off].iter().all(|&b| b == 0xAA));
            prop_assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..]);
            prop_assert!(dst[dst_off + len..].iter().all(|&b| b == 0xAA));
        }
    }
}
