//! Result egress: puts the outcome of a job that came from Celery where the Python caller's
//! `AsyncResult` looks for it, Celery's Redis result backend (`SETEX celery-task-meta-<id>` and a
//! `PUBLISH` of the same value on the channel of that name, which wakes `AsyncResult.get()`).
//!
//! Terminal results travel as a homing follow-up job ([`RESULT_TASK`]) that the ingress attaches
//! to every Celery job whose caller wants a result: the store enqueues it in the same
//! transaction as the terminal state, so a crash can delay a result but never lose it, and a
//! backend outage is retried like any job. Writes are idempotent (the same key, the same value).
//! `RETRY` is written by a thin wrapper around each handler when it asks for a retry: it is a
//! progress report, so it is sent once, best effort.

use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

use super::conn::Conn;
use super::{keys, wire};
use crate::job::{FollowUp, Job, JobState};
use crate::task::{Context, Registry, TaskDefaults, TaskError};
use crate::time::now;

/// The follow-up task that writes a Celery job's terminal result to the result backend.
pub const RESULT_TASK: &str = "celery.result";

/// How long results live, as Celery's `result_expires` default (one day).
pub const DEFAULT_RESULT_EXPIRES: Duration = Duration::from_secs(86_400);

/// What a follow-up needs to know about the Celery message its parent job came from.
pub fn follow_up(queue: &str, m: &wire::Message) -> FollowUp {
    FollowUp {
        task: RESULT_TASK.into(),
        queue: Some(queue.to_string()),
        args: json!({ "celery": {
            "id": m.id,
            "task": m.task,
            "expires": m.expires,
            "parent_id": m.parent_id,
        }}),
    }
}

/// The Celery metadata a job carries in its follow-up, if it came from Celery with a result wanted.
pub fn celery_meta(job: &Job) -> Option<&Value> {
    job.on_success
        .as_ref()
        .filter(|f| f.task == RESULT_TASK)
        .and_then(|f| f.args.get("celery"))
}

/// Reason prefixes the ingress and the handler wrapper use, mapped to Celery states here.
pub const EXPIRED: &str = "celery: task expired";

/// An exception in the shape Celery's JSON result serializer stores it.
fn exception(exc_type: &str, module: &str, message: &str) -> Value {
    json!({ "exc_type": exc_type, "exc_message": [message], "exc_module": module })
}

/// The meta document for a terminal homing state.
pub fn terminal_meta(
    task_id: &str,
    task: &str,
    state: JobState,
    result: &Value,
    error: &str,
) -> Value {
    let (status, result, traceback) = match state {
        JobState::Succeeded => ("SUCCESS", result.clone(), Value::Null),
        _ if error.starts_with("unknown task") => (
            "FAILURE",
            exception("NotRegistered", "celery.exceptions", task),
            json!(format!("homing: {error}")),
        ),
        _ if error.starts_with(EXPIRED) => (
            "REVOKED",
            exception("TaskRevokedError", "celery.exceptions", "expired"),
            Value::Null,
        ),
        JobState::Cancelled => (
            "REVOKED",
            exception("TaskRevokedError", "celery.exceptions", "revoked"),
            Value::Null,
        ),
        _ => (
            "FAILURE",
            exception("RuntimeError", "builtins", error),
            json!(format!("homing: job {state}: {error}")),
        ),
    };
    json!({
        "status": status,
        "result": result,
        "traceback": traceback,
        "children": [],
        "date_done": wire::format_iso8601(now()),
        "task_id": task_id,
    })
}

/// Writes a result the way Celery's Redis backend does: `SETEX` then `PUBLISH`, in one pipeline.
pub async fn store_result(
    conn: &Conn,
    task_id: &str,
    meta: &Value,
    expires: Duration,
) -> crate::Result<()> {
    let key = keys::result(task_id);
    let value = meta.to_string();
    let mut c = conn.get().await?;
    ::redis::pipe()
        .cmd("SETEX")
        .arg(&key)
        .arg(expires.as_secs().max(1))
        .arg(&value)
        .ignore()
        .cmd("PUBLISH")
        .arg(&key)
        .arg(&value)
        .ignore()
        .query_async::<()>(&mut c)
        .await
        .map_err(crate::broker::redis::err)
}

/// Registers [`RESULT_TASK`] and wraps every task of `registry` so a retry of a Celery job is
/// reported as `RETRY`. Without a backend the result task only acknowledges.
pub fn wrap(registry: &Registry, backend: Option<Conn>, expires: Duration) -> Registry {
    let mut out = Registry::new();
    for name in registry.names() {
        let Some(handler) = registry.get(&name).cloned() else {
            continue;
        };
        let defaults = handler.defaults();
        let backend = backend.clone();
        let d2 = defaults.clone();
        out.register_fn(&name, defaults, move |ctx: Context, args: Value| {
            let handler = handler.clone();
            let backend = backend.clone();
            let defaults = d2.clone();
            async move {
                let job = Arc::new(ctx.job().clone());
                let expired = celery_meta(&job)
                    .and_then(|m| m["expires"].as_i64())
                    .is_some_and(|at| at < now());
                if expired {
                    // What a Celery worker does with a message past its `expires`: not run it.
                    return Err(TaskError::Fatal(EXPIRED.into()));
                }
                let res = handler.call(ctx, args).await;
                if let (Err(e @ (TaskError::Retry(_) | TaskError::RetryIn(..))), Some(b)) =
                    (&res, &backend)
                {
                    report_retry(b, &job, &defaults, e, expires).await;
                }
                res
            }
        });
    }
    let defaults = TaskDefaults {
        max_retries: 20,
        ..TaskDefaults::default()
    };
    out.register_fn(RESULT_TASK, defaults, move |_ctx, args: Value| {
        let backend = backend.clone();
        async move {
            let celery = &args["celery"];
            let Some(b) = backend.filter(|_| celery["store"] != false) else {
                return Ok(json!({"stored": false}));
            };
            let parent = &args["parent"];
            let Some(id) = celery["id"].as_str() else {
                return Err(TaskError::fatal("follow-up without a Celery task id"));
            };
            let state: JobState = serde_json::from_value(parent["state"].clone())
                .map_err(|e| TaskError::fatal(format!("bad parent state: {e}")))?;
            let meta = terminal_meta(
                id,
                celery["task"].as_str().unwrap_or(""),
                state,
                &parent["result"],
                parent["error"].as_str().unwrap_or(""),
            );
            store_result(&b, id, &meta, expires)
                .await
                .map_err(|e| TaskError::retry(format!("cannot store the Celery result: {e}")))?;
            Ok(json!({"stored": meta["status"]}))
        }
    });
    out
}

async fn report_retry(
    backend: &Conn,
    job: &Job,
    defaults: &TaskDefaults,
    err: &TaskError,
    expires: Duration,
) {
    let Some(meta) = celery_meta(job) else { return };
    let Some(id) = meta["id"].as_str() else {
        return;
    };
    if job.attempts >= job.max_retries.unwrap_or(defaults.max_retries) {
        return; // no retry left: the job fails, and the follow-up writes FAILURE
    }
    let doc = json!({
        "status": "RETRY",
        "result": exception("Retry", "celery.exceptions", &err.to_string()),
        "traceback": format!("homing: attempt {} failed: {err}", job.attempts + 1),
        "children": [],
        "date_done": null,
        "task_id": id,
    });
    if let Err(e) = store_result(backend, id, &doc, expires).await {
        tracing::warn!(job = %job.id, error = %e, "cannot report RETRY to the Celery result backend");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_shapes_match_celery() {
        let ok = terminal_meta("t1", "a.b", JobState::Succeeded, &json!(3), "");
        assert_eq!(ok["status"], "SUCCESS");
        assert_eq!(ok["result"], 3);
        assert_eq!(ok["task_id"], "t1");
        assert!(ok["date_done"].as_str().unwrap().ends_with("+00:00"));
        let nr = terminal_meta(
            "t2",
            "no.such",
            JobState::Dead,
            &Value::Null,
            "unknown task 'no.such': …",
        );
        assert_eq!(nr["status"], "FAILURE");
        assert_eq!(nr["result"]["exc_type"], "NotRegistered");
        assert_eq!(nr["result"]["exc_module"], "celery.exceptions");
        assert_eq!(nr["result"]["exc_message"], json!(["no.such"]));
        let f = terminal_meta("t3", "a", JobState::Failed, &Value::Null, "boom");
        assert_eq!(f["result"]["exc_type"], "RuntimeError");
        assert_eq!(f["result"]["exc_message"], json!(["boom"]));
        let x = terminal_meta("t4", "a", JobState::Failed, &Value::Null, EXPIRED);
        assert_eq!(x["status"], "REVOKED");
    }
}
