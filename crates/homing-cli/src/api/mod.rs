//! The HTTP API (`/v1`, JSON) and the operator's page at `/`. Handlers are thin: they parse,
//! call the library's [`homing::Client`] or store, and map errors to `{"error": {code, message}}`
//! without leaking internals — never a 500 for a client's mistake.

mod error;
mod jobs;
mod status;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

pub use error::ApiError;
use homing::{Backends, Client, Registry};

/// Largest request body accepted (a job's args are limited to 1 MiB of JSON).
pub const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub client: Client,
    pub backends: Backends,
    /// Tasks this binary knows without any worker registering them.
    pub builtin: Registry,
    /// With `HOMING_API_TOKEN` set, every route but `/healthz` requires it.
    pub token: Option<Arc<str>>,
}

impl AppState {
    pub fn new(backends: Backends, builtin: Registry) -> Self {
        let token = std::env::var("HOMING_API_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
            .map(Arc::from);
        let client = Client::new(backends.broker.clone(), backends.store.clone())
            .with_registry(builtin.clone());
        Self {
            client,
            backends,
            builtin,
            token,
        }
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(status::page))
        .route("/healthz", get(status::healthz))
        .route("/v1/jobs", post(jobs::create).get(jobs::list))
        .route("/v1/jobs/:id", get(jobs::get))
        .route("/v1/jobs/:id/retry", post(jobs::retry))
        .route("/v1/jobs/:id/cancel", post(jobs::cancel))
        .route("/v1/queues", get(status::queues))
        .route("/v1/workers", get(status::workers))
        .merge(crate::pipelines::router(state.client.clone()))
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn(declared_length_limit))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// Compares two byte strings in time that depends only on their lengths, not their contents.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Refuses a body whose declared length is over the limit before reading any of it; bodies
/// without a declared length are still cut off at the limit by `DefaultBodyLimit`.
async fn declared_length_limit(req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > BODY_LIMIT as u64 => ApiError::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body of {n} bytes is over the limit of {BODY_LIMIT} bytes"),
        )
        .into_response(),
        _ => next.run(req).await,
    }
}

async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(token) = &state.token else {
        return next.run(req).await;
    };
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(given.as_bytes(), token.as_bytes()) {
        next.run(req).await
    } else {
        ApiError::new(
            axum::http::StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong API token: send `Authorization: Bearer <HOMING_API_TOKEN>`",
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
}
