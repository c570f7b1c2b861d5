//! The data file reader (`daqflow_wire::file`) on a file's bytes in memory: opened (header,
//! trailer, footer), scanned record by record, verified (every CRC, every event's structure),
//! and read through its index.
#![no_main]

use daqflow_wire::file::{FileReader, ScanItem};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut reader) = FileReader::from_source(data.to_vec(), "fuzz.dqf") else { return };
    let _ = (reader.header(), reader.is_complete(), reader.trailer_problem(), reader.footer());
    for item in reader.scan().take(10_000) {
        if let Ok(ScanItem::Record(r)) = item {
            let _ = r;
        }
    }
    let _ = reader.verify(true);
    if let Ok(n) = reader.len() {
        for i in 0..n.min(64) {
            let _ = reader.read_record(i);
        }
    }
});
