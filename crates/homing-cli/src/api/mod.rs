//! The HTTP API (`/v1`, JSON, described by the OpenAPI document at `/v1/openapi.json`), the
//! Prometheus endpoint at `/metrics`, and the dashboard at `/`. Handlers are thin: they parse,
//! call the library's [`homing::Client`] or store, and map errors to `{"error": {code, message}}`
//! without leaking internals — never a 500 for a client's mistake.
//!
//! Access (docs/access.md): with tokens configured, every route but the open ones needs a
//! token; a `read` token may only `GET` (and `HEAD`), everything else answers 403 `forbidden`.
//! Every write an operator makes (everything but the producer's and remote workers' traffic)
//! is recorded in the audit log after it is answered.

mod audit;
mod events;
mod exact_json;
pub use exact_json::ExactJson;
pub mod jobs;
mod metrics;
pub mod queues;
mod remote;
pub mod schedules;
mod stats;
mod status;
mod workflows;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

use crate::config::{ApiToken, Role};
use homing::{Backends, Client, Registry};
use homing_pipelines::api::refuse_declared_over;
/// One error type for the whole API, shared with the pipelines' routes.
pub use homing_pipelines::api::ApiError;
pub use metrics::install_recorder;

/// Largest request body accepted by this module's routes (a job's args are limited to 1 MiB of
/// JSON). The pipelines' upload routes carry their own, larger limits.
pub const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// Largest body of `POST /v1/jobs/batch` (docs/batch.md): room for
/// [`homing::client::MAX_BATCH`] jobs of a few kilobytes each. A batch of larger jobs is split
/// by its sender; each job's own args stay limited to 1 MiB.
pub const BATCH_BODY_LIMIT: usize = 32 * 1024 * 1024;

/// The default of `--unhealthy-after`: long enough that a store failover or a broker restart
/// does not page anyone, short enough that a dead dependency shows within a minute.
pub const DEFAULT_UNHEALTHY_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// The budget of one bulk call: `part`, but at most a quarter of `request_timeout`, so that the
/// step that runs past the budget still ends well before the request would be cut (a step is
/// at most [`homing::bulk::BATCH`] jobs in one transaction).
pub fn bulk_budget(
    request_timeout: std::time::Duration,
    part: std::time::Duration,
) -> std::time::Duration {
    (request_timeout / 4).min(part)
}

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub client: Client,
    pub backends: Backends,
    /// Tasks this binary knows without any worker registering them.
    pub builtin: Registry,
    /// When not empty, every route but `/healthz` and the dashboard's static files requires
    /// one of these tokens, and its role decides what it may do.
    pub tokens: Arc<Vec<ApiToken>>,
    /// Renders this process's metrics; `None` when no recorder is installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// `/healthz` reports a background loop that has failed for longer than this.
    pub unhealthy_after: std::time::Duration,
    /// How long one call of a bulk action works before it answers what it did and where to go
    /// on (docs/bulk.md); well inside the request timeout.
    pub bulk_budget: std::time::Duration,
    /// What this server's sweeps for remote sessions' stray messages saw (`homing::remote::strays`).
    pub remote_sightings: Arc<homing::remote::strays::Sightings>,
    /// Job event streams open at once: at most half the connections
    /// ([`event_streams_for`]). A stream is exempt from the request timeout, so without a
    /// bound one client's streams could hold every connection for as long as it liked.
    pub event_streams: Arc<tokio::sync::Semaphore>,
}

/// The bound on open job event streams for a server of `max_connections`: half of them, so
/// that streams never leave the API without a connection.
pub fn event_streams_for(max_connections: usize) -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(max_connections / 2))
}

impl AppState {
    pub fn new(backends: Backends, builtin: Registry, tokens: Vec<ApiToken>) -> Self {
        let client = Client::new(backends.broker.clone(), backends.store.clone())
            .with_registry(builtin.clone());
        Self {
            client,
            backends,
            builtin,
            tokens: Arc::new(tokens),
            metrics: None,
            unhealthy_after: DEFAULT_UNHEALTHY_AFTER,
            bulk_budget: std::time::Duration::from_secs(10),
            remote_sightings: Arc::default(),
            event_streams: event_streams_for(512),
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
        .route("/dashboard/charts.js", get(stats::charts_script))
        .route("/dashboard/vendor/uplot.min.js", get(stats::uplot_script))
        .route("/dashboard/vendor/uplot.min.css", get(stats::uplot_style))
        .route("/v1/stats/series", get(stats::series))
        .route("/dashboard/views.js", get(status::views_script))
        .route("/dashboard/workers.js", get(status::workers_script))
        .route("/dashboard/timeline.js", get(status::timeline_script))
        .route("/healthz", get(status::healthz))
        .route("/metrics", get(metrics::render))
        .route("/v1/openapi.json", get(status::openapi))
        .route("/v1/jobs", post(jobs::create).get(jobs::list))
        .route("/v1/jobs/count", get(jobs::count))
        .route("/v1/jobs/retry", post(jobs::bulk_retry))
        .route("/v1/jobs/cancel", post(jobs::bulk_cancel))
        .route("/v1/jobs/delete", post(jobs::bulk_delete))
        .route("/v1/jobs/{id}", get(jobs::get))
        .route("/v1/jobs/{id}/history", get(jobs::history))
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
        .route("/v1/workers/{id}", get(status::worker))
        .route("/v1/whoami", get(audit::whoami))
        .route("/v1/audit", get(audit::list))
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
    // The batch route alone takes bodies beyond BODY_LIMIT, so it gets its own router and
    // limits.
    let batch = Router::new()
        .route("/v1/jobs/batch", post(jobs::create_batch))
        .layer(middleware::from_fn_with_state(
            BATCH_BODY_LIMIT,
            refuse_declared_over,
        ))
        .layer(DefaultBodyLimit::max(BATCH_BODY_LIMIT));
    // Producers', operators' and uploads' requests share a budget of store threads
    // (homing::requests); remote workers' calls are a worker's and stay outside it.
    own.merge(batch)
        .merge(pipelines.router(state.client.clone()))
        .layer(middleware::from_fn_with_state(
            homing::requests::new_budget(),
            within_budget,
        ))
        .merge(remote::router())
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .with_state(state)
}

/// Handles a request with its embedded-store calls inside the requests' budget, so that a flood
/// of slow ones cannot take the threads the process's workers and loops need.
async fn within_budget(
    State(budget): State<Arc<homing::requests::Budget>>,
    req: Request,
    next: Next,
) -> Response {
    // The health check stays outside: one short read, which a probe must get answered however
    // many slow requests wait.
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    homing::requests::serving(budget, next.run(req)).await
}

/// `value` as a JSON answer (200), serialized and then dropped on a blocking thread, inside the
/// requests' share of threads (homing::requests). A page
/// of jobs with large args or results is tens of megabytes, which held a runtime thread for
/// seconds: the heartbeats of `homing up`'s workers waited behind it until they were presumed
/// dead and their jobs taken back.
pub async fn json_off_runtime<T>(value: T) -> Result<Response, ApiError>
where
    T: serde::Serialize + Send + 'static,
{
    let permit = homing::requests::permit(homing::requests::Work::Answer).await;
    let body = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        serde_json::to_vec(&value)
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(ApiError::internal)?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response())
}

/// Routes anyone may fetch: the health check, and the dashboard's static shell, which holds no
/// data (it asks for a token and sends it with every API call it makes).
fn is_open(path: &str) -> bool {
    matches!(
        path,
        "/healthz"
            | "/"
            | "/dashboard/app.js"
            | "/dashboard/style.css"
            | "/dashboard/charts.js"
            | "/dashboard/vendor/uplot.min.js"
            | "/dashboard/vendor/uplot.min.css"
            | "/dashboard/views.js"
            | "/dashboard/workers.js"
            | "/dashboard/timeline.js"
    )
}

/// Compares two byte strings in time that depends only on their lengths, not their contents.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Which of `tokens` equals `given`. Every token is compared, in constant time each, so the
/// time taken reveals neither which token nor how much of one matched. Tokens are distinct
/// (the configuration refuses one given twice), so at most one matches.
fn token_match<'a>(given: &[u8], tokens: &'a [ApiToken]) -> Option<&'a ApiToken> {
    tokens.iter().fold(None, |found, t| {
        let eq = constant_time_eq(given, t.token.as_bytes());
        if eq {
            Some(t)
        } else {
            found
        }
    })
}

/// Who is calling: put on every request that passed [`auth`], for the handlers and the audit
/// log.
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: Arc<str>,
    pub role: Role,
}

/// Whether a request only reads: what a `read` token may do.
fn is_read(method: &axum::http::Method) -> bool {
    method == axum::http::Method::GET || method == axum::http::Method::HEAD
}

async fn auth(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if is_open(req.uri().path()) {
        return next.run(req).await;
    }
    let caller = if state.tokens.is_empty() {
        Caller {
            name: "anonymous".into(),
            role: Role::Admin,
        }
    } else {
        let given = req
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        match token_match(given.as_bytes(), &state.tokens) {
            Some(t) => Caller {
                name: t.name.clone(),
                role: t.role,
            },
            None => {
                return ApiError::new(
                    axum::http::StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "missing or wrong API token: send `Authorization: Bearer <token>` (HOMING_API_TOKEN or api_tokens in HOMING_CONFIG)",
                )
                .into_response()
            }
        }
    };
    if caller.role == Role::Read && !is_read(req.method()) {
        let refused = ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "the token '{}' has the role read: it may only GET; {} needs an admin token",
                caller.name,
                req.method()
            ),
        )
        .into_response();
        let entry = audit::refusal(&caller, &req, refused.status().as_u16());
        return audit::refused(&state, entry, refused).await;
    }
    req.extensions_mut().insert(caller.clone());
    if is_read(req.method()) {
        return next.run(req).await;
    }
    audit::recorded(&state, caller, req, next).await
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
    fn any_configured_token_opens_with_its_own_role() {
        use crate::config::{ApiToken, Role};
        let t = |token: &str, role, name: &str| ApiToken {
            token: token.into(),
            role,
            name: name.into(),
        };
        let tokens = vec![
            t("alpha", Role::Admin, "a"),
            t("beta-token", Role::Read, "b"),
        ];
        let who = |given: &[u8]| super::token_match(given, &tokens).map(|t| (&*t.name, t.role));
        assert_eq!(who(b"alpha"), Some(("a", Role::Admin)));
        assert_eq!(who(b"beta-token"), Some(("b", Role::Read)));
        assert_eq!(who(b"beta"), None);
        assert_eq!(who(b""), None);
    }
}
