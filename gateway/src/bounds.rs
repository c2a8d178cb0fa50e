//! The size bounds of what a client may send: the body and the header
//! block. The door and the connection settings enforce them; the errors
//! name them.

/// The largest request body accepted (a declared larger one is refused
/// before a byte of it is read).
pub(crate) const MAX_BODY_BYTES: usize = 2 << 20;

/// The largest header block accepted, on HTTP/1.1 and HTTP/2 (hyper's
/// minimum buffer is 8 KiB).
pub(crate) const MAX_HEADER_BYTES: usize = 64 << 10;
