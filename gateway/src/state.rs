//! The state every handler shares: the routing watch, JWT settings, the
//! limiter, budgets, the worker client and the picker. Cheap to clone.

use crate::auth::JwtConfig;
use crate::budget::Budgets;
use crate::limits::Limiter;
use crate::pick::Picker;
use crate::upstream::Upstream;
use crate::watch::RoutingWatch;
use std::sync::Arc;

/// Shared state of every handler; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub(crate) watch: RoutingWatch,
    pub(crate) jwt: Option<Arc<JwtConfig>>,
    pub(crate) limiter: Limiter,
    pub(crate) upstream: Upstream,
    pub(crate) picker: Arc<Picker>,
    pub(crate) budgets: Budgets,
    /// Whether a conversation's requests go to the worker its key ranks
    /// highest (prefix-aware routing; on unless an operator turns it off).
    pub(crate) affinity: bool,
}

impl AppState {
    /// State over a routing watch, JWT settings, a limiter and the client
    /// that calls workers.
    pub fn new(
        watch: RoutingWatch,
        jwt: Option<JwtConfig>,
        limiter: Limiter,
        upstream: Upstream,
    ) -> AppState {
        AppState {
            watch,
            jwt: jwt.map(Arc::new),
            limiter,
            upstream,
            picker: Arc::new(Picker::default()),
            budgets: Budgets::memory(),
            affinity: true,
        }
    }

    /// The same state with prefix-aware routing on or off: off, workers
    /// are picked by load alone (a benchmark's baseline).
    pub fn with_affinity(self, affinity: bool) -> AppState {
        AppState { affinity, ..self }
    }

    /// The same state with budgets counted in `budgets` (in this process
    /// otherwise).
    pub fn with_budgets(self, budgets: Budgets) -> AppState {
        AppState { budgets, ..self }
    }
}

impl AppState {
    /// The control plane, for reads a handler makes there.
    pub(crate) fn control_plane(&self) -> &bulkhead_control_api::Client {
        self.watch.control_plane()
    }
}
