//! Health, queues, workers, the OpenAPI document, and the dashboard's static files (embedded in
//! the binary: no front-end build step, nothing to install next to it).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::{ApiError, AppState};
use crate::views;

/// 200 when the store answers a read and no background loop of this process has been failing for
/// longer than the threshold (`--unhealthy-after`); 503 otherwise, naming what fails. The body
/// lists every loop either way, without error texts (the route is open; the log has them).
pub async fn healthz(State(state): State<AppState>) -> Response {
    // A cheap read that touches the store: a server whose store is gone is not healthy.
    let store = match state.backends.store.get(homing::job::new_job_id()).await {
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, "health check: the store cannot be read");
            Some(format!(
                "the {} store cannot be read",
                state.backends.store.kind()
            ))
        }
    };
    let loops = homing::health::global().report(state.unhealthy_after);
    let failing: Vec<&str> = loops.iter().filter(|l| l.failing).map(|l| l.name).collect();
    let store_ok = store.is_none();
    let mut problems: Vec<String> = store.into_iter().collect();
    if !failing.is_empty() {
        problems.push(format!(
            "failing for over {}: {}",
            humantime::format_duration(state.unhealthy_after),
            failing.join(", ")
        ));
    }
    if problems.is_empty() {
        return Json(serde_json::json!({"status": "ok", "loops": loops})).into_response();
    }
    let body = serde_json::json!({
        "status": "unavailable",
        "error": {"code": "unavailable", "message": problems.join("; ")},
        "store_ok": store_ok,
        "failing": failing,
        "loops": loops,
    });
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// Queues per page of `GET /v1/queues` unless `limit` says otherwise: the default bound on queue
/// names, so a default deployment gets every queue in one page.
const QUEUES_PAGE: usize = 1000;
/// The largest page `limit` may ask for.
const QUEUES_PAGE_MAX: usize = 10_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueuesQuery {
    pub limit: Option<usize>,
    pub after: Option<String>,
}

pub async fn queues(
    State(state): State<AppState>,
    q: Result<Query<QueuesQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let limit = q.limit.unwrap_or(QUEUES_PAGE);
    if limit == 0 || limit > QUEUES_PAGE_MAX {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {QUEUES_PAGE_MAX}"
        )));
    }
    let after = q.after.as_deref().filter(|s| !s.is_empty());
    let page = views::queues(&state.backends, after, limit).await?;
    Ok(Json(page).into_response())
}

pub async fn workers(State(state): State<AppState>) -> Result<Response, ApiError> {
    let since = homing::time::now() - 3600 * 1_000_000;
    let ws = views::workers(&state.backends, since).await?;
    super::json_off_runtime(std::collections::BTreeMap::from([("workers", ws)])).await
}

/// One worker, live or departed, until retention deletes its record: a lost worker's page
/// (with the jobs reclaimed from it) outlives the hour the list covers.
pub async fn worker(
    State(state): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    match views::worker(&state.backends, &id).await? {
        Some(w) => Ok(Json(w).into_response()),
        None => Err(ApiError::not_found(
            "no such worker (or retention deleted it)",
        )),
    }
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

/// Search and the worker view (docs/operate.md), loaded after app.js.
pub async fn views_script() -> Response {
    (
        [(CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../dashboard/views.js"),
    )
        .into_response()
}

/// The worker view (docs/workers.md), loaded after views.js.
pub async fn workers_script() -> Response {
    (
        [(CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../dashboard/workers.js"),
    )
        .into_response()
}

/// The job view's full timeline (docs/timeline.md), after views.js.
pub async fn timeline_script() -> Response {
    (
        [(CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../dashboard/timeline.js"),
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
