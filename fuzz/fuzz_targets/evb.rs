//! Event-builder messages as the EVM, the RUs and the BUs decode them
//! (`crates/evb/src/protocol.rs`), with the fragments an RU receives from its sources and the
//! super-fragments a BU receives from the RUs. Each decoded message round-trips.
#![no_main]

use daqflow_evb::protocol::{KIND_FRAGMENT, KIND_SUPER_FRAGMENT, Message};
use daqflow_wire::{Fragment, SuperFragment};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for frame in daqflow_fuzz::frames(data) {
        match frame.kind {
            KIND_FRAGMENT => {
                if let Ok(f) = Fragment::parse(frame.payload.clone()) {
                    let _ = f.verify_crc();
                }
            }
            KIND_SUPER_FRAGMENT => {
                if let Ok(sf) = SuperFragment::parse(frame.payload.clone()) {
                    for f in sf.fragments() {
                        let Ok(f) = f else { break };
                        let _ = f.verify_crc();
                    }
                }
            }
            _ => {
                if let Ok(m) = Message::decode(&frame) {
                    let again = m.to_frame();
                    assert_eq!(again.kind, frame.kind);
                    assert_eq!(Message::decode(&again).as_ref(), Ok(&m), "a message round-trips");
                }
            }
        }
    }
});
