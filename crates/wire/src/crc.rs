//! CRC32C (Castagnoli), the checksum of every fragment payload, data-file record and file header.
//!
//! Two implementations, one chosen per process on first use (see [`implementation`]):
//!
//! - `crc-fast`, which folds with carry-less multiplication, where it folds 512 bits at a time
//!   (`x86_64-avx512-vpclmulqdq`) and on CPUs without the SSE4.2 `crc32` instruction (every
//!   CPU but x86-64 among them); on the project's Intel reference machine (AVX-512,
//!   VPCLMULQDQ) it is 3–4× faster than the instruction from 1 KiB up (76 GiB/s against
//!   21.5 GiB/s at 4 KiB);
//! - the `crc32c` crate, which interleaves three streams of the SSE4.2 `crc32` instruction, on
//!   every other x86-64: there `crc-fast` takes 128-bit paths (`x86-sse-pclmulqdq`,
//!   `x86_64-avx512-pclmulqdq`) that split each buffer into streams whose constants it computes
//!   on every call and which each start on a cold cache line. On the AMD EPYC development VM
//!   (no AVX-512), 4 KiB buffers out of memory: 7.7 against 13.8 GiB/s; in the cache 13.3
//!   against 17.9 GiB/s; at 1 KiB 9.7 against 14.6 GiB/s (docs/performance.md, "CRC32C").
//!   Buffers of up to 256 bytes still go to `crc-fast` where it folds with PCLMULQDQ, whose
//!   short path is the faster one.
//!
//! Both compute the same function; [`crc32c()`] and [`Crc32c`] use the one chosen.
//!
//! ```
//! use daqflow_wire::crc::{crc32c, implementation};
//! assert_eq!(crc32c(b"123456789"), 0xE306_9283);
//! println!("CRC32C by {}", implementation());
//! ```

use std::sync::OnceLock;

use crc_fast::{CrcAlgorithm, Digest};

/// Which implementation this process uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    /// `crc-fast` (carry-less multiplication).
    Fold,
    /// The `crc32c` crate (SSE4.2 `crc32`, three streams); buffers of up to [`SHORT`] bytes
    /// to `crc-fast` if `short_fold` (it folds with PCLMULQDQ: the faster one there).
    Instruction { short_fold: bool },
}

/// The implementation for this CPU, decided once.
#[inline]
fn engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    *ENGINE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        let instruction = std::arch::is_x86_feature_detected!("sse4.2");
        #[cfg(not(target_arch = "x86_64"))]
        let instruction = false;
        choose(&crc_fast::get_calculator_target(CrcAlgorithm::Crc32Iscsi), instruction)
    })
}

/// The rule: `crc-fast` where it folds with 512-bit VPCLMULQDQ (`x86_64-avx512-vpclmulqdq`,
/// measured 3–4× faster than the instruction) or where the CPU has no SSE4.2 `crc32`
/// instruction (`instruction`: an x86-64 with it); the instruction on every other x86-64:
/// `crc-fast`'s SSE path and its `avx512-pclmulqdq` path run the same 128-bit code (measured
/// slower than the instruction on the first), and its table fallback is slower still.
fn choose(target: &str, instruction: bool) -> Engine {
    if instruction && target != "x86_64-avx512-vpclmulqdq" {
        Engine::Instruction { short_fold: target.ends_with("pclmulqdq") }
    } else {
        Engine::Fold
    }
}

/// The CRC32C implementation this process uses, and why, in words (for benchmark notes and
/// logs): e.g. `crc32c crate, SSE4.2 crc32 (crc-fast would take x86-sse-pclmulqdq)`.
pub fn implementation() -> String {
    let target = crc_fast::get_calculator_target(CrcAlgorithm::Crc32Iscsi);
    match engine() {
        Engine::Fold => format!("crc-fast, {target}"),
        Engine::Instruction { short_fold } => format!(
            "crc32c crate, SSE4.2 crc32{} (crc-fast would take {target})",
            if short_fold { ", crc-fast up to 256 B" } else { "" }
        ),
    }
}

/// CRC32C of `data` (initial value `0xFFFF_FFFF`, reflected, final XOR `0xFFFF_FFFF`; the
/// check value of `b"123456789"` is `0xE306_9283`).
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    match engine() {
        Engine::Fold => crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, data) as u32,
        // Up to 256 bytes `crc-fast`'s one short fold is still the faster (8 against 10 ns at
        // 64 B, 20 against 26 ns at 256 B; from 384 B the instruction's three streams win).
        Engine::Instruction { short_fold: true } if data.len() <= SHORT => {
            crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, data) as u32
        }
        Engine::Instruction { .. } => ::crc32c::crc32c(data),
    }
}

/// Up to where [`Engine::Instruction`] still folds with `crc-fast` (bytes, inclusive).
const SHORT: usize = 256;

/// Incremental CRC32C over data that arrives in several pieces.
///
/// ```
/// use daqflow_wire::crc::{crc32c, Crc32c};
/// let mut crc = Crc32c::new();
/// crc.update(b"1234");
/// crc.update(b"56789");
/// assert_eq!(crc.finish(), crc32c(b"123456789"));
/// ```
#[derive(Clone)]
pub struct Crc32c {
    state: State,
}

// No larger than the `Digest` alone, which `Crc32c` always held; boxing it would allocate per
// checksum (a data file's record of several parts makes one per event).
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum State {
    Fold(Digest),
    /// The CRC of what was added so far (finished form: `crc32c_append` continues it).
    Instruction(u32),
}

impl Crc32c {
    /// A CRC over no data yet.
    pub fn new() -> Self {
        Self::with(engine())
    }

    fn with(engine: Engine) -> Self {
        Crc32c {
            state: match engine {
                Engine::Fold => State::Fold(Digest::new(CrcAlgorithm::Crc32Iscsi)),
                Engine::Instruction { .. } => State::Instruction(0),
            },
        }
    }

    /// Adds `data` to the checksum.
    #[inline]
    pub fn update(&mut self, data: &[u8]) {
        match &mut self.state {
            State::Fold(d) => d.update(data),
            State::Instruction(crc) => *crc = ::crc32c::crc32c_append(*crc, data),
        }
    }

    /// The CRC32C of everything added so far.
    pub fn finish(&self) -> u32 {
        match &self.state {
            State::Fold(d) => d.finalize() as u32,
            State::Instruction(crc) => *crc,
        }
    }
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Crc32c {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Crc32c({:#010x})", self.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value_matches_the_standard() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        for engine in [Engine::Fold, Engine::Instruction { short_fold: true }] {
            let mut c = Crc32c::with(engine);
            c.update(b"123456789");
            assert_eq!(c.finish(), 0xE306_9283, "{engine:?}");
            assert_eq!(Crc32c::with(engine).finish(), 0, "{engine:?}");
        }
    }

    #[test]
    fn agrees_with_an_independent_implementation_at_every_length() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in (0..300).chain([383, 384, 385, 1023, 1024, 4095, 4096, 4999]) {
            let fold = crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, &data[..len]) as u32;
            assert_eq!(fold, ::crc32c::crc32c(&data[..len]), "length {len}");
            assert_eq!(crc32c(&data[..len]), fold, "length {len}");
        }
    }

    #[test]
    fn incremental_equals_one_shot_with_either_implementation() {
        let data: Vec<u8> = (0..3000u32).map(|i| i as u8 ^ 0x5a).collect();
        for engine in [Engine::Fold, Engine::Instruction { short_fold: true }] {
            for split in [0, 1, 7, 64, 1000, 2999, 3000] {
                let mut c = Crc32c::with(engine);
                c.update(&data[..split]);
                c.update(&data[split..]);
                assert_eq!(c.finish(), crc32c(&data), "{engine:?}, split at {split}");
            }
        }
    }

    #[test]
    fn the_two_implementations_agree_on_any_bytes_in_any_pieces() {
        proptest::proptest!(|(data in proptest::collection::vec(proptest::num::u8::ANY, 0..9000), cut in 0usize..9000)| {
            let cut = cut.min(data.len());
            let fold = crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, &data) as u32;
            proptest::prop_assert_eq!(fold, ::crc32c::crc32c(&data));
            proptest::prop_assert_eq!(crc32c(&data), fold);
            for engine in [Engine::Fold, Engine::Instruction { short_fold: true }] {
                let mut c = Crc32c::with(engine);
                c.update(&data[..cut]);
                c.update(&data[cut..]);
                proptest::prop_assert_eq!(c.finish(), fold);
            }
        });
    }

    #[test]
    fn the_instruction_is_taken_on_x86_64_unless_crc_fast_has_512_bit_folds() {
        // Every target `crc-fast` 1.10 names (`feature_detection::tier_to_target_string`).
        let table = [
            ("x86_64-avx512-vpclmulqdq", true, Engine::Fold),
            ("x86_64-avx512-pclmulqdq", true, Engine::Instruction { short_fold: true }),
            ("x86_64-sse-pclmulqdq", true, Engine::Instruction { short_fold: true }),
            ("x86-sse-pclmulqdq", true, Engine::Instruction { short_fold: true }),
            ("software-fallback-tables", true, Engine::Instruction { short_fold: false }),
            ("software-fallback-tables", false, Engine::Fold),
            ("aarch64-neon-pmull-sha3", false, Engine::Fold),
            ("aarch64-neon-pmull", false, Engine::Fold),
        ];
        for (target, instruction, want) in table {
            assert_eq!(choose(target, instruction), want, "{target}, instruction {instruction}");
        }
        // The names are `crc-fast`'s: the one it gives on this machine must be in the table,
        // or a new version renamed its targets and the rule above would read them wrong.
        let here = crc_fast::get_calculator_target(CrcAlgorithm::Crc32Iscsi);
        assert!(table.iter().any(|(t, _, _)| *t == here), "crc-fast names a target the rule does not know: {here}");
        println!("CRC32C by {}", implementation());
    }
}
