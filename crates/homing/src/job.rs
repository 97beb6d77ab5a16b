//! The job record: what a job is, which states it passes through, and the options a producer
//! can set. Every backend stores exactly this, and every interface (CLI `--json`, HTTP API,
//! webhooks) shows exactly this serialisation.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::retry::RetryPolicy;
use crate::time::{self, Micros};

/// A job's identifier: a UUID v7, so ids sort by creation time.
pub type JobId = uuid::Uuid;

/// A fresh, time-ordered job id.
pub fn new_job_id() -> JobId {
    uuid::Uuid::now_v7()
}

/// Where a job is in its life (docs/design.md section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting for its due time (a countdown or a retry delay); the time is stored, not held in memory.
    Scheduled,
    /// A workflow step whose parents have not all finished; never published. It becomes `queued`
    /// (or `cancelled`) in the transaction that commits its last parent's end (docs/workflows.md).
    Waiting,
    /// Dispatched (or about to be) to the broker; waiting for a worker.
    Queued,
    /// Started by a worker under the job's current epoch.
    Running,
    Succeeded,
    /// A handler error with no retries left, or a fatal error.
    Failed,
    /// Undeliverable: its crash budget is spent, or its message or task cannot be decoded.
    Dead,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 8] = [
        JobState::Scheduled,
        JobState::Waiting,
        JobState::Queued,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Dead,
        JobState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Waiting => "waiting",
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
        }
    }

    /// A terminal job never changes again, except by an operator's retry of a failed/dead job.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Dead | JobState::Cancelled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown state '{s}'; expected one of scheduled, waiting, queued, running, succeeded, failed, dead, cancelled"
                )
            })
    }
}

/// A job to enqueue on a terminal transition of another job, in the same store transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FollowUp {
    pub task: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Input of the follow-up. The store adds `"parent": {id, task, state, result, error}` when
    /// the follow-up runs, so it knows what it follows.
    #[serde(default)]
    pub args: serde_json::Value,
}

impl FollowUp {
    /// The job this follow-up becomes when `parent` reaches `state`: its args with
    /// `"parent": {id, task, state, result, error}` added, so it knows what it follows. Every
    /// store inserts it in the transaction of the parent's transition.
    pub fn job_for(&self, parent: &Job, state: JobState, now: Micros) -> NewJob {
        let mut args = match &self.args {
            serde_json::Value::Object(m) => serde_json::Value::Object(m.clone()),
            serde_json::Value::Null => serde_json::json!({}),
            other => serde_json::json!({ "value": other }),
        };
        args["parent"] = serde_json::json!({
            "id": parent.id,
            "task": parent.task,
            "state": state,
            "result": parent.result,
            "error": parent.error,
        });
        NewJob {
            id: new_job_id(),
            task: self.task.clone(),
            queue: self.queue.clone().unwrap_or_else(|| "default".into()),
            args,
            // A follow-up continues its parent's trace (docs/traces.md).
            options: JobOptions {
                traceparent: parent.traceparent.clone(),
                ..JobOptions::default()
            },
            created_at: now,
            run_at: None,
        }
    }
}

/// Options a producer may set on one job; anything unset falls back to the task's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Run no earlier than this long after enqueue.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "opt_duration"
    )]
    pub countdown: Option<std::time::Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy: Option<RetryPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_crashes: Option<u32>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "opt_duration"
    )]
    pub time_limit: Option<std::time::Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_success: Option<FollowUp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<FollowUp>,
    /// An `http(s)` URL called (as a `builtin.webhook` delivery, with retries) when the job
    /// reaches a terminal state. A secret: shown only redacted, see
    /// [`crate::redact::redact_secret_url`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// Higher starts first within its queue; equal priorities start in enqueue order. Default 0,
    /// range [`crate::validate::MAX_PRIORITY`] either side of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Makes the job unique for this long (docs/limits.md): while a job of the same task, queue
    /// and args is scheduled, queued or running, or finished less than this long ago, enqueueing
    /// returns that job instead of a new one.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "opt_duration"
    )]
    pub unique_for: Option<std::time::Duration>,
    /// The W3C trace context (`00-<trace id>-<span id>-<flags>`) the job's runs continue
    /// (docs/traces.md). Set from a `traceparent` header or argument; with traces exported,
    /// the enqueue replaces it by its own span's context, keeping the trace id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// A job as handed to [`crate::store::Store::insert`]: fully resolved, with its id chosen.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    pub id: JobId,
    pub task: String,
    pub queue: String,
    pub args: serde_json::Value,
    pub options: JobOptions,
    pub created_at: Micros,
    /// `Some(t)` with `t` in the future makes the job `scheduled` instead of `queued`.
    pub run_at: Option<Micros>,
}

/// Default crash budget (docs/design.md section 1, guarantee 6).
pub const DEFAULT_MAX_CRASHES: u32 = 3;

/// The job record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub task: String,
    pub queue: String,
    pub state: JobState,
    pub args: serde_json::Value,
    pub result: Option<serde_json::Value>,
    pub error: Option<String>,
    pub attempts: u32,
    pub crashes: u32,
    pub epoch: u64,
    /// The job's own retry budget; `null` means the task's default.
    pub max_retries: Option<u32>,
    pub max_crashes: u32,
    pub idempotency_key: Option<String>,
    /// Higher starts first within its queue (see [`JobOptions::priority`]).
    #[serde(default)]
    pub priority: i32,
    pub progress: Option<serde_json::Value>,
    pub worker: Option<String>,
    #[serde(with = "time::as_rfc3339")]
    pub created_at: Micros,
    #[serde(with = "time::opt_rfc3339")]
    pub scheduled_at: Option<Micros>,
    #[serde(with = "time::opt_rfc3339")]
    pub started_at: Option<Micros>,
    #[serde(with = "time::opt_rfc3339")]
    pub finished_at: Option<Micros>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy: Option<RetryPolicy>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "opt_duration"
    )]
    pub time_limit: Option<std::time::Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_success: Option<FollowUp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<FollowUp>,
    #[serde(default)]
    pub cancel_requested: bool,
    /// Serialised redacted (`scheme://host/…`): every view of a job (API, CLI, webhooks, the
    /// dashboard) goes through serde, so the full URL never leaves the store.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "redacted_opt"
    )]
    pub callback_url: Option<String>,
    /// The periodic schedule that enqueued this job, and the tick it stands for (RFC 3339):
    /// both read from its idempotency key, which only the periodic loop can give this form
    /// (see [`crate::schedule::tick_key`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::opt_rfc3339"
    )]
    pub scheduled_tick: Option<Micros>,
    /// Stored columns that could not be decoded (`"args cannot be read: …"`), each shown as
    /// null/absent above; reads still show the job, so one bad row never fails a page. A job
    /// whose args, retry policy or follow-ups are among them is made `dead` instead of run (see
    /// [`crate::transition::start`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
    /// The workflow this job is a step of: its id, the step's name, its parents' job ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<crate::workflow::StepLink>,
    /// A workflow step's parents by step name (id, task, state, result, error), as they were
    /// when the step became runnable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parents: Option<std::collections::BTreeMap<String, crate::workflow::ParentRun>>,
    /// The W3C trace context stored with the job at enqueue (docs/traces.md): every run of
    /// the job, in whichever process and after any crash, joins this trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// Checks a callback or webhook URL: `http` or `https`, a host, at most 2048 bytes.
pub fn validate_callback_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    let ok = url.len() <= 2048
        && !url.chars().any(|c| c.is_control() || c.is_whitespace())
        && rest.is_some_and(|r| {
            let end = r.find(['/', '?', '#']).unwrap_or(r.len());
            let host = r[..end].rsplit('@').next().unwrap_or("");
            !host.is_empty() && !host.starts_with(':')
        });
    if ok {
        Ok(())
    } else {
        Err(
            "callback_url must be an http:// or https:// URL with a host, at most 2048 bytes"
                .into(),
        )
    }
}

fn redacted_opt<S: serde::Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(u) => s.serialize_str(&crate::redact::redact_secret_url(u)),
        None => s.serialize_none(),
    }
}

/// Durations in job options travel as human strings (`"30s"`) or as milliseconds.
pub mod opt_duration {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Millis(u64),
            Text(String),
        }
        match Option::<Repr>::deserialize(d)? {
            None => Ok(None),
            Some(Repr::Millis(ms)) => Ok(Some(Duration::from_millis(ms))),
            Some(Repr::Text(s)) => crate::time::parse_duration(&s)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse_and_print() {
        for st in JobState::ALL {
            assert_eq!(st.as_str().parse::<JobState>().unwrap(), st);
        }
        assert!("pending".parse::<JobState>().is_err());
        assert!(JobState::Dead.is_terminal());
        assert!(!JobState::Running.is_terminal());
    }

    #[test]
    fn options_accept_human_durations() {
        let o: JobOptions =
            serde_json::from_value(serde_json::json!({"countdown": "2s", "time_limit": 1500}))
                .unwrap();
        assert_eq!(o.countdown, Some(std::time::Duration::from_secs(2)));
        assert_eq!(o.time_limit, Some(std::time::Duration::from_millis(1500)));
        assert!(
            serde_json::from_value::<JobOptions>(serde_json::json!({"countdown": "x"})).is_err()
        );
    }

    #[test]
    fn callback_urls_are_checked() {
        assert!(validate_callback_url("http://127.0.0.1:9/cb").is_ok());
        assert!(validate_callback_url("ftp://x/y").is_err());
        assert!(validate_callback_url("http:///path").is_err());
        assert!(validate_callback_url("http://a b/").is_err());
    }
}
