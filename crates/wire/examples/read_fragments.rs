//! Reads every fragment of data files, as `daqflow.File.arrays()` does in Python: the Rust
//! reader's speed that `docs/python.md` compares the Python package with.
//!
//! ```text
//! cargo run --release -p daqflow-wire --example read_fragments -- FILE... [--copy]
//! ```
//!
//! With `--copy` the payloads are also copied into one contiguous buffer, as `arrays()` does.

use std::time::Instant;

use daqflow_wire::Event;
use daqflow_wire::file::{FileReader, ScanItem};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let copy = args.iter().any(|a| a == "--copy");
    for path in args.iter().filter(|a| *a != "--copy") {
        let start = Instant::now();
        let reader = FileReader::open(path)?;
        let (mut events, mut fragments, mut bytes) = (0u64, 0u64, 0u64);
        let mut payload = Vec::with_capacity(if copy { reader.size() as usize } else { 0 });
        for item in reader.scan() {
            let ScanItem::Record(record) = item? else { continue };
            let event = Event::parse(record.payload)?;
            events += 1;
            for sf in event.super_fragments() {
                for fragment in sf?.fragments() {
                    let fragment = fragment?;
                    fragments += 1;
                    bytes += fragment.header().payload_len as u64;
                    if copy {
                        payload.extend_from_slice(fragment.payload_slice());
                    }
                }
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        println!(
            "{path}: {events} events, {fragments} fragments, {bytes} payload bytes in {seconds:.3} s: {:.0} MB/s of file",
            reader.size() as f64 / seconds / 1e6
        );
    }
    Ok(())
}
