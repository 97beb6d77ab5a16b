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
