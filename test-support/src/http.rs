//! A blocking HTTP/1.1 client for tests: build a [`Request`], then
//! [`Request::send`] it for the whole [`Response`] or [`Request::stream`]
//! it to read the body chunk by chunk (and drop it mid-stream, as a
//! client that goes away does).
//!
//! Each request opens its own connection (`Connection: close`) on its own
//! single-threaded runtime, so a test's requests never share state and a
//! test that is itself async can call it from a blocking thread.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bad URL {0:?} (want http://host:port/path, or https:// with a TLS config)")]
    Url(String),
    #[error("connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("TLS: {0}")]
    Tls(#[source] std::io::Error),
    /// The exchange failed; the text carries the whole chain of causes
    /// (a TLS alert shows as such).
    #[error("HTTP: {0}")]
    Http(String),
    #[error("request: {0}")]
    Build(#[from] http::Error),
    #[error("no response within {0:?}")]
    Timeout(Duration),
    #[error("runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// One request, built step by step.
#[derive(Debug, Clone)]
pub struct Request {
    method: http::Method,
    url: String,
    headers: Vec<(String, String)>,
    body: Bytes,
    tls: Option<(Arc<rustls::ClientConfig>, String)>,
    timeout: Duration,
}

impl Request {
    /// `method` on `url` (`http://host:port/path`, or `https://...` with
    /// [`Request::tls`]).
    pub fn new(method: &str, url: &str) -> Self {
        Self {
            method: http::Method::from_bytes(method.as_bytes())
                .unwrap_or_else(|_| panic!("not an HTTP method: {method:?}")),
            url: url.to_owned(),
            headers: Vec::new(),
            body: Bytes::new(),
            tls: None,
            timeout: Duration::from_secs(600),
        }
    }

    /// `GET url`.
    pub fn get(url: &str) -> Self {
        Self::new("GET", url)
    }

    /// `POST url` with a JSON body.
    pub fn post(url: &str, json: &str) -> Self {
        Self::new("POST", url).json(json)
    }

    /// Puts `base` (`http://host:port` or `https://host:port`) before a
    /// URL that is only a path.
    pub fn base(mut self, base: &str) -> Self {
        if self.url.starts_with('/') {
            self.url = format!("{}{}", base.trim_end_matches('/'), self.url);
        }
        self
    }

    /// `url` as `base` (`http://host:port`, with or without the scheme)
    /// followed by `path`.
    pub fn at(method: &str, base: &str, path: &str) -> Self {
        let base = if base.contains("://") {
            base.to_owned()
        } else {
            format!("http://{base}")
        };
        Self::new(method, &format!("{}{path}", base.trim_end_matches('/')))
    }

    /// A header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// `Authorization: Bearer token` (none when `token` is empty).
    pub fn bearer(self, token: &str) -> Self {
        if token.is_empty() {
            self
        } else {
            self.header("authorization", &format!("Bearer {token}"))
        }
    }

    /// A JSON body (`content-type: application/json`).
    pub fn json(mut self, body: &str) -> Self {
        self.body = Bytes::copy_from_slice(body.as_bytes());
        self.header("content-type", "application/json")
    }

    /// A raw body, with no content type.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// TLS with `config`, checking the server's certificate for `server`
    /// (a DNS name).
    pub fn tls(mut self, config: Arc<rustls::ClientConfig>, server: &str) -> Self {
        self.tls = Some((config, server.to_owned()));
        self
    }

    /// How long to wait for the response's head, and for each piece of
    /// its body after that (default 600 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends it and reads the whole body. A body cut short by the peer
    /// (a worker dropping the connection) still answers, with what came
    /// and [`Response::cut`] saying why it ended.
    pub fn send(self) -> Result<Response, Error> {
        let timeout = self.timeout;
        let mut s = self.stream()?;
        let mut body = Vec::new();
        let mut cut = None;
        loop {
            match s.next_chunk_within(timeout) {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(e) => {
                    cut = Some(e.to_string());
                    break;
                }
            }
        }
        Ok(Response {
            status: s.status,
            headers: s.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            cut,
        })
    }

    /// Sends it and returns once the response's head has arrived.
    pub fn stream(self) -> Result<Streaming, Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        let timeout = self.timeout;
        let response = rt.block_on(async {
            tokio::time::timeout(timeout, self.exchange())
                .await
                .map_err(|_| Error::Timeout(timeout))?
        })?;
        let (parts, body) = response.into_parts();
        Ok(Streaming {
            rt,
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }

    /// Sends it and hangs up once the request is written, reading
    /// nothing: a client that goes away before any answer.
    pub fn send_and_hang_up(self) -> Result<(), Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        let timeout = self.timeout;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let flushed = Flushed::new(tx);
        rt.block_on(async move {
            let exchange = self.exchange_with(flushed);
            tokio::select! {
                r = exchange => r.map(drop),
                _ = rx => Ok(()),
                () = tokio::time::sleep(timeout) => Err(Error::Timeout(timeout)),
            }
        })
        // Dropping the runtime closes the connection.
    }

    async fn exchange(self) -> Result<http::Response<Incoming>, Error> {
        self.exchange_with(Flushed::never()).await
    }

    async fn exchange_with(self, flushed: Flushed) -> Result<http::Response<Incoming>, Error> {
        let (scheme, rest) = self
            .url
            .split_once("://")
            .ok_or_else(|| Error::Url(self.url.clone()))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let tcp = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(Error::Connect)?;
        let mut req = http::Request::builder()
            .method(self.method.clone())
            .uri(path)
            .header("host", authority)
            .header("connection", "close");
        for (k, v) in &self.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let req = req.body(Full::new(self.body.clone()))?;
        match (scheme, &self.tls) {
            ("http", None) => send_on(TokioIo::new(flushed.wrap(tcp)), req).await,
            ("https", Some((config, server))) => {
                let name = ServerName::try_from(server.clone())
                    .map_err(|e| Error::Tls(std::io::Error::other(e)))?;
                let tls = tokio_rustls::TlsConnector::from(Arc::clone(config))
                    .connect(name, tcp)
                    .await
                    .map_err(Error::Tls)?;
                send_on(TokioIo::new(flushed.wrap(tls)), req).await
            }
            _ => Err(Error::Url(self.url.clone())),
        }
    }
}

/// A response read whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
    /// Why the body ended before its end, if it did.
    pub cut: Option<String>,
}

impl Response {
    /// The body as JSON (panics with the body when it is not: a test
    /// helper).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}), status {}: {}", self.status, self.body))
    }

    /// A header's value, when present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The head as text: status line and `name: value` lines, names
    /// lowercase.
    pub fn head(&self) -> String {
        let mut h = format!("HTTP/1.1 {}\r\n", self.status);
        for (k, v) in &self.headers {
            h.push_str(&format!(
                "{k}: {}\r\n",
                String::from_utf8_lossy(v.as_bytes())
            ));
        }
        h
    }
}

/// A response whose body is still arriving; dropping it closes the
/// connection.
#[derive(Debug)]
pub struct Streaming {
    rt: Runtime,
    pub status: u16,
    pub headers: http::HeaderMap,
    body: Incoming,
}

impl Streaming {
    /// The next piece of the body; `None` at its end.
    pub fn next_chunk(&mut self) -> Result<Option<Bytes>, Error> {
        self.next_chunk_within(Duration::from_secs(600))
    }

    /// As [`Streaming::next_chunk`], waiting at most `timeout`.
    pub fn next_chunk_within(&mut self, timeout: Duration) -> Result<Option<Bytes>, Error> {
        let body = &mut self.body;
        self.rt.block_on(async {
            loop {
                let frame = tokio::time::timeout(timeout, body.frame())
                    .await
                    .map_err(|_| Error::Timeout(timeout))?;
                match frame {
                    None => return Ok(None),
                    Some(Err(e)) => return Err(Error::http(&e)),
                    Some(Ok(f)) => {
                        if let Ok(data) = f.into_data() {
                            return Ok(Some(data));
                        }
                    }
                }
            }
        })
    }

    /// Reads until the text received so far satisfies `done` or the body
    /// ends; returns the text.
    pub fn read_until(&mut self, done: impl Fn(&str) -> bool) -> Result<String, Error> {
        let mut text = String::new();
        while !done(&text) {
            match self.next_chunk()? {
                Some(chunk) => text.push_str(&String::from_utf8_lossy(&chunk)),
                None => break,
            }
        }
        Ok(text)
    }
}

async fn send_on<T>(
    io: TokioIo<T>,
    req: http::Request<Full<Bytes>>,
) -> Result<http::Response<Incoming>, Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| Error::http(&e))?;
    tokio::spawn(async move {
        // The connection's own end (a peer closing after the response)
        // shows in the body's frames; nothing more to report here.
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(|e| Error::http(&e))
}

impl Error {
    /// `e` with every cause after it, `: `-separated.
    fn http(e: &(dyn std::error::Error + 'static)) -> Self {
        let causes: Vec<String> = std::iter::successors(Some(e), |c| c.source())
            .map(ToString::to_string)
            .collect();
        Self::Http(causes.join(": "))
    }
}

/// Says, once, that the connection was first flushed: hyper flushes after
/// writing a whole request with a body it holds in full.
struct Flushed(Option<tokio::sync::oneshot::Sender<()>>);

impl Flushed {
    fn new(tx: tokio::sync::oneshot::Sender<()>) -> Self {
        Self(Some(tx))
    }

    fn never() -> Self {
        Self(None)
    }

    fn wrap<T>(self, io: T) -> Watched<T> {
        Watched { io, flushed: self }
    }
}

/// A stream that reports its first flush.
struct Watched<T> {
    io: T,
    flushed: Flushed,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.io).poll_flush(cx);
        if r.is_ready()
            && let Some(tx) = self.flushed.0.take()
        {
            let _ = tx.send(());
        }
        r
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
