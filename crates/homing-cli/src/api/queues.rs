//! `/v1/queues/{name}/pause` and `/resume`: an operator holds a queue's jobs back or lets them
//! run again; `PUT /v1/queues/{name}` sets its cluster-wide limits and `GET` reads its settings
//! (docs/limits.md). The listing of queues is in `status.rs`.

use axum::extract::rejection::JsonRejection;
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

/// The body of `PUT /v1/queues/{name}`: the queue's limits, replacing the previous ones; an
/// absent or null field is no such limit, so `{}` clears them all.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutQueue {
    #[serde(default)]
    concurrency: Option<u32>,
    #[serde(default)]
    rate: Option<homing::limit::Rate>,
    #[serde(default)]
    key_arg: Option<String>,
}

impl PutQueue {
    /// The limits the body sets, checked as at every door.
    pub fn into_limits(self) -> Result<homing::limit::QueueLimits, String> {
        let limits = homing::limit::QueueLimits {
            concurrency: self.concurrency,
            rate: self.rate,
            key_arg: self.key_arg,
        };
        limits.check()?;
        Ok(limits)
    }
}

pub async fn put(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Result<Json<PutQueue>, JsonRejection>,
) -> Result<Response, ApiError> {
    homing::validate::producer_queue(&name).map_err(ApiError::bad_request)?;
    let Json(body) = body?;
    let limits = body.into_limits().map_err(ApiError::bad_request)?;
    state.client.set_queue_limits(&name, &limits).await?;
    get(State(state), Path(name)).await
}

/// A queue's settings: paused and limits (the defaults for a queue with none).
pub async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    homing::validate::producer_queue(&name).map_err(ApiError::bad_request)?;
    let settings = state
        .backends
        .store
        .queue_settings()
        .await?
        .into_iter()
        .find(|q| q.queue == name)
        .unwrap_or(homing::store::QueueSettings {
            queue: name,
            ..Default::default()
        });
    Ok(Json(settings).into_response())
}
