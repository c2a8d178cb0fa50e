//! What the tests of several crates share. Today that is one HTTP client
//! ([`http`]): blocking, so synchronous tests can call it, over a real
//! socket per request, plain or mutual TLS, on hyper (no hand-written
//! HTTP parsing in any test).
//!
//! Tests that must write malformed or deliberately slow bytes (the
//! gateway's flood and connection tests) keep their raw sockets: that is
//! what they test.

pub mod http;

pub use http::{Request, Response, Streaming};
