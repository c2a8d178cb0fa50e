//! The admin API under `/admin/v1`. Every route authenticates a [`Caller`]
//! and checks its role before touching the database; writes run in one
//! transaction with their audit entries.

use super::AppState;
use super::auth::{Admin, Caller, GatewayAgent, NodeAgent, Responder};
use super::error::{ApiError, AppJson, AppPath, AppQuery, OptionalJson};
use crate::store::usage;
use crate::store::{
    accounts, api_tokens, audit, configs, incidents, models, nodes, operators, routing, views,
};
use crate::{ConfigVersion, IncidentId, NodeId, OperatorId};
use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use bulkhead_control_api::{
    AccountView, ApiTokenCreated, ApiTokenView, AuditEntry, ConfigSpec, ConfigView, CreateAccount,
    CreateApiToken, CreateModel, CreateOperator, Heartbeat, IncidentView, ModelChange, ModelSlug,
    ModelView, NodeRole, NodeStatus, NodeView, OpenIncident, OperatorCreated, OperatorView,
    PrefillPeer, RegisterNode, Role, RoutingTable, SetAllowlist, SetBudget, SetVisibility,
    Timestamp, UpdateIncident, UsageRecorded, UsageReport, UsageRow, UsageVoid, UsageVoided,
    Whoami,
};
use serde::Deserialize;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/whoami", get(whoami))
        .route("/models", get(list_models).post(create_model))
        .route("/models/{slug}", get(get_model))
        .route("/models/{slug}/visibility", post(set_visibility))
        .route("/models/{slug}/allowlist", post(set_allowlist))
        .route("/models/{slug}/configs", get(list_configs).post(add_config))
        .route(
            "/models/{slug}/configs/{version}/activate",
            post(activate_config),
        )
        .route("/accounts", get(list_accounts).post(create_account))
        .route("/accounts/{id}/budget", axum::routing::put(set_budget))
        .route("/operators", get(list_operators).post(create_operator))
        .route("/operators/{id}", axum::routing::delete(revoke_operator))
        .route("/nodes", get(list_nodes).post(register_node))
        .route("/nodes/{id}", axum::routing::delete(remove_node))
        .route("/nodes/{id}/heartbeat", post(heartbeat))
        .route("/incidents", get(list_incidents).post(open_incident))
        .route("/incidents/{id}", get(get_incident))
        .route("/incidents/{id}/updates", post(update_incident))
        .route("/audit", get(list_audit))
        .route("/usage", get(list_usage).post(report_usage))
        .route("/usage/void", post(void_usage))
        .route(
            "/accounts/{id}/tokens",
            get(list_api_tokens).post(create_api_token),
        )
        .route(
            "/accounts/{id}/tokens/{token}",
            axum::routing::delete(revoke_api_token),
        )
        .route("/routing", get(routing))
}

type ApiResult<T> = Result<Json<T>, ApiError>;

fn slug(raw: &str) -> Result<ModelSlug, ApiError> {
    raw.parse()
        .map_err(|e: bulkhead_control_api::SlugError| ApiError::bad_request(e.to_string()))
}

async fn whoami(caller: Caller) -> Json<Whoami> {
    Json(Whoami {
        name: caller.0.name,
        role: caller.0.role,
    })
}

// === models ===

async fn list_models(State(s): State<AppState>, _: Responder) -> ApiResult<Vec<ModelView>> {
    let mut conn = s.db.pool().acquire().await?;
    let mut out = Vec::new();
    for m in models::list(&mut conn).await? {
        out.push(views::model(&mut conn, &m).await?);
    }
    Ok(Json(out))
}

async fn get_model(
    State(s): State<AppState>,
    _: Responder,
    AppPath(raw): AppPath<String>,
) -> ApiResult<ModelView> {
    let slug = slug(&raw)?;
    let mut conn = s.db.pool().acquire().await?;
    let m = models::find(&mut conn, &slug).await?;
    Ok(Json(views::model(&mut conn, &m).await?))
}

async fn create_model(
    State(s): State<AppState>,
    Admin(op): Admin,
    AppJson(req): AppJson<CreateModel>,
) -> Result<(StatusCode, Json<ModelView>), ApiError> {
    let now = Timestamp::now();
    let mut tx = s.db.begin().await?;
    let mut m = models::create(&mut tx, &req, now).await?;
    if let Some(spec) = &req.config {
        let v = configs::add(&mut tx, &m, spec, &op.name, now).await?;
        configs::activate(
            &mut tx,
            &m,
            v,
            &op.name,
            "first config",
            now,
            s.settings.node_ttl,
        )
        .await?;
        m = models::find(&mut tx, &req.slug).await?;
    }
    let view = views::model(&mut tx, &m).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(view)))
}

async fn set_visibility(
    State(s): State<AppState>,
    Responder(op): Responder,
    AppPath(raw): AppPath<String>,
    AppJson(req): AppJson<SetVisibility>,
) -> ApiResult<ModelChange> {
    let slug = slug(&raw)?;
    let now = Timestamp::now();
    let mut tx = s.db.begin().await?;
    let why = models::Why {
        actor: &op.name,
        reason: &req.reason,
        now,
    };
    let audit = models::set_visibility(&mut tx, &slug, req.visibility, why).await?;
    let m = models::find(&mut tx, &slug).await?;
    let model = views::model(&mut tx, &m).await?;
    tx.commit().await?;
    // Streams of a model made private end with it unless the responder
    // planned the flip.
    s.hub.plan(
        &slug,
        req.visibility == bulkhead_control_api::Visibility::Private && !req.end_streams,
    );
    // A visibility change is acknowledged only once every live gateway
    // enforces it, its streams ended (or has stopped admitting requests:
    // see `Hub`).
    let propagation = match audit {
        Some(_) => {
            crate::metrics::flipped(req.visibility);
            Some(propagate(&s).await)
        }
        None => None,
    };
    Ok(Json(ModelChange {
        model,
        audit,
        propagation,
    }))
}

/// Publishes a change and waits until every live gateway enforces it.
async fn propagate(s: &AppState) -> bulkhead_control_api::Propagation {
    let started = std::time::Instant::now();
    let p = s.hub.publish_and_wait().await;
    crate::metrics::propagated(started.elapsed());
    p
}

async fn set_allowlist(
    State(s): State<AppState>,
    Responder(op): Responder,
    AppPath(raw): AppPath<String>,
    AppJson(req): AppJson<SetAllowlist>,
) -> ApiResult<ModelChange> {
    let slug = slug(&raw)?;
    let now = Timestamp::now();
    let mut tx = s.db.begin().await?;
    let account = accounts::find(&mut tx, &req.account_id).await?;
    let why = models::Why {
        actor: &op.name,
        reason: &req.reason,
        now,
    };
    let audit = models::set_allowed(&mut tx, &slug, (&account, req.allowed), why).await?;
    let m = models::find(&mut tx, &slug).await?;
    let model = views::model(&mut tx, &m).await?;
    tx.commit().await?;
    // A visibility change is acknowledged only once every live gateway
    // enforces it (or has stopped admitting requests: see `Hub`).
    let propagation = match audit {
        Some(_) => Some(propagate(&s).await),
        None => None,
    };
    Ok(Json(ModelChange {
        model,
        audit,
        propagation,
    }))
}

// === configs ===

async fn list_configs(
    State(s): State<AppState>,
    _: Responder,
    AppPath(raw): AppPath<String>,
) -> ApiResult<Vec<ConfigView>> {
    let slug = slug(&raw)?;
    let mut conn = s.db.pool().acquire().await?;
    let m = models::find(&mut conn, &slug).await?;
    let rows = configs::list(&mut conn, &m).await?;
    Ok(Json(rows.iter().map(|c| c.view(m.active_config)).collect()))
}

async fn add_config(
    State(s): State<AppState>,
    Admin(op): Admin,
    AppPath(raw): AppPath<String>,
    AppJson(spec): AppJson<ConfigSpec>,
) -> Result<(StatusCode, Json<ConfigView>), ApiError> {
    let slug = slug(&raw)?;
    let now = Timestamp::now();
    let mut tx = s.db.begin().await?;
    let m = models::find(&mut tx, &slug).await?;
    let v = configs::add(&mut tx, &m, &spec, &op.name, now).await?;
    let row = configs::get(&mut tx, &m, v).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(row.view(m.active_config))))
}

async fn activate_config(
    State(s): State<AppState>,
    Admin(op): Admin,
    AppPath((raw, version)): AppPath<(String, u32)>,
    OptionalJson(body): OptionalJson<Activate>,
) -> ApiResult<ConfigView> {
    let slug = slug(&raw)?;
    let reason = body.reason;
    let now = Timestamp::now();
    let mut tx = s.db.begin().await?;
    let m = models::find(&mut tx, &slug).await?;
    let v = ConfigVersion::new(version);
    configs::activate(&mut tx, &m, v, &op.name, &reason, now, s.settings.node_ttl).await?;
    let row = configs::get(&mut tx, &m, v).await?;
    tx.commit().await?;
    Ok(Json(row.view(Some(v))))
}

// === accounts and operators ===

async fn list_accounts(State(s): State<AppState>, _: Responder) -> ApiResult<Vec<AccountView>> {
    let mut conn = s.db.pool().acquire().await?;
    Ok(Json(accounts::list(&mut conn).await?))
}

async fn create_account(
    State(s): State<AppState>,
    _: Admin,
    AppJson(req): AppJson<CreateAccount>,
) -> Result<(StatusCode, Json<AccountView>), ApiError> {
    let mut conn = s.db.pool().acquire().await?;
    let a = accounts::create(&mut conn, &req.name, Timestamp::now()).await?;
    Ok((StatusCode::CREATED, Json(a)))
}

/// The largest budget or allowance, in neurons: in micro-neurons it stays
/// below 2^53, so Redis's Lua numbers (doubles) compare it exactly.
const MAX_NEURONS: u64 = 1_000_000_000;

/// `PUT /admin/v1/accounts/{id}/budget` (admin): replaces the account's
/// budgets and free allowance, audited as `account.budget`.
async fn set_budget(
    State(s): State<AppState>,
    Admin(op): Admin,
    AppPath(id): AppPath<String>,
    AppJson(req): AppJson<SetBudget>,
) -> ApiResult<AccountView> {
    crate::store::require_text("reason", &req.reason, 1000)?;
    let budget = req.budget();
    let over = [budget.daily_neurons, budget.monthly_neurons]
        .into_iter()
        .flatten()
        .chain([budget.free_neurons_per_day])
        .any(|v| v > MAX_NEURONS);
    if over {
        return Err(ApiError::bad_request(format!(
            "budgets and allowances are at most {MAX_NEURONS} neurons"
        )));
    }
    let now = Timestamp::now();
    let mut tx = s.db.begin().await?;
    let account = accounts::find(&mut tx, &id).await?;
    let before = accounts::set_budget(&mut tx, &account, &budget).await?;
    let show = |b: &bulkhead_control_api::Budget| {
        let n = |v: Option<u64>| v.map_or_else(|| "unlimited".to_owned(), |v| v.to_string());
        format!(
            "daily={} monthly={} free_per_day={}",
            n(b.daily_neurons),
            n(b.monthly_neurons),
            b.free_neurons_per_day
        )
    };
    audit::commit_with(
        tx,
        audit::NewEntry::new(
            &op.name,
            "account.budget",
            account.as_str(),
            (&show(&before.budget), &show(&budget)),
        )
        .because(&req.reason),
        now,
    )
    .await?;
    Ok(Json(AccountView { budget, ..before }))
}

async fn list_operators(State(s): State<AppState>, _: Admin) -> ApiResult<Vec<OperatorView>> {
    let mut conn = s.db.pool().acquire().await?;
    Ok(Json(operators::list(&mut conn).await?))
}

async fn create_operator(
    State(s): State<AppState>,
    Admin(op): Admin,
    AppJson(req): AppJson<CreateOperator>,
) -> Result<(StatusCode, Json<OperatorCreated>), ApiError> {
    let now = Timestamp::now();
    let mut tx = s.db.begin().await?;
    let created = operators::create(&mut tx, &req.name, req.role, now).await?;
    audit::commit_with(
        tx,
        audit::NewEntry::new(
            &op.name,
            "operator.create",
            &req.name,
            ("absent", req.role.as_str()),
        ),
        now,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(created)))
}

async fn revoke_operator(
    State(s): State<AppState>,
    Admin(op): Admin,
    AppPath(id): AppPath<i64>,
) -> ApiResult<OperatorView> {
    let now = Timestamp::now();
    let mut tx = s.db.begin().await?;
    let revoked = operators::revoke(&mut tx, OperatorId::from_db(id), now).await?;
    audit::commit_with(
        tx,
        audit::NewEntry::new(
            &op.name,
            "operator.revoke",
            &revoked.name,
            (revoked.role.as_str(), "revoked"),
        ),
        now,
    )
    .await?;
    Ok(Json(revoked))
}

// === nodes ===

async fn list_nodes(
    State(s): State<AppState>,
    _: Responder,
    AppQuery(f): AppQuery<NodeFilter>,
) -> ApiResult<Vec<NodeView>> {
    let mut conn = s.db.pool().acquire().await?;
    let model = match &f.model {
        Some(raw) => Some(models::find(&mut conn, &slug(raw)?).await?.id),
        None => None,
    };
    let rows = nodes::list(&mut conn, model).await?;
    Ok(Json(
        views::nodes(&mut conn, rows, Timestamp::now(), s.settings.node_ttl).await?,
    ))
}

async fn node_status(
    s: &AppState,
    conn: &mut crate::store::Conn,
    id: NodeId,
    now: Timestamp,
) -> Result<NodeStatus, ApiError> {
    let row = nodes::get(conn, id).await?;
    let model = row.model_id;
    let node = views::nodes(conn, vec![row], now, s.settings.node_ttl)
        .await?
        .pop()
        .ok_or_else(|| ApiError::from(crate::Error::NotFound(format!("node {id}"))))?;
    let prefill_peers = if node.registration.role == NodeRole::Decode {
        let fleet = nodes::list(conn, Some(model)).await?;
        views::nodes(conn, fleet, now, s.settings.node_ttl)
            .await?
            .into_iter()
            .filter(|n| n.routable && n.registration.role == NodeRole::Prefill)
            .filter_map(|n| {
                Some(PrefillPeer {
                    transfer_address: n.registration.transfer_address?,
                    name: n.registration.name,
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    Ok(NodeStatus {
        node,
        heartbeat_interval_ms: u64::try_from(s.settings.heartbeat_interval.as_millis())
            .unwrap_or(u64::MAX),
        prefill_peers,
    })
}

async fn register_node(
    State(s): State<AppState>,
    NodeAgent(op, cert, scope): NodeAgent,
    AppJson(req): AppJson<RegisterNode>,
) -> ApiResult<NodeStatus> {
    // A node is what its certificate says: a decode certificate cannot
    // register a prefill worker (nor the gateway route to one).
    let expected = match req.role {
        NodeRole::Prefill => bulkhead_trust::Role::Prefill,
        NodeRole::Decode => bulkhead_trust::Role::Decode,
        NodeRole::Colocated => bulkhead_trust::Role::Colocated,
    };
    if cert != expected {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("a {cert} certificate cannot register a {} node", req.role),
        ));
    }
    // Nor beyond its scope: a certificate for one model cannot register a
    // worker of another (so the gateway never routes that model to it), nor
    // claim a larger pool than it was issued for.
    if !scope.allows_model(req.model.as_str()) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "this {cert} certificate is for {}: it cannot register a node of {}",
                scope.describe(),
                req.model
            ),
        ));
    }
    if !scope.allows_pool(req.kv_pool_tokens) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "this {cert} certificate is for {}: it cannot claim a KV pool of {} tokens",
                scope.describe(),
                req.kv_pool_tokens
            ),
        ));
    }
    let now = Timestamp::now();
    let mut tx = s.db.begin().await?;
    let existing = nodes::list(&mut tx, None)
        .await?
        .into_iter()
        .find(|n| n.registration.name == req.name);
    // Re-registering replaces the node of that name: only a certificate
    // that may serve the model it serves now may do so (else one model's
    // certificate could take another model's node out of routing).
    if existing
        .as_ref()
        .is_some_and(|n| !scope.allows_model(n.registration.model.as_str()))
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "a node named {} serves another model: this certificate (for {}) cannot replace it",
                req.name,
                scope.describe()
            ),
        ));
    }
    let before = existing.map(|n| node_summary(&n.registration));
    let id = nodes::register(&mut tx, &req, &op, now).await?;
    let after = node_summary(&req);
    let action = if before.is_some() {
        "node.reregister"
    } else {
        "node.register"
    };
    let change = (before.as_deref().unwrap_or(""), after.as_str());
    audit::append(
        &mut tx,
        audit::NewEntry::new(&op.name, action, &req.name, change),
        now,
    )
    .await?;
    let status = node_status(&s, &mut tx, id, now).await?;
    tx.commit().await?;
    Ok(Json(status))
}

/// What the audit log records of a node's registration.
fn node_summary(r: &RegisterNode) -> String {
    format!(
        "{} {} at {}{}, pool {} tokens, {} {}-token pages",
        r.role,
        r.model,
        r.address,
        r.transfer_address
            .as_deref()
            .map_or_else(String::new, |t| format!(" (transfer {t})")),
        r.kv_pool_tokens,
        r.quantization,
        r.page_size
    )
}

async fn heartbeat(
    State(s): State<AppState>,
    NodeAgent(op, _, scope): NodeAgent,
    AppPath(id): AppPath<i64>,
    OptionalJson(beat): OptionalJson<Heartbeat>,
) -> ApiResult<NodeStatus> {
    let now = Timestamp::now();
    let mut tx = s.db.begin().await?;
    let id = NodeId::from_db(id);
    nodes::heartbeat(&mut tx, id, &op, &beat, now).await?;
    // A certificate keeps alive only nodes of the models it may serve (the
    // heartbeat above is rolled back otherwise).
    let node = nodes::get(&mut tx, id).await?;
    if !scope.allows_model(node.registration.model.as_str()) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "this certificate (for {}) may not report for that node",
                scope.describe()
            ),
        ));
    }
    let status = node_status(&s, &mut tx, id, now).await?;
    tx.commit().await?;
    Ok(Json(status))
}

async fn remove_node(
    State(s): State<AppState>,
    Admin(op): Admin,
    AppPath(id): AppPath<i64>,
) -> Result<StatusCode, ApiError> {
    let mut tx = s.db.begin().await?;
    let id = NodeId::from_db(id);
    let row = nodes::get(&mut tx, id).await?;
    nodes::remove(&mut tx, id).await?;
    let before = node_summary(&row.registration);
    audit::commit_with(
        tx,
        audit::NewEntry::new(
            &op.name,
            "node.remove",
            &row.registration.name,
            (&before, "removed"),
        ),
        Timestamp::now(),
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

// === incidents ===

async fn list_incidents(State(s): State<AppState>, _: Responder) -> ApiResult<Vec<IncidentView>> {
    let mut conn = s.db.pool().acquire().await?;
    Ok(Json(incidents::list(&mut conn, 50, false).await?))
}

async fn get_incident(
    State(s): State<AppState>,
    _: Responder,
    AppPath(id): AppPath<i64>,
) -> ApiResult<IncidentView> {
    let mut conn = s.db.pool().acquire().await?;
    Ok(Json(
        incidents::get(&mut conn, IncidentId::from_db(id)).await?,
    ))
}

async fn open_incident(
    State(s): State<AppState>,
    Responder(op): Responder,
    AppJson(req): AppJson<OpenIncident>,
) -> Result<(StatusCode, Json<IncidentView>), ApiError> {
    let mut tx = s.db.begin().await?;
    let id = incidents::open(&mut tx, &req, &op.name, Timestamp::now()).await?;
    let view = incidents::get(&mut tx, id).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(view)))
}

async fn update_incident(
    State(s): State<AppState>,
    Responder(op): Responder,
    AppPath(id): AppPath<i64>,
    AppJson(req): AppJson<UpdateIncident>,
) -> ApiResult<IncidentView> {
    let id = IncidentId::from_db(id);
    let mut tx = s.db.begin().await?;
    incidents::update(&mut tx, id, &req, &op.name, Timestamp::now()).await?;
    let view = incidents::get(&mut tx, id).await?;
    tx.commit().await?;
    Ok(Json(view))
}

// === audit ===

async fn list_audit(
    State(s): State<AppState>,
    _: Responder,
    AppQuery(f): AppQuery<AuditFilter>,
) -> ApiResult<Vec<AuditEntry>> {
    let limit = f.limit.unwrap_or(100).clamp(1, 1000);
    let mut conn = s.db.pool().acquire().await?;
    Ok(Json(
        audit::list(&mut conn, f.subject.as_deref(), limit).await?,
    ))
}

// === usage ===

/// `POST /admin/v1/usage`: a worker's batch of usage events, for its own
/// model only, recorded whole or not at all.
async fn report_usage(
    State(s): State<AppState>,
    NodeAgent(op, _, scope): NodeAgent,
    AppJson(report): AppJson<UsageReport>,
) -> ApiResult<UsageRecorded> {
    if let Some(e) = report
        .events
        .iter()
        .find(|e| !scope.allows_model(e.model.as_str()))
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "this certificate (for {}) may not report usage of {}",
                scope.describe(),
                e.model
            ),
        ));
    }
    // A worker bills only calls the gateway sent it: each event names the
    // account, model and call id of the context the gateway signed, which
    // also gives the key the call bills under, if any.
    let mut keys = Vec::with_capacity(report.events.len());
    for e in &report.events {
        let signed = s.settings.contexts.statement(&e.context).ok();
        let matches = signed.as_ref().is_some_and(|c| {
            c.account == e.account_id && c.model == e.model.as_str() && c.request_id == e.call_id
        });
        if !matches {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "usage event {:?}: {}",
                    e.call_id,
                    if signed.is_some() {
                        "its signed tenant context is for another account, model or call"
                    } else {
                        "it carries no tenant context the gateway signed"
                    }
                ),
            ));
        }
        keys.push(signed.and_then(|c| c.bill_as));
    }
    let mut tx = s.db.begin().await?;
    let recorded = usage::record_keyed(&mut tx, &op.name, &report.events, &keys).await?;
    tx.commit().await?;
    Ok(Json(recorded))
}

/// `POST /admin/v1/usage/void`: the gateway, which alone knows what each
/// client was told, voids the calls of a request that answered an error
/// (one of its `n` choices failed): they bill nothing, reported or not.
async fn void_usage(
    State(s): State<AppState>,
    GatewayAgent(_): GatewayAgent,
    AppJson(v): AppJson<UsageVoid>,
) -> ApiResult<UsageVoided> {
    let mut tx = s.db.begin().await?;
    let voided = usage::void(&mut tx, &v, Timestamp::now()).await?;
    tx.commit().await?;
    Ok(Json(voided))
}

/// `GET /admin/v1/usage`: usage by account, model and UTC day. Responders
/// read every account's; the gateway reads one account's for that
/// tenant's own usage route.
async fn list_usage(
    State(s): State<AppState>,
    Caller(op): Caller,
    AppQuery(f): AppQuery<UsageFilter>,
) -> ApiResult<Vec<UsageRow>> {
    if !(op.role.allows(Role::Responder) || op.role == Role::Gateway) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "reading usage needs a responder, admin or gateway token",
        ));
    }
    if op.role == Role::Gateway && f.account.is_none() {
        return Err(ApiError::bad_request(
            "a gateway reads one account's usage: give account",
        ));
    }
    let day = |s: &Option<String>, what: &str| -> Result<Option<Timestamp>, ApiError> {
        s.as_deref()
            .map(|d| {
                Timestamp::parse_rfc3339(&format!("{d}T00:00:00Z"))
                    .filter(|t| t.to_string().starts_with(d))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("{what} is a UTC day, YYYY-MM-DD"))
                    })
            })
            .transpose()
    };
    let until = day(&f.until, "until")?.unwrap_or_else(Timestamp::now);
    let since =
        day(&f.since, "since")?.unwrap_or_else(|| Timestamp::start_of_day(until.day() - 30));
    let mut conn = s.db.pool().acquire().await?;
    Ok(Json(
        usage::daily(&mut conn, f.account.as_deref(), since, until).await?,
    ))
}

// === tenant API tokens ===

async fn list_api_tokens(
    State(s): State<AppState>,
    _: Responder,
    AppPath(id): AppPath<String>,
) -> ApiResult<Vec<ApiTokenView>> {
    let mut conn = s.db.pool().acquire().await?;
    let account = accounts::find(&mut conn, &id).await?;
    Ok(Json(api_tokens::list(&mut conn, &account).await?))
}

async fn create_api_token(
    State(s): State<AppState>,
    _: Admin,
    AppPath(id): AppPath<String>,
    AppJson(req): AppJson<CreateApiToken>,
) -> Result<(StatusCode, Json<ApiTokenCreated>), ApiError> {
    let mut tx = s.db.begin().await?;
    let account = accounts::find(&mut tx, &id).await?;
    let created = api_tokens::create(&mut tx, &account, &req.name, Timestamp::now()).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(created)))
}

async fn revoke_api_token(
    State(s): State<AppState>,
    Responder(op): Responder,
    AppPath((id, token)): AppPath<(String, i64)>,
) -> ApiResult<ApiTokenView> {
    let now = Timestamp::now();
    let mut tx = s.db.begin().await?;
    let account = accounts::find(&mut tx, &id).await?;
    let revoked = api_tokens::revoke(&mut tx, &account, token, now).await?;
    let subject = format!("{account} token {token}");
    audit::commit_with(
        tx,
        audit::NewEntry::new(&op.name, "api_token.revoke", &subject, ("live", "revoked")),
        now,
    )
    .await?;
    Ok(Json(revoked))
}

// === routing (gateways) ===

/// Long-poll: answers at once when the table's version differs from the
/// caller's, else when it changes or `wait_ms` (at most a third of the
/// lease) passes. Each poll also tells the hub which version that gateway
/// has applied.
async fn routing(
    State(s): State<AppState>,
    GatewayAgent(op): GatewayAgent,
    AppQuery(q): AppQuery<RoutingQuery>,
) -> ApiResult<RoutingTable> {
    if q.gateway.is_empty() || q.gateway.len() > 200 {
        return Err(ApiError::bad_request("gateway must be 1 to 200 characters"));
    }
    let cap = s.hub.lease() / 3;
    let wait = std::time::Duration::from_millis(q.wait_ms.unwrap_or(0)).min(cap);
    let instance = format!("{}/{}", op.name, q.gateway);
    let version = s.hub.poll(&instance, q.version.unwrap_or(0), wait).await;
    let mut tx = s.db.begin().await?;
    let mut table = routing::table(&mut tx, version, s.hub.lease(), s.settings.node_ttl).await?;
    tx.commit().await?;
    table.planned_withdrawals = s.hub.planned();
    Ok(Json(table))
}

// What the handlers above read from query strings and bodies.

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Activate {
    #[serde(default)]
    reason: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFilter {
    model: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditFilter {
    subject: Option<String>,
    limit: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageFilter {
    account: Option<String>,
    /// First UTC day, `YYYY-MM-DD` (default: 30 days before `until`).
    since: Option<String>,
    /// Last UTC day, `YYYY-MM-DD` (default: today).
    until: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoutingQuery {
    /// The polling gateway's instance id.
    gateway: String,
    /// The version it has applied; absent on its first poll.
    version: Option<u64>,
    /// Longest to hold the poll open waiting for a change.
    wait_ms: Option<u64>,
}
