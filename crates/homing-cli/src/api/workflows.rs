//! `/v1/workflows`: create a DAG of steps in one transaction, read it, list them, cancel one
//! (docs/workflows.md). The graph's rules live in the library (`homing::workflow`); this module
//! only parses and maps errors.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use std::collections::BTreeMap;

use super::{json_off_runtime, ApiError, AppState};
use homing::workflow::{StepSpec, WorkflowId, WorkflowSpec};

/// The body of `POST /v1/workflows`. Unknown fields, and a step named twice, are refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkflow {
    pub name: String,
    #[serde(deserialize_with = "homing::workflow::unique_keys")]
    pub steps: BTreeMap<String, StepSpec>,
    /// Accept tasks that no worker has registered yet.
    #[serde(default)]
    pub allow_unknown_task: bool,
}

fn parse_id(s: &str) -> Result<WorkflowId, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("'{s}' is not a workflow id (a UUID)")))
}

pub async fn create(
    State(state): State<AppState>,
    body: Result<super::ExactJson<CreateWorkflow>, ApiError>,
) -> Result<Response, ApiError> {
    let super::ExactJson(body) = body?;
    let spec = WorkflowSpec {
        name: body.name,
        steps: body.steps,
    };
    // Every rule first (graph, names, sizes), so a refused name is reported as such rather than
    // as an unknown task.
    state.client.check_workflow(&spec)?;
    if !body.allow_unknown_task {
        let mut tasks: Vec<&str> = spec.steps.values().map(|s| s.task.as_str()).collect();
        tasks.sort_unstable();
        tasks.dedup();
        for t in tasks {
            super::jobs::check_known_task(&state, t).await?;
        }
    }
    let created = state.client.create_workflow(spec).await?;
    Ok((StatusCode::ACCEPTED, Json(created)).into_response())
}

pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let w = state.client.workflow(id).await?;
    json_off_runtime(w).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub limit: Option<usize>,
    pub cursor: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let limit = q.limit.unwrap_or(20);
    if limit == 0 || limit > 200 {
        return Err(ApiError::bad_request("limit must be between 1 and 200"));
    }
    let page = state
        .client
        .workflows(q.cursor.as_deref().filter(|s| !s.is_empty()), limit)
        .await?;
    json_off_runtime(page).await
}

pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    Ok(Json(state.client.cancel_workflow(id).await?).into_response())
}
