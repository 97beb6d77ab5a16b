//! Health, queues, workers, and the page at `/`.

use axum::extract::State;
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

/// A small self-refreshing overview; the API is the interface, this is a window onto it.
pub async fn page() -> Html<&'static str> {
    Html(include_str!("page.html"))
}
