//! `bulkhead bench transfer`: KV transfer throughput over loopback TCP with
//! and without checksums against a raw socket copy of the same bytes, time
//! to first token disaggregated against colocated, and what the stale-byte
//! guard (zeroing the unwritten slots of a reused page) adds to each, in
//! one run.

use crate::bench::Prompts;
use crate::config::ModelArgs;
use anyhow::{Context, bail};
use bulkhead_engine::{Engine, GenerateRequest, ModelFile, SeqEvent};
use bulkhead_kv::{Generation, KvDtype, KvGeometry, KvPool, PageTable, TenantId, TransferId};
use bulkhead_node::decode::landing::Landing;
use bulkhead_node::{DecodeOptions, DecodeWorker, PrefillOptions, PrefillWorker, hello};
use bulkhead_transfer::checksum::transfer_digest;
use bulkhead_transfer::{
    Checksums, Done, DoneVerdict, FrameKey, Grant, Head, Ledger, Message, PageVerdict, TagWidth,
    TcpTransport, Transport,
};
use bulkhead_trust::Role as CertRole;
use clap::Args;
use serde_json::json;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub(crate) struct TransferBenchArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Pages per throughput run (368,640 bytes each for the default model).
    #[arg(long, default_value_t = 256)]
    pages: usize,
    /// Prompt tokens of the time-to-first-token comparison.
    #[arg(long, default_value_t = 500)]
    prompt_tokens: usize,
    /// Hash page tags at most this wide (`pclmulqdq`, `vpclmulqdq-256`),
    /// to measure a narrower CPU's path on a wider one (test builds:
    /// `--features test-hooks`).
    #[arg(long, value_parser = ["portable", "pclmulqdq", "vpclmulqdq-256", "vpclmulqdq-512"])]
    tag_width: Option<String>,
    /// Repetitions; medians are reported.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    #[command(flatten)]
    model: ModelArgs,
}

pub(crate) fn run(args: &TransferBenchArgs) -> anyhow::Result<()> {
    if let Some(w) = &args.tag_width {
        cap_tag_width(w)?;
    }
    let model = Arc::new(args.model.load()?.0);
    let c = model.config();
    let geometry = KvGeometry {
        layers: c.layers,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        page_size: args.model.page_size,
        dtype: KvDtype::F16,
    };
    let rounds = args.rounds.max(1);
    let pages = args.pages.max(1);
    let bytes = pages * geometry.bytes_per_page();
    let window = c.context_window;
    let (mut src, table, tokens) = filled_pool(geometry, pages, window)?;
    // One long-lived destination pool, as a decode worker has.
    let mut dst = KvPool::new(geometry, pages, false);
    let raw_src = vec![7u8; bytes];
    let mut raw_dst = vec![0u8; bytes];
    let mut raw = Vec::new();
    let (mut on, mut crc, mut off, mut tls) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let identities = BenchIdentities::new()?;
    for _ in 0..rounds {
        let (t, d) = raw_copy(&raw_src, raw_dst, geometry.bytes_per_page())?;
        raw.push(t);
        raw_dst = d;
        for (checksums, link, out) in [
            (Checksums::On, None, &mut on),
            (Checksums::CrcOnlyForBenchmark, None, &mut crc),
            (Checksums::OffForBenchmark, None, &mut off),
            // What serving runs: tags, over mutual TLS (which encrypts).
            (Checksums::On, Some(&identities), &mut tls),
        ] {
            let (t, d) = protocol_copy(&mut src, &table, tokens, window, dst, checksums, link)?;
            out.push(t);
            dst = d;
        }
    }
    // Context: the loopback ceiling with one cache-hot buffer on each side.
    let mut hot = Vec::new();
    for _ in 0..rounds {
        let chunk = geometry.bytes_per_page();
        let (t, ()) = raw_copy_repeated(&raw_src[..chunk], pages)?;
        hot.push(t);
    }
    let hot_s = median(&hot);
    let (raw_s, on_s, off_s) = (median(&raw), median(&on), median(&off));
    let (crc_s, tls_s) = (median(&crc), median(&tls));
    let gbps = |s: f64| bytes as f64 / s / 1e9;

    let (colocated, disagg) = ttft(&model, args, rounds)?;
    let (col_s, dis_s) = (median(&colocated), median(&disagg));
    // The stale-byte guard's only work on the transfer path: zeroing the
    // slots of reused pages that the new owner's prompt leaves unwritten.
    let guard_transfer_s = stale_guard_cost(geometry, window, pages, tokens, rounds)?;
    let ttft_pages = (args.prompt_tokens + 1).div_ceil(geometry.page_size);
    let guard_ttft_s = stale_guard_cost(geometry, window, ttft_pages, args.prompt_tokens, rounds)?;
    let hash_gb_s = tag_hash_gb_s(geometry.bytes_per_page(), pages, rounds);
    let v = json!({
        "tag_width": TagWidth::detected().name(),
        "tag_hash_gb_s": hash_gb_s,
        "pages": pages,
        "bytes": bytes,
        "raw_gb_s": gbps(raw_s),
        "hot_loopback_gb_s": gbps(hot_s),
        "transfer_ratio_to_hot_loopback": hot_s / on_s,
        "transfer_gb_s": gbps(on_s),
        "transfer_no_checksum_gb_s": gbps(off_s),
        "transfer_crc_only_gb_s": gbps(crc_s),
        "transfer_tls_gb_s": gbps(tls_s),
        "tag_cost": on_s / crc_s - 1.0,
        "tls_and_tag_cost": tls_s / crc_s - 1.0,
        "transfer_ratio_to_raw": raw_s / on_s,
        "transfer_ratio_to_raw_no_checksum": raw_s / off_s,
        "prompt_tokens": args.prompt_tokens,
        "ttft_colocated_ms": col_s * 1e3,
        "ttft_disaggregated_ms": dis_s * 1e3,
        "ttft_ratio_disagg_to_colocated": dis_s / col_s,
        "stale_guard_us_per_transfer": guard_transfer_s * 1e6,
        "stale_guard_share_of_transfer": guard_transfer_s / on_s,
        "stale_guard_us_per_ttft": guard_ttft_s * 1e6,
        "stale_guard_share_of_ttft": guard_ttft_s / dis_s,
    });
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{v}")?;
    } else {
        print_text(&mut out, &v, rounds)?;
    }
    Ok(())
}

/// Caps the page tags' hash at the width named `name`.
fn cap_tag_width(name: &str) -> anyhow::Result<()> {
    #[cfg(feature = "test-hooks")]
    {
        let width = [
            TagWidth::Portable,
            TagWidth::Clmul128,
            TagWidth::Vpclmul256,
            TagWidth::Vpclmul512,
        ]
        .into_iter()
        .find(|w| w.name() == name)
        .ok_or_else(|| anyhow::anyhow!("no tag width {name}"))?;
        TagWidth::cap(width);
        Ok(())
    }
    #[cfg(not(feature = "test-hooks"))]
    anyhow::bail!("--tag-width {name} is only in test and benchmark builds (--features test-hooks)")
}

/// The figures of [`run`] as sentences.
fn print_text(out: &mut impl Write, v: &serde_json::Value, rounds: usize) -> std::io::Result<()> {
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let raw = f("raw_gb_s");
    writeln!(
        out,
        "KV transfer, {} pages ({:.1} MB) over loopback TCP, median of {rounds}; page tags hashed with {} ({:.1} GB/s a core alone):",
        v["pages"],
        f("bytes") / 1e6,
        v["tag_width"].as_str().unwrap_or("?"),
        f("tag_hash_gb_s")
    )?;
    writeln!(
        out,
        "  raw socket copy        {raw:>7.2} GB/s   (same bytes, buffer to buffer)"
    )?;
    writeln!(
        out,
        "  hot loopback ceiling   {:>7.2} GB/s   (one cache-hot page buffer each side; transfer is {:.2}x of it)",
        f("hot_loopback_gb_s"),
        f("transfer_ratio_to_hot_loopback")
    )?;
    writeln!(
        out,
        "  transfer, tags         {:>7.2} GB/s   {:.2}x raw; tags cost {:.1}% against CRC alone (as served on RDMA)",
        f("transfer_gb_s"),
        f("transfer_ratio_to_raw"),
        f("tag_cost") * 100.0
    )?;
    writeln!(
        out,
        "  transfer, CRC only     {:>7.2} GB/s   {:.2}x raw (the unkeyed check tags replaced)",
        f("transfer_crc_only_gb_s"),
        f("transfer_crc_only_gb_s") / raw
    )?;
    writeln!(
        out,
        "  transfer, tags + mTLS  {:>7.2} GB/s   {:.2}x raw; {:.1}% against CRC alone in the clear (as served: TLS encrypts)",
        f("transfer_tls_gb_s"),
        f("transfer_tls_gb_s") / raw,
        f("tls_and_tag_cost") * 100.0
    )?;
    writeln!(
        out,
        "  transfer, no checksums {:>7.2} GB/s   {:.2}x raw",
        f("transfer_no_checksum_gb_s"),
        f("transfer_ratio_to_raw_no_checksum")
    )?;
    writeln!(
        out,
        "Time to first token, {}-token prompt: colocated {:.1} ms, disaggregated {:.1} ms ({:.3}x)",
        v["prompt_tokens"],
        f("ttft_colocated_ms"),
        f("ttft_disaggregated_ms"),
        f("ttft_ratio_disagg_to_colocated")
    )?;
    writeln!(
        out,
        "Stale-byte guard (zeroing what a reused page's new owner leaves unwritten): {:.1} us per transfer ({:.4}% of it), {:.1} us per first token ({:.4}% of it)",
        f("stale_guard_us_per_transfer"),
        f("stale_guard_share_of_transfer") * 100.0,
        f("stale_guard_us_per_ttft"),
        f("stale_guard_share_of_ttft") * 100.0
    )
}

/// A pool of `pages` pages, all owned by one sequence whose prompt ends
/// half way into the last page, written as prefill writes them. Returns
/// the pool, the table and the prompt's token count.
fn filled_pool(
    geometry: KvGeometry,
    pages: usize,
    window: usize,
) -> anyhow::Result<(KvPool, PageTable, usize)> {
    let mut pool = KvPool::new(geometry, pages, false);
    let ps = geometry.page_size;
    let tokens = pages * ps - ps / 2;
    let admitted = pool.limits(window).admit(TenantId::new(1), tokens, 1, ())?;
    let table = pool.allocate(&admitted)?;
    pool.begin_write(&table, 0, tokens)?;
    let width = geometry.kv_heads * geometry.head_dim;
    for pos in 0..tokens {
        let k: Vec<f32> = (0..width)
            .map(|i| ((pos * 31 + i) % 997) as f32 * 1e-3)
            .collect();
        for layer in 0..geometry.layers {
            pool.write_token(&table, layer, pos, &k, &k)?;
        }
    }
    Ok((pool, table, tokens))
}

/// Median seconds [`KvPool::begin_write`] takes to make a `tokens`-token
/// prompt ready on `pages` pages that another owner filled before: the
/// work the stale-byte guard adds to a transfer (the unwritten slots of the
/// partly filled last page are zeroed; pages the prompt fills whole are
/// not touched).
fn stale_guard_cost(
    geometry: KvGeometry,
    window: usize,
    pages: usize,
    tokens: usize,
    rounds: usize,
) -> anyhow::Result<f64> {
    let mut pool = KvPool::new(geometry, pages, false);
    let limits = pool.limits(window);
    let ps = geometry.page_size;
    let mut times = Vec::new();
    for _ in 0..rounds {
        // A previous owner fills every page and leaves.
        let before = limits.admit(TenantId::new(2), pages * ps - 1, 1, ())?;
        let table = pool.allocate(&before)?;
        pool.begin_write(&table, 0, pages * ps)?;
        pool.release(table);
        let admitted = limits.admit(TenantId::new(1), tokens, 1, ())?;
        let table = pool.allocate(&admitted)?;
        let start = Instant::now();
        pool.begin_write(&table, 0, tokens)?;
        times.push(start.elapsed().as_secs_f64());
        pool.release(table);
    }
    Ok(median(&times))
}

/// How fast one core computes page tags alone: `pages` pages of
/// `page_bytes` (cache-cold, as a transfer's pages are), best of `rounds`.
fn tag_hash_gb_s(page_bytes: usize, pages: usize, rounds: usize) -> f64 {
    let key = FrameKey::from_bytes(&BENCH_KEY);
    let memory: Vec<u8> = (0..page_bytes * pages)
        .map(|i| (i * 131 % 251) as u8)
        .collect();
    let mut best = f64::MAX;
    let mut fold = 0u8;
    for _ in 0..rounds {
        let start = Instant::now();
        for (i, page) in memory.chunks_exact(page_bytes).enumerate() {
            fold ^= key.page_tag(i as u32, Generation::from_wire(1), page)[0];
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    std::hint::black_box(fold);
    memory.len() as f64 / best.max(1e-9) / 1e9
}

/// Seconds to move `src` into `dst` (the same bytes, from and to memory of
/// the same size as the pools) through a plain blocking loopback socket,
/// `chunk` at a time: what the wire alone can do.
fn raw_copy(src: &[u8], mut dst: Vec<u8>, chunk: usize) -> anyhow::Result<(f64, Vec<u8>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let reader = std::thread::Builder::new()
        .name("bh-raw-recv".into())
        .spawn(move || -> std::io::Result<Vec<u8>> {
            let (mut s, _) = listener.accept()?;
            for c in dst.chunks_mut(chunk) {
                s.read_exact(c)?;
            }
            s.write_all(&[1])?;
            Ok(dst)
        })?;
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let start = Instant::now();
    for c in src.chunks(chunk) {
        s.write_all(c)?;
    }
    let mut done = [0u8; 1];
    s.read_exact(&mut done)?;
    let t = start.elapsed().as_secs_f64();
    let dst = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    Ok((t, dst))
}

/// Seconds to send `page` `times` times through a blocking loopback socket
/// into one reused buffer: the kernel's loopback path with hot caches.
fn raw_copy_repeated(page: &[u8], times: usize) -> anyhow::Result<(f64, ())> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let len = page.len();
    let reader = std::thread::Builder::new()
        .name("bh-hot-recv".into())
        .spawn(move || -> std::io::Result<()> {
            let (mut s, _) = listener.accept()?;
            let mut buf = vec![0u8; len];
            for _ in 0..times {
                s.read_exact(&mut buf)?;
            }
            s.write_all(&[1])
        })?;
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let start = Instant::now();
    for _ in 0..times {
        s.write_all(page)?;
    }
    let mut done = [0u8; 1];
    s.read_exact(&mut done)?;
    let t = start.elapsed().as_secs_f64();
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    Ok((t, ()))
}

/// Seconds to move every page of `table` from `src` into `dst` through the
/// real protocol, as the workers do it: source pages lent to the sender and
/// written in place (checksummed or not), landing pages lent to the
/// receiver, which checks each header against the grant, reads the payload
/// straight into its slot, verifies it with the ledger, then takes the pages
/// home and commits after the digest check.
fn protocol_copy(
    src: &mut KvPool,
    table: &PageTable,
    tokens: usize,
    window: usize,
    dst: KvPool,
    checksums: Checksums,
    tls: Option<&BenchIdentities>,
) -> anyhow::Result<(f64, KvPool)> {
    let acceptor = tls.map(|i| i.acceptor.clone());
    let connector = tls.map(|i| i.connector.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let receiver = std::thread::Builder::new().name("bh-recv".into()).spawn(
        move || -> anyhow::Result<KvPool> {
            let (s, _) = listener.accept()?;
            s.set_nonblocking(true)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(receive(s, acceptor, dst, window, tokens, checksums))
        },
    )?;
    let elapsed = rt.block_on(send_all(addr, connector, src, table, tokens, checksums))?;
    let dst = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("receiver panicked"))??;
    Ok((elapsed, dst))
}

/// The receiving side of [`protocol_copy`]: a decode worker's own [`Landing`] lands a
/// transfer: grant, pages checked against the ledger and read into their
/// slots, commit after the digest; the pool back.
async fn receive(
    s: std::net::TcpStream,
    acceptor: Option<bulkhead_trust::tokio_rustls::TlsAcceptor>,
    mut dst: KvPool,
    window: usize,
    tokens: usize,
    checksums: Checksums,
) -> anyhow::Result<KvPool> {
    let geometry = dst.geometry();
    use tokio::io::AsyncWriteExt;
    let tcp = tokio::net::TcpStream::from_std(s)?;
    let mut s: Box<dyn Stream> = match acceptor {
        Some(a) => Box::new(a.accept(bulkhead_trust::wire(tcp)).await?),
        None => Box::new(tcp),
    };
    let limits = dst.limits(window);
    let admitted = limits.admit(TenantId::new(2), tokens, 1, ())?;
    let t = TransferId::new(1);
    let landing = dst.allocate_receiving(&admitted, t)?;
    let gens: Vec<Generation> = landing.generations().collect();
    let lent = dst.lend_landing(&landing, t, None);
    // The grant goes to the sender first.
    let mut g = Vec::with_capacity(gens.len() * 8);
    for x in &gens {
        g.extend_from_slice(&x.get().to_le_bytes());
    }
    s.write_all(&g).await?;
    s.flush().await?;
    // From here on, the decode worker's own landing code.
    let mut land = Landing::new(Ledger::new(checksums));
    if !land.open(
        t,
        lent,
        (gens, tokens as u64),
        geometry.bytes_per_page(),
        FrameKey::from_bytes(&BENCH_KEY),
    ) {
        bail!("the ledger refused to open the transfer");
    }
    loop {
        match Message::read_head(&mut s).await? {
            Head::Page(h, len) => {
                let verdict = land.page(&mut s, &h, len).await?;
                if !matches!(verdict, PageVerdict::Write { .. }) {
                    bail!("page refused: {verdict:?}");
                }
            }
            Head::Message(Message::Done(d)) => match land.ledger.on_done(&d) {
                DoneVerdict::Commit(_) => {
                    for p in land.end(t) {
                        dst.restore(p);
                    }
                    if !dst.commit_received(&landing, t) {
                        bail!("a landing page was not written whole");
                    }
                    s.write_all(&[1]).await?;
                    s.flush().await?;
                    dst.release(landing);
                    return Ok(dst);
                }
                v => bail!("transfer refused: {v:?}"),
            },
            Head::Message(m) => bail!("unexpected frame {m:?}"),
        }
    }
}

/// The sending side of [`protocol_copy`], as a prefill worker sends: every
/// page of `table` lent and written in place, then the digest; the seconds
/// until the receiver acknowledged.
async fn send_all(
    addr: std::net::SocketAddr,
    connector: Option<bulkhead_trust::tokio_rustls::TlsConnector>,
    src: &mut KvPool,
    table: &PageTable,
    tokens: usize,
    checksums: Checksums,
) -> anyhow::Result<f64> {
    let n = table.len();
    use tokio::io::AsyncReadExt;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let s: Box<dyn Stream> = match connector {
        Some(c) => Box::new(
            c.connect(
                CertRole::Decode.dns_name().try_into()?,
                bulkhead_trust::wire(tcp),
            )
            .await?,
        ),
        None => Box::new(tcp),
    };
    let (mut rd, wr) = tokio::io::split(s);
    let mut g = vec![0u8; n * 8];
    rd.read_exact(&mut g).await?;
    let gens: Vec<Generation> = g
        .chunks_exact(8)
        .map(|c| Generation::from_wire(u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))))
        .collect();
    let grant = Grant::new(TransferId::new(1), gens, FrameKey::from_bytes(&BENCH_KEY));
    let mut t = TcpTransport::new(wr, checksums, Duration::from_secs(30));
    let start = Instant::now();
    let mut sent = Vec::with_capacity(n);
    let mut lent = Vec::with_capacity(n);
    for i in 0..n {
        let page = src.lend_source(table, i, None)?;
        let slot = grant.slot(i).context("slot granted")?;
        let sum = t.write_page(slot, page.bytes(), grant.key()).await?;
        sent.push((slot.generation(), sum));
        lent.push(page);
    }
    let tokens = tokens as u64;
    let logits = vec![0.0f32; 16];
    let digest = transfer_digest(&sent, tokens, &logits);
    let mac = grant.key().done_tag(tokens, digest);
    t.send(&Message::Done(Done {
        transfer: TransferId::new(1),
        tokens,
        digest,
        logits,
        mac,
    }))
    .await?;
    let mut ack = [0u8; 1];
    rd.read_exact(&mut ack).await?;
    let elapsed = start.elapsed().as_secs_f64();
    for p in lent {
        src.restore(p);
    }
    anyhow::Ok(elapsed)
}

/// Time to first token, colocated and disaggregated (prefill and decode
/// engines in this process, talking over loopback TCP), `rounds` each.
fn ttft(
    model: &Arc<ModelFile>,
    args: &TransferBenchArgs,
    rounds: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let mut config = args.model.engine_config();
    config.kv_budget_bytes = config.kv_budget_bytes.min(256 << 20);
    let colocated = Engine::start(Arc::clone(model), &config)?;
    let prefill_engine = Arc::new(Engine::start(Arc::clone(model), &config)?);
    let decode_engine = Arc::new(Engine::start(Arc::clone(model), &config)?);
    let prompts = Prompts::new(model, args.prompt_tokens, rounds)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let decode = in_process_pair(prefill_engine, decode_engine).await?;
        let request =
            |i: usize| GenerateRequest::fixed_length(prompts.get(i, args.prompt_tokens), 1);
        // One warm-up each, then alternate.
        let (mut col, mut dis) = (Vec::new(), Vec::new());
        for i in 0..=rounds {
            let start = Instant::now();
            let mut h = colocated.submit(TenantId::new(1), request(i % rounds))?;
            first_token(h.next().await)?;
            let c = start.elapsed().as_secs_f64();
            drop(h);
            let start = Instant::now();
            let mut h = decode
                .submit(TenantId::new(1), request(i % rounds))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            first_token(h.next().await)?;
            let d = start.elapsed().as_secs_f64();
            drop(h);
            if i > 0 {
                col.push(c);
                dis.push(d);
            }
        }
        Ok((col, dis))
    })
}

/// Any byte stream the protocol runs over (TCP, or TLS over TCP).
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

/// The benchmark's transfer key (the protocol's cost does not depend on it).
const BENCH_KEY: [u8; bulkhead_transfer::mac::KEY_LEN] = [0x42; bulkhead_transfer::mac::KEY_LEN];

/// A prefill identity's acceptor and a decode identity's connector, from a
/// CA made for this run: the transfer connection as served.
struct BenchIdentities {
    acceptor: bulkhead_trust::tokio_rustls::TlsAcceptor,
    connector: bulkhead_trust::tokio_rustls::TlsConnector,
}

impl BenchIdentities {
    fn new() -> anyhow::Result<BenchIdentities> {
        let dir = bench_tls_dir()?;
        let id = |role| {
            bulkhead_trust::Identity::load(&bulkhead_trust::TlsFiles::in_dir(&dir, role), role)
        };
        Ok(BenchIdentities {
            acceptor: id(CertRole::Prefill)?.acceptor(&[CertRole::Decode])?,
            connector: id(CertRole::Decode)?.connector(&[CertRole::Prefill])?,
        })
    }
}

/// A CA and the worker identities for this run.
fn bench_tls_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("bulkhead-bench-tls-{}", std::process::id()));
    bulkhead_trust::authority::init_dir(&dir, &[CertRole::Prefill, CertRole::Decode])?;
    Ok(dir)
}

/// A decode worker linked to a prefill worker in this process, and the
/// gateway key this run signs each call's context with.
#[derive(Clone)]
pub(crate) struct Pair {
    decode: DecodeWorker,
    gateway: bulkhead_worker_api::context::SigningKey,
}

impl Pair {
    /// Submits `request` for `tenant` with a context signed as the gateway
    /// signs one.
    pub(crate) fn submit(
        &self,
        tenant: TenantId,
        request: GenerateRequest,
    ) -> Result<bulkhead_engine::RequestHandle, bulkhead_node::SubmitError> {
        static CALL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let call = CALL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ctx = bulkhead_worker_api::context::TenantContext::new(
            &"0".repeat(32),
            tenant.get(),
            format!("bench-{call}"),
            crate::platform::register::DEFAULT_SLUG,
            None,
            u64::from(u32::MAX),
            None,
            std::time::SystemTime::now(),
        );
        self.decode.submit(tenant, request, self.gateway.sign(&ctx))
    }
}

/// A prefill worker on a loopback port and a decode worker linked to it,
/// both in this process (call inside a tokio runtime).
pub(crate) async fn in_process_pair(
    prefill_engine: Arc<Engine>,
    decode_engine: Arc<Engine>,
) -> anyhow::Result<Pair> {
    let gateway = bulkhead_worker_api::context::SigningKey::generate();
    // Mutual TLS as in production, with a CA made for this run.
    let tls = bench_tls_dir()?;
    let identity = |role: CertRole| {
        bulkhead_trust::Identity::load(&bulkhead_trust::TlsFiles::in_dir(&tls, role), role)
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let listener = bulkhead_trust::TlsListener::new(
        listener,
        identity(CertRole::Prefill)?.acceptor(&[CertRole::Decode])?,
    )?;
    let tcp = bulkhead_node::TransportKind::Tcp;
    let p_hello = hello(&prefill_engine, &tcp);
    let mut options = PrefillOptions::new(Duration::from_secs(30), tcp.clone());
    options.contexts = bulkhead_node::prefill::ContextKeys::new(
        gateway.verifying(),
        crate::platform::register::DEFAULT_SLUG,
    );
    let prefill = PrefillWorker::new(prefill_engine, p_hello, options);
    tokio::spawn(prefill.serve(listener));
    let d_hello = hello(&decode_engine, &tcp);
    let decode = DecodeWorker::start(
        decode_engine,
        d_hello,
        DecodeOptions {
            prefill: vec![addr],
            transfer_timeout: Duration::from_secs(60),
            ack_timeout: Duration::from_secs(10),
            transport: tcp,
            identity: identity(CertRole::Decode)?,
            model: crate::platform::register::DEFAULT_SLUG.to_owned(),
        },
    );
    if !decode.ready(Duration::from_secs(10)).await {
        bail!("the in-process prefill worker did not answer");
    }
    Ok(Pair { decode, gateway })
}

fn first_token(ev: Option<SeqEvent>) -> anyhow::Result<()> {
    match ev {
        Some(SeqEvent::Token { .. } | SeqEvent::Finished { .. }) => Ok(()),
        Some(SeqEvent::Failed(e)) => bail!("request failed: {e}"),
        None => bail!("the engine stopped"),
    }
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
