//! ET remote requests as the ET system's server decodes them (`crates/et/src/remote`), a `PUT`
//! with the `DATA` frames after it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let frames = daqflow_fuzz::frames(data);
    let _ = daqflow_et::remote::fuzzing::server_requests(&frames, 64);
});
