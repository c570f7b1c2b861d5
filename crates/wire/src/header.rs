//! Checks shared by the headers that start with a `u32` magic, a `u16` version and a `u16`
//! header length (fragment, super-fragment, event).

use crate::error::DecodeError;
use crate::le::{head, u16_at, u32_at};

/// The first `N` bytes of `data` as a header of `what`, once its magic, version and header
/// length are checked.
pub(crate) fn checked_header<'a, const N: usize>(
    data: &'a [u8],
    what: &'static str,
    magic: u32,
    version: u16,
) -> Result<&'a [u8; N], DecodeError> {
    let h: &[u8; N] = head(data).ok_or(DecodeError::Short { what, need: N as u64, have: data.len() as u64 })?;
    let found = u32_at(h, 0);
    if found != magic {
        return Err(DecodeError::BadMagic { what, found, expected: magic });
    }
    let found = u16_at(h, 4);
    if found != version {
        return Err(DecodeError::UnsupportedVersion { what, found, supported: version });
    }
    let header_len = u16_at(h, 6) as usize;
    if header_len != N {
        return Err(DecodeError::BadHeaderLength { what, found: header_len as u64, expected: N as u64 });
    }
    Ok(h)
}

/// Iterator over `count` structures packed back to back in `rest` (the fragments of a
/// super-fragment, the super-fragments of an event). It yields an error, and then ends, if a
/// structure is malformed, if the bytes run out before `count`, or if bytes are left after it.
#[derive(Debug, Clone)]
pub struct Counted<T> {
    rest: bytes::Bytes,
    remaining: u32,
    failed: bool,
    container: &'static str,
    parse: fn(bytes::Bytes) -> Result<(T, bytes::Bytes), DecodeError>,
}

impl<T> Counted<T> {
    pub(crate) fn new(
        rest: bytes::Bytes,
        count: u32,
        container: &'static str,
        parse: fn(bytes::Bytes) -> Result<(T, bytes::Bytes), DecodeError>,
    ) -> Self {
        Counted { rest, remaining: count, failed: false, container, parse }
    }

    fn fail(&mut self, detail: String) -> Option<Result<T, DecodeError>> {
        self.failed = true;
        Some(Err(DecodeError::Inconsistent { what: self.container, detail }))
    }
}

impl<T> Iterator for Counted<T> {
    type Item = Result<T, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match (self.remaining, self.rest.is_empty()) {
            (0, true) => None,
            (0, false) => self.fail(format!("{} bytes follow the last counted part", self.rest.len())),
            (n, true) => self.fail(format!("ends with {n} of its counted parts missing")),
            (_, false) => match (self.parse)(std::mem::take(&mut self.rest)) {
                Ok((item, rest)) => {
                    self.rest = rest;
                    self.remaining -= 1;
                    Some(Ok(item))
                }
                Err(e) => {
                    self.failed = true;
                    Some(Err(e))
                }
            },
        }
    }
}
