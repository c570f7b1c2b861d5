//! CRC32C throughput: `crc-fast` (used by daqflow-wire) against the `crc32c` crate.
//! Run with `cargo bench -p daqflow-wire --bench crc`; the figures are in docs/performance.md.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn crc(c: &mut Criterion) {
    let mut group = c.benchmark_group("crc32c");
    for size in [64usize, 1024, 4096, 65536, 1 << 20] {
        let data: Vec<u8> = (0..size).map(|i| (i * 131 + 7) as u8).collect();
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("crc-fast", size), &data, |b, d| {
            b.iter(|| daqflow_wire::crc::crc32c(std::hint::black_box(d)))
        });
        group.bench_with_input(BenchmarkId::new("crc32c", size), &data, |b, d| {
            b.iter(|| crc32c::crc32c(std::hint::black_box(d)))
        });
    }
    group.finish();
}

criterion_group!(benches, crc);
criterion_main!(benches);
