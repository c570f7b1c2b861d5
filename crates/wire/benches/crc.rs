//! CRC32C throughput: `crc-fast` against the `crc32c` crate, and the one daqflow-wire chose for
//! this CPU (`daqflow_wire::crc::implementation`), on a buffer in the cache (`crc32c/…`) and on
//! consecutive pieces of a 64 MiB buffer, out of memory as a builder's data (`crc32c_cold/…`).
//! Run with `cargo bench -p daqflow-wire --bench crc`; the figures are in docs/performance.md.

use std::cell::Cell;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn fold(d: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, d) as u32
}

type Implementations = [(&'static str, fn(&[u8]) -> u32); 3];

const IMPLEMENTATIONS: Implementations =
    [("crc-fast", fold), ("crc32c", crc32c::crc32c), ("daqflow", daqflow_wire::crc::crc32c)];

fn crc(c: &mut Criterion) {
    println!("daqflow-wire's CRC32C here: {}", daqflow_wire::crc::implementation());
    let mut group = c.benchmark_group("crc32c");
    for size in [64usize, 1024, 4096, 65536, 1 << 20] {
        let data: Vec<u8> = (0..size).map(|i| (i * 131 + 7) as u8).collect();
        group.throughput(Throughput::Bytes(size as u64));
        for (name, f) in IMPLEMENTATIONS {
            group.bench_with_input(BenchmarkId::new(name, size), &data, |b, d| b.iter(|| f(std::hint::black_box(d))));
        }
    }
    group.finish();

    let big: Vec<u8> = (0..64usize << 20).map(|i| (i * 131 + 7) as u8).collect();
    let mut group = c.benchmark_group("crc32c_cold");
    for size in [1024usize, 4096, 16384, 65536] {
        group.throughput(Throughput::Bytes(size as u64));
        for (name, f) in IMPLEMENTATIONS {
            let next = Cell::new(0usize);
            group.bench_function(BenchmarkId::new(name, size), |b| {
                b.iter(|| {
                    let at = next.get();
                    next.set(if at + 2 * size > big.len() { 0 } else { at + size });
                    f(std::hint::black_box(&big[at..at + size]))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, crc);
criterion_main!(benches);
