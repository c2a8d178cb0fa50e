//! Responder commands that call the control plane's admin API:
//! `bulkhead model list|private|public`, `bulkhead incident
//! open|update|resolve|list` and `bulkhead audit`. They find the control
//! plane and token in `BULKHEAD_CONTROL_PLANE_URL` and `BULKHEAD_TOKEN`, or
//! else in `credentials.json` under `--data-dir`; they print a short human
//! summary, or the API's JSON with `--json`.

use bulkhead_control_api::{
    AuditEntry, Client, ComponentChange, ComponentStatus, Credentials, Impact, IncidentStatus,
    IncidentView, ModelChange, ModelSlug, ModelView, OpenIncident, SetVisibility, UpdateIncident,
    Visibility,
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
    let models: Vec<ModelView> = block_on(async { Ok(client.get("/admin/v1/models").await?) })?;
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
    let change: ModelChange = block_on(async { Ok(client.post(&path, &body).await?) })?;
    if args.conn.json {
        return print_json(&change);
    }
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
    Ok(())
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
            let client = conn.client()?;
            let req = OpenIncident {
                name,
                status,
                impact,
                body,
                components,
            };
            let v: IncidentView =
                block_on(async { Ok(client.post("/admin/v1/incidents", &req).await?) })?;
            show_incident(&v, conn.json, "opened")
        }
        IncidentCommand::Update {
            id,
            status,
            body,
            impact,
            components,
            conn,
        } => {
            let client = conn.client()?;
            let req = UpdateIncident {
                status,
                body,
                impact,
                components,
                postmortem: None,
            };
            let path = format!("/admin/v1/incidents/{id}/updates");
            let v: IncidentView = block_on(async { Ok(client.post(&path, &req).await?) })?;
            show_incident(&v, conn.json, "updated")
        }
        IncidentCommand::Resolve {
            id,
            body,
            postmortem,
            conn,
        } => {
            let client = conn.client()?;
            let req = UpdateIncident {
                status: IncidentStatus::Resolved,
                body,
                impact: None,
                components: Vec::new(),
                postmortem,
            };
            let path = format!("/admin/v1/incidents/{id}/updates");
            let v: IncidentView = block_on(async { Ok(client.post(&path, &req).await?) })?;
            show_incident(&v, conn.json, "resolved")
        }
        IncidentCommand::List { conn } => {
            let client = conn.client()?;
            let all: Vec<IncidentView> =
                block_on(async { Ok(client.get("/admin/v1/incidents").await?) })?;
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

pub(crate) fn audit(args: &AuditArgs) -> anyhow::Result<()> {
    let client = args.conn.client()?;
    let mut path = format!("/admin/v1/audit?limit={}", args.limit);
    if let Some(s) = &args.subject {
        path.push_str("&subject=");
        path.push_str(&query_escape(s));
    }
    let entries: Vec<AuditEntry> = block_on(async { Ok(client.get(&path).await?) })?;
    if args.conn.json {
        return print_json(&entries);
    }
    if entries.is_empty() {
        println!("the audit log is empty");
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

fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
