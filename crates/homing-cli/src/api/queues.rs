//! `/v1/queues/{name}/pause` and `/resume`: an operator holds a queue's jobs back or lets them
//! run again (docs/limits.md). The listing of queues is in `status.rs`.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{ApiError, AppState};

pub async fn pause(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    set(state, name, true).await
}

pub async fn resume(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    set(state, name, false).await
}

async fn set(state: AppState, name: String, paused: bool) -> Result<Response, ApiError> {
    homing::validate::producer_queue(&name).map_err(ApiError::bad_request)?;
    if paused {
        state.client.pause_queue(&name).await?;
    } else {
        state.client.resume_queue(&name).await?;
    }
    Ok(Json(serde_json::json!({ "queue": name, "paused": paused })).into_response())
}
