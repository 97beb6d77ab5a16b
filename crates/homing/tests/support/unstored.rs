//! The test of an outcome the store cannot take yet, shared by the embedded and the Redis
//! broker's test binaries.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use homing::broker::Broker;
use homing::conformance::{new_job, unique_queue};
use homing::sqlite::Db;
use homing::store::{Store, ToPublish};
use homing::{Context, JobState, Registry, TaskDefaults, Worker, WorkerConfig};
use serde_json::{json, Value};

/// Runs one job on two workers sharing `broker` and `store` (a SQLite store whose file is `db`)
/// while a trigger refuses its updates.
///
/// An outcome the store answers unstored (its update and even making the job dead refused, or
/// the store gone between the isolated transactions of a batch) leaves the job `running` under
/// its worker. The worker keeps the message and commits the outcome again after a pause. Handed
/// back instead, the message reached either the other worker, which skipped the job (it runs
/// elsewhere) and acknowledged it, leaving it `running` as long as its worker lived, or the same
/// one, which ran the handler again. Here a trigger refuses every update of the job while its
/// handler finishes, and is dropped 1.5 s later: the job must succeed with one run.
pub async fn refused_then_taken(broker: Arc<dyn Broker>, store: Arc<dyn Store>, db: Arc<Db>) {
    let q = unique_queue("unstored");
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let tasks = || {
        let mut tasks = Registry::new();
        let (runs, gate) = (runs.clone(), gate.clone());
        tasks.register_fn(
            "t.held",
            TaskDefaults::default(),
            move |_c: Context, _a: Value| {
                let (runs, gate) = (runs.clone(), gate.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    gate.acquire().await.unwrap().forget();
                    Ok(json!("ran"))
                }
            },
        );
        tasks
    };
    let stop = homing::CancellationToken::new();
    let mut workers = Vec::new();
    for _ in 0..2 {
        let worker = Worker::new(
            broker.clone(),
            store.clone(),
            tasks(),
            WorkerConfig {
                queues: vec![q.clone()],
                heartbeat_interval: Duration::from_millis(200),
                maintenance: false,
                ..WorkerConfig::default()
            },
        );
        workers.push(tokio::spawn(worker.run(stop.clone())));
    }

    let job = new_job(&q, "t.held");
    let id = job.id;
    store.insert(vec![job]).await.unwrap();
    broker
        .publish(&[ToPublish {
            id,
            queue: q.clone(),
            priority: 0,
        }])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while runs.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the job never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let trigger = format!("refuse-update-{id}");
    let sql = format!(
        "CREATE TRIGGER \"{trigger}\" BEFORE UPDATE ON jobs WHEN OLD.id = '{id}' \
         BEGIN SELECT RAISE(ABORT, 'updates of this job are refused by the test'); END"
    );
    db.write(move |tx| tx.execute_batch(&sql)).await.unwrap();
    gate.add_permits(1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let j = store.get(id).await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Running, "the refused outcome was stored");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the job ran again while its outcome could not be stored"
    );

    let sql = format!("DROP TRIGGER \"{trigger}\"");
    db.write(move |tx| tx.execute_batch(&sql)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let j = store.get(id).await.unwrap().unwrap();
        if j.state == JobState::Succeeded {
            assert_eq!(j.result, Some(json!("ran")));
            assert_eq!(j.epoch, 1, "{j:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the job was left {} under {:?} after the store took updates again",
            j.state,
            j.worker
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the job ran more than once");

    // Its message was acknowledged, not left with either worker.
    let ids: Vec<String> = store
        .workers(0)
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.info.id)
        .collect();
    assert_eq!(ids.len(), 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    for w in &ids {
        while !broker.pending(w, 10).await.unwrap().is_empty() {
            assert!(Instant::now() < deadline, "a message is still held by {w}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    stop.cancel();
    for w in workers {
        w.await.unwrap().unwrap();
    }
}
