//! The store and broker conformance suites against the embedded SQLite backend, each case on
//! a fresh database file.

use std::sync::Arc;

use homing::broker::sqlite::SqliteBroker;
use homing::broker::Broker;
use homing::conformance::{Poisonable, Tamper};
use homing::job::JobId;
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

/// Raw writes to the SQLite file, for the poisoned-row cases.
struct RawSqlite(Arc<Db>);

/// A string as an SQL literal.
fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[homing::async_trait]
impl Tamper for RawSqlite {
    async fn set_job_text(&self, id: JobId, column: &str, text: &str) {
        let sql = format!(
            "UPDATE jobs SET {column} = {} WHERE id = {}",
            lit(text),
            lit(&id.to_string())
        );
        self.0
            .write(move |tx| tx.execute_batch(&sql))
            .await
            .unwrap();
    }

    async fn set_event_data(&self, id: i64, text: &str) {
        let sql = format!("UPDATE events SET data = {} WHERE id = {id}", lit(text));
        self.0
            .write(move |tx| tx.execute_batch(&sql))
            .await
            .unwrap();
    }

    /// SQLite stores any text, so a trigger stands in for what PostgreSQL refuses.
    async fn unstorable_queue(&self) -> String {
        let q = homing::conformance::unique_queue("unstorable");
        let sql = format!(
            "CREATE TRIGGER \"refuse-{q}\" BEFORE INSERT ON jobs WHEN NEW.queue = {} \
             BEGIN SELECT RAISE(ABORT, 'this queue is refused by the test'); END",
            lit(&q)
        );
        self.0
            .write(move |tx| tx.execute_batch(&sql))
            .await
            .unwrap();
        q
    }

    async fn refuse_job_key(&self, key: &str) {
        let sql = format!(
            "CREATE TRIGGER \"refuse-key-{key}\" BEFORE INSERT ON jobs \
             WHEN NEW.idempotency_key = {} \
             BEGIN SELECT RAISE(ABORT, 'this key is refused by the test'); END",
            lit(key)
        );
        self.0
            .write(move |tx| tx.execute_batch(&sql))
            .await
            .unwrap();
    }
}

async fn poisonable() -> Poisonable {
    let db = fresh_db();
    (
        Arc::new(SqliteStore::new(db.clone())),
        Arc::new(RawSqlite(db)),
    )
}

mod poison_suite {
    homing::store_poison_conformance!(super::poisonable());
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
