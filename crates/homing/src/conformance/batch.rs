//! The store's part of a bulk enqueue (docs/batch.md), run on every store as cases of
//! [`store_conformance!`](crate::store_conformance): a batch of many jobs in one
//! [`Store::insert`] decides each job as the same jobs inserted one after the other would, and a
//! batch the store refuses leaves nothing behind.

use std::sync::Arc;
use std::time::Duration;

use super::{new_job, unique_queue};
use crate::job::JobState;
use crate::store::{JobFilter, Store};
use crate::time::{micros, now};

/// A batch mixing every option that changes what an insert does (idempotency keys old and
/// repeated, unique jobs, a countdown, priorities), large enough to span any chunking a store
/// might do, answers in order as one-by-one inserts would.
pub async fn batch_insert_decides_each_job_as_one_by_one(s: Arc<dyn Store>) {
    let q = unique_queue("batch");
    let old_key = unique_queue("old");
    let mut old = new_job(&q, "t");
    old.options.idempotency_key = Some(old_key.clone());
    let old_id = s.insert(vec![old]).await.expect("insert")[0].id;

    let mut jobs = Vec::new();
    for n in 0..2_000 {
        let mut j = new_job(&q, "t");
        j.args = serde_json::json!({ "n": n });
        j.options.priority = Some(n % 7 - 3);
        jobs.push(j);
    }
    let key = unique_queue("key");
    // 10: a key met again at 11 and at 1 500; 12: a key stored before the batch.
    jobs[10].options.idempotency_key = Some(key.clone());
    jobs[11].options.idempotency_key = Some(key.clone());
    jobs[1_500].options.idempotency_key = Some(key.clone());
    jobs[12].options.idempotency_key = Some(old_key);
    // 20 and 21: equal unique jobs; the second is the first.
    for i in [20, 21] {
        jobs[i].args = serde_json::json!({ "same": true });
        jobs[i].options.unique_for = Some(Duration::from_secs(60));
    }
    // 30: later.
    jobs[30].run_at = Some(now() + micros(Duration::from_secs(3600)));
    let ids: Vec<_> = jobs.iter().map(|j| j.id).collect();

    let out = s.insert(jobs).await.expect("batch insert");
    assert_eq!(out.len(), 2_000);
    for (i, ins) in out.iter().enumerate() {
        let (id, existed) = match i {
            11 | 1_500 => (ids[10], true),
            12 => (old_id, true),
            21 => (ids[20], true),
            _ => (ids[i], false),
        };
        assert_eq!((ins.id, ins.existed), (id, existed), "job {i} of the batch");
        assert_eq!(ins.queue, q);
        let want = if i == 30 {
            JobState::Scheduled
        } else {
            JobState::Queued
        };
        assert_eq!(ins.state, want, "job {i} of the batch");
    }
    let stored = s
        .count(&JobFilter {
            queue: Some(q.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    // 1 before + 2 000 - the 4 that resolved to an existing job.
    assert_eq!(stored, 1 + 2_000 - 4);
    let j = s.get(ids[1_999]).await.unwrap().expect("stored");
    assert_eq!(j.priority, 1_999 % 7 - 3);
    assert_eq!(j.args, serde_json::json!({ "n": 1_999 }));
    assert!(s.get(ids[11]).await.unwrap().is_none());
}

/// A batch the store refuses as a whole (here: it would bring more new queue names than the
/// store takes) stores none of its jobs, not even those before the one at fault.
pub async fn refused_batch_stores_nothing(s: Arc<dyn Store>) {
    let q = unique_queue("whole");
    let mut jobs = vec![new_job(&q, "t")];
    for n in 0..crate::store::queues::DEFAULT_MAX_QUEUES {
        jobs.push(new_job(&format!("{q}-{n}"), "t"));
    }
    let first = jobs[0].id;
    let e = s.insert(jobs).await.expect_err("over the queue bound");
    assert!(e.to_string().contains("too many queues"), "{e}");
    assert!(s.get(first).await.unwrap().is_none());
    assert_eq!(s.count(&JobFilter::default()).await.unwrap(), 0);
    // The store still takes a batch afterwards.
    let ok = s.insert(vec![new_job(&q, "t")]).await.expect("insert");
    assert!(!ok[0].existed);
}
