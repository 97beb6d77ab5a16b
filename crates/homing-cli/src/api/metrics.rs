//! `GET /metrics`: Prometheus text. Counters and histograms are this process's own, recorded by
//! the library where things happen (so `homing up`, one process, sees everything; a `homing
//! server` sees its API's enqueues and its own webhook deliveries, each worker its own jobs).
//! Queue depth and live workers are global: read from the store and broker at every scrape.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

use super::{ApiError, AppState};
use crate::views;
use homing::metrics as m;
use homing::JobState;

/// Installs the process-wide Prometheus recorder once and returns its handle.
pub fn install_recorder() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let built = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(m::JOB_DURATION.into()), &m::DURATION_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(m::JOB_QUEUE_WAIT.into()),
                        &m::DURATION_BUCKETS,
                    )
                })
                .and_then(|b| b.install_recorder());
            match built {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::warn!(error = %e, "metrics recorder not installed; /metrics shows store gauges only");
                    None
                }
            }
        })
        .clone()
}

pub async fn render(State(state): State<AppState>) -> Result<Response, ApiError> {
    // Only the per-state counts: one grouped read, no per-queue work beyond one line each.
    let queues = state.backends.store.queue_stats().await?;
    let since = homing::time::now() - 3600 * 1_000_000;
    let live = views::workers(&state.backends, since)
        .await?
        .iter()
        .filter(|w| w.alive)
        .count();
    let mut text = String::new();
    if let Some(h) = &state.metrics {
        for j in &queues {
            let counts = [
                (JobState::Scheduled, j.scheduled),
                (JobState::Waiting, j.waiting),
                (JobState::Queued, j.queued),
                (JobState::Running, j.running),
                (JobState::Succeeded, j.succeeded),
                (JobState::Failed, j.failed),
                (JobState::Dead, j.dead),
                (JobState::Cancelled, j.cancelled),
            ];
            for (st, n) in counts {
                metrics::gauge!(m::QUEUE_JOBS, "queue" => j.queue.clone(), "state" => st.as_str())
                    .set(n as f64);
            }
        }
        metrics::gauge!(m::WORKERS_LIVE).set(live as f64);
        text = h.render();
    }
    if state.metrics.is_none() || !text.contains(m::WORKERS_LIVE) {
        text.push_str(&format!(
            "# TYPE {w} gauge\n{w} {live}\n",
            w = m::WORKERS_LIVE
        ));
    }
    Ok((
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response())
}
