//! What `homing queues` / `homing workers` and `GET /v1/queues` / `GET /v1/workers` show: one
//! assembly of store and broker facts, so the CLI and the API never disagree.

use serde::Serialize;

use homing::broker::QueueDepth;
use homing::store::{FinishedCounts, QueueStats, WorkerRecord, WorkerStatus};
use homing::time::{now, Micros};
use homing::{Backends, Result};

#[derive(Debug, Clone, Serialize)]
pub struct QueueView {
    #[serde(flatten)]
    pub jobs: QueueStats,
    /// What the broker holds for the queue.
    pub broker: QueueDepth,
    /// Jobs that finished in the last hour, by state.
    pub last_hour: FinishedCounts,
    /// Jobs finished per second over the last minute.
    pub throughput_per_s: f64,
}

pub async fn queues(b: &Backends) -> Result<Vec<QueueView>> {
    let stats = b.store.queue_stats().await?;
    let depths = b.broker.depths().await?;
    let t = now();
    let hour = b.store.finished_since(t - 3600 * 1_000_000).await?;
    let minute = b.store.finished_since(t - 60 * 1_000_000).await?;
    let mut names: Vec<String> = stats.iter().map(|s| s.queue.clone()).collect();
    names.extend(depths.iter().map(|d| d.queue.clone()));
    names.sort();
    names.dedup();
    Ok(names
        .into_iter()
        .map(|q| QueueView {
            jobs: stats
                .iter()
                .find(|s| s.queue == q)
                .cloned()
                .unwrap_or(QueueStats {
                    queue: q.clone(),
                    ..Default::default()
                }),
            broker: depths
                .iter()
                .find(|d| d.queue == q)
                .cloned()
                .unwrap_or(QueueDepth {
                    queue: q.clone(),
                    ..Default::default()
                }),
            last_hour: hour
                .iter()
                .find(|h| h.queue == q)
                .cloned()
                .unwrap_or(FinishedCounts {
                    queue: q.clone(),
                    ..Default::default()
                }),
            throughput_per_s: minute
                .iter()
                .find(|m| m.queue == q)
                .map(|m| (m.succeeded + m.failed + m.dead + m.cancelled) as f64 / 60.0)
                .unwrap_or(0.0),
        })
        .collect())
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerView {
    #[serde(flatten)]
    pub record: WorkerRecord,
    /// Seconds since the worker last updated its store record (`last_seen`), which it does every
    /// few heartbeats: a record, not the liveness signal.
    pub last_seen_age_s: f64,
    /// Seconds until the worker's heartbeat in the broker expires unless refreshed; `None` when
    /// it has none. Liveness is decided by this heartbeat, so this is what shows whether a
    /// worker is about to be presumed dead (a healthy one stays between TTL − interval and TTL).
    pub heartbeat_expires_in_s: Option<f64>,
    /// Whether its heartbeat is current in the broker.
    pub alive: bool,
    /// What it is running now, and since when.
    pub running_jobs: Vec<RunningView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunningView {
    pub id: homing::JobId,
    pub task: String,
    pub queue: String,
    #[serde(with = "homing::time::opt_rfc3339")]
    pub started_at: Option<Micros>,
    pub running_for_s: f64,
}

/// Most running jobs listed per worker (its concurrency is usually lower).
const RUNNING_SHOWN: usize = 50;

pub async fn workers(b: &Backends, since: Micros) -> Result<Vec<WorkerView>> {
    let records = b.store.workers(since).await?;
    let t = now();
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let expires_in = if r.status == WorkerStatus::Live {
            b.broker.heartbeat_expires_in(&r.info.id).await?
        } else {
            None
        };
        let alive = expires_in.is_some();
        let mut running_jobs = Vec::new();
        for id in r.running.iter().take(RUNNING_SHOWN) {
            if let Some(j) = b.store.get(*id).await? {
                running_jobs.push(RunningView {
                    id: j.id,
                    task: j.task,
                    queue: j.queue,
                    started_at: j.started_at,
                    running_for_s: j
                        .started_at
                        .map(|s| ((t - s).max(0) as f64) / 1e6)
                        .unwrap_or(0.0),
                });
            }
        }
        out.push(WorkerView {
            last_seen_age_s: ((t - r.last_seen).max(0) as f64) / 1e6,
            heartbeat_expires_in_s: expires_in.map(|d| d.as_secs_f64()),
            alive,
            running_jobs,
            record: r,
        });
    }
    Ok(out)
}
