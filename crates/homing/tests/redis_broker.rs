//! What the Redis broker must do beyond the shared conformance suite, on a real `redis-server`:
//! garbage written straight into a stream, a lost worker's messages, Redis losing its data
//! (`FLUSHALL`), the connection going away and coming back, and a worker running end to end.

#[path = "support/redis_server.rs"]
mod redis_server;
#[path = "support/unstored.rs"]
mod unstored;

use std::sync::Arc;
use std::time::{Duration, Instant};

use homing::broker::redis::RedisBroker;
use homing::broker::{Broker, Delivery};
use homing::conformance::{new_job, unique_queue};
use homing::maintenance::{reconciler, rescuer, MaintenanceConfig};
use homing::sqlite::Db;
use homing::store::sqlite::SqliteStore;
use homing::store::{StartOutcome, Store, ToPublish};
use homing::{Client, EnqueueRequest, JobId, JobState, Worker, WorkerConfig};
use redis_server::{shared, unique_prefix, RedisServer};

const SHORT: Duration = Duration::from_millis(50);

async fn open(url: &str) -> Arc<RedisBroker> {
    Arc::new(RedisBroker::open(url).await.expect("open redis broker"))
}

fn sqlite_store() -> Arc<dyn Store> {
    let dir = tempfile::tempdir().expect("temp dir").keep();
    Arc::new(SqliteStore::new(
        Db::open(dir.join("homing.db")).expect("open sqlite"),
    ))
}

/// A worker presumed dead before it notices (Redis lost its heartbeat with its data; its next
/// beat is up to an interval away) keeps reserving, and takes back at once what the rescuer
/// puts back. The rescuer used to chase it until it held nothing, counting a crash on each round
/// trip: under `homing chaos` jobs of a healthy worker went `dead` within a second of a Redis
/// restart. Here a consumer with no heartbeat holds 150 running jobs (more than a page of the
/// rescuer's listing) and starts every message it gets again, as that worker would, for 1.5 s.
/// One sweep must count one crash per job (before the fix: all 150 `dead`, three crashes each);
/// after the consumer stops, the next sweep reclaims what it took back and forgets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_worker_that_keeps_reserving_is_not_chased() {
    const JOBS: usize = 150;
    let server = shared();
    let b = open(&server.url(&unique_prefix("chased"))).await;
    let store = sqlite_store();
    let q = unique_queue("chased");
    let ids = held_by_a_lost_consumer(&b, &store, &q, JOBS).await;
    let zombie = Zombie::spawn(&b, &store, &q, JOBS);
    let report = rescuer::sweep(&*b, &*store).await.unwrap();
    assert_eq!(report.requeued, JOBS, "{report:?}");
    for id in &ids {
        let j = store.get(*id).await.unwrap().unwrap();
        assert_eq!(
            j.crashes, 1,
            "one sweep counted {} crashes: {j:?}",
            j.crashes
        );
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        zombie.notice().await.0 > 0,
        "the consumer took nothing back: the test did not test"
    );

    let report = rescuer::sweep(&*b, &*store).await.unwrap();
    assert_eq!(report.lost_workers, 1, "{report:?}");
    all_back_once(&b, &q, &ids).await;
    for id in &ids {
        let j = store.get(*id).await.unwrap().unwrap();
        assert_eq!(j.state, JobState::Queued, "{j:?}");
        assert!(j.crashes <= 2, "{j:?}");
    }
}

/// The same worker, still unaware, against several rescuers (every process with maintenance runs
/// one): each reclaims a job it takes back at most once a sweep, but together they used to count
/// a crash each time, and at the default budget of 3 a job of a healthy worker went `dead`. Now
/// every rescuer reads when the worker was first presumed dead from the store, and a run begun
/// after that counts no crash: every job ends with exactly the one crash of the run it had when
/// the worker was presumed dead. And no such run begins: the store refuses the starts of a
/// worker presumed dead (`StartOutcome::Presumed`), so none of its jobs runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_worker_that_keeps_reserving_spends_no_crash_budget_however_many_rescuers() {
    const JOBS: usize = 40;
    const RESCUERS: usize = 4;
    let server = shared();
    let b = open(&server.url(&unique_prefix("rescuers"))).await;
    let store = sqlite_store();
    let q = unique_queue("rescuers");
    let t = homing::time::now();
    let info = homing::store::WorkerInfo {
        id: "z".into(),
        hostname: "h".into(),
        pid: 1,
        queues: vec![q.clone()],
        concurrency: JOBS as u32,
        tasks: vec!["t".into()],
        started_at: t,
        remote: None,
        version: None,
        heartbeat_ttl_ms: Some(200),
    };
    store.register_worker(&info, t).await.unwrap();
    let ids = held_by_a_lost_consumer(&b, &store, &q, JOBS).await;
    let zombie = Zombie::spawn(&b, &store, &q, JOBS);
    let mut rescuers = Vec::new();
    for _ in 0..RESCUERS {
        let (b, store) = (b.clone(), store.clone());
        rescuers.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_millis(1500);
            let mut dead = 0;
            while Instant::now() < until {
                dead += rescuer::sweep(&*b, &*store).await.unwrap().dead;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            dead
        }));
    }
    let mut dead = 0;
    for r in rescuers {
        dead += r.await.unwrap();
    }
    let (retaken, ran) = zombie.notice().await;
    assert!(
        retaken >= JOBS,
        "the consumer took back {retaken} messages: the test did not test"
    );
    assert_eq!(dead, 0, "jobs of a worker that was only unaware went dead");
    // Every message it took back was put back after the first rescuer presumed it dead, so the
    // store started none of them: no job ran twice.
    assert_eq!(ran, 0, "the store started jobs for a worker presumed dead");

    rescuer::sweep(&*b, &*store).await.unwrap();
    all_back_once(&b, &q, &ids).await;
    for id in &ids {
        let j = store.get(*id).await.unwrap().unwrap();
        assert_eq!((j.state, j.crashes), (JobState::Queued, 1), "{j:?}");
        let h = store.history(*id).await.unwrap();
        assert_eq!(homing::history::disagreement(&j, &h), None, "{h:?}");
    }
}

/// `jobs` jobs of `q`, reserved and started by consumer `z`, whose heartbeat (200 ms) has
/// expired: a worker presumed dead.
async fn held_by_a_lost_consumer(
    b: &Arc<RedisBroker>,
    store: &Arc<dyn Store>,
    q: &str,
    jobs: usize,
) -> Vec<JobId> {
    let mut ids = Vec::new();
    for _ in 0..jobs {
        ids.push(enqueued(&**store, &**b, q).await);
    }
    b.register("z", Duration::from_millis(200)).await.unwrap();
    let got = b.reserve("z", &[q.to_string()], jobs, SHORT).await.unwrap();
    assert_eq!(got.len(), jobs);
    store.start(&ids, "z", homing::time::now()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(b.lost_consumers().await.unwrap().contains(&"z".to_string()));
    ids
}

/// Consumer `z` as a worker that has not noticed it was presumed dead: whatever it gets, it
/// starts, until told it noticed.
struct Zombie {
    noticed: Arc<std::sync::atomic::AtomicBool>,
    retaken: Arc<std::sync::atomic::AtomicUsize>,
    ran: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Zombie {
    fn spawn(b: &Arc<RedisBroker>, store: &Arc<dyn Store>, q: &str, max: usize) -> Zombie {
        use std::sync::atomic::Ordering;
        let noticed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let retaken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (b, store, q) = (b.clone(), store.clone(), q.to_string());
        let ran_here = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (stop, count, ran) = (noticed.clone(), retaken.clone(), ran_here.clone());
        let task = tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let got = b
                    .reserve("z", std::slice::from_ref(&q), max, Duration::from_millis(1))
                    .await
                    .unwrap();
                let ids: Vec<JobId> = got.iter().filter_map(|d| d.job.clone().ok()).collect();
                if !ids.is_empty() {
                    count.fetch_add(ids.len(), Ordering::SeqCst);
                    let out = store.start(&ids, "z", homing::time::now()).await.unwrap();
                    let runs = out
                        .iter()
                        .filter(|o| matches!(o, homing::store::StartOutcome::Run(_)))
                        .count();
                    ran.fetch_add(runs, Ordering::SeqCst);
                }
            }
        });
        Zombie {
            noticed,
            retaken,
            ran: ran_here,
            task,
        }
    }

    /// Stops it; how many messages it took back, and how many of their jobs the store let it
    /// start.
    async fn notice(self) -> (usize, usize) {
        use std::sync::atomic::Ordering;
        self.noticed.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        (
            self.retaken.load(Ordering::SeqCst),
            self.ran.load(Ordering::SeqCst),
        )
    }
}

/// `z` is forgotten, and every job's message is back in `q`, once.
async fn all_back_once(b: &Arc<RedisBroker>, q: &str, ids: &[JobId]) {
    assert!(!b.lost_consumers().await.unwrap().contains(&"z".to_string()));
    let again = b
        .reserve("w2", &[q.to_string()], ids.len(), SHORT)
        .await
        .unwrap();
    let mut back: Vec<JobId> = again.iter().filter_map(|d| d.job.clone().ok()).collect();
    back.sort();
    let mut want = ids.to_vec();
    want.sort();
    assert_eq!(back, want, "every job's message is back, once");
}

/// A job in the store, published to the broker, as `Client::enqueue` leaves it.
async fn enqueued(store: &dyn Store, broker: &dyn Broker, queue: &str) -> JobId {
    let job = new_job(queue, "t");
    let id = job.id;
    store.insert(vec![job]).await.expect("insert");
    broker
        .publish(&[ToPublish {
            id,
            queue: queue.to_string(),
            priority: 0,
        }])
        .await
        .expect("publish");
    store.mark_dispatched(&[id]).await.expect("dispatched");
    id
}

/// A raw connection to `server`, for writing what no homing producer would.
async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url("raw"))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_a_stream_is_delivered_undecodable_and_dead_lettered() {
    let server = shared();
    let b = open(&server.url(&unique_prefix("garbage"))).await;
    let q = unique_queue("g");
    let good = homing::job::new_job_id();
    b.publish(&[ToPublish {
        id: good,
        queue: q.clone(),
        priority: 0,
    }])
    .await
    .unwrap();
    let stream = b.keys().stream(&q);
    server.cli(&["XADD", &stream, "*", "foo", "bar"]);
    server.cli(&["XADD", &stream, "*", "job", "not-a-uuid"]);
    let mut c = raw(server).await;
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("job")
        .arg(&[0xffu8, 0xfe][..])
        .query_async(&mut c)
        .await
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg(&[0xffu8][..])
        .arg("binary field name")
        .query_async(&mut c)
        .await
        .unwrap();

    let got = b
        .reserve("w", std::slice::from_ref(&q), 10, SHORT)
        .await
        .unwrap();
    assert_eq!(got.len(), 5, "garbage is delivered, not dropped: {got:?}");
    assert_eq!(got[0].job, Ok(good));
    let bad: Vec<&Delivery> = got.iter().filter(|d| d.job.is_err()).collect();
    assert_eq!(bad.len(), 4);
    for d in &bad {
        let reason = d.job.clone().unwrap_err();
        assert!(reason.starts_with("undecodable message"), "{reason}");
        b.dead_letter(d, &reason).await.unwrap();
    }

    let dl = b.dead_letters(100).await.unwrap();
    assert_eq!(dl.len(), 4);
    assert!(dl.iter().all(|d| d.queue == q && d.at > 0));
    assert!(
        dl.iter()
            .any(|d| d.payload.contains("foo") && d.payload.contains("bar")),
        "the garbage stays inspectable: {dl:?}"
    );
    assert!(dl.iter().any(|d| d.payload == "not-a-uuid"));
    assert_eq!(
        server.cli(&["XLEN", &stream]),
        "1",
        "only the good message is left"
    );
    let depth = b
        .depths()
        .await
        .unwrap()
        .into_iter()
        .find(|d| d.queue == q)
        .unwrap();
    assert_eq!((depth.ready, depth.reserved, depth.dead_letters), (0, 1, 4));
    let pending = b.pending("w", 10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].job, Ok(good));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_worker_s_messages_are_requeued_by_the_rescuer() {
    let server = shared();
    let b = open(&server.url(&unique_prefix("lost"))).await;
    let store = sqlite_store();
    let q = unique_queue("lost");
    let id = enqueued(&*store, &*b, &q).await;
    server.cli(&["XADD", &b.keys().stream(&q), "*", "not", "a job"]);

    b.register("w1", Duration::from_millis(200)).await.unwrap();
    let got = b
        .reserve("w1", std::slice::from_ref(&q), 10, SHORT)
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    let outcome = store.start(&[id], "w1", homing::time::now()).await.unwrap();
    assert!(matches!(outcome[0], StartOutcome::Run(_)));

    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(!b.heartbeat("w1", Duration::from_secs(1)).await.unwrap());
    assert!(b
        .lost_consumers()
        .await
        .unwrap()
        .contains(&"w1".to_string()));

    let report = rescuer::sweep(&*b, &*store).await.unwrap();
    assert_eq!(report.requeued, 1, "{report:?}");
    assert_eq!(report.lost_workers, 1, "{report:?}");
    let job = store.get(id).await.unwrap().unwrap();
    assert_eq!((job.state, job.crashes), (JobState::Queued, 1));
    assert!(b
        .dead_letters(10)
        .await
        .unwrap()
        .iter()
        .any(|d| d.queue == q && d.payload.contains("a job")));

    // The lost worker is gone from Redis entirely, and its message went to the next worker.
    assert!(!b
        .lost_consumers()
        .await
        .unwrap()
        .contains(&"w1".to_string()));
    let consumers = server.cli(&["XINFO", "CONSUMERS", &b.keys().stream(&q), "homing"]);
    assert!(!consumers.contains("w1"), "{consumers}");
    assert!(b.pending("w1", 10).await.unwrap().is_empty());
    let again = b
        .reserve("w2", std::slice::from_ref(&q), 10, SHORT)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].job, Ok(id));
    assert_ne!(
        again[0].tag, got[0].tag,
        "a requeued message is a new entry"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pending_entry_is_acknowledged_away() {
    let server = shared();
    let b = open(&server.url(&unique_prefix("deleted"))).await;
    let q = unique_queue("del");
    let ids: Vec<JobId> = (0..2).map(|_| homing::job::new_job_id()).collect();
    let msgs: Vec<ToPublish> = ids
        .iter()
        .map(|id| ToPublish {
            id: *id,
            queue: q.clone(),
            priority: 0,
        })
        .collect();
    b.publish(&msgs).await.unwrap();
    let got = b
        .reserve("w", std::slice::from_ref(&q), 10, SHORT)
        .await
        .unwrap();
    let stream = b.keys().stream(&q);
    let entry_id = got[0].tag.split('.').next().unwrap();
    assert_eq!(server.cli(&["XDEL", &stream, entry_id]), "1");

    let pending = b.pending("w", 10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].job, Ok(ids[1]));
    let summary = server.cli(&["XPENDING", &stream, "homing"]);
    assert!(
        summary.starts_with('1'),
        "the deleted id left the pending list: {summary}"
    );
    assert_eq!(b.requeue("w", &got[..1]).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserving_from_several_queues_never_exceeds_max() {
    let b = open(&shared().url(&unique_prefix("multi"))).await;
    let (qa, qb) = (unique_queue("qa"), unique_queue("qb"));
    let msgs: Vec<ToPublish> = [&qa, &qa, &qa, &qb, &qb, &qb]
        .iter()
        .map(|q| ToPublish {
            id: homing::job::new_job_id(),
            queue: q.to_string(),
            priority: 0,
        })
        .collect();
    b.publish(&msgs).await.unwrap();
    let queues = [qa.clone(), qb.clone()];
    let first = b.reserve("w", &queues, 4, SHORT).await.unwrap();
    assert_eq!(first.len(), 4);
    assert_eq!(b.pending("w", 100).await.unwrap().len(), 4);
    let rest = b.reserve("w", &queues, 10, SHORT).await.unwrap();
    assert_eq!(rest.len(), 2);
    assert!(b.reserve("w", &queues, 10, SHORT).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reservation_picks_up_a_requeued_message() {
    let b = open(&shared().url(&unique_prefix("wake"))).await;
    let q = unique_queue("wake");
    let id = homing::job::new_job_id();
    b.publish(&[ToPublish {
        id,
        queue: q.clone(),
        priority: 0,
    }])
    .await
    .unwrap();
    let lost = b
        .reserve("lost", std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap();
    let b2 = b.clone();
    let requeuer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        b2.requeue("lost", &lost).await.unwrap()
    });
    // Requeueing adds nothing to the stream, so it cannot wake a blocked XREADGROUP; the wait
    // is sliced so the message is still picked up long before the wait ends.
    let t = Instant::now();
    let got = b
        .reserve(
            "fresh",
            std::slice::from_ref(&q),
            1,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(requeuer.await.unwrap(), 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job, Ok(id));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

/// A blocked `XREADGROUP` legitimately stays unanswered for a whole `BLOCK` slice, longer than
/// redis-rs's default response timeout (500 ms since 1.0): the reader's own connection must not
/// give up on it, or a quiet queue turns every wait into an `Unavailable` error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_waits_on_a_quiet_queue_without_timing_out() {
    let b = open(&shared().url(&unique_prefix("quiet"))).await;
    let q = unique_queue("quiet");
    let id = homing::job::new_job_id();
    let (b2, q2) = (b.clone(), q.clone());
    let publisher = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        b2.publish(&[ToPublish {
            id,
            queue: q2,
            priority: 0,
        }])
        .await
        .unwrap();
    });
    let got = b
        .reserve("c", std::slice::from_ref(&q), 1, Duration::from_secs(30))
        .await
        .expect("a long wait on a quiet queue is not an error");
    publisher.await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job, Ok(id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_is_detected_and_the_store_re_dispatches() {
    let server = RedisServer::unix();
    let b = open(&server.url("flush")).await;
    let store = sqlite_store();
    let q = unique_queue("flush");
    let id = enqueued(&*store, &*b, &q).await;

    assert!(
        !b.check_marker().await.unwrap(),
        "a fresh server has no marker"
    );
    assert!(b.check_marker().await.unwrap());
    b.register("w", Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        b.reserve("w", std::slice::from_ref(&q), 1, SHORT)
            .await
            .unwrap()
            .len(),
        1
    );

    server.cli(&["FLUSHALL"]);

    assert!(
        !b.heartbeat("w", Duration::from_secs(30)).await.unwrap(),
        "a worker whose heartbeat vanished learns it was presumed dead"
    );
    assert!(b.pending("w", 10).await.unwrap().is_empty());
    let config = MaintenanceConfig {
        dispatch_grace: Duration::ZERO,
        ..MaintenanceConfig::for_heartbeat(Duration::from_millis(100))
    };
    let report = reconciler::pass(&*b, &*store, &config, false)
        .await
        .unwrap();
    assert!(report.broker_data_lost, "{report:?}");
    assert_eq!(report.published, 1, "{report:?}");
    assert!(b.check_marker().await.unwrap(), "the marker is set again");

    // The group vanished with the data; reserving re-creates it and finds the re-published job.
    let got = b
        .reserve("w2", std::slice::from_ref(&q), 10, SHORT)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job, Ok(id));
    assert_eq!(b.depths().await.unwrap()[0].reserved, 1);
}

/// Runs `op` against a stopped server: it must fail as `Unavailable`, quickly.
async fn fails_fast<T: std::fmt::Debug>(
    what: &str,
    op: impl std::future::Future<Output = homing::Result<T>>,
) {
    let t = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(15), op)
        .await
        .unwrap_or_else(|_| panic!("{what} hung with the server down"));
    let e = r.expect_err(what);
    assert!(e.is_transient(), "{what}: {e:?} should be Unavailable");
    assert!(!e.to_string().contains("s3cret"), "password leaked: {e}");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "{what} took {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_loss_is_unavailable_and_the_same_broker_recovers() {
    let mut server = RedisServer::tcp("s3cret");
    let b = open(&server.url("conn")).await;
    let q = unique_queue("conn");
    let msg = |id| ToPublish {
        id,
        queue: q.clone(),
        priority: 0,
    };
    b.publish(&[msg(homing::job::new_job_id())]).await.unwrap();
    let got = b
        .reserve("w", std::slice::from_ref(&q), 1, SHORT)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    b.register("w", Duration::from_secs(30)).await.unwrap();

    server.stop();
    let queues = [q.clone()];
    fails_fast("publish", b.publish(&[msg(homing::job::new_job_id())])).await;
    fails_fast(
        "reserve",
        b.reserve("w", &queues, 1, Duration::from_millis(300)),
    )
    .await;
    fails_fast("ack", b.ack(&got)).await;
    fails_fast("heartbeat", b.heartbeat("w", Duration::from_secs(30))).await;
    fails_fast("lost_consumers", b.lost_consumers()).await;
    fails_fast("check_marker", b.check_marker()).await;

    server.restart();
    let id = homing::job::new_job_id();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match b.publish(&[msg(id)]).await {
            Ok(()) => break,
            Err(e) => {
                assert!(e.is_transient(), "{e:?}");
                assert!(Instant::now() < deadline, "never reconnected: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let got = loop {
        match b.reserve("w", std::slice::from_ref(&q), 1, SHORT).await {
            Ok(got) => break got,
            Err(e) => {
                assert!(e.is_transient(), "{e:?}");
                assert!(Instant::now() < deadline, "reserve never recovered: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job, Ok(id));
    assert!(
        !b.check_marker().await.unwrap(),
        "the restarted server (no persistence) lost the marker"
    );
}

/// A worker of the built-in tasks on `b` and `store`, running until its token is cancelled.
fn run_builtin_worker(
    b: &Arc<RedisBroker>,
    store: &Arc<dyn Store>,
    config: WorkerConfig,
) -> (
    homing::CancellationToken,
    tokio::task::JoinHandle<homing::Result<()>>,
) {
    let worker = Worker::new(
        b.clone(),
        store.clone(),
        homing::builtin::registry(),
        config,
    );
    let stop = homing::CancellationToken::new();
    (stop.clone(), tokio::spawn(worker.run(stop)))
}

/// `n` no-op jobs in `queue`, each returning its number.
async fn enqueue_noops(client: &Client, queue: &str, n: usize) -> Vec<JobId> {
    let mut ids = Vec::new();
    for req in noops(queue, n) {
        ids.push(client.enqueue(req).await.unwrap().id);
    }
    ids
}

fn noops(queue: &str, n: usize) -> Vec<EnqueueRequest> {
    (0..n)
        .map(|n| {
            let mut req = EnqueueRequest::new("builtin.noop", serde_json::json!({ "n": n }));
            req.options.queue = Some(queue.to_string());
            req
        })
        .collect()
}

/// Waits for every job to succeed; returns the distinct start and finish times (one per start
/// call and one per commit: a call stamps all its jobs with one time).
async fn rounds_of(
    client: &Client,
    ids: &[JobId],
) -> (
    std::collections::BTreeSet<i64>,
    std::collections::BTreeSet<i64>,
) {
    let mut starts = std::collections::BTreeSet::new();
    let mut commits = std::collections::BTreeSet::new();
    for id in ids {
        let job = client.wait(*id, Duration::from_secs(60)).await.unwrap();
        assert_eq!(job.state, JobState::Succeeded, "{job:?}");
        starts.insert(job.started_at.expect("a started job has started_at"));
        commits.insert(job.finished_at.expect("a finished job has finished_at"));
    }
    (starts, commits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_runs_jobs_end_to_end_on_redis() {
    let server = shared();
    let b = open(&server.url(&unique_prefix("e2e"))).await;
    let store = sqlite_store();
    let q = unique_queue("e2e");
    let client = Client::new(b.clone(), store.clone());
    let ids = enqueue_noops(&client, &q, 20).await;
    let config = WorkerConfig {
        queues: vec![q.clone()],
        concurrency: 4,
        heartbeat_interval: Duration::from_millis(200),
        ..WorkerConfig::default()
    };
    let (stop, running) = run_builtin_worker(&b, &store, config);
    for (n, id) in ids.iter().enumerate() {
        let job = client.wait(*id, Duration::from_secs(20)).await.unwrap();
        assert_eq!(job.state, JobState::Succeeded, "{job:?}");
        assert_eq!(job.result, Some(serde_json::json!({ "n": n })));
    }
    // The worker's first reconciler pass finds no marker (a fresh namespace) and publishes the
    // queued jobs again; those duplicates are skipped by the guard and acknowledged too. Every
    // acknowledged message must leave the stream.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.cli(&["XLEN", &b.keys().stream(&q)]) != "0" {
        assert!(
            Instant::now() < deadline,
            "acknowledged messages are deleted: {} left",
            server.cli(&["XLEN", &b.keys().stream(&q)])
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await.unwrap().unwrap();
    assert!(
        b.lost_consumers().await.unwrap().is_empty(),
        "a worker that shut down cleanly is not lost"
    );
}

/// A busy worker moves its jobs in whole rounds: a round's jobs start in one store call and
/// commit in one, so with a backlog nearly every round is the worker's full concurrency. The
/// rounds are read from the records: a start call stamps every job it starts with one
/// `started_at`, a commit stamps every outcome with one `finished_at`. Rounds used to fall apart
/// (a round's last job committed on its own, its reservation came back alone, and the fetcher
/// reserved it alone), to about three jobs per round at concurrency 8. Counts, not speeds, are
/// asserted; a few partial rounds (the last one, a commit that outlasts the fetcher's wait on a
/// loaded machine) are allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_worker_starts_and_commits_in_whole_rounds() {
    const JOBS: usize = 400;
    const CONCURRENCY: usize = 8;
    let server = shared();
    let b = open(&server.url(&unique_prefix("rounds"))).await;
    // As an installation that ran before: no first-start re-dispatch, whose duplicate messages
    // would make rounds of their own.
    b.check_marker().await.unwrap();
    let store = sqlite_store();
    let q = unique_queue("rounds");
    let client = Client::new(b.clone(), store.clone());
    let ids = enqueue_noops(&client, &q, JOBS).await;
    let config = WorkerConfig {
        queues: vec![q.clone()],
        concurrency: CONCURRENCY,
        ..WorkerConfig::default()
    };
    let (stop, running) = run_builtin_worker(&b, &store, config);
    let (starts, commits) = rounds_of(&client, &ids).await;
    stop.cancel();
    running.await.unwrap().unwrap();
    let per_start = JOBS as f64 / starts.len() as f64;
    let per_commit = JOBS as f64 / commits.len() as f64;
    eprintln!(
        "{} start calls ({per_start:.1} jobs each), {} commits ({per_commit:.1} jobs each)",
        starts.len(),
        commits.len()
    );
    assert!(
        per_start >= 6.0,
        "jobs per start call: {per_start:.1} ({} calls for {JOBS} jobs at concurrency {CONCURRENCY})",
        starts.len()
    );
    assert!(
        per_commit >= 6.0,
        "jobs per commit: {per_commit:.1} ({} commits for {JOBS} jobs at concurrency {CONCURRENCY})",
        commits.len()
    );
}

/// A busy worker's round acknowledges its messages and reserves their successors in one script
/// call (`Broker::ack_and_reserve`, with the acknowledged messages' reservations) rather than an
/// acknowledgement from the committer and then a reservation from the fetcher. Redis's own
/// command counts show it: about one `EVALSHA` per round with it, two without (the few other
/// calls are the worker's registration and maintenance). A server of its own, so that no other
/// test's commands are counted.
///
/// The backlog arrives just after a few jobs trickled into the idle worker, so the first rounds
/// are partial; only whole rounds carry their reservations over, partial ones give them back
/// and the fetcher joins them (`fetcher::settle`), and the drain still starts 8 jobs per call.
/// (What carrying partial rounds over did, now and then, is in BENCHMARKS.md: it showed in a
/// drain of 20,000 jobs by two workers, not in this one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_worker_acknowledges_and_reserves_in_one_call() {
    const JOBS: usize = 400;
    let server = RedisServer::unix();
    let b = open(&server.url(&unique_prefix("handon"))).await;
    b.check_marker().await.unwrap();
    let store = sqlite_store();
    let q = unique_queue("handon");
    let client = Client::new(b.clone(), store.clone());
    let config = WorkerConfig {
        queues: vec![q.clone()],
        concurrency: 8,
        ..WorkerConfig::default()
    };
    let (stop, running) = run_builtin_worker(&b, &store, config);
    // One at a time into the idle worker: each is reserved alone, in a round of its own.
    enqueue_noops(&client, &q, 3).await;
    let scripts_before = script_calls(&server);
    let inserted = client.enqueue_many(noops(&q, JOBS)).await.unwrap();
    let ids: Vec<JobId> = inserted.into_iter().map(|i| i.id).collect();
    let (starts, commits) = rounds_of(&client, &ids).await;
    let calls = script_calls(&server) - scripts_before;
    // Nothing left reserved once the last acknowledgement is in: no round reserved a message
    // it then lost track of.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let depth = b.depths().await.unwrap();
        let left = depth
            .iter()
            .find(|d| d.queue == q)
            .map_or(0, |d| d.ready + d.reserved);
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} messages left after the drain: {depth:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    running.await.unwrap().unwrap();
    let per_round = calls as f64 / commits.len() as f64;
    let per_start = JOBS as f64 / starts.len() as f64;
    eprintln!(
        "{calls} script calls for {} rounds ({per_round:.2} per round); {} start calls ({per_start:.1} jobs each)",
        commits.len(),
        starts.len()
    );
    assert!(
        per_round < 1.5,
        "script calls per round: {per_round:.2} ({calls} calls, {} rounds)",
        commits.len()
    );
    assert!(
        per_start >= 6.0,
        "jobs per start call: {per_start:.1} ({} calls for {JOBS} jobs): split rounds did not join",
        starts.len()
    );
}

/// How many script calls (`EVALSHA`) the server has answered.
fn script_calls(server: &RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map(|n| n.parse().expect("a count"))
        .unwrap_or(0)
}

/// A queue's band streams vanish (Redis lost its data) while this process believes their groups
/// exist: a prioritised message published afterwards sits in a band stream without a group.
/// The non-blocking reservation and the blocked one both create the groups again and deliver it,
/// tagged with its band, and its ack removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn band_streams_lost_with_their_groups_are_recreated() {
    let server = shared();
    let b = open(&server.url(&unique_prefix("bands"))).await;
    let q = unique_queue("bands");
    let publish = |priority: i32| {
        let b = b.clone();
        let q = q.clone();
        async move {
            let id = homing::job::new_job_id();
            b.publish(&[ToPublish {
                id,
                queue: q,
                priority,
            }])
            .await
            .unwrap();
            id
        }
    };
    let first = publish(0).await;
    let got = b
        .reserve("c", std::slice::from_ref(&q), 10, SHORT)
        .await
        .unwrap();
    assert_eq!(got[0].job, Ok(first));
    b.ack(&got).await.unwrap();
    let streams = b.keys().streams(&q);
    assert_eq!(streams.len(), 7);
    for s in &streams {
        assert_eq!(
            server.cli(&["EXISTS", s]),
            "1",
            "{s} created with its group"
        );
    }

    let forget = || {
        let mut args = vec!["DEL"];
        args.extend(streams.iter().map(String::as_str));
        server.cli(&args);
    };
    forget();
    let high = publish(50).await;
    let got = b
        .reserve("c", std::slice::from_ref(&q), 10, SHORT)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job, Ok(high));
    assert!(
        got[0].tag.ends_with(".2"),
        "band 2 in the tag: {}",
        got[0].tag
    );
    b.ack(&got).await.unwrap();
    assert!(b.pending("c", 10).await.unwrap().is_empty());

    forget();
    let later = publish(-50);
    let publisher = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        later.await
    });
    let got = b
        .reserve("c", std::slice::from_ref(&q), 10, Duration::from_secs(5))
        .await
        .unwrap();
    let low = publisher.await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job, Ok(low));
    assert!(
        got[0].tag.ends_with(".-2"),
        "band -2 in the tag: {}",
        got[0].tag
    );
    b.ack(&got).await.unwrap();
    assert_eq!(server.cli(&["XLEN", &b.keys().band_stream(&q, -2)]), "0");
}

/// Waits (at most 20 s) for job `id` to run; returns the worker that runs it.
async fn worker_running(client: &Client, id: JobId) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let job = client.get(id).await.unwrap();
        if job.state == JobState::Running {
            return job.worker.expect("a running job names its worker");
        }
        assert!(Instant::now() < deadline, "job {id} never started: {job:?}");
        tokio::time::sleep(SHORT).await;
    }
}

/// Takes the next message of `q`'s default band under `consumer`'s name, as a reservation
/// whose answer was lost leaves it; answers what `XREADGROUP` printed.
fn take_one_under(server: &RedisServer, b: &RedisBroker, q: &str, consumer: &str) -> String {
    server.cli(&[
        "XREADGROUP",
        "GROUP",
        homing::broker::redis::keys::GROUP,
        consumer,
        "COUNT",
        "1",
        "STREAMS",
        &b.keys().stream(q),
        ">",
    ])
}

/// The messages of `q`'s default band reserved under `consumer`: `XPENDING` prints id,
/// consumer, idle time and delivery count, a line each.
fn pending_under(server: &RedisServer, b: &RedisBroker, q: &str, consumer: &str) -> String {
    server.cli(&[
        "XPENDING",
        &b.keys().stream(q),
        homing::broker::redis::keys::GROUP,
        "-",
        "+",
        "10",
        consumer,
    ])
}

/// A reservation that ran on the server but whose answer never reached the worker (the
/// connection broke after the script) leaves its message reserved under the worker's name,
/// unknown to the worker. Its sweep (`worker::strays`) puts the message back; before it, the
/// job stayed queued until the worker stopped, which for a long-lived worker is never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_reserved_under_a_live_worker_without_its_knowledge_is_put_back() {
    let server = shared();
    let b = open(&server.url(&unique_prefix("stray"))).await;
    let store = sqlite_store();
    let q = unique_queue("stray");
    let client = Client::new(b.clone(), store.clone());
    let config = WorkerConfig {
        queues: vec![q.clone()],
        concurrency: 1,
        // A sweep every second.
        heartbeat_interval: Duration::from_millis(100),
        // No reconciler here: its first pass would publish the job a second time, and that copy
        // would run it whatever the sweep does.
        maintenance: false,
        ..WorkerConfig::default()
    };
    let (stop, running) = run_builtin_worker(&b, &store, config);
    // The worker's one slot and one reservation go to a job that sleeps.
    let mut req = EnqueueRequest::new("builtin.sleep", serde_json::json!({ "ms": 1500 }));
    req.options.queue = Some(q.clone());
    let busy = client.enqueue(req).await.unwrap().id;
    let worker = worker_running(&client, busy).await;
    // The next job's message is taken under the worker's name while the worker cannot reserve,
    // as a reservation whose answer was lost leaves it.
    let orphan = enqueue_noops(&client, &q, 1).await[0];
    let took = take_one_under(server, &b, &q, &worker);
    assert!(
        took.contains(&orphan.to_string()),
        "the test reserved the job's message: {took}"
    );
    let job = client.wait(orphan, Duration::from_secs(30)).await.unwrap();
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    assert_eq!(job.worker.as_deref(), Some(worker.as_str()));
    assert_eq!(client.get(busy).await.unwrap().state, JobState::Succeeded);
    stop.cancel();
    running.await.unwrap().unwrap();
}

/// An outcome the store cannot take yet stays with its worker, message and all, and is
/// committed again after a pause (`support/unstored.rs`, where the embedded broker runs it too):
/// handed back to Redis, the message went to the other worker, which acknowledged it as a
/// duplicate and left the job `running`, or to the same one, which ran it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_the_store_cannot_take_yet_is_committed_later_with_one_run() {
    let server = shared();
    let b = open(&server.url(&unique_prefix("unstored"))).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let db = Db::open(dir.path().join("homing.db")).expect("open sqlite");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::new(db.clone()));
    unstored::refused_then_taken(b, store, db).await;
}

/// The sweep for strays never touches a message the worker did receive, however long it waits:
/// with a prefetch above the concurrency, a message reserved behind a long job waits for the slot
/// through two sweeps and is still this worker's, delivered once, when the slot frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_received_message_waiting_for_a_slot_is_not_put_back() {
    let server = shared();
    let b = open(&server.url(&unique_prefix("waiting"))).await;
    let store = sqlite_store();
    let q = unique_queue("waiting");
    let client = Client::new(b.clone(), store.clone());
    let config = WorkerConfig {
        queues: vec![q.clone()],
        concurrency: 1,
        prefetch: Some(2),
        // A sweep every second: two run before the check, while the long job runs.
        heartbeat_interval: Duration::from_millis(100),
        maintenance: false,
        ..WorkerConfig::default()
    };
    let mut req = EnqueueRequest::new("builtin.sleep", serde_json::json!({ "ms": 3500 }));
    req.options.queue = Some(q.clone());
    let long = client.enqueue(req).await.unwrap().id;
    let waiting = enqueue_noops(&client, &q, 1).await[0];
    let (stop, running) = run_builtin_worker(&b, &store, config);
    let worker = worker_running(&client, long).await;
    // Two sweeps and more while the long job runs. Both messages must still be this worker's,
    // each delivered once: put back, a message leaves the worker's pending list and comes back,
    // if ever, with a higher delivery count. `XPENDING` lists id, consumer, idle and count.
    tokio::time::sleep(Duration::from_millis(2600)).await;
    assert_eq!(
        client.get(long).await.unwrap().state,
        JobState::Running,
        "the long job still runs"
    );
    let pending = pending_under(server, &b, &q, &worker);
    let fields: Vec<&str> = pending.lines().collect();
    assert_eq!(fields.len(), 8, "both messages reserved here: {pending}");
    assert_eq!(
        (fields[3], fields[7]),
        ("1", "1"),
        "each delivered once: {pending}"
    );
    let job = client.wait(waiting, Duration::from_secs(30)).await.unwrap();
    assert_eq!(job.state, JobState::Succeeded, "{job:?}");
    let long = client.get(long).await.unwrap();
    assert_eq!(long.state, JobState::Succeeded, "{long:?}");
    // The slot frees when the long handler returns, a moment before its outcome is stamped.
    assert!(
        job.started_at.unwrap() >= long.started_at.unwrap() + 3_000_000,
        "the waiting job waited for the long one's slot: {job:?} {long:?}"
    );
    stop.cancel();
    running.await.unwrap().unwrap();
}

/// A remote session the store presumed dead is refused its start (`StartOutcome::Presumed`):
/// the gateway hands the message back unstarted and answers that the session expired, and
/// another session then starts the job once, at epoch 1, with no crash counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_session_presumed_dead_is_refused_its_start_and_loses_no_message() {
    use homing::remote::{strays::Sightings, Gateway, Registration, RemoteError};
    let server = shared();
    let b = open(&server.url(&unique_prefix("remote-presumed"))).await;
    let store = sqlite_store();
    let q = unique_queue("remote-presumed");
    let client = Client::new(b.clone(), store.clone());
    let gateway = Gateway::new(b.clone(), store.clone(), Arc::new(Sightings::default()));
    let registration = || Registration {
        queues: vec![q.clone()],
        concurrency: 1,
        heartbeat_interval_ms: 1000,
        host: None,
        pid: None,
        version: None,
        tasks: Vec::new(),
    };
    let zombie = gateway.register(registration()).await.unwrap().session;
    // A rescuer found it without a heartbeat; it has not heard yet (its heartbeat key is still
    // there: only the store's record says it is presumed dead).
    store
        .presume_lost(&zombie, homing::time::now())
        .await
        .unwrap();
    let id = enqueue_noops(&client, &q, 1).await[0];
    let refused = gateway.reserve(&zombie, 1, Duration::from_secs(5)).await;
    assert!(
        matches!(refused, Err(RemoteError::SessionExpired(_))),
        "{refused:?}"
    );
    let j = client.get(id).await.unwrap();
    assert_eq!(
        (j.state, j.epoch, j.crashes),
        (JobState::Queued, 0, 0),
        "{j:?}"
    );

    let live = gateway.register(registration()).await.unwrap().session;
    let got = gateway
        .reserve(&live, 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "the refused message was not handed back");
    assert_eq!((got[0].job_id, got[0].epoch), (id, 1));
}

/// A remote session (the HTTP gateway, docs/remote-workers.md) whose reservation's answer was
/// lost, or whose server died before starting what it reserved, holds a message it never
/// received: its heartbeats' sweep puts it back, and the session reserves the job. A message
/// whose job runs under the session is its lease and is never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_reserved_under_a_remote_session_without_its_knowledge_is_put_back() {
    use homing::remote::{strays::Sightings, Gateway, Held, Registration};
    let server = shared();
    let b = open(&server.url(&unique_prefix("remote-stray"))).await;
    let store = sqlite_store();
    let q = unique_queue("remote-stray");
    let client = Client::new(b.clone(), store.clone());
    let gateway = Gateway::new(b.clone(), store.clone(), Arc::new(Sightings::default()));
    let session = gateway
        .register(Registration {
            queues: vec![q.clone()],
            concurrency: 4,
            // The shortest interval: a sweep every 2 s.
            heartbeat_interval_ms: 200,
            host: None,
            pid: None,
            version: None,
            tasks: Vec::new(),
        })
        .await
        .unwrap()
        .session;
    let held_id = enqueue_noops(&client, &q, 1).await[0];
    let held = gateway
        .reserve(&session, 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].job_id, held_id);
    let beat = Held {
        job_id: held_id,
        epoch: held[0].epoch,
    };
    let stray = enqueue_noops(&client, &q, 1).await[0];
    let took = take_one_under(server, &b, &q, &session);
    assert!(
        took.contains(&stray.to_string()),
        "the test reserved the job's message: {took}"
    );
    let began = Instant::now();
    let got = loop {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "the stray message was never put back: job {stray} is {:?}",
            client.get(stray).await.unwrap().state
        );
        gateway.heartbeat(&session, &[beat]).await.unwrap();
        let r = gateway
            .reserve(&session, 1, Duration::from_millis(200))
            .await
            .unwrap();
        if let Some(j) = r.into_iter().next() {
            break j;
        }
    };
    assert_eq!(got.job_id, stray);
    assert_eq!(got.epoch, 1, "started once, by this reservation");
    // Put back no sooner than the second sweep, 2 s after the first.
    assert!(
        began.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        began.elapsed()
    );
    // The held job went through the same sweeps: still running under the session, its message
    // still this session's and delivered once. `XPENDING` lists id, consumer, idle and count.
    let job = client.get(held_id).await.unwrap();
    assert_eq!(job.state, JobState::Running, "{job:?}");
    assert_eq!(job.epoch, 1, "{job:?}");
    let pending = pending_under(server, &b, &q, &session);
    let fields: Vec<&str> = pending.lines().collect();
    assert_eq!(fields.len(), 8, "both messages reserved here: {pending}");
    // A tag is the entry id and its band.
    let tag = held[0].lease.split('@').next().unwrap();
    assert!(
        tag.starts_with(&format!("{}.", fields[0])) && fields[3] == "1",
        "the held one ({tag}) first, delivered once: {pending}"
    );
    gateway.end(&session).await.unwrap();
}
