//! What `homing queues` / `homing workers` and `GET /v1/queues` / `GET /v1/workers` show: one
//! assembly of store and broker facts, so the CLI and the API never disagree.

use serde::Serialize;

use homing::broker::QueueDepth;
use homing::store::{QueueStats, WorkerRecord};
use homing::time::{now, Micros};
use homing::{Backends, Result};

#[derive(Debug, Clone, Serialize)]
pub struct QueueView {
    #[serde(flatten)]
    pub jobs: QueueStats,
    /// What the broker holds for the queue.
    pub broker: QueueDepth,
}

pub async fn queues(b: &Backends) -> Result<Vec<QueueView>> {
    let stats = b.store.queue_stats().await?;
    let depths = b.broker.depths().await?;
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
        })
        .collect())
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerView {
    #[serde(flatten)]
    pub record: WorkerRecord,
    /// Seconds since the store last heard of the worker.
    pub last_seen_age_s: f64,
    /// Whether its heartbeat is current in the broker.
    pub alive: bool,
}

pub async fn workers(b: &Backends, since: Micros) -> Result<Vec<WorkerView>> {
    let records = b.store.workers(since).await?;
    let t = now();
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let alive = r.status == "live" && b.broker.is_alive(&r.info.id).await?;
        out.push(WorkerView {
            last_seen_age_s: ((t - r.last_seen).max(0) as f64) / 1e6,
            alive,
            record: r,
        });
    }
    Ok(out)
}
