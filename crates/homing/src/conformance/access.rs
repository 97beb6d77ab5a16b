//! The audit log and bulk actions (docs/access.md), for every store: a backend's test file
//! invokes [`access_conformance!`](crate::access_conformance) beside the store suite.

use std::sync::Arc;

use super::{new_job, unique_queue};
use crate::bulk::{self, Action};
use crate::job::{JobId, JobState};
use crate::store::audit::NewAudit;
use crate::store::*;
use crate::time::now;

/// Generates one `#[tokio::test]` per case; `$make` makes a fresh store, as for
/// [`store_conformance!`](crate::store_conformance).
#[macro_export]
macro_rules! access_conformance {
    ($make:expr) => {
        $crate::__conformance_cases!(access, $make;
            audit_is_recorded_paged_and_pruned, count_and_delete_take_only_finished_jobs,
            bulk_walks_in_bounded_steps_and_a_rerun_finishes, bulk_cancel_requests_running_jobs,
            a_bulk_step_over_large_jobs_stays_within_a_page,
            retention_prunes_an_audit_log_longer_than_a_batch,
            many_applies_each_single_decision_in_one_step
        );
    };
}

fn entry(actor: &str, n: u64) -> NewAudit {
    NewAudit {
        actor: actor.into(),
        role: "admin".into(),
        action: "POST /v1/jobs/{id}/retry".into(),
        target: format!("/v1/jobs/{n}/retry?x=1"),
        status: 200,
        count: n.is_multiple_of(2).then_some(n),
    }
}

/// Entries come back newest first, paged with a cursor, exactly as recorded (text cut to the
/// bound, never refused); retention removes the ones recorded before its cut-off only.
pub async fn audit_is_recorded_paged_and_pruned(s: Arc<dyn Store>) {
    let mut ids = Vec::new();
    for n in 0..5u64 {
        // Recorded "long ago" (1 ms, 2 ms, … after the epoch), so a cut-off can fall between.
        ids.push(
            s.record_audit(entry("ops-bob", n), (n as i64 + 1) * 1000)
                .await
                .unwrap(),
        );
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let first = s.audit(None, 2).await.unwrap();
    assert_eq!(first.entries.len(), 2);
    assert_eq!(first.entries[0].id, ids[4]);
    assert_eq!(first.entries[0].at, 5000);
    assert_eq!(first.entries[0].entry, entry("ops-bob", 4));
    assert_eq!(first.entries[1].entry, entry("ops-bob", 3));
    let mut all = first.entries.clone();
    let mut cursor = first.next_cursor.clone();
    while let Some(c) = cursor {
        let p = s.audit(Some(&c), 2).await.unwrap();
        all.extend(p.entries);
        cursor = p.next_cursor;
    }
    let got: Vec<i64> = all.iter().map(|e| e.id).collect();
    assert_eq!(got, ids.iter().rev().copied().collect::<Vec<_>>());
    assert!(s.audit(Some("nope"), 2).await.is_err());

    let long = NewAudit {
        target: format!("/v1/{}\0", "x".repeat(5000)),
        ..entry("long", 1)
    };
    let id = s.record_audit(long, now()).await.unwrap();
    let top = s.audit(None, 1).await.unwrap().entries.remove(0);
    assert_eq!(top.id, id);
    assert!(top.entry.target.len() <= crate::store::audit::MAX_FIELD);
    assert!(!top.entry.target.contains('\0'));

    // Entries at 1 ms and 2 ms go; 3 ms and later (and the one just recorded) stay.
    let purged = s.purge(2500, 1000).await.unwrap();
    assert_eq!(purged.audit, 2);
    let left: Vec<i64> = s
        .audit(None, 100)
        .await
        .unwrap()
        .entries
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(left, vec![id, ids[4], ids[3], ids[2]]);
}

async fn finish(s: &dyn Store, id: JobId, outcome: Outcome) {
    let job = match s.start(&[id], "w1", now()).await.unwrap().remove(0) {
        StartOutcome::Run(j) => *j,
        other => panic!("expected Run, got {other:?}"),
    };
    let c = s
        .complete(
            &[Completion {
                id,
                epoch: job.epoch,
                outcome,
            }],
            now(),
        )
        .await
        .unwrap();
    assert!(matches!(c[0], Committed::Applied { .. }), "{c:?}");
}

/// `count` counts exactly the filter; `delete_finished` removes only finished jobs of the ids
/// it is given and leaves queued and running ones.
pub async fn count_and_delete_take_only_finished_jobs(s: Arc<dyn Store>) {
    let q = unique_queue("del");
    let ins = s
        .insert((0..4).map(|_| new_job(&q, "t")).collect())
        .await
        .unwrap();
    let ids: Vec<JobId> = ins.iter().map(|i| i.id).collect();
    finish(&*s, ids[0], Outcome::Succeeded(serde_json::json!(1))).await;
    finish(&*s, ids[1], Outcome::Failed { error: "no".into() }).await;
    s.start(&[ids[2]], "w1", now()).await.unwrap();
    let f = |state: Option<JobState>| JobFilter {
        state,
        queue: Some(q.clone()),
        task: None,
    };
    assert_eq!(s.count(&f(None)).await.unwrap(), 4);
    assert_eq!(s.count(&f(Some(JobState::Succeeded))).await.unwrap(), 1);
    assert_eq!(s.count(&f(Some(JobState::Running))).await.unwrap(), 1);
    assert_eq!(
        s.count(&JobFilter {
            task: Some("other".into()),
            ..f(None)
        })
        .await
        .unwrap(),
        0
    );
    assert_eq!(s.delete_finished(&ids).await.unwrap(), 2);
    assert!(s.get(ids[0]).await.unwrap().is_none());
    assert!(s.get(ids[1]).await.unwrap().is_none());
    assert_eq!(
        s.get(ids[2]).await.unwrap().unwrap().state,
        JobState::Running
    );
    assert_eq!(
        s.get(ids[3]).await.unwrap().unwrap().state,
        JobState::Queued
    );
    assert_eq!(s.delete_finished(&ids).await.unwrap(), 0);
    assert_eq!(s.delete_finished(&[]).await.unwrap(), 0);
}

/// A bulk action walks its filter one bounded step at a time; stopped after its first step (a
/// crash), every job is either untouched or changed exactly as its single action would change
/// it, and running it again from the start finishes the rest without touching a job twice.
pub async fn bulk_walks_in_bounded_steps_and_a_rerun_finishes(s: Arc<dyn Store>) {
    let q = unique_queue("bulk");
    let n = bulk::BATCH + 30;
    let mut ids = Vec::new();
    for chunk in 0..n.div_ceil(200) {
        let k = 200.min(n - chunk * 200);
        let ins = s
            .insert((0..k).map(|_| new_job(&q, "t")).collect())
            .await
            .unwrap();
        ids.extend(ins.iter().map(|i| i.id));
    }
    let other = s.insert(vec![new_job(&q, "u")]).await.unwrap()[0].id;
    let f = |state| JobFilter {
        state: Some(state),
        queue: Some(q.clone()),
        task: Some("t".into()),
    };
    let count = |state| {
        let s = s.clone();
        let filter = f(state);
        async move { s.count(&filter).await.unwrap() }
    };

    // One step, then "the process dies".
    let first = bulk::step(&*s, Action::Cancel, &f(JobState::Queued), None)
        .await
        .unwrap();
    assert_eq!(first.done.count, bulk::BATCH as u64);
    assert!(first.next.is_some());
    assert_eq!(count(JobState::Cancelled).await, bulk::BATCH as u64);
    assert_eq!(count(JobState::Queued).await, 30);
    // Run again from the start: only the rest is met.
    let mut total = bulk::Outcome::default();
    let mut cursor: Option<String> = None;
    loop {
        let st = bulk::step(&*s, Action::Cancel, &f(JobState::Queued), cursor.as_deref())
            .await
            .unwrap();
        total.count += st.done.count;
        total.skipped += st.done.skipped;
        match st.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(
        total,
        bulk::Outcome {
            count: 30,
            skipped: 0
        }
    );
    assert_eq!(count(JobState::Cancelled).await, n as u64);
    // The job of another task is out of the filter.
    assert_eq!(s.get(other).await.unwrap().unwrap().state, JobState::Queued);

    // Retry them all: each is queued again, undispatched, and handed back to publish.
    let mut retried = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let st = bulk::step(
            &*s,
            Action::Retry,
            &f(JobState::Cancelled),
            cursor.as_deref(),
        )
        .await
        .unwrap();
        retried.extend(st.publish.iter().map(|p| p.id));
        match st.next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    retried.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(retried, want);
    assert_eq!(count(JobState::Queued).await, n as u64);
    let j = s.get(ids[0]).await.unwrap().unwrap();
    assert_eq!((j.state, j.attempts, j.crashes), (JobState::Queued, 0, 0));

    // Delete finished: cancel, then delete; nothing of them is left, the other job stays.
    for action in [Action::Cancel, Action::Delete] {
        let state = if action == Action::Cancel {
            JobState::Queued
        } else {
            JobState::Cancelled
        };
        let mut cursor: Option<String> = None;
        let mut done = 0;
        loop {
            let st = bulk::step(&*s, action, &f(state), cursor.as_deref())
                .await
                .unwrap();
            done += st.done.count;
            match st.next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(done, n as u64, "{action:?}");
    }
    assert_eq!(
        s.count(&JobFilter {
            queue: Some(q.clone()),
            ..JobFilter::default()
        })
        .await
        .unwrap(),
        1
    );
    // A filter the action does not take is refused before anything is read.
    assert!(matches!(
        bulk::step(&*s, Action::Delete, &f(JobState::Queued), None).await,
        Err(crate::error::Error::Invalid(_))
    ));
}

/// A bulk cancel of running jobs requests their cancel, as a single cancel does.
pub async fn bulk_cancel_requests_running_jobs(s: Arc<dyn Store>) {
    let q = unique_queue("bulkrun");
    let a = s.insert(vec![new_job(&q, "t")]).await.unwrap()[0].id;
    s.start(&[a], "w1", now()).await.unwrap();
    let st = bulk::step(
        &*s,
        Action::Cancel,
        &JobFilter {
            state: Some(JobState::Running),
            queue: Some(q.clone()),
            task: None,
        },
        None,
    )
    .await
    .unwrap();
    assert_eq!(st.done.count, 1);
    assert_eq!(s.cancel_requested(&[a]).await.unwrap(), vec![a]);
}

/// A step over large jobs changes no more than a page of whole jobs holds ([`PAGE_BYTES`]):
/// each change rewrites its row, so a step of 500 jobs of 1 MB args would be a transaction of
/// half a gigabyte holding the store's writers up. The walk goes on to the end, and a retry's
/// step answers each job to publish with its queue and priority.
pub async fn a_bulk_step_over_large_jobs_stays_within_a_page(s: Arc<dyn Store>) {
    let q = unique_queue("bulkbig");
    let pad = "x".repeat(1_000_000);
    let jobs = (0..6)
        .map(|i| {
            let mut j = new_job(&q, "t");
            j.args = serde_json::json!({ "i": i, "pad": pad });
            j.options.priority = Some(3);
            j
        })
        .collect();
    let mut ids: Vec<JobId> = s.insert(jobs).await.unwrap().iter().map(|i| i.id).collect();
    ids.sort();
    let f = |state| JobFilter {
        state: Some(state),
        queue: Some(q.clone()),
        task: None,
    };
    for (action, state) in [
        (Action::Cancel, JobState::Queued),
        (Action::Retry, JobState::Cancelled),
    ] {
        let (mut steps, mut done, mut published, mut cursor) = (0, 0, Vec::new(), None::<String>);
        loop {
            let st = bulk::step(&*s, action, &f(state), cursor.as_deref())
                .await
                .unwrap();
            assert!(
                st.done.count <= (PAGE_BYTES / 1_000_000) as u64,
                "{:?}",
                st.done
            );
            assert!(st.publish.iter().all(|p| p.queue == q && p.priority == 3));
            steps += 1;
            done += st.done.count;
            published.extend(st.publish.iter().map(|p| p.id));
            match st.next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(done, 6, "{action:?}");
        assert!(steps >= 2, "{action:?}: one step took every large job");
        published.sort();
        let want = if action == Action::Retry {
            ids.clone()
        } else {
            Vec::new()
        };
        assert_eq!(published, want);
    }
}

/// `retry_many` and `cancel_many` decide each job as the single action does, in one step: the
/// jobs the decision takes change, the others (gone, or in a state the action refuses) are
/// left exactly as they were and are not returned; a second run changes nothing more.
pub async fn many_applies_each_single_decision_in_one_step(s: Arc<dyn Store>) {
    let q = unique_queue("many");
    let prioritised = || {
        let mut j = new_job(&q, "t");
        j.options.priority = Some(7);
        j
    };
    let ids: Vec<JobId> = s
        .insert((0..5).map(|_| prioritised()).collect())
        .await
        .unwrap()
        .iter()
        .map(|i| i.id)
        .collect();
    // 0 failed, 1 succeeded, 2 running, 3 and 4 queued; one id that does not exist.
    finish(&*s, ids[0], Outcome::Failed { error: "no".into() }).await;
    finish(&*s, ids[1], Outcome::Succeeded(serde_json::json!(1))).await;
    s.start(&[ids[2]], "w1", now()).await.unwrap();
    let missing: JobId = "00000000-0000-4000-8000-000000000000".parse().unwrap();
    let mut all = ids.clone();
    all.push(missing);
    let state = |id: JobId| {
        let s = s.clone();
        async move { s.get(id).await.unwrap().unwrap().state }
    };

    let retried = s.retry_many(&all, now()).await.unwrap();
    // As the broker needs it: the queue and priority the job is published to.
    assert_eq!(
        retried,
        vec![crate::store::ToPublish {
            id: ids[0],
            queue: q.clone(),
            priority: 7,
        }]
    );
    let j = s.get(ids[0]).await.unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Queued, 0));
    assert_eq!(state(ids[1]).await, JobState::Succeeded);
    assert_eq!(state(ids[2]).await, JobState::Running);
    assert!(s.retry_many(&all[1..], now()).await.unwrap().is_empty());

    let mut cancelled: Vec<JobId> = s
        .cancel_many(&all, now())
        .await
        .unwrap()
        .iter()
        .map(|j| j.id)
        .collect();
    cancelled.sort();
    let mut want = vec![ids[0], ids[2], ids[3], ids[4]];
    want.sort();
    assert_eq!(cancelled, want);
    for id in [ids[0], ids[3], ids[4]] {
        assert_eq!(state(id).await, JobState::Cancelled);
    }
    // The running job is asked to stop, as a single cancel does; the finished one is untouched.
    assert_eq!(state(ids[2]).await, JobState::Running);
    assert_eq!(s.cancel_requested(&[ids[2]]).await.unwrap(), vec![ids[2]]);
    assert_eq!(state(ids[1]).await, JobState::Succeeded);
    assert_eq!(
        s.cancel_many(&[ids[0], ids[1], missing], now())
            .await
            .unwrap()
            .len(),
        0
    );
    assert!(s.cancel_many(&[], now()).await.unwrap().is_empty());
    assert!(s.retry_many(&[], now()).await.unwrap().is_empty());
}

/// The retention loop keeps purging while audit entries fill its batches, so a long audit log
/// is pruned entirely in one pass, not one batch per retention interval.
pub async fn retention_prunes_an_audit_log_longer_than_a_batch(s: Arc<dyn Store>) {
    let n = 600u64; // more than the pruner's batch of 500
    for i in 0..n {
        s.record_audit(entry("old", i), 1000 + i as i64)
            .await
            .unwrap();
    }
    let kept = s.record_audit(entry("new", 0), now()).await.unwrap();
    let purged = crate::maintenance::pruner::purge_before(
        &*s,
        1_000_000,
        &tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(purged.audit, n);
    let left: Vec<i64> = s
        .audit(None, 10)
        .await
        .unwrap()
        .entries
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(left, vec![kept]);
}
