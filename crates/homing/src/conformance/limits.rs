//! Pause, priority and unique jobs (docs/limits.md), for every store: a backend's test file
//! invokes [`limits_conformance!`](crate::limits_conformance) beside the store suite.

use std::sync::Arc;
use std::time::Duration;

use super::{new_job, unique_queue};
use crate::job::{JobId, JobState};
use crate::store::*;
use crate::time::{micros, now};

/// Generates one `#[tokio::test]` per case; `$make` makes a fresh store, as for
/// [`store_conformance!`](crate::store_conformance).
#[macro_export]
macro_rules! limits_conformance {
    ($make:expr) => {
        $crate::__conformance_cases!(limits, $make;
            paused_queue_parks_and_resume_hands_back, pause_spares_other_queues_and_finished_jobs,
            priority_is_stored_and_kept, unique_for_returns_the_same_job,
            unique_for_window_counts_from_the_finish, concurrent_unique_enqueues_insert_once
        );
    };
}

async fn insert(s: &dyn Store, job: crate::job::NewJob) -> Inserted {
    s.insert(vec![job]).await.expect("insert").remove(0)
}

async fn start(s: &dyn Store, id: JobId) -> StartOutcome {
    s.start(&[id], "w1", now()).await.expect("start").remove(0)
}

/// A paused queue's job is parked by a start: still queued, undispatched, not started, left out
/// of the outbox until the queue is resumed, which hands it back to publish.
pub async fn paused_queue_parks_and_resume_hands_back(s: Arc<dyn Store>) {
    let q = unique_queue("pause");
    let a = insert(&*s, new_job(&q, "t")).await;
    s.mark_dispatched(&[a.id]).await.unwrap();
    assert!(s.set_paused(&q, true, now()).await.unwrap().is_empty());
    let settings = s.queue_settings().await.unwrap();
    assert!(
        settings.iter().any(|x| x.queue == q && x.paused),
        "{settings:?}"
    );
    // Pausing twice is harmless.
    s.set_paused(&q, true, now()).await.unwrap();
    // A job enqueued while paused is accepted.
    let b = insert(&*s, new_job(&q, "t")).await;
    assert_eq!(b.state, JobState::Queued);
    let out = s.start(&[a.id, b.id], "w1", now()).await.unwrap();
    assert_eq!(out, vec![StartOutcome::Parked, StartOutcome::Parked]);
    for id in [a.id, b.id] {
        let j = s.get(id).await.unwrap().unwrap();
        assert_eq!((j.state, j.epoch, j.worker), (JobState::Queued, 0, None));
        assert_eq!(
            (j.attempts, j.crashes),
            (0, 0),
            "being held back counts nothing"
        );
    }
    let outbox = s
        .undispatched(now() + micros(Duration::from_secs(60)), 100)
        .await
        .unwrap();
    assert!(
        !outbox.iter().any(|d| d.queue == q),
        "a paused queue's jobs are not published again: {outbox:?}"
    );
    let back = s.set_paused(&q, false, now()).await.unwrap();
    let mut ids: Vec<JobId> = back.iter().map(|d| d.id).collect();
    ids.sort();
    let mut want = vec![a.id, b.id];
    want.sort();
    assert_eq!(ids, want, "resume hands back every held job");
    assert!(back.iter().all(|d| d.queue == q));
    assert!(!s
        .queue_settings()
        .await
        .unwrap()
        .iter()
        .any(|x| x.queue == q && x.paused));
    // Had the caller died before publishing, the reconciler would find them.
    let outbox = s
        .undispatched(now() + micros(Duration::from_secs(60)), 1000)
        .await
        .unwrap();
    assert_eq!(outbox.iter().filter(|d| d.queue == q).count(), 2);
    assert!(matches!(start(&*s, a.id).await, StartOutcome::Run(_)));
}

/// A pause holds back only starts of its own queue: other queues run, a running job finishes,
/// a due scheduled job is parked as queued, and a duplicate delivery of a finished job is skipped.
pub async fn pause_spares_other_queues_and_finished_jobs(s: Arc<dyn Store>) {
    let q = unique_queue("pause2");
    let other = unique_queue("open");
    let running = insert(&*s, new_job(&q, "t")).await;
    let StartOutcome::Run(r) = start(&*s, running.id).await else {
        panic!("not started")
    };
    let done = insert(&*s, new_job(&q, "t")).await;
    let StartOutcome::Run(d) = start(&*s, done.id).await else {
        panic!("not started")
    };
    s.complete(
        &[Completion {
            id: d.id,
            epoch: d.epoch,
            outcome: Outcome::Succeeded(serde_json::json!(1)),
        }],
        now(),
    )
    .await
    .unwrap();
    let mut due = new_job(&q, "t");
    due.run_at = Some(due.created_at + 1_000);
    let due = insert(&*s, due).await;
    assert_eq!(due.state, JobState::Scheduled);
    s.set_paused(&q, true, now()).await.unwrap();
    let free = insert(&*s, new_job(&other, "t")).await;
    assert!(matches!(start(&*s, free.id).await, StartOutcome::Run(_)));
    assert_eq!(
        start(&*s, done.id).await,
        StartOutcome::Skip(JobState::Succeeded)
    );
    assert_eq!(
        s.start(&[due.id], "w1", now() + micros(Duration::from_secs(1)))
            .await
            .unwrap(),
        vec![StartOutcome::Parked]
    );
    assert_eq!(
        s.get(due.id).await.unwrap().unwrap().state,
        JobState::Queued
    );
    // The running job finishes normally.
    let c = s
        .complete(
            &[Completion {
                id: r.id,
                epoch: r.epoch,
                outcome: Outcome::Succeeded(serde_json::json!(2)),
            }],
            now(),
        )
        .await
        .unwrap();
    assert!(matches!(
        c[0],
        Committed::Applied {
            state: JobState::Succeeded,
            ..
        }
    ));
}

/// A job's priority is stored, shown, and kept when its worker is lost and it is requeued.
pub async fn priority_is_stored_and_kept(s: Arc<dyn Store>) {
    let q = unique_queue("prio");
    let mut nj = new_job(&q, "t");
    nj.options.priority = Some(7);
    let ins = insert(&*s, nj).await;
    let mut low = new_job(&q, "t");
    low.options.priority = Some(-3);
    let low = insert(&*s, low).await;
    assert_eq!(s.get(low.id).await.unwrap().unwrap().priority, -3);
    assert_eq!(s.get(ins.id).await.unwrap().unwrap().priority, 7);
    let StartOutcome::Run(j) = start(&*s, ins.id).await else {
        panic!("not started")
    };
    assert_eq!(j.priority, 7);
    assert_eq!(
        s.mark_lost(ins.id, "w1", now()).await.unwrap(),
        Lost::Requeued
    );
    let j = s.get(ins.id).await.unwrap().unwrap();
    assert_eq!((j.state, j.priority), (JobState::Queued, 7));
    let plain = insert(&*s, new_job(&q, "t")).await;
    assert_eq!(s.get(plain.id).await.unwrap().unwrap().priority, 0);
}

fn unique(q: &str, args: serde_json::Value, window: Duration) -> crate::job::NewJob {
    let mut j = new_job(q, "t.unique");
    j.args = args;
    j.options.unique_for = Some(window);
    j
}

/// While an equal job is unfinished, enqueueing it again returns it; other args, another task
/// or another queue make a new job; so does a job enqueued without `unique_for`.
pub async fn unique_for_returns_the_same_job(s: Arc<dyn Store>) {
    let q = unique_queue("uniq");
    let w = Duration::from_secs(60);
    let first = insert(&*s, unique(&q, serde_json::json!({"a": 1, "b": [1, 2]}), w)).await;
    assert!(!first.existed);
    // The same args with keys in another order are the same args.
    let again = insert(&*s, unique(&q, serde_json::json!({"b": [1, 2], "a": 1}), w)).await;
    assert_eq!((again.id, again.existed), (first.id, true));
    assert!(!again.needs_dispatch());
    let other_args = insert(&*s, unique(&q, serde_json::json!({"a": 2, "b": [1, 2]}), w)).await;
    assert!(!other_args.existed);
    let mut other_task = unique(&q, serde_json::json!({"a": 1, "b": [1, 2]}), w);
    other_task.task = "t.other".into();
    assert!(!insert(&*s, other_task).await.existed);
    let other_queue = unique(
        &unique_queue("uniq2"),
        serde_json::json!({"a": 1, "b": [1, 2]}),
        w,
    );
    assert!(!insert(&*s, other_queue).await.existed);
    // Running still counts as the same job.
    let StartOutcome::Run(r) = start(&*s, first.id).await else {
        panic!("not started")
    };
    let again = insert(&*s, unique(&q, serde_json::json!({"a": 1, "b": [1, 2]}), w)).await;
    assert_eq!(
        (again.id, again.existed, again.state),
        (first.id, true, JobState::Running)
    );
    // Two equal unique jobs in one batch: one job.
    let batch = s
        .insert(vec![
            unique(&q, serde_json::json!({"batch": true}), w),
            unique(&q, serde_json::json!({"batch": true}), w),
        ])
        .await
        .unwrap();
    assert_eq!(batch[0].id, batch[1].id);
    assert!(!batch[0].existed && batch[1].existed);
    drop(r);
}

/// A finished job counts as the same job for `unique_for` after its finish; then a new one.
pub async fn unique_for_window_counts_from_the_finish(s: Arc<dyn Store>) {
    let q = unique_queue("uwin");
    let w = Duration::from_secs(5);
    let args = serde_json::json!({"k": "v"});
    let first = insert(&*s, unique(&q, args.clone(), w)).await;
    let StartOutcome::Run(r) = start(&*s, first.id).await else {
        panic!("not started")
    };
    let finish = now();
    s.complete(
        &[Completion {
            id: r.id,
            epoch: r.epoch,
            outcome: Outcome::Failed { error: "e".into() },
        }],
        finish,
    )
    .await
    .unwrap();
    // Within the window, measured from the finish.
    let mut inside = unique(&q, args.clone(), w);
    inside.created_at = finish + micros(Duration::from_secs(4));
    let got = insert(&*s, inside).await;
    assert_eq!(
        (got.id, got.existed, got.state),
        (first.id, true, JobState::Failed)
    );
    // Past it: a new job.
    let mut after = unique(&q, args.clone(), w);
    after.created_at = finish + micros(Duration::from_secs(6));
    let got = insert(&*s, after).await;
    assert!(!got.existed && got.id != first.id);
    // And that new, unfinished one is now the job returned, whatever the window.
    let mut tiny = unique(&q, args, Duration::from_secs(1));
    tiny.created_at = finish + micros(Duration::from_secs(600));
    assert_eq!(insert(&*s, tiny).await.id, got.id);
}

/// Many enqueues of one unique job at once, each its own call: exactly one job is created.
pub async fn concurrent_unique_enqueues_insert_once(s: Arc<dyn Store>) {
    let q = unique_queue("urace");
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let s = s.clone();
        let j = unique(&q, serde_json::json!({"race": 1}), Duration::from_secs(60));
        tasks.push(tokio::spawn(async move { s.insert(vec![j]).await }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap().expect("insert")[0].id);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let page = s
        .list(
            &JobFilter {
                queue: Some(q),
                ..Default::default()
            },
            None,
            100,
        )
        .await
        .unwrap();
    assert_eq!(page.jobs.len(), 1);
}
