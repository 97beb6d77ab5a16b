//! Counters and histograms, recorded where things happen (client enqueue, executor, committer,
//! rescuer, webhook deliveries) through the `metrics` facade. The library installs no recorder:
//! without one every call here is a no-op, and a program that wants numbers installs its own
//! (the `homing` binary renders them as Prometheus text at `/metrics`).
//!
//! These are per-process figures: a worker's counters cover the jobs that worker ran. Global
//! figures (queue depth, live workers) are read from the store at scrape time instead. Every
//! metric name lives here so the docs, the exporter's bucket settings and the tests agree.

use std::time::Duration;

pub const JOBS_ENQUEUED: &str = "homing_jobs_enqueued_total";
pub const JOBS_STARTED: &str = "homing_jobs_started_total";
pub const JOBS_SUCCEEDED: &str = "homing_jobs_succeeded_total";
pub const JOBS_FAILED: &str = "homing_jobs_failed_total";
pub const JOBS_DEAD: &str = "homing_jobs_dead_total";
pub const JOBS_RETRIED: &str = "homing_jobs_retried_total";
pub const JOBS_RECLAIMED: &str = "homing_jobs_reclaimed_total";
pub const JOB_DURATION: &str = "homing_job_duration_seconds";
pub const JOB_QUEUE_WAIT: &str = "homing_job_queue_wait_seconds";
pub const WEBHOOK_DELIVERIES: &str = "homing_webhook_deliveries_total";
/// Completions of remote workers refused for a stale epoch (zombie writes), by queue and task.
pub const REMOTE_STALE: &str = "homing_remote_stale_total";
/// Gauges a server sets from the store at scrape time.
pub const QUEUE_JOBS: &str = "homing_queue_jobs";
pub const WORKERS_LIVE: &str = "homing_workers_live";

/// Histogram buckets (seconds) for durations and queue waits: from a no-op job to an hour-long
/// inference.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 300.0, 3600.0,
];

fn labels(queue: &str, task: &str) -> [(&'static str, String); 2] {
    [("queue", queue.to_string()), ("task", task.to_string())]
}

pub(crate) fn count(name: &'static str, queue: &str, task: &str) {
    metrics::counter!(name, &labels(queue, task)).increment(1);
}

pub(crate) fn duration(name: &'static str, queue: &str, task: &str, d: Duration) {
    metrics::histogram!(name, &labels(queue, task)).record(d.as_secs_f64());
}

/// One webhook delivery attempt: `outcome` is `delivered`, `retry` or `failed`.
#[cfg(feature = "http")]
pub(crate) fn webhook(target: &str, outcome: &'static str) {
    metrics::counter!(WEBHOOK_DELIVERIES, "target" => target.to_string(), "outcome" => outcome)
        .increment(1);
}
