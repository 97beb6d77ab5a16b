//! A start that committed although its caller saw an error leaves a job `running` under a live
//! worker with no handler for it (an earlier start call failed after committing part of its
//! batch, or its answer was lost). When that job's message comes to the same worker again, the
//! worker must run it: no other worker will (it is not lost), and skipping it as a duplicate
//! would leave it running forever.

use std::time::{Duration, Instant};

use homing::conformance::{new_job, unique_queue};
use homing::store::ToPublish;
use homing::{Backends, Context, JobState, Registry, TaskDefaults, Worker, WorkerConfig};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_running_under_this_worker_without_a_handler_is_run() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/homing.db", dir.path().display());
    let backends = Backends::open(&url, &url).await.unwrap();
    let q = unique_queue("orphan");
    let mut tasks = Registry::new();
    tasks.register_fn(
        "t.orphan",
        TaskDefaults::default(),
        |_c: Context, _a: Value| async { Ok(json!("ran")) },
    );
    let worker = Worker::new(
        backends.broker.clone(),
        backends.store.clone(),
        tasks,
        WorkerConfig {
            queues: vec![q.clone()],
            heartbeat_interval: Duration::from_millis(200),
            maintenance: false,
            ..WorkerConfig::default()
        },
    );
    let stop = homing::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));

    let deadline = Instant::now() + Duration::from_secs(30);
    let me = loop {
        let ws = backends.store.workers(0).await.unwrap();
        if let Some(w) = ws.first() {
            break w.info.id.clone();
        }
        assert!(Instant::now() < deadline, "the worker never registered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // What a failed start call leaves behind: committed `running` under this worker, and the
    // message handed back to the broker.
    let job = new_job(&q, "t.orphan");
    let id = job.id;
    backends.store.insert(vec![job]).await.unwrap();
    backends
        .store
        .start(&[id], &me, homing::time::now())
        .await
        .unwrap();
    backends
        .broker
        .publish(&[ToPublish {
            id,
            queue: q.clone(),
            priority: 0,
        }])
        .await
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let j = backends.store.get(id).await.unwrap().unwrap();
        if j.state == JobState::Succeeded {
            assert_eq!(j.result, Some(json!("ran")));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the job was left {} under {:?}",
            j.state,
            j.worker
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await.unwrap().unwrap();
}
