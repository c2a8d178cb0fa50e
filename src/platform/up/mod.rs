//! `bulkhead up`: the whole platform on this machine, with embedded
//! defaults. It fetches the default model if missing, opens (or creates)
//! the SQLite database in the data directory, registers the default model
//! and demo accounts, then starts the control plane, a prefill worker, a
//! decode worker and a gateway as separate processes talking over loopback
//! sockets, writes `credentials.json` and prints a ready-to-paste curl
//! line. A component that exits is restarted where it was, with backoff;
//! Ctrl-C (or SIGTERM) stops every component. A second `up` reuses the
//! data directory: same accounts, same tokens.
//!
//! By default it serves two models: the default file as it is (Q4_1) and
//! converted to Q8_0 at load, each with `--prefill-workers` prefill and
//! `--decode-workers` decode workers (colocated ones with `--colocated`); last
//! it starts the leak prober (unless `--no-prober`) and the batch runner.
//! Beside them it serves an embedding model on an embedding worker (unless
//! `--no-embeddings`; `embedding.rs`), which computes only while no
//! generation engine does (the compute gate, `compute.gate` in the data
//! directory). Tokens and the TLS
//! directory reach the components in their environment, never on a command
//! line. If this machine cannot prefill a model's configured context window
//! within `--prefill-deadline-secs`, `up` serves a smaller window, a quarter
//! under the longest prompt prefilled in time (in whole 256s), and says so;
//! a window that fits is served whole, and it says that too. A restarted
//! worker measures itself again; a window it can no longer prefill in time
//! is reduced the same way, so the platform serves again.

mod bootstrap;
mod catalog;
pub(crate) mod child;
mod console;
mod credentials;
mod embedding;
mod supervision;
mod window;

use bootstrap::*;
pub(crate) use catalog::config;
use console::Console;
use credentials::*;
use supervision::*;
use window::*;

use anyhow::Context;
use bulkhead_engine::fetch;
use clap::Args;
use std::path::PathBuf;

/// Flags of `bulkhead up`.
#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    /// Where the database and credentials live.
    #[arg(long, default_value = ".bulkhead")]
    data_dir: PathBuf,
    /// The gateway's port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 8787)]
    port: u16,
    /// KV pool memory of each worker, in MiB.
    #[arg(long, default_value_t = 512)]
    kv_budget_mib: u64,
    /// Compute threads of each worker (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Context window of the registered config (it must fit the pools).
    #[arg(long, default_value_t = 8192)]
    context_window: u64,
    /// Max output of the registered config.
    #[arg(long, default_value_t = 2048)]
    max_output: u64,
    /// Longest a prompt may take to prefill on a worker at the speed it
    /// measures when it starts; if the context window takes longer on this
    /// machine, `up` serves the longest window that does not, and says so.
    #[arg(long, default_value_t = 60)]
    prefill_deadline_secs: u64,
    /// Models to serve, as variants of the default file: `q4_1` (the file's
    /// own weights, `@cf/huggingfacetb/smollm2-135m-instruct`) and `q8_0`
    /// (converted to Q8_0 at load, the same slug with `-q8`).
    #[arg(long, value_delimiter = ',', default_value = "q4_1,q8_0", value_parser = ["q4_1", "q8_0"])]
    models: Vec<String>,
    /// Prefill workers of each model.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8))]
    prefill_workers: u8,
    /// Decode workers of each model (colocated ones with `--colocated`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8))]
    decode_workers: u8,
    /// Run each model on colocated workers (`bulkhead serve`: prefill and
    /// decode in one process) instead of prefill/decode pairs.
    #[arg(long)]
    colocated: bool,
    /// Do not serve the embedding model
    /// (`@cf/sentence-transformers/all-minilm-l6-v2`, one `bulkhead embed`
    /// worker on one thread at a lower priority than generation).
    #[arg(long)]
    no_embeddings: bool,
    /// Do not start the leak prober (`bulkhead prober`), which otherwise
    /// calls every public model as two sentinel accounts and withdraws a
    /// model whose answers leak or go wrong.
    #[arg(long)]
    no_prober: bool,
    /// Seconds between the prober's rounds.
    #[arg(long, default_value_t = 30)]
    prober_interval_secs: u64,
    /// An HTTP URL the prober POSTs each finding to.
    #[arg(long)]
    prober_webhook: Option<String>,
    /// Stream every component's log lines to the terminal (as `RUST_LOG`
    /// does); otherwise they go to `DATA_DIR/logs/` and the terminal gets
    /// state changes, warnings and a summary a minute.
    #[arg(long)]
    verbose: bool,
    /// Testing only: each decode or colocated worker answers wrong after
    /// this many requests. Refused unless built with the test hooks.
    #[arg(long, hide = true)]
    corrupt_answers_after: Option<u64>,
    /// Testing only: the embedding worker answers each call after this
    /// many with the previous call's vectors. Refused unless built with the
    /// test hooks.
    #[arg(long, hide = true)]
    corrupt_embeddings_after: Option<u64>,
    /// Testing only: each prefill worker breaks this percent of its page
    /// frames (the chaos soak). Refused unless built with the test hooks.
    #[arg(long, hide = true)]
    frame_faults_percent: Option<u8>,
}

/// A model `up` serves: the default file, as it is or converted at load.
#[derive(Debug, Clone, Copy)]
struct Served {
    /// `--models` value.
    variant: &'static str,
    /// Appended to the default slug.
    suffix: &'static str,
    /// The workers' `--quantize`, if any.
    quantize: Option<&'static str>,
    /// What its workers register (lower case).
    quantization: &'static str,
    description: &'static str,
    /// Before the role in its workers' node names.
    prefix: &'static str,
}

/// What the models `up` serves cost: Workers AI's rates for
/// `@cf/meta/llama-3.2-1b-instruct` (2,457 and 18,252 neurons per million
/// prompt and output tokens) scaled down to a 135M-parameter model.
const PRICE: bulkhead_control_api::Price = bulkhead_control_api::Price {
    input_neurons_per_mtok: 330,
    output_neurons_per_mtok: 2_460,
};

const SERVED: [Served; 2] = [
    Served {
        variant: "q4_1",
        suffix: "",
        quantize: None,
        quantization: "q4_1",
        description: "SmolLM2 135M Instruct (Q4_1), Apache-2.0",
        prefix: "up-",
    },
    Served {
        variant: "q8_0",
        suffix: "-q8",
        quantize: Some("q8_0"),
        quantization: "q8_0",
        description: "SmolLM2 135M Instruct, converted to Q8_0 at load, Apache-2.0",
        prefix: "up-q8-",
    },
];

impl Served {
    fn slug(self) -> String {
        format!("{}{}", crate::platform::register::DEFAULT_SLUG, self.suffix)
    }

    /// The node name of its `i`-th (from 1) worker of `role`.
    fn node_name(self, role: &str, i: u8) -> String {
        if i == 1 {
            format!("{}{role}", self.prefix)
        } else {
            format!("{}{role}-{i}", self.prefix)
        }
    }
}

impl UpArgs {
    /// The models to serve, in the order given, each once.
    fn served(&self) -> Vec<Served> {
        let mut out: Vec<Served> = Vec::new();
        for m in &self.models {
            if let Some(s) = SERVED.iter().find(|s| s.variant == m)
                && !out.iter().any(|o| o.variant == s.variant)
            {
                out.push(*s);
            }
        }
        out
    }
}

/// The request the printed curl line sends. SmolLM2's chat template adds a
/// default system prompt under which the 135M model rambles; a plain one,
/// greedy, gets a plain answer.
pub(crate) const EXAMPLE_BODY: &str = r#"{"messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is the capital of France?"}], "temperature": 0}"#;

pub(crate) fn run(args: &UpArgs) -> anyhow::Result<()> {
    create_private_dir(&args.data_dir)?;
    // One `up` per data directory: a second one would re-register the
    // workers of the first under new addresses. The lock dies with us.
    let lock = std::fs::File::create(args.data_dir.join("up.lock"))?;
    if lock.try_lock().is_err() {
        anyhow::bail!(
            "another `bulkhead up` is running on {}",
            args.data_dir.display()
        );
    }
    if args.port != 0 {
        std::net::TcpListener::bind(("127.0.0.1", args.port))
            .with_context(|| format!("port {} is taken (choose another with --port)", args.port))?;
    }
    let weights = fetch::ensure_default_model(&crate::config::model_source(true))
        .context("fetching the default model")?;
    let embeddings = match args.no_embeddings {
        true => None,
        false => Some(embedding::fetch()?),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // Listen for Ctrl-C and SIGTERM before any component exists, so a
    // signal during start-up still stops everything.
    let mut signals = rt.block_on(async { Signals::new() })?;
    let (internal, mut creds) = rt.block_on(bootstrap(args, embeddings.as_deref()))?;
    // Recorded before anything starts, so a failed start is retried with
    // the same accounts and tokens.
    let path = args.data_dir.join("credentials.json");
    write_private(&path, &serde_json::to_string_pretty(&creds)?)?;
    // The platform's CA and every component's certificate (reused).
    let tls = args.data_dir.join("tls");
    bulkhead_trust::authority::init_dir(&tls, &bulkhead_trust::Role::ALL)
        .context("creating the platform's TLS identities")?;
    bulkhead_worker_api::context::SigningKey::create(
        &tls.join(crate::tls::CONTEXT_SIGN),
        &tls.join(crate::tls::CONTEXT_PUB),
    )?;
    // Each component is given its own bundle, never the directory.
    crate::tls::write_role_bundles(&tls).context("writing the components' TLS bundles")?;
    let verbose = args.verbose || crate::config::telemetry_settings().log_filter.is_some();
    let console = Console::start(&args.data_dir, verbose)
        .with_context(|| format!("creating {}", args.data_dir.join("logs").display()))?;
    let mut components = Components::new(console);
    let started = start(args, &weights, &internal, &mut creds, &mut components)
        .and_then(|()| match &embeddings {
            Some(dir) => embedding::start(
                args,
                dir,
                &creds.internal_url.clone(),
                &internal.node,
                &mut creds,
                &mut components,
            ),
            None => Ok(()),
        })
        .and_then(|()| rt.block_on(check_routable(args, &creds, &internal)))
        .and_then(|()| start_prober(args, &internal, &mut creds, &mut components))
        .and_then(|()| start_batch_runner(args, &creds, &mut components));
    if let Err(e) = started {
        components.stop();
        return Err(e);
    }
    write_private(&path, &serde_json::to_string_pretty(&creds)?)?;
    announce(&creds, &args.data_dir);
    // A component that exits is restarted (same addresses, backoff); the
    // platform stops only on a signal.
    let (restarted, rechecks) = tokio::sync::mpsc::unbounded_channel();
    rt.block_on(async {
        tokio::select! {
            biased;
            () = signals.next() => {}
            () = components.supervise(restarted) => {}
            () = recheck_after_restarts(args, &creds, &internal, rechecks) => {}
        }
    });
    eprintln!("bulkhead up: stopping");
    components.stop();
    drop(lock);
    Ok(())
}

/// The compute gate every worker `up` starts is given (`compute.gate` in
/// the data directory): generation engines hold it while they compute,
/// and the embedding worker computes only while none does
/// ([`bulkhead_engine::ComputeGate`]).
fn compute_gate(args: &UpArgs) -> anyhow::Result<String> {
    let path = args.data_dir.join("compute.gate");
    path.to_str()
        .map(str::to_owned)
        .context("the data directory must be UTF-8")
}

/// Ctrl-C and SIGTERM, registered once.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
