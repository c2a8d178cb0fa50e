//! Where a transfer's pages land, frame by frame: the one implementation
//! of the decode side's page handling, run by each link's receiver and by
//! `bulkhead bench transfer`.
//!
//! A page frame's header is checked against the grant (the [`Ledger`])
//! before a byte of its payload is read; a frame that fits is read
//! straight into its lent landing page, any other into scratch memory
//! (so the stream stays in step), and the ledger rules on it either way.
//! The pages of a transfer stay here until [`Landing::end`] gives them
//! back: only then can no write for them arrive.

use bulkhead_kv::Generation;
use bulkhead_kv::{LentPage, TransferId};
use bulkhead_transfer::{
    FrameKey, Ledger, PageHeader, PageTagger, PageVerdict, WireError, read_payload,
};
use std::collections::HashMap;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The ledger of one connection and the landing pages of its open
/// transfers.
#[derive(Debug)]
pub struct Landing {
    /// What the grants allow and what arrived.
    pub ledger: Ledger,
    pages: HashMap<TransferId, Vec<LentPage>>,
    scratch: Vec<u8>,
}

impl Landing {
    /// No transfer open yet; `ledger` rules on every frame.
    pub fn new(ledger: Ledger) -> Self {
        Self {
            ledger,
            pages: HashMap::new(),
            scratch: Vec::new(),
        }
    }

    /// Opens `transfer` on its grant, its landing `pages` held here; false
    /// (and the pages dropped, so they go home) when the ledger refuses.
    pub fn open(
        &mut self,
        transfer: TransferId,
        pages: Vec<LentPage>,
        grant: (Vec<Generation>, u64),
        page_bytes: usize,
        key: FrameKey,
    ) -> bool {
        let (generations, tokens) = grant;
        let opened = self
            .ledger
            .open_transfer(transfer, generations, tokens, page_bytes, key);
        if opened {
            self.pages.insert(transfer, pages);
        }
        opened
    }

    /// Reads the payload of a page frame with header `h` (`len` bytes
    /// follow on `rd`) into its landing page if the header fits the grant,
    /// else into scratch memory; the ledger's verdict. A landing page's
    /// tag is computed piece by piece as each read lands (still in cache),
    /// not in a pass over the page of its own.
    pub async fn page<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
        h: &PageHeader,
        len: usize,
    ) -> Result<PageVerdict, WireError> {
        match landing_page(&self.ledger, &mut self.pages, h, len) {
            Some(page) => {
                if bytes::BufMut::remaining_mut(page) < len {
                    return Err(WireError::Malformed("payload larger than its landing page"));
                }
                let mut tagger = self.ledger.page_tagger(h);
                let start = page.bytes().len();
                let mut done = 0;
                while done < len {
                    let n = {
                        let mut rest = bytes::BufMut::limit(&mut *page, len - done);
                        rd.read_buf(&mut rest).await?
                    };
                    if n == 0 {
                        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
                    }
                    if let Some(t) = tagger.as_mut() {
                        t.update(&page.bytes()[start + done..start + done + n]);
                    }
                    done += n;
                }
                let landed = tagger.map(PageTagger::finish);
                Ok(self.ledger.on_landed_page(h, page.bytes(), landed))
            }
            None => {
                self.scratch.resize(len, 0);
                read_payload(rd, &mut self.scratch).await?;
                Ok(self.ledger.on_page(h, &self.scratch))
            }
        }
    }

    /// A page that arrived whole (RDMA): copied into its landing page if
    /// the header fits the grant; the ledger's verdict.
    #[cfg(feature = "rdma")]
    pub fn received_page(&mut self, h: &PageHeader, payload: &[u8]) -> PageVerdict {
        match landing_page(&self.ledger, &mut self.pages, h, payload.len()) {
            Some(page) => {
                bytes::BufMut::put_slice(page, payload);
                self.ledger.on_page(h, page.bytes())
            }
            None => self.ledger.on_page(h, payload),
        }
    }

    /// No write for `t` can arrive any more: its landing pages, given back.
    pub fn end(&mut self, t: TransferId) -> Vec<LentPage> {
        self.pages.remove(&t).unwrap_or_default()
    }

    /// The connection is gone: every landing page goes home.
    pub fn clear(&mut self) {
        self.pages.clear();
    }
}

/// The lent landing page a frame with header `h` and `len` payload bytes
/// may be read into, if the ledger says its header fits the grant.
fn landing_page<'a>(
    ledger: &Ledger,
    pages: &'a mut HashMap<TransferId, Vec<LentPage>>,
    h: &PageHeader,
    len: usize,
) -> Option<&'a mut LentPage> {
    let slot = ledger.landing_slot(h, len)?;
    pages
        .get_mut(&h.transfer)?
        .iter_mut()
        .find(|p| p.slot() == slot)
}
