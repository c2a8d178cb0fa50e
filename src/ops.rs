//! Responder commands that call the control plane's admin API:
//! `bulkhead model list|private|public`, `bulkhead incident
//! open|update|resolve|list` and `bulkhead audit`. They find the control
//! plane and token in `BULKHEAD_CONTROL_PLANE_URL` and `BULKHEAD_TOKEN`, or
//! else in `credentials.json` under `--data-dir`; they print a short human
//! summary, or the API's JSON with `--json`.
//!
//! A refused token is reported with where it came from; a slug the control
//! plane does not know gets the nearest registered slug as a suggestion; a
//! flip shows its progress while the gateways apply it and fails (exit 1)
//! when not every live gateway confirmed it.
//!
//! `bulkhead usage` prints the ledger by UTC day, account and model, and
//! `bulkhead budget` sets an account's daily and monthly budgets and free
//! allowance (admins).

use anyhow::anyhow;
use bulkhead_control_api::{
    AuditEntry, Client, ClientError, ComponentChange, ComponentStatus, Credentials, Impact,
    IncidentStatus, IncidentView, ModelChange, ModelSlug, ModelView, OpenIncident, SetVisibility,
    UpdateIncident, Visibility,
};
use clap::{Args, Subcommand};
use serde::Serialize;
use std::path::PathBuf;

/// How to reach the control plane.
#[derive(Debug, Args)]
pub(crate) struct Connection {
    /// Control plane URL (else `control_plane_url` of credentials.json).
    #[arg(
        long = "control-plane",
        env = "BULKHEAD_CONTROL_PLANE_URL",
        hide_env_values = true
    )]
    url: Option<String>,
    /// Operator token (else `operator_token` of credentials.json).
    #[arg(long = "token", env = "BULKHEAD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Where `bulkhead up` wrote credentials.json.
    #[arg(long, default_value = ".bulkhead")]
    data_dir: PathBuf,
    /// Print the API's JSON instead of a summary.
    #[arg(long)]
    json: bool,
}

/// `bulkhead model private|public SLUG --reason ...`.
#[derive(Debug, Args)]
pub(crate) struct FlipArgs {
    /// Model slug, e.g. @cf/huggingfacetb/smollm2-135m-instruct.
    slug: ModelSlug,
    /// Why; recorded in the audit log.
    #[arg(long)]
    reason: String,
    /// A planned flip: let streams in flight finish instead of ending them
    /// (making a model private ends them by default).
    #[arg(long)]
    keep_streams: bool,
    #[command(flatten)]
    conn: Connection,
}

/// `bulkhead model list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    conn: Connection,
}

/// `bulkhead incident ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum IncidentCommand {
    /// Open an incident.
    Open {
        /// Title shown on the status page.
        #[arg(long)]
        name: String,
        /// none, minor, major or critical.
        #[arg(long)]
        impact: Impact,
        /// investigating, identified or monitoring.
        #[arg(long, default_value = "investigating")]
        status: IncidentStatus,
        /// First update's text.
        #[arg(long)]
        body: String,
        /// Affected model and its status, e.g. `@cf/org/m=major_outage`; repeatable.
        #[arg(long = "component", value_parser = parse_component)]
        components: Vec<ComponentChange>,
        #[command(flatten)]
        conn: Connection,
    },
    /// Post an update.
    Update {
        /// Incident id.
        id: i64,
        /// investigating, identified or monitoring.
        #[arg(long)]
        status: IncidentStatus,
        /// Update text.
        #[arg(long)]
        body: String,
        /// New impact.
        #[arg(long)]
        impact: Option<Impact>,
        /// Model and its new status; repeatable.
        #[arg(long = "component", value_parser = parse_component)]
        components: Vec<ComponentChange>,
        #[command(flatten)]
        conn: Connection,
    },
    /// Resolve it; affected models go back to operational.
    Resolve {
        /// Incident id.
        id: i64,
        /// Closing text.
        #[arg(long)]
        body: String,
        /// Postmortem to publish with it.
        #[arg(long)]
        postmortem: Option<String>,
        #[command(flatten)]
        conn: Connection,
    },
    /// The most recent incidents.
    List {
        #[command(flatten)]
        conn: Connection,
    },
}

/// `bulkhead audit`.
#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    /// Only entries about this subject (e.g. a model slug).
    #[arg(long)]
    subject: Option<String>,
    /// At most this many, newest first.
    #[arg(long, default_value_t = 50)]
    limit: u32,
    #[command(flatten)]
    conn: Connection,
}

/// `bulkhead usage`.
#[derive(Debug, Args)]
pub(crate) struct UsageArgs {
    /// Only this account (32 hex digits).
    #[arg(long)]
    account: Option<String>,
    /// First UTC day, YYYY-MM-DD (default: 30 days ago).
    #[arg(long)]
    since: Option<String>,
    /// Last UTC day, YYYY-MM-DD (default: today).
    #[arg(long)]
    until: Option<String>,
    #[command(flatten)]
    conn: Connection,
}

#[derive(Debug, Args)]
pub(crate) struct BudgetArgs {
    /// The account (32 hex digits).
    account: String,
    /// Neurons per UTC day (default: unlimited).
    #[arg(long)]
    daily: Option<u64>,
    /// Neurons per UTC calendar month (default: unlimited).
    #[arg(long)]
    monthly: Option<u64>,
    /// Neurons a day not billed.
    #[arg(long, default_value_t = bulkhead_control_api::DEFAULT_FREE_NEURONS_PER_DAY)]
    free: u64,
    /// Why, for the audit log.
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    conn: Connection,
}

fn parse_component(s: &str) -> Result<ComponentChange, String> {
    let (slug, status) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("`{s}`: expected SLUG=STATUS, e.g. @cf/org/model=major_outage"))?;
    Ok(ComponentChange {
        model: slug
            .parse()
            .map_err(|e: bulkhead_control_api::SlugError| e.to_string())?,
        status: status
            .parse::<ComponentStatus>()
            .map_err(|e| e.to_string())?,
    })
}

impl Connection {
    fn client(&self) -> anyhow::Result<Client> {
        let creds = Credentials::resolve(self.url.clone(), self.token.clone(), &self.data_dir)?;
        Ok(Client::new(&creds)?)
    }

    /// Where the token came from, for a refusal's message.
    fn token_source(&self) -> String {
        match &self.token {
            Some(t) if crate::config::secret("BULKHEAD_TOKEN").as_ref() == Some(t) => {
                "the environment (BULKHEAD_TOKEN)".to_owned()
            }
            Some(_) => "--token".to_owned(),
            None => self.data_dir.join("credentials.json").display().to_string(),
        }
    }

    /// An admin call's error, with the token's source when it was refused.
    fn explain(&self, e: ClientError) -> anyhow::Error {
        match &e {
            ClientError::Api {
                status: 401 | 403, ..
            } => anyhow!("{e} (the token came from {})", self.token_source()),
            _ => e.into(),
        }
    }

    /// Runs one admin call.
    fn call<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> anyhow::Result<T> {
        block_on(async { f.await.map_err(|e| self.explain(e)) })
    }
}

/// `e`, with the registered slug nearest to `slug` suggested when the
/// control plane does not know it.
fn unknown_model(
    client: &Client,
    conn: &Connection,
    slug: &str,
    e: anyhow::Error,
) -> anyhow::Error {
    let not_found = e
        .downcast_ref::<ClientError>()
        .is_some_and(|c| matches!(c, ClientError::Api { status: 404, .. }));
    if !not_found {
        return e;
    }
    let known: Vec<ModelView> = conn
        .call(client.get("/admin/v1/models"))
        .unwrap_or_default();
    match nearest(slug, known.iter().map(|m| m.slug.as_str())) {
        Some(s) => anyhow!("no model {slug} is registered; did you mean {s}?"),
        None => anyhow!("no model {slug} is registered (`bulkhead model list` shows them)"),
    }
}

/// The candidate nearest to `wanted` by edit distance, if it is near
/// enough to be a typo (at most a third of its length away).
fn nearest<'a>(wanted: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .map(|c| (edit_distance(wanted, c), c))
        .filter(|(d, c)| *d > 0 && *d * 3 <= c.chars().count().max(3))
        .min()
        .map(|(_, c)| c)
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub(crate) fn model_list(args: &ListArgs) -> anyhow::Result<()> {
    let client = args.conn.client()?;
    let models: Vec<ModelView> = args.conn.call(client.get("/admin/v1/models"))?;
    if args.conn.json {
        return print_json(&models);
    }
    if models.is_empty() {
        println!("no models registered");
    }
    for m in &models {
        let limits = m.properties.map_or_else(
            || "no active config".to_owned(),
            |p| {
                format!(
                    "config v{} ctx {} out {}",
                    m.active_config.unwrap_or(0),
                    p.context_window,
                    p.max_output
                )
            },
        );
        let allow = if m.visibility == Visibility::Private && !m.allowlist.is_empty() {
            format!(" (allowlist: {})", m.allowlist.len())
        } else {
            String::new()
        };
        println!(
            "{}  {}{}  {}  {}",
            m.slug, m.visibility, allow, m.component_status, limits
        );
    }
    Ok(())
}

pub(crate) fn model_flip(args: &FlipArgs, to: Visibility) -> anyhow::Result<()> {
    let client = args.conn.client()?;
    let body = SetVisibility {
        visibility: to,
        reason: args.reason.clone(),
        end_streams: !args.keep_streams,
    };
    let path = format!("/admin/v1/models/{}/visibility", args.slug.path_segment());
    // The answer comes once every live gateway applied the flip (or their
    // lease ran out): say what is happening meanwhile.
    let change: ModelChange = block_on(async {
        let call = client.post(&path, &body);
        tokio::pin!(call);
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        tick.tick().await;
        let mut waited = 0u64;
        loop {
            tokio::select! {
                r = &mut call => break r.map_err(|e| args.conn.explain(e)),
                _ = tick.tick() => {
                    waited += 1;
                    eprintln!("waiting for every gateway to apply it: {waited} s");
                }
            }
        }
    })
    .map_err(|e| unknown_model(&client, &args.conn, args.slug.as_str(), e))?;
    if args.conn.json {
        print_json(&change)?;
    } else {
        match &change.audit {
            Some(a) => println!(
                "{} is now {} (was {}); audit #{} by {} at {}: {}",
                change.model.slug, a.after, a.before, a.id, a.actor, a.at, a.reason
            ),
            None => println!(
                "{} was already {}; nothing changed",
                change.model.slug, change.model.visibility
            ),
        }
    }
    let Some(p) = change.propagation else {
        return Ok(());
    };
    if p.applied >= p.gateways {
        if !args.conn.json {
            match p.gateways {
                0 => println!("no gateway is running; each applies it when it starts"),
                n => println!("applied by all {n} gateways in {} ms", p.waited_ms),
            }
        }
        return Ok(());
    }
    let missing = p.gateways - p.applied;
    Err(anyhow!(
        "the flip is recorded, but only {} of {} gateways confirmed applying it within {} ms. \
         A gateway that has not heard from the control plane since the flip stops serving every \
         model once its lease ({} s) runs out, so the other {missing} have stopped serving by now; \
         check them before trusting the flip",
        p.applied,
        p.gateways,
        p.waited_ms,
        p.lease_ms / 1000
    ))
}

pub(crate) fn incident(cmd: IncidentCommand) -> anyhow::Result<()> {
    match cmd {
        IncidentCommand::Open {
            name,
            impact,
            status,
            body,
            components,
            conn,
        } => {
            let req = OpenIncident {
                name,
                status,
                impact,
                body,
                components,
            };
            post_incident(&conn, "/admin/v1/incidents", &req, "opened")
        }
        IncidentCommand::Update {
            id,
            status,
            body,
            impact,
            components,
            conn,
        } => {
            let req = UpdateIncident {
                status,
                body,
                impact,
                components,
                postmortem: None,
            };
            post_incident(
                &conn,
                &format!("/admin/v1/incidents/{id}/updates"),
                &req,
                "updated",
            )
        }
        IncidentCommand::Resolve {
            id,
            body,
            postmortem,
            conn,
        } => {
            let (status, impact, components) = (IncidentStatus::Resolved, None, Vec::new());
            let req = UpdateIncident {
                status,
                body,
                impact,
                components,
                postmortem,
            };
            post_incident(
                &conn,
                &format!("/admin/v1/incidents/{id}/updates"),
                &req,
                "resolved",
            )
        }
        IncidentCommand::List { conn } => {
            let client = conn.client()?;
            let all: Vec<IncidentView> = conn.call(client.get("/admin/v1/incidents"))?;
            if conn.json {
                return print_json(&all);
            }
            if all.is_empty() {
                println!("no incidents");
            }
            for i in &all {
                println!(
                    "#{}  {}  {}  impact {}  updated {}",
                    i.id, i.name, i.status, i.impact, i.updated_at
                );
            }
            Ok(())
        }
    }
}

/// Posts an incident change and shows the incident as it now is.
fn post_incident(
    conn: &Connection,
    path: &str,
    req: &impl serde::Serialize,
    verb: &str,
) -> anyhow::Result<()> {
    let client = conn.client()?;
    let v: IncidentView = conn.call(client.post(path, req))?;
    show_incident(&v, conn.json, verb)
}

fn show_incident(v: &IncidentView, json: bool, verb: &str) -> anyhow::Result<()> {
    if json {
        return print_json(v);
    }
    println!(
        "{verb} incident #{} \"{}\": {}, impact {}",
        v.id, v.name, v.status, v.impact
    );
    if let Some(u) = v.updates.first() {
        for c in &u.affected_components {
            println!("  {}: {} -> {}", c.model, c.old_status, c.new_status);
        }
    }
    Ok(())
}

/// `bulkhead usage`: the ledger by UTC day, account and model.
pub(crate) fn usage(args: &UsageArgs) -> anyhow::Result<()> {
    let client = args.conn.client()?;
    let mut query = Vec::new();
    for (key, v) in [
        ("account", &args.account),
        ("since", &args.since),
        ("until", &args.until),
    ] {
        if let Some(v) = v {
            query.push(format!("{key}={}", query_escape(v)));
        }
    }
    let path = format!("/admin/v1/usage?{}", query.join("&"));
    let rows: Vec<bulkhead_control_api::UsageRow> = args.conn.call(client.get(&path))?;
    if args.conn.json {
        return print_json(&rows);
    }
    if rows.is_empty() {
        println!("no usage recorded in that period");
        return Ok(());
    }
    println!(
        "date        account                           model  requests  prompt  output  neurons"
    );
    let (mut r, mut p, mut c, mut n) = (0, 0, 0, 0);
    let neurons = |micro: u64| micro as f64 / bulkhead_control_api::MICRO as f64;
    for u in &rows {
        println!(
            "{}  {}  {}  {}  {}  {}  {:.6}",
            u.date,
            u.account_id,
            u.model,
            u.requests,
            u.prompt_tokens,
            u.completion_tokens,
            neurons(u.micro_neurons)
        );
        (r, p, c, n) = (
            r + u.requests,
            p + u.prompt_tokens,
            c + u.completion_tokens,
            n + u.micro_neurons,
        );
    }
    println!(
        "total: {r} requests, {p} prompt tokens, {c} output tokens, {:.6} neurons",
        neurons(n)
    );
    Ok(())
}

/// `bulkhead budget`: replaces an account's budgets and free allowance.
pub(crate) fn budget(args: &BudgetArgs) -> anyhow::Result<()> {
    let client = args.conn.client()?;
    let req = bulkhead_control_api::SetBudget {
        daily_neurons: args.daily,
        monthly_neurons: args.monthly,
        free_neurons_per_day: args.free,
        reason: args.reason.clone(),
    };
    let path = format!("/admin/v1/accounts/{}/budget", query_escape(&args.account));
    let a: bulkhead_control_api::AccountView = args.conn.call(client.put(&path, &req))?;
    if args.conn.json {
        return print_json(&a);
    }
    let n = |v: Option<u64>| v.map_or_else(|| "unlimited".to_owned(), |v| format!("{v} neurons"));
    println!(
        "{} ({}): daily {}, monthly {}, {} neurons a day free",
        a.name,
        a.id,
        n(a.budget.daily_neurons),
        n(a.budget.monthly_neurons),
        a.budget.free_neurons_per_day
    );
    Ok(())
}

pub(crate) fn audit(args: &AuditArgs) -> anyhow::Result<()> {
    let client = args.conn.client()?;
    let mut path = format!("/admin/v1/audit?limit={}", args.limit);
    if let Some(s) = &args.subject {
        // A slug must name a registered model: a typo would otherwise read
        // as "nothing happened to it".
        if let Ok(slug) = s.parse::<ModelSlug>() {
            let model = format!("/admin/v1/models/{}", slug.path_segment());
            args.conn
                .call(client.get::<ModelView>(&model))
                .map_err(|e| unknown_model(&client, &args.conn, slug.as_str(), e))?;
        }
        path.push_str("&subject=");
        path.push_str(&query_escape(s));
    }
    let entries: Vec<AuditEntry> = args.conn.call(client.get(&path))?;
    if args.conn.json {
        return print_json(&entries);
    }
    match (&args.subject, entries.is_empty()) {
        (Some(s), true) => println!("no audit entries about {s}"),
        (None, true) => println!("the audit log is empty"),
        _ => {}
    }
    for e in &entries {
        println!(
            "#{} {} {} {} {}: {} -> {}{}",
            e.id,
            e.at,
            e.actor,
            e.action,
            e.subject,
            e.before,
            e.after,
            if e.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", e.reason)
            }
        );
    }
    Ok(())
}

/// `s` as one query value or path segment: everything but RFC 3986's
/// unreserved characters percent-encoded.
fn query_escape(s: &str) -> String {
    const RESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(s, RESERVED).to_string()
}
