//! The system file parser (`daqflow_runcontrol::system::SystemFile::parse`) with the standard
//! kinds: every problem is a message with its line, never a panic.
#![no_main]

use std::sync::OnceLock;

use daqflow_component::Registry;
use daqflow_runcontrol::system::SystemFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    let registry = REGISTRY.get_or_init(daqflow_fuzz::registry);
    let Ok(text) = std::str::from_utf8(data) else { return };
    match SystemFile::parse(text, registry) {
        Ok(file) => assert_eq!(file.text, text),
        Err(e) => assert!(!e.problems.is_empty(), "a refusal says why"),
    }
});
