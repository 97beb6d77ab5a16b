//! The broker conformance suite against the Redis Streams broker on a real three-master Redis
//! Cluster that this test binary starts once (loopback ports, `redis-cli --cluster create`); each
//! case gets its own key prefix, so its queues hash to slots spread over the three masters.

#[path = "support/redis_cluster.rs"]
mod redis_cluster;
#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;

use homing::broker::redis::RedisBroker;
use homing::broker::Broker;

async fn broker() -> Arc<dyn Broker> {
    let url = redis_cluster::shared().url(&redis_server::unique_prefix("cconf"));
    let b = RedisBroker::open(&url)
        .await
        .expect("open redis cluster broker");
    assert!(b.is_cluster());
    Arc::new(b)
}

mod broker_suite {
    homing::broker_conformance!(super::broker());
}
