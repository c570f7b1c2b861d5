//! DIALOG messages (`crates/dialog/src/protocol.rs`), as the control server and every dialog
//! process decode them: each decoded message encodes to a frame that decodes to it again.
#![no_main]

use daqflow_dialog::protocol::Message;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for frame in daqflow_fuzz::frames(data) {
        if let Ok(m) = Message::from_frame(&frame) {
            let again = m.to_frame();
            assert_eq!(again.kind, frame.kind);
            assert_eq!(Message::from_frame(&again).as_ref(), Ok(&m), "a message round-trips");
        }
    }
});
