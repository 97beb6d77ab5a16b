//! Transactional enqueue on a real PostgreSQL (docs/workflows.md): a job enqueued in the
//! application's own transaction exists if and only if that transaction commits, from Rust
//! (`Client::enqueue_in`) and from SQL (`homing_enqueue`, installed by the migrations), which
//! checks its input like the door does; the listener's signal arrives at commit, not before.

mod support;

use homing::validate::MAX_DEPTH;
use std::time::Duration;

use homing::job::JobState;
use homing::store::postgres::PgStore;
use homing::store::Store;
use homing::{Client, EnqueueRequest};
use sqlx::Connection;
use support::postgres::server;

async fn setup() -> (String, PgStore, Client) {
    let url = server().fresh_database().await;
    let store = PgStore::connect(&url).await.expect("connect and migrate");
    let dir = tempfile::tempdir().unwrap();
    let broker = format!("sqlite://{}/broker.db", dir.path().display());
    let b = homing::Backends::open(&broker, &url).await.unwrap();
    std::mem::forget(dir);
    (url, store, Client::new(b.broker, b.store))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_in_commits_with_the_application_transaction() {
    let (url, store, client) = setup().await;
    let mut app = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::query("CREATE TABLE documents (id SERIAL PRIMARY KEY, title TEXT NOT NULL)")
        .execute(&mut app)
        .await
        .unwrap();
    assert!(
        store.wait_enqueued().await.unwrap(),
        "a first look after connecting"
    );

    let mut tx = app.begin().await.unwrap();
    sqlx::query("INSERT INTO documents (title) VALUES ('dropped')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let rolled = client
        .enqueue_in(
            &mut tx,
            EnqueueRequest::new("doc.ocr", serde_json::json!({"d": 1})),
        )
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(
        store.get(rolled.id).await.unwrap().is_none(),
        "a rolled-back enqueue leaves no job"
    );

    // A listener waits; it must not be woken before the commit, and must be after it.
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move { store.wait_enqueued().await })
    };
    let mut tx = app.begin().await.unwrap();
    let kept = client
        .enqueue_in(
            &mut tx,
            EnqueueRequest::new("doc.ocr", serde_json::json!({"d": 2})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "no signal before the commit");
    assert!(
        store.get(kept.id).await.unwrap().is_none(),
        "invisible before the commit"
    );
    tx.commit().await.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the commit signals the listener")
        .unwrap();
    assert!(woke.unwrap());
    let job = store
        .get(kept.id)
        .await
        .unwrap()
        .expect("committed with the transaction");
    assert_eq!(job.state, JobState::Queued);
    assert_eq!(job.args, serde_json::json!({"d": 2}));
    let due = store
        .undispatched(homing::time::now() + 1, 10)
        .await
        .unwrap();
    assert!(
        due.iter().any(|d| d.id == kept.id),
        "left for the listener and reconciler to publish"
    );

    // Checked like enqueue.
    let mut tx = app.begin().await.unwrap();
    let e = client
        .enqueue_in(
            &mut tx,
            EnqueueRequest::new("builtin.webhook", serde_json::json!({})),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("internal"), "{e}");
}

async fn call(conn: &mut sqlx::PgConnection, sql: &str) -> Result<uuid::Uuid, (String, String)> {
    sqlx::query_scalar::<_, uuid::Uuid>(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(conn)
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(db) => (
                db.code().unwrap_or_default().to_string(),
                db.message().to_string(),
            ),
            other => (String::new(), other.to_string()),
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn homing_enqueue_checks_its_input_like_the_door() {
    let (url, store, _client) = setup().await;
    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    let big = format!("'{{\"s\": \"{}\"}}'::jsonb", "x".repeat(1024 * 1024));
    let cases = [
        (
            "SELECT homing_enqueue('no spaces', '{}')".to_string(),
            "invalid task name",
        ),
        (
            "SELECT homing_enqueue(NULL, '{}')".to_string(),
            "invalid task name",
        ),
        (
            "SELECT homing_enqueue('builtin.webhook', '{}')".to_string(),
            "internal to homing",
        ),
        (
            "SELECT homing_enqueue('t', '{}', queue => 'a/b')".to_string(),
            "invalid queue name",
        ),
        (
            "SELECT homing_enqueue('t', '{}', queue => 'homing.webhooks')".to_string(),
            "reserved",
        ),
        (
            format!("SELECT homing_enqueue('t', {big})"),
            "at most 1048576",
        ),
        (
            "SELECT homing_enqueue('t', '{}', countdown => -1)".to_string(),
            "countdown",
        ),
        (
            "SELECT homing_enqueue('t', '{}', countdown => 'NaN')".to_string(),
            "countdown",
        ),
        (
            "SELECT homing_enqueue('t', '{}', idempotency_key => '')".to_string(),
            "idempotency_key",
        ),
        (
            "SELECT homing_enqueue('t', '{}', idempotency_key => E'a\\nb')".to_string(),
            "idempotency_key",
        ),
        (
            format!(
                "SELECT homing_enqueue('t', '{}')",
                nested(MAX_DEPTH + 1, "1")
            ),
            "nested deeper than 64 levels",
        ),
        (
            format!("SELECT homing_enqueue('t', '{}')", nested(MAX_DEPTH, "[]")),
            "nested deeper than 64 levels",
        ),
        (
            "SELECT homing_enqueue('t', '{}', priority => 1001)".to_string(),
            "priority must be from -1000 to 1000",
        ),
        (
            "SELECT homing_enqueue('t', '{}', priority => NULL)".to_string(),
            "priority must be from -1000 to 1000",
        ),
    ];
    for (sql, want) in &cases {
        let (code, msg) = call(&mut c, sql).await.unwrap_err();
        assert_eq!(code, "22023", "{sql}: {msg}");
        assert!(msg.contains(want), "{sql}: {msg} lacks {want}");
    }
    let page = store.list(&Default::default(), None, 10).await.unwrap();
    assert!(page.jobs.is_empty(), "nothing refused was stored");

    let id = call(
        &mut c,
        "SELECT homing_enqueue('doc.ocr', '{\"k\": 1}'::jsonb, queue => 'ocr')",
    )
    .await
    .unwrap();
    assert_eq!(id.get_version_num(), 7, "time-ordered like homing's ids");
    let j = store.get(id).await.unwrap().unwrap();
    assert_eq!(
        (j.task.as_str(), j.queue.as_str(), j.state),
        ("doc.ocr", "ocr", JobState::Queued)
    );
    assert_eq!(j.args, serde_json::json!({"k": 1}));
    assert_eq!(j.max_crashes, homing::job::DEFAULT_MAX_CRASHES);
    let later = call(&mut c, "SELECT homing_enqueue('t', countdown => 3600)")
        .await
        .unwrap();
    let j = store.get(later).await.unwrap().unwrap();
    assert_eq!(j.state, JobState::Scheduled);
    assert_eq!(j.args, serde_json::json!({}));
    assert!(j.scheduled_at.unwrap() > homing::time::now() + 3_000_000_000);
    let k1 = call(
        &mut c,
        "SELECT homing_enqueue('t', '{}', idempotency_key => 'once')",
    )
    .await
    .unwrap();
    let k2 = call(
        &mut c,
        "SELECT homing_enqueue('t', '{\"other\": 1}', idempotency_key => 'once')",
    )
    .await
    .unwrap();
    assert_eq!(k1, k2, "a known key returns the existing job");

    // The deepest value the door accepts is accepted here too, with its priority.
    let deepest = nested(MAX_DEPTH, "1");
    let v: serde_json::Value = serde_json::from_str(&deepest).unwrap();
    homing::validate::json("args", &v, homing::validate::MAX_ARGS_BYTES).unwrap();
    let too_deep: serde_json::Value = serde_json::from_str(&nested(MAX_DEPTH + 1, "1")).unwrap();
    assert!(homing::validate::json("args", &too_deep, homing::validate::MAX_ARGS_BYTES).is_err());
    let id = call(
        &mut c,
        &format!("SELECT homing_enqueue('t', '{deepest}', priority => -5)"),
    )
    .await
    .unwrap();
    let j = store.get(id).await.unwrap().unwrap();
    assert_eq!((j.args, j.priority), (v, -5));
}

/// `levels` nested objects and arrays (alternating) around `inner`, as JSON text.
fn nested(levels: usize, inner: &str) -> String {
    let mut s = inner.to_string();
    for i in 0..levels {
        s = if i % 2 == 0 {
            format!("[{s}]")
        } else {
            format!("{{\"k\": {s}}}")
        };
    }
    s
}
