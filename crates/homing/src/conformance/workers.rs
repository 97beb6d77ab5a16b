//! The worker view's store contract (docs/workers.md): what a worker registered with (version,
//! heartbeat TTL), when it ended, and which jobs were reclaimed from it when it was lost, each
//! recorded in the transaction that did it and deleted with the worker's row by retention.

use std::sync::Arc;

use super::{new_job, unique_queue};
use crate::job::JobState;
use crate::reclaim::ReclaimOutcome;
use crate::store::*;
use crate::time::now;

/// A worker's registration as the cases make it (tests outside the suites use it too).
pub fn info(id: &str, t: crate::time::Micros) -> WorkerInfo {
    WorkerInfo {
        id: id.to_string(),
        hostname: "h".into(),
        pid: 4242,
        queues: vec!["default".into()],
        concurrency: 3,
        tasks: vec!["t".into()],
        started_at: t,
        remote: None,
        version: Some("9.8.7".into()),
        heartbeat_ttl_ms: Some(600),
    }
}

async fn run(s: &dyn Store, id: crate::job::JobId, worker: &str) -> crate::job::Job {
    match s.start(&[id], worker, now()).await.unwrap().remove(0) {
        StartOutcome::Run(j) => *j,
        other => panic!("expected Run, got {other:?}"),
    }
}

pub async fn lost_worker_keeps_its_reclaims(s: Arc<dyn Store>) {
    // Whole milliseconds: timestamps travel as RFC 3339 with millisecond precision.
    let t = now() / 1000 * 1000;
    let lost = unique_queue("lostw");
    let stopped = unique_queue("stopw");
    s.register_worker(&info(&lost, t), t).await.unwrap();
    s.register_worker(&info(&stopped, t), t).await.unwrap();
    let q = unique_queue("reclaim");
    let requeued = new_job(&q, "t");
    let mut dead = new_job(&q, "t");
    dead.options.max_crashes = Some(1);
    let cancelled = new_job(&q, "t");
    let other = new_job(&q, "t");
    s.insert(vec![
        requeued.clone(),
        dead.clone(),
        cancelled.clone(),
        other.clone(),
    ])
    .await
    .unwrap();
    let r = run(&*s, requeued.id, &lost).await;
    let d = run(&*s, dead.id, &lost).await;
    let c = run(&*s, cancelled.id, &lost).await;
    run(&*s, other.id, &stopped).await;
    s.cancel(cancelled.id, now()).await.unwrap();

    let at = t + 5_000;
    assert_eq!(
        s.mark_lost(requeued.id, &lost, at).await.unwrap(),
        Lost::Requeued
    );
    assert_eq!(s.mark_lost(dead.id, &lost, at).await.unwrap(), Lost::Dead);
    assert_eq!(
        s.mark_lost(cancelled.id, &lost, at).await.unwrap(),
        Lost::Cancelled
    );
    // A second rescuer finds nothing of its own: no second reclaim.
    assert_eq!(
        s.mark_lost(requeued.id, &lost, at + 1).await.unwrap(),
        Lost::NotOwned(JobState::Queued)
    );
    // Not this worker's job: nothing is recorded against it.
    assert_eq!(
        s.mark_lost(other.id, &lost, at).await.unwrap(),
        Lost::NotOwned(JobState::Running)
    );
    let live = s.worker(&lost).await.unwrap().expect("the worker is kept");
    assert_eq!(live.status, WorkerStatus::Live);
    assert_eq!((live.ended_at, live.presumed_dead_at), (None, None));
    assert_eq!(live.reclaimed.len(), 3, "{:?}", live.reclaimed);

    assert!(s
        .worker_gone(&lost, WorkerStatus::Lost, None, at + 10)
        .await
        .unwrap());
    assert!(s
        .worker_gone(&stopped, WorkerStatus::Stopped, None, at + 20)
        .await
        .unwrap());
    // A later declaration changes nothing, its time included.
    assert!(!s
        .worker_gone(&lost, WorkerStatus::Lost, None, at + 99)
        .await
        .unwrap());

    let w = s.worker(&lost).await.unwrap().unwrap();
    assert_eq!(w.status, WorkerStatus::Lost);
    assert_eq!(w.ended_at, Some(at + 10));
    assert_eq!(w.info, info(&lost, t), "version and TTL round-trip");
    let mut got: Vec<_> = w
        .reclaimed
        .iter()
        .map(|r| (r.job, r.epoch, r.outcome, r.at))
        .collect();
    got.sort_by_key(|g| g.0);
    let mut want = vec![
        (requeued.id, r.epoch, ReclaimOutcome::Requeued, at),
        (dead.id, d.epoch, ReclaimOutcome::Dead, at),
        (cancelled.id, c.epoch, ReclaimOutcome::Cancelled, at),
    ];
    want.sort_by_key(|g| g.0);
    assert_eq!(got, want);
    // The listing carries the same record.
    let listed = s.workers(t - 1).await.unwrap();
    let lw = listed.iter().find(|x| x.info.id == lost).unwrap();
    assert_eq!(lw, &w);

    let st = s.worker(&stopped).await.unwrap().unwrap();
    assert_eq!(st.status, WorkerStatus::Stopped);
    assert_eq!(st.ended_at, Some(at + 20));
    assert!(st.reclaimed.is_empty());
    assert_eq!(st.running, vec![other.id]);
    assert!(s.worker("no-such-worker").await.unwrap().is_none());

    // Retention: the departed workers go, and the reclaims with them.
    // After the departures' own times, which lie ahead of the clock when the case runs in
    // under 5 ms.
    let p = s.purge(now().max(at + 20) + 1, 100).await.unwrap();
    assert!(p.workers >= 5, "two workers and three reclaims: {p:?}");
    assert!(s.worker(&lost).await.unwrap().is_none());
    assert!(s.worker(&stopped).await.unwrap().is_none());
    // Registering the same id again starts a clean record.
    s.register_worker(&info(&lost, t), t).await.unwrap();
    let again = s.worker(&lost).await.unwrap().unwrap();
    assert!(again.reclaimed.is_empty() && again.ended_at.is_none());
}

/// A worker presumed dead that has not noticed takes back what the rescuers put back. The
/// store records what ran under it when it was first presumed dead, and only those runs count a
/// crash; and it starts nothing for that worker afterwards ([`StartOutcome::Presumed`]), so a
/// job it takes back is neither run twice nor spent. No clocks are compared: a run stamped with
/// a clock far ahead still counts, and a start stamped far behind the presumption is still
/// refused. (A run the record missed would be taken back without a crash:
/// tests/conformance_sqlite.rs makes one by hand; tests/conformance_postgres.rs races starts
/// against presumptions.)
pub async fn a_worker_presumed_dead_starts_nothing_and_only_its_recorded_runs_crash(
    s: Arc<dyn Store>,
) {
    let w = unique_queue("zombie");
    let t = now();
    s.register_worker(&info(&w, t), t).await.unwrap();
    let q = unique_queue("presumed");
    let mut job = new_job(&q, "t");
    job.options.max_crashes = Some(2);
    let mut ahead = new_job(&q, "t");
    ahead.options.max_crashes = Some(1);
    let (id, ahead_id) = (job.id, ahead.id);
    s.insert(vec![job, ahead]).await.unwrap();
    run(&*s, id, &w).await;
    // Started by a worker whose clock is an hour ahead of the rescuers'.
    match s
        .start(&[ahead_id], &w, now() + 3_600_000_000)
        .await
        .unwrap()
        .remove(0)
    {
        StartOutcome::Run(_) => {}
        other => panic!("expected Run, got {other:?}"),
    }

    let since = now();
    assert_eq!(s.presume_lost(&w, since).await.unwrap(), Presumption::Made);
    // Later calls, from this rescuer or another, change nothing.
    assert_eq!(
        s.presume_lost(&w, since + 3_600_000_000).await.unwrap(),
        Presumption::Made
    );
    let view = s.worker(&w).await.unwrap().unwrap();
    let at = view.presumed_dead_at.expect("presumed_dead_at");
    assert!(at >= since && at <= now(), "{at} against {since}");

    // The runs it had count their crash, whatever their clocks said.
    let (lost, _) = s.mark_lost_unparking(id, &w, true, now()).await.unwrap();
    assert_eq!(lost, Lost::Requeued);
    assert_eq!(s.get(id).await.unwrap().unwrap().crashes, 1);
    let (lost, _) = s
        .mark_lost_unparking(ahead_id, &w, true, now())
        .await
        .unwrap();
    assert_eq!(lost, Lost::Dead, "a real crash left uncounted");
    // Taken back by the worker that has not noticed, once with a clock an hour behind: nothing
    // starts, nothing is written, and a live worker starts it next.
    let before = s.get(id).await.unwrap().unwrap();
    for at in [now(), since - 3_600_000_000] {
        assert_eq!(
            s.start(&[id, id], &w, at).await.unwrap(),
            vec![StartOutcome::Presumed, StartOutcome::Presumed],
            "a start by a worker presumed dead"
        );
        assert_eq!(s.get(id).await.unwrap().unwrap(), before);
    }
    let live = unique_queue("live");
    s.register_worker(&info(&live, t), t).await.unwrap();
    let next = run(&*s, id, &live).await;
    assert_eq!((next.epoch, next.crashes), (before.epoch + 1, 1));
    // The timeline has one crash and agrees with the row.
    let h = s.history(id).await.unwrap();
    let j = s.get(id).await.unwrap().unwrap();
    assert_eq!(
        crate::history::disagreement(&j, &h),
        None,
        "{:#?}",
        h.entries
    );
    use crate::history::Kind;
    let kinds: Vec<_> = h.entries.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == Kind::Crashed).count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(s.worker(&w).await.unwrap().unwrap().reclaimed.len(), 2);
    // Without `presumed` (a live remote session's unheld job) the crash counts, and spends it.
    assert_eq!(s.mark_lost(id, &live, now()).await.unwrap(), Lost::Dead);

    // A worker with no record: its crashes count.
    let unknown = unique_queue("never-registered");
    let other = new_job(&q, "t");
    let other_id = other.id;
    s.insert(vec![other]).await.unwrap();
    s.presume_lost(&unknown, now()).await.unwrap();
    run(&*s, other_id, &unknown).await;
    s.mark_lost_unparking(other_id, &unknown, true, now())
        .await
        .unwrap();
    assert_eq!(s.get(other_id).await.unwrap().unwrap().crashes, 1);

    // Registering the id again starts a clean record, this time included.
    s.register_worker(&info(&w, t), now()).await.unwrap();
    let again = s.worker(&w).await.unwrap().unwrap();
    assert_eq!((again.presumed_dead_at, again.ended_at), (None, None));
    let fresh = new_job(&q, "t");
    let fresh_id = fresh.id;
    s.insert(vec![fresh]).await.unwrap();
    run(&*s, fresh_id, &w).await;
}
