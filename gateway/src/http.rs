//! The router: each route's handler in the API module that renders it
//! (`openai`, `workers_ai`), the door (`edge::guard`) before every one of
//! them, and the gateway's own health and fallback.

use crate::errors::GatewayError;
use crate::state::AppState;
use crate::{batches, embeddings, files, openai, workers_ai};
use axum::Router;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

/// The gateway router.
pub fn app(state: AppState) -> Router {
    let v4 = "/client/v4/accounts/{account_id}/ai";
    let router = Router::new()
        .route(&format!("{v4}/run/{{*model}}"), post(workers_ai::run))
        .route(&format!("{v4}/models/search"), get(workers_ai::search))
        .route(&format!("{v4}/usage"), get(workers_ai::usage))
        .route(
            &format!("{v4}/v1/chat/completions"),
            post(openai::account_chat),
        )
        .route(
            &format!("{v4}/v1/embeddings"),
            post(embeddings::account_create),
        )
        .route(&format!("{v4}/v1/models"), get(openai::account_models))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/embeddings", post(embeddings::create))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{*model}", get(openai::model))
        .route("/v1/files", post(files::upload).get(files::list))
        .route("/v1/files/{id}", get(files::one).delete(files::delete))
        .route("/v1/files/{id}/content", get(files::content))
        .route("/v1/batches", post(batches::create).get(batches::list))
        .route("/v1/batches/{id}", get(batches::one))
        .route("/v1/batches/{id}/cancel", post(batches::cancel))
        .route("/health", get(health))
        // Before any handler: strangers and declared over-large bodies are
        // refused without reading a byte of the body.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::edge::guard,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(
            crate::bounds::MAX_BODY_BYTES,
        ))
        .method_not_allowed_fallback(crate::edge::method_not_allowed)
        .fallback(fallback)
        .with_state(state);
    // Tenants call this router: a trace starts here, whatever they send.
    bulkhead_telemetry::instrument(router, bulkhead_telemetry::Hop::Edge, &["/health"])
}

async fn health(axum::extract::State(s): axum::extract::State<AppState>) -> Response {
    match s.watch.current() {
        Ok(snap) => format!("ok version={}\n", snap.table.version()).into_response(),
        Err(e) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("{e}\n"),
        )
            .into_response(),
    }
}

async fn fallback(uri: Uri) -> Response {
    GatewayError::NoRoute
        .in_(crate::edge::flavor_of(uri.path()))
        .into_response()
}
