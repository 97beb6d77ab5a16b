//! `homing migrate` and `--store postgres://…` through the real binary, against a PostgreSQL
//! that this test binary starts itself (the harness is shared with the library's tests).

#[path = "../../homing/tests/support/postgres.rs"]
#[allow(dead_code)]
mod postgres;

use homing::store::postgres::MIGRATIONS;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn homing(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_homing"))
        .args(args)
        .current_dir(dir)
        .env_remove("HOMING_STORE")
        .env_remove("HOMING_BROKER")
        .output()
        .expect("run homing")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_applies_once_and_every_command_uses_the_postgres_store() {
    let url = postgres::server().fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let broker = format!("sqlite://{}/broker.db", dir.path().display());

    let latest = MIGRATIONS.last().unwrap();
    let first = homing(dir.path(), &["migrate", "--store", &url]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    for m in MIGRATIONS {
        assert!(
            text(&first.stdout).contains(&format!("applied {}", m.name)),
            "{}",
            text(&first.stdout)
        );
    }
    let at = format!("schema at version {}", latest.version);
    assert!(text(&first.stdout).contains(&at), "{}", text(&first.stdout));
    let second = homing(dir.path(), &["migrate", "--store", &url, "--json"]);
    assert!(second.status.success(), "{}", text(&second.stderr));
    let report: serde_json::Value = serde_json::from_slice(&second.stdout).unwrap();
    assert_eq!(report["applied"], serde_json::json!([]));
    assert_eq!(report["latest"], latest.name);
    assert_eq!(report["version"], latest.version);
    let third = homing(dir.path(), &["migrate", "--store", &url]);
    assert!(third.status.success(), "{}", text(&third.stderr));
    assert!(
        text(&third.stdout).contains(&format!("{at}, nothing to apply")),
        "{}",
        text(&third.stdout)
    );

    // The embedded broker's file must exist for enqueue; migrating it as a store creates it,
    // and says so the same way.
    let sqlite = homing(dir.path(), &["migrate", "--store", &broker]);
    assert!(sqlite.status.success(), "{}", text(&sqlite.stderr));
    assert!(
        text(&sqlite.stdout).contains("applied 0001_init"),
        "{}",
        text(&sqlite.stdout)
    );
    // enqueue writes the job to PostgreSQL; jobs get reads it back from there.
    let enq = homing(
        dir.path(),
        &[
            "enqueue",
            "builtin.noop",
            "--allow-unknown-task",
            "--store",
            &url,
            "--broker",
            &broker,
        ],
    );
    assert!(enq.status.success(), "{}", text(&enq.stderr));
    let id = text(&enq.stdout).trim().to_string();
    let got = homing(
        dir.path(),
        &[
            "jobs", "get", &id, "--json", "--store", &url, "--broker", &broker,
        ],
    );
    assert!(got.status.success(), "{}", text(&got.stderr));
    let job: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!(job["state"], "queued");
    assert_eq!(job["task"], "builtin.noop");
}

/// A database a version-1 build migrated (0001 applied and recorded) is upgraded by `homing
/// migrate`, which names what it applied, and the next run applies nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_an_old_postgres_schema_and_reports_it() {
    let url = postgres::server().fresh_database().await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::raw_sql(include_str!(
        "../../homing/src/store/postgres/migrations/0001_init.sql"
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE homing_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, \
         applied_at TIMESTAMPTZ NOT NULL DEFAULT now()); \
         INSERT INTO homing_migrations (version, name) VALUES (1, '0001_init')",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let dir = tempfile::tempdir().unwrap();
    let latest = MIGRATIONS.last().unwrap();
    let first = homing(dir.path(), &["migrate", "--store", &url]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let out = text(&first.stdout);
    assert!(!out.contains("0001_init"), "{out}");
    for m in &MIGRATIONS[1..] {
        assert!(out.contains(&format!("applied {}", m.name)), "{out}");
    }
    assert!(
        out.contains(&format!("schema at version {}", latest.version)),
        "{out}"
    );
    let second = homing(dir.path(), &["migrate", "--store", &url]);
    let out = text(&second.stdout);
    assert!(
        out.contains(&format!(
            "schema at version {}, nothing to apply",
            latest.version
        )),
        "{out}"
    );
}

#[test]
fn migrate_against_no_server_fails_fast_without_printing_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "postgres://homing:hunter2-secret@localhost:5432/db?host={}",
        dir.path().display()
    );
    let t = Instant::now();
    let out = homing(dir.path(), &["migrate", "--store", &url]);
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert!(!out.status.success());
    let all = text(&out.stdout) + &text(&out.stderr);
    assert!(all.contains("unavailable"), "{all}");
    assert!(!all.contains("hunter2-secret"), "{all}");
}
