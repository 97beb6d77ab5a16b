//! Health, queues, workers, the OpenAPI document, and the dashboard's static files (embedded in
//! the binary: no front-end build step, nothing to install next to it).

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::Json;

use super::{ApiError, AppState};
use crate::views;

pub async fn healthz(State(state): State<AppState>) -> Response {
    // A cheap read that touches the store: a server whose store is gone is not healthy.
    match state.backends.store.get(homing::job::new_job_id()).await {
        Ok(_) => Json(serde_json::json!({"status": "ok"})).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "health check failed");
            let msg = format!("the {} store is unavailable", state.backends.store.kind());
            let body = serde_json::json!({"status": "unavailable", "error": {"code": "unavailable", "message": msg}});
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}

pub async fn queues(State(state): State<AppState>) -> Result<Response, ApiError> {
    let qs = views::queues(&state.backends).await?;
    Ok(Json(serde_json::json!({ "queues": qs })).into_response())
}

pub async fn workers(State(state): State<AppState>) -> Result<Response, ApiError> {
    let since = homing::time::now() - 3600 * 1_000_000;
    let ws = views::workers(&state.backends, since).await?;
    Ok(Json(serde_json::json!({ "workers": ws })).into_response())
}

/// The dashboard: a static shell whose script reads and steers everything through the API.
pub async fn page() -> Html<&'static str> {
    Html(include_str!("../dashboard/index.html"))
}

pub async fn script() -> Response {
    (
        [(CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../dashboard/app.js"),
    )
        .into_response()
}

pub async fn style() -> Response {
    (
        [(CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../dashboard/style.css"),
    )
        .into_response()
}

/// The OpenAPI 3 document, written by hand next to the routes it describes; the schemathesis
/// test (`tests/openapi.rs`) fuzzes the server against it so the two cannot drift apart.
pub async fn openapi() -> Response {
    (
        [(CONTENT_TYPE, "application/json")],
        include_str!("openapi.json"),
    )
        .into_response()
}
