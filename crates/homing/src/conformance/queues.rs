//! The bound on distinct queue names (`store::queues`), for every store. Unlike the store suite's
//! cases it needs two stores on ONE fresh database, each opened with the same small limit, as two
//! processes would be: a backend's test file makes them and calls [`distinct_queue_bound`].

use std::sync::Arc;

use crate::error::Error;
use crate::job::{JobState, NewJob};
use crate::store::Store;

use super::{new_job, unique_queue};

/// `a` and `b` share one empty database and were opened with a limit of `max` queue names
/// (at least 2).
pub async fn distinct_queue_bound(a: Arc<dyn Store>, b: Arc<dyn Store>, max: u64) {
    assert!(max >= 2, "the case needs room for two queues");
    let prefix = unique_queue("qb");
    let name = |i: u64| format!("{prefix}-{i}");
    // Both "processes" race to create twice the limit of new queues, one job each.
    let mut tasks = Vec::new();
    for i in 0..2 * max {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        let job = new_job(&name(i), "t");
        tasks.push(tokio::spawn(async move { store.insert(vec![job]).await }));
    }
    let mut accepted = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.expect("insert task") {
            Ok(ins) => {
                assert_eq!(ins[0].state, JobState::Queued);
                accepted.push(i as u64);
            }
            Err(Error::Invalid(m)) => assert!(m.contains("too many queues"), "{m}"),
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(
        accepted.len() as u64,
        max,
        "exactly the limit of queues is accepted across processes: {accepted:?}"
    );
    // Existing queues keep working from either process, alone or in a batch.
    let known = name(accepted[0]);
    let other = name(accepted[1]);
    a.insert(vec![new_job(&known, "t"), new_job(&other, "t")])
        .await
        .expect("existing queues keep working");
    b.insert(vec![new_job(&known, "t")])
        .await
        .expect("existing queues keep working");
    // A batch that brings one new name is refused whole: nothing of it is stored.
    let ok = new_job(&known, "t");
    let ok_id = ok.id;
    let batch: Vec<NewJob> = vec![ok, new_job(&format!("{prefix}-late"), "t")];
    let err = b
        .insert(batch)
        .await
        .expect_err("a new queue over the limit");
    assert!(
        matches!(&err, Error::Invalid(m) if m.contains("too many queues") && m.contains("-late")),
        "{err}"
    );
    assert!(a.get(ok_id).await.unwrap().is_none(), "all or nothing");
    let stats = a.queue_stats().await.unwrap();
    let ours = stats
        .iter()
        .filter(|s| s.queue.starts_with(&prefix))
        .count();
    assert_eq!(ours as u64, max);
}
