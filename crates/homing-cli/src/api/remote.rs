//! `/v1/remote/sessions/...`: the remote worker protocol (docs/remote-workers.md). Thin: each
//! handler parses its body and calls [`homing::remote::Gateway`], where every decision is made;
//! a session's errors map to 404 (`unknown_session`) and 410 (`session_expired`).

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{middleware, Json, Router};
use serde::Deserialize;
use std::time::Duration;

use super::{ApiError, AppState};
use homing::remote::{Gateway, Held, Registration, RemoteError, Report};
use homing::JobId;
use homing_pipelines::api::refuse_declared_over;

/// The body limit of `complete`: one result at its largest (8 MiB) with room for its batch.
pub const COMPLETE_BODY_LIMIT: usize = 16 * 1024 * 1024;

pub fn router() -> Router<AppState> {
    let own = Router::new()
        .route("/v1/remote/sessions", post(register))
        .route("/v1/remote/sessions/{session}", delete(end))
        .route("/v1/remote/sessions/{session}/heartbeat", post(heartbeat))
        .route("/v1/remote/sessions/{session}/reserve", post(reserve))
        .route("/v1/remote/sessions/{session}/progress", post(progress))
        .layer(middleware::from_fn_with_state(
            super::BODY_LIMIT,
            refuse_declared_over,
        ))
        .layer(DefaultBodyLimit::max(super::BODY_LIMIT));
    let complete = Router::new()
        .route("/v1/remote/sessions/{session}/complete", post(complete))
        .layer(middleware::from_fn_with_state(
            COMPLETE_BODY_LIMIT,
            refuse_declared_over,
        ))
        .layer(DefaultBodyLimit::max(COMPLETE_BODY_LIMIT));
    own.merge(complete)
}

fn gateway(state: &AppState) -> Gateway {
    Gateway::new(
        state.backends.broker.clone(),
        state.backends.store.clone(),
        state.remote_sightings.clone(),
    )
}

fn api_error(e: RemoteError) -> ApiError {
    match e {
        RemoteError::UnknownSession(m) => {
            ApiError::new(StatusCode::NOT_FOUND, "unknown_session", m)
        }
        RemoteError::SessionExpired(m) => ApiError::new(StatusCode::GONE, "session_expired", m),
        RemoteError::Other(e) => e.into(),
    }
}

async fn register(
    State(state): State<AppState>,
    body: Result<Json<Registration>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(reg) = body?;
    let r = gateway(&state).register(reg).await.map_err(api_error)?;
    Ok((StatusCode::CREATED, Json(r)).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeartbeatBody {
    #[serde(default)]
    held: Vec<Held>,
}

async fn heartbeat(
    State(state): State<AppState>,
    Path(session): Path<String>,
    body: Result<Json<HeartbeatBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(b) = body?;
    let beat = gateway(&state)
        .heartbeat(&session, &b.held)
        .await
        .map_err(api_error)?;
    Ok(Json(beat).into_response())
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveBody {
    #[serde(default = "one")]
    max: u32,
    #[serde(default)]
    wait_ms: u64,
}

async fn reserve(
    State(state): State<AppState>,
    Path(session): Path<String>,
    body: Result<Json<ReserveBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(b) = body?;
    // Its own task: a worker that closes the long poll (a graceful stop) must not cut the
    // reservation off between the broker and the store; finished, it sees the session ended
    // and hands its messages back (Gateway::reserve).
    let gw = gateway(&state);
    let wait = Duration::from_millis(b.wait_ms);
    let jobs = tokio::spawn(async move { gw.reserve(&session, b.max, wait).await })
        .await
        .map_err(ApiError::internal)?
        .map_err(api_error)?;
    Ok(Json(serde_json::json!({ "jobs": jobs })).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteBody {
    results: Vec<Report>,
    /// Reserve the next jobs in the same round trip, once the completions are committed: a
    /// worker whose slots these completions free asks for their successors here.
    #[serde(default)]
    reserve: Option<ReserveBody>,
}

async fn complete(
    State(state): State<AppState>,
    Path(session): Path<String>,
    body: Result<Json<CompleteBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(b) = body?;
    let gw = gateway(&state);
    let Some(next) = b.reserve else {
        let results = gw.complete(&session, &b.results).await.map_err(api_error)?;
        return Ok(Json(serde_json::json!({ "results": results })).into_response());
    };
    // Its bounds are checked before anything is committed, as a plain `reserve` call's.
    if next.max == 0 || next.max > homing::remote::MAX_RESERVE {
        return Err(ApiError::bad_request(format!(
            "reserve.max must be between 1 and {} (got {})",
            homing::remote::MAX_RESERVE,
            next.max
        )));
    }
    if Duration::from_millis(next.wait_ms) > homing::remote::MAX_WAIT {
        return Err(ApiError::bad_request(format!(
            "reserve.wait_ms must be at most {} (got {})",
            homing::remote::MAX_WAIT.as_millis(),
            next.wait_ms
        )));
    }
    // Its own task, as `reserve`: a closed connection must not cut a reservation in half.
    let (results, jobs) = tokio::spawn(async move {
        // The completions are committed whatever happens to the reservation: a refused one
        // (a session presumed dead) reserves nothing and says why.
        gw.complete_and_reserve(
            &session,
            &b.results,
            next.max,
            Duration::from_millis(next.wait_ms),
        )
        .await
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(api_error)?;
    let jobs = jobs.map_err(api_error);
    let mut out = serde_json::json!({ "results": results });
    match jobs {
        Ok(jobs) => out["jobs"] = serde_json::json!(jobs),
        Err(e) => {
            out["jobs"] = serde_json::json!([]);
            out["reserve_error"] = serde_json::json!({"code": e.code, "message": e.message});
        }
    }
    Ok(Json(out).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProgressBody {
    job_id: JobId,
    epoch: u64,
    progress: serde_json::Value,
}

async fn progress(
    State(state): State<AppState>,
    Path(session): Path<String>,
    body: Result<super::ExactJson<ProgressBody>, ApiError>,
) -> Result<Response, ApiError> {
    let super::ExactJson(b) = body?;
    let applied = gateway(&state)
        .progress(&session, b.job_id, b.epoch, b.progress)
        .await
        .map_err(api_error)?;
    let status = if applied { "applied" } else { "stale" };
    Ok(Json(serde_json::json!({ "status": status })).into_response())
}

async fn end(
    State(state): State<AppState>,
    Path(session): Path<String>,
) -> Result<Response, ApiError> {
    gateway(&state).end(&session).await.map_err(api_error)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
