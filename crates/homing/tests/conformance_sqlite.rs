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

mod limits_suite {
    homing::limits_conformance!(super::store());
}

mod cluster_limits_suite {
    homing::cluster_limits_conformance!(super::store());
}

mod access_suite {
    homing::access_conformance!(super::store());
}

mod stats_suite {
    homing::stats_conformance!(super::store());
}

mod counts_suite {
    homing::counts_conformance!(super::store());
}

mod search_suite {
    homing::search_conformance!(super::store());
}

mod timeline_suite {
    homing::timeline_conformance!(super::store());
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

    async fn set_job_int(&self, id: JobId, column: &str, value: i64) {
        let sql = format!(
            "UPDATE jobs SET {column} = {value} WHERE id = {}",
            lit(&id.to_string())
        );
        self.0
            .write(move |tx| tx.execute_batch(&sql))
            .await
            .unwrap();
    }

    async fn refuse_job_updates(&self, id: JobId) {
        let sql = format!(
            "CREATE TRIGGER \"refuse-update-{id}\" BEFORE UPDATE ON jobs WHEN OLD.id = {} \
             BEGIN SELECT RAISE(ABORT, 'updates of this job are refused by the test'); END",
            lit(&id.to_string())
        );
        self.0
            .write(move |tx| tx.execute_batch(&sql))
            .await
            .unwrap();
    }

    async fn set_worker_status(&self, id: &str, text: &str) {
        let sql = format!(
            "UPDATE workers SET status = {} WHERE id = {}",
            lit(text),
            lit(id)
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

/// A run under a presumed worker that the presumption did not record. No start leaves one now
/// that both stores order starts against presumptions (before the PostgreSQL start fence a start
/// racing the presumption's commit could); the rule stays for a run that escapes the record.
/// Made here by writing `presumed_dead_at` by hand after the start. It is taken back
/// without a crash (with one, `max_crashes` 1 would make it dead), its timeline entry
/// `released` with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrecorded_run_of_a_presumed_worker_is_taken_back_without_a_crash() {
    use homing::history::Kind;
    use homing::job::JobState;
    use homing::store::{Lost, StartOutcome};
    use homing::time::now;

    let db = fresh_db();
    let store = SqliteStore::new(db.clone());
    let w = homing::conformance::unique_queue("raced");
    let q = homing::conformance::unique_queue("raced");
    let t = now();
    store
        .register_worker(&homing::conformance::workers::info(&w, t), t)
        .await
        .unwrap();
    let mut job = homing::conformance::new_job(&q, "t");
    job.options.max_crashes = Some(1);
    let id = job.id;
    store.insert(vec![job]).await.unwrap();
    let started = store.start(&[id], &w, now()).await.unwrap();
    assert!(matches!(started[0], StartOutcome::Run(_)), "{started:?}");
    let worker = w.clone();
    db.write(move |tx| {
        tx.execute(
            "UPDATE workers SET presumed_dead_at = ?2 WHERE id = ?1",
            rusqlite::params![worker, now()],
        )
    })
    .await
    .unwrap();

    let (lost, _) = store
        .mark_lost_unparking(id, &w, true, now())
        .await
        .unwrap();
    assert_eq!(lost, Lost::Requeued);
    let j = store.get(id).await.unwrap().unwrap();
    assert_eq!((j.state, j.crashes), (JobState::Queued, 0), "{j:?}");
    let h = store.history(id).await.unwrap();
    assert_eq!(homing::history::disagreement(&j, &h), None, "{h:?}");
    let last = h.entries.last().expect("entries");
    assert_eq!(last.kind, Kind::Released, "{h:?}");
    assert!(
        last.message
            .as_deref()
            .unwrap_or("")
            .contains("no crash counted"),
        "{last:?}"
    );
}

/// A heartbeat with less than the margin left is refused: its time is read before its commit,
/// so a reader whose snapshot predates the commit, its clock past the old expiry, would
/// presume dead a worker told it was alive. Refused, the worker learns it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_at_the_edge_of_expiry_is_refused() {
    use homing::broker::sqlite::refresh_margin;
    use std::time::Duration;

    let db = fresh_db();
    let b = SqliteBroker::new(db.clone());
    let w = homing::conformance::unique_queue("edge");
    let ttl = Duration::from_secs(10);
    assert_eq!(refresh_margin(ttl), Duration::from_millis(250));
    b.register(&w, ttl).await.unwrap();
    let expire_in = |left: Duration| {
        let w = w.clone();
        db.write(move |tx| {
            tx.execute(
                "UPDATE heartbeats SET expires_at = ?2 WHERE worker = ?1",
                rusqlite::params![w, homing::time::now() + homing::time::micros(left)],
            )
        })
    };
    assert_eq!(expire_in(Duration::from_millis(150)).await.unwrap(), 1);
    assert!(
        !b.heartbeat(&w, ttl).await.unwrap(),
        "a refresh 150 ms before expiry, within the 250 ms margin, must be refused"
    );
    assert_eq!(expire_in(Duration::from_secs(2)).await.unwrap(), 1);
    assert!(
        b.heartbeat(&w, ttl).await.unwrap(),
        "a refresh with 2 s left is taken"
    );
    let left = b.heartbeat_expires_in(&w).await.unwrap().expect("live");
    assert!(
        left > Duration::from_secs(9),
        "{left:?}: the refresh set the TTL"
    );
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

/// A lost worker's job on which the store fails (every write refused) must not stop the
/// rescuer's sweep: the worker's other jobs are reclaimed, the bad one's message stays pending
/// for the next sweep, and the worker is kept until it holds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_the_store_fails_on_does_not_stop_the_rescuer() {
    use homing::job::JobState;
    use homing::maintenance::rescuer;
    use homing::store::{StartOutcome, ToPublish};
    use std::time::Duration;

    let db = fresh_db();
    let store = SqliteStore::new(db.clone());
    let b = SqliteBroker::new(fresh_db());
    let q = homing::conformance::unique_queue("rescue");
    let (bad, good) = (
        homing::conformance::new_job(&q, "t"),
        homing::conformance::new_job(&q, "t"),
    );
    let ids = [bad.id, good.id];
    store.insert(vec![bad, good]).await.unwrap();
    for id in ids {
        b.publish(&[ToPublish {
            id,
            queue: q.clone(),
            priority: 0,
        }])
        .await
        .unwrap();
    }
    store.mark_dispatched(&ids).await.unwrap();
    b.register("w1", Duration::from_millis(200)).await.unwrap();
    let got = b
        .reserve(
            "w1",
            std::slice::from_ref(&q),
            10,
            Duration::from_millis(500),
        )
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    let out = store.start(&ids, "w1", homing::time::now()).await.unwrap();
    assert!(
        out.iter().all(|o| matches!(o, StartOutcome::Run(_))),
        "{out:?}"
    );
    RawSqlite(db).refuse_job_updates(ids[0]).await;

    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(!b.heartbeat("w1", Duration::from_secs(1)).await.unwrap());
    assert!(b
        .lost_consumers()
        .await
        .unwrap()
        .contains(&"w1".to_string()));
    let report = rescuer::sweep(&b, &store)
        .await
        .expect("one bad job does not fail the sweep");
    assert_eq!((report.requeued, report.lost_workers), (1, 0), "{report:?}");
    assert_eq!(
        store.get(ids[1]).await.unwrap().unwrap().state,
        JobState::Queued
    );
    assert_eq!(
        store.get(ids[0]).await.unwrap().unwrap().state,
        JobState::Running
    );
    let pending = b.pending("w1", 10).await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].job, Ok(ids[0]));
}

/// The reconciler reclaims running jobs whose worker and message are gone; one such job the
/// store fails on must not stop the pass (and the outbox after it, for every job).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_the_store_fails_on_does_not_stop_the_reconciler() {
    use homing::job::JobState;
    use homing::maintenance::{reconciler, MaintenanceConfig};
    use std::time::Duration;

    let db = fresh_db();
    let store = SqliteStore::new(db.clone());
    let b = SqliteBroker::new(fresh_db());
    let q = homing::conformance::unique_queue("orphans");
    let (bad, good) = (
        homing::conformance::new_job(&q, "t"),
        homing::conformance::new_job(&q, "t"),
    );
    let ids = [bad.id, good.id];
    store.insert(vec![bad, good]).await.unwrap();
    // Running under a worker the broker never heard of, with no message anywhere.
    store
        .start(&ids, "gone-worker", homing::time::now())
        .await
        .unwrap();
    RawSqlite(db).refuse_job_updates(ids[0]).await;
    let config = MaintenanceConfig::for_heartbeat(Duration::from_millis(200));
    let report = reconciler::pass(&b, &store, &config, true)
        .await
        .expect("one bad job does not fail the pass");
    assert_eq!(report.orphans_requeued, 1, "{report:?}");
    assert_eq!(
        store.get(ids[1]).await.unwrap().unwrap().state,
        JobState::Queued
    );
    assert_eq!(
        store.get(ids[0]).await.unwrap().unwrap().state,
        JobState::Running
    );
}

/// A late `mark_dispatched` cannot strand a limited queue's job. Job P's first message is taken
/// and P parked (its queue full) while P's producer is still to mark it dispatched; the worker
/// holding the slot is lost and its rescue unparks P; the producer's mark lands only then. The
/// outbox no longer has P, so the rescuer must have published P itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_mark_cannot_strand_a_job_unparked_by_a_rescue() {
    use homing::limit::QueueLimits;
    use homing::maintenance::rescuer;
    use homing::store::{StartOutcome, ToPublish};
    use std::time::Duration;

    let store = SqliteStore::new(fresh_db());
    let b = SqliteBroker::new(fresh_db());
    let q = homing::conformance::unique_queue("late-mark");
    let one = QueueLimits {
        concurrency: Some(1),
        ..Default::default()
    };
    store
        .set_limits(&q, &one, homing::time::now())
        .await
        .unwrap();
    let (rj, pj) = (
        homing::conformance::new_job(&q, "t"),
        homing::conformance::new_job(&q, "t"),
    );
    let (r, p) = (rj.id, pj.id);
    store.insert(vec![rj, pj]).await.unwrap();
    let publish = |id: JobId| ToPublish {
        id,
        queue: q.clone(),
        priority: 0,
    };
    let queues = std::slice::from_ref(&q);
    let wait = Duration::from_millis(500);
    // w1 takes R and holds the only slot; its heartbeat will lapse.
    b.publish(&[publish(r)]).await.unwrap();
    store.mark_dispatched(&[r]).await.unwrap();
    b.register("w1", Duration::from_millis(200)).await.unwrap();
    assert_eq!(b.reserve("w1", queues, 1, wait).await.unwrap().len(), 1);
    let started = store.start(&[r], "w1", homing::time::now()).await.unwrap();
    assert!(matches!(started[0], StartOutcome::Run(_)), "{started:?}");
    // P is published, but its producer stalls before marking it; w2 takes it, parks it (the
    // queue is full) and acknowledges the message, as a worker does.
    b.publish(&[publish(p)]).await.unwrap();
    b.register("w2", Duration::from_secs(30)).await.unwrap();
    let got = b.reserve("w2", queues, 1, wait).await.unwrap();
    assert_eq!(got.len(), 1);
    let parked = store.start(&[p], "w2", homing::time::now()).await.unwrap();
    assert_eq!(parked, vec![StartOutcome::Parked]);
    b.ack(&got).await.unwrap();
    // w1 is lost: its rescue requeues R and frees the slot, which unparks P.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let report = rescuer::sweep(&b, &store).await.expect("sweep");
    assert_eq!(report.requeued, 1, "{report:?}");
    // The producer's late mark.
    store.mark_dispatched(&[p]).await.unwrap();
    assert!(
        store
            .undispatched(homing::time::now() + 3_600_000_000, 100)
            .await
            .unwrap()
            .iter()
            .all(|d| d.id != p),
        "the late mark took P out of the outbox"
    );
    let mut delivered: Vec<JobId> = b
        .reserve("w2", queues, 10, wait)
        .await
        .unwrap()
        .iter()
        .filter_map(|d| d.job.clone().ok())
        .collect();
    delivered.sort();
    let mut want = vec![r, p];
    want.sort();
    assert_eq!(delivered, want, "both R (requeued) and P have a message");
}

/// The embedded broker reserves the highest priority first and is FIFO within one priority; a
/// requeued message keeps its place. (Redis Streams do not order by priority: docs/limits.md.)
#[tokio::test]
async fn embedded_broker_reserves_by_priority() {
    use homing::store::ToPublish;
    use std::time::Duration;
    let b = broker().await;
    let q = homing::conformance::unique_queue("prio");
    let prios = [0, 5, -1, 5, 9];
    let ids: Vec<JobId> = prios.iter().map(|_| homing::job::new_job_id()).collect();
    let msgs: Vec<ToPublish> = ids
        .iter()
        .zip(prios)
        .map(|(id, priority)| ToPublish {
            id: *id,
            queue: q.clone(),
            priority,
        })
        .collect();
    b.publish(&msgs).await.unwrap();
    let qs = [q.clone()];
    let first = b.reserve("c", &qs, 2, Duration::ZERO).await.unwrap();
    let got: Vec<JobId> = first.iter().map(|d| d.job.clone().unwrap()).collect();
    assert_eq!(got, vec![ids[4], ids[1]]);
    assert_eq!(b.requeue("c", &first[..1]).await.unwrap(), 1);
    let rest = b.reserve("c", &qs, 10, Duration::ZERO).await.unwrap();
    let got: Vec<JobId> = rest.iter().map(|d| d.job.clone().unwrap()).collect();
    assert_eq!(got, vec![ids[4], ids[3], ids[0], ids[2]]);
}

/// A file that had jobs before migration 17 gets counts equal to its jobs: the migration is
/// undone by hand and applied again on reopening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_counts_are_backfilled_from_existing_jobs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("homing.db");
    let db = Db::open(&path).expect("open sqlite");
    let s = SqliteStore::new(db.clone());
    homing::conformance::counts::jobs_in_several_states(&s).await;
    db.write(|tx| {
        tx.execute_batch(
            "DROP TRIGGER jobs_count_insert; DROP TRIGGER jobs_count_delete; \
             DROP TRIGGER jobs_count_update; DROP TRIGGER jobs_count_move; \
             DROP TABLE queue_counts; DELETE FROM homing_migrations WHERE version IN (17, 26);",
        )
    })
    .await
    .unwrap();
    drop(s);
    drop(db);
    let db = Db::open(&path).expect("reopen and migrate");
    let s = SqliteStore::new(db);
    assert!(!s.queue_stats().await.unwrap().is_empty());
    homing::conformance::counts::assert_counts_exact(&s, "backfill").await;
}

/// A file whose counts were kept by the triggers of versions 17 and 23 (some of its rows
/// missing, others at 0) gets every row of every counted queue from migration 26, the count
/// triggers a worker's round fires upsert nothing, and its job counts and message depths stay
/// equal to a fresh count through further changes, on the queues it had and on a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_kept_by_the_old_triggers_carry_over_to_the_new_ones() {
    use homing::broker::QueueDepth;
    use homing::store::ToPublish;
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("homing.db");
    let db = Db::open(&path).expect("open sqlite");
    let (s, b) = (SqliteStore::new(db.clone()), SqliteBroker::new(db.clone()));
    homing::conformance::counts::jobs_in_several_states(&s).await;
    let old_q = homing::conformance::unique_queue("old");
    let publish = |q: &str, n: usize| -> Vec<ToPublish> {
        (0..n)
            .map(|_| ToPublish {
                id: homing::job::new_job_id(),
                queue: q.to_string(),
                priority: 0,
            })
            .collect()
    };
    b.publish(&publish(&old_q, 3)).await.unwrap();
    // A queue whose messages are all reserved: its ready count is 0, a row the old triggers
    // may not have (version 23 counted only queues with ready messages or dead letters).
    let busy_q = homing::conformance::unique_queue("busy");
    b.publish(&publish(&busy_q, 2)).await.unwrap();
    let busy = b
        .reserve("c", std::slice::from_ref(&busy_q), 2, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(busy.len(), 2);
    let old_jobs: Vec<_> = (0..4)
        .map(|_| homing::conformance::new_job(&old_q, "t"))
        .collect();
    s.insert(old_jobs.clone()).await.unwrap();
    // Back to version 25: the old triggers, the rows they never made.
    db.write(|tx| {
        tx.execute_batch(
            "DROP TRIGGER jobs_count_insert; DROP TRIGGER jobs_count_delete; \
             DROP TRIGGER jobs_count_update; DROP TRIGGER messages_ready_insert; \
             DROP TRIGGER messages_ready_delete; DROP TRIGGER messages_ready_leave; \
             DROP TRIGGER messages_ready_enter; DROP TRIGGER dead_letters_count_insert; \
             DROP TRIGGER dead_letters_count_delete; DROP TRIGGER queue_counts_seed; \
             DROP TRIGGER broker_counts_seed; DROP TRIGGER jobs_count_move; \
             DROP TRIGGER messages_ready_move; \
             DELETE FROM queue_counts WHERE n = 0; DELETE FROM broker_counts WHERE n = 0; \
             DELETE FROM homing_migrations WHERE version = 26;",
        )?;
        tx.execute_batch(include_str!(
            "../src/sqlite/migrations/0017_queue_counts.sql"
        ))?;
        tx.execute_batch(include_str!(
            "../src/sqlite/migrations/0023_broker_counts.sql"
        ))
    })
    .await
    .unwrap();
    let got = b
        .reserve("c", std::slice::from_ref(&old_q), 2, Duration::ZERO)
        .await
        .unwrap();
    b.ack(&got[..1]).await.unwrap();
    let upserts: i64 = db
        .read(|c| {
            c.query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND sql LIKE '%DO UPDATE%'",
                [],
                |r| r.get(0),
            )
        })
        .await
        .unwrap();
    assert!(upserts > 0, "the old triggers are back");
    drop((s, b));
    drop(db);

    let db = Db::open(&path).expect("reopen and migrate");
    let (s, b) = (SqliteStore::new(db.clone()), SqliteBroker::new(db.clone()));
    // Every state a job can be in has its row: a state missing from the seed would be counted
    // nowhere.
    let states = homing::job::JobState::ALL.len() as i64;
    let (upserts, partial): (i64, i64) = db
        .read(move |c| {
            c.query_row(
                "SELECT (SELECT count(*) FROM sqlite_master WHERE type = 'trigger' \
                         AND sql LIKE '%DO UPDATE%' AND name IN ('jobs_count_update', \
                         'messages_ready_delete', 'messages_ready_leave', \
                         'messages_ready_enter')), \
                        (SELECT count(*) FROM (SELECT queue FROM queue_counts GROUP BY queue \
                         HAVING count(*) <> ?1)) + \
                        (SELECT count(*) FROM (SELECT queue FROM broker_counts GROUP BY queue \
                         HAVING count(*) <> 2))",
                [states],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .await
        .unwrap();
    assert_eq!(upserts, 0, "no upsert in the count triggers a round fires");
    assert_eq!(partial, 0, "every counted queue has all its rows");
    homing::conformance::counts::assert_counts_exact(&s, "migration 26").await;
    // Further changes on the old queues and on a new one.
    homing::conformance::run_to_success(&s, &[old_jobs[0].id], "w").await;
    let now = homing::time::now();
    s.cancel(old_jobs[1].id, now).await.unwrap();
    b.requeue("c", &busy[..1]).await.unwrap();
    // What homing never does, by hand: a job moved into a queue never counted (then changed
    // there by the store), another moved and changed in one statement, the ready messages moved
    // into a new queue, a reserved message moved into another and released there, and one
    // added already reserved to a new queue and released.
    let q = |p: &str| homing::conformance::unique_queue(p);
    let (moved_jobs, moved_jobs2, moved_msgs, moved_reserved, added_reserved) =
        (q("moved"), q("moved"), q("moved"), q("moved"), q("added"));
    let (id, id2) = (old_jobs[2].id.to_string(), old_jobs[3].id.to_string());
    let (q1, q2, q3, q4, q5, from, busy_from) = (
        moved_jobs.clone(),
        moved_jobs2.clone(),
        moved_msgs.clone(),
        moved_reserved.clone(),
        added_reserved.clone(),
        old_q.clone(),
        busy_q.clone(),
    );
    db.write(move |tx| {
        tx.execute("UPDATE jobs SET queue = ?1 WHERE id = ?2", [&q1, &id])?;
        tx.execute(
            "UPDATE jobs SET queue = ?1, state = 'cancelled' WHERE id = ?2",
            [&q2, &id2],
        )?;
        tx.execute(
            "UPDATE messages SET queue = ?1 WHERE queue = ?2 AND consumer IS NULL",
            [&q3, &from],
        )?;
        tx.execute(
            "UPDATE messages SET queue = ?1 WHERE queue = ?2 AND consumer IS NOT NULL",
            [&q4, &busy_from],
        )?;
        tx.execute(
            "UPDATE messages SET consumer = NULL WHERE queue = ?1",
            [&q4],
        )?;
        tx.execute(
            "INSERT INTO messages (queue, payload, consumer) VALUES (?1, 'x', 'c')",
            [&q5],
        )?;
        tx.execute(
            "UPDATE messages SET consumer = NULL WHERE queue = ?1",
            [&q5],
        )
    })
    .await
    .unwrap();
    homing::conformance::counts::assert_counts_exact(&s, "jobs moved by hand").await;
    s.cancel(old_jobs[2].id, now).await.unwrap();
    homing::conformance::counts::assert_counts_exact(&s, "a moved job cancelled").await;
    homing::conformance::counts::jobs_in_several_states(&s).await;
    homing::conformance::counts::assert_counts_exact(&s, "changes after migration 26").await;
    let new_q = homing::conformance::unique_queue("new");
    b.publish(&publish(&old_q, 2)).await.unwrap();
    b.publish(&publish(&new_q, 2)).await.unwrap();
    b.requeue("c", &got[1..]).await.unwrap();
    let more = b
        .reserve("c", &[old_q.clone(), new_q.clone()], 10, Duration::ZERO)
        .await
        .unwrap();
    b.ack(&more[..2]).await.unwrap();
    b.dead_letter(&more[2], "garbage").await.unwrap();
    let ours = [
        &old_q,
        &new_q,
        &busy_q,
        &moved_msgs,
        &moved_reserved,
        &added_reserved,
    ];
    let mine = |ds: Vec<QueueDepth>| -> Vec<QueueDepth> {
        ds.into_iter()
            .filter(|d| ours.contains(&&d.queue))
            .collect()
    };
    let kept = mine(b.depths().await.unwrap());
    assert_eq!(kept.len(), ours.len(), "{kept:?}");
    assert_eq!(kept, mine(b.depths_recounted().await.unwrap()));
}
