//! An HTTP sink for what the platform sends out (the prober's webhook,
//! OTLP exports): an axum server on its own runtime thread that answers
//! every request with `status` and an empty body, recording each request's
//! path and body. No HTTP is parsed or written by hand.

use axum::body::Bytes;
use axum::http::{StatusCode, Uri};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One request a sink received: its path and body.
pub type Request = (String, Vec<u8>);

/// What a sink received: each request, in order.
#[derive(Debug, Clone, Default)]
pub struct Received(Arc<Mutex<Vec<Request>>>);

impl Received {
    /// Every request so far.
    pub fn all(&self) -> Vec<Request> {
        self.0.lock().expect("sink").clone()
    }

    /// The first request's body, waiting up to `within` for it.
    pub fn first_within(&self, within: Duration) -> Option<Vec<u8>> {
        let until = Instant::now() + within;
        loop {
            if let Some((_, b)) = self.0.lock().expect("sink").first() {
                return Some(b.clone());
            }
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Starts a sink answering `status` with an empty body of `content_type`;
/// its base URL (`http://ADDR`) and what it receives.
pub fn start(status: StatusCode, content_type: &'static str) -> (String, Received) {
    let received = Received::default();
    let r = received.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    super::on_own_runtime(move || async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind sink");
        let _ = tx.send(listener.local_addr().expect("sink address"));
        let app = axum::Router::new().fallback(move |uri: Uri, body: Bytes| {
            let r = r.clone();
            async move {
                r.0.lock()
                    .expect("sink")
                    .push((uri.path().to_owned(), body.to_vec()));
                (status, [(axum::http::header::CONTENT_TYPE, content_type)])
            }
        });
        let _ = axum::serve(listener, app).await;
    });
    let addr = rx.recv().expect("the sink started");
    (format!("http://{addr}"), received)
}
