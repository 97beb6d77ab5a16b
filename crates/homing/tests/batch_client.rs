//! `Client::enqueue_batch` (docs/batch.md) on the embedded backends: the count bound, a job
//! refused by its task's own argument check (which only the client knows) refusing the whole
//! batch with its index, and a batch taken being published after its commit.

use std::sync::Arc;

use homing::broker::sqlite::SqliteBroker;
use homing::client::MAX_BATCH;
use homing::sqlite::Db;
use homing::store::sqlite::SqliteStore;
use homing::store::{JobFilter, Store};
use homing::{Client, EnqueueRequest, Error};

fn client() -> (Client, Arc<dyn Store>) {
    let dir = tempfile::tempdir().expect("temp dir").keep();
    let db = Db::open(dir.join("homing.db")).expect("open sqlite");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::new(db.clone()));
    let client = Client::new(Arc::new(SqliteBroker::new(db)), store.clone())
        .with_registry(homing::builtin::registry());
    (client, store)
}

fn sleep(ms: serde_json::Value) -> EnqueueRequest {
    EnqueueRequest::new("builtin.sleep", serde_json::json!({ "ms": ms }))
}

#[tokio::test]
async fn a_batch_is_bounded_checked_whole_and_published() {
    let (client, store) = client();
    let all = JobFilter::default();

    let e = client.enqueue_batch(Vec::new()).await.unwrap_err();
    assert!(
        matches!(&e, Error::Invalid(m) if m.contains("at least one")),
        "{e}"
    );
    let over = (0..=MAX_BATCH).map(|_| sleep(1.into())).collect();
    let e = client.enqueue_batch(over).await.unwrap_err();
    assert!(
        matches!(&e, Error::Invalid(m) if m.contains("at most 10000")),
        "{e}"
    );

    // Valid for any enqueue, refused by builtin.sleep's own arguments: the whole batch goes.
    let reqs = vec![sleep(1.into()), sleep(2.into()), sleep("soon".into())];
    let e = client.enqueue_batch(reqs).await.unwrap_err();
    assert!(
        matches!(&e, Error::Invalid(m) if m.starts_with("job 2: ")),
        "{e}"
    );
    assert_eq!(store.count(&all).await.unwrap(), 0);

    let reqs = (0..MAX_BATCH).map(|n| sleep(n.into())).collect();
    let out = client.enqueue_batch(reqs).await.unwrap();
    assert_eq!(out.len(), MAX_BATCH);
    assert!(out.iter().all(|i| !i.existed));
    assert_eq!(store.count(&all).await.unwrap(), MAX_BATCH as u64);
    // Published and recorded as such: the reconciler has nothing left to do.
    let left = store.undispatched(homing::time::now(), 10).await.unwrap();
    assert!(left.is_empty(), "{left:?}");
}
