//! The database `up` opens or creates: the models it serves with their
//! configs and prices, the operator, gateway, node and sentinel tokens, and
//! the demo accounts, reused by a second `up` on the same directory.

use super::*;
use bulkhead_control_api::{Role, Timestamp};
use bulkhead_control_plane::{AccountId, Db, store};
use std::path::Path;

/// Database, operators, model and demo accounts; reuses what a previous
/// `up` left in the data directory.
pub(super) async fn bootstrap(
    args: &UpArgs,
    embeddings: Option<&Path>,
) -> anyhow::Result<(Internal, CredentialsFile)> {
    let db = Db::connect(&Db::sqlite_url(&args.data_dir.join("bulkhead.db"))).await?;
    let now = Timestamp::now();
    let mut c = db.pool().acquire().await?;
    let internal_path = args.data_dir.join("internal-tokens.json");
    let previous: Option<Internal> = std::fs::read_to_string(&internal_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let mut token = async |old: Option<&str>, name: &str, role: Role| -> anyhow::Result<String> {
        if let Some(t) = old
            && store::operators::authenticate(&mut c, t)
                .await?
                .is_some_and(|o| o.role == role)
        {
            return Ok(t.to_owned());
        }
        let name = format!("{name}-{}", now.millis());
        Ok(store::operators::create(&mut c, &name, role, now)
            .await?
            .token)
    };
    let internal = Internal {
        admin: token(
            previous.as_ref().map(|p| p.admin.as_str()),
            "up-admin",
            Role::Admin,
        )
        .await?,
        gateway: token(
            previous.as_ref().map(|p| p.gateway.as_str()),
            "up-gateway",
            Role::Gateway,
        )
        .await?,
        node: token(
            previous.as_ref().map(|p| p.node.as_str()),
            "up-node",
            Role::Node,
        )
        .await?,
        sentinels: Vec::new(),
    };
    let old_creds: Option<CredentialsFile> =
        std::fs::read_to_string(args.data_dir.join("credentials.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
    let operator_token = token(
        old_creds.as_ref().map(|o| o.operator_token.as_str()),
        "responder",
        Role::Responder,
    )
    .await?;
    // The prober's two sentinel accounts, marked as such (reused).
    let mut internal = internal;
    internal.sentinels = sentinels(&mut c, previous.as_ref(), now).await?;
    write_private(&internal_path, &serde_json::to_string_pretty(&internal)?)?;

    // Worker records of earlier runs: their names are reused now, perhaps
    // under a new node token.
    for n in store::nodes::list(&mut c, None).await? {
        if n.registration.name.starts_with("up-") {
            store::nodes::remove(&mut c, n.id).await?;
        }
    }

    super::catalog::publish_models(&mut c, args, now).await?;
    if let Some(dir) = embeddings {
        super::embedding::publish(&mut c, dir, now).await?;
    }

    let accounts = demo_accounts(&mut c, old_creds.as_ref(), now).await?;
    drop(c);
    db.close().await;
    Ok((
        internal,
        CredentialsFile {
            gateway_url: String::new(),
            control_plane_url: String::new(),
            internal_url: String::new(),
            status_url: String::new(),
            operator_token,
            model: args.served().first().map_or_else(
                || crate::platform::register::DEFAULT_SLUG.to_owned(),
                |m| m.slug(),
            ),
            models: args.served().iter().map(|m| m.slug()).collect(),
            accounts,
            metrics: Default::default(),
            embedding_model: None,
        },
    ))
}

/// Whether `token` still belongs to account `id` (a data directory kept
/// from an earlier `up`).
pub(super) async fn still_valid(
    c: &mut store::Conn,
    token: &str,
    id: &str,
) -> anyhow::Result<bool> {
    Ok(store::api_tokens::account_of(&mut *c, token)
        .await?
        .as_deref()
        == Some(id))
}

/// A new API token named `name` for account `id`.
pub(super) async fn token_for(
    c: &mut store::Conn,
    id: &str,
    name: &str,
    now: Timestamp,
) -> anyhow::Result<String> {
    let id = AccountId::parse(id).context("account id")?;
    Ok(store::api_tokens::create(&mut *c, &id, name, now)
        .await?
        .token)
}

/// The prober's sentinel accounts: those of the previous run when their
/// tokens still work, else new ones.
pub(super) async fn sentinels(
    c: &mut store::Conn,
    previous: Option<&Internal>,
    now: Timestamp,
) -> anyhow::Result<Vec<crate::platform::prober::Sentinel>> {
    let mut out = Vec::new();
    for (i, name) in ["sentinel-a", "sentinel-b"].into_iter().enumerate() {
        let old = previous.and_then(|p| p.sentinels.get(i));
        let old = old.map(|s| (s.id.as_str(), s.token.as_str()));
        let (id, token) = account(c, old, (name, Kind::Sentinel), now).await?;
        out.push(crate::platform::prober::Sentinel { id, token });
    }
    Ok(out)
}

/// What an account `up` makes is for.
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
    /// The prober's (its token labelled `prober`).
    Sentinel,
    /// A demo tenant's (its token labelled `demo`).
    Demo,
}

/// The id and token of `old` when its token still works; else of a new
/// account `name` of `kind`, with a new token.
pub(super) async fn account(
    c: &mut store::Conn,
    old: Option<(&str, &str)>,
    (name, kind): (&str, Kind),
    now: Timestamp,
) -> anyhow::Result<(String, String)> {
    if let Some((id, token)) = old
        && still_valid(c, token, id).await?
    {
        return Ok((id.to_owned(), token.to_owned()));
    }
    let (account, label) = match kind {
        Kind::Sentinel => (
            store::accounts::create_sentinel(&mut *c, name, now).await?,
            "prober",
        ),
        Kind::Demo => (store::accounts::create(&mut *c, name, now).await?, "demo"),
    };
    let token = token_for(c, &account.id, label, now).await?;
    Ok((account.id, token))
}

/// Two demo accounts, each with an API token (reused when still valid).
pub(super) async fn demo_accounts(
    c: &mut store::Conn,
    old: Option<&CredentialsFile>,
    now: Timestamp,
) -> anyhow::Result<Vec<DemoAccount>> {
    let mut accounts = Vec::new();
    for name in ["alice", "bob"] {
        let reuse = old.and_then(|o| o.accounts.iter().find(|a| a.name == name));
        let reuse = reuse.map(|a| (a.id.as_str(), a.token.as_str()));
        let (id, token) = account(c, reuse, (name, Kind::Demo), now).await?;
        let name = name.to_owned();
        accounts.push(DemoAccount { id, name, token });
    }
    Ok(accounts)
}
