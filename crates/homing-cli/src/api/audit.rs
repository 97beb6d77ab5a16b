//! The audit log over HTTP (docs/access.md): recording every operator write as it is answered,
//! `GET /v1/audit` to page through it, and `GET /v1/whoami`, which tells the dashboard the
//! caller's role so it can hide what the caller may not do.
//!
//! Recorded: every request that is not a `GET`/`HEAD`, refused or not, except the traffic of
//! producers and workers — enqueueing (`POST /v1/jobs`, the pipelines' uploads) and the remote
//! worker protocol (`/v1/remote/…`) — which would bury the operators' actions under thousands of
//! routine calls and which the jobs themselves already record.

use axum::extract::rejection::QueryRejection;
use axum::extract::{MatchedPath, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;

use super::{ApiError, AppState, Caller};
use homing::store::audit::NewAudit;

/// Put on a response by a bulk action: how many jobs it changed, for its audit entry.
#[derive(Debug, Clone, Copy)]
pub struct Count(pub u64);

/// Whether a write to `path` is an operator's action (see the module's documentation).
fn audited(method: &axum::http::Method, path: &str) -> bool {
    let producer = (method == axum::http::Method::POST
        && matches!(path, "/v1/jobs" | "/v1/documents" | "/v1/exhibitions"))
        || path == "/v1/remote"
        || path.starts_with("/v1/remote/");
    !producer
}

fn entry(caller: &Caller, req: &Request, status: u16, count: Option<u64>) -> NewAudit {
    let path = req.uri().path();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str())
        .unwrap_or(path);
    NewAudit {
        actor: caller.name.to_string(),
        role: caller.role.as_str().into(),
        action: format!("{} {route}", req.method()),
        target: req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or(path)
            .to_string(),
        status,
        count,
    }
}

async fn record(state: &AppState, e: NewAudit) {
    // The action is done and answered either way: a store that cannot take the entry is logged
    // (without the target's query, which is the caller's text) rather than failing the action.
    let action = e.action.clone();
    if let Err(err) = state
        .backends
        .store
        .record_audit(e, homing::time::now())
        .await
    {
        tracing::warn!(error = %err, %action, "could not record an audit entry");
    }
}

/// Runs an authorised write and records it with the answer's status.
pub(super) async fn recorded(
    state: &AppState,
    caller: Caller,
    req: Request,
    next: Next,
) -> Response {
    if !audited(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    // The entry is made before the request is handed on (the status and count are filled in
    // from the answer).
    let mut e = entry(&caller, &req, 0, None);
    let resp = next.run(req).await;
    e.status = resp.status().as_u16();
    e.count = resp.extensions().get::<Count>().map(|c| c.0);
    record(state, e).await;
    resp
}

/// Records a write refused for the caller's role, and answers the refusal.
pub(super) async fn refused(state: &AppState, entry: Option<NewAudit>, resp: Response) -> Response {
    if let Some(e) = entry {
        record(state, e).await;
    }
    resp
}

/// The entry of a write refused with `status`, when such a write is audited.
pub(super) fn refusal(caller: &Caller, req: &Request, status: u16) -> Option<NewAudit> {
    audited(req.method(), req.uri().path()).then(|| entry(caller, req, status, None))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    pub limit: Option<usize>,
    pub cursor: Option<String>,
}

/// `GET /v1/audit`: the audit log, newest first.
pub async fn list(
    State(state): State<AppState>,
    q: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let limit = q.limit.unwrap_or(50);
    if limit == 0 || limit > 1000 {
        return Err(ApiError::bad_request("limit must be between 1 and 1000"));
    }
    let page = state
        .backends
        .store
        .audit(q.cursor.as_deref().filter(|s| !s.is_empty()), limit)
        .await?;
    Ok(Json(page).into_response())
}

/// `GET /v1/whoami`: the caller's token name and role (`anonymous`, `admin` without tokens).
pub async fn whoami(State(state): State<AppState>, caller: Option<Extension<Caller>>) -> Response {
    let (name, role) = match caller {
        Some(Extension(c)) => (c.name.to_string(), c.role.as_str()),
        None => ("anonymous".to_string(), "admin"),
    };
    Json(serde_json::json!({
        "name": name,
        "role": role,
        "auth": !state.tokens.is_empty(),
    }))
    .into_response()
}
