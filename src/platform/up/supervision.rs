//! The components as child processes: started in order (control plane,
//! workers, gateway, prober), each one's listening line read for its
//! address, and restarted where it was, with backoff, when it exits;
//! stopped together on Ctrl-C or SIGTERM.

use super::*;
use bulkhead_trust::Role as CertRole;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The child processes, stopped in reverse order, and where their output
/// goes.
#[derive(Debug)]
pub(super) struct Components {
    pub(super) running: Vec<Running>,
    pub(super) console: Console,
}

/// A started component and how to start it again.
#[derive(Debug)]
pub(super) struct Running {
    pub(super) name: String,
    pub(super) child: Child,
    /// Its arguments with every `127.0.0.1:0` replaced by the address it
    /// bound, so a restart listens where everyone else expects it.
    pub(super) args: Vec<String>,
    /// Its secrets, passed in the environment.
    pub(super) env: Vec<(&'static str, String)>,
    pub(super) started: std::time::Instant,
    /// The wait before the next restart (doubles, at most 30 s; back to
    /// 1 s after a minute up).
    pub(super) backoff: Duration,
}

/// The key of a listening line that names what `flag` bound.
pub(super) fn bound_key(flag: &str, line: &str) -> &'static str {
    match flag {
        "--http" => "http",
        "--metrics-listen" => "metrics",
        "--internal-listen" => "internal",
        _ if line.contains("transfer=") => "transfer",
        _ => "http",
    }
}

impl Components {
    /// No component yet; their output to `console`.
    pub(super) fn new(console: Console) -> Components {
        Components {
            running: Vec::new(),
            console,
        }
    }

    /// Starts `bulkhead <args>` and waits for its `listening` line (the rest
    /// of its output is passed through), with secrets and identities in the
    /// child's environment (never on its command line, which every local
    /// user can read).
    pub(super) fn spawn_with(
        &mut self,
        name: &str,
        args: &[&str],
        env: Vec<(&'static str, String)>,
    ) -> anyhow::Result<String> {
        let name = name.to_owned();
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        // Their own process group: a Ctrl-C at the terminal reaches `up`
        // alone, which stops them in order.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting the {name}"))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let stderr = child.stderr.take().context("child stderr")?;
        self.running.push(Running {
            name: name.clone(),
            child,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env,
            started: std::time::Instant::now(),
            backoff: Duration::from_secs(1),
        });
        // Its log lines, to the console (its file, and the terminal where
        // a person should see them). Never stops draining: a component
        // blocked on a full pipe would stop serving.
        let (console, tag) = (self.console.clone(), name.clone());
        std::thread::spawn(move || {
            for l in lossy_lines(BufReader::new(stderr)) {
                console.line(&tag, true, l);
            }
        });
        let mut lines = lossy_lines(BufReader::new(stdout));
        let line = match lines.next() {
            Some(l) if l.contains("listening") => l,
            _ => anyhow::bail!(
                "the {name} did not start (see its messages above, or {})",
                self.console.log_path(&name).display()
            ),
        };
        let console = self.console.clone();
        self.console.line(&name, false, line.clone());
        std::thread::spawn(move || {
            for l in lines {
                console.line(&name, false, l);
            }
        });
        // Pin what it bound, for a restart.
        if let Some(r) = self.running.last_mut() {
            for i in 1..r.args.len() {
                if r.args[i] == "127.0.0.1:0"
                    && let Ok(a) = addr(&line, bound_key(&r.args[i - 1], &line))
                {
                    r.args[i] = a;
                }
            }
        }
        Ok(line)
    }

    /// Restarts every component that exits, with backoff, until cancelled.
    /// A restarted worker registers again; the others keep serving. Each
    /// restarted worker's node name goes to `restarted`, with when it
    /// started again.
    pub(super) async fn supervise(
        &mut self,
        restarted: tokio::sync::mpsc::UnboundedSender<(String, bulkhead_control_api::Timestamp)>,
    ) {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let Some(i) = self
                .running
                .iter_mut()
                .position(|r| matches!(r.child.try_wait(), Ok(Some(_))))
            else {
                continue;
            };
            let dead = self.running.remove(i);
            let backoff = if dead.started.elapsed() > Duration::from_secs(60) {
                Duration::from_secs(1)
            } else {
                dead.backoff
            };
            eprintln!(
                "bulkhead up: the {} exited; restarting it in {} s",
                dead.name,
                backoff.as_secs()
            );
            tokio::time::sleep(backoff).await;
            let args: Vec<&str> = dead.args.iter().map(String::as_str).collect();
            let env = dead.env.clone();
            let at = bulkhead_control_api::Timestamp::now();
            let started = tokio::task::block_in_place(|| self.spawn_with(&dead.name, &args, env));
            match started {
                Ok(_) => {
                    let r = self.running.last_mut().expect("just started");
                    // Keep it in its place, so `stop` still goes newest first.
                    r.backoff = (backoff * 2).min(Duration::from_secs(30));
                    let r = self.running.pop().expect("just started");
                    self.running.insert(i, r);
                    eprintln!("bulkhead up: the {} is back", dead.name);
                    if let Some(node) = dead.args.windows(2).find(|w| w[0] == "--node-name") {
                        let _ = restarted.send((node[1].clone(), at));
                    }
                }
                Err(e) => {
                    eprintln!("bulkhead up: restarting the {} failed: {e:#}", dead.name);
                    // Tried again when it is seen to have exited, after a
                    // longer wait.
                    if let Some(mut r) = self.running.pop() {
                        r.backoff = (backoff * 2).min(Duration::from_secs(30));
                        self.running.insert(i, r);
                    }
                }
            }
        }
    }

    /// Stops every component, newest first: SIGTERM, so it flushes its
    /// telemetry, then SIGKILL after a grace period.
    pub(super) fn stop(&mut self) {
        while let Some(Running { mut child, .. }) = self.running.pop() {
            #[cfg(unix)]
            if let Ok(pid) = i32::try_from(child.id()) {
                use nix::sys::signal::{Signal, kill};
                let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM);
                let until = std::time::Instant::now() + Duration::from_secs(3);
                while std::time::Instant::now() < until {
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Components {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Lines of `r` until it ends or fails, invalid UTF-8 replaced (a line
/// that is not text must not stop the draining).
pub(super) fn lossy_lines(mut r: impl BufRead) -> impl Iterator<Item = String> {
    std::iter::from_fn(move || {
        let mut buf = Vec::new();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    buf.pop();
                }
                Some(String::from_utf8_lossy(&buf).into_owned())
            }
        }
    })
}

pub(super) fn addr(line: &str, key: &str) -> anyhow::Result<String> {
    line.split(&format!("{key}="))
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .map(str::to_owned)
        .with_context(|| format!("no {key}= in `{line}`"))
}

pub(super) fn start(
    args: &UpArgs,
    weights: &Path,
    internal: &Internal,
    creds: &mut CredentialsFile,
    c: &mut Components,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.served().is_empty(),
        "--models names no model to serve"
    );
    let data = args
        .data_dir
        .to_str()
        .context("the data directory must be UTF-8")?;
    let weights = weights.to_str().context("the model path must be UTF-8")?;
    let mib = args.kv_budget_mib.to_string();
    // Each component's bundle: its certificate and key, the CA
    // certificate and the context keys it uses; never the CA key.
    let tls = args.data_dir.join("tls");
    let bundle = |role: CertRole| -> anyhow::Result<String> {
        Ok(crate::tls::bundle_dir(&tls, role.as_str())
            .to_str()
            .context("the data directory must be UTF-8")?
            .to_owned())
    };
    let tls_env = || -> anyhow::Result<(&str, String)> {
        Ok(("BULKHEAD_TLS_DIR", bundle(CertRole::ControlPlane)?))
    };
    let line = c.spawn_with(
        "control plane",
        &[
            "control-plane",
            "--listen",
            "127.0.0.1:0",
            "--internal-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
            data,
        ],
        vec![tls_env()?],
    )?;
    let cp = format!("http://{}", addr(&line, "http")?);
    let cp_internal = format!("https://{}", addr(&line, "internal")?);
    creds.metrics = [(
        "control-plane".to_owned(),
        format!("http://{}/metrics", addr(&line, "metrics")?),
    )]
    .into_iter()
    .collect();
    let spawn = WorkerSpawn {
        args,
        weights,
        mib: &mib,
        cp_internal: &cp_internal,
        node_token: &internal.node,
        deadline: args.prefill_deadline_secs.to_string(),
        threads: args.threads.map(|t| t.to_string()),
        corrupt: args.corrupt_answers_after.map(|n| n.to_string()),
        faults: args.frame_faults_percent.map(|p| p.to_string()),
        max_pool: pool_bound(Path::new(weights), args.kv_budget_mib << 20)?,
    };
    for served in args.served() {
        if args.colocated {
            for i in 1..=args.decode_workers {
                spawn.worker(c, creds, &served, "serve", i, &[])?;
            }
            continue;
        }
        // Prefill first: a decode worker finds them through the control plane.
        for i in 1..=args.prefill_workers {
            spawn.worker(
                c,
                creds,
                &served,
                "prefill",
                i,
                &["--listen", "127.0.0.1:0"],
            )?;
        }
        for i in 1..=args.decode_workers {
            spawn.worker(c, creds, &served, "decode", i, &[])?;
        }
    }
    let gateway_bundle = bundle(CertRole::Gateway)?;
    let line = spawn_gateway(
        c,
        args.port,
        &cp_internal,
        &internal.gateway,
        &gateway_bundle,
    )?;
    creds.gateway_url = format!("http://{}", addr(&line, "http")?);
    creds.metrics.insert(
        "gateway".to_owned(),
        format!("http://{}/metrics", addr(&line, "metrics")?),
    );
    creds.status_url = cp.clone();
    creds.control_plane_url = cp;
    creds.internal_url = cp_internal;
    Ok(())
}

/// Starts the gateway on `port`; its announcement line.
pub(super) fn spawn_gateway(
    c: &mut Components,
    port: u16,
    cp_internal: &str,
    gateway_token: &str,
    tls: &str,
) -> anyhow::Result<String> {
    let listen = format!("127.0.0.1:{port}");
    c.spawn_with(
        "gateway",
        &[
            "gateway",
            "--listen",
            &listen,
            "--control-plane",
            cp_internal,
            "--instance",
            "up",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        vec![
            ("BULKHEAD_GATEWAY_TOKEN", gateway_token.to_owned()),
            ("BULKHEAD_TLS_DIR", tls.to_owned()),
        ],
    )
}

/// What every worker `up` starts is given.
pub(super) struct WorkerSpawn<'a> {
    pub(super) args: &'a UpArgs,
    pub(super) weights: &'a str,
    pub(super) mib: &'a str,
    pub(super) cp_internal: &'a str,
    pub(super) node_token: &'a str,
    pub(super) deadline: String,
    pub(super) threads: Option<String>,
    pub(super) corrupt: Option<String>,
    pub(super) faults: Option<String>,
    /// The pool bound the workers' certificates carry.
    pub(super) max_pool: u64,
}

impl WorkerSpawn<'_> {
    /// Starts worker `i` of `served` in `role` (`prefill`, `decode` or
    /// `serve`) with `extra` flags, records its metrics URL in `creds`;
    /// its announcement line. Each model's workers hold certificates
    /// scoped to that model and to the pool they are given: they can
    /// register nothing else, and the gateway sends another model's
    /// requests to none of them.
    pub(super) fn worker(
        &self,
        c: &mut Components,
        creds: &mut CredentialsFile,
        served: &Served,
        role: &str,
        i: u8,
        extra: &[&str],
    ) -> anyhow::Result<String> {
        let slug = served.slug();
        let scope = bulkhead_trust::Scope::model(&slug, Some(self.max_pool));
        let tls_dir = self.args.data_dir.join("tls");
        let cert_role = match role {
            "prefill" => CertRole::Prefill,
            "decode" => CertRole::Decode,
            _ => CertRole::Colocated,
        };
        let bundle = scoped_bundle(&tls_dir, cert_role, &scope, &slug)?;
        let node_name = served.node_name(role, i);
        let mut a: Vec<&str> = vec![role, "--http", "127.0.0.1:0"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--model", self.weights, "--model-slug", &slug]);
        if let Some(q) = served.quantize {
            a.extend_from_slice(&["--quantize", q]);
        }
        a.extend_from_slice(&[
            "--kv-budget-mib",
            self.mib,
            "--control-plane",
            self.cp_internal,
        ]);
        a.extend_from_slice(&["--metrics-listen", "127.0.0.1:0"]);
        a.extend_from_slice(&["--node-name", &node_name]);
        a.extend_from_slice(&["--prefill-deadline-secs", &self.deadline]);
        let gate = super::compute_gate(self.args)?;
        a.extend_from_slice(&["--compute-gate", &gate]);
        if let Some(t) = &self.threads {
            a.extend_from_slice(&["--threads", t]);
        }
        if role != "prefill"
            && let Some(n) = &self.corrupt
        {
            a.extend_from_slice(&["--corrupt-answers-after", n]);
        }
        if role == "prefill"
            && let Some(p) = &self.faults
        {
            a.extend_from_slice(&["--frame-faults-percent", p]);
        }
        let env = vec![
            ("BULKHEAD_NODE_TOKEN", self.node_token.to_owned()),
            ("BULKHEAD_TLS_DIR", bundle),
        ];
        let name = format!("{} worker", &node_name["up-".len()..]);
        c.console.serves(&name, &slug);
        let line = c.spawn_with(&name, &a, env)?;
        let key = node_name.trim_start_matches("up-").to_owned();
        creds
            .metrics
            .insert(key, format!("http://{}/metrics", addr(&line, "metrics")?));
        Ok(line)
    }
}

/// Issues (or reuses) the `role` certificate scoped to `scope` in
/// `tls_dir`, and writes its own bundle (the scoped certificate and key,
/// the CA certificate and the context verifying keys); the bundle's
/// directory.
pub(super) fn scoped_bundle(
    tls_dir: &Path,
    role: CertRole,
    scope: &bulkhead_trust::Scope,
    slug: &str,
) -> anyhow::Result<String> {
    let (files, _) = bulkhead_trust::authority::init_scoped(tls_dir, role, scope)
        .with_context(|| format!("issuing the {role} certificate for {slug}"))?;
    let name = files
        .cert
        .file_stem()
        .and_then(|s| s.to_str())
        .context("the data directory must be UTF-8")?
        .to_owned();
    let bundle = crate::tls::write_bundle(tls_dir, &name, role, &files)?;
    Ok(bundle
        .to_str()
        .context("the data directory must be UTF-8")?
        .to_owned())
}

/// The most tokens a worker's pool can hold in `budget` bytes (f16 keys
/// and values, 16-token pages, as `up`'s workers keep them): the bound
/// their certificates carry. Both served variants share the geometry.
pub(super) fn pool_bound(weights: &Path, budget: u64) -> anyhow::Result<u64> {
    let model = bulkhead_engine::ModelFile::load(weights)
        .with_context(|| format!("reading {}", weights.display()))?;
    let c = model.config();
    let page = (c.layers * 2 * c.kv_heads * c.head_dim * 2 * 16) as u64;
    anyhow::ensure!(page > 0, "{}: a model with no KV", weights.display());
    Ok(budget / page * 16)
}

/// Starts the leak prober (unless `--no-prober`): the sentinels' tokens and
/// the responder's token go in its environment.
pub(super) fn start_prober(
    args: &UpArgs,
    internal: &Internal,
    creds: &mut CredentialsFile,
    c: &mut Components,
) -> anyhow::Result<()> {
    if args.no_prober {
        return Ok(());
    }
    let interval = args.prober_interval_secs.to_string();
    let state = args.data_dir.join("prober.json");
    let state = state.to_str().context("the data directory must be UTF-8")?;
    let mut a = vec![
        "prober",
        "--gateway",
        &creds.gateway_url,
        "--control-plane",
        &creds.control_plane_url,
        "--interval-secs",
        &interval,
        "--state",
        state,
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    if let Some(w) = &args.prober_webhook {
        a.extend_from_slice(&["--webhook", w]);
    }
    let env = vec![
        ("BULKHEAD_PROBER_TOKEN", creds.operator_token.clone()),
        (
            "BULKHEAD_SENTINELS",
            serde_json::to_string(&internal.sentinels)?,
        ),
    ];
    let line = c.spawn_with("prober", &a, env)?;
    let metrics = format!("http://{}/metrics", addr(&line, "metrics")?);
    creds.metrics.insert("prober".to_owned(), metrics);
    Ok(())
}

/// Starts the batch runner: its certificate's bundle in its environment;
/// it calls the control plane's internal port and the gateway.
pub(super) fn start_batch_runner(
    args: &UpArgs,
    creds: &CredentialsFile,
    c: &mut Components,
) -> anyhow::Result<()> {
    let tls = args.data_dir.join("tls");
    let bundle = crate::tls::bundle_dir(&tls, CertRole::BatchRunner.as_str())
        .to_str()
        .context("the data directory must be UTF-8")?
        .to_owned();
    let a = [
        "batch-runner",
        "--control-plane",
        &creds.internal_url,
        "--gateway",
        &creds.gateway_url,
    ];
    c.spawn_with("batch-runner", &a, vec![("BULKHEAD_TLS_DIR", bundle)])?;
    Ok(())
}
