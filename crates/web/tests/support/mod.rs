//! What the integration tests share: a fake operator, an HTTP/SSE client and a Chrome
//! DevTools Protocol driver.
#![allow(dead_code)]

pub mod cdp;
pub mod client;
pub mod fake;
pub mod history;
