//! The authentication handshake (`docs/security.md`): a server checking a client's RESPONSE,
//! a client checking a CHALLENGE and the server's answer, with and without a token. Nobody
//! without the token is ever accepted by an end that has one.
#![no_main]

use daqflow_transport::auth::{Token, fuzzing};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let frames = daqflow_fuzz::frames(data);
    let token = Token::new("fuzzing-token").expect("a valid token");
    if let Some(response) = frames.first() {
        let _ = fuzzing::server_response("et", None, response);
        // With a token, the client's proof is an HMAC of a fresh nonce: no input can know it.
        assert!(fuzzing::server_response("et", Some(&token), response).is_err(), "accepted without the token");
    }
    if let [challenge, answer, ..] = &frames[..] {
        let _ = fuzzing::client("et", None, challenge, answer);
        // The server's proof covers the client's fresh nonce: no input can know it.
        assert!(fuzzing::client("et", Some(&token), challenge, answer).is_err(), "trusted an unproven server");
    }
});
