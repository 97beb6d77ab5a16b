//! Job timelines (docs/timeline.md), for every store: a backend's test file invokes
//! [`timeline_conformance!`](crate::timeline_conformance) beside the store suite. Each case
//! drives transitions through the store and checks the entries they leave: which kind, state,
//! epoch and worker, and that a refused (zombie) write leaves none.

use std::sync::Arc;

use super::{new_job, unique_queue};
use crate::history::{disagreement, Entry, Kind, PROGRESS_PER_RUN};
use crate::job::{JobId, JobState};
use crate::store::*;
use crate::time::now;

/// Generates one `#[tokio::test]` per case; `$make` makes a fresh store.
#[macro_export]
macro_rules! timeline_conformance {
    ($make:expr) => {
        $crate::__conformance_cases!(timeline, $make;
            every_run_crash_and_outcome_leaves_its_entry, refused_writes_leave_no_entry,
            operator_actions_and_schedules_leave_entries, progress_is_capped_per_run,
            timeline_is_bounded_and_goes_with_its_job, an_enqueue_met_again_adds_no_entry
        );
    };
}

async fn start(s: &dyn Store, id: JobId, worker: &str) -> crate::job::Job {
    match s.start(&[id], worker, now()).await.unwrap().remove(0) {
        StartOutcome::Run(j) => *j,
        other => panic!("expected Run, got {other:?}"),
    }
}

async fn complete(s: &dyn Store, id: JobId, epoch: u64, outcome: Outcome) -> Committed {
    s.complete(&[Completion { id, epoch, outcome }], now())
        .await
        .unwrap()
        .remove(0)
}

fn kinds(entries: &[Entry]) -> Vec<Kind> {
    entries.iter().map(|e| e.kind).collect()
}

async fn consistent(s: &dyn Store, id: JobId) -> Vec<Entry> {
    let h = s.history(id).await.unwrap();
    let job = s.get(id).await.unwrap().unwrap();
    assert_eq!(disagreement(&job, &h), None, "{:#?}", h.entries);
    h.entries
}

/// A job met again by its idempotency key leaves the stored job's timeline as it was and the
/// refused job none: the `enqueued` entry is written with the job's row and only with it. The
/// later inserts go to a queue the store knows already, the path on which PostgreSQL writes the
/// rows and their entries in one statement.
pub async fn an_enqueue_met_again_adds_no_entry(s: Arc<dyn Store>) {
    let q = unique_queue("again");
    let mut first = new_job(&q, "t");
    first.options.idempotency_key = Some(unique_queue("key"));
    let key = first.options.idempotency_key.clone();
    let first_id = first.id;
    s.insert(vec![first]).await.unwrap();
    let second = new_job(&q, "t");
    let second_id = second.id;
    assert!(!s.insert(vec![second]).await.unwrap()[0].existed);
    let mut same_key = new_job(&q, "t");
    same_key.options.idempotency_key = key;
    let refused = same_key.id;
    let out = s.insert(vec![same_key]).await.unwrap();
    assert_eq!((out[0].id, out[0].existed), (first_id, true));
    for id in [first_id, second_id] {
        let e = consistent(&*s, id).await;
        assert_eq!(kinds(&e), [Kind::Enqueued], "job {id}");
    }
    assert!(s.history(refused).await.unwrap().entries.is_empty());
}

/// Fails once (retry scheduled), crashes once, then succeeds: each step's entry carries the
/// run's epoch and worker, and the timeline agrees with the row throughout.
pub async fn every_run_crash_and_outcome_leaves_its_entry(s: Arc<dyn Store>) {
    let q = unique_queue("tl");
    let mut nj = new_job(&q, "t");
    nj.options.max_retries = Some(3);
    let id = nj.id;
    s.insert(vec![nj]).await.unwrap();
    let e = consistent(&*s, id).await;
    assert_eq!(kinds(&e), [Kind::Enqueued]);
    assert_eq!(
        (e[0].state, e[0].worker.as_deref()),
        (JobState::Queued, None)
    );

    let run1 = start(&*s, id, "w-a").await;
    assert!(s
        .set_progress(id, run1.epoch, serde_json::json!({"fraction": 0.5}))
        .await
        .unwrap());
    let at = now() - 1;
    let failed = Outcome::Retry {
        error: "boom\nTraceback (most recent call last): line 1".into(),
        at,
    };
    assert!(matches!(
        complete(&*s, id, run1.epoch, failed).await,
        Committed::Applied { .. }
    ));
    let e = consistent(&*s, id).await;
    assert_eq!(
        kinds(&e),
        [
            Kind::Enqueued,
            Kind::Started,
            Kind::Progress,
            Kind::RetryScheduled
        ]
    );
    assert_eq!(
        (e[1].epoch, e[1].worker.as_deref()),
        (Some(run1.epoch), Some("w-a"))
    );
    assert_eq!(e[2].data, Some(serde_json::json!({"fraction": 0.5})));
    let retry = &e[3];
    assert_eq!(
        (retry.epoch, retry.worker.as_deref()),
        (Some(run1.epoch), Some("w-a"))
    );
    assert_eq!((retry.state, retry.attempts), (JobState::Scheduled, 1));
    assert!(retry.message.as_deref().unwrap().contains("Traceback"));
    assert_eq!(
        retry.data,
        Some(serde_json::json!({"at": crate::time::rfc3339(at)}))
    );

    assert_eq!(s.claim_due(now(), 100).await.unwrap().len(), 1);
    let run2 = start(&*s, id, "w-b").await;
    assert_eq!(s.mark_lost(id, "w-b", now()).await.unwrap(), Lost::Requeued);
    let run3 = start(&*s, id, "w-c").await;
    assert!(matches!(
        complete(
            &*s,
            id,
            run3.epoch,
            Outcome::Succeeded(serde_json::json!({"ok": 1}))
        )
        .await,
        Committed::Applied { .. }
    ));
    let e = consistent(&*s, id).await;
    assert_eq!(
        kinds(&e[4..]),
        [
            Kind::Due,
            Kind::Started,
            Kind::Crashed,
            Kind::Started,
            Kind::Succeeded
        ]
    );
    let crash = &e[6];
    assert_eq!(
        (
            crash.epoch,
            crash.worker.as_deref(),
            crash.state,
            crash.crashes
        ),
        (Some(run2.epoch), Some("w-b"), JobState::Queued, 1)
    );
    let done = &e[8];
    assert_eq!(
        (done.epoch, done.worker.as_deref(), done.state),
        (Some(run3.epoch), Some("w-c"), JobState::Succeeded)
    );
    assert_eq!(done.data, Some(serde_json::json!({"ok": 1})));
    let starts: Vec<u64> = e
        .iter()
        .filter(|e| e.kind == Kind::Started)
        .filter_map(|e| e.epoch)
        .collect();
    assert_eq!(starts, [run1.epoch, run2.epoch, run3.epoch]);
    assert!(run1.epoch < run2.epoch && run2.epoch < run3.epoch);
}

/// A zombie's completion, a second rescuer, a stale progress report and a start of a running
/// job are refused by the store, and leave no entry.
pub async fn refused_writes_leave_no_entry(s: Arc<dyn Store>) {
    let q = unique_queue("tlz");
    let nj = new_job(&q, "t");
    let id = nj.id;
    s.insert(vec![nj]).await.unwrap();
    let zombie = start(&*s, id, "zombie").await;
    assert_eq!(
        s.mark_lost(id, "zombie", now()).await.unwrap(),
        Lost::Requeued
    );
    let before = s.history(id).await.unwrap().entries.len();
    let current = start(&*s, id, "w2").await;
    let after_start = s.history(id).await.unwrap().entries.len();
    assert_eq!(after_start, before + 1);
    // Refused: the zombie's outcome, its progress, a rescuer naming the old worker, a start of
    // a running job.
    assert_eq!(
        complete(&*s, id, zombie.epoch, Outcome::Failed { error: "z".into() }).await,
        Committed::Stale
    );
    assert!(!s
        .set_progress(id, zombie.epoch, serde_json::json!(1))
        .await
        .unwrap());
    assert_eq!(
        s.mark_lost(id, "zombie", now()).await.unwrap(),
        Lost::NotOwned(JobState::Running)
    );
    assert!(matches!(
        s.start(&[id], "w3", now()).await.unwrap()[0],
        StartOutcome::Skip(JobState::Running)
    ));
    let e = consistent(&*s, id).await;
    assert_eq!(e.len(), after_start, "refused writes left entries: {e:#?}");
    // Exactly one crash entry, for the zombie's run, under the worker presumed dead.
    let crashes: Vec<&Entry> = e.iter().filter(|e| e.kind == Kind::Crashed).collect();
    assert_eq!(crashes.len(), 1);
    assert_eq!(
        (crashes[0].epoch, crashes[0].worker.as_deref()),
        (Some(zombie.epoch), Some("zombie"))
    );
    assert_eq!(e.last().unwrap().epoch, Some(current.epoch));
}

/// Cancel (a queued job; a running one: request, then the handler's cancelled outcome), an
/// operator's retry, a snooze and a release each leave their entry.
pub async fn operator_actions_and_schedules_leave_entries(s: Arc<dyn Store>) {
    let q = unique_queue("tlo");
    let a = new_job(&q, "t");
    let mut b = new_job(&q, "t");
    b.run_at = Some(now() + 60_000_000);
    let (a, b) = (a.id, b);
    let bid = b.id;
    s.insert(vec![new_job_with_id(&q, a), b]).await.unwrap();
    let e = consistent(&*s, bid).await;
    assert_eq!(
        (e[0].kind, e[0].state),
        (Kind::Enqueued, JobState::Scheduled)
    );
    assert!(e[0].data.as_ref().unwrap()["at"].is_string());
    s.cancel(bid, now()).await.unwrap();
    let e = consistent(&*s, bid).await;
    assert_eq!(kinds(&e), [Kind::Enqueued, Kind::Cancelled]);
    assert_eq!(e[1].epoch, None, "no run is concerned");
    s.retry(bid, now()).await.unwrap();
    let e = consistent(&*s, bid).await;
    assert_eq!(kinds(&e[2..]), [Kind::Retried]);
    assert_eq!(e[2].state, JobState::Queued);

    let run = start(&*s, a, "w").await;
    complete(&*s, a, run.epoch, Outcome::Snooze { at: now() - 1 }).await;
    s.claim_due(now(), 100).await.unwrap();
    let run = start(&*s, a, "w").await;
    complete(&*s, a, run.epoch, Outcome::Released).await;
    let run = start(&*s, a, "w").await;
    s.cancel(a, now()).await.unwrap();
    complete(&*s, a, run.epoch, Outcome::Cancelled).await;
    let e = consistent(&*s, a).await;
    assert_eq!(
        kinds(&e),
        [
            Kind::Enqueued,
            Kind::Started,
            Kind::Snoozed,
            Kind::Due,
            Kind::Started,
            Kind::Released,
            Kind::Started,
            Kind::CancelRequested,
            Kind::Cancelled,
        ]
    );
    assert_eq!(
        e[5].worker.as_deref(),
        Some("w"),
        "a release names its worker"
    );
    assert_eq!(
        (e[8].epoch, e[8].state),
        (Some(run.epoch), JobState::Cancelled)
    );
}

fn new_job_with_id(q: &str, id: JobId) -> crate::job::NewJob {
    let mut j = new_job(q, "t");
    j.id = id;
    j
}

/// A chatty handler keeps at most PROGRESS_PER_RUN entries per run, the last holding the
/// latest value.
pub async fn progress_is_capped_per_run(s: Arc<dyn Store>) {
    let q = unique_queue("tlp");
    let nj = new_job(&q, "t");
    let id = nj.id;
    s.insert(vec![nj]).await.unwrap();
    let run = start(&*s, id, "w").await;
    let reports = PROGRESS_PER_RUN + 15;
    for i in 0..reports {
        assert!(s
            .set_progress(id, run.epoch, serde_json::json!({"i": i}))
            .await
            .unwrap());
    }
    let e = consistent(&*s, id).await;
    let progress: Vec<&Entry> = e.iter().filter(|e| e.kind == Kind::Progress).collect();
    assert_eq!(progress.len(), PROGRESS_PER_RUN);
    assert_eq!(
        progress.last().unwrap().data,
        Some(serde_json::json!({"i": reports - 1}))
    );
    assert_eq!(kinds(&e[..2]), [Kind::Enqueued, Kind::Started]);
}

/// A timeline keeps its first entry and the latest KEEP_LATEST, and is deleted with its job.
pub async fn timeline_is_bounded_and_goes_with_its_job(s: Arc<dyn Store>) {
    let q = unique_queue("tlb");
    let nj = new_job(&q, "t");
    let id = nj.id;
    s.insert(vec![nj]).await.unwrap();
    // Each round: start, snooze, due = 3 entries.
    let rounds = crate::history::KEEP_LATEST / 3 + 5;
    for _ in 0..rounds {
        let run = start(&*s, id, "w").await;
        complete(&*s, id, run.epoch, Outcome::Snooze { at: now() - 1 }).await;
        s.claim_due(now(), 1000).await.unwrap();
    }
    let run = start(&*s, id, "w").await;
    complete(&*s, id, run.epoch, Outcome::Succeeded(serde_json::json!(1))).await;
    let h = s.history(id).await.unwrap();
    // Trimmed at each start to the first and the latest KEEP_LATEST (the start's own entry
    // among them); the run's end adds one more. Exact: one entry kept too many or too few is
    // a trim that is off by one.
    assert_eq!(
        h.entries.len(),
        1 + crate::history::KEEP_LATEST + 1,
        "{} entries",
        h.entries.len()
    );
    assert!(h.truncated);
    assert_eq!(h.entries[0].kind, Kind::Enqueued, "the first entry is kept");
    assert_eq!(h.entries.last().unwrap().kind, Kind::Succeeded);
    let job = s.get(id).await.unwrap().unwrap();
    assert_eq!(disagreement(&job, &h), None);
    assert!(s.purge(now() + 1, 1000).await.unwrap().jobs >= 1);
    assert!(s.get(id).await.unwrap().is_none());
    assert!(
        s.history(id).await.unwrap().entries.is_empty(),
        "the pruner deletes the timeline with its job"
    );
}
