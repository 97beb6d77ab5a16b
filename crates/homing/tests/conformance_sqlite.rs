//! The store and broker conformance suites against the embedded SQLite backend, each case on
//! a fresh database file.

use std::sync::Arc;

use homing::broker::sqlite::SqliteBroker;
use homing::broker::Broker;
use homing::sqlite::Db;
use homing::store::sqlite::SqliteStore;
use homing::store::Store;

fn fresh_db() -> Arc<Db> {
    let dir = tempfile::tempdir().expect("temp dir").keep();
    Db::open(dir.join("homing.db")).expect("open sqlite")
}

async fn store() -> Arc<dyn Store> {
    Arc::new(SqliteStore::new(fresh_db()))
}

async fn broker() -> Arc<dyn Broker> {
    Arc::new(SqliteBroker::new(fresh_db()))
}

mod store_suite {
    homing::store_conformance!(super::store());
}

mod broker_suite {
    homing::broker_conformance!(super::broker());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn distinct_queue_bound() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("homing.db");
    // Two processes are two `Db`s on one file.
    let a = SqliteStore::new(Db::open(&path).expect("open")).with_max_queues(5);
    let b = SqliteStore::new(Db::open(&path).expect("open")).with_max_queues(5);
    homing::conformance::queues::distinct_queue_bound(Arc::new(a), Arc::new(b), 5).await;
}
