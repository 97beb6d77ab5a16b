//! The deployment's limited queue (docs/limits.md): a queue limited to [`LIMIT`] running jobs
//! across every worker, fed in bursts larger than the limit, whose jobs call the counter on
//! their own path. The counter records each such call's start and end; the invariant is that no
//! more than [`LIMIT`] calls were ever in flight at once, under every fault.
//!
//! One excess is explained rather than counted: a worker that was stopped or cut off long
//! enough to be presumed dead, whose job the rescuer reclaimed (freeing its slot) while the
//! zombie still made its call. The store fences that zombie's commit out; its call is the
//! at-least-once duplicate docs/design.md section 1 allows, and it can overlap a legitimate run.
//! A broker that loses its heartbeats (restart, flushall) makes every worker presumed dead at
//! once. So a moment above the limit is explained only if it falls within such a fault (a
//! pause, a cut, a broker restart or flush, plus the settle time) or around a presumption the
//! rescuer logged; any other is a violation, and explained moments are counted apart.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use homing::time::Micros;
use homing::{Client, EnqueueRequest, JobId};

use super::faults::{Injected, Kind};

/// The limited queue's name and its concurrency limit.
pub const QUEUE: &str = "chaos-limited";
pub const LIMIT: u32 = 2;
/// The counter path its jobs call.
pub const PATH: &str = "/limited";
/// Jobs per burst (more than the limit, so the limit has work to do), one burst a second.
const BURST: usize = 4;

/// Sets the limit on the deployment.
pub async fn configure(client: &Client) -> anyhow::Result<()> {
    client
        .set_queue_limits(
            QUEUE,
            &homing::limit::QueueLimits {
                concurrency: Some(LIMIT),
                ..Default::default()
            },
        )
        .await?;
    Ok(())
}

/// Enqueues a burst of [`BURST`] jobs of `task` (the load's task: `builtin.http`, or its Python
/// twin) every second until stopped; returns via `accepted`.
pub async fn run(
    client: Client,
    url: String,
    task: &'static str,
    max_crashes: u32,
    accepted: Arc<Mutex<Vec<JobId>>>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let reqs = (0..BURST)
            .map(|_| {
                let mut r =
                    EnqueueRequest::new(task, serde_json::json!({ "url": url, "timeout": "10s" }));
                r.options.queue = Some(QUEUE.into());
                r.options.max_crashes = Some(max_crashes);
                r
            })
            .collect();
        if let Ok(Ok(ins)) =
            tokio::time::timeout(Duration::from_secs(10), client.enqueue_many(reqs)).await
        {
            accepted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(ins.into_iter().map(|i| i.id));
        }
    }
}

/// The accepted jobs and, after them, the store's jobs of the load's `task` in the queue that
/// were never answered as accepted (their enqueue failed, yet committed): every one of them must
/// succeed, and the counter's calls of each are this check's, not the load's.
pub fn with_unanswered(mut accepted: Vec<JobId>, jobs: &[homing::Job], task: &str) -> Vec<JobId> {
    let answered: std::collections::HashSet<JobId> = accepted.iter().copied().collect();
    accepted.extend(
        jobs.iter()
            .filter(|j| j.task == task && !answered.contains(&j.id))
            .map(|j| j.id),
    );
    accepted
}

/// What the limited queue showed.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Outcome {
    pub limit: u32,
    pub jobs: usize,
    pub max_in_flight: u32,
    /// Moments above the limit explained by a presumed-dead worker's zombie call.
    pub explained_excess: usize,
    pub violations: Vec<String>,
}

/// Checks the calls' intervals (start, end) against the limit, and that every accepted job of
/// the queue succeeded.
pub fn check(
    calls: &[(Micros, Micros)],
    jobs: &[homing::Job],
    accepted: &[JobId],
    injected: &[Injected],
    presumed_dead: &[Micros],
    settle: Micros,
) -> Outcome {
    let mut out = Outcome {
        limit: LIMIT,
        jobs: accepted.len(),
        ..Default::default()
    };
    // Ends sort before starts at the same instant: a call that ended as another began did not
    // overlap it.
    let mut edges: Vec<(Micros, i32)> = calls
        .iter()
        .flat_map(|(s, e)| [(*s, 1), (*e, -1)])
        .collect();
    edges.sort();
    // Where a live worker can be presumed dead: a pause or a cut of it, a broker that lost its
    // heartbeats (restart, flushall), and around every presumption the rescuer logged.
    let mut zombie_windows: Vec<(Micros, Micros)> = injected
        .iter()
        // A killed server also makes its Python workers' sessions presumed dead while their
        // calls go on.
        .filter(|f| {
            matches!(
                f.kind,
                Kind::Pause
                    | Kind::NetCut
                    | Kind::RedisRestart
                    | Kind::RedisFlushall
                    | Kind::ServerKill
            )
        })
        .map(|f| (f.at, f.end + settle))
        .collect();
    zombie_windows.extend(
        presumed_dead
            .iter()
            .map(|p| (p.saturating_sub(1_000_000), p + settle)),
    );
    let mut now_in = 0i32;
    for (t, d) in edges {
        now_in += d;
        out.max_in_flight = out.max_in_flight.max(now_in.max(0) as u32);
        if d > 0 && now_in > LIMIT as i32 {
            if zombie_windows.iter().any(|(a, b)| *a <= t && t <= *b) {
                out.explained_excess += 1;
            } else if out.violations.len() < 20 {
                out.violations.push(format!(
                    "{now_in} calls of the limited queue in flight at {t} (limit {LIMIT})"
                ));
            }
        }
    }
    let by_id: std::collections::HashMap<JobId, &homing::Job> =
        jobs.iter().map(|j| (j.id, j)).collect();
    for id in accepted {
        match by_id.get(id) {
            Some(j) if j.state == homing::JobState::Succeeded => {}
            Some(j) if out.violations.len() < 40 => out.violations.push(format!(
                "limited job {id} ended {:?}: {:?}",
                j.state, j.error
            )),
            None if out.violations.len() < 40 => {
                out.violations.push(format!("limited job {id} was lost"))
            }
            _ => {}
        }
    }
    if accepted.is_empty() {
        out.violations
            .push("no limited job was accepted: the limited load never ran".into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_are_counted_and_zombies_explained() {
        let calls = [(0, 10), (5, 15), (10, 20), (12, 14)];
        let o = check(&calls, &[], &[], &[], &[], 0);
        assert_eq!(o.max_in_flight, 3);
        assert_eq!(o.violations.len(), 2, "{:?}", o.violations);
        let ok = check(&[(0, 10), (10, 20), (5, 10)], &[], &[], &[], &[], 0);
        let z = check(&calls, &[], &[], &[], &[13], 0);
        assert_eq!(
            (z.violations.len(), z.explained_excess),
            (1, 1),
            "{:?}",
            z.violations
        );
        assert_eq!(ok.max_in_flight, 2);
        assert_eq!(
            ok.violations.len(),
            1,
            "only the no-jobs note: {:?}",
            ok.violations
        );
    }

    /// A job the store holds although its enqueue was not answered is checked like an accepted
    /// one; a job of another task in the queue (a hostile request's) is not.
    #[test]
    fn an_unanswered_job_in_the_store_is_checked_too() {
        let job = |task: &str| {
            crate::commands::chaos::test_job(
                homing::job::new_job_id(),
                task,
                QUEUE,
                homing::JobState::Succeeded,
            )
        };
        let (answered, unanswered, hostile) =
            (job("builtin.http"), job("builtin.http"), job("other"));
        let ids = with_unanswered(
            vec![answered.id],
            &[answered.clone(), unanswered.clone(), hostile],
            "builtin.http",
        );
        assert_eq!(ids, vec![answered.id, unanswered.id]);
    }
}
