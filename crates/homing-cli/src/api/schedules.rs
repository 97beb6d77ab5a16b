//! `/v1/schedules`: periodic schedules (docs/schedules.md). A schedule is set whole with `PUT`
//! (create or replace, idempotent), read, listed, paused, resumed and deleted. Bodies are checked
//! by `homing::client::check_schedule`, the same rules as the CLI's: a bad name, cron expression,
//! time zone, interval or policy is a 400 with the reason; a task no worker registered is a 422,
//! as for an enqueue, unless the schedule had that task already or the body allows it.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use std::time::Duration;

use super::{json_off_runtime, ApiError, AppState};
use homing::job::opt_duration;
use homing::schedule::{Missed, ScheduleDef, ScheduleView, Spec};
use homing::time::now;
use homing::{FollowUp, JobOptions, RetryPolicy};

/// The body of `PUT /v1/schedules/{name}`: exactly one of `cron` and `every`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutSchedule {
    pub task: String,
    #[serde(default)]
    pub args: serde_json::Value,
    pub queue: Option<String>,
    pub cron: Option<String>,
    pub timezone: Option<String>,
    pub every: Option<String>,
    pub missed: Option<String>,
    pub max_retries: Option<u32>,
    pub retry_policy: Option<RetryPolicy>,
    pub max_crashes: Option<u32>,
    #[serde(default, with = "opt_duration")]
    pub time_limit: Option<Duration>,
    pub on_success: Option<FollowUp>,
    pub on_failure: Option<FollowUp>,
    pub callback_url: Option<String>,
    /// Set it even if no worker has registered its task (as an enqueue's field). The config
    /// file's schedules are never checked so: they are set at start, before workers register.
    #[serde(default)]
    pub allow_unknown_task: bool,
}

impl PutSchedule {
    /// The definition, or the reason it is not one. Shared with the config file's schedules.
    pub fn into_def(self, name: String) -> Result<ScheduleDef, String> {
        let spec = match (self.cron, self.every) {
            (Some(expr), None) => Spec::Cron {
                expr,
                timezone: self.timezone.unwrap_or_else(|| "UTC".into()),
            },
            (None, Some(every)) => {
                if self.timezone.is_some() {
                    return Err("timezone applies to cron schedules only".into());
                }
                let interval = homing::time::parse_duration_in(
                    &every,
                    homing::schedule::MIN_INTERVAL,
                    homing::schedule::MAX_INTERVAL,
                )
                .map_err(|e| format!("every: {e}"))?;
                Spec::Every { interval }
            }
            _ => return Err("give exactly one of \"cron\" and \"every\"".into()),
        };
        let missed = match self.missed {
            Some(m) => m.parse::<Missed>()?,
            None => Missed::default(),
        };
        Ok(ScheduleDef {
            name,
            task: self.task,
            args: if self.args.is_null() {
                serde_json::json!({})
            } else {
                self.args
            },
            queue: self.queue.unwrap_or_else(|| "default".into()),
            options: JobOptions {
                max_retries: self.max_retries,
                retry_policy: self.retry_policy,
                max_crashes: self.max_crashes,
                time_limit: self.time_limit,
                on_success: self.on_success,
                on_failure: self.on_failure,
                callback_url: self.callback_url,
                ..JobOptions::default()
            },
            spec,
            missed,
        })
    }
}

fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("no schedule named '{name}'"))
}

fn checked_name(name: &str) -> Result<(), ApiError> {
    homing::validate::name("schedule", name).map_err(ApiError::bad_request)
}

pub async fn put(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Result<super::ExactJson<PutSchedule>, ApiError>,
) -> Result<Response, ApiError> {
    checked_name(&name)?;
    let super::ExactJson(body) = body?;
    let allow_unknown_task = body.allow_unknown_task;
    let def = body.into_def(name).map_err(ApiError::bad_request)?;
    // Every rule first, so a refused name or cron is reported as such rather than as an
    // unknown task.
    state.client.check_schedule_def(&def).await?;
    if !allow_unknown_task && !homing::client::keeps_task(&*state.backends.store, &def).await? {
        super::jobs::check_known_task(&state, &def.task).await?;
    }
    let s = state.backends.store.put_schedule(&def, now()).await?;
    Ok(Json(ScheduleView::from(s)).into_response())
}

/// A page's count when the query names none: every schedule of most deployments in one page.
const PAGE: usize = 1000;
/// The largest page `limit` may ask for.
const PAGE_MAX: usize = 10_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub limit: Option<usize>,
    pub after: Option<String>,
}

/// `GET /v1/schedules?limit=&after=`: by name, a page at a time (the store ends a page before
/// 4 MiB of definitions: a schedule may carry 1 MiB of args, and listing them all at once took
/// the server's memory with their count); `next` is the `after` of the next page, `null` on the
/// last.
pub async fn list(
    State(state): State<AppState>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let limit = q.limit.unwrap_or(PAGE);
    if limit == 0 || limit > PAGE_MAX {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {PAGE_MAX}"
        )));
    }
    let after = q.after.as_deref().filter(|s| !s.is_empty());
    let page = state.backends.store.schedules_page(after, limit).await?;
    // A cron's next tick takes a search: done off the runtime with the serialising.
    let views = tokio::task::spawn_blocking(move || {
        let schedules: Vec<ScheduleView> =
            page.schedules.into_iter().map(ScheduleView::from).collect();
        serde_json::json!({ "schedules": schedules, "next": page.next })
    })
    .await
    .map_err(ApiError::internal)?;
    json_off_runtime(views).await
}

pub async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    checked_name(&name)?;
    let s = state.backends.store.schedule(&name).await?;
    let s = s.ok_or_else(|| not_found(&name))?;
    Ok(Json(ScheduleView::from(s)).into_response())
}

pub async fn delete(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    checked_name(&name)?;
    if !state.backends.store.delete_schedule(&name).await? {
        return Err(not_found(&name));
    }
    Ok(axum::http::StatusCode::NO_CONTENT.into_response())
}

async fn set_paused(state: AppState, name: String, paused: bool) -> Result<Response, ApiError> {
    checked_name(&name)?;
    let s = state
        .backends
        .store
        .pause_schedule(&name, paused, now())
        .await?;
    let s = s.ok_or_else(|| not_found(&name))?;
    Ok(Json(ScheduleView::from(s)).into_response())
}

pub async fn pause(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    set_paused(state, name, true).await
}

pub async fn resume(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    set_paused(state, name, false).await
}
