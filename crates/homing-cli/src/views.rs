//! What `homing queues` / `homing workers` and `GET /v1/queues` / `GET /v1/workers` show: one
//! assembly of store and broker facts, so the CLI and the API never disagree.

use serde::Serialize;
use std::collections::BTreeMap;

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
    /// Paused by an operator: no job starts from it until it is resumed (docs/limits.md).
    pub paused: bool,
    /// Cluster-wide limits (`homing queues limit`, `PUT /v1/queues/{name}`); empty when none.
    pub limits: homing::limit::QueueLimits,
}

impl QueueView {
    fn empty(queue: &str) -> Self {
        QueueView {
            jobs: QueueStats {
                queue: queue.to_string(),
                ..Default::default()
            },
            broker: QueueDepth {
                queue: queue.to_string(),
                ..Default::default()
            },
            last_hour: FinishedCounts {
                queue: queue.to_string(),
                ..Default::default()
            },
            throughput_per_s: 0.0,
            paused: false,
            limits: Default::default(),
        }
    }
}

/// One page of queues, by name.
#[derive(Debug, Clone, Serialize)]
pub struct QueuePage {
    pub queues: Vec<QueueView>,
    /// The name to pass as `after` for the next page; `None` on the last one.
    pub next: Option<String>,
}

/// The queues named after `after` (all when `None`), at most `limit` of them. Each source is
/// read once and merged by name, so the cost grows with the number of queues, not its square.
pub async fn queues(b: &Backends, after: Option<&str>, limit: usize) -> Result<QueuePage> {
    let stats = b.store.queue_stats().await?;
    let depths = b.broker.depths().await?;
    let t = now();
    let hour = b.store.finished_since(t - 3600 * 1_000_000).await?;
    let minute = b.store.finished_since(t - 60 * 1_000_000).await?;
    let settings = b.store.queue_settings().await?;
    let mut by_name: BTreeMap<String, QueueView> = BTreeMap::new();
    fn view<'a>(m: &'a mut BTreeMap<String, QueueView>, q: &str) -> &'a mut QueueView {
        m.entry(q.to_string())
            .or_insert_with(|| QueueView::empty(q))
    }
    for s in stats {
        let v = view(&mut by_name, &s.queue);
        v.jobs = s;
    }
    for d in depths {
        let v = view(&mut by_name, &d.queue);
        v.broker = d;
    }
    for h in hour {
        let v = view(&mut by_name, &h.queue);
        v.last_hour = h;
    }
    for m in minute {
        view(&mut by_name, &m.queue).throughput_per_s =
            (m.succeeded + m.failed + m.dead + m.cancelled) as f64 / 60.0;
    }
    for q in settings {
        let v = view(&mut by_name, &q.queue);
        v.paused = q.paused;
        v.limits = q.limits;
    }
    let mut rest = match after {
        Some(a) => by_name.split_off(a),
        None => by_name,
    }
    .into_iter()
    .filter(|(name, _)| Some(name.as_str()) != after)
    .map(|(_, v)| v);
    let queues: Vec<QueueView> = rest.by_ref().take(limit).collect();
    let next = match rest.next() {
        Some(_) => queues.last().map(|q| q.jobs.queue.clone()),
        None => None,
    };
    Ok(QueuePage { queues, next })
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
    /// The heartbeat TTL it registered with (seconds): the heartbeat expires this long after its
    /// last refresh. `None` for a worker that registered before it was recorded.
    pub heartbeat_ttl_s: Option<f64>,
    /// How long ago its heartbeat was last refreshed (TTL − time left): what liveness compares
    /// with the TTL. `None` without a live heartbeat or a known TTL.
    pub heartbeat_age_s: Option<f64>,
    /// When a rescuer declared it lost (its `ended_at`); `None` unless its status is `lost`.
    #[serde(with = "homing::time::opt_rfc3339")]
    pub lost_at: Option<Micros>,
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
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        out.push(view_of(b, r).await?);
    }
    Ok(out)
}

/// One worker, however long ago it was heard of (until retention deletes its record).
pub async fn worker(b: &Backends, id: &str) -> Result<Option<WorkerView>> {
    match b.store.worker(id).await? {
        Some(r) => Ok(Some(view_of(b, r).await?)),
        None => Ok(None),
    }
}

async fn view_of(b: &Backends, r: WorkerRecord) -> Result<WorkerView> {
    let t = now();
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
    let ttl = r
        .info
        .heartbeat_ttl_ms
        .map(std::time::Duration::from_millis);
    Ok(WorkerView {
        last_seen_age_s: ((t - r.last_seen).max(0) as f64) / 1e6,
        heartbeat_expires_in_s: expires_in.map(|d| d.as_secs_f64()),
        heartbeat_ttl_s: ttl.map(|d| d.as_secs_f64()),
        heartbeat_age_s: match (ttl, expires_in) {
            (Some(ttl), Some(left)) => Some(ttl.saturating_sub(left).as_secs_f64()),
            _ => None,
        },
        lost_at: if r.status == WorkerStatus::Lost {
            r.ended_at
        } else {
            None
        },
        alive,
        running_jobs,
        record: r,
    })
}
