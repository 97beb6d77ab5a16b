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
    /// Jobs that finished in the last hour (the current minute and the 59 before it), by state.
    pub last_hour: FinishedCounts,
    /// Jobs finished per second over the current minute and the one before it (60–120 s).
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

/// Finished jobs per queue, summed from the store's two sources.
#[derive(Default)]
struct Tally(BTreeMap<String, FinishedCounts>);

impl Tally {
    fn add(&mut self, c: &FinishedCounts) {
        let t = self
            .0
            .entry(c.queue.clone())
            .or_insert_with(|| FinishedCounts {
                queue: c.queue.clone(),
                ..Default::default()
            });
        t.succeeded += c.succeeded;
        t.failed += c.failed;
        t.dead += c.dead;
        t.cancelled += c.cancelled;
    }
}

/// Per queue, the jobs finished in the last hour and in the throughput window
/// (`homing::stats::list_windows`): whatever the rollups hold from them, and the finishes since
/// the rollup's live point counted from the jobs once for both, so a busy hour at a million jobs
/// costs a pass interval's worth of index entries, not the hour's.
async fn finished_recently(
    b: &Backends,
    t: Micros,
    live: Option<Micros>,
) -> Result<(Tally, Tally, homing::stats::ListWindows)> {
    let w = homing::stats::list_windows(t, live);
    let (mut hour, mut minute) = (Tally::default(), Tally::default());
    // The rollups first, right after the cursor was read: a pass committing between the two
    // reads would make the rows disagree with it (for one call). One read serves both windows:
    // the throughput's rolled minutes are the last of the hour's.
    if let Some((from, to)) = w.hour_rolled {
        for c in b.store.stats_rows(60, from, to).await?.counts {
            let in_minute = w.minute_rolled.is_some_and(|(m, _)| c.at >= m);
            let c = FinishedCounts::from(c);
            if in_minute {
                minute.add(&c);
            }
            hour.add(&c);
        }
    }
    if let Some((from, to)) = w.mid {
        for c in b.store.finished_between(from, to).await? {
            hour.add(&c);
        }
    }
    for c in b.store.finished_between(w.tail, Micros::MAX).await? {
        hour.add(&c);
        minute.add(&c);
    }
    Ok((hour, minute, w))
}

/// The queues named after `after` (all when `None`), at most `limit` of them. Each source is
/// read once and merged by name, so the cost grows with the number of queues, not its square.
pub async fn queues(b: &Backends, after: Option<&str>, limit: usize) -> Result<QueuePage> {
    queues_at(b, now(), after, limit).await
}

/// [`queues`] as seen at time `t` (the windows of finished jobs end there).
pub async fn queues_at(
    b: &Backends,
    t: Micros,
    after: Option<&str>,
    limit: usize,
) -> Result<QueuePage> {
    // Three strands at once, so the answer takes about as long as the slowest (the finishes
    // since the last rollup pass) rather than the sum: the broker's depths (on Redis a round
    // trip, on the embedded file a connection of its own), the store's kept counts and queue
    // settings (a few rows each), and the rollup cursor followed by the rows it describes and the
    // finishes after it. A call holds at most two store connections (PostgreSQL pools are small).
    let kept = async {
        let stats = b.store.queue_stats().await?;
        let settings = b.store.queue_settings().await?;
        Ok::<_, homing::Error>((stats, settings))
    };
    let finished = async {
        let live = b.store.stats_cursor().await?.map(|c| c.live);
        finished_recently(b, t, live).await
    };
    let (depths, (stats, settings), (hour, minute, windows)) =
        tokio::try_join!(b.broker.depths(), kept, finished)?;
    let seconds = ((t - windows.minute_from) as f64 / 1e6).max(1.0);
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
    for (q, h) in hour.0 {
        view(&mut by_name, &q).last_hour = h;
    }
    for (q, m) in minute.0 {
        view(&mut by_name, &q).throughput_per_s =
            (m.succeeded + m.failed + m.dead + m.cancelled) as f64 / seconds;
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

#[cfg(test)]
mod tests {
    use super::*;
    use homing::job::NewJob;
    use homing::store::{Completion, Outcome, StartOutcome};

    /// Finishes a fresh job of `queue` at `at`; returns its id.
    async fn finish_at(b: &Backends, queue: &str, at: Micros, outcome: Outcome) -> homing::JobId {
        let nj = NewJob {
            id: homing::job::new_job_id(),
            task: "t".into(),
            queue: queue.into(),
            args: serde_json::json!({}),
            options: Default::default(),
            created_at: at - 2,
            run_at: None,
        };
        let id = nj.id;
        b.store.insert(vec![nj]).await.unwrap();
        let StartOutcome::Run(j) = b.store.start(&[id], "w", at - 1).await.unwrap().remove(0)
        else {
            panic!("not started")
        };
        let c = Completion {
            id,
            epoch: j.epoch,
            outcome,
        };
        b.store.complete(&[c], at).await.unwrap();
        id
    }

    /// The last hour is what the rollups hold up to their live point plus the finishes after it
    /// from the jobs, each counted once: a job finished before the hour is not in it, one in
    /// the open minute before the rollup's pass is counted once, one after the pass is counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn last_hour_adds_the_rollups_and_the_finishes_after_them_once() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/homing.db", dir.path().display());
        let b = Backends::open(&url, &url).await.unwrap();
        let q = "hour".to_string();
        let t = now();
        let ok = || Outcome::Succeeded(serde_json::json!(1));
        let minute = 60_000_000;
        finish_at(&b, &q, t - 120 * minute, ok()).await;
        let rolled_job = finish_at(&b, &q, t - 30 * minute, ok()).await;
        finish_at(
            &b,
            &q,
            t - 20 * minute,
            Outcome::Failed { error: "x".into() },
        )
        .await;
        finish_at(&b, &q, t - 1, ok()).await;
        homing::maintenance::rollup::pass(&*b.store, None, t, &Default::default())
            .await
            .unwrap();
        let cursor = b.store.stats_cursor().await.unwrap().expect("rolled up");
        assert_eq!(cursor.live, t, "the pass counted up to its own time");
        // After the rollup: the tail is counted from the jobs.
        finish_at(&b, &q, t + 1, ok()).await;
        let page = queues(&b, None, 1000).await.unwrap();
        let v = page
            .queues
            .iter()
            .find(|v| v.jobs.queue == q)
            .expect("queue listed");
        assert_eq!(
            (v.last_hour.succeeded, v.last_hour.failed),
            (3, 1),
            "30, 20 and 0 minutes ago from the rollups, just now from the jobs, not 2 hours ago"
        );
        assert!(v.throughput_per_s > 0.0, "two finished within the minute");
        let count = |(hour, minute, _): (Tally, Tally, _)| {
            let pick = |t: Tally| t.0.get(&q).map(|c| (c.succeeded, c.failed));
            (pick(hour), pick(minute))
        };
        // Without rollups the same answer, all from the jobs.
        let all = finished_recently(&b, t + 2, None).await.unwrap();
        assert_eq!(count(all), (Some((3, 1)), Some((2, 0))));
        // The rolled minutes really come from the rollups: a job deleted after its minute was
        // rolled up is still counted with them, no longer without.
        assert_eq!(b.store.delete_finished(&[rolled_job]).await.unwrap(), 1);
        let with = finished_recently(&b, t + 2, Some(cursor.live))
            .await
            .unwrap();
        let without = finished_recently(&b, t + 2, None).await.unwrap();
        assert_eq!(
            (count(with), count(without).0),
            ((Some((3, 1)), Some((2, 0))), Some((2, 1))),
            "the hour from both sources; the throughput window's job of a second ago from the \
             rollups, the one after the pass from the jobs"
        );
    }
}
