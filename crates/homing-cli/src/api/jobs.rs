//! `/v1/jobs`: enqueue, read, list, retry and cancel (the event stream is in `events.rs`).

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use std::time::Duration;

use super::{ApiError, AppState};
use homing::job::opt_duration;
use homing::store::JobFilter;
use homing::{EnqueueRequest, FollowUp, JobId, JobOptions, JobState, RetryPolicy};

/// The body of `POST /v1/jobs`. Unknown fields are refused so that a typo is not silently ignored.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateJob {
    pub task: String,
    #[serde(default)]
    pub args: serde_json::Value,
    pub queue: Option<String>,
    pub idempotency_key: Option<String>,
    #[serde(default, with = "opt_duration")]
    pub countdown: Option<Duration>,
    pub max_retries: Option<u32>,
    pub retry_policy: Option<RetryPolicy>,
    pub max_crashes: Option<u32>,
    #[serde(default, with = "opt_duration")]
    pub time_limit: Option<Duration>,
    pub on_success: Option<FollowUp>,
    pub on_failure: Option<FollowUp>,
    /// Called (a JSON POST of the event, with retries) when the job reaches a terminal state.
    pub callback_url: Option<String>,
    /// Accept a task that no worker has registered yet.
    #[serde(default)]
    pub allow_unknown_task: bool,
}

pub fn parse_id(s: &str) -> Result<JobId, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("'{s}' is not a job id (a UUID)")))
}

/// Fails with a clear error unless some worker (or this binary) knows the task.
pub async fn check_known_task(state: &AppState, task: &str) -> Result<(), ApiError> {
    if state.builtin.get(task).is_some() {
        return Ok(());
    }
    let known = state.backends.store.known_tasks().await?;
    if known.iter().any(|t| t == task) {
        return Ok(());
    }
    let mut all = state.builtin.names();
    all.extend(known);
    all.sort();
    all.dedup();
    Err(ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_task",
        format!(
            "no worker has registered task '{task}' (known: {}); start a worker that runs it, or set \"allow_unknown_task\": true",
            all.join(", ")
        ),
    ))
}

pub async fn create(
    State(state): State<AppState>,
    body: Result<Json<CreateJob>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    homing::client::validate_name("task", &body.task)?;
    if !body.allow_unknown_task {
        check_known_task(&state, &body.task).await?;
    }
    let req = EnqueueRequest {
        task: body.task,
        args: body.args,
        options: JobOptions {
            queue: body.queue,
            idempotency_key: body.idempotency_key,
            countdown: body.countdown,
            max_retries: body.max_retries,
            retry_policy: body.retry_policy,
            max_crashes: body.max_crashes,
            time_limit: body.time_limit,
            on_success: body.on_success,
            on_failure: body.on_failure,
            callback_url: body.callback_url,
        },
    };
    let inserted = state.client.enqueue(req).await?;
    let job = state.client.get(inserted.id).await?;
    let status = if inserted.existed {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(job)).into_response())
}

pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(state.client.get(id).await?).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub state: Option<String>,
    pub queue: Option<String>,
    pub task: Option<String>,
    pub limit: Option<usize>,
    pub cursor: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let st = q
        .state
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<JobState>())
        .transpose()
        .map_err(ApiError::bad_request)?;
    let limit = q.limit.unwrap_or(50);
    if limit == 0 || limit > 1000 {
        return Err(ApiError::bad_request("limit must be between 1 and 1000"));
    }
    let filter = JobFilter {
        state: st,
        queue: q.queue.filter(|s| !s.is_empty()),
        task: q.task.filter(|s| !s.is_empty()),
    };
    let page = state
        .client
        .list(
            &filter,
            q.cursor.as_deref().filter(|s| !s.is_empty()),
            limit,
        )
        .await?;
    Ok(Json(page).into_response())
}

pub async fn retry(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(state.client.retry(id).await?).into_response())
}

pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(state.client.cancel(id).await?).into_response())
}
