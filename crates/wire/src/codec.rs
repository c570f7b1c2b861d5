//! Writing and reading the payloads of protocol messages: little-endian integers, text with a
//! `u16` length, counted lists whose count is checked against the bytes left before anything
//! is allocated. Every daqflow protocol encodes and decodes its messages with these, so that
//! they all refuse short, long or malformed payloads the same way, with an error that names the
//! message and the field, and never panic.
//!
//! ```
//! use daqflow_wire::codec::{CodecError, Reader, Writer};
//! let mut w = Writer::new();
//! w.u32(7);
//! w.text("ru-1");
//! w.count(2);
//! w.u64(10);
//! w.u64(11);
//! let bytes = w.finish();
//!
//! let mut r = Reader::new("example", &bytes);
//! assert_eq!(r.u32("id")?, 7);
//! assert_eq!(r.text("name")?, "ru-1");
//! let n = r.count(8, "events")?;
//! let events: Vec<u64> = (0..n).map(|_| r.u64("event")).collect::<Result<_, _>>()?;
//! assert_eq!(events, [10, 11]);
//! r.finish()?;
//!
//! // A count larger than what follows is refused before anything is allocated.
//! let mut r = Reader::new("example", &[255, 255, 255, 255]);
//! assert!(matches!(r.count(8, "events"), Err(CodecError::Short { field: "events", .. })));
//! # Ok::<(), CodecError>(())
//! ```

use bytes::{BufMut, Bytes, BytesMut};

/// A payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The payload ends before a field (or before the entries a count announces).
    #[error("{what}: the payload ends inside `{field}` ({need} bytes needed, {have} present)")]
    Short {
        /// The message.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// Bytes the payload would need.
        need: usize,
        /// Bytes it has.
        have: usize,
    },
    /// Bytes are left after the last field.
    #[error("{what}: {extra} bytes after the last field")]
    Trailing {
        /// The message.
        what: &'static str,
        /// How many.
        extra: usize,
    },
    /// A text field is not UTF-8.
    #[error("{what}: `{field}` is not UTF-8")]
    NotUtf8 {
        /// The message.
        what: &'static str,
        /// The field.
        field: &'static str,
    },
    /// A field has a value the protocol does not define.
    #[error("{what}: `{field}` has the undefined value {value}")]
    BadValue {
        /// The message.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// The value.
        value: u64,
    },
}

/// Writes a payload. Integers are little-endian.
#[derive(Debug, Default)]
pub struct Writer {
    buf: BytesMut,
}

impl Writer {
    /// An empty payload.
    pub fn new() -> Writer {
        Writer::default()
    }

    /// An empty payload with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Writer {
        Writer { buf: BytesMut::with_capacity(n) }
    }

    /// One byte.
    pub fn u8(&mut self, v: u8) {
        self.buf.put_u8(v);
    }

    /// A `u16`.
    pub fn u16(&mut self, v: u16) {
        self.buf.put_u16_le(v);
    }

    /// A `u32`.
    pub fn u32(&mut self, v: u32) {
        self.buf.put_u32_le(v);
    }

    /// An `i32`.
    pub fn i32(&mut self, v: i32) {
        self.buf.put_i32_le(v);
    }

    /// A `u64`.
    pub fn u64(&mut self, v: u64) {
        self.buf.put_u64_le(v);
    }

    /// Bytes as they are (a fixed-size field, or the rest of the payload).
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.put_slice(b);
    }

    /// `n` zero bytes (reserved fields).
    pub fn zeros(&mut self, n: usize) {
        self.buf.put_bytes(0, n);
    }

    /// Text: a `u16` length and that many bytes of UTF-8. Longer text is cut at 65 535 bytes, at
    /// a character boundary (it stays UTF-8).
    pub fn text(&mut self, s: &str) {
        let mut end = s.len().min(u16::MAX as usize);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.buf.put_u16_le(end as u16);
        self.buf.put_slice(&s.as_bytes()[..end]);
    }

    /// Text with a `u8` length (at most 255 bytes, cut at a character boundary).
    pub fn short_text(&mut self, s: &str) {
        let mut end = s.len().min(u8::MAX as usize);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.buf.put_u8(end as u8);
        self.buf.put_slice(&s.as_bytes()[..end]);
    }

    /// The `u32` count of the entries that follow.
    ///
    /// # Panics
    /// With 2³² entries or more, which no payload can carry.
    pub fn count(&mut self, n: usize) {
        self.buf.put_u32_le(u32::try_from(n).expect("a count of 2^32 entries or more"));
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The payload.
    pub fn finish(self) -> Bytes {
        self.buf.freeze()
    }
}

/// Reads a payload field by field; every read checks the bytes left first.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    what: &'static str,
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader of the payload of message `what` (named in errors).
    pub fn new(what: &'static str, data: &'a [u8]) -> Reader<'a> {
        Reader { what, data, at: 0 }
    }

    fn short(&self, field: &'static str, n: usize) -> CodecError {
        CodecError::Short { what: self.what, field, need: self.at.saturating_add(n), have: self.data.len() }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], CodecError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len()).ok_or_else(|| self.short(field, n))?;
        let s = &self.data[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], CodecError> {
        let b = self.take(N, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    /// One byte.
    pub fn u8(&mut self, field: &'static str) -> Result<u8, CodecError> {
        Ok(self.take(1, field)?[0])
    }

    /// A `u16`.
    pub fn u16(&mut self, field: &'static str) -> Result<u16, CodecError> {
        self.array(field).map(u16::from_le_bytes)
    }

    /// A `u32`.
    pub fn u32(&mut self, field: &'static str) -> Result<u32, CodecError> {
        self.array(field).map(u32::from_le_bytes)
    }

    /// An `i32`.
    pub fn i32(&mut self, field: &'static str) -> Result<i32, CodecError> {
        self.array(field).map(i32::from_le_bytes)
    }

    /// A `u64`.
    pub fn u64(&mut self, field: &'static str) -> Result<u64, CodecError> {
        self.array(field).map(u64::from_le_bytes)
    }

    /// `n` bytes that must be zero (reserved).
    pub fn zeros(&mut self, n: usize, field: &'static str) -> Result<(), CodecError> {
        let b = self.take(n, field)?;
        match b.iter().position(|&x| x != 0) {
            None => Ok(()),
            Some(i) => Err(CodecError::BadValue { what: self.what, field, value: u64::from(b[i]) }),
        }
    }

    /// Text with a `u16` length.
    pub fn text(&mut self, field: &'static str) -> Result<String, CodecError> {
        let n = self.u16(field)? as usize;
        self.utf8(n, field)
    }

    /// Text with a `u8` length.
    pub fn short_text(&mut self, field: &'static str) -> Result<String, CodecError> {
        let n = self.u8(field)? as usize;
        self.utf8(n, field)
    }

    fn utf8(&mut self, n: usize, field: &'static str) -> Result<String, CodecError> {
        let b = self.take(n, field)?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| CodecError::NotUtf8 { what: self.what, field })
    }

    /// A `u32` count of entries of at least `entry` bytes each, checked against the bytes left
    /// before the caller allocates for them.
    pub fn count(&mut self, entry: usize, field: &'static str) -> Result<usize, CodecError> {
        let n = self.u32(field)? as usize;
        let need = n.saturating_mul(entry.max(1));
        if need > self.remaining() {
            return Err(self.short(field, need));
        }
        Ok(n)
    }

    /// A value out of a field, or [`CodecError::BadValue`] naming it.
    pub fn bad_value(&self, field: &'static str, value: u64) -> CodecError {
        CodecError::BadValue { what: self.what, field, value }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.data.len() - self.at
    }

    /// Where the next read starts (to slice a shared buffer the payload came from).
    pub fn position(&self) -> usize {
        self.at
    }

    /// The rest of the payload (everything not read yet), which is then read.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.data[self.at..];
        self.at = self.data.len();
        s
    }

    /// Ends the payload: an error if bytes are left.
    pub fn finish(self) -> Result<(), CodecError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(CodecError::Trailing { what: self.what, extra }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips() {
        let mut w = Writer::with_capacity(64);
        w.u8(1);
        w.u16(2);
        w.u32(3);
        w.i32(-4);
        w.u64(5);
        w.text("héllo");
        w.short_text("x");
        w.zeros(3);
        w.bytes(b"raw");
        let b = w.finish();
        let mut r = Reader::new("t", &b);
        assert_eq!(r.u8("a").unwrap(), 1);
        assert_eq!(r.u16("b").unwrap(), 2);
        assert_eq!(r.u32("c").unwrap(), 3);
        assert_eq!(r.i32("d").unwrap(), -4);
        assert_eq!(r.u64("e").unwrap(), 5);
        assert_eq!(r.text("f").unwrap(), "héllo");
        assert_eq!(r.short_text("g").unwrap(), "x");
        r.zeros(3, "h").unwrap();
        assert_eq!(r.position(), b.len() - 3);
        assert_eq!(r.rest(), b"raw");
        r.finish().unwrap();
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let s = "é".repeat(40_000);
        let mut w = Writer::new();
        w.text(&s);
        let b = w.finish();
        let t = Reader::new("t", &b).text("s").unwrap();
        assert!(t.len() <= u16::MAX as usize && t.chars().all(|c| c == 'é'));
    }

    #[test]
    fn malformed_payloads_are_named_errors() {
        let mut r = Reader::new("hello", &[1, 0]);
        assert_eq!(r.u32("id"), Err(CodecError::Short { what: "hello", field: "id", need: 4, have: 2 }));
        let r = Reader::new("hello", &[1]);
        assert_eq!(r.finish(), Err(CodecError::Trailing { what: "hello", extra: 1 }));
        let mut r = Reader::new("hello", &[2, 0, 0xff, 0xfe]);
        assert_eq!(r.text("name"), Err(CodecError::NotUtf8 { what: "hello", field: "name" }));
        let mut r = Reader::new("hello", &[0, 7]);
        assert_eq!(r.zeros(2, "reserved"), Err(CodecError::BadValue { what: "hello", field: "reserved", value: 7 }));
        assert!(CodecError::Short { what: "m", field: "f", need: 9, have: 1 }.to_string().contains("`f`"));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..64 {
            for _ in 0..32 {
                let data: Vec<u8> = (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed as u8
                    })
                    .collect();
                let mut r = Reader::new("any", &data);
                let _ = r.u8("a");
                let _ = r.text("b");
                let _ = r.count(8, "c");
                let _ = r.short_text("d");
                let _ = r.u64("e");
                let _ = r.finish();
            }
        }
    }
}
