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
/// handler finishes, and is dropped 3 s later (past two sweeps for strays on Redis). Meanwhile
/// the job's message is published six times more (the job must not run again: it is still
/// marked as on its way to the store), and six blocked jobs are offered (neither worker may run
/// more jobs than its prefetch of 2: the kept message keeps its reservation). Then the job must
/// succeed with one run, and every message must be acknowledged.
pub async fn refused_then_taken(broker: Arc<dyn Broker>, store: Arc<dyn Store>, db: Arc<Db>) {
    const PREFETCH: usize = 2;
    const OTHERS: usize = 6;
    const DUPLICATES: usize = 6;
    let q = unique_queue("unstored");
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let others_ran = Arc::new(AtomicUsize::new(0));
    let others_gate = Arc::new(tokio::sync::Semaphore::new(0));
    let tasks = || {
        let mut tasks = Registry::new();
        gated(&mut tasks, "t.held", &runs, &gate, "ran");
        gated(&mut tasks, "t.other", &others_ran, &others_gate, "other");
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
                concurrency: PREFETCH,
                // A sweep for strays every second on Redis.
                heartbeat_interval: Duration::from_millis(100),
                maintenance: false,
                ..WorkerConfig::default()
            },
        );
        workers.push(tokio::spawn(worker.run(stop.clone())));
    }
    let publish = |id| {
        let (broker, q) = (broker.clone(), q.clone());
        async move {
            broker
                .publish(&[ToPublish {
                    id,
                    queue: q,
                    priority: 0,
                }])
                .await
                .unwrap()
        }
    };

    let job = new_job(&q, "t.held");
    let id = job.id;
    store.insert(vec![job]).await.unwrap();
    publish(id).await;
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
    let refused_at = Instant::now();
    gate.add_permits(1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // One at a time, so that each worker is likely to take some.
    for _ in 0..DUPLICATES {
        publish(id).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut others = Vec::new();
    for _ in 0..OTHERS {
        let j = new_job(&q, "t.other");
        others.push(j.id);
        store.insert(vec![j]).await.unwrap();
        publish(others[others.len() - 1]).await;
    }
    let names: Vec<String> = store
        .workers(0)
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.info.id)
        .collect();
    assert_eq!(names.len(), 2);
    // Both workers full: the held job and one other under its worker, two under the other.
    while refused_at.elapsed() < Duration::from_secs(3) || others_ran.load(Ordering::SeqCst) < 3 {
        for w in &names {
            let n = store.running_under(w, 10).await.unwrap().len();
            assert!(
                n <= PREFETCH,
                "{n} jobs running under {w}, whose prefetch is {PREFETCH}"
            );
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the job ran again while its outcome could not be stored"
        );
        assert!(
            refused_at.elapsed() < Duration::from_secs(30),
            "{} of the other jobs started while one outcome was refused",
            others_ran.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let j = store.get(id).await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Running, "the refused outcome was stored");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the job ran again while its outcome could not be stored"
    );
    assert_eq!(others_ran.load(Ordering::SeqCst), 3);

    let sql = format!("DROP TRIGGER \"{trigger}\"");
    db.write(move |tx| tx.execute_batch(&sql)).await.unwrap();
    others_gate.add_permits(OTHERS);
    let deadline = Instant::now() + Duration::from_secs(30);
    for o in std::iter::once(id).chain(others) {
        loop {
            let j = store.get(o).await.unwrap().unwrap();
            if j.state == JobState::Succeeded {
                assert_eq!(j.epoch, 1, "{j:?}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "job {o} was left {} under {:?} after the store took updates again",
                j.state,
                j.worker
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(
        store.get(id).await.unwrap().unwrap().result,
        Some(json!("ran"))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the job ran more than once");
    assert_eq!(others_ran.load(Ordering::SeqCst), OTHERS);

    // Every message was acknowledged, none left with either worker.
    let deadline = Instant::now() + Duration::from_secs(10);
    for w in &names {
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

/// Registers `name`: each run counts itself in `ran`, then waits for a permit of `gate` and
/// returns `result`.
fn gated(
    tasks: &mut Registry,
    name: &str,
    ran: &Arc<AtomicUsize>,
    gate: &Arc<tokio::sync::Semaphore>,
    result: &'static str,
) {
    let (ran, gate) = (ran.clone(), gate.clone());
    tasks.register_fn(
        name,
        TaskDefaults::default(),
        move |_c: Context, _a: Value| {
            let (ran, gate) = (ran.clone(), gate.clone());
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
                Ok(json!(result))
            }
        },
    );
}
