//! Voiding a request's calls in the ledger: a request of `n` choices that
//! answers the client an error bills nothing, though some of its choices
//! ran (their workers report what they computed, before or after). The
//! gateway alone knows what the client was told, so it tells the control
//! plane which calls to void; a void that cannot be delivered is retried,
//! then logged.

use super::Ctx;
use crate::state::AppState;
use bulkhead_control_api::{RoutedModel, UsageVoid, UsageVoided};
use std::time::Duration;

/// Tries to deliver a void this many times.
const TRIES: u32 = 3;

/// Voids every call `ctx`'s request signed so far, in the background.
pub(crate) fn void_calls(s: &AppState, ctx: &Ctx, model: &RoutedModel) {
    let call_ids = ctx
        .calls
        .lock()
        .map(|mut c| std::mem::take(&mut *c))
        .unwrap_or_default();
    if call_ids.is_empty() {
        return;
    }
    let void = UsageVoid {
        account_id: ctx.principal.account_id.clone(),
        model: model.slug.clone(),
        call_ids,
    };
    let client = s.watch.control_plane().clone();
    tokio::spawn(async move {
        for attempt in 1..=TRIES {
            match client
                .post::<_, UsageVoided>("/admin/v1/usage/void", &void)
                .await
            {
                Ok(v) => {
                    tracing::debug!(target: "bulkhead::gateway", reversed = v.reversed, barred = v.barred, "voided a failed request's calls");
                    return;
                }
                Err(e) if attempt < TRIES => {
                    tracing::debug!(target: "bulkhead::gateway", error = %e, "voiding calls failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500 * u64::from(attempt))).await;
                }
                Err(e) => tracing::warn!(
                    target: "bulkhead::gateway",
                    error = %e,
                    calls = void.call_ids.len(),
                    "a failed request's calls could not be voided: they stay billed"
                ),
            }
        }
    });
}
