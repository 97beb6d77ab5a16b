//! What the Redis broker must survive on a real three-master Redis Cluster beyond the shared
//! conformance suite: a master killed with SIGKILL and restarted empty (no persistence), and a
//! queue's slot migrated to another master while jobs flow (`ASK`/`TRYAGAIN` during the move,
//! `MOVED` after it). Both disturb the whole cluster, so they share one cluster and run one at a
//! time.

#[path = "support/redis_cluster.rs"]
mod redis_cluster;
#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

use homing::broker::redis::RedisBroker;
use homing::conformance::unique_queue;
use homing::maintenance::{reconciler, MaintenanceConfig};
use homing::sqlite::Db;
use homing::store::sqlite::SqliteStore;
use homing::store::Store;
use homing::{Client, EnqueueRequest, JobId, JobState, Worker, WorkerConfig};
use redis_cluster::RedisCluster;
use redis_server::unique_prefix;

fn cluster() -> &'static Mutex<RedisCluster> {
    static C: OnceLock<Mutex<RedisCluster>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(RedisCluster::start(3)))
}

fn sqlite_store() -> Arc<dyn Store> {
    let dir = tempfile::tempdir().expect("temp dir").keep();
    Arc::new(SqliteStore::new(
        Db::open(dir.join("homing.db")).expect("open sqlite"),
    ))
}

/// A queue name whose stream lives on a master other than `avoid`'s.
fn queue_not_on(c: &RedisCluster, b: &RedisBroker, avoid: &[usize], what: &str) -> String {
    loop {
        let q = unique_queue(what);
        if !avoid.contains(&c.owner_of(&b.keys().stream(&q))) {
            return q;
        }
    }
}

async fn enqueue(client: &Client, queue: &str, n: usize) -> Vec<JobId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let mut req = EnqueueRequest::new("builtin.noop", serde_json::json!({ "n": i }));
        req.options.queue = Some(queue.to_string());
        ids.push(client.enqueue(req).await.expect("enqueue").id);
    }
    ids
}

fn worker(b: Arc<RedisBroker>, store: Arc<dyn Store>, queues: Vec<String>) -> Worker {
    let config = WorkerConfig {
        queues,
        concurrency: 4,
        heartbeat_interval: Duration::from_millis(200),
        ..WorkerConfig::default()
    };
    Worker::new(b, store, homing::builtin::registry(), config)
}

async fn all_succeed(client: &Client, ids: &[JobId]) {
    for id in ids {
        let job = client.wait(*id, Duration::from_secs(60)).await.unwrap();
        assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    }
}

/// Queued jobs whose messages lived on one master survive that master being killed (`kill -9`)
/// and restarted empty: the queue's own marker is gone, so the reconciler sees the loss even
/// though the global marker (on another master) survived, and re-publishes from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_jobs_survive_a_master_restart_without_persistence() {
    let mut c = cluster().lock().await;
    let b = Arc::new(
        RedisBroker::open(&c.url(&unique_prefix("restart")))
            .await
            .unwrap(),
    );
    let keys = b.keys().clone();
    // The victim holds neither the global marker nor the set of known queues: the old single
    // marker could not have noticed its loss.
    let spared = [c.owner_of(&keys.marker()), c.owner_of(&keys.queues())];
    let lost_q = queue_not_on(&c, &b, &spared, "lost");
    let victim = c.owner_of(&keys.stream(&lost_q));
    let kept_q = queue_not_on(&c, &b, &[victim], "kept");

    let store = sqlite_store();
    let client = Client::new(b.clone(), store.clone());
    let mut ids = enqueue(&client, &lost_q, 10).await;
    ids.extend(enqueue(&client, &kept_q, 10).await);
    let config = MaintenanceConfig {
        dispatch_grace: Duration::ZERO,
        ..MaintenanceConfig::for_heartbeat(Duration::from_millis(200))
    };
    // First pass on a fresh namespace: markers are set (and everything re-published once).
    reconciler::pass(&*b, &*store, &config, true).await.unwrap();
    let report = reconciler::pass(&*b, &*store, &config, false)
        .await
        .unwrap();
    assert!(!report.broker_data_lost, "{report:?}");
    let before: u64 = c.cli(&["XLEN", &keys.stream(&lost_q)]).parse().unwrap();
    assert!(before >= 10, "{before} messages");

    c.kill9(victim);
    c.restart(victim);
    assert_eq!(
        c.cli(&["XLEN", &keys.stream(&lost_q)]),
        "0",
        "restarted empty"
    );

    // The broker's connections to the killed master broke: passes fail (Unavailable) until the
    // client reconnects, then one reports the loss and re-publishes.
    let deadline = Instant::now() + Duration::from_secs(30);
    let report = loop {
        match reconciler::pass(&*b, &*store, &config, false).await {
            Ok(r) => break r,
            Err(e) => {
                assert!(e.is_transient(), "{e}");
                assert!(Instant::now() < deadline, "the broker did not recover: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(report.broker_data_lost, "{report:?}");
    assert!(report.published >= 20, "{report:?}");

    let stop = homing::CancellationToken::new();
    let running =
        tokio::spawn(worker(b.clone(), store.clone(), vec![lost_q, kept_q]).run(stop.clone()));
    all_succeed(&client, &ids).await;
    stop.cancel();
    running.await.unwrap().unwrap();
}

/// A queue's slot is migrated to another master, key by key, while a producer enqueues and a
/// worker drains: during the move the client is redirected with `ASK` (and told `TRYAGAIN` when a
/// script's keys are split between the two masters), after it with `MOVED`. Every job finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_flow_while_their_slot_moves_to_another_master() {
    let c = cluster().lock().await;
    let b = Arc::new(
        RedisBroker::open(&c.url(&unique_prefix("move")))
            .await
            .unwrap(),
    );
    let q = unique_queue("moving");
    let stream = b.keys().stream(&q);
    let from = c.owner_of(&stream);
    let to = (from + 1) % c.ports().len();
    let slot = c.cli(&["CLUSTER", "KEYSLOT", &stream]);

    let store = sqlite_store();
    let client = Arc::new(Client::new(b.clone(), store.clone()));
    let stop = homing::CancellationToken::new();
    let running = tokio::spawn(worker(b.clone(), store.clone(), vec![q.clone()]).run(stop.clone()));
    let mut ids = enqueue(&client, &q, 20).await;
    all_succeed(&client, &ids).await;

    // A producer keeps enqueueing during the whole move.
    let producer = {
        let (client, q) = (client.clone(), q.clone());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..40 {
                ids.extend(enqueue(&client, &q, 5).await);
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            ids
        })
    };

    let (from_id, to_id) = (c.node_id(from), c.node_id(to));
    let to_port = c.ports()[to].to_string();
    c.node_cli(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
    c.node_cli(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
    // One key at a time, with pauses, so jobs flow while the queue is split between masters.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let keys = c.node_cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "1"]);
        let Some(key) = keys.lines().next().filter(|k| !k.is_empty()) else {
            break;
        };
        c.node_cli(from, &["MIGRATE", "127.0.0.1", &to_port, key, "0", "5000"]);
        assert!(Instant::now() < deadline, "migration did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..c.ports().len() {
        c.node_cli(i, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
    }
    assert_eq!(c.owner_of(&stream), to);

    ids.extend(producer.await.unwrap());
    ids.extend(enqueue(&client, &q, 20).await);
    all_succeed(&client, &ids).await;
    stop.cancel();
    running.await.unwrap().unwrap();
    // Every acknowledged message left the stream, now on the new master.
    assert_eq!(c.node_cli(to, &["XLEN", &stream]), "0");
}
