//! The RDMA transport over `ibverbs` (feature `rdma`).
//!
//! Two-sided verbs only: the decode side posts one receive buffer per frame
//! it is willing to take and the prefill side SENDs into whatever the peer
//! posted. The sender never learns an address or a remote key, so it cannot
//! name remote memory at all; frames land in the receiver's own buffers and
//! go through the same [`crate::Ledger`] checks as TCP frames.
//!
//! Verbs objects borrow each other, so each connection's objects live on a
//! dedicated thread (their one owner), fed by a channel. Where the host has
//! no RDMA device (or no RDMA support in the kernel), opening fails with
//! [`TransportError::Unavailable`] and a sentence saying so; nothing panics.

use crate::checksum::Checksums;
use crate::transport::{Slot, Transport, TransportError};
use crate::wire::{MAX_FRAME, Message};
use std::sync::mpsc;
use std::thread::JoinHandle;
use tokio::sync::oneshot;

/// The names of the RDMA devices on this host.
pub fn devices() -> Result<Vec<String>, TransportError> {
    let list = ibverbs::devices().map_err(|e| {
        TransportError::Unavailable(format!("RDMA is not available on this host: {e}"))
    })?;
    Ok(list
        .iter()
        .filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned()))
        .collect())
}

/// Picks `wanted` (or the first device), with a clear error when none fits.
fn pick(wanted: Option<&str>) -> Result<String, TransportError> {
    let names = devices()?;
    match wanted {
        Some(w) if names.iter().any(|n| n == w) => Ok(w.to_owned()),
        Some(w) => Err(TransportError::Unavailable(format!(
            "RDMA device {w:?} not found (devices here: {names:?})"
        ))),
        None => names
            .into_iter()
            .next()
            .ok_or_else(|| TransportError::Unavailable("no RDMA device found on this host".into())),
    }
}

enum Job {
    Send(Vec<u8>, oneshot::Sender<std::io::Result<()>>),
}

/// The sending side: frames go out as RDMA SENDs on one reliable queue pair.
#[derive(Debug)]
pub struct RdmaTransport {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    checksums: Checksums,
}

/// The receiving side: posted buffers, frames delivered in order.
#[derive(Debug)]
pub struct RdmaReceiver {
    frames: tokio::sync::mpsc::UnboundedReceiver<Result<Message, TransportError>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Job")
    }
}

/// Swaps this side's queue-pair endpoint (one line of JSON) for the peer's,
/// over a connection both sides already authenticated (the transfer
/// connection's mutual TLS). Called once, on the verbs thread.
pub type Exchange = Box<dyn FnOnce(String) -> std::io::Result<String> + Send>;

/// Opens `device`, exchanges queue-pair endpoints through `exchange` and
/// returns the connected pair's objects to `body`, on the calling thread.
fn with_queue_pair(
    device: &str,
    exchange: Exchange,
    body: impl FnOnce(
        &ibverbs::ProtectionDomain<'_>,
        &ibverbs::CompletionQueue<'_>,
        ibverbs::QueuePair<'_>,
    ) -> Result<(), TransportError>,
) -> Result<(), TransportError> {
    let io = |e: std::io::Error| TransportError::Unavailable(format!("RDMA device {device}: {e}"));
    let list = ibverbs::devices().map_err(io)?;
    let dev = list
        .iter()
        .find(|d| d.name().is_some_and(|n| n.to_string_lossy() == device))
        .ok_or_else(|| TransportError::Unavailable(format!("RDMA device {device:?} vanished")))?;
    let ctx = dev.open().map_err(io)?;
    let cq = ctx.create_cq(64, 0).map_err(io)?;
    let pd = ctx.alloc_pd().map_err(io)?;
    let prepared = pd
        .create_qp(&cq, &cq, ibverbs::ibv_qp_type::IBV_QPT_RC)
        .set_max_send_wr(16)
        .set_max_recv_wr(16)
        .build()
        .map_err(io)?;
    let local = prepared.endpoint();
    let line = serde_json::to_string(&local)
        .map_err(|e| TransportError::Unavailable(format!("endpoint encoding: {e}")))?;
    let peer = exchange(line)?;
    let remote: ibverbs::QueuePairEndpoint = serde_json::from_str(peer.trim())
        .map_err(|e| TransportError::Unavailable(format!("peer endpoint: {e}")))?;
    let qp = prepared.handshake(remote).map_err(io)?;
    body(&pd, &cq, qp)
}

/// Waits for one completion of `wr_id`.
fn complete(cq: &ibverbs::CompletionQueue<'_>, wr_id: u64) -> std::io::Result<usize> {
    let mut wc = [ibverbs::ibv_wc::default(); 4];
    loop {
        for c in cq.poll(&mut wc)? {
            if c.wr_id() == wr_id {
                return if c.is_valid() {
                    Ok(c.len())
                } else {
                    Err(std::io::Error::other("RDMA work request failed"))
                };
            }
        }
        std::thread::yield_now();
    }
}

/// Runs `body` on a thread of its own named `name`, over a queue pair on
/// `device` (or the first one) with `bytes` of registered memory; returns
/// once `body` signalled that it is ready, or with the error that stopped
/// it before.
fn spawn_on_queue_pair(
    name: &str,
    (device, exchange): (Option<&str>, Exchange),
    bytes: usize,
    body: impl FnOnce(
        ibverbs::MemoryRegion<u8>,
        &ibverbs::CompletionQueue<'_>,
        ibverbs::QueuePair<'_>,
        Ready,
    ) -> Result<(), TransportError>
    + Send
    + 'static,
) -> Result<std::thread::JoinHandle<()>, TransportError> {
    let device = pick(device)?;
    let (ready_tx, ready) = mpsc::channel();
    let failed = ready_tx.clone();
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let r = with_queue_pair(&device, exchange, |pd, cq, qp| {
                let mr = pd.allocate::<u8>(bytes).map_err(TransportError::Io)?;
                body(mr, cq, qp, Ready(ready_tx))
            });
            if let Err(e) = r {
                let _ = failed.send(Err(e));
            }
        })?;
    match ready.recv() {
        Ok(Ok(())) => Ok(thread),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(TransportError::Unavailable(
            "the RDMA thread stopped".into(),
        )),
    }
}

/// How a queue pair's thread tells its spawner that it is ready.
struct Ready(mpsc::Sender<Result<(), TransportError>>);

impl Ready {
    fn signal(self) {
        let _ = self.0.send(Ok(()));
    }
}

impl RdmaTransport {
    /// Connects the sending side on `device` (or the first one).
    pub fn connect(
        device: Option<&str>,
        exchange: Exchange,
        checksums: Checksums,
    ) -> Result<Self, TransportError> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let thread = spawn_on_queue_pair(
            "bulkhead-rdma-send",
            (device, exchange),
            MAX_FRAME.min(64 << 20),
            move |mut mr, cq, mut qp, ready| {
                ready.signal();
                let mut id = 0u64;
                while let Ok(Job::Send(frame, done)) = rx.recv() {
                    id += 1;
                    let r = if frame.len() > mr.len() {
                        Err(std::io::Error::other("frame larger than the send buffer"))
                    } else {
                        mr[..frame.len()].copy_from_slice(&frame);
                        // SAFETY: `mr` is not touched again until the
                        // completion for `id` has been polled below.
                        #[allow(unsafe_code)]
                        let posted = unsafe { qp.post_send(&mut mr, ..frame.len(), id) };
                        posted.and_then(|()| complete(cq, id).map(|_| ()))
                    };
                    let _ = done.send(r);
                }
                Ok(())
            },
        )?;
        Ok(RdmaTransport {
            jobs: Some(jobs),
            thread: Some(thread),
            checksums,
        })
    }

    async fn post(&mut self, frame: Vec<u8>) -> Result<(), TransportError> {
        let (done, wait) = oneshot::channel();
        self.jobs
            .as_ref()
            .and_then(|j| j.send(Job::Send(frame, done)).ok())
            .ok_or_else(|| TransportError::Unavailable("the RDMA thread stopped".into()))?;
        wait.await
            .map_err(|_| TransportError::Unavailable("the RDMA thread stopped".into()))??;
        Ok(())
    }
}

impl Transport for RdmaTransport {
    async fn write_page(
        &mut self,
        slot: Slot,
        page: &[u8],
        key: &crate::mac::FrameKey,
    ) -> crate::transport::Written {
        let header = slot.header(self.checksums, page, key);
        let checksum = header.checksum;
        let mut frame = header.encode(page.len()).to_vec();
        frame.extend_from_slice(page);
        self.post(frame).await?;
        Ok(checksum)
    }

    async fn send(&mut self, msg: &Message) -> Result<(), TransportError> {
        self.post(msg.encode()).await
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl RdmaReceiver {
    /// Connects the receiving side on `device` (or the first one), posting
    /// `depth` receive buffers of `frame_bytes` each.
    pub fn connect(
        device: Option<&str>,
        exchange: Exchange,
        depth: usize,
        frame_bytes: usize,
    ) -> Result<Self, TransportError> {
        let depth = depth.clamp(1, 16);
        let (tx, frames) = tokio::sync::mpsc::unbounded_channel();
        let thread = spawn_on_queue_pair(
            "bulkhead-rdma-recv",
            (device, exchange),
            depth * frame_bytes,
            move |mut mr, cq, mut qp, ready| {
                for i in 0..depth {
                    // SAFETY: buffer `i` is read only after its completion.
                    #[allow(unsafe_code)]
                    unsafe {
                        qp.post_receive(&mut mr, i * frame_bytes..(i + 1) * frame_bytes, i as u64)
                    }
                    .map_err(TransportError::Io)?;
                }
                ready.signal();
                let mut next = 0usize;
                loop {
                    let len = complete(cq, next as u64).map_err(TransportError::Io)?;
                    let at = next * frame_bytes;
                    let mut bytes = &mr[at..at + len.min(frame_bytes)];
                    let msg = decode_frame(&mut bytes);
                    if tx.send(msg).is_err() {
                        return Ok(());
                    }
                    // SAFETY: as above; the frame was copied out.
                    #[allow(unsafe_code)]
                    unsafe { qp.post_receive(&mut mr, at..at + frame_bytes, next as u64) }
                        .map_err(TransportError::Io)?;
                    next = (next + 1) % depth;
                }
            },
        )?;
        Ok(RdmaReceiver {
            frames,
            thread: Some(thread),
        })
    }

    /// The next frame, in order; `None` when the queue pair is gone.
    pub async fn next(&mut self) -> Option<Result<Message, TransportError>> {
        self.frames.recv().await
    }
}

impl Drop for RdmaReceiver {
    fn drop(&mut self) {
        self.frames.close();
        if let Some(t) = self.thread.take()
            && t.is_finished()
        {
            let _ = t.join();
        }
    }
}

/// Parses one frame from received bytes with the same decoder as TCP (on a
/// byte slice it never waits, so one poll finishes it).
fn decode_frame(bytes: &mut &[u8]) -> Result<Message, TransportError> {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let mut read = std::pin::pin!(Message::read(bytes));
    match read.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(r) => {
            r.map_err(|e| TransportError::Unavailable(format!("bad RDMA frame: {e}")))
        }
        Poll::Pending => Err(TransportError::Unavailable("truncated RDMA frame".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_is_a_clear_error_not_a_panic() {
        // Passes on hosts with RDMA too: a device that cannot exist.
        match pick(Some("bulkhead-no-such-device")) {
            Err(TransportError::Unavailable(msg)) => {
                assert!(msg.contains("RDMA"), "{msg}");
            }
            other => panic!("expected a clear error, got {other:?}"),
        }
    }
}
