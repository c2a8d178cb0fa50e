//! Output constraints for constrained sampling: JSON mode and a JSON-schema
//! subset, compiled once ([`Grammar`]) and walked byte by byte
//! ([`Matcher`]). The gateway compiles a client's schema to refuse what
//! cannot be enforced before any worker is called; the engine's sampler
//! keeps one matcher per sequence and only ever picks a token whose bytes
//! the matcher accepts, so the output parses by construction.
//!
//! Tool calls ([`tools`]) are a grammar too: calls in one text format,
//! each call's arguments held to its function's schema.
//!
//! Invariant: there is no schema keyword that is accepted and not
//! enforced; an unknown keyword is a [`SchemaError::Unsupported`].

mod matcher;
mod schema;
pub mod tools;

pub use matcher::Matcher;
pub use schema::{Grammar, MAX_LITERAL_BYTES, MAX_NAME_BYTES, MAX_NODES, SchemaError};

#[cfg(test)]
mod tests;
