//! The frames of the transfer protocol and their byte encoding.
//!
//! Every frame is `len: u32 LE` (of what follows), `kind: u8`, then a
//! fixed little-endian body. Frames longer than [`MAX_FRAME`] or of an
//! unknown kind are protocol errors: the connection is dropped, never
//! resynchronised.
//!
//! The frames are the variants of [`Message`]. A [`PrefillRequest`] also
//! carries the decode side's W3C `traceparent`, at most [`MAX_TRACEPARENT`]
//! visible ASCII bytes, refused otherwise.

use bulkhead_kv::{AdmissionError, CacheScope, Generation, Namespace, TransferId};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Protocol version; both ends must agree.
pub const VERSION: u16 = 5;
/// Largest frame accepted (a page of a large model fits many times over).
pub const MAX_FRAME: usize = 256 << 20;
/// Largest control frame accepted: a prefill request for a million-token
/// prompt (4 MB of ids and 64K slots) fits four times over. A peer cannot
/// make the reader allocate a page frame's bound for a control frame.
pub const MAX_CONTROL_FRAME: usize = 16 << 20;

/// What a worker tells its peer when a connection opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version.
    pub version: u16,
    /// Fingerprint of the model file: both ends must serve the same model.
    pub model: u64,
    /// Transformer layers.
    pub layers: u32,
    /// KV heads per layer.
    pub kv_heads: u32,
    /// Head dimension.
    pub head_dim: u32,
    /// Tokens per page.
    pub page_size: u32,
    /// Bytes per KV element (2 for f16, 4 for f32).
    pub dtype_bytes: u8,
    /// The model's context window on this worker.
    pub context_window: u64,
    /// Tokens this worker's pool holds.
    pub pool_tokens: u64,
    /// The longest prompt this worker prefills within its deadline
    /// (measured prefill speed).
    pub prefill_tokens: u64,
    /// How pages travel: [`TRANSPORT_TCP`] or [`TRANSPORT_RDMA`]; both ends
    /// must agree.
    pub transport: u8,
}

/// Pages travel in frames on the TCP connection.
pub const TRANSPORT_TCP: u8 = 0;
/// Pages travel as RDMA SENDs; control frames from decode stay on TCP.
pub const TRANSPORT_RDMA: u8 = 1;

/// Decode asks prefill to compute a prompt into granted landing slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillRequest {
    /// The transfer this request opens.
    pub transfer: TransferId,
    /// The tenant (prefill tags its own pages with it too).
    pub tenant: u64,
    /// Output tokens the decode side will generate (counted by admission).
    pub max_tokens: u64,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Generation of each landing slot, in slot order: exactly
    /// `ceil(prompt / page_size)` of them.
    pub slots: Vec<Generation>,
    /// The gateway's signed tenant context of the call (the
    /// `x-bulkhead-context` header decode was called with, at most
    /// [`MAX_CONTEXT`] visible ASCII bytes): prefill verifies it and takes
    /// the tenant and the cache scope from it, never from decode's word.
    pub context: String,
    /// The W3C `traceparent` of the decode side's transfer span (at most
    /// [`MAX_TRACEPARENT`] visible ASCII bytes), so prefill's spans join the
    /// request's trace.
    pub traceparent: Option<String>,
    /// This transfer's key ([`crate::mac`]): prefill tags every page and
    /// the end with it.
    pub key: [u8; crate::mac::KEY_LEN],
    /// The request's prefix-cache scope, which the decode worker derived
    /// from the signed tenant context: prefill copies the prompt's cached
    /// blocks of that scope instead of computing them. `None`: no reuse.
    pub cache: Option<CacheScope>,
}

/// Longest signed context a prefill request carries.
pub const MAX_CONTEXT: usize = 4096;

/// Longest `traceparent` a prefill request carries.
pub const MAX_TRACEPARENT: usize = 128;

/// The fixed header of a page frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageHeader {
    /// The transfer it belongs to.
    pub transfer: TransferId,
    /// The landing slot (index into the grant, not a physical page).
    pub slot: u32,
    /// The slot's granted generation, echoed.
    pub generation: Generation,
    /// CRC-32C of the payload (0 only when checksums are off for a benchmark).
    pub checksum: u64,
    /// The payload's tag under the transfer's key (zeros only when tags
    /// are off for a benchmark).
    pub mac: [u8; crate::mac::TAG_LEN],
}

/// The end of a transfer: metadata last, after every page.
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    /// The transfer.
    pub transfer: TransferId,
    /// Prompt tokens whose KV was sent.
    pub tokens: u64,
    /// Digest over every page frame's (slot, generation, checksum), the
    /// token count and the logits.
    pub digest: u64,
    /// Logits of the last prompt position.
    pub logits: Vec<f32>,
    /// The tag of (tokens, digest) under the transfer's key.
    pub mac: [u8; crate::mac::TAG_LEN],
}

/// One protocol frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Connection opening, both directions.
    Hello(Hello),
    /// Decode to prefill: open a transfer.
    Prefill(PrefillRequest),
    /// Prefill to decode: admission refused the request; nothing was sent.
    Rejected {
        /// The transfer.
        transfer: TransferId,
        /// The admission error, as prefill saw it.
        error: AdmissionError,
    },
    /// Prefill to decode: one page.
    Page(PageHeader, Vec<u8>),
    /// Prefill to decode: every page was sent.
    Done(Done),
    /// Decode to prefill: committed; free the source pages.
    Release {
        /// The transfer.
        transfer: TransferId,
    },
    /// Prefill to decode: the prompt is being computed, `computed` of its
    /// tokens are done, or it waits its turn at `place` in the queue. A live
    /// transfer is never timed out while these keep coming.
    Progress {
        /// The transfer.
        transfer: TransferId,
        /// Prompt tokens computed so far.
        computed: u64,
        /// Its place in the prefill queue, from 1 (0: being computed).
        place: u64,
    },
    /// Either way: stop this transfer.
    Abort {
        /// The transfer.
        transfer: TransferId,
    },
    /// Either way: the abort is done; the sender wrote its last frame for it.
    AbortAck {
        /// The transfer.
        transfer: TransferId,
    },
}

/// The start of a frame: a whole control frame, or a page frame's header
/// with its payload still on the wire (read it with [`read_payload`]).
#[derive(Debug)]
pub enum Head {
    /// A page header; `len` payload bytes follow.
    Page(PageHeader, usize),
    /// Any other frame, read whole.
    Message(Message),
}

/// Reads a page payload announced by [`Head::Page`] into `dst` (exactly its
/// length): the receiver chooses where it lands.
pub async fn read_payload<R: AsyncRead + Unpin>(
    r: &mut R,
    dst: &mut [u8],
) -> Result<(), WireError> {
    r.read_exact(dst).await?;
    Ok(())
}

/// A frame that could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The socket failed or closed.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not a valid frame.
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
}

const HELLO: u8 = 1;
const PREFILL: u8 = 2;
const REJECTED: u8 = 3;
const PAGE: u8 = 4;
const DONE: u8 = 5;
const RELEASE: u8 = 6;
const ABORT: u8 = 7;
const ABORT_ACK: u8 = 8;
const PROGRESS: u8 = 9;

/// Bytes of a page frame before its payload (length prefix included).
pub const PAGE_HEADER_LEN: usize = 4 + 1 + 8 + 4 + 8 + 8 + crate::mac::TAG_LEN;

impl PageHeader {
    /// The frame prefix of a page of `payload_len` bytes.
    pub fn encode(&self, payload_len: usize) -> [u8; PAGE_HEADER_LEN] {
        let mut b = [0u8; PAGE_HEADER_LEN];
        let len = u32::try_from(PAGE_HEADER_LEN - 4 + payload_len).unwrap_or(u32::MAX);
        b[0..4].copy_from_slice(&len.to_le_bytes());
        b[4] = PAGE;
        b[5..13].copy_from_slice(&self.transfer.get().to_le_bytes());
        b[13..17].copy_from_slice(&self.slot.to_le_bytes());
        b[17..25].copy_from_slice(&self.generation.get().to_le_bytes());
        b[25..33].copy_from_slice(&self.checksum.to_le_bytes());
        b[33..PAGE_HEADER_LEN].copy_from_slice(&self.mac);
        b
    }
}

impl Message {
    /// The whole frame, length prefix included. Page frames are usually
    /// written as [`PageHeader::encode`] plus the payload instead, to avoid
    /// a copy.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(64));
        w.0.extend_from_slice(&[0; 4]);
        match self {
            Message::Hello(h) => w.hello(h),
            Message::Prefill(p) => w.prefill(p),
            Message::Rejected { transfer, error } => {
                w.head(REJECTED, *transfer);
                w.admission_error(error);
            }
            Message::Page(h, payload) => {
                let head = h.encode(payload.len());
                w.0.clear();
                w.0.extend_from_slice(&head);
                w.0.extend_from_slice(payload);
                return w.0;
            }
            Message::Done(d) => {
                w.head(DONE, d.transfer);
                w.u64(d.tokens);
                w.u64(d.digest);
                w.counted(&d.logits, |w, x| w.0.extend_from_slice(&x.to_le_bytes()));
                w.0.extend_from_slice(&d.mac);
            }
            Message::Release { transfer } => w.head(RELEASE, *transfer),
            Message::Abort { transfer } => w.head(ABORT, *transfer),
            Message::Progress {
                transfer,
                computed,
                place,
            } => {
                w.head(PROGRESS, *transfer);
                w.u64(*computed);
                w.u64(*place);
            }
            Message::AbortAck { transfer } => w.head(ABORT_ACK, *transfer),
        }
        let len = len32(w.0.len() - 4);
        w.0[0..4].copy_from_slice(&len.to_le_bytes());
        w.0
    }

    /// Reads one frame, a page payload into a new buffer.
    pub async fn read<R: AsyncRead + Unpin>(r: &mut R) -> Result<Message, WireError> {
        match Self::read_head(r).await? {
            Head::Message(m) => Ok(m),
            Head::Page(h, n) => {
                let mut payload = vec![0u8; n];
                read_payload(r, &mut payload).await?;
                Ok(Message::Page(h, payload))
            }
        }
    }

    /// Reads a whole control frame, or a page frame up to its payload.
    pub async fn read_head<R: AsyncRead + Unpin>(r: &mut R) -> Result<Head, WireError> {
        let len = r.read_u32_le().await? as usize;
        if len == 0 || len > MAX_FRAME {
            return Err(WireError::Malformed("frame length out of range"));
        }
        let kind = r.read_u8().await?;
        if kind == PAGE {
            let mut head = [0u8; PAGE_HEADER_LEN - 5];
            if len < head.len() + 1 {
                return Err(WireError::Malformed("short page frame"));
            }
            r.read_exact(&mut head).await?;
            let mut c = Reader(&head);
            let h = PageHeader {
                transfer: TransferId::new(c.u64()?),
                slot: c.u32()?,
                generation: Generation::from_wire(c.u64()?),
                checksum: c.u64()?,
                mac: c.array()?,
            };
            return Ok(Head::Page(h, len - 1 - head.len()));
        }
        if len > MAX_CONTROL_FRAME {
            return Err(WireError::Malformed("control frame too long"));
        }
        let mut body = vec![0u8; len - 1];
        r.read_exact(&mut body).await?;
        let mut c = Reader(&body);
        let m = match kind {
            HELLO => Message::Hello(Hello {
                version: c.u16()?,
                model: c.u64()?,
                layers: c.u32()?,
                kv_heads: c.u32()?,
                head_dim: c.u32()?,
                page_size: c.u32()?,
                dtype_bytes: c.u8()?,
                context_window: c.u64()?,
                pool_tokens: c.u64()?,
                prefill_tokens: c.u64()?,
                transport: c.u8()?,
            }),
            PREFILL => Message::Prefill(c.prefill()?),
            REJECTED => Message::Rejected {
                transfer: c.transfer()?,
                error: c.admission_error()?,
            },
            DONE => Message::Done(c.done()?),
            RELEASE => Message::Release {
                transfer: c.transfer()?,
            },
            ABORT => Message::Abort {
                transfer: c.transfer()?,
            },
            PROGRESS => Message::Progress {
                transfer: c.transfer()?,
                computed: c.u64()?,
                place: c.u64()?,
            },
            ABORT_ACK => Message::AbortAck {
                transfer: c.transfer()?,
            },
            _ => return Err(WireError::Malformed("unknown frame kind")),
        };
        if !c.0.is_empty() {
            return Err(WireError::Malformed("trailing bytes"));
        }
        Ok(Head::Message(m))
    }
}

impl Reader<'_> {
    fn prefill(&mut self) -> Result<PrefillRequest, WireError> {
        let c = self;
        let (transfer, tenant, max_tokens) = (c.transfer()?, c.u64()?, c.u64()?);
        let prompt = c.counted(4, Reader::u32)?;
        let slots = c.counted(8, |c| c.u64().map(Generation::from_wire))?;
        let n = usize::from(c.u16()?);
        if n > MAX_CONTEXT {
            return Err(WireError::Malformed("signed context too long"));
        }
        let mut context = Vec::with_capacity(n);
        for _ in 0..n {
            context.push(c.u8()?);
        }
        if !context_ok(&context) {
            return Err(WireError::Malformed("signed context is not visible ASCII"));
        }
        let n = usize::from(c.u8()?);
        let mut tp = Vec::with_capacity(n);
        for _ in 0..n {
            tp.push(c.u8()?);
        }
        if !tp.is_empty() && !trace_ok(&tp) {
            return Err(WireError::Malformed("traceparent is not visible ASCII"));
        }
        let key = c.array()?;
        let cache = match c.u8()? {
            0 => None,
            n @ (1 | 2) => {
                let own = Namespace::from_digest(c.array()?);
                let shared = if n == 2 {
                    Some(Namespace::from_digest(c.array()?))
                } else {
                    None
                };
                Some(CacheScope::new(own, shared))
            }
            _ => return Err(WireError::Malformed("unknown cache scope kind")),
        };
        Ok(PrefillRequest {
            transfer,
            tenant,
            max_tokens,
            prompt,
            slots,
            context: String::from_utf8(context).unwrap_or_default(),
            traceparent: String::from_utf8(tp).ok().filter(|t| !t.is_empty()),
            key,
            cache,
        })
    }

    /// An admission error from its code and three numbers.
    fn admission_error(&mut self) -> Result<AdmissionError, WireError> {
        let c = self;
        let code = c.u8()?;
        let prompt_tokens = usize_of(c.u64()?);
        let max_tokens = usize_of(c.u64()?);
        let limit = usize_of(c.u64()?);
        Ok(match code {
            1 => AdmissionError::EmptyPrompt,
            2 => AdmissionError::NoOutputTokens,
            3 => AdmissionError::ContextWindowExceeded {
                prompt_tokens,
                max_tokens,
                limit,
            },
            4 => AdmissionError::PoolCapacityExceeded {
                prompt_tokens,
                max_tokens,
                limit,
            },
            5 => AdmissionError::TokenOutOfRange {
                token: prompt_tokens,
                vocab: max_tokens,
            },
            6 => AdmissionError::PrefillTooLong {
                prompt_tokens,
                limit,
            },
            7 => AdmissionError::PrefillQueueFull {
                prompt_tokens,
                queued_ms: u64::try_from(max_tokens).unwrap_or(u64::MAX),
                retry_after_ms: u64::try_from(limit).unwrap_or(u64::MAX),
            },
            _ => return Err(WireError::Malformed("unknown rejection code")),
        })
    }

    fn done(&mut self) -> Result<Done, WireError> {
        let c = self;
        Ok(Done {
            transfer: c.transfer()?,
            tokens: c.u64()?,
            digest: c.u64()?,
            logits: c.counted(4, |c| c.u32().map(f32::from_bits))?,
            mac: c.array()?,
        })
    }
}

/// A signed context the wire carries: short, visible ASCII (empty: none).
fn context_ok(c: &[u8]) -> bool {
    c.len() <= MAX_CONTEXT && c.iter().all(|b| b.is_ascii_graphic())
}

/// A traceparent the wire carries: short, visible ASCII.
fn trace_ok(t: &[u8]) -> bool {
    !t.is_empty() && t.len() <= MAX_TRACEPARENT && t.iter().all(|b| b.is_ascii_graphic())
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn usize_of(x: u64) -> usize {
    usize::try_from(x).unwrap_or(usize::MAX)
}

impl Writer {
    fn hello(&mut self, h: &Hello) {
        let w = self;
        w.u8(HELLO);
        w.u16(h.version);
        w.u64(h.model);
        w.u32(h.layers);
        w.u32(h.kv_heads);
        w.u32(h.head_dim);
        w.u32(h.page_size);
        w.u8(h.dtype_bytes);
        w.u64(h.context_window);
        w.u64(h.pool_tokens);
        w.u64(h.prefill_tokens);
        w.u8(h.transport);
    }

    fn prefill(&mut self, p: &PrefillRequest) {
        let w = self;
        w.head(PREFILL, p.transfer);
        w.u64(p.tenant);
        w.u64(p.max_tokens);
        w.counted(&p.prompt, Writer::u32);
        w.counted(&p.slots, |w, g| w.u64(g.get()));
        let ctx = Some(p.context.as_bytes())
            .filter(|c| context_ok(c))
            .unwrap_or(b"");
        w.u16(ctx.len() as u16);
        w.0.extend_from_slice(ctx);
        let tp = p
            .traceparent
            .as_deref()
            .filter(|t| trace_ok(t.as_bytes()))
            .unwrap_or("");
        w.u8(tp.len() as u8);
        w.0.extend_from_slice(tp.as_bytes());
        w.0.extend_from_slice(&p.key);
        match p.cache {
            None => w.u8(0),
            Some(scope) => {
                w.u8(if scope.shared().is_some() { 2 } else { 1 });
                w.0.extend_from_slice(scope.own().digest());
                if let Some(shared) = scope.shared() {
                    w.0.extend_from_slice(shared.digest());
                }
            }
        }
    }

    /// An admission error as a code and three numbers.
    fn admission_error(&mut self, error: &AdmissionError) {
        let w = self;
        let (code, a, b, c) = match *error {
            AdmissionError::EmptyPrompt => (1, 0, 0, 0),
            AdmissionError::NoOutputTokens => (2, 0, 0, 0),
            AdmissionError::ContextWindowExceeded {
                prompt_tokens,
                max_tokens,
                limit,
            } => (3, prompt_tokens, max_tokens, limit),
            AdmissionError::PoolCapacityExceeded {
                prompt_tokens,
                max_tokens,
                limit,
            } => (4, prompt_tokens, max_tokens, limit),
            AdmissionError::TokenOutOfRange { token, vocab } => (5, token, vocab, 0),
            AdmissionError::PrefillTooLong {
                prompt_tokens,
                limit,
            } => (6, prompt_tokens, 0, limit),
            AdmissionError::PrefillQueueFull {
                prompt_tokens,
                queued_ms,
                retry_after_ms,
            } => (
                7,
                prompt_tokens,
                usize_of(queued_ms),
                usize_of(retry_after_ms),
            ),
            _ => (0, 0, 0, 0),
        };
        w.u8(code);
        w.u64(a as u64);
        w.u64(b as u64);
        w.u64(c as u64);
    }
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, x: u8) {
        self.0.push(x);
    }
    fn u16(&mut self, x: u16) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    fn u32(&mut self, x: u32) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    fn u64(&mut self, x: u64) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    /// A control frame's kind and the transfer it is about.
    fn head(&mut self, kind: u8, transfer: TransferId) {
        self.u8(kind);
        self.u64(transfer.get());
    }
    /// `xs`'s length as a u32, then each element as `put` writes it.
    fn counted<T: Copy>(&mut self, xs: &[T], put: impl Fn(&mut Writer, T)) {
        self.u32(len32(xs.len()));
        for x in xs {
            put(self, *x);
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(WireError::Malformed("truncated frame"))?;
        self.0 = rest;
        Ok(*head)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        self.take()
    }
    /// A count of `elem`-byte items that must fit the rest of the frame.
    /// A u32 count of elements of `elem` bytes, then each as `read` reads it.
    fn counted<T>(
        &mut self,
        elem: usize,
        read: impl Fn(&mut Self) -> Result<T, WireError>,
    ) -> Result<Vec<T>, WireError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(elem) > self.0.len() {
            return Err(WireError::Malformed("count past the end of the frame"));
        }
        (0..n).map(|_| read(self)).collect()
    }
    fn transfer(&mut self) -> Result<TransferId, WireError> {
        Ok(TransferId::new(self.u64()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_control_frame_over_its_bound_is_refused_before_its_body_is_read() {
        // A frame claiming a 16 MiB + 1 body of a control kind (Done).
        let mut head = u32::try_from(MAX_CONTROL_FRAME + 1)
            .expect("in u32")
            .to_le_bytes()
            .to_vec();
        let done_kind = Message::Done(Done {
            transfer: TransferId::new(1),
            tokens: 0,
            digest: 0,
            logits: Vec::new(),
            mac: [0; crate::mac::TAG_LEN],
        })
        .encode()[4];
        head.push(done_kind);
        let mut r = &head[..];
        match Message::read_head(&mut r).await {
            Err(WireError::Malformed(why)) => assert_eq!(why, "control frame too long"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn every_frame_round_trips_and_garbage_is_refused() {
        let t = TransferId::new(0xfeed);
        let frames = vec![
            Message::Hello(Hello {
                version: VERSION,
                // Every field a different value: a swap cannot round-trip.
                model: 9,
                layers: 24,
                kv_heads: 5,
                head_dim: 96,
                page_size: 32,
                dtype_bytes: 4,
                context_window: 4_096,
                pool_tokens: 12_345,
                prefill_tokens: 678,
                transport: TRANSPORT_RDMA,
            }),
            Message::Prefill(PrefillRequest {
                transfer: t,
                tenant: 4,
                max_tokens: 8,
                prompt: vec![1, 2, 3],
                slots: vec![Generation::from_wire(7)],
                context: "v2.k1.e30.c2ln".to_owned(),
                traceparent: Some(
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
                ),
                key: [3; crate::mac::KEY_LEN],
                cache: Some(CacheScope::new(
                    Namespace::from_digest([5; 16]),
                    Some(Namespace::from_digest([6; 16])),
                )),
            }),
            Message::Rejected {
                transfer: t,
                error: AdmissionError::PoolCapacityExceeded {
                    prompt_tokens: 5,
                    max_tokens: 6,
                    limit: 7,
                },
            },
            Message::Page(
                PageHeader {
                    transfer: t,
                    slot: 2,
                    generation: Generation::from_wire(11),
                    checksum: 99,
                    mac: [4; crate::mac::TAG_LEN],
                },
                vec![5; 100],
            ),
            Message::Done(Done {
                transfer: t,
                tokens: 3,
                digest: 12,
                logits: vec![0.5, -1.0],
                mac: [5; crate::mac::TAG_LEN],
            }),
            Message::Rejected {
                transfer: t,
                error: AdmissionError::PrefillTooLong {
                    prompt_tokens: 5_000,
                    limit: 3_100,
                },
            },
            Message::Rejected {
                transfer: t,
                error: AdmissionError::PrefillQueueFull {
                    prompt_tokens: 2_252,
                    queued_ms: 61_500,
                    retry_after_ms: 9_250,
                },
            },
            Message::Progress {
                transfer: t,
                computed: 512,
                place: 0,
            },
            Message::Progress {
                transfer: t,
                computed: 0,
                place: 3,
            },
            Message::Release { transfer: t },
            Message::Abort { transfer: t },
            Message::AbortAck { transfer: t },
        ];
        let mut bytes = Vec::new();
        for f in &frames {
            bytes.extend(f.encode());
        }
        let mut r = bytes.as_slice();
        for f in &frames {
            assert_eq!(&Message::read(&mut r).await.unwrap(), f);
        }
        assert!(Message::read(&mut r).await.is_err());

        // A count that claims more items than the frame holds.
        let small = PrefillRequest {
            transfer: t,
            tenant: 1,
            max_tokens: 1,
            prompt: vec![1],
            slots: vec![],
            context: String::new(),
            traceparent: None,
            key: [0; crate::mac::KEY_LEN],
            cache: None,
        };
        let mut bad = Message::Prefill(small.clone()).encode();
        bad[29..33].copy_from_slice(&1000u32.to_le_bytes());
        assert!(matches!(
            Message::read(&mut bad.as_slice()).await,
            Err(WireError::Malformed(_))
        ));
        // A traceparent with a control character in it.
        let traced = PrefillRequest {
            traceparent: Some("00-ab".to_owned()),
            ..small
        };
        let mut ctl = Message::Prefill(traced).encode();
        // The traceparent's last byte: before the key and the cache byte.
        let last = ctl.len() - 2 - crate::mac::KEY_LEN;
        ctl[last] = b'\n';
        assert!(matches!(
            Message::read(&mut ctl.as_slice()).await,
            Err(WireError::Malformed(_))
        ));
        let huge = [0xff, 0xff, 0xff, 0x7f, PAGE];
        assert!(Message::read(&mut huge.as_slice()).await.is_err());
    }
}
