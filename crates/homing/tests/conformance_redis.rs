//! The broker conformance suite against the Redis Streams broker, on a real `redis-server` that
//! this test binary starts (once, on a unix socket); each case gets its own key prefix, so cases
//! run in parallel on one server without seeing each other.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;

use homing::broker::redis::RedisBroker;
use homing::broker::Broker;

async fn broker() -> Arc<dyn Broker> {
    let url = redis_server::shared().url(&redis_server::unique_prefix("conf"));
    Arc::new(RedisBroker::open(&url).await.expect("open redis broker"))
}

mod broker_suite {
    homing::broker_conformance!(super::broker());
}
