//! Cluster-wide limits (docs/limits.md), for every store: a backend's test file invokes
//! [`cluster_limits_conformance!`](crate::cluster_limits_conformance) beside the store suite.

use std::sync::Arc;
use std::time::Duration;

use super::{new_job, unique_queue};
use crate::job::{Job, JobId, JobState};
use crate::limit::{QueueLimits, Rate};
use crate::store::*;
use crate::time::{micros, now};

/// Generates one `#[tokio::test]` per case; `$make` makes a fresh store, as for
/// [`store_conformance!`](crate::store_conformance).
#[macro_export]
macro_rules! cluster_limits_conformance {
    ($make:expr) => {
        $crate::__conformance_cases!(cluster_limits, $make;
            concurrency_limit_parks_and_a_release_unparks, key_limit_partitions_by_argument,
            rate_limit_counts_starts_in_its_window, rate_windows_are_aligned_and_count_batches,
            a_rescue_frees_the_slot,
            concurrent_starts_never_exceed_the_limit, limits_are_shown_changed_and_cleared,
            failure_retry_and_cancel_free_the_slot
        );
    };
}

fn concurrency(n: u32) -> QueueLimits {
    QueueLimits {
        concurrency: Some(n),
        ..Default::default()
    }
}

async fn enqueue(s: &dyn Store, q: &str, args: serde_json::Value) -> JobId {
    let mut j = new_job(q, "t");
    j.args = args;
    let id = s.insert(vec![j]).await.expect("insert").remove(0).id;
    s.mark_dispatched(&[id]).await.unwrap();
    id
}

async fn start_one(s: &dyn Store, id: JobId) -> StartOutcome {
    s.start(&[id], "w1", now()).await.expect("start").remove(0)
}

fn ran(o: &StartOutcome) -> Job {
    match o {
        StartOutcome::Run(j) => (**j).clone(),
        other => panic!("expected a run, got {other:?}"),
    }
}

async fn succeed(s: &dyn Store, j: &Job) -> Vec<ToPublish> {
    match s
        .complete(
            &[Completion {
                id: j.id,
                epoch: j.epoch,
                outcome: Outcome::Succeeded(serde_json::json!(null)),
            }],
            now(),
        )
        .await
        .unwrap()
        .remove(0)
    {
        Committed::Applied { dispatch, .. } => dispatch,
        other => panic!("not applied: {other:?}"),
    }
}

async fn outbox_has(s: &dyn Store, id: JobId) -> bool {
    s.undispatched(now() + micros(Duration::from_secs(3600)), 10_000)
        .await
        .unwrap()
        .iter()
        .any(|d| d.id == id)
}

/// A limit of 2: a batch of three starts two and parks the third (queued, nothing counted, left
/// out of the outbox); the commit that ends a run unparks it in the same transaction and hands
/// it back to publish; then it runs.
pub async fn concurrency_limit_parks_and_a_release_unparks(s: Arc<dyn Store>) {
    let q = unique_queue("conc");
    assert!(s
        .set_limits(&q, &concurrency(2), now())
        .await
        .unwrap()
        .is_empty());
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(enqueue(&*s, &q, serde_json::json!({ "n": n })).await);
    }
    let out = s.start(&ids, "w1", now()).await.unwrap();
    let first = ran(&out[0]);
    ran(&out[1]);
    assert_eq!(out[2], StartOutcome::Parked);
    let held = s.get(ids[2]).await.unwrap().unwrap();
    assert_eq!(
        (held.state, held.epoch, held.attempts, held.crashes),
        (JobState::Queued, 0, 0, 0)
    );
    assert!(
        !outbox_has(&*s, ids[2]).await,
        "a parked job is not published again"
    );
    // Still full: a second delivery parks it again.
    assert_eq!(start_one(&*s, ids[2]).await, StartOutcome::Parked);
    let dispatch = succeed(&*s, &first).await;
    assert!(
        dispatch.iter().any(|d| d.id == ids[2] && d.queue == q),
        "the release unparks the held job: {dispatch:?}"
    );
    // Had the committer died before publishing, the reconciler would publish it.
    assert!(outbox_has(&*s, ids[2]).await);
    ran(&start_one(&*s, ids[2]).await);
    // Another queue is not limited by this one.
    let other = unique_queue("open");
    let o = enqueue(&*s, &other, serde_json::json!({})).await;
    ran(&start_one(&*s, o).await);
}

/// A per-key limit of one: two jobs of one user run one at a time, another user's runs beside.
pub async fn key_limit_partitions_by_argument(s: Arc<dyn Store>) {
    let q = unique_queue("key");
    let limits = QueueLimits {
        concurrency: Some(1),
        key_arg: Some("user".into()),
        ..Default::default()
    };
    s.set_limits(&q, &limits, now()).await.unwrap();
    let a1 = enqueue(&*s, &q, serde_json::json!({"user": 1})).await;
    let a2 = enqueue(&*s, &q, serde_json::json!({"user": 1})).await;
    let b1 = enqueue(&*s, &q, serde_json::json!({"user": "1"})).await;
    let out = s.start(&[a1, a2, b1], "w1", now()).await.unwrap();
    let first = ran(&out[0]);
    assert_eq!(out[1], StartOutcome::Parked, "same key, no room");
    let other = ran(&out[2]);
    // Ending the other key's run frees nothing for this key.
    let dispatch = succeed(&*s, &other).await;
    assert!(!dispatch.iter().any(|d| d.id == a2), "{dispatch:?}");
    let dispatch = succeed(&*s, &first).await;
    assert!(dispatch.iter().any(|d| d.id == a2), "{dispatch:?}");
    ran(&start_one(&*s, a2).await);
}

/// A rate of 2 per hour: two starts, the third parked; ending runs frees nothing; the periodic
/// pass unparks it only once the window has rolled.
pub async fn rate_limit_counts_starts_in_its_window(s: Arc<dyn Store>) {
    let q = unique_queue("rate");
    let limits = QueueLimits {
        rate: Some(Rate {
            count: 2,
            period: Duration::from_secs(3600),
        }),
        ..Default::default()
    };
    s.set_limits(&q, &limits, now()).await.unwrap();
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(enqueue(&*s, &q, serde_json::json!({ "n": n })).await);
    }
    // One instant for every start, so that the hour's window cannot roll in between.
    let t = now();
    let out = s.start(&ids, "w1", t).await.unwrap();
    let a = ran(&out[0]);
    let b = ran(&out[1]);
    assert_eq!(out[2], StartOutcome::Parked);
    succeed(&*s, &a).await;
    succeed(&*s, &b).await;
    assert_eq!(
        start_one_at(&*s, ids[2], t).await,
        StartOutcome::Parked,
        "still two starts in the window"
    );
    let early = s.unpark_ready(t, 1000).await.unwrap();
    assert!(!early.iter().any(|d| d.id == ids[2]), "{early:?}");
    let later = t + micros(Duration::from_secs(3601));
    let ready = s.unpark_ready(later, 1000).await.unwrap();
    assert!(ready.iter().any(|d| d.id == ids[2]), "{ready:?}");
    assert!(matches!(
        s.start(&[ids[2]], "w1", later).await.unwrap()[0],
        StartOutcome::Run(_)
    ));
}

/// Rate windows are fixed, aligned to the epoch (docs/limits.md, "Rate windows"): a batch
/// counts each of its starts; a start late in a full window is parked however long ago the
/// window's starts were; the next window's first instant admits COUNT again, the periodic pass
/// unparks then and not before; a start whose clock lags the counter's window is parked (it
/// is not counted in a window its start time is not in).
pub async fn rate_windows_are_aligned_and_count_batches(s: Arc<dyn Store>) {
    let q = unique_queue("windows");
    let period = Duration::from_secs(60);
    let rate = Rate { count: 3, period };
    let limits = QueueLimits {
        rate: Some(rate),
        ..Default::default()
    };
    let p = micros(period);
    // A window in the future of every other case's clock, so none of them can touch it.
    let w0 = crate::limit::window_of(&rate, now()) + 100 * p;
    s.set_limits(&q, &limits, now()).await.unwrap();
    let mut ids = Vec::new();
    for n in 0..8 {
        ids.push(enqueue(&*s, &q, serde_json::json!({ "n": n })).await);
    }
    // Two in one batch at the window's start, one more near its end: the third is the last.
    let out = s.start(&ids[0..2], "w1", w0).await.unwrap();
    ran(&out[0]);
    ran(&out[1]);
    ran(&start_one_at(&*s, ids[2], w0 + p - 2).await);
    assert_eq!(
        start_one_at(&*s, ids[3], w0 + p - 1).await,
        StartOutcome::Parked
    );
    let early = s.unpark_ready(w0 + p - 1, 1000).await.unwrap();
    assert!(!early.iter().any(|d| d.id == ids[3]), "{early:?}");
    // The next window opens: the pass unparks the held job, and three start again.
    let ready = s.unpark_ready(w0 + p, 1000).await.unwrap();
    assert!(ready.iter().any(|d| d.id == ids[3]), "{ready:?}");
    let out = s.start(&ids[3..7], "w1", w0 + p).await.unwrap();
    ran(&out[0]);
    ran(&out[1]);
    ran(&out[2]);
    assert_eq!(out[3], StartOutcome::Parked, "a batch of 4 on a rate of 3");
    // A lagging clock (still in the first window) finds the later window opened: parked.
    assert_eq!(
        start_one_at(&*s, ids[7], w0 + 5).await,
        StartOutcome::Parked
    );
    ran(&start_one_at(&*s, ids[7], w0 + 2 * p).await);
}

async fn start_one_at(s: &dyn Store, id: JobId, at: crate::time::Micros) -> StartOutcome {
    s.start(&[id], "w1", at).await.expect("start").remove(0)
}

/// A worker that dies holding the only slot: the rescue that reclaims its job frees the slot
/// and unparks the held job in the same transaction, and hands it to the rescuer to publish
/// (the outbox has it too, should the rescuer die first).
pub async fn a_rescue_frees_the_slot(s: Arc<dyn Store>) {
    let q = unique_queue("rescue");
    s.set_limits(&q, &concurrency(1), now()).await.unwrap();
    let a = enqueue(&*s, &q, serde_json::json!({"n": 1})).await;
    let b = enqueue(&*s, &q, serde_json::json!({"n": 2})).await;
    ran(&start_one(&*s, a).await);
    assert_eq!(start_one(&*s, b).await, StartOutcome::Parked);
    let (lost, unparked) = s.mark_lost_unparking(a, "w1", false, now()).await.unwrap();
    assert_eq!(lost, Lost::Requeued);
    assert_eq!(
        unparked.map(|p| p.id),
        Some(b),
        "the rescue hands back the held job"
    );
    assert!(outbox_has(&*s, b).await, "the rescue unparked the held job");
    // A second rescue of the same run decides nothing and unparks nothing.
    assert_eq!(
        s.mark_lost_unparking(a, "w1", false, now()).await.unwrap(),
        (Lost::NotOwned(JobState::Queued), None)
    );
    // One slot: whichever starts first runs, the other is parked.
    let out = s.start(&[b, a], "w2", now()).await.unwrap();
    ran(&out[0]);
    assert_eq!(out[1], StartOutcome::Parked);
}

/// Sixteen starts of sixteen jobs race, one job each, on a limit of 3: exactly three run.
pub async fn concurrent_starts_never_exceed_the_limit(s: Arc<dyn Store>) {
    let q = unique_queue("race");
    s.set_limits(&q, &concurrency(3), now()).await.unwrap();
    let mut ids = Vec::new();
    for n in 0..16 {
        ids.push(enqueue(&*s, &q, serde_json::json!({ "n": n })).await);
    }
    let mut tasks = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let s = s.clone();
        let id = *id;
        tasks.push(tokio::spawn(async move {
            s.start(&[id], &format!("w{i}"), now())
                .await
                .unwrap()
                .remove(0)
        }));
    }
    let mut runs = 0;
    for t in tasks {
        match t.await.unwrap() {
            StartOutcome::Run(_) => runs += 1,
            StartOutcome::Parked => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(runs, 3);
    let stats = s.queue_stats().await.unwrap();
    let st = stats.iter().find(|x| x.queue == q).unwrap();
    assert_eq!((st.running, st.queued), (3, 13));
}

/// `queue_settings` shows limits; replacing them unparks what was held (the new limit decides
/// again), and clearing them leaves the queue unlimited.
pub async fn limits_are_shown_changed_and_cleared(s: Arc<dyn Store>) {
    let q = unique_queue("set");
    let limits = QueueLimits {
        concurrency: Some(1),
        rate: Some(Rate::parse("10/1s").unwrap()),
        key_arg: Some("user_id".into()),
    };
    s.set_limits(&q, &limits, now()).await.unwrap();
    let shown = s.queue_settings().await.unwrap();
    let mine = shown.iter().find(|x| x.queue == q).expect("listed");
    assert_eq!((mine.paused, &mine.limits), (false, &limits));
    let a = enqueue(&*s, &q, serde_json::json!({"user_id": 5})).await;
    let b = enqueue(&*s, &q, serde_json::json!({"user_id": 5})).await;
    ran(&start_one(&*s, a).await);
    assert_eq!(start_one(&*s, b).await, StartOutcome::Parked);
    let back = s.set_limits(&q, &concurrency(2), now()).await.unwrap();
    assert_eq!(back.iter().map(|d| d.id).collect::<Vec<_>>(), vec![b]);
    ran(&start_one(&*s, b).await);
    s.set_limits(&q, &QueueLimits::default(), now())
        .await
        .unwrap();
    assert!(!s
        .queue_settings()
        .await
        .unwrap()
        .iter()
        .any(|x| x.queue == q));
    let c = enqueue(&*s, &q, serde_json::json!({"user_id": 5})).await;
    ran(&start_one(&*s, c).await);
    // Refused limits change nothing.
    assert!(s.set_limits(&q, &concurrency(0), now()).await.is_err());
}

/// Every way a run ends frees its slot, not only a success: a failure with a retry left, and a
/// cancelled run.
pub async fn failure_retry_and_cancel_free_the_slot(s: Arc<dyn Store>) {
    let q = unique_queue("ends");
    s.set_limits(&q, &concurrency(1), now()).await.unwrap();
    let a = enqueue(&*s, &q, serde_json::json!({"n": 1})).await;
    let b = enqueue(&*s, &q, serde_json::json!({"n": 2})).await;
    let c = enqueue(&*s, &q, serde_json::json!({"n": 3})).await;
    let ja = ran(&start_one(&*s, a).await);
    assert_eq!(start_one(&*s, b).await, StartOutcome::Parked);
    assert_eq!(start_one(&*s, c).await, StartOutcome::Parked);
    let out = s
        .complete(
            &[Completion {
                id: ja.id,
                epoch: ja.epoch,
                outcome: Outcome::Retry {
                    error: "boom".into(),
                    at: now() + micros(Duration::from_secs(3600)),
                },
            }],
            now(),
        )
        .await
        .unwrap()
        .remove(0);
    let Committed::Applied { dispatch, .. } = out else {
        panic!("{out:?}")
    };
    assert!(dispatch.iter().any(|d| d.id == b), "{dispatch:?}");
    let jb = ran(&start_one(&*s, b).await);
    let out = s
        .complete(
            &[Completion {
                id: jb.id,
                epoch: jb.epoch,
                outcome: Outcome::Cancelled,
            }],
            now(),
        )
        .await
        .unwrap()
        .remove(0);
    let Committed::Applied { dispatch, .. } = out else {
        panic!("{out:?}")
    };
    assert!(dispatch.iter().any(|d| d.id == c), "{dispatch:?}");
}
