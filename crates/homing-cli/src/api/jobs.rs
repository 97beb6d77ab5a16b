//! `/v1/jobs`: enqueue, read, list, retry and cancel (the event stream is in `events.rs`).

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use std::time::Duration;

use super::{json_off_runtime, ApiError, AppState};
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
    /// Higher runs first within the queue (-1000 to 1000, default 0).
    pub priority: Option<i32>,
    /// Returns an equal job (same task, queue and args) instead of a new one while it is
    /// unfinished or finished less than this long ago.
    #[serde(default, with = "opt_duration")]
    pub unique_for: Option<Duration>,
    /// Accept a task that no worker has registered yet.
    #[serde(default)]
    pub allow_unknown_task: bool,
}

impl CreateJob {
    /// The library's request, and whether an unknown task is allowed.
    pub fn into_request(self) -> (EnqueueRequest, bool) {
        let req = EnqueueRequest {
            task: self.task,
            args: self.args,
            options: JobOptions {
                queue: self.queue,
                idempotency_key: self.idempotency_key,
                countdown: self.countdown,
                max_retries: self.max_retries,
                retry_policy: self.retry_policy,
                max_crashes: self.max_crashes,
                time_limit: self.time_limit,
                on_success: self.on_success,
                on_failure: self.on_failure,
                callback_url: self.callback_url,
                priority: self.priority,
                unique_for: self.unique_for,
                traceparent: None,
            },
        };
        (req, self.allow_unknown_task)
    }
}

/// The caller's W3C trace context (docs/traces.md): the job's enqueue and runs join its trace.
/// A malformed one is refused rather than dropped, so a broken propagator is noticed.
fn traceparent(headers: &axum::http::HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all("traceparent").iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::bad_request(
            "only one traceparent header is allowed",
        ));
    }
    let tp = v
        .to_str()
        .map_err(|_| ApiError::bad_request("traceparent must be ASCII"))?
        .trim();
    homing::tracecontext::validate(tp).map_err(ApiError::bad_request)?;
    Ok(Some(tp.to_string()))
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
    let all = homing::validate::enqueueable_tasks(all);
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
    headers: axum::http::HeaderMap,
    body: Result<super::ExactJson<CreateJob>, ApiError>,
) -> Result<Response, ApiError> {
    let super::ExactJson(body) = body?;
    let (mut req, allow_unknown_task) = body.into_request();
    req.options.traceparent = traceparent(&headers)?;
    // Every rule first (names, internal tasks and queues, depth, sizes, ranges), so a refused
    // name is reported as such rather than as an unknown task.
    homing::client::validate_request(&req)?;
    if !allow_unknown_task {
        check_known_task(&state, &req.task).await?;
    }
    let inserted = state.client.enqueue(req).await?;
    let job = state.client.get(inserted.id).await?;
    let status = if inserted.existed {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(job)).into_response())
}

/// The body of `POST /v1/jobs/batch`: `jobs` holds objects of [`CreateJob`]'s shape. The
/// items are kept as their text and read one by one after the count is checked, so an error
/// names its index and each is read exactly as `POST /v1/jobs` reads its body (a field given
/// twice is refused, not overwritten).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    pub jobs: Vec<Box<serde_json::value::RawValue>>,
}

/// One job of a batch's answer, in the order of the request.
#[derive(Debug, serde::Serialize)]
pub struct BatchItem {
    pub id: JobId,
    pub queue: String,
    pub state: JobState,
    /// The job existed before this request (its idempotency key or unique window matched, or
    /// an earlier item of the batch had the same key) and is returned instead of a new one.
    pub existed: bool,
}

/// Reads the items of a batch: each must be a [`CreateJob`], pass every rule of one enqueue and
/// name a known task (unless it allows an unknown one). The first that does not fails the
/// batch with its index.
pub async fn batch_requests(
    state: &AppState,
    items: Vec<Box<serde_json::value::RawValue>>,
) -> Result<Vec<EnqueueRequest>, ApiError> {
    homing::client::check_batch_len(items.len())?;
    let mut known: Option<Vec<String>> = None;
    let mut reqs = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let body: CreateJob = serde_json::from_str(item.get()).map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_json",
                format!("job {i}: {e}"),
            )
        })?;
        homing::validate::exact_integers(item.get().as_bytes()).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("job {i}: {e}"),
            )
        })?;
        let (req, allow_unknown_task) = body.into_request();
        homing::client::validate_request(&req).map_err(|e| homing::client::at_index(i, e))?;
        if !allow_unknown_task && state.builtin.get(&req.task).is_none() {
            // Read once per batch: the set of registered tasks only grows.
            if known.is_none() {
                known = Some(state.backends.store.known_tasks().await?);
            }
            if !known.iter().flatten().any(|t| *t == req.task) {
                let e = check_known_task(state, &req.task)
                    .await
                    .err()
                    .unwrap_or_else(|| ApiError::bad_request("unknown task"));
                return Err(ApiError::new(
                    e.status,
                    e.code,
                    format!("job {i}: {}", e.message),
                ));
            }
        }
        reqs.push(req);
    }
    Ok(reqs)
}

/// `POST /v1/jobs/batch` (docs/batch.md): up to [`homing::client::MAX_BATCH`] jobs, all or
/// nothing, in one store transaction. Answers 202 with each job's id in request order (200 when
/// every one already existed).
pub async fn create_batch(
    State(state): State<AppState>,
    // Each item is checked for integers beyond 64 bits apart (batch_requests), so that the
    // refusal names its index as every other item's does.
    body: Result<Json<CreateBatch>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    let reqs = batch_requests(&state, body.jobs).await?;
    let inserted = state.client.enqueue_batch(reqs).await?;
    let created = inserted.iter().filter(|i| !i.existed).count();
    let status = if created == 0 {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let jobs: Vec<BatchItem> = inserted
        .into_iter()
        .map(|i| BatchItem {
            id: i.id,
            queue: i.queue,
            state: i.state,
            existed: i.existed,
        })
        .collect();
    let mut resp = (
        status,
        Json(serde_json::json!({ "jobs": jobs, "created": created })),
    )
        .into_response();
    resp.extensions_mut()
        .insert(super::audit::Count(created as u64));
    Ok(resp)
}

pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let job = state.client.get(id).await?;
    json_off_runtime(job).await
}

/// `GET /v1/jobs/{id}/history`: the job's timeline (docs/timeline.md), oldest first, with the
/// job as read right after it. A read route: both roles may call it.
pub async fn history(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let (job, history) = state.client.history(id).await?;
    json_off_runtime(HistoryAnswer {
        entries: history.entries,
        job,
        truncated: history.truncated,
    })
    .await
}

/// The answer of [`history`], serialized as it stands (not copied into a `serde_json::Value`
/// first); its keys in the order they have always had.
#[derive(serde::Serialize)]
struct HistoryAnswer {
    entries: Vec<homing::history::Entry>,
    job: homing::Job,
    truncated: bool,
}

/// `GET /v1/jobs`: a page of jobs, newest first, narrowed by any of the search fields
/// (docs/operate.md); `cursor` is the previous page's `next_cursor`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub state: Option<String>,
    pub queue: Option<String>,
    pub task: Option<String>,
    /// A job id or its first hex digits.
    pub id: Option<String>,
    pub created_from: Option<String>,
    pub created_to: Option<String>,
    pub args_path: Option<String>,
    pub args_value: Option<String>,
    pub args_contains: Option<String>,
    pub limit: Option<usize>,
    pub cursor: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let limit = q.limit.unwrap_or(50);
    if limit == 0 || limit > 1000 {
        return Err(ApiError::bad_request("limit must be between 1 and 1000"));
    }
    let search = homing::search::JobSearch::parse(&homing::search::RawSearch {
        id: q.id.as_deref(),
        state: q.state.as_deref(),
        queue: q.queue.as_deref(),
        task: q.task.as_deref(),
        created_from: q.created_from.as_deref(),
        created_to: q.created_to.as_deref(),
        args_path: q.args_path.as_deref(),
        args_value: q.args_value.as_deref(),
        args_contains: q.args_contains.as_deref(),
    })
    .map_err(ApiError::bad_request)?;
    let cursor = q.cursor.as_deref().filter(|s| !s.is_empty());
    if let Some(c) = cursor {
        parse_id(c).map_err(|_| {
            ApiError::bad_request("cursor must be the next_cursor of a previous page")
        })?;
    }
    let page = state.client.search(&search, cursor, limit).await?;
    json_off_runtime(page).await
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

/// The filter of a bulk action or a count: `state`, `queue`, `task`, all optional here (a bulk
/// action refuses a missing state itself, with the states it takes).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterQuery {
    pub state: Option<String>,
    pub queue: Option<String>,
    pub task: Option<String>,
}

impl FilterQuery {
    fn filter(self) -> Result<JobFilter, ApiError> {
        let state = self
            .state
            .as_deref()
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<JobState>())
            .transpose()
            .map_err(ApiError::bad_request)?;
        Ok(JobFilter {
            state,
            queue: self.queue.filter(|s| !s.is_empty()),
            task: self.task.filter(|s| !s.is_empty()),
        })
    }
}

/// `GET /v1/jobs/count`: how many jobs match, the number a bulk action shows before it runs.
pub async fn count(
    State(state): State<AppState>,
    q: Result<Query<FilterQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let n = state.client.count(&q.filter()?).await?;
    Ok(Json(serde_json::json!({ "count": n })).into_response())
}

/// The query of a bulk action: its filter and, to go on with a walk, the `cursor` a previous
/// call answered.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkQuery {
    pub state: Option<String>,
    pub queue: Option<String>,
    pub task: Option<String>,
    pub cursor: Option<String>,
}

/// One call of a bulk action (docs/bulk.md): it works for at most the server's bulk budget plus
/// one step, each step committed, then answers exactly what it did. `done: false` means more
/// may match: the caller calls again with `cursor` set to `next_cursor`. The answer is never a
/// timeout after work was done, and the audit entry of the call carries its own count.
async fn bulk(
    state: AppState,
    action: homing::bulk::Action,
    q: Result<Query<BulkQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let cursor = q.cursor.filter(|s| !s.is_empty());
    if let Some(c) = &cursor {
        parse_id(c).map_err(|_| {
            ApiError::bad_request("cursor must be the next_cursor of a previous call")
        })?;
    }
    let filter = FilterQuery {
        state: q.state,
        queue: q.queue,
        task: q.task,
    }
    .filter()?;
    homing::bulk::check(action, &filter).map_err(ApiError::bad_request)?;
    let part = state
        .client
        .bulk_part(action, &filter, cursor.as_deref(), state.bulk_budget)
        .await?;
    let mut resp = Json(serde_json::json!({
        "action": action.as_str(),
        "count": part.done.count,
        "skipped": part.done.skipped,
        "done": part.next.is_none(),
        "next_cursor": part.next,
    }))
    .into_response();
    resp.extensions_mut()
        .insert(super::audit::Count(part.done.count));
    Ok(resp)
}

/// `POST /v1/jobs/retry?state=failed&task=…`: retries every matching job (docs/access.md).
pub async fn bulk_retry(
    State(state): State<AppState>,
    q: Result<Query<BulkQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    bulk(state, homing::bulk::Action::Retry, q).await
}

/// `POST /v1/jobs/cancel?state=queued&queue=…`: cancels every matching job.
pub async fn bulk_cancel(
    State(state): State<AppState>,
    q: Result<Query<BulkQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    bulk(state, homing::bulk::Action::Cancel, q).await
}

/// `POST /v1/jobs/delete?state=succeeded&…`: deletes every matching finished job.
pub async fn bulk_delete(
    State(state): State<AppState>,
    q: Result<Query<BulkQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    bulk(state, homing::bulk::Action::Delete, q).await
}

/// Property tests of the API's door: any body either is refused (while reading it, or by the
/// rules) or, once accepted, is made only of values that serialise and read back, including the
/// values homing derives from them.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            ".{0,20}".prop_map(Value::from),
            Just(json!("a\u{0}b")),
        ]
    }

    /// Small trees, or a chain nested up to past serde_json's reading limit.
    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            leaf().prop_recursive(4, 24, 5, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
                    prop::collection::btree_map(".{0,8}", inner, 0..5)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            }),
            (0usize..140, leaf()).prop_map(|(n, v)| homing::validate::nested(n, v)),
        ]
    }

    fn name() -> impl Strategy<Value = Value> {
        prop_oneof![
            prop::sample::select(vec![
                "builtin.noop",
                "tasks.add",
                "builtin.webhook",
                "celery.result",
                "homing.webhooks",
                "default",
                "no such task!!",
                "bad queue \u{0} é",
                "",
                "a/b",
            ])
            .prop_map(Value::from),
            "[A-Za-z0-9_.:-]{0,140}".prop_map(Value::from),
            leaf(),
        ]
    }

    fn number() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| Value::from(f.to_string())),
            prop::sample::select(vec![
                "1e30",
                "-1",
                "NaN",
                "inf",
                "5s",
                "500ms",
                "18446744073709551615s",
                "366d",
                "367d",
                "0",
                "",
                "1h 30m",
            ])
            .prop_map(Value::from),
            leaf(),
        ]
    }

    fn follow_up() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            (name(), proptest::option::of(name()), value())
                .prop_map(|(t, q, a)| json!({"task": t, "queue": q, "args": a})),
            leaf(),
        ]
    }

    fn body() -> impl Strategy<Value = Value> {
        (
            (name(), value(), proptest::option::of(name())),
            (
                proptest::option::of(".{0,600}"),
                number(),
                number(),
                number(),
                number(),
            ),
            (
                follow_up(),
                follow_up(),
                proptest::option::of(".{0,40}"),
                any::<bool>(),
            ),
        )
            .prop_map(
                |(
                    (task, args, queue),
                    (key, countdown, limit, crashes, retries),
                    (ok, ko, cb, allow),
                )| {
                    let mut b = json!({"task": task, "args": args, "allow_unknown_task": allow});
                    let mut set = |k: &str, v: Value| {
                        if !v.is_null() {
                            b[k] = v;
                        }
                    };
                    set("queue", queue.map_or(Value::Null, |q| q));
                    set("idempotency_key", key.map_or(Value::Null, Value::from));
                    set("countdown", countdown);
                    set("time_limit", limit);
                    set("max_crashes", crashes);
                    set("max_retries", retries.clone());
                    set("retry_policy", json!({"kind": "fixed", "delay": retries}));
                    set("on_success", ok);
                    set("on_failure", ko);
                    set(
                        "callback_url",
                        cb.map_or(Value::Null, |c| format!("http://{c}").into()),
                    );
                    b
                },
            )
    }

    fn read_back(what: &str, v: &impl serde::Serialize) {
        let text = serde_json::to_string(v).unwrap_or_else(|e| panic!("{what}: {e}"));
        let _: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("accepted {what} cannot be read back: {e}"));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        #[test]
        fn bodies_are_refused_or_read_back(b in body(), garble in proptest::option::of((any::<usize>(), any::<u8>()))) {
            let mut bytes = serde_json::to_vec(&b).unwrap();
            if let Some((at, byte)) = garble {
                let at = at % bytes.len();
                bytes[at] = byte;
            }
            let Ok(body) = serde_json::from_slice::<CreateJob>(&bytes) else {
                return Ok(()); // a 4xx from the JSON extractor
            };
            let (req, _) = body.into_request();
            if homing::client::validate_request(&req).is_err() {
                return Ok(()); // a 400 with the rule's message
            }
            read_back("args", &req.args);
            read_back("options", &req.options);
            // What the store derives: a follow-up's args hold the parent's result (here, a
            // result as deep as a handler may return), an event holds the job.
            let deepest = homing::validate::nested(homing::validate::MAX_DEPTH, json!(1));
            for f in [&req.options.on_success, &req.options.on_failure].into_iter().flatten() {
                let mut parent: homing::Job = serde_json::from_value(json!({
                    "id": homing::job::new_job_id(), "task": req.task, "queue": "q",
                    "state": "succeeded", "args": req.args, "result": deepest, "error": null,
                    "attempts": 0, "crashes": 0, "epoch": 1, "max_retries": null,
                    "max_crashes": 3, "idempotency_key": null, "progress": null, "worker": null,
                    "created_at": "2024-01-01T00:00:00Z", "scheduled_at": null,
                    "started_at": null, "finished_at": null
                })).unwrap();
                let child = f.job_for(&parent, homing::JobState::Succeeded, 0);
                read_back("follow-up args", &child.args);
                parent.args = child.args;
                parent.state = homing::JobState::Failed;
                let ev = homing::events::NewEvent::for_terminal(&parent).unwrap();
                read_back("event data", &json!({"event": ev.data}));
            }
        }
    }
}
