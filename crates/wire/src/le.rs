//! Little-endian field access on fixed-size header arrays. Offsets are constants of the format,
//! so indexing cannot go out of bounds for the header sizes used in this crate.

#[inline]
pub(crate) fn u16_at<const N: usize>(h: &[u8; N], at: usize) -> u16 {
    u16::from_le_bytes([h[at], h[at + 1]])
}

#[inline]
pub(crate) fn u32_at<const N: usize>(h: &[u8; N], at: usize) -> u32 {
    u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]])
}

#[inline]
pub(crate) fn u64_at<const N: usize>(h: &[u8; N], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[at..at + 8]);
    u64::from_le_bytes(b)
}

#[inline]
pub(crate) fn put_u16<const N: usize>(h: &mut [u8; N], at: usize, v: u16) {
    h[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub(crate) fn put_u32<const N: usize>(h: &mut [u8; N], at: usize, v: u32) {
    h[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub(crate) fn put_u64<const N: usize>(h: &mut [u8; N], at: usize, v: u64) {
    h[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The first `N` bytes of `data` as an array, or `None` when `data` is shorter.
#[inline]
pub(crate) fn head<const N: usize>(data: &[u8]) -> Option<&[u8; N]> {
    data.first_chunk::<N>()
}

/// `len` rounded up to the next multiple of 8.
#[inline]
pub const fn pad8(len: usize) -> usize {
    (len + 7) & !7
}
