//! ET server answers as a remote client decodes them (`crates/et/src/remote`), an `EVENTS`
//! batch with the `DATA` frames after it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let frames = daqflow_fuzz::frames(data);
    let _ = daqflow_et::remote::fuzzing::client_answers(&frames, 64);
});
