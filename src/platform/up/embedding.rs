//! The embedding model `up` serves beside the generating ones (unless
//! `--no-embeddings`): sentence-transformers' all-MiniLM-L6-v2 from its
//! PyPI package, published public under
//! `@cf/sentence-transformers/all-minilm-l6-v2` with a config of its own
//! (its sequence limit as the window, no output, no KV) and a price, and
//! served by one `bulkhead embed` worker on one thread in the idle
//! scheduling class (nice 19 where that cannot be set), so generation
//! keeps the cores it needs when both are busy.

use super::supervision::{Components, addr, scoped_bundle};
use super::*;
use bulkhead_control_api::{ConfigSpec, KvBudget, Parallelism, Price, Properties, Timestamp};
use bulkhead_control_plane::store;
use bulkhead_trust::Role as CertRole;
use std::path::Path;

pub(crate) use crate::platform::embed_worker::EMBED_SLUG;

/// Its compute threads: one, so that generation keeps the other core.
const THREADS: &str = "1";

/// Its node name.
pub(super) const NODE_NAME: &str = "up-embed";

/// What it costs: Workers AI's rate for `@cf/baai/bge-small-en-v1.5`
/// (1,841 neurons per million tokens, 33M parameters) scaled to this
/// model's 22M.
const PRICE: Price = Price {
    input_neurons_per_mtok: 1_230,
    output_neurons_per_mtok: 0,
};

/// Tokens one call may hold (the worker's `--max-tokens`, and the pool
/// its certificate allows).
const MAX_TOKENS: u64 = 32_768;

/// The model's directory in the cache, fetched and verified if missing.
pub(super) fn fetch() -> anyhow::Result<PathBuf> {
    bulkhead_embed::package::ensure(&crate::config::model_source(true))
        .context("fetching the embedding model")
}

/// The model's config: its files' sha256 and sequence limit.
fn config(dir: &Path) -> anyhow::Result<ConfigSpec> {
    let limit = bulkhead_embed::EmbedConfig::read(dir)?.max_seq_length;
    let weights = bulkhead_embed::package::PACKAGE
        .files
        .iter()
        .find(|f| f.name.ends_with("/model.safetensors"))
        .context("the package names no weights")?;
    Ok(ConfigSpec {
        properties: Properties {
            context_window: limit as u64,
            max_output: 0,
        },
        weights_file: "model.safetensors".to_owned(),
        weights_sha256: weights.sha256.to_owned(),
        quantization: "f32".to_owned(),
        page_size: 1,
        kv_budget: KvBudget {
            prefill_bytes: 0,
            decode_bytes: 0,
        },
        parallelism: Parallelism::default(),
        price: PRICE,
    })
}

/// Publishes the model, public, with its config (a new version only when
/// it changed).
pub(super) async fn publish(c: &mut store::Conn, dir: &Path, now: Timestamp) -> anyhow::Result<()> {
    let model = super::catalog::NewModel {
        slug: EMBED_SLUG.parse()?,
        task: bulkhead_control_api::EMBEDDING_TASK,
        description: "all-MiniLM-L6-v2 sentence embeddings (384 dimensions), Apache-2.0",
    };
    super::catalog::publish(c, &model, &config(dir)?, now).await?;
    Ok(())
}

/// Starts the embedding worker, its certificate scoped to the model;
/// records its metrics URL.
pub(super) fn start(
    args: &UpArgs,
    dir: &Path,
    cp_internal: &str,
    node_token: &str,
    creds: &mut CredentialsFile,
    c: &mut Components,
) -> anyhow::Result<()> {
    let scope = bulkhead_trust::Scope::model(EMBED_SLUG, Some(MAX_TOKENS));
    let bundle = scoped_bundle(
        &args.data_dir.join("tls"),
        CertRole::Colocated,
        &scope,
        EMBED_SLUG,
    )?;
    let dir = dir.to_str().context("the model path must be UTF-8")?;
    let max_tokens = MAX_TOKENS.to_string();
    let deadline = args.prefill_deadline_secs.to_string();
    let corrupt = args.corrupt_embeddings_after.map(|n| n.to_string());
    let gate = super::compute_gate(args)?;
    let mut a = vec![
        "embed",
        "--http",
        "127.0.0.1:0",
        "--model-dir",
        dir,
        "--model-slug",
        EMBED_SLUG,
        "--max-tokens",
        &max_tokens,
        "--threads",
        THREADS,
        "--nice",
        "19",
        "--idle",
        "--compute-gate",
        &gate,
        "--prefill-deadline-secs",
        &deadline,
        "--control-plane",
        cp_internal,
        "--metrics-listen",
        "127.0.0.1:0",
        "--node-name",
        NODE_NAME,
    ];
    if let Some(n) = &corrupt {
        a.extend_from_slice(&["--corrupt-answers-after", n]);
    }
    let env = vec![
        ("BULKHEAD_NODE_TOKEN", node_token.to_owned()),
        ("BULKHEAD_TLS_DIR", bundle),
    ];
    let component = "embed worker";
    c.console.serves(component, EMBED_SLUG);
    let line = c.spawn_with(component, &a, env)?;
    creds.metrics.insert(
        "embed".to_owned(),
        format!("http://{}/metrics", addr(&line, "metrics")?),
    );
    creds.embedding_model = Some(EMBED_SLUG.to_owned());
    Ok(())
}
