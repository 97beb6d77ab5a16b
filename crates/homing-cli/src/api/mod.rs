//! The HTTP API (`/v1`, JSON, described by the OpenAPI document at `/v1/openapi.json`), the
//! Prometheus endpoint at `/metrics`, and the dashboard at `/`. Handlers are thin: they parse,
//! call the library's [`homing::Client`] or store, and map errors to `{"error": {code, message}}`
//! without leaking internals — never a 500 for a client's mistake.

mod events;
mod jobs;
mod metrics;
mod queues;
mod remote;
pub mod schedules;
mod status;
mod workflows;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

use homing::{Backends, Client, Registry};
use homing_pipelines::api::refuse_declared_over;
/// One error type for the whole API, shared with the pipelines' routes.
pub use homing_pipelines::api::ApiError;
pub use metrics::install_recorder;

/// Largest request body accepted by this module's routes (a job's args are limited to 1 MiB of
/// JSON). The pipelines' upload routes carry their own, larger limits.
pub const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// The default of `--unhealthy-after`: long enough that a store failover or a broker restart
/// does not page anyone, short enough that a dead dependency shows within a minute.
pub const DEFAULT_UNHEALTHY_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub client: Client,
    pub backends: Backends,
    /// Tasks this binary knows without any worker registering them.
    pub builtin: Registry,
    /// When not empty, every route but `/healthz` and the dashboard's static files requires
    /// one of these tokens.
    pub tokens: Arc<Vec<Arc<str>>>,
    /// Renders this process's metrics; `None` when no recorder is installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// `/healthz` reports a background loop that has failed for longer than this.
    pub unhealthy_after: std::time::Duration,
}

impl AppState {
    pub fn new(backends: Backends, builtin: Registry, tokens: Vec<Arc<str>>) -> Self {
        let client = Client::new(backends.broker.clone(), backends.store.clone())
            .with_registry(builtin.clone());
        Self {
            client,
            backends,
            builtin,
            tokens: Arc::new(tokens),
            metrics: None,
            unhealthy_after: DEFAULT_UNHEALTHY_AFTER,
        }
    }
}

pub fn router(state: AppState, pipelines: &homing_pipelines::Pipelines) -> Router {
    // The limit is layered on these routes (and the fallback) only, before the pipelines' routes
    // join: each route's own limit is the one that holds, for declared and streamed bodies.
    let own = Router::new()
        .route("/", get(status::page))
        .route("/dashboard/app.js", get(status::script))
        .route("/dashboard/style.css", get(status::style))
        .route("/healthz", get(status::healthz))
        .route("/metrics", get(metrics::render))
        .route("/v1/openapi.json", get(status::openapi))
        .route("/v1/jobs", post(jobs::create).get(jobs::list))
        .route("/v1/jobs/{id}", get(jobs::get))
        .route("/v1/jobs/{id}/retry", post(jobs::retry))
        .route("/v1/jobs/{id}/cancel", post(jobs::cancel))
        .route("/v1/jobs/{id}/events", get(events::stream))
        .route(
            "/v1/workflows",
            post(workflows::create).get(workflows::list),
        )
        .route("/v1/workflows/{id}", get(workflows::get))
        .route("/v1/workflows/{id}/cancel", post(workflows::cancel))
        .route("/v1/queues", get(status::queues))
        .route("/v1/queues/{name}", get(queues::get).put(queues::put))
        .route("/v1/queues/{name}/pause", post(queues::pause))
        .route("/v1/queues/{name}/resume", post(queues::resume))
        .route("/v1/workers", get(status::workers))
        .route("/v1/schedules", get(schedules::list))
        .route(
            "/v1/schedules/{name}",
            get(schedules::get)
                .put(schedules::put)
                .delete(schedules::delete),
        )
        .route("/v1/schedules/{name}/pause", post(schedules::pause))
        .route("/v1/schedules/{name}/resume", post(schedules::resume))
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(middleware::from_fn_with_state(
            BODY_LIMIT,
            refuse_declared_over,
        ))
        .layer(DefaultBodyLimit::max(BODY_LIMIT));
    own.merge(remote::router())
        .merge(pipelines.router(state.client.clone()))
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .with_state(state)
}

/// Routes anyone may fetch: the health check, and the dashboard's static shell, which holds no
/// data (it asks for a token and sends it with every API call it makes).
fn is_open(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/" | "/dashboard/app.js" | "/dashboard/style.css"
    )
}

/// Compares two byte strings in time that depends only on their lengths, not their contents.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `given` equals any of `tokens`. Every token is compared, in constant time each, so
/// the time taken reveals neither which token nor how much of one matched.
fn token_matches(given: &[u8], tokens: &[Arc<str>]) -> bool {
    tokens
        .iter()
        .fold(false, |ok, t| ok | constant_time_eq(given, t.as_bytes()))
}

async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if state.tokens.is_empty() || is_open(req.uri().path()) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if token_matches(given.as_bytes(), &state.tokens) {
        next.run(req).await
    } else {
        ApiError::new(
            axum::http::StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong API token: send `Authorization: Bearer <token>` (HOMING_API_TOKEN or api_tokens in HOMING_CONFIG)",
        )
        .into_response()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn constant_time_eq_compares_exactly() {
        assert!(super::constant_time_eq(b"secret", b"secret"));
        assert!(!super::constant_time_eq(b"secret", b"secreT"));
        assert!(!super::constant_time_eq(b"secret", b"secret2"));
        assert!(!super::constant_time_eq(b"", b"x"));
    }

    #[test]
    fn any_configured_token_opens() {
        let tokens: Vec<std::sync::Arc<str>> = vec!["alpha".into(), "beta-token".into()];
        assert!(super::token_matches(b"alpha", &tokens));
        assert!(super::token_matches(b"beta-token", &tokens));
        assert!(!super::token_matches(b"beta", &tokens));
        assert!(!super::token_matches(b"", &tokens));
    }
}
