//! The store conformance suite against a real PostgreSQL (each case in its own database), plus
//! what only a shared database has to get right: several processes, each with its own pool,
//! competing for the same rows; migrations raced by processes starting at once; text and JSON
//! that PostgreSQL treats differently from SQLite.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use homing::conformance::{new_job, Poisonable, Tamper};
use homing::events::{
    NewEvent, Subscriber, CALLBACK_TARGET, WEBHOOK_QUEUE, WEBHOOK_TASK, WORKER_LOST, WORKER_READY,
    WORKER_SHUTDOWN,
};
use homing::job::{JobId, JobState};
use homing::store::postgres::{PgOptions, PgStore, MIGRATIONS};
use homing::store::{Committed, Completion, Lost, Outcome, Presumption, StartOutcome, Store};
use homing::time::now;
use support::postgres::server;

async fn fresh_store() -> PgStore {
    let url = server().fresh_database().await;
    PgStore::connect(&url).await.expect("connect and migrate")
}

async fn store() -> Arc<dyn Store> {
    Arc::new(fresh_store().await)
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

/// Raw writes to the store's tables, for the poisoned-row cases.
struct RawPg(PgStore);

#[homing::async_trait]
impl Tamper for RawPg {
    async fn set_job_text(&self, id: JobId, column: &str, text: &str) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE homing_jobs SET {column} = $2 WHERE id = $1"
        )))
        .bind(id)
        .bind(text)
        .execute(self.0.pool())
        .await
        .unwrap();
    }

    async fn set_event_data(&self, id: i64, text: &str) {
        sqlx::query("UPDATE homing_events SET data = $2 WHERE id = $1")
            .bind(id)
            .bind(text)
            .execute(self.0.pool())
            .await
            .unwrap();
    }

    /// PostgreSQL text cannot hold a NUL character.
    async fn unstorable_queue(&self) -> String {
        format!("{}\0", homing::conformance::unique_queue("nul"))
    }

    async fn refuse_job_key(&self, key: &str) {
        let name = homing::conformance::unique_queue("refuse").replace('-', "_");
        let key = key.replace('\'', "''");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF NEW.idempotency_key = '{key}' THEN \
                 RAISE EXCEPTION 'this key is refused by the test'; \
               END IF; RETURN NEW; END $$; \
             CREATE TRIGGER {name} BEFORE INSERT ON homing_jobs \
               FOR EACH ROW EXECUTE FUNCTION {name}();"
        )))
        .execute(self.0.pool())
        .await
        .unwrap();
    }

    async fn set_job_int(&self, id: JobId, column: &str, value: i64) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE homing_jobs SET {column} = $2 WHERE id = $1"
        )))
        .bind(id)
        .bind(value)
        .execute(self.0.pool())
        .await
        .unwrap();
    }

    async fn refuse_job_updates(&self, id: JobId) {
        let name = homing::conformance::unique_queue("refuse_update").replace('-', "_");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
               IF OLD.id = '{id}' THEN \
                 RAISE EXCEPTION 'updates of this job are refused by the test'; \
               END IF; RETURN NEW; END $$; \
             CREATE TRIGGER {name} BEFORE UPDATE ON homing_jobs \
               FOR EACH ROW EXECUTE FUNCTION {name}();"
        )))
        .execute(self.0.pool())
        .await
        .unwrap();
    }

    async fn set_worker_status(&self, id: &str, text: &str) {
        sqlx::query("UPDATE homing_workers SET status = $2 WHERE id = $1")
            .bind(id)
            .bind(text)
            .execute(self.0.pool())
            .await
            .unwrap();
    }
}

async fn poisonable() -> Poisonable {
    let store = fresh_store().await;
    let raw = RawPg(store.clone());
    (Arc::new(store), Arc::new(raw))
}

mod poison_suite {
    homing::store_poison_conformance!(super::poisonable());
}

/// Two stores on one database, as two servers (or a server and a worker) would have.
async fn two_pools() -> (Arc<PgStore>, Arc<PgStore>) {
    let url = server().fresh_database().await;
    let a = PgStore::connect(&url).await.expect("first pool");
    let b = PgStore::connect(&url).await.expect("second pool");
    (Arc::new(a), Arc::new(b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_claim_each_due_job_once() {
    let (a, b) = two_pools().await;
    let q = homing::conformance::unique_queue("due");
    let t = now();
    let jobs: Vec<_> = (0..300)
        .map(|_| {
            let mut j = new_job(&q, "t");
            j.created_at = t;
            j.run_at = Some(t + 1_000);
            j
        })
        .collect();
    let want: HashSet<JobId> = jobs.iter().map(|j| j.id).collect();
    a.insert(jobs).await.unwrap();
    let mut handles = Vec::new();
    for i in 0..8 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        handles.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let batch = s.claim_due(t + 2_000, 13).await.unwrap();
                if batch.is_empty() {
                    return got;
                }
                got.extend(batch.into_iter().map(|d| d.id));
            }
        }));
    }
    let mut per_pool = [0usize; 2];
    let mut all = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        let got = h.await.unwrap();
        per_pool[i % 2] += got.len();
        all.extend(got);
    }
    let unique: HashSet<JobId> = all.iter().copied().collect();
    assert_eq!(all.len(), unique.len(), "a due job was claimed twice");
    assert_eq!(unique, want, "every due job is claimed");
    assert_eq!(per_pool[0] + per_pool[1], 300);
    let stats = a.queue_stats().await.unwrap();
    let st = stats.iter().find(|s| s.queue == q).unwrap();
    assert_eq!((st.queued, st.scheduled), (300, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_rescuers_count_a_lost_delivery_once() {
    let (a, b) = two_pools().await;
    let q = homing::conformance::unique_queue("lost");
    let jobs: Vec<_> = (0..20).map(|_| new_job(&q, "t")).collect();
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    a.insert(jobs).await.unwrap();
    let started = a.start(&ids, "w-gone", now()).await.unwrap();
    assert!(started.iter().all(|s| matches!(s, StartOutcome::Run(_))));
    let mut handles = Vec::new();
    for &id in &ids {
        for i in 0..6 {
            let s = if i % 2 == 0 { a.clone() } else { b.clone() };
            handles.push(tokio::spawn(async move {
                (id, s.mark_lost(id, "w-gone", now()).await.unwrap())
            }));
        }
    }
    let mut requeued: HashMap<JobId, usize> = HashMap::new();
    for h in handles {
        let (id, lost) = h.await.unwrap();
        match lost {
            Lost::Requeued => *requeued.entry(id).or_default() += 1,
            Lost::NotOwned(JobState::Queued) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    for id in &ids {
        assert_eq!(requeued.get(id), Some(&1), "one crash counted for {id}");
        let j = b.get(*id).await.unwrap().unwrap();
        assert_eq!((j.state, j.crashes, j.worker), (JobState::Queued, 1, None));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_start_overlapping_batches_once_without_deadlock() {
    let (a, b) = two_pools().await;
    let q = homing::conformance::unique_queue("start");
    let jobs: Vec<_> = (0..50).map(|_| new_job(&q, "t")).collect();
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    a.insert(jobs).await.unwrap();
    let mut handles = Vec::new();
    for i in 0..6 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        let mut batch = ids.clone();
        // Opposite orders: lock ordering, not luck, must keep the batches from deadlocking.
        if i % 3 == 1 {
            batch.reverse();
        } else if i % 3 == 2 {
            batch.rotate_left(17);
        }
        let worker = format!("w{i}");
        handles.push(tokio::spawn(async move {
            s.start(&batch, &worker, now()).await.unwrap()
        }));
    }
    let mut runs: HashMap<JobId, usize> = HashMap::new();
    for h in handles {
        for o in h.await.unwrap() {
            match o {
                StartOutcome::Run(j) => *runs.entry(j.id).or_default() += 1,
                StartOutcome::Skip(JobState::Running) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    for id in &ids {
        assert_eq!(runs.get(id), Some(&1), "job {id} started other than once");
        assert_eq!(a.get(*id).await.unwrap().unwrap().epoch, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_reconcilers_share_the_outbox_and_leases_expire() {
    let (a, b) = two_pools().await;
    let q = homing::conformance::unique_queue("outbox");
    let t0 = now();
    let jobs: Vec<_> = (0..120)
        .map(|_| {
            let mut j = new_job(&q, "t");
            j.created_at = t0 - 1_000;
            j
        })
        .collect();
    let want: HashSet<JobId> = jobs.iter().map(|j| j.id).collect();
    a.insert(jobs).await.unwrap();
    let mut handles = Vec::new();
    for i in 0..6 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        handles.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let batch = s.undispatched(t0, 9).await.unwrap();
                if batch.is_empty() {
                    return got;
                }
                got.extend(batch.into_iter().map(|d| d.id));
            }
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    let unique: HashSet<JobId> = all.iter().copied().collect();
    assert_eq!(all.len(), unique.len(), "one sweep handed a job out twice");
    assert_eq!(unique, want);
    // Nobody marked them dispatched (the reconcilers "died"): once the lease is older than
    // `before`, they are handed out again, so nothing is lost.
    let again: HashSet<JobId> = a
        .undispatched(now() + 1, 1_000)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(again, want, "expired leases come back");
    let ids: Vec<JobId> = want.iter().copied().collect();
    b.mark_dispatched(&ids).await.unwrap();
    assert!(a.undispatched(now() + 1, 1_000).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_dispatchers_fan_out_each_event_once() {
    let (a, b) = two_pools().await;
    let worker = homing::conformance::unique_queue("fan");
    let mut want: HashMap<String, usize> = HashMap::new();
    let mut events = 0;
    for i in 0..90 {
        let kind = [WORKER_READY, WORKER_SHUTDOWN, WORKER_LOST][i % 3];
        let ev = NewEvent::worker(kind, &worker, serde_json::json!({ "i": i }));
        let id = a.record_event(ev, now()).await.unwrap();
        events += 1;
        want.insert(format!("{id}:all"), 0);
        if kind == WORKER_LOST {
            want.insert(format!("{id}:lost"), 0);
        }
    }
    // Job events too: failures with a callback go to the subscription and the callback URL.
    let q = homing::conformance::unique_queue("fan");
    let jobs: Vec<_> = (0..30)
        .map(|_| {
            let mut j = new_job(&q, "t");
            j.options.callback_url = Some("http://127.0.0.1:9/cb".into());
            j
        })
        .collect();
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    a.insert(jobs).await.unwrap();
    let failed = Outcome::Failed {
        error: "boom".into(),
    };
    homing::conformance::start_and_complete(&*a, &ids, "w-fan", failed).await;
    for e in a.events(0, 10_000).await.unwrap() {
        if e.job_id.is_some_and(|j| ids.contains(&j)) {
            events += 1;
            want.insert(format!("{}:all", e.id), 0);
            want.insert(format!("{}:{CALLBACK_TARGET}", e.id), 0);
        }
    }
    let subs = vec![
        Subscriber {
            name: "all".into(),
            events: vec!["*".into()],
        },
        Subscriber {
            name: "lost".into(),
            events: vec![WORKER_LOST.into()],
        },
    ];
    let mut handles = Vec::new();
    for i in 0..6 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        let subs = subs.clone();
        handles.push(tokio::spawn(async move {
            let (mut taken, mut published) = (0, Vec::new());
            loop {
                // Small batches, so the dispatchers interleave.
                let out = s.fan_out(&subs, 7, now()).await.unwrap();
                if out.events == 0 {
                    return (taken, published);
                }
                taken += out.events;
                published.extend(out.dispatch.into_iter().map(|d| d.id));
            }
        }));
    }
    let (mut taken, mut published) = (0, Vec::new());
    for h in handles {
        let (t, p) = h.await.unwrap();
        taken += t;
        published.extend(p);
    }
    assert_eq!(
        taken, events,
        "each pending event is taken by one dispatcher"
    );
    let unique: HashSet<JobId> = published.iter().copied().collect();
    assert_eq!(
        unique.len(),
        published.len(),
        "a delivery was published twice"
    );
    let mut delivered = HashSet::new();
    for key in want.keys() {
        let d = b
            .get_by_key(key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no delivery {key}"));
        assert_eq!(
            (d.task.as_str(), d.queue.as_str()),
            (WEBHOOK_TASK, WEBHOOK_QUEUE)
        );
        delivered.insert(d.id);
    }
    assert_eq!(
        delivered, unique,
        "every delivery inserted once and published once"
    );
    let (total,): (i64,) = sqlx::query_as("SELECT count(*) FROM homing_jobs WHERE task = $1")
        .bind(WEBHOOK_TASK)
        .fetch_one(a.pool())
        .await
        .unwrap();
    assert_eq!(total as usize, want.len(), "no delivery inserted twice");
    assert!(a
        .events(0, 10_000)
        .await
        .unwrap()
        .iter()
        .all(|e| e.dispatched_at.is_some()));
    assert_eq!(b.fan_out(&subs, 100, now()).await.unwrap().events, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_race_safely_and_are_recorded_once() {
    let url = server().fresh_database().await;
    let mut handles = Vec::new();
    for _ in 0..6 {
        let url = url.clone();
        handles.push(tokio::spawn(async move {
            let s = PgStore::open(&url, PgOptions::default()).await.unwrap();
            s.migrate().await.unwrap()
        }));
    }
    let mut applied = Vec::new();
    for h in handles {
        applied.push(h.await.unwrap());
    }
    let names: Vec<&str> = MIGRATIONS.iter().map(|m| m.name).collect();
    assert_eq!(
        applied.iter().filter(|a| !a.is_empty()).count(),
        1,
        "exactly one process applies the migrations: {applied:?}"
    );
    assert!(applied.iter().all(|a| a.is_empty() || *a == names));
    let s = PgStore::open(&url, PgOptions::default()).await.unwrap();
    assert!(
        s.migrate().await.unwrap().is_empty(),
        "nothing left to apply"
    );
    let recorded: Vec<(i32, String)> =
        sqlx::query_as("SELECT version, name FROM homing_migrations ORDER BY version")
            .fetch_all(s.pool())
            .await
            .unwrap();
    let expected: Vec<(i32, String)> = MIGRATIONS
        .iter()
        .map(|m| (m.version, m.name.to_string()))
        .collect();
    assert_eq!(recorded, expected);
}

/// A deployment that applied version 1 (with jobs in it) upgrades in place: 0001 is never edited,
/// so 0002 alone must bring its schema to what this build reads and writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_database_upgrades_with_its_jobs() {
    let url = server().fresh_database().await;
    let s = PgStore::open(&url, PgOptions::default()).await.unwrap();
    let old = new_job(&homing::conformance::unique_queue("v1"), "t");
    sqlx::raw_sql(include_str!(
        "../src/store/postgres/migrations/0001_init.sql"
    ))
    .execute(s.pool())
    .await
    .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE homing_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, \
         applied_at TIMESTAMPTZ NOT NULL DEFAULT now()); \
         INSERT INTO homing_migrations (version, name) VALUES (1, '0001_init')",
    )
    .execute(s.pool())
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO homing_jobs (id, task, queue, state, args, max_crashes, created_at, \
         updated_at, finished_at) VALUES ($1, $2, $3, 'succeeded', '{}', 3, $4, $4, $4)",
    )
    .bind(old.id)
    .bind(&old.task)
    .bind(&old.queue)
    .bind(old.created_at)
    .execute(s.pool())
    .await
    .unwrap();
    // Every migration after the first, whatever this build's newest is.
    let applied = s.migrate().await.unwrap();
    let after_first: Vec<&str> = MIGRATIONS[1..].iter().map(|m| m.name).collect();
    assert_eq!(applied, after_first);
    assert_eq!(
        &applied[..6],
        &[
            "0002_events",
            "0003_queues",
            "0004_remote",
            "0005_schedules",
            "0006_limits",
            "0007_workflows"
        ]
    );
    // 0003 registers the queues already in use: they keep working even with no room for more.
    let full = PgStore::open(&url, PgOptions::default())
        .await
        .unwrap()
        .with_max_queues(0);
    full.insert(vec![new_job(&old.queue, "t")])
        .await
        .expect("an existing queue keeps working");
    let err = full
        .insert(vec![new_job(
            &homing::conformance::unique_queue("v1new"),
            "t",
        )])
        .await
        .expect_err("a new queue is over the limit");
    assert!(err.to_string().contains("too many queues"), "{err}");
    let j = s.get(old.id).await.unwrap().expect("old job kept");
    assert_eq!((j.state, j.callback_url), (JobState::Succeeded, None));
    let fin = s.finished_between(old.created_at, i64::MAX).await.unwrap();
    assert!(fin.iter().any(|c| c.queue == old.queue && c.succeeded == 1));
    let ev = NewEvent::worker(WORKER_READY, "w-v1", serde_json::json!({}));
    let id = s.record_event(ev, now()).await.unwrap();
    assert_eq!(s.events(id - 1, 10).await.unwrap()[0].kind, WORKER_READY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_and_json_round_trip_exactly() {
    let s = fresh_store().await;
    let q = homing::conformance::unique_queue("text");
    let mut nj = new_job(&q, "t");
    // JSONB would refuse \u0000 and reorder keys; the store must return what it was given.
    nj.args = serde_json::json!({"nul": "a\u{0}b", "big": u64::MAX, "neg": i64::MIN,
        "float": 0.1, "ko": "문서", "nested": {"z": 1, "a": [true, null]}});
    s.insert(vec![nj.clone()]).await.unwrap();
    let j = s.get(nj.id).await.unwrap().unwrap();
    assert_eq!(j.args, nj.args);
    assert_eq!(
        serde_json::to_string(&j.args).unwrap(),
        serde_json::to_string(&nj.args).unwrap()
    );
    // A handler's error text with a NUL byte is kept (the byte replaced), not lost.
    let run = match s.start(&[nj.id], "w", now()).await.unwrap().remove(0) {
        StartOutcome::Run(j) => j,
        other => panic!("{other:?}"),
    };
    let done = Completion {
        id: nj.id,
        epoch: run.epoch,
        outcome: Outcome::Failed {
            error: "bad\0byte".into(),
        },
    };
    assert!(matches!(
        s.complete(&[done], now()).await.unwrap()[0],
        Committed::Applied {
            state: JobState::Failed,
            ..
        }
    ));
    let j = s.get(nj.id).await.unwrap().unwrap();
    assert_eq!(j.error.as_deref(), Some("bad\u{FFFD}byte"));
    // A client's idempotency key with a NUL byte is the client's mistake.
    let mut bad = new_job(&q, "t");
    bad.options.idempotency_key = Some("k\0".into());
    assert!(matches!(
        s.insert(vec![bad]).await,
        Err(homing::Error::Invalid(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_insert_whose_commit_was_not_heard_returns_the_job() {
    let s = fresh_store().await;
    let q = homing::conformance::unique_queue("again");
    let nj = new_job(&q, "t");
    assert!(!s.insert(vec![nj.clone()]).await.unwrap()[0].existed);
    let again = s.insert(vec![nj.clone()]).await.unwrap().remove(0);
    assert!(again.existed && again.id == nj.id && !again.needs_dispatch());
}

/// A batch that meets a stored idempotency key reads the stored job after its insert; when
/// that read fails the batch's answer is an error, and then nothing of it may be stored (all or
/// none: a producer that retries with fresh ids must not enqueue its new jobs twice). The read
/// is made to fail with a row whose state this version does not know (a newer version's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_batch_whose_lookup_fails_stores_none_of_its_jobs() {
    let s = fresh_store().await;
    let q = homing::conformance::unique_queue("keyed");
    let mut stored = new_job(&q, "t");
    stored.options.idempotency_key = Some("k-stored".into());
    s.insert(vec![stored.clone()]).await.unwrap();
    // The queue is known to this process now: the batch below is not a new queue's admission.
    sqlx::query("ALTER TABLE homing_jobs DROP CONSTRAINT homing_jobs_state_check")
        .execute(s.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE homing_jobs SET state = 'from-the-future' WHERE id = $1")
        .bind(stored.id)
        .execute(s.pool())
        .await
        .unwrap();
    let fresh = new_job(&q, "t");
    let mut again = new_job(&q, "t");
    again.options.idempotency_key = Some("k-stored".into());
    let err = s
        .insert(vec![fresh.clone(), again])
        .await
        .expect_err("the stored job cannot be read");
    assert!(err.to_string().contains("state"), "{err}");
    assert!(
        s.get(fresh.id).await.unwrap().is_none(),
        "a batch answered with an error stored its new job"
    );
    assert!(s.history(fresh.id).await.unwrap().entries.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_unavailable_quickly_and_url_password_stays_secret() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "postgres://homing:s3cret-pw@localhost:5432/nodb?host={}",
        dir.path().display()
    );
    let started = Instant::now();
    let err = PgStore::connect(&url).await.expect_err("no server there");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert!(err.is_transient(), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("s3cret-pw"), "{err:?}");
    let err = homing::Backends::open("sqlite://unused.db", &url)
        .await
        .expect_err("no server there");
    assert!(!format!("{err} {err:?}").contains("s3cret-pw"), "{err:?}");
    let bad = PgStore::open(
        "postgres://homing:s3cret-pw@localhost:notaport/db",
        PgOptions::default(),
    )
    .await
    .expect_err("bad port");
    assert!(matches!(bad, homing::Error::Invalid(_)), "{bad:?}");
    assert!(!bad.to_string().contains("s3cret-pw"), "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backends_open_selects_postgres_and_a_worker_runs_jobs() {
    let url = server().fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let broker = format!("sqlite://{}/broker.db", dir.path().display());
    let backends = homing::Backends::open(&broker, &url).await.unwrap();
    assert_eq!(backends.store.kind(), "postgres");
    let client = homing::Client::new(backends.broker.clone(), backends.store.clone());
    let mut ids = Vec::new();
    for i in 0..20 {
        let req = homing::EnqueueRequest::new("builtin.noop", serde_json::json!({ "i": i }));
        ids.push(client.enqueue(req).await.unwrap().id);
    }
    let worker = homing::Worker::new(
        backends.broker.clone(),
        backends.store.clone(),
        homing::builtin::registry(),
        homing::WorkerConfig {
            heartbeat_interval: Duration::from_millis(100),
            ..Default::default()
        },
    );
    let stop = homing::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    for (i, id) in ids.iter().enumerate() {
        let job = client.wait(*id, Duration::from_secs(30)).await.unwrap();
        assert_eq!(job.state, JobState::Succeeded, "{job:?}");
        assert_eq!(job.result.as_ref().unwrap()["i"], serde_json::json!(i));
        assert_eq!(job.epoch, 1);
    }
    stop.cancel();
    running.await.unwrap().unwrap();
    let ws = backends.store.workers(0).await.unwrap();
    assert!(
        ws.iter()
            .any(|w| w.status == homing::store::WorkerStatus::Stopped),
        "{ws:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn distinct_queue_bound() {
    let (a, b) = two_pools().await;
    let a = Arc::unwrap_or_clone(a).with_max_queues(5);
    let b = Arc::unwrap_or_clone(b).with_max_queues(5);
    homing::conformance::queues::distinct_queue_bound(Arc::new(a), Arc::new(b), 5).await;
}

/// A database that had jobs before migration 17 gets counts equal to its jobs: the migration is
/// undone by hand and applied again by a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_counts_are_backfilled_from_existing_jobs() {
    let url = server().fresh_database().await;
    let s = PgStore::connect(&url).await.expect("connect and migrate");
    homing::conformance::counts::jobs_in_several_states(&s).await;
    sqlx::raw_sql(
        "DROP TABLE homing_queue_counts; \
         DROP TRIGGER homing_jobs_count_insert ON homing_jobs; \
         DROP TRIGGER homing_jobs_count_delete ON homing_jobs; \
         DROP TRIGGER homing_jobs_count_update ON homing_jobs; \
         DROP TRIGGER homing_jobs_count_truncate ON homing_jobs; \
         DROP FUNCTION homing_count_inserted(); DROP FUNCTION homing_count_deleted(); \
         DROP FUNCTION homing_count_updated(); DROP FUNCTION homing_count_truncated(); \
         DROP FUNCTION homing_fold_queue_counts(); \
         DELETE FROM homing_migrations WHERE version = 17;",
    )
    .execute(s.pool())
    .await
    .unwrap();
    s.pool().close().await;
    let s = PgStore::connect(&url).await.expect("migrate again");
    assert!(!s.queue_stats().await.unwrap().is_empty());
    homing::conformance::counts::assert_counts_exact(&s, "backfill").await;
}

/// Makes PostgreSQL run `action` (a sleep, or [`GATED`]) in one kind of write in this test's
/// database, so that a start and a presumption overlap for certain.
async fn slow_down(s: &PgStore, table: &str, when: &str, action: &str) {
    let sql = format!(
        "CREATE FUNCTION slow_{table}() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF {when} THEN PERFORM {action}; END IF; RETURN NEW; END $$; \
         CREATE TRIGGER slow_{table} BEFORE UPDATE ON {table} \
         FOR EACH ROW EXECUTE FUNCTION slow_{table}()"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(s.pool())
        .await
        .unwrap();
}

/// A write slowed down by this waits until the test's [`Gate`] is released.
const GATED: &str = "pg_advisory_xact_lock_shared(7, 7)";

/// The lock a [`GATED`] write waits for, held by the test on a connection of its own.
struct Gate(sqlx::pool::PoolConnection<sqlx::Postgres>);

impl Gate {
    async fn close(s: &PgStore) -> Gate {
        let mut c = s.pool().acquire().await.unwrap();
        sqlx::query("SELECT pg_advisory_lock(7, 7)")
            .execute(&mut *c)
            .await
            .unwrap();
        Gate(c)
    }

    async fn open(mut self) {
        sqlx::query("SELECT pg_advisory_unlock(7, 7)")
            .execute(&mut *self.0)
            .await
            .unwrap();
    }
}

/// What a backend waits for: asleep in a trigger, or for an advisory lock.
const ASLEEP_OR_ADVISORY: &[&str] = &["PgSleep", "advisory"];

/// Waits until a backend of this database runs a query matching `pattern` (`ILIKE`) and waits
/// in it for one of `events` (`pg_stat_activity.wait_event`).
async fn until_waiting(s: &PgStore, events: &[&str], pattern: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event = ANY($1) AND query ILIKE $2)",
        )
        .bind(events)
        .bind(pattern)
        .fetch_one(s.pool())
        .await
        .unwrap();
        if waiting {
            return;
        }
        assert!(Instant::now() < deadline, "nothing waits in {pattern}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Takes the row of queue `q` in a transaction of its own, as a start does, and holds it until
/// the transaction returned is rolled back or dropped.
async fn hold_queue_row(s: &PgStore, q: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = s.pool().begin().await.unwrap();
    sqlx::query("SELECT name FROM homing_queues WHERE name = $1 FOR UPDATE")
        .bind(q)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx
}

/// Waits until a write to `table` waits in its trigger (so holds whatever its transaction took
/// before that write).
async fn until_held(s: &PgStore, table: &str) {
    until_waiting(s, ASLEEP_OR_ADVISORY, &format!("%UPDATE {table}%")).await;
}

/// A registered worker and a queued job for it.
async fn worker_and_job(s: &PgStore, prefix: &str) -> (String, JobId) {
    let w = homing::conformance::unique_queue(prefix);
    let t = now();
    s.register_worker(&homing::conformance::workers::info(&w, t), t)
        .await
        .unwrap();
    let job = new_job(&homing::conformance::unique_queue(prefix), "t");
    let id = job.id;
    s.insert(vec![job]).await.unwrap();
    (w, id)
}

/// Starts `id` under `w` and returns once the start holds what it takes before its write (the
/// fence among it), its write held until the gate returned is opened.
async fn start_held(
    s: &Arc<PgStore>,
    w: &str,
    id: JobId,
) -> (Gate, tokio::task::JoinHandle<Vec<StartOutcome>>) {
    let gate = Gate::close(s).await;
    slow_down(
        s,
        "homing_jobs",
        "NEW.state = 'running' AND OLD.state <> 'running'",
        GATED,
    )
    .await;
    let (store, worker) = (s.clone(), w.to_string());
    let start = tokio::spawn(async move { store.start(&[id], &worker, now()).await.unwrap() });
    until_held(s, "homing_jobs").await;
    (gate, start)
}

/// A batch's start and its completion plan each statement once per connection, as lookups by
/// id, whatever the batch's size, and their planner settings end with their transactions.
/// Left to itself PostgreSQL made a custom plan on most calls at the defaults' batches of 1 to 8
/// jobs, and planning cost more than running the statements (BENCHMARKS.md).
#[tokio::test]
async fn starts_and_completions_plan_once_and_keep_their_settings_to_themselves() {
    let s = one_connection().await;
    let (w, _) = worker_and_job(&s, "plans").await;
    // Another caller of the jobs' lock (a workflow's cancel, which reads them whole as the keyed
    // transactions do) plans its statement by PostgreSQL's own rule first, six times, on a small
    // table: the keyed transactions must not take its plan (without a text of their own they
    // would, and its five custom plans would show).
    for _ in 0..6 {
        let spec = homing::workflow::WorkflowSpec::new("plans").with_step(
            "a",
            homing::workflow::StepSpec::new("t", serde_json::json!({})),
        );
        let wf =
            homing::workflow::plan(spec, now(), |_, st| Ok(new_job("plans-wf", &st.task))).unwrap();
        let id = wf.id;
        s.create_workflow(wf).await.unwrap();
        s.cancel_workflow(id, now())
            .await
            .unwrap()
            .expect("the workflow");
    }
    let q = homing::conformance::unique_queue("plans");
    // More rounds than the five custom plans PostgreSQL makes before it weighs a generic one.
    let sizes = [1, 3, 8, 1, 2, 8, 1];
    for size in sizes {
        let jobs: Vec<_> = (0..size).map(|_| new_job(&q, "t")).collect();
        let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
        s.insert(jobs).await.unwrap();
        for c in homing::conformance::run_to_success(&*s, &ids, &w).await {
            assert!(matches!(c, Committed::Applied { .. }), "{c:?}");
        }
    }
    // The pool's one connection ran every statement.
    let mut conn = s.pool().acquire().await.unwrap();
    let plans: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements \
         WHERE statement NOT LIKE '%pg_prepared_statements%' \
           AND (statement LIKE 'WITH started AS%' OR statement LIKE 'WITH succeeded AS%' \
                OR statement LIKE '/* keyed */ SELECT ARRAY(SELECT DISTINCT workflow_id%' \
                OR statement LIKE '%pg_advisory_xact_lock_shared($2, $3)' \
                OR statement LIKE '/* keyed */ SELECT id, %FOR UPDATE' \
                OR statement LIKE '%FROM homing_queues WHERE paused AND name = ANY($1)%')",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    // The start's update, the completion's, the probe before the locks (a start's form and a
    // completion's), the jobs' lock, the paused-queues read.
    assert_eq!(plans.len(), 6, "{plans:#?}");
    let cancel_plans: i64 = sqlx::query_scalar(
        "SELECT generic_plans + custom_plans FROM pg_prepared_statements \
         WHERE statement LIKE 'SELECT id, %FOR UPDATE'",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(cancel_plans, 6, "the workflow cancels' own statement");
    for (statement, generic, custom) in &plans {
        assert_eq!(*custom, 0, "planned anew on a call: {statement}");
        assert!(*generic >= 1, "never planned: {statement}");
    }
    for (setting, default) in [
        ("plan_cache_mode", "auto"),
        ("enable_seqscan", "on"),
        ("enable_hashjoin", "on"),
        ("enable_mergejoin", "on"),
    ] {
        let now_set: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {setting}")))
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(now_set, default, "{setting} outlived its transaction");
    }
}

/// A completion's follow-up is inserted under the planner's defaults: the settings that make a
/// batch's start and completion plan once (nested loops only) end before it. A plan stays with
/// its statement on the connection, and the insert's statement is also a producer's enqueue:
/// made without hash joins, its plan would match a later batch of 10,000 jobs to their timeline
/// entries by a nested loop.
#[tokio::test]
async fn a_completions_follow_up_is_planned_with_the_defaults() {
    let s = one_connection().await;
    let (w, _) = worker_and_job(&s, "follow").await;
    let mut job = new_job(&homing::conformance::unique_queue("follow"), "t");
    job.options.on_success = Some(follow_up());
    let id = job.id;
    s.insert(vec![job]).await.unwrap();
    match &homing::conformance::run_to_success(&*s, &[id], &w).await[..] {
        [Committed::Applied { dispatch, .. }] => assert_eq!(dispatch.len(), 1, "{dispatch:?}"),
        other => panic!("unexpected {other:?}"),
    }
    // Three inserts on the connection (a job of worker_and_job's, the parent, its follow-up):
    // all custom plans under the defaults, where the keyed settings make the last a generic one.
    assert_eq!(
        insert_plans(&s).await,
        (0, 3),
        "the insert's generic and custom plans"
    );
}

/// The same for a start that finds its job dead (out of crashes) and inserts its `on_failure`
/// follow-up.
#[tokio::test]
async fn a_dead_starts_follow_up_is_planned_with_the_defaults() {
    let s = one_connection().await;
    let (w, _) = worker_and_job(&s, "dead").await;
    let mut job = new_job(&homing::conformance::unique_queue("dead"), "t");
    job.options.max_crashes = Some(0);
    job.options.on_failure = Some(follow_up());
    let id = job.id;
    s.insert(vec![job]).await.unwrap();
    assert_eq!(
        s.start(&[id], &w, now()).await.unwrap(),
        vec![StartOutcome::Dead]
    );
    assert_eq!(
        insert_plans(&s).await,
        (0, 3),
        "the insert's generic and custom plans"
    );
}

/// The same for a completion that ends a workflow's step: the workflow is settled under the
/// defaults. Its statements find steps by workflow and state, and a generic plan made with the
/// keyed settings on a small table can pick an index that walks every waiting job.
#[tokio::test]
async fn a_workflow_step_is_settled_with_the_defaults() {
    use homing::workflow::{plan, StepSpec, WorkflowSpec};
    let s = one_connection().await;
    let (w, _) = worker_and_job(&s, "settle").await;
    let q = homing::conformance::unique_queue("settle");
    let spec = WorkflowSpec::new("settle")
        .with_step("a", StepSpec::new("t.a", serde_json::json!({})))
        .with_step("b", {
            let mut st = StepSpec::new("t.b", serde_json::json!({}));
            st.after = vec!["a".into()];
            st
        });
    let wf = plan(spec, now(), |_, st| Ok(new_job(&q, &st.task))).expect("a valid graph");
    let first = s
        .create_workflow(wf)
        .await
        .unwrap()
        .into_iter()
        .find(|i| i.state == JobState::Queued)
        .expect("a runnable step")
        .id;
    match &homing::conformance::run_to_success(&*s, &[first], &w).await[..] {
        [Committed::Applied { dispatch, .. }] => assert_eq!(dispatch.len(), 1, "{dispatch:?}"),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        plans_of(
            &s,
            "UPDATE homing_jobs SET state = 'queued', dispatched = false, parents = $2%"
        )
        .await,
        (0, 1),
        "the step made runnable"
    );
}

/// The follow-up the plan cases' jobs carry.
fn follow_up() -> homing::FollowUp {
    homing::FollowUp {
        task: "t.next".into(),
        queue: None,
        args: serde_json::json!({}),
    }
}

/// A store on a fresh database whose pool has one connection, so that every statement it sends
/// is prepared on that connection.
async fn one_connection() -> Arc<PgStore> {
    with_options(PgOptions {
        max_connections: 1,
        ..PgOptions::default()
    })
    .await
    .1
}

/// How often the one connection of `s` planned the statement whose text is `LIKE` `pattern`:
/// (generically, for its values).
async fn plans_of(s: &PgStore, pattern: &str) -> (i64, i64) {
    let mut conn = s.pool().acquire().await.unwrap();
    sqlx::query_as(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE $1",
    )
    .bind(pattern)
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// The same for the jobs' insert statement.
async fn insert_plans(s: &PgStore) -> (i64, i64) {
    plans_of(s, "WITH ins AS (INSERT INTO homing_jobs%").await
}

/// On a fresh database, a store with the defaults (which migrated it) and one with `options`.
async fn with_options(options: PgOptions) -> (Arc<PgStore>, Arc<PgStore>) {
    let url = server().fresh_database().await;
    let defaults = Arc::new(PgStore::connect(&url).await.unwrap());
    let other = Arc::new(PgStore::open(&url, options).await.unwrap());
    (defaults, other)
}

/// A presumption made while a start of the same worker is in flight waits for it and records
/// its run, so the run's loss counts a crash (it began before the presumption). Without the
/// start fence the presumption read the jobs before the start committed, recorded nothing, and
/// the run was taken back without a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_presumption_waits_for_a_start_in_flight_and_records_its_run() {
    let (s, patient) = with_options(PgOptions {
        fence_wait: Duration::from_secs(10),
        ..PgOptions::default()
    })
    .await;
    let (w, id) = worker_and_job(&s, "inflight").await;
    let (gate, start) = start_held(&s, &w, id).await;
    let (store, worker) = (patient.clone(), w.clone());
    let presume = tokio::spawn(async move { store.presume_lost(&worker, now()).await.unwrap() });
    until_waiting(&s, ASLEEP_OR_ADVISORY, "SELECT pg_advisory_xact_lock(%").await;
    gate.open().await;
    assert_eq!(presume.await.unwrap(), Presumption::Made);
    let started = start.await.unwrap();
    assert!(matches!(started[0], StartOutcome::Run(_)), "{started:?}");
    let (lost, _) = s.mark_lost_unparking(id, &w, true, now()).await.unwrap();
    assert_eq!(lost, Lost::Requeued);
    let j = s.get(id).await.unwrap().unwrap();
    assert_eq!((j.state, j.crashes), (JobState::Queued, 1), "{j:?}");
}

/// A start that comes while a presumption of its worker is being written waits for it and is
/// refused. Without the fence it read the worker's row before the presumption committed and
/// began a run the presumption never recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_start_during_a_presumption_waits_for_it_and_is_refused() {
    let s = Arc::new(fresh_store().await);
    let (w, id) = worker_and_job(&s, "during").await;
    let gate = Gate::close(&s).await;
    slow_down(
        &s,
        "homing_workers",
        "NEW.presumed_dead_at IS NOT NULL AND OLD.presumed_dead_at IS NULL",
        GATED,
    )
    .await;
    let (store, worker) = (s.clone(), w.clone());
    let presume = tokio::spawn(async move { store.presume_lost(&worker, now()).await.unwrap() });
    until_held(&s, "homing_workers").await;
    let (store, worker) = (s.clone(), w.clone());
    let start = tokio::spawn(async move { store.start(&[id], &worker, now()).await.unwrap() });
    until_waiting(&s, ASLEEP_OR_ADVISORY, "%pg_advisory_xact_lock\\_shared(%").await;
    gate.open().await;
    assert_eq!(presume.await.unwrap(), Presumption::Made);
    assert_eq!(
        start.await.unwrap(),
        vec![StartOutcome::Presumed],
        "a start after a presumption"
    );
    let j = s.get(id).await.unwrap().unwrap();
    assert_eq!((j.state, j.epoch), (JobState::Queued, 0), "{j:?}");
}

/// A presumption held up at the fence by a start of its worker (a process paused mid-transaction
/// holds its start until its session is ended) is deferred: it writes nothing, and the one
/// connection it waited on is usable afterwards with its settings as they were (the lock is a
/// statement inside the open transaction, which is rolled back; its `lock_timeout` is local to
/// it). Once the start is done the presumption goes through and records the run. Here the
/// statement timeout (200 ms) is shorter than `fence_wait` (1 s): the wait is kept under it, so
/// the answer is a deferral, not a failed call. Before: the presumption waited out the start, or
/// failed at the statement timeout (and taken in the `BEGIN` query, its failed wait left the
/// connection in an aborted transaction, refusing every later statement).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_presumption_held_up_by_a_stuck_start_is_deferred_and_writes_nothing() {
    let (s, impatient) = with_options(PgOptions {
        max_connections: 1,
        statement_timeout: Duration::from_millis(200),
        ..PgOptions::default()
    })
    .await;
    let (w, id) = worker_and_job(&s, "stuck").await;
    let (gate, start) = start_held(&s, &w, id).await;
    assert_eq!(
        impatient.presume_lost(&w, now()).await.unwrap(),
        Presumption::Deferred
    );
    let view = s.worker(&w).await.unwrap().unwrap();
    assert_eq!(view.presumed_dead_at, None, "a deferred presumption wrote");
    let lock_timeout: String = sqlx::query_scalar("SHOW lock_timeout")
        .fetch_one(impatient.pool())
        .await
        .expect("the connection after a deferral");
    assert_eq!(lock_timeout, "0");
    gate.open().await;
    assert!(matches!(start.await.unwrap()[0], StartOutcome::Run(_)));
    assert_eq!(
        impatient.presume_lost(&w, now()).await.unwrap(),
        Presumption::Made
    );
    let (lost, _) = s.mark_lost_unparking(id, &w, true, now()).await.unwrap();
    assert_eq!(lost, Lost::Requeued);
    assert_eq!(s.get(id).await.unwrap().unwrap().crashes, 1);
}

/// A worker presumed dead already is not deferred by a start of it that holds the fence (one
/// that came after the presumption, to be refused, stuck here behind its limited queue's row):
/// its runs are recorded, so the rescuers may go on. Before, it was deferred like a worker not
/// yet presumed, and its jobs waited for the stuck start.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_presumed_already_is_not_deferred_by_a_start_it_holds() {
    use homing::limit::QueueLimits;

    let (s, quick) = with_options(PgOptions {
        fence_wait: Duration::from_millis(200),
        ..PgOptions::default()
    })
    .await;
    let (w, id) = worker_and_job(&s, "already").await;
    let q = s.get(id).await.unwrap().unwrap().queue;
    let one = QueueLimits {
        concurrency: Some(1),
        ..Default::default()
    };
    s.set_limits(&q, &one, now()).await.unwrap();
    assert_eq!(s.presume_lost(&w, now()).await.unwrap(), Presumption::Made);
    let row = hold_queue_row(&s, &q).await;
    let (store, worker) = (s.clone(), w.clone());
    let start = tokio::spawn(async move { store.start(&[id], &worker, now()).await.unwrap() });
    until_waiting(&s, &["transactionid", "tuple"], "%homing_queues%").await;
    assert_eq!(
        quick.presume_lost(&w, now()).await.unwrap(),
        Presumption::Made
    );
    row.rollback().await.unwrap();
    assert_eq!(start.await.unwrap(), vec![StartOutcome::Presumed]);
}

/// Two lost workers, one of them with a start stuck in flight: a rescuer's sweep and a
/// reconciler's pass each leave the stuck one for later and reclaim the other's job. Before,
/// the stuck worker's presumption waited for its start, then reclaimed its job too (and with
/// the start stuck longer than the statement timeout, failed the whole sweep or pass, holding
/// up every other lost worker and, in the reconciler, the outbox).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_worker_with_a_stuck_start_holds_up_no_other_rescue() {
    use homing::broker::sqlite::SqliteBroker;
    use homing::broker::Broker;
    use homing::maintenance::{reconciler, rescuer, MaintenanceConfig};
    use homing::store::ToPublish;

    let (s, quick) = with_options(PgOptions {
        fence_wait: Duration::from_millis(200),
        ..PgOptions::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let b = SqliteBroker::new(homing::sqlite::Db::open(dir.path().join("broker.db")).unwrap());
    // Set now, so the reconciler's pass does not take the broker for one that lost its data
    // (re-dispatching every queued job would wait for the held start's row).
    assert!(!b.check_marker().await.unwrap());
    let q = homing::conformance::unique_queue("stuck");
    let (stuck, other) = (
        homing::conformance::unique_queue("stuck-w"),
        homing::conformance::unique_queue("other-w"),
    );
    // Both have a job with no message left (the reconciler's orphan); the other worker also
    // holds a message of its running job (the rescuer's). The stuck worker's next start is held.
    let jobs: Vec<_> = (0..4).map(|_| new_job(&q, "t")).collect();
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    s.insert(jobs).await.unwrap();
    b.publish(&[ToPublish {
        id: ids[1],
        queue: q.clone(),
        priority: 0,
    }])
    .await
    .unwrap();
    for w in [&stuck, &other] {
        let t = now();
        s.register_worker(&homing::conformance::workers::info(w, t), t)
            .await
            .unwrap();
        b.register(w, Duration::from_millis(200)).await.unwrap();
    }
    let got = b
        .reserve(&other, std::slice::from_ref(&q), 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    for (w, mine) in [(&stuck, vec![ids[0]]), (&other, vec![ids[1], ids[3]])] {
        let out = s.start(&mine, w, now()).await.unwrap();
        assert!(
            out.iter().all(|o| matches!(o, StartOutcome::Run(_))),
            "{out:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(350)).await;
    let lost = b.lost_consumers().await.unwrap();
    assert!(lost.contains(&stuck) && lost.contains(&other), "{lost:?}");
    let (gate, start) = start_held(&s, &stuck, ids[2]).await;

    let report = rescuer::sweep(&b, &*quick).await.unwrap();
    assert_eq!((report.requeued, report.deferred), (1, 1), "{report:?}");
    let config = MaintenanceConfig::for_heartbeat(Duration::from_millis(200));
    let pass = reconciler::pass(&b, &*quick, &config, true).await.unwrap();
    assert_eq!(pass.orphans_requeued, 1, "{pass:?}");
    gate.open().await;
    assert!(matches!(start.await.unwrap()[0], StartOutcome::Run(_)));
    // The stuck worker's runs are untouched; the other's were reclaimed, each a crash.
    for (id, state, crashes) in [
        (ids[0], JobState::Running, 0),
        (ids[1], JobState::Queued, 1),
        (ids[2], JobState::Running, 0),
        (ids[3], JobState::Queued, 1),
    ] {
        let j = s.get(id).await.unwrap().unwrap();
        assert_eq!((j.state, j.crashes), (state, crashes), "{j:?}");
    }
}

/// A client paused inside a transaction (SIGSTOP between a start's statements) holds its row
/// locks until the server ends its session: here the row of a limited queue, which every start
/// of that queue's jobs locks. With `idle_in_transaction_timeout` the server ends the paused
/// session and the other worker's start goes through; without it (the old 60 s) that start
/// waited out its own statement timeout and failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_left_idle_is_ended_so_a_limited_queue_does_not_stall() {
    use homing::limit::QueueLimits;

    let url = server().fresh_database().await;
    let paused = PgStore::open(
        &url,
        PgOptions {
            idle_in_transaction_timeout: Duration::from_millis(300),
            ..PgOptions::default()
        },
    )
    .await
    .unwrap();
    paused.migrate().await.unwrap();
    let other = PgStore::open(
        &url,
        PgOptions {
            statement_timeout: Duration::from_secs(5),
            ..PgOptions::default()
        },
    )
    .await
    .unwrap();
    let (w, id) = worker_and_job(&other, "idle").await;
    let q = other.get(id).await.unwrap().unwrap().queue;
    let two = QueueLimits {
        concurrency: Some(2),
        ..Default::default()
    };
    other.set_limits(&q, &two, now()).await.unwrap();
    let tx = hold_queue_row(&paused, &q).await;
    let started = other
        .start(&[id], &w, now())
        .await
        .expect("the start waited out its statement timeout behind the idle transaction");
    assert!(matches!(started[0], StartOutcome::Run(_)), "{started:?}");
    drop(tx);
    // The paused store gets a working connection again.
    assert_eq!(
        paused.get(id).await.unwrap().unwrap().state,
        JobState::Running
    );
}

/// The unparking pass (run with the periodic schedules by every process) leaves a limited queue
/// whose row a stuck transaction holds for its next pass and unparks the other queues' jobs.
/// Before, it waited on that row (a paused worker's start holds it until its session is ended)
/// and failed at the statement timeout, holding up every queue and the schedules with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_unparking_pass_skips_a_queue_whose_row_a_stuck_start_holds() {
    use homing::limit::{QueueLimits, Rate};

    let (s, impatient) = with_options(PgOptions {
        statement_timeout: Duration::from_secs(5),
        ..PgOptions::default()
    })
    .await;
    // Sorted first, so the pass reaches it before the other.
    let stuck = homing::conformance::unique_queue("aaa-stuck");
    let rated = homing::conformance::unique_queue("zzz-rated");
    let one_an_hour = QueueLimits {
        rate: Some(Rate {
            count: 1,
            period: Duration::from_secs(3600),
        }),
        ..Default::default()
    };
    let mut parked = Vec::new();
    let t = now();
    for q in [&stuck, &rated] {
        s.set_limits(q, &one_an_hour, t).await.unwrap();
        let jobs = vec![new_job(q, "t"), new_job(q, "t")];
        let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
        s.insert(jobs).await.unwrap();
        let out = s.start(&ids, "w", t).await.unwrap();
        assert!(matches!(out[0], StartOutcome::Run(_)), "{out:?}");
        assert_eq!(out[1], StartOutcome::Parked);
        parked.push(ids[1]);
    }
    let row = hold_queue_row(&s, &stuck).await;
    let later = t + 3_601_000_000;
    let ready = impatient
        .unpark_ready(later, 1000)
        .await
        .expect("the pass waited for the held row");
    let ids: Vec<JobId> = ready.iter().map(|d| d.id).collect();
    assert_eq!(ids, vec![parked[1]], "only the other queue's job");
    row.rollback().await.unwrap();
    let ready = impatient.unpark_ready(later, 1000).await.unwrap();
    let ids: Vec<JobId> = ready.iter().map(|d| d.id).collect();
    assert_eq!(
        ids,
        vec![parked[0]],
        "the skipped queue's job at the next pass"
    );
}

/// A search whose caller stopped waiting does not run on for nobody: its connection is closed
/// rather than pooled again, and the server ends the statement at its next check of the client
/// (each second), not at its statement_timeout (30 s). The search is held up by a lock another
/// session keeps, as a long scan of every row would keep it busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_whose_caller_left_is_stopped_on_the_server() {
    let s = Arc::new(fresh_store().await);
    s.insert(vec![new_job("q", "t")]).await.unwrap();
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert!(
        version >= 140_000,
        "the server's check of its clients needs PostgreSQL 14 or later (Debian package \
         postgresql-15); this one is {version}"
    );
    let mut hold = s.pool().begin().await.unwrap();
    let holder: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *hold)
        .await
        .unwrap();
    sqlx::query("LOCK TABLE homing_jobs IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *hold)
        .await
        .unwrap();
    // Sessions waiting for the holder's lock: the search, while it runs.
    let searching = {
        let s = s.clone();
        move || {
            let s = s.clone();
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
                     AND wait_event_type = 'Lock' AND $1 = ANY(pg_blocking_pids(pid))",
                )
                .bind(holder)
                .fetch_one(s.pool())
                .await
                .unwrap()
            }
        }
    };
    let search = homing::search::JobSearch {
        args_contains: Some("no such text".into()),
        ..Default::default()
    };
    let task = {
        let (s, search) = (s.clone(), search.clone());
        tokio::spawn(async move { s.search(&search, None, 10).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while searching().await == 0 {
        assert!(
            Instant::now() < deadline,
            "the search never reached the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
    let left = Instant::now();
    while searching().await > 0 {
        assert!(
            left.elapsed() < Duration::from_secs(10),
            "the abandoned search still runs on the server"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    hold.rollback().await.unwrap();
    // The pool goes on serving.
    let page = s.search(&search, None, 10).await.unwrap();
    assert!(page.jobs.is_empty());
    assert_eq!(
        s.search(&Default::default(), None, 10)
            .await
            .unwrap()
            .jobs
            .len(),
        1
    );
}

/// An hourly schedule of `builtin.noop` on `default`.
fn hourly(name: &str) -> homing::schedule::ScheduleDef {
    homing::schedule::ScheduleDef {
        name: name.into(),
        task: "builtin.noop".into(),
        args: serde_json::json!({}),
        queue: "default".into(),
        options: homing::JobOptions::default(),
        spec: homing::schedule::Spec::Every {
            interval: Duration::from_secs(3600),
        },
        missed: homing::schedule::Missed::Latest,
    }
}

/// Schedules are paged by the bytes of their names (as the embedded file keeps them) from an
/// index, whatever the database's collation. The test server's databases are C, where the
/// primary key's index serves that order; this one is C.UTF-8 (on every Debian), where it does
/// not, and without the bytewise index each page of the list sorted every later schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_paged_from_an_index_in_a_database_that_is_not_c() {
    use sqlx::{Connection, Executor};
    let name = format!("homing_collate_{}", std::process::id());
    let mut admin = sqlx::PgConnection::connect(&server().url("postgres"))
        .await
        .unwrap();
    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8' \
             LC_COLLATE 'C.UTF-8' LC_CTYPE 'C.UTF-8'"
        )))
        .await
        .expect("a database in C.UTF-8 (the locale ships with every Debian libc)");
    let s = PgStore::connect(&server().url(&name)).await.unwrap();
    let names = ["b-2", "B-1", "a.9", "_x", "A:0", "b-10"];
    for n in names {
        s.put_schedule(&hourly(n), now()).await.unwrap();
    }
    // Bytewise, two to a page.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = s.schedules_page(after.as_deref(), 2).await.unwrap();
        seen.extend(page.schedules.iter().map(|x| x.def.name.clone()));
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let mut bytewise: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    bytewise.sort();
    assert_eq!(seen, bytewise);
    // The page's first query, planned with sorts and sequential scans priced out: it reads the
    // bytewise index, in order, and sorts nothing.
    let mut c = sqlx::PgConnection::connect(&server().url(&name))
        .await
        .unwrap();
    c.execute("SET enable_seqscan = off; SET enable_sort = off")
        .await
        .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT name, octet_length(definition)::bigint FROM homing_schedules \
         WHERE name COLLATE \"C\" > $1 ORDER BY name COLLATE \"C\" LIMIT $2",
    )
    .bind("B-1")
    .bind(3_i64)
    .fetch_all(&mut c)
    .await
    .unwrap();
    let plan = plan.join("\n");
    assert!(
        plan.contains("homing_schedules_name_bytewise") && !plan.contains("Sort"),
        "{plan}"
    );
}

/// The schedules' change count (migration 27) moves with a statement that sets any of the
/// columns the periodic pass reads, however it is written (here by hand), and not with the other
/// columns; its deltas are folded by the read that finds many, and a fold keeps the sum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_changes_count_each_head_column_and_fold() {
    let s = fresh_store().await;
    let count = || async { s.schedule_changes().await.unwrap().expect("kept") };
    s.put_schedule(&hourly("hand"), now()).await.unwrap();
    let sql = |q: &'static str| sqlx::query(q).execute(s.pool());
    for (set, counted) in [
        ("UPDATE homing_schedules SET name = name", true),
        ("UPDATE homing_schedules SET spec = spec", true),
        ("UPDATE homing_schedules SET cursor = cursor", true),
        ("UPDATE homing_schedules SET paused = paused", true),
        (
            "UPDATE homing_schedules SET last_tick = 1, last_job = 'x', \
             definition = definition, updated_at = 2",
            false,
        ),
    ] {
        let before = count().await;
        sql(set).await.unwrap();
        let moved = count().await - before;
        assert_eq!(moved, u64::from(counted), "{set}");
    }
    let before = count().await;
    for _ in 0..100 {
        sql("UPDATE homing_schedules SET cursor = cursor")
            .await
            .unwrap();
    }
    let rows = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM homing_schedule_changes")
            .fetch_one(s.pool())
            .await
            .unwrap()
    };
    assert!(rows().await > 64, "one delta a statement");
    assert_eq!(count().await, before + 100, "read before any fold");
    assert_eq!(rows().await, 1, "the read folded the deltas");
    assert_eq!(count().await, before + 100, "read after a fold");
    let before = count().await;
    sql("DELETE FROM homing_schedules").await.unwrap();
    assert_eq!(count().await, before + 1, "a deletion by hand");
}
