//! The kept queue counts (docs/counts.md), for every store: after every kind of change a job
//! can go through, and under concurrent writers, [`Store::queue_stats`] (the counts the
//! schema's triggers keep) equals [`Store::queue_stats_recounted`] (a fresh count of the jobs),
//! and [`Store::count`] agrees with both. A backend's test file invokes
//! [`counts_conformance!`](crate::counts_conformance) beside the store suite.

use std::sync::Arc;
use std::time::Duration;

use super::schedules::{def, firing};
use super::{new_job, unique_queue};
use crate::job::{JobId, JobState};
use crate::store::*;
use crate::time::{micros, now};
use crate::workflow::{plan, StepSpec, WorkflowSpec};

/// Generates one `#[tokio::test]` per case; `$make` makes a fresh store, as for
/// [`store_conformance!`](crate::store_conformance).
#[macro_export]
macro_rules! counts_conformance {
    ($make:expr) => {
        $crate::__conformance_cases!(counts, $make;
            counts_follow_every_transition,
            counts_stay_exact_under_concurrent_writers
        );
    };
}

/// Panics, naming `step`, unless the kept counts equal a fresh count of the jobs, and the
/// filtered counts a bulk preview shows agree with them.
pub async fn assert_counts_exact(s: &dyn Store, step: &str) {
    let kept = s.queue_stats().await.expect("queue_stats");
    let fresh = s.queue_stats_recounted().await.expect("recount");
    assert_eq!(kept, fresh, "kept counts drifted after {step}");
    let total: u64 = fresh
        .iter()
        .map(|q| {
            q.scheduled
                + q.waiting
                + q.queued
                + q.running
                + q.succeeded
                + q.failed
                + q.dead
                + q.cancelled
        })
        .sum();
    assert_eq!(
        s.count(&JobFilter::default()).await.unwrap(),
        total,
        "count() after {step}"
    );
    for q in &fresh {
        let filter = JobFilter {
            state: Some(JobState::Queued),
            queue: Some(q.queue.clone()),
            task: None,
        };
        assert_eq!(
            s.count(&filter).await.unwrap(),
            q.queued,
            "count(queued in {}) after {step}",
            q.queue
        );
    }
}

async fn start(s: &dyn Store, id: JobId) -> u64 {
    match s.start(&[id], "w", now()).await.unwrap().remove(0) {
        StartOutcome::Run(j) => j.epoch,
        other => panic!("expected Run, got {other:?}"),
    }
}

async fn end(s: &dyn Store, id: JobId, epoch: u64, outcome: Outcome) {
    let c = Completion { id, epoch, outcome };
    s.complete(&[c], now()).await.unwrap();
}

pub async fn counts_follow_every_transition(s: Arc<dyn Store>) {
    let s = &*s;
    let q = unique_queue("counts");
    let other = unique_queue("counts-b");
    assert_counts_exact(s, "nothing").await;

    // Insert: queued, scheduled, a batch over two queues, a duplicate key that stores nothing.
    let jobs: Vec<_> = (0..8).map(|_| new_job(&q, "t")).collect();
    s.insert(jobs.clone()).await.unwrap();
    let mut later = new_job(&q, "t");
    later.run_at = Some(later.created_at + micros(Duration::from_secs(3600)));
    let mut keyed = new_job(&other, "t");
    keyed.options.idempotency_key = Some(format!("{other}-key"));
    s.insert(vec![later.clone(), keyed.clone()]).await.unwrap();
    let mut again = new_job(&other, "t");
    again.options.idempotency_key = keyed.options.idempotency_key.clone();
    s.insert(vec![again]).await.unwrap();
    assert_counts_exact(s, "insert").await;

    let id = |i: usize| jobs[i].id;
    // Start, then each way a run ends.
    let e0 = start(s, id(0)).await;
    assert_counts_exact(s, "start").await;
    end(s, id(0), e0, Outcome::Succeeded(serde_json::json!(1))).await;
    assert_counts_exact(s, "complete").await;
    let e1 = start(s, id(1)).await;
    end(s, id(1), e1, Outcome::Failed { error: "x".into() }).await;
    assert_counts_exact(s, "fail").await;
    let e2 = start(s, id(2)).await;
    let at = now() + micros(Duration::from_secs(30));
    end(
        s,
        id(2),
        e2,
        Outcome::Retry {
            error: "again".into(),
            at,
        },
    )
    .await;
    assert_counts_exact(s, "retry outcome").await;
    s.claim_due(at, 10).await.unwrap();
    assert_counts_exact(s, "claim due").await;
    let e3 = start(s, id(3)).await;
    end(
        s,
        id(3),
        e3,
        Outcome::Dead {
            reason: "unknown task".into(),
        },
    )
    .await;
    s.mark_dead(id(4), "poison", now()).await.unwrap();
    assert_counts_exact(s, "dead").await;
    let e5 = start(s, id(5)).await;
    end(s, id(5), e5, Outcome::Released).await;
    assert_counts_exact(s, "release").await;

    // Operator actions: cancel queued and running, retry a failed job.
    s.cancel(id(6), now()).await.unwrap();
    start(s, id(7)).await;
    s.cancel(id(7), now()).await.unwrap();
    assert_counts_exact(s, "cancel").await;
    s.retry(id(1), now()).await.unwrap();
    assert_counts_exact(s, "operator retry").await;

    // Reclaim: a lost worker's running job goes back to the queue.
    let e = start(s, id(5)).await;
    assert!(e > 0);
    s.mark_lost(id(5), "w", now()).await.unwrap();
    assert_counts_exact(s, "reclaim").await;
    // The cancel requested above lands when its run ends.
    s.mark_lost(id(7), "w", now()).await.unwrap();
    assert_counts_exact(s, "reclaim with a cancel request").await;

    // Pause and resume a queue.
    s.set_paused(&q, true, now()).await.unwrap();
    assert_counts_exact(s, "pause").await;
    s.set_paused(&q, false, now()).await.unwrap();
    assert_counts_exact(s, "resume").await;

    // Workflow: waiting steps, one finished, the rest cancelled with the workflow.
    let spec = WorkflowSpec::new("counts")
        .with_step("a", StepSpec::new("t.a", serde_json::json!({})))
        .with_step("b", {
            let mut st = StepSpec::new("t.b", serde_json::json!({}));
            st.after = vec!["a".into()];
            st
        })
        .with_step("c", {
            let mut st = StepSpec::new("t.c", serde_json::json!({}));
            st.after = vec!["b".into()];
            st
        });
    let wf = plan(spec, now(), |_, st| Ok(new_job(&other, &st.task))).expect("a valid graph");
    let wf_id = wf.id;
    let steps = s.create_workflow(wf).await.unwrap();
    assert_counts_exact(s, "workflow created").await;
    let first = steps
        .iter()
        .find(|i| i.state == JobState::Queued)
        .expect("a runnable step")
        .id;
    let e = start(s, first).await;
    end(s, first, e, Outcome::Succeeded(serde_json::json!(null))).await;
    assert_counts_exact(s, "workflow step finished").await;
    s.cancel_workflow(wf_id, now()).await.unwrap();
    assert_counts_exact(s, "workflow cancelled").await;

    // Schedule: a firing inserts its ticks' jobs.
    let sched = def(&unique_queue("counts-tick"), &other, 1);
    let set = s.put_schedule(&sched, now()).await.unwrap();
    let c = set.cursor;
    s.fire_schedule(&firing(&sched, c, &[c + 1_000_000, c + 2_000_000]), now())
        .await
        .unwrap()
        .expect("fired");
    assert_counts_exact(s, "schedule fired").await;

    // Bulk delete of finished jobs, then the pruner takes the rest of the history.
    assert!(s.delete_finished(&[id(0), id(3)]).await.unwrap() >= 1);
    assert_counts_exact(s, "bulk delete").await;
    std::thread::sleep(Duration::from_millis(2));
    s.purge(now(), 1000).await.unwrap();
    assert_counts_exact(s, "prune").await;
}

pub async fn counts_stay_exact_under_concurrent_writers(s: Arc<dyn Store>) {
    let queues: Vec<String> = (0..3).map(|_| unique_queue("race")).collect();
    let mut tasks = Vec::new();
    for w in 0..6 {
        let s = s.clone();
        let q = queues[w % queues.len()].clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..10 {
                let jobs: Vec<_> = (0..5).map(|_| new_job(&q, "t")).collect();
                let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
                s.insert(jobs).await.unwrap();
                let outcomes = s.start(&ids, &format!("w{w}"), now()).await.unwrap();
                let done: Vec<Completion> = outcomes
                    .into_iter()
                    .zip(&ids)
                    .filter_map(|(o, id)| match o {
                        StartOutcome::Run(j) => Some(Completion {
                            id: *id,
                            epoch: j.epoch,
                            outcome: match (round + w) % 3 {
                                0 => Outcome::Succeeded(serde_json::json!(1)),
                                1 => Outcome::Failed { error: "x".into() },
                                _ => Outcome::Released,
                            },
                        }),
                        _ => None,
                    })
                    .collect();
                // Leave some running, so the counts cover every live state.
                let keep = done.len().min(1);
                s.complete(&done[keep..], now()).await.unwrap();
            }
        }));
    }
    // Readers (which may fold PostgreSQL's deltas) and depth samples (which do) race them.
    for _ in 0..2 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                s.queue_stats().await.unwrap();
                s.sample_depth(now()).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    assert_counts_exact(&*s, "concurrent writers").await;
    let kept = s.queue_stats().await.unwrap();
    let sum: u64 = kept
        .iter()
        .filter(|k| queues.contains(&k.queue))
        .map(|k| k.queued + k.running + k.succeeded + k.failed)
        .sum();
    assert_eq!(sum, 6 * 10 * 5, "every job counted once");
}

/// Jobs in several queues and states, for the backfill cases (a database that had jobs before
/// the counts existed): each test file undoes its store's migration 17 by hand, reopens the
/// store (which migrates again) and checks [`assert_counts_exact`].
pub async fn jobs_in_several_states(s: &dyn Store) {
    for q in [unique_queue("backfill"), unique_queue("backfill")] {
        let jobs: Vec<_> = (0..6).map(|_| new_job(&q, "t")).collect();
        s.insert(jobs.clone()).await.unwrap();
        let mut later = new_job(&q, "t");
        later.run_at = Some(later.created_at + micros(Duration::from_secs(3600)));
        s.insert(vec![later]).await.unwrap();
        let e = start(s, jobs[0].id).await;
        end(s, jobs[0].id, e, Outcome::Succeeded(serde_json::json!(1))).await;
        let e = start(s, jobs[1].id).await;
        end(s, jobs[1].id, e, Outcome::Failed { error: "x".into() }).await;
        start(s, jobs[2].id).await;
        s.cancel(jobs[3].id, now()).await.unwrap();
    }
}
