//! The charts' rollups (docs/charts.md), for every store: a backend's test file invokes
//! [`stats_conformance!`](crate::stats_conformance) beside the store suite. Jobs are run with
//! explicit clocks a fixed time ago, so each case knows exactly which minute each job ends in.

use std::sync::Arc;

use super::{new_job, unique_queue};
use crate::job::JobId;
use crate::stats::{self, floor, Range, HOUR, MINUTE, RUN, WAIT};
use crate::store::*;

/// Generates one `#[tokio::test]` per case; `$make` makes a fresh store, as for
/// [`store_conformance!`](crate::store_conformance).
#[macro_export]
macro_rules! stats_conformance {
    ($make:expr) => {
        $crate::__conformance_cases!(stats, $make;
            rollups_count_each_outcome_once_however_often_they_run,
            depth_keeps_the_highest_sample_and_rollups_are_pruned,
            the_rollup_pass_catches_up_and_recounts_late_completions
        );
    };
}

/// A fixed minute in 2026, five minutes into its hour.
const T: i64 = 1_767_225_600_000_000 + 5 * MINUTE;
const S: i64 = 1_000_000;

async fn start(s: &dyn Store, id: JobId, at: i64) -> u64 {
    match s.start(&[id], "w", at).await.unwrap().remove(0) {
        StartOutcome::Run(j) => j.epoch,
        other => panic!("expected Run, got {other:?}"),
    }
}

async fn end(s: &dyn Store, id: JobId, epoch: u64, outcome: Outcome, at: i64) {
    let c = Completion { id, epoch, outcome };
    s.complete(&[c], at).await.unwrap();
}

fn mine(rows: &stats::Rows, q: &str) -> Vec<(i64, u64, u64, u64, u64, u64)> {
    let mut v: Vec<_> = rows
        .counts
        .iter()
        .filter(|r| r.queue == q)
        .map(|r| (r.at, r.succeeded, r.failed, r.dead, r.cancelled, r.retried))
        .collect();
    v.sort();
    v
}

fn latency_total(rows: &stats::Rows, q: &str, kind: &str) -> u64 {
    rows.latency
        .iter()
        .filter(|r| r.queue == q && r.kind == kind)
        .map(|r| r.n)
        .sum()
}

/// Succeeded, failed, retried-then-succeeded and dead jobs land in the minute they finished,
/// each counted once; the hour is the sum of its minutes; running the same rollup again (or an
/// overlapping one) gives the same rows; the cursor only moves forward.
pub async fn rollups_count_each_outcome_once_however_often_they_run(s: Arc<dyn Store>) {
    let q = unique_queue("stats");
    let mk = |offset: i64| {
        let mut j = new_job(&q, "t");
        j.created_at = T + offset;
        j
    };
    let (a, b, c, d, e) = (mk(0), mk(0), mk(0), mk(0), mk(61 * S));
    s.insert(vec![a.clone(), b.clone(), c.clone(), d.clone(), e.clone()])
        .await
        .unwrap();
    // a: waits 1 s, runs 0.5 s, succeeds.
    let ep = start(&*s, a.id, T + S).await;
    end(
        &*s,
        a.id,
        ep,
        Outcome::Succeeded(serde_json::json!(1)),
        T + 3 * S / 2,
    )
    .await;
    // b: fails for good.
    let ep = start(&*s, b.id, T + S).await;
    let failed = Outcome::Failed { error: "x".into() };
    end(&*s, b.id, ep, failed, T + 2 * S).await;
    // c: a handler error, retried at T+3s, then succeeds.
    let ep = start(&*s, c.id, T + S).await;
    let retry = Outcome::Retry {
        error: "again".into(),
        at: T + 3 * S,
    };
    end(&*s, c.id, ep, retry, T + 2 * S).await;
    assert_eq!(s.claim_due(T + 3 * S, 10).await.unwrap().len(), 1);
    let ep = start(&*s, c.id, T + 3 * S).await;
    end(
        &*s,
        c.id,
        ep,
        Outcome::Succeeded(serde_json::json!(2)),
        T + 4 * S,
    )
    .await;
    // d: dead in the next minute; e: succeeds in the next minute too.
    assert!(s.mark_dead(d.id, "gone", T + 70 * S).await.unwrap());
    let ep = start(&*s, e.id, T + 62 * S).await;
    end(
        &*s,
        e.id,
        ep,
        Outcome::Succeeded(serde_json::json!(3)),
        T + 65 * S,
    )
    .await;

    assert_eq!(s.stats_cursor().await.unwrap(), None);
    s.roll_up(T, T + 2 * MINUTE, T + 2 * MINUTE).await.unwrap();
    let minutes = s.stats_rows(60, T, T + 2 * MINUTE).await.unwrap();
    let want = vec![(T, 2, 1, 0, 0, 1), (T + MINUTE, 1, 0, 1, 0, 0)];
    assert_eq!(mine(&minutes, &q), want);
    // Latencies of the jobs that ran to an end: a, b, c in the first minute, e in the second.
    assert_eq!(latency_total(&minutes, &q, WAIT), 4);
    assert_eq!(latency_total(&minutes, &q, RUN), 4);
    let s1 = stats::series(Range::Hour, T + 2 * MINUTE, Some(&q), &minutes);
    let i = s1.t.iter().position(|t| *t == T / S).unwrap();
    // Runs of 0.5 s, 1 s and 1 s: the median is in the [1 s, 2 s) bucket.
    let p50 = s1.run_p50_ms[i].unwrap();
    assert!((1000.0..=2000.0).contains(&p50), "run p50 {p50}");
    let w99 = s1.wait_p99_ms[i].unwrap();
    assert!((1000.0..=2000.0).contains(&w99), "wait p99 {w99}");

    // Again, and overlapping: the same rows, nothing doubled.
    s.roll_up(T, T + 2 * MINUTE, T + 2 * MINUTE).await.unwrap();
    s.roll_up(T + MINUTE, T + 3 * MINUTE, T + MINUTE)
        .await
        .unwrap();
    let again = s.stats_rows(60, T, T + 3 * MINUTE).await.unwrap();
    assert_eq!(mine(&again, &q), want);
    assert_eq!(latency_total(&again, &q, RUN), 4);
    let hour = floor(T, HOUR);
    let hours = s.stats_rows(3600, hour, hour + HOUR).await.unwrap();
    assert_eq!(mine(&hours, &q), vec![(hour, 3, 1, 1, 0, 1)]);
    assert_eq!(latency_total(&hours, &q, WAIT), 4);
    // The cursor went to T+2min and a later call with an older `closed` left it there; the
    // live point is where the last call's minutes ended.
    let c = s.stats_cursor().await.unwrap().unwrap();
    assert_eq!((c.closed, c.live), (T + 2 * MINUTE, T + 3 * MINUTE));
}

/// Depth keeps the highest sample of its minute and hour; the pruner's `purge` removes rollup
/// rows of periods that started before its cut-off and counts them, and keeps the later ones.
pub async fn depth_keeps_the_highest_sample_and_rollups_are_pruned(s: Arc<dyn Store>) {
    let q = unique_queue("depth");
    let jobs: Vec<_> = (0..3).map(|_| new_job(&q, "t")).collect();
    s.insert(jobs.clone()).await.unwrap();
    s.sample_depth(T + S).await.unwrap();
    let ep = start(&*s, jobs[0].id, T + 2 * S).await;
    end(
        &*s,
        jobs[0].id,
        ep,
        Outcome::Succeeded(serde_json::json!(1)),
        T + 3 * S,
    )
    .await;
    s.sample_depth(T + 10 * S).await.unwrap();
    s.sample_depth(T + MINUTE + S).await.unwrap();
    let rows = s.stats_rows(60, T, T + 2 * MINUTE).await.unwrap();
    let mut depth: Vec<_> = rows
        .depth
        .iter()
        .filter(|r| r.queue == q)
        .map(|r| (r.at, r.depth))
        .collect();
    depth.sort();
    assert_eq!(depth, vec![(T, 3), (T + MINUTE, 2)]);
    let hour = floor(T, HOUR);
    let rows = s.stats_rows(3600, hour, hour + HOUR).await.unwrap();
    assert_eq!(rows.depth.len(), 1);
    assert_eq!((rows.depth[0].at, rows.depth[0].depth), (hour, 3));

    s.roll_up(T, T + MINUTE, T + MINUTE).await.unwrap();
    let before = s.stats_rows(60, T, T + MINUTE).await.unwrap();
    assert_eq!(mine(&before, &q), vec![(T, 1, 0, 0, 0, 0)]);
    // Cut between the two minutes: the first minute's rows (counts, latency, depth) and
    // the hour's (which starts before it) go; the second minute's depth stays.
    let p = s.purge(T + MINUTE, 1000).await.unwrap();
    assert!(p.stats >= 5, "{p:?}");
    let after = s.stats_rows(60, T, T + 2 * MINUTE).await.unwrap();
    assert!(
        after.counts.is_empty() && after.latency.is_empty(),
        "{after:?}"
    );
    assert_eq!(after.depth.len(), 1);
    assert_eq!(after.depth[0].at, T + MINUTE);
    let hours = s.stats_rows(3600, hour, hour + HOUR).await.unwrap();
    assert_eq!(hours, stats::Rows::default());
}

/// The maintenance loop's pass: the first one rolls up the history within the retention, the
/// open minute up to the pass's time (live charts, and the live point the queue list counts on
/// from: a finish after it is left to the jobs) while the closed cursor stops at the last
/// closed minute; a completion committed after its minute was rolled up is counted by the next
/// pass, once.
pub async fn the_rollup_pass_catches_up_and_recounts_late_completions(s: Arc<dyn Store>) {
    use crate::maintenance::rollup::pass;
    let stop = tokio_util::sync::CancellationToken::new();
    let retention = Some(std::time::Duration::from_secs(3600));
    let q = unique_queue("pass");
    let jobs: Vec<_> = (0..4)
        .map(|_| {
            let mut j = new_job(&q, "t");
            j.created_at = T;
            j
        })
        .collect();
    s.insert(jobs.clone()).await.unwrap();
    let ok = || Outcome::Succeeded(serde_json::json!(1));
    let ep = start(&*s, jobs[0].id, T + S).await;
    end(&*s, jobs[0].id, ep, ok(), T + 2 * S).await;
    let ep = start(&*s, jobs[1].id, T + MINUTE + S).await;
    end(&*s, jobs[1].id, ep, ok(), T + MINUTE + 2 * S).await;
    // The third starts now but its end, at T+30s, commits only after the first pass.
    let late = start(&*s, jobs[2].id, T + 20 * S).await;
    // The fourth ends (by its clock) after the first pass's time but commits before it.
    let ep = start(&*s, jobs[3].id, T + MINUTE + 20 * S).await;
    end(&*s, jobs[3].id, ep, ok(), T + MINUTE + 30 * S).await;

    pass(&*s, retention, T + MINUTE + 10 * S, &stop)
        .await
        .unwrap();
    let c = s.stats_cursor().await.unwrap().unwrap();
    assert_eq!((c.closed, c.live), (T + MINUTE, T + MINUTE + 10 * S));
    let rows = s.stats_rows(60, T, T + 2 * MINUTE).await.unwrap();
    let got: Vec<_> = mine(&rows, &q).iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(got, vec![(T, 1), (T + MINUTE, 1)]);
    // The pass sampled the depth: nothing queued on this queue, so no row.
    assert!(rows.depth.iter().all(|r| r.queue != q), "{rows:?}");

    end(&*s, jobs[2].id, late, ok(), T + 30 * S).await;
    pass(&*s, retention, T + 2 * MINUTE + 10 * S, &stop)
        .await
        .unwrap();
    pass(&*s, retention, T + 2 * MINUTE + 20 * S, &stop)
        .await
        .unwrap();
    let c = s.stats_cursor().await.unwrap().unwrap();
    assert_eq!(
        (c.closed, c.live),
        (T + 2 * MINUTE, T + 2 * MINUTE + 20 * S)
    );
    let rows = s.stats_rows(60, T, T + 3 * MINUTE).await.unwrap();
    let got: Vec<_> = mine(&rows, &q).iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(got, vec![(T, 2), (T + MINUTE, 2)]);
    let hour = floor(T, HOUR);
    let hours = s.stats_rows(3600, hour, hour + HOUR).await.unwrap();
    assert_eq!(mine(&hours, &q), vec![(hour, 4, 0, 0, 0, 0)]);
}
