//! Hyper answers a request whose head it cannot take itself, with an empty
//! body: 431 when the headers are over the limit, 400 when the request line
//! or a header is malformed. This connection wrapper gives those answers a
//! body in the API's own JSON shape. It notes which API the connection's
//! first request line names, and rewrites a bodiless 400 or 431 head on its
//! way out: the gateway's own responses always carry a body, so such a head
//! can only be hyper's.

use crate::errors::{Flavor, GatewayError};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection whose head errors are answered in the API's shape.
#[derive(Debug)]
pub(crate) struct HeadErrors<S> {
    io: S,
    flavor: Option<Flavor>,
    /// A rewritten answer still to write, and how much of it is written.
    pending: Vec<u8>,
    written: usize,
}

impl<S> HeadErrors<S> {
    pub(crate) fn new(io: S) -> Self {
        HeadErrors {
            io,
            flavor: None,
            pending: Vec::new(),
            written: 0,
        }
    }
}

/// The API a request line names (`POST /v1/chat/completions HTTP/1.1`).
fn flavor_of(head: &[u8]) -> Flavor {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let path = line.split(|b| *b == b' ').nth(1).unwrap_or_default();
    if path.starts_with(b"/v1/") || path.windows(7).any(|w| w == b"/ai/v1/") {
        Flavor::OpenAi
    } else {
        Flavor::WorkersAi
    }
}

/// Hyper's own answer to a head it refused: a complete, bodiless 400 or
/// 431 head.
fn refusal(buf: &[u8]) -> Option<GatewayError> {
    let error = if buf.starts_with(b"HTTP/1.1 431 ") {
        GatewayError::HeadersTooLarge
    } else if buf.starts_with(b"HTTP/1.1 400 ") {
        GatewayError::BadHead
    } else {
        return None;
    };
    let head = std::str::from_utf8(buf).ok()?.to_ascii_lowercase();
    (head.ends_with("\r\n\r\n") && head.contains("\r\ncontent-length: 0\r\n")).then_some(error)
}

fn answer(error: GatewayError, flavor: Flavor) -> Vec<u8> {
    let (status, body) = error.in_(flavor).status_and_body();
    let body = body.to_string();
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes()
}

impl<S: AsyncWrite + Unpin> HeadErrors<S> {
    /// Writes what is left of a rewritten answer.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for HeadErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        if self.flavor.is_none() && buf.filled().len() > before {
            self.flavor = Some(flavor_of(&buf.filled()[before..]));
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for HeadErrors<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.drain(cx))?;
        if let Some(error) = refusal(buf) {
            let flavor = self.flavor.unwrap_or(Flavor::WorkersAi);
            crate::metrics::head_refused(error.kind());
            self.pending = answer(error, flavor);
            self.written = 0;
            // Accepted whole; the rewritten answer goes out on this call
            // or on the flush that follows.
            let _ = self.drain(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        // Hyper then writes each head in one buffer, where it can be seen whole.
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_bodiless_refusals_are_rewritten() {
        let hyper431 =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        assert_eq!(refusal(hyper431), Some(GatewayError::HeadersTooLarge));
        let hyper400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(refusal(hyper400), Some(GatewayError::BadHead));
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 80\r\n\r\n";
        assert_eq!(refusal(ours), None);
        assert_eq!(
            refusal(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"),
            None
        );
        assert_eq!(
            flavor_of(b"POST /v1/chat/completions HTTP/1.1\r\n"),
            Flavor::OpenAi
        );
        assert_eq!(
            flavor_of(b"POST /client/v4/accounts/a/ai/v1/chat/completions HTTP/1.1\r\n"),
            Flavor::OpenAi
        );
        assert_eq!(
            flavor_of(b"POST /client/v4/accounts/a/ai/run/@cf/x/y HTTP/1.1\r\n"),
            Flavor::WorkersAi
        );
        let a = String::from_utf8(answer(GatewayError::HeadersTooLarge, Flavor::OpenAi)).unwrap();
        assert!(a.starts_with("HTTP/1.1 431 "), "{a}");
        let body = a.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "headers_too_large");
    }
}
