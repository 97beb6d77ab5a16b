//! A start that committed although its caller saw an error leaves a job `running` under a live
//! worker with no handler for it (an earlier start call failed after committing part of its
//! batch, or its answer was lost). When that job's message comes to the same worker again, the
//! worker must run it: no other worker will (it is not lost), and skipping it as a duplicate
//! would leave it running forever. And an outcome the store cannot take yet stays with its
//! worker, message and all, until it can.

#[path = "support/unstored.rs"]
mod unstored;

use std::time::{Duration, Instant};

use homing::conformance::{new_job, unique_queue};
use homing::store::ToPublish;
use homing::{Backends, Context, JobState, Registry, TaskDefaults, Worker, WorkerConfig};
use serde_json::{json, Value};

/// An embedded file with one worker (no maintenance) serving a fresh queue whose one task
/// answers "ran", and the worker's session id once it has registered.
struct OneWorker {
    _dir: tempfile::TempDir,
    backends: Backends,
    q: String,
    stop: homing::CancellationToken,
    running: tokio::task::JoinHandle<homing::Result<()>>,
    id: String,
}

async fn one_worker(prefix: &str, task: &str, heartbeat: Option<Duration>) -> OneWorker {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/homing.db", dir.path().display());
    let backends = Backends::open(&url, &url).await.unwrap();
    let q = unique_queue(prefix);
    let mut tasks = Registry::new();
    tasks.register_fn(
        task,
        TaskDefaults::default(),
        |_c: Context, _a: Value| async { Ok(json!("ran")) },
    );
    let defaults = WorkerConfig::default();
    let worker = Worker::new(
        backends.broker.clone(),
        backends.store.clone(),
        tasks,
        WorkerConfig {
            queues: vec![q.clone()],
            heartbeat_interval: heartbeat.unwrap_or(defaults.heartbeat_interval),
            maintenance: false,
            ..defaults
        },
    );
    let stop = homing::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = loop {
        let ws = backends.store.workers(0).await.unwrap();
        if let Some(w) = ws.first() {
            break w.info.id.clone();
        }
        assert!(Instant::now() < deadline, "the worker never registered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    OneWorker {
        _dir: dir,
        backends,
        q,
        stop,
        running,
        id,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_running_under_this_worker_without_a_handler_is_run() {
    let OneWorker {
        _dir,
        backends,
        q,
        stop,
        running,
        id: me,
    } = one_worker("orphan", "t.orphan", Some(Duration::from_millis(200))).await;

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

/// A worker the store presumed dead (a rescuer found its heartbeat gone) that has not noticed is
/// refused its next start (`StartOutcome::Presumed`): it learns there that it was presumed dead,
/// hands the message back unstarted and rejoins under a new name, which runs the job once.
/// Without maintenance nothing else would put the message back, so a worker that acknowledged
/// it, or kept asking under the old name, would leave the job queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_presumed_dead_rejoins_at_its_next_start_and_loses_no_message() {
    let OneWorker {
        _dir,
        backends,
        q,
        stop,
        running,
        id: first,
    } = one_worker("presumed", "t.presumed", None).await;
    backends
        .store
        .presume_lost(&first, homing::time::now())
        .await
        .unwrap();

    let job = new_job(&q, "t.presumed");
    let id = job.id;
    backends.store.insert(vec![job]).await.unwrap();
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
    let j = loop {
        let j = backends.store.get(id).await.unwrap().unwrap();
        if j.state == JobState::Succeeded {
            break j;
        }
        assert!(
            Instant::now() < deadline,
            "the job was left {} at epoch {}",
            j.state,
            j.epoch
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!((j.epoch, j.crashes), (1, 0), "{j:?}");
    let h = backends.store.history(id).await.unwrap();
    let started: Vec<_> = h
        .entries
        .iter()
        .filter(|e| e.kind == homing::history::Kind::Started)
        .collect();
    assert_eq!(started.len(), 1, "{h:?}");
    let by = started[0].worker.clone().unwrap_or_default();
    assert_ne!(by, first, "run under the session presumed dead");
    assert!(
        backends.store.worker(&by).await.unwrap().is_some(),
        "the new session {by} is registered"
    );
    stop.cancel();
    running.await.unwrap().unwrap();
}

/// The other side of the rule above: a job this session has just started must never be taken
/// for an orphan. Duplicate messages of one job (a republish after the broker's marker went
/// missing, say) often come in the same batch or in two rounds close together; the duplicate's
/// start finds the job `running` under this worker, and if the first start's handler is not yet
/// claimed, the old check ran the job a second time under the same epoch. Here every job has
/// three messages and each run is counted by (job, epoch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_messages_never_run_a_job_twice_in_one_epoch() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/homing.db", dir.path().display());
    let backends = Backends::open(&url, &url).await.unwrap();
    let q = unique_queue("dups");
    const JOBS: usize = 600;
    let mut ids = Vec::new();
    let mut jobs = Vec::new();
    for _ in 0..JOBS {
        let j = new_job(&q, "t.dup");
        ids.push(j.id);
        jobs.push(j);
    }
    backends.store.insert(jobs).await.unwrap();
    let publish: Vec<ToPublish> = ids
        .iter()
        .flat_map(|id| {
            std::iter::repeat_n(
                ToPublish {
                    id: *id,
                    queue: q.clone(),
                    priority: 0,
                },
                3,
            )
        })
        .collect();
    // Interleaved so that a job's duplicates land in one reserve batch as often as in the next.
    backends.broker.publish(&publish).await.unwrap();

    let runs: Arc<Mutex<HashMap<(homing::JobId, u64), usize>>> = Arc::default();
    let mut tasks = Registry::new();
    let r2 = runs.clone();
    tasks.register_fn(
        "t.dup",
        TaskDefaults::default(),
        move |c: Context, _a: Value| {
            let runs = r2.clone();
            async move {
                *runs
                    .lock()
                    .unwrap()
                    .entry((c.job().id, c.epoch()))
                    .or_default() += 1;
                tokio::task::yield_now().await;
                Ok(json!("ran"))
            }
        },
    );
    let worker = Worker::new(
        backends.broker.clone(),
        backends.store.clone(),
        tasks,
        WorkerConfig {
            queues: vec![q.clone()],
            maintenance: false,
            ..WorkerConfig::default()
        },
    );
    let stop = homing::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut done = 0;
        for id in &ids {
            if backends.store.get(*id).await.unwrap().unwrap().state == JobState::Succeeded {
                done += 1;
            }
        }
        if done == JOBS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {JOBS} jobs succeeded in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    running.await.unwrap().unwrap();
    let runs = runs.lock().unwrap();
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} of {JOBS} jobs ran more than once in one epoch, e.g. {:?}",
        twice.len(),
        twice.first()
    );
    assert_eq!(runs.len(), JOBS, "every job ran once");
}

/// An outcome the store answers unstored (its update and even making the job dead refused, or
/// the store gone between the isolated transactions of a batch) leaves the job `running` under
/// its worker, which keeps the message and commits the outcome again after a pause
/// (`support/unstored.rs`; the same on Redis in redis_broker.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_the_store_cannot_take_yet_is_committed_later_with_one_run() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/homing.db", dir.path().display());
    let backends = Backends::open(&url, &url).await.unwrap();
    let db = backends
        .store
        .embedded_db()
        .expect("an embedded store")
        .clone();
    unstored::refused_then_taken(backends.broker, backends.store, db).await;
}
