//! The web server's HTTP/1.1 request parser (`crates/web/src/http.rs`) on the bytes a client
//! sends, with small limits (so that the limits are reached) and the server's own: a whole
//! request parses back the same once written again.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = daqflow_web::http_fuzzing::parse(data, 256, 64);
    let _ = daqflow_web::http_fuzzing::parse(data, 16 * 1024, 1 << 20);
});
