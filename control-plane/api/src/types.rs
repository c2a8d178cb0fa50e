//! Request and response bodies of the admin API.

use crate::{ComponentStatus, Impact, IncidentStatus, ModelSlug, NodeRole, Role, Visibility};
use serde::{Deserialize, Serialize};

pub use crate::time::Timestamp;

/// The error body of every admin API failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// A machine-readable code and a human message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Stable code such as `config_does_not_fit`.
    pub code: String,
    /// Human message; never carries internals.
    pub message: String,
}

/// Who the caller's token belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Whoami {
    /// Operator name.
    pub name: String,
    /// Operator role.
    pub role: Role,
}

/// A model's serving limits, from its active config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Properties {
    /// Longest prompt, in tokens.
    pub context_window: u64,
    /// Most tokens one request may generate.
    pub max_output: u64,
}

impl Properties {
    /// Tokens a node's KV pool must hold for one request at the limits.
    pub fn required_tokens(&self) -> u64 {
        self.context_window.saturating_add(self.max_output)
    }
}

/// KV memory budget per role, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvBudget {
    /// Prefill workers.
    pub prefill_bytes: u64,
    /// Decode (and colocated) workers.
    pub decode_bytes: u64,
}

/// How a model is split across devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parallelism {
    /// Tensor-parallel degree.
    pub tensor: u32,
    /// Pipeline-parallel degree.
    pub pipeline: u32,
}

impl Default for Parallelism {
    fn default() -> Self {
        Parallelism {
            tensor: 1,
            pipeline: 1,
        }
    }
}

/// One config version's content, as an admin submits it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigSpec {
    /// Serving limits.
    #[serde(flatten)]
    pub properties: Properties,
    /// Weights file name.
    pub weights_file: String,
    /// Its sha256, 64 lowercase hex digits.
    pub weights_sha256: String,
    /// Weight quantization, e.g. `q4_1`.
    pub quantization: String,
    /// Tokens per KV page.
    pub page_size: u32,
    /// KV memory per role.
    pub kv_budget: KvBudget,
    /// Device split.
    #[serde(default)]
    pub parallelism: Parallelism,
    /// What a token costs (free when not given).
    #[serde(default)]
    pub price: Price,
}

/// A model's price in neurons (Workers AI's unit) per million tokens.
/// Costs are counted in micro-neurons, so integer arithmetic is exact:
/// `tokens × neurons per million tokens` micro-neurons.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Neurons per million prompt tokens.
    pub input_neurons_per_mtok: u64,
    /// Neurons per million output tokens.
    pub output_neurons_per_mtok: u64,
}

impl Price {
    /// What `prompt` prompt tokens and `completion` output tokens cost, in
    /// micro-neurons (saturating).
    pub fn micro_neurons(&self, prompt: u64, completion: u64) -> u64 {
        prompt
            .saturating_mul(self.input_neurons_per_mtok)
            .saturating_add(completion.saturating_mul(self.output_neurons_per_mtok))
    }
}

/// Micro-neurons in one neuron.
pub const MICRO: u64 = 1_000_000;

/// An account's spending limits in neurons per UTC day and calendar month
/// (none: unlimited), and the neurons a day it uses free of charge.
/// Budgets count every neuron, free or not; the allowance decides only
/// what is billed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Neurons per UTC day.
    pub daily_neurons: Option<u64>,
    /// Neurons per UTC calendar month.
    pub monthly_neurons: Option<u64>,
    /// Neurons a day that are not billed.
    pub free_neurons_per_day: u64,
}

/// Workers AI's free allowance: 10,000 neurons a day.
pub const DEFAULT_FREE_NEURONS_PER_DAY: u64 = 10_000;

impl Default for Budget {
    fn default() -> Self {
        Budget {
            daily_neurons: None,
            monthly_neurons: None,
            free_neurons_per_day: DEFAULT_FREE_NEURONS_PER_DAY,
        }
    }
}

impl Budget {
    /// Whether either budget is set (otherwise nothing is reserved).
    pub fn limited(&self) -> bool {
        self.daily_neurons.is_some() || self.monthly_neurons.is_some()
    }
}

/// `PUT /admin/v1/accounts/{id}/budget` (admin): the account's budgets and
/// free allowance, replaced whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetBudget {
    /// Neurons per UTC day (absent: unlimited).
    #[serde(default)]
    pub daily_neurons: Option<u64>,
    /// Neurons per UTC calendar month (absent: unlimited).
    #[serde(default)]
    pub monthly_neurons: Option<u64>,
    /// Neurons a day that are not billed (absent: Workers AI's 10,000).
    #[serde(default = "default_free")]
    pub free_neurons_per_day: u64,
    /// Why, for the audit log.
    pub reason: String,
}

fn default_free() -> u64 {
    DEFAULT_FREE_NEURONS_PER_DAY
}

impl SetBudget {
    /// The budget it sets.
    pub fn budget(&self) -> Budget {
        Budget {
            daily_neurons: self.daily_neurons,
            monthly_neurons: self.monthly_neurons,
            free_neurons_per_day: self.free_neurons_per_day,
        }
    }
}

/// A stored config version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigView {
    /// 1, 2, … per model.
    pub version: u32,
    /// The content.
    #[serde(flatten)]
    pub spec: ConfigSpec,
    /// Operator who added it.
    pub created_by: String,
    /// When it was added.
    pub created_at: Timestamp,
    /// When it was last activated, if ever.
    pub activated_at: Option<Timestamp>,
    /// Whether it is the model's active config.
    pub active: bool,
}

/// `POST /admin/v1/models`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateModel {
    /// `@cf/org/name`.
    pub slug: ModelSlug,
    /// Workers AI task, e.g. `Text Generation`.
    pub task: String,
    /// One line for catalogues.
    #[serde(default)]
    pub description: String,
    /// Starting visibility.
    pub visibility: Visibility,
    /// A first config, activated at once (subject to the pool check).
    #[serde(default)]
    pub config: Option<ConfigSpec>,
}

/// A model as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelView {
    /// `@cf/org/name`.
    pub slug: ModelSlug,
    /// Workers AI task.
    pub task: String,
    /// One line for catalogues.
    pub description: String,
    /// Who may call it.
    pub visibility: Visibility,
    /// Accounts that may call it while private.
    pub allowlist: Vec<String>,
    /// Limits of the active config; `None` before any config is active.
    pub properties: Option<Properties>,
    /// Active config version.
    pub active_config: Option<u32>,
    /// Its status-page component status.
    pub component_status: ComponentStatus,
    /// Created.
    pub created_at: Timestamp,
    /// Last changed.
    pub updated_at: Timestamp,
}

/// `POST /admin/v1/models/{slug}/visibility`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetVisibility {
    /// The new visibility.
    pub visibility: Visibility,
    /// Why; goes into the audit log. Must not be empty.
    pub reason: String,
    /// Whether making the model private also ends its streams in flight,
    /// on every gateway, before the change is acknowledged (each ends with
    /// an error event). `false` lets them finish: a planned flip.
    #[serde(default = "yes")]
    pub end_streams: bool,
}

fn yes() -> bool {
    true
}

/// `POST /admin/v1/models/{slug}/allowlist`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetAllowlist {
    /// The account.
    pub account_id: String,
    /// Add (`true`) or remove (`false`).
    pub allowed: bool,
    /// Why; goes into the audit log. Must not be empty.
    pub reason: String,
}

/// The result of a visibility or allowlist change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelChange {
    /// The model after the change.
    pub model: ModelView,
    /// The audit entry written for it; `None` when nothing changed.
    pub audit: Option<AuditEntry>,
    /// How far the change had reached the gateways when this answer left.
    pub propagation: Option<Propagation>,
}

/// One append-only audit log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Increasing.
    pub id: i64,
    /// When.
    pub at: Timestamp,
    /// Operator name.
    pub actor: String,
    /// `model.visibility`, `model.allowlist`, `config.activate`, …
    pub action: String,
    /// What it acted on, e.g. a model slug.
    pub subject: String,
    /// The operator's reason.
    pub reason: String,
    /// State before.
    pub before: String,
    /// State after.
    pub after: String,
}

/// `POST /admin/v1/accounts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateAccount {
    /// Display name.
    pub name: String,
}

/// A tenant account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountView {
    /// 32 lowercase hex digits, as in Workers AI URLs.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Created.
    pub created_at: Timestamp,
    /// The platform's own (the leak prober's), not a tenant's.
    #[serde(default)]
    pub sentinel: bool,
    /// Budgets and free allowance.
    #[serde(default)]
    pub budget: Budget,
}

/// `POST /admin/v1/operators`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateOperator {
    /// Unique name; the audit log's actor.
    pub name: String,
    /// What the token may do.
    pub role: Role,
}

/// An operator token's metadata (never the token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorView {
    /// Id.
    pub id: i64,
    /// Name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// Created.
    pub created_at: Timestamp,
    /// Revoked, if it was.
    pub revoked_at: Option<Timestamp>,
}

/// A new operator and its token, shown once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorCreated {
    /// Metadata.
    pub operator: OperatorView,
    /// The bearer token; only its hash is stored.
    pub token: String,
}

/// `POST /admin/v1/nodes`: a worker announces itself after loading weights.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterNode {
    /// Unique node name; re-registering under it replaces the old record.
    pub name: String,
    /// What it does.
    pub role: NodeRole,
    /// The model it serves.
    pub model: ModelSlug,
    /// Its HTTP address.
    pub address: String,
    /// Its KV transfer address (prefill workers).
    #[serde(default)]
    pub transfer_address: Option<String>,
    /// Tokens its KV pool holds, measured after loading weights.
    pub kv_pool_tokens: u64,
    /// sha256 of the weights it loaded.
    pub weights_sha256: String,
    /// Their quantization.
    pub quantization: String,
    /// Tokens per KV page.
    pub page_size: u32,
    /// KV memory it was given.
    pub kv_budget_bytes: u64,
    /// Its device split.
    #[serde(default)]
    pub parallelism: Parallelism,
    /// Its prefill speed, measured at start, and its prefill deadline.
    #[serde(default)]
    pub prefill: Option<PrefillFigures>,
}

/// How fast a worker prefills (measured when it starts) and the longest a
/// prompt may take on it: `n` prompt tokens take about
/// `ns_per_token * n + ns_per_pair * n * (n - 1) / 2` nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefillFigures {
    /// Nanoseconds per prompt token for the weight matrices.
    pub ns_per_token: u64,
    /// Nanoseconds of attention per pair of prompt tokens.
    pub ns_per_pair: u64,
    /// The longest a prompt may take to prefill, in milliseconds.
    pub deadline_ms: u64,
}

impl PrefillFigures {
    /// Estimated milliseconds to prefill a prompt of `n` tokens alone.
    pub fn prompt_ms(&self, n: u64) -> u64 {
        let pairs = u128::from(n) * u128::from(n.saturating_sub(1)) / 2;
        let ns =
            u128::from(self.ns_per_token) * u128::from(n) + u128::from(self.ns_per_pair) * pairs;
        u64::try_from(ns / 1_000_000).unwrap_or(u64::MAX)
    }

    /// The longest prompt prefilled within the deadline.
    pub fn max_prompt(&self) -> u64 {
        let (mut lo, mut hi) = (0u64, 1u64 << 32);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.prompt_ms(mid) <= self.deadline_ms {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}

/// `POST /admin/v1/nodes/{id}/heartbeat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// Current load, for routing.
    #[serde(default)]
    pub load: Option<NodeLoad>,
}

/// A node's load as it last reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeLoad {
    /// Free KV pages.
    pub free_pages: u64,
    /// All KV pages.
    pub total_pages: u64,
    /// Requests waiting.
    pub queue_depth: u64,
}

/// A registered worker and whether requests may be routed to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    /// Id.
    pub id: i64,
    /// What it registered.
    #[serde(flatten)]
    pub registration: RegisterNode,
    /// Last reported load.
    pub load: Option<NodeLoad>,
    /// First registration under this name.
    pub registered_at: Timestamp,
    /// Last registration or heartbeat.
    pub last_seen_at: Timestamp,
    /// Whether the gateway may send it requests.
    pub routable: bool,
    /// Why not, when it may not.
    pub unroutable_reason: Option<String>,
}

/// Reply to a registration or heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node as stored.
    pub node: NodeView,
    /// Send a heartbeat at least this often.
    pub heartbeat_interval_ms: u64,
    /// For a decode node: the routable prefill workers of its model, to
    /// link to (empty for other roles).
    #[serde(default)]
    pub prefill_peers: Vec<PrefillPeer>,
}

/// A prefill worker a decode worker may link to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefillPeer {
    /// Its registered name.
    pub name: String,
    /// Its KV transfer address.
    pub transfer_address: String,
}

/// A component (model) status change an incident update makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentChange {
    /// The model.
    pub model: ModelSlug,
    /// Its new status.
    pub status: ComponentStatus,
}

/// `POST /admin/v1/incidents`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenIncident {
    /// Title.
    pub name: String,
    /// First status; default `investigating`.
    #[serde(default = "investigating")]
    pub status: IncidentStatus,
    /// Impact.
    pub impact: Impact,
    /// First update's text.
    pub body: String,
    /// Affected models and their statuses.
    #[serde(default)]
    pub components: Vec<ComponentChange>,
}

fn investigating() -> IncidentStatus {
    IncidentStatus::Investigating
}

/// `POST /admin/v1/incidents/{id}/updates`. A `resolved` update with no
/// component changes sets every affected model back to operational.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateIncident {
    /// New status.
    pub status: IncidentStatus,
    /// Update text.
    pub body: String,
    /// New impact, if it changed.
    #[serde(default)]
    pub impact: Option<Impact>,
    /// Component changes.
    #[serde(default)]
    pub components: Vec<ComponentChange>,
    /// Postmortem text (only with `resolved`); publishes it and moves the
    /// incident to `postmortem`.
    #[serde(default)]
    pub postmortem: Option<String>,
}

/// An incident with its timeline, newest update first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentView {
    /// Id.
    pub id: i64,
    /// Title.
    pub name: String,
    /// Current status.
    pub status: IncidentStatus,
    /// Current impact.
    pub impact: Impact,
    /// Opened.
    pub created_at: Timestamp,
    /// Last update.
    pub updated_at: Timestamp,
    /// First `monitoring` update.
    pub monitoring_at: Option<Timestamp>,
    /// Resolution.
    pub resolved_at: Option<Timestamp>,
    /// Postmortem, if published.
    pub postmortem_body: Option<String>,
    /// When it was published.
    pub postmortem_published_at: Option<Timestamp>,
    /// Every model any update touched.
    pub components: Vec<ModelSlug>,
    /// Timeline, newest first.
    pub updates: Vec<IncidentUpdateView>,
}

/// One timestamped incident update.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentUpdateView {
    /// Id.
    pub id: i64,
    /// Status it set.
    pub status: IncidentStatus,
    /// Text.
    pub body: String,
    /// When.
    pub created_at: Timestamp,
    /// Operator name.
    pub actor: String,
    /// Component changes it made.
    pub affected_components: Vec<AffectedComponent>,
}

/// One component change within an update.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AffectedComponent {
    /// The model.
    pub model: ModelSlug,
    /// Before.
    pub old_status: ComponentStatus,
    /// After.
    pub new_status: ComponentStatus,
}

/// `POST /admin/v1/accounts/{id}/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateApiToken {
    /// A label for the token, e.g. "ci".
    pub name: String,
}

/// A tenant API token's metadata (never the token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiTokenView {
    /// Id.
    pub id: i64,
    /// The one account it is valid for.
    pub account_id: String,
    /// Label.
    pub name: String,
    /// Created.
    pub created_at: Timestamp,
    /// Revoked, if it was.
    pub revoked_at: Option<Timestamp>,
}

/// A new API token, shown once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiTokenCreated {
    /// Metadata.
    #[serde(flatten)]
    pub meta: ApiTokenView,
    /// The bearer token; only its hash is stored.
    pub token: String,
}

/// How far a change has reached the gateways.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Propagation {
    /// The routing table version that carries the change.
    pub version: u64,
    /// Live gateways when the change was made.
    pub gateways: usize,
    /// How many of them applied it before the answer.
    pub applied: usize,
    /// How long the answer waited for them.
    pub waited_ms: u64,
    /// The gateways' lease: one that has not applied the change stops
    /// serving once this long has passed without an answer from the
    /// control plane.
    #[serde(default)]
    pub lease_ms: u64,
}

/// `GET /admin/v1/routing`: everything a gateway routes and authenticates
/// with. Token hashes only, never tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingTable {
    /// Changes whenever anything in it may have changed.
    pub version: u64,
    /// A gateway that has not heard from the control plane for this long
    /// must stop admitting requests.
    pub lease_ms: u64,
    /// Every model.
    pub models: Vec<RoutedModel>,
    /// Every registered worker, with its routability.
    pub nodes: Vec<NodeView>,
    /// Every account.
    pub accounts: Vec<RoutedAccount>,
    /// Every live API token, as its sha256.
    pub tokens: Vec<RoutedToken>,
    /// Models made private by a planned flip: their streams in flight may
    /// finish. A stream of any other model that its account may no longer
    /// call is ended.
    #[serde(default)]
    pub planned_withdrawals: Vec<ModelSlug>,
}

/// A model as the gateway sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutedModel {
    /// Slug.
    pub slug: ModelSlug,
    /// Workers AI task.
    pub task: String,
    /// Description.
    pub description: String,
    /// Who may call it.
    pub visibility: Visibility,
    /// Accounts that may call it while private.
    pub allowlist: Vec<String>,
    /// Limits of the active config.
    pub properties: Option<Properties>,
    /// The active config's version (the gateway names it in the tenant
    /// context it signs).
    #[serde(default)]
    pub config_version: Option<u64>,
    /// The active config's price.
    #[serde(default)]
    pub price: Price,
    /// Created.
    pub created_at: Timestamp,
}

/// An account as the gateway sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutedAccount {
    /// 32 hex digits.
    pub id: String,
    /// Display name.
    pub name: String,
    /// The tenant number workers tag its KV pages with.
    pub tenant: u64,
    /// Its budgets, which the gateway reserves against.
    #[serde(default)]
    pub budget: Budget,
}

/// A live API token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutedToken {
    /// sha256 of the token, hex.
    pub sha256: String,
    /// Its account.
    pub account_id: String,
    /// The batch it was made for, when the batch runner holds it: the
    /// gateway runs its calls in the batch class and bills each batch line
    /// once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_id: Option<String>,
}

/// One worker call's usage, as the worker counted it: the prompt once
/// admitted, the output tokens it emitted (also when the client went away).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageEvent {
    /// The call's single-use id from its signed tenant context: a report
    /// repeated (after a lost answer) counts once.
    pub call_id: String,
    /// The account (32 hex digits).
    pub account_id: String,
    /// The model slug.
    pub model: ModelSlug,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Output tokens emitted.
    pub completion_tokens: u64,
    /// The call's tenant context as the gateway signed it: the event is
    /// accepted only for that context's account, model and call id.
    pub context: String,
    /// How the call ended (`stop`, `length`, `cancelled`, `error`, ...).
    pub finish: String,
    /// When it ended.
    pub at: Timestamp,
}

/// `POST /admin/v1/usage` (workers): a batch of events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageReport {
    /// At most 1000 events.
    pub events: Vec<UsageEvent>,
}

/// `POST /admin/v1/usage/void` (the gateway): worker calls whose answer
/// the client never got (one of a request's `n` choices failed, so the
/// request answered an error). They bill nothing: an event already in the
/// ledger is reversed, and one reported later counts nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageVoid {
    /// The account the calls were for (32 hex digits).
    pub account_id: String,
    /// The model slug.
    pub model: ModelSlug,
    /// The calls' ids, as the gateway signed them (at most 1000).
    pub call_ids: Vec<String>,
}

/// What a void changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageVoided {
    /// Events already in the ledger, now reversed.
    pub reversed: u64,
    /// Calls not reported yet: a report of them counts nothing.
    pub barred: u64,
}

/// What a report changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecorded {
    /// Events new to the ledger.
    pub recorded: u64,
    /// Events it had already (counted once).
    pub duplicates: u64,
}

/// One row of usage: an account's use of a model on a UTC day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    /// The account.
    pub account_id: String,
    /// The model slug.
    pub model: String,
    /// The UTC day, `YYYY-MM-DD`.
    pub date: String,
    /// Worker calls.
    pub requests: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// What they cost, in micro-neurons, at the model's price when they
    /// were recorded.
    #[serde(default)]
    pub micro_neurons: u64,
}

/// The most bytes one uploaded file may hold (under the gateway's 2 MiB
/// body bound, with room for the multipart envelope).
pub const MAX_FILE_BYTES: usize = 2_000_000;
/// The most lines one uploaded file may hold.
pub const MAX_FILE_LINES: usize = 10_000;
/// The most files one account keeps at once.
pub const MAX_FILES_PER_ACCOUNT: u64 = 100;
/// The most bytes of files one account keeps at once.
pub const MAX_FILE_BYTES_PER_ACCOUNT: u64 = 50_000_000;

/// A tenant's uploaded file, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileView {
    /// `file-` and 24 hex digits.
    pub id: String,
    /// Whose it is.
    pub account_id: String,
    /// What it is for (`batch`).
    pub purpose: String,
    /// The name the client gave it.
    pub filename: String,
    /// Its size.
    pub bytes: u64,
    /// Its non-empty lines.
    pub lines: u64,
    /// When it was uploaded.
    pub created_at: Timestamp,
}

/// `POST /admin/v1/files`: a file the gateway received for the account it
/// authenticated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileUpload {
    /// The account it belongs to.
    pub account_id: String,
    /// What it is for (`batch`).
    pub purpose: String,
    /// The client's name for it.
    pub filename: String,
    /// Its text (JSON Lines).
    pub content: String,
}

/// `GET /admin/v1/files/{id}/content`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileContent {
    /// The file's text.
    pub content: String,
}
