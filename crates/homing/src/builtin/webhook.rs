//! `builtin.webhook`: delivers one event to one target, as a job, so a delivery is retried with
//! backoff, honours `429 Retry-After`, and survives any crash (docs/design.md section 6). The outbox
//! notifier creates these jobs; see [`crate::events`] for why.
//!
//! The job's args name the target (a subscription, or the callback URL of the job the event is
//! about), never its URL: URLs carry secrets (a Discord webhook's token is in its path), and job
//! args are shown by the API and the dashboard. The URL is resolved here, from this process's
//! configuration or the store, and appears in logs and errors only redacted.

use serde::Deserialize;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::events::{discord_message, Format, Subscription, CALLBACK_TARGET};
use crate::job::JobId;
use crate::redact::redact_secret_url;
use crate::retry::RetryPolicy;
use crate::task::{Context, Task, TaskError};

/// Delivers events to the subscriptions it was configured with, and to callback URLs.
#[derive(Debug, Clone, Default)]
pub struct Webhook {
    subscriptions: Arc<Vec<Subscription>>,
}

impl Webhook {
    pub fn new(subscriptions: Arc<Vec<Subscription>>) -> Self {
        Self { subscriptions }
    }
}

#[derive(Debug, Deserialize)]
pub struct WebhookArgs {
    /// The event object (`{"id", "event", "at", …}`).
    pub event: serde_json::Value,
    #[serde(default)]
    pub subscription: Option<String>,
    #[serde(default)]
    pub callback_job: Option<JobId>,
}

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        crate::tls::install_crypto_provider();
        crate::egress::client(
            crate::egress::policy(),
            reqwest::Client::builder()
                .connect_timeout(crate::egress::CONNECT_TIMEOUT)
                .timeout(Duration::from_secs(15)),
        )
    })
}

/// Parses `Retry-After` in its seconds form (what Discord and most APIs send).
/// The trace a job event belongs to: the context stored with the job it is about (carried in
/// the event's `job`), so the receiver continues that job's trace (docs/traces.md).
fn event_traceparent(event: &serde_json::Value) -> Option<&str> {
    event["job"]["traceparent"]
        .as_str()
        .filter(|tp| crate::tracecontext::validate(tp).is_ok())
}

fn retry_after(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = h.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    let secs: f64 = v.parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(3600.0)))
}

#[async_trait::async_trait]
impl Task for Webhook {
    const NAME: &'static str = crate::events::WEBHOOK_TASK;
    type Args = WebhookArgs;
    type Output = serde_json::Value;

    fn queue(&self) -> &str {
        crate::events::WEBHOOK_QUEUE
    }

    /// A receiver that is down for a while still gets the event: 1 s, 2 s, 4 s … capped at 5
    /// minutes, 12 retries (about half an hour).
    fn max_retries(&self) -> u32 {
        12
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::Exponential {
            base: Duration::from_secs(1),
            max: Duration::from_secs(300),
            jitter: 0.1,
        }
    }

    fn time_limit(&self) -> Duration {
        Duration::from_secs(60)
    }

    async fn run(&self, ctx: Context, args: WebhookArgs) -> Result<serde_json::Value, TaskError> {
        let (target, url, format) = match (&args.subscription, args.callback_job) {
            (Some(name), _) => {
                let sub = self
                    .subscriptions
                    .iter()
                    .find(|s| &s.name == name)
                    .ok_or_else(|| {
                        TaskError::fatal(format!(
                            "no webhook named '{name}' in this process's configuration"
                        ))
                    })?;
                (name.clone(), sub.url.clone(), sub.format)
            }
            (None, Some(job)) => {
                let url = ctx
                    .store()
                    .get(job)
                    .await
                    .map_err(|e| TaskError::retry(format!("reading job {job}: {e}")))?
                    .and_then(|j| j.callback_url)
                    .ok_or_else(|| TaskError::fatal(format!("job {job} has no callback_url")))?;
                (CALLBACK_TARGET.to_string(), url, Format::Json)
            }
            (None, None) => {
                return Err(TaskError::fatal(
                    "webhook args name neither a subscription nor a callback job",
                ))
            }
        };
        let shown = redact_secret_url(&url);
        // A refused destination stays refused: fail the delivery now rather than retry it.
        let refused = |d: &crate::egress::Denied| {
            crate::metrics::webhook(&target, "failed");
            TaskError::fatal(format!("delivery to {shown} refused: {d}"))
        };
        let parsed = reqwest::Url::parse(&url)
            .map_err(|e| TaskError::fatal(format!("delivery to {shown}: invalid url: {e}")))?;
        crate::egress::policy()
            .check_url(&parsed)
            .map_err(|d| refused(&d))?;
        let body = match format {
            Format::Discord => serde_json::json!({ "content": discord_message(&args.event) }),
            Format::Json => args.event.clone(),
        };
        let mut req = client()
            .post(parsed)
            .header("Idempotency-Key", ctx.idempotency_key())
            .header(
                "X-Homing-Event",
                args.event["event"].as_str().unwrap_or("event"),
            )
            .json(&body);
        if let Some(tp) = event_traceparent(&args.event).or(ctx.traceparent()) {
            req = req.header("traceparent", tp);
        }
        let resp = tokio::select! {
            r = req.send() => r,
            _ = ctx.cancelled() => return Err(TaskError::retry("cancelled")),
        };
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                if let Some(d) = crate::egress::denial(&e) {
                    return Err(refused(d));
                }
                crate::metrics::webhook(&target, "retry");
                let why = if e.is_timeout() {
                    "timed out"
                } else if e.is_connect() {
                    "could not connect"
                } else {
                    "transport error"
                };
                return Err(TaskError::retry(format!(
                    "delivery to {shown} failed: {why}"
                )));
            }
        };
        let status = resp.status();
        let wait = retry_after(resp.headers());
        if status.is_success() {
            crate::metrics::webhook(&target, "delivered");
            tracing::info!(event = %args.event["event"].as_str().unwrap_or(""), %target, url = %shown, "webhook delivered");
            return Ok(serde_json::json!({ "status": status.as_u16(), "target": target }));
        }
        let msg = format!("{shown} answered {}", status.as_u16());
        if status.as_u16() == 429 {
            crate::metrics::webhook(&target, "retry");
            tracing::info!(%target, url = %shown, retry_after = ?wait, "webhook rate-limited; delivery postponed");
            return Err(match wait {
                Some(d) => TaskError::RetryIn(msg, d),
                None => TaskError::Retry(msg),
            });
        }
        if status.is_server_error() || status.as_u16() == 408 {
            crate::metrics::webhook(&target, "retry");
            return Err(TaskError::Retry(msg));
        }
        crate::metrics::webhook(&target, "failed");
        Err(TaskError::Fatal(msg))
    }
}
