//! Events and webhook subscriptions: what operators are told about (a worker started, stopped or
//! was lost; a job failed or is dead; a job with a `callback_url` finished), and to whom.
//!
//! Why events are rows and deliveries are jobs: an alert must survive the crash that causes it.
//! Each event is written by the store in the same transaction as the transition it reports, so a
//! transition without its event (or the reverse) cannot exist; the outbox notifier
//! ([`crate::maintenance::notifier`]) later fans each event out, in one transaction, into one
//! `builtin.webhook` job per matching subscription, and those jobs get every guarantee a job has
//! (retries with backoff, `Retry-After`, survival of crashes) without ever taking a slot from
//! the user's handlers: they run on their own queue, [`WEBHOOK_QUEUE`].

use serde::{Deserialize, Serialize};

use crate::job::{Job, JobId, JobState};
use crate::time::{rfc3339, Micros};

pub const WORKER_READY: &str = "worker.ready";
pub const WORKER_SHUTDOWN: &str = "worker.shutdown";
pub const WORKER_LOST: &str = "worker.lost";
pub const JOB_FAILED: &str = "job.failed";
pub const JOB_DEAD: &str = "job.dead";

/// The events a subscription can ask for. Jobs with a `callback_url` also produce
/// `job.succeeded` / `job.cancelled` events, which go to that URL only.
pub const SUBSCRIBABLE: [&str; 5] = [
    WORKER_READY,
    WORKER_SHUTDOWN,
    WORKER_LOST,
    JOB_FAILED,
    JOB_DEAD,
];

/// The internal queue webhook deliveries travel on (served by a small worker of its own).
pub const WEBHOOK_QUEUE: &str = "homing.webhooks";
/// The task that delivers one event to one subscription or callback URL.
pub const WEBHOOK_TASK: &str = "builtin.webhook";
/// The target name a job's own `callback_url` is delivered under (not a valid subscription
/// name, so the two can never collide in an idempotency key).
pub const CALLBACK_TARGET: &str = "@callback";

/// An event to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub kind: String,
    pub job_id: Option<JobId>,
    pub worker: Option<String>,
    /// The event's own fields (`{"worker": {...}}`, `{"job": {...}}`), merged into its JSON.
    pub data: serde_json::Value,
}

impl NewEvent {
    /// A worker event; `details` (hostname, queues, …) is merged into `{"worker": {"id": …}}`.
    pub fn worker(kind: &str, id: &str, details: serde_json::Value) -> Self {
        let mut w = serde_json::json!({ "id": id });
        if let serde_json::Value::Object(m) = details {
            for (k, v) in m {
                w[k] = v;
            }
        }
        NewEvent {
            kind: kind.into(),
            job_id: None,
            worker: Some(id.into()),
            data: serde_json::json!({ "worker": w }),
        }
    }

    /// A job event carrying the job as it is after the transition (callback URL redacted).
    pub fn job(kind: &str, job: &Job) -> Self {
        NewEvent {
            kind: kind.into(),
            job_id: Some(job.id),
            worker: job.worker.clone(),
            data: serde_json::json!({ "job": job }),
        }
    }

    /// The event a job's terminal transition writes, if any: `job.failed` and `job.dead` always
    /// (they are alerts), other terminal states only when the job has a callback. Deliveries
    /// themselves never produce events, so a failing webhook cannot alert about itself forever.
    pub fn for_terminal(job: &Job) -> Option<Self> {
        if job.task == WEBHOOK_TASK {
            return None;
        }
        let kind = match job.state {
            JobState::Failed => JOB_FAILED,
            JobState::Dead => JOB_DEAD,
            JobState::Succeeded if job.callback_url.is_some() => "job.succeeded",
            JobState::Cancelled if job.callback_url.is_some() => "job.cancelled",
            _ => return None,
        };
        Some(Self::job(kind, job))
    }

    /// Whether a transition of `before` into `state` writes an event (decided before the
    /// transition so the common case — success without a callback — costs no extra read).
    pub fn wanted(before: &Job, state: JobState) -> bool {
        before.task != WEBHOOK_TASK
            && (matches!(state, JobState::Failed | JobState::Dead)
                || (state.is_terminal() && before.callback_url.is_some()))
    }
}

/// A recorded event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: i64,
    pub kind: String,
    pub job_id: Option<JobId>,
    pub worker: Option<String>,
    pub data: serde_json::Value,
    pub created_at: Micros,
    /// When the notifier fanned it out; `None` while pending.
    pub dispatched_at: Option<Micros>,
}

impl Event {
    /// The `builtin.webhook` job that delivers this event to one target (a subscription's name,
    /// or [`CALLBACK_TARGET`] for the event's job's own callback URL). Its idempotency key,
    /// `<event id>:<target>`, makes a repeated fan-out insert it once.
    pub fn delivery_job(&self, target: &str, now: Micros) -> crate::job::NewJob {
        let mut args = serde_json::json!({ "event": self.to_json() });
        match (target, self.job_id) {
            (CALLBACK_TARGET, Some(job)) => args["callback_job"] = serde_json::json!(job),
            _ => args["subscription"] = serde_json::json!(target),
        }
        crate::job::NewJob {
            id: crate::job::new_job_id(),
            task: WEBHOOK_TASK.into(),
            queue: WEBHOOK_QUEUE.into(),
            args,
            options: crate::job::JobOptions {
                idempotency_key: Some(format!("{}:{target}", self.id)),
                ..Default::default()
            },
            created_at: now,
            run_at: None,
        }
    }

    /// The event as subscribers receive it: `{"id", "event", "at", …data}`.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "id": self.id,
            "event": self.kind,
            "at": rfc3339(self.created_at),
        });
        if let serde_json::Value::Object(m) = &self.data {
            for (k, x) in m {
                v[k] = x.clone();
            }
        }
        v
    }
}

/// What the store needs to know of a subscription to fan events out: its name and filter.
/// (Never its URL: URLs are secrets, resolved only by the delivering task.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscriber {
    pub name: String,
    /// Event kinds; `*` matches every subscribable event.
    pub events: Vec<String>,
}

impl Subscriber {
    pub fn matches(&self, kind: &str) -> bool {
        SUBSCRIBABLE.contains(&kind) && self.events.iter().any(|e| e == "*" || e == kind)
    }
}

/// How a delivery's body is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// `{"content": "…"}`: a Discord (or Slack-compatible) incoming-webhook message.
    Discord,
    /// The event object itself.
    Json,
}

/// One webhook subscription, from configuration (`HOMING_CONFIG` / `HOMING_WEBHOOKS`).
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subscription {
    pub name: String,
    pub url: String,
    #[serde(default = "default_format")]
    pub format: Format,
    /// Event kinds to deliver; default: all of them.
    #[serde(default = "all_events")]
    pub events: Vec<String>,
}

fn default_format() -> Format {
    Format::Json
}

fn all_events() -> Vec<String> {
    vec!["*".into()]
}

/// The URL is a secret: debug output shows it redacted.
impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("name", &self.name)
            .field("url", &crate::redact::redact_secret_url(&self.url))
            .field("format", &self.format)
            .field("events", &self.events)
            .finish()
    }
}

impl Subscription {
    pub fn subscriber(&self) -> Subscriber {
        Subscriber {
            name: self.name.clone(),
            events: self.events.clone(),
        }
    }

    /// Checks name, URL and filter, so a typo fails at start-up instead of silently never firing.
    pub fn validate(&self) -> Result<(), String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !name_ok {
            return Err(format!(
                "webhook name {:?}: use 1-64 letters, digits, '.', '_' or '-'",
                self.name
            ));
        }
        crate::job::validate_callback_url(&self.url)
            .map_err(|_| format!("webhook '{}': url must be http:// or https://", self.name))?;
        if self.events.is_empty() {
            return Err(format!("webhook '{}': events is empty", self.name));
        }
        for e in &self.events {
            if e != "*" && !SUBSCRIBABLE.contains(&e.as_str()) {
                return Err(format!(
                    "webhook '{}': unknown event '{e}' (expected *, {})",
                    self.name,
                    SUBSCRIBABLE.join(", ")
                ));
            }
        }
        Ok(())
    }
}

/// Checks a list of subscriptions, including that names are unique.
pub fn validate_all(subs: &[Subscription]) -> Result<(), String> {
    for (i, s) in subs.iter().enumerate() {
        s.validate()?;
        if subs[..i].iter().any(|o| o.name == s.name) {
            return Err(format!("webhook name '{}' is used twice", s.name));
        }
    }
    Ok(())
}

/// The one-line message a Discord subscription receives for an event (the seeds' alert).
pub fn discord_message(event: &serde_json::Value) -> String {
    let kind = event["event"].as_str().unwrap_or("event");
    let worker = &event["worker"];
    let job = &event["job"];
    let wid = worker["id"].as_str().unwrap_or("?");
    let text = match kind {
        WORKER_READY => format!(
            "🟢 **worker.ready** `{wid}` is up (queues: {}, concurrency {})",
            list(&worker["queues"]),
            worker["concurrency"]
        ),
        WORKER_SHUTDOWN => format!("⚪ **worker.shutdown** `{wid}` stopped gracefully"),
        WORKER_LOST => format!(
            "🔴 **worker.lost** `{wid}`: its heartbeat expired (killed or hung); its jobs were put back"
        ),
        _ => format!(
            "{} **{kind}** job `{}` ({} on `{}`) after {} attempt(s), {} crash(es): {}",
            if kind == JOB_DEAD || kind == JOB_FAILED { "❌" } else { "ℹ️" },
            job["id"].as_str().unwrap_or("?"),
            job["task"].as_str().unwrap_or("?"),
            job["queue"].as_str().unwrap_or("?"),
            job["attempts"],
            job["crashes"],
            job["error"].as_str().unwrap_or("-")
        ),
    };
    // Discord refuses messages over 2000 characters.
    text.chars().take(1900).collect()
}

fn list(v: &serde_json::Value) -> String {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_validate_and_match() {
        let s: Subscription = serde_json::from_value(serde_json::json!({
            "name": "ops", "url": "https://hooks.example/x/y", "format": "discord",
            "events": ["worker.lost", "job.dead"]
        }))
        .unwrap();
        assert!(s.validate().is_ok());
        let sub = s.subscriber();
        assert!(sub.matches("worker.lost") && !sub.matches("worker.ready"));
        assert!(
            !format!("{s:?}").contains("/x/y"),
            "debug output hides the URL"
        );
        let all = Subscriber {
            name: "a".into(),
            events: vec!["*".into()],
        };
        assert!(all.matches("job.failed") && !all.matches("job.succeeded"));
        let mut bad = s.clone();
        bad.events = vec!["worker.readdy".into()];
        assert!(bad.validate().is_err());
        bad = s.clone();
        bad.name = "@callback".into();
        assert!(bad.validate().is_err());
        assert!(validate_all(&[s.clone(), s]).is_err());
    }

    #[test]
    fn discord_messages_name_the_worker() {
        let ev = Event {
            id: 3,
            kind: WORKER_LOST.into(),
            job_id: None,
            worker: Some("w-1".into()),
            data: NewEvent::worker(WORKER_LOST, "w-1", serde_json::json!({})).data,
            created_at: 0,
            dispatched_at: None,
        };
        let j = ev.to_json();
        assert_eq!(j["id"], 3);
        assert_eq!(j["worker"]["id"], "w-1");
        assert!(discord_message(&j).contains("worker.lost") && discord_message(&j).contains("w-1"));
    }
}
