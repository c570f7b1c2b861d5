//! Remote access: a TCP server in the ET process serving the attachment API to other hosts, its
//! client, and discovery of ET systems by name over UDP.

pub(crate) mod client;
pub mod discovery;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod protocol;
pub(crate) mod server;
