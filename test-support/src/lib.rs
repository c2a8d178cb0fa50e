//! What the tests of several crates share: one HTTP client ([`http`]),
//! blocking, so synchronous tests can call it, over a real socket per
//! request, plain or mutual TLS, on hyper (no hand-written HTTP parsing in
//! any test); the child processes a test starts ([`process`]); and the
//! JSON bodies the fuzz tests mutate ([`fuzz`]); and reading JSON answers
//! ([`json`]).
//!
//! Tests that must write malformed or deliberately slow bytes (the
//! gateway's flood and connection tests) keep their raw sockets: that is
//! what they test.

pub mod fuzz;
pub mod http;
pub mod json;
pub mod process;

pub use http::{Request, Response, Streaming};
