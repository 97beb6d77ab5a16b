//! The real binary's commands where they read their configuration: the pipelines' settings are
//! read only by the commands that run the pipelines, and `homing migrate` reports the embedded
//! store's schema as it is (numbered migrations, each applied once).

mod support;

use std::time::Duration;
use support::*;

/// A bad pipeline setting stops `homing up` at start with a one-line reason, and does not touch
/// the commands that only read or steer jobs.
#[test]
fn a_bad_pipeline_setting_fails_up_but_not_jobs_list() {
    let env = Env::sqlite();
    let (code, _, err) = env.run(&["migrate"]);
    assert_eq!(code, 0, "{err}");

    let mut list = env.command(&["jobs", "list", "--json"]);
    list.env("HOMING_BGM_SECONDS", "garbage");
    let out = list.output().expect("run homing");
    assert!(
        out.status.success(),
        "jobs list must not read the pipelines' settings: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(page["jobs"].is_array(), "{page}");

    let mut up = env.command(&["up", "--listen", &format!("127.0.0.1:{}", free_port())]);
    up.env("HOMING_BGM_SECONDS", "garbage");
    let mut child = up
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start homing up");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("homing up started despite HOMING_BGM_SECONDS=garbage");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains("HOMING_BGM_SECONDS"),
        "{err}"
    );
}

/// A command whose reader has gone (`homing migrate | head -1` once `head` exits) ends quietly
/// with the status a death by SIGPIPE gives, as other tools do, instead of panicking in the
/// middle of its output (exit 101 and a backtrace).
#[test]
fn a_command_whose_reader_went_away_ends_quietly() {
    let env = Env::sqlite();
    let (code, _, err) = env.run(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    let (code, err) = env.run_without_reader(&["migrate"]);
    assert_eq!(code, Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

fn migrate(env: &Env) -> (String, serde_json::Value) {
    let (code, text, err) = env.run(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    let (code, json, err) = env.run(&["migrate", "--json"]);
    assert_eq!(code, 0, "{err}");
    (text, serde_json::from_str(&json).expect("JSON report"))
}

/// This build's newest SQLite migration: its version and name (branches add migrations, so the
/// tests read them from the list rather than repeating a number).
fn latest() -> (i32, &'static str) {
    let m = homing::sqlite::MIGRATIONS.last().unwrap();
    (m.version, m.name)
}

#[test]
fn migrate_on_a_fresh_sqlite_store_applies_each_migration_once() {
    let env = Env::sqlite();
    let (code, first, err) = env.run(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    assert!(first.contains("applied 0001_init"), "{first}");
    assert!(first.contains("applied 0002_events"), "{first}");
    assert!(first.contains("applied 0003_queues"), "{first}");
    assert!(first.contains("applied 0004_remote"), "{first}");
    assert!(first.contains("applied 0005_schedules"), "{first}");
    assert!(first.contains("applied 0006_limits"), "{first}");
    for m in homing::sqlite::MIGRATIONS {
        assert!(first.contains(&format!("applied {}", m.name)), "{first}");
    }
    let (latest, latest_name) = latest();
    assert!(
        first.contains(&format!("schema at version {latest}")),
        "{first}"
    );

    let (second, report) = migrate(&env);
    assert!(
        second.contains(&format!("schema at version {latest}, nothing to apply")),
        "{second}"
    );
    assert!(!second.contains("applied"), "{second}");
    assert_eq!(report["applied"], serde_json::json!([]));
    assert_eq!(report["version"], latest);
    assert_eq!(report["latest"], latest_name);

    let conn = rusqlite::Connection::open(env.db_path()).unwrap();
    let rows: Vec<(i64, String, i64)> = conn
        .prepare("SELECT version, name, applied_at FROM homing_migrations ORDER BY version")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // One row per migration of this build, in order; the first seven are the released ones.
    let recorded: Vec<(i64, &str)> = rows.iter().map(|r| (r.0, r.1.as_str())).collect();
    let expected: Vec<(i64, &str)> = homing::sqlite::MIGRATIONS
        .iter()
        .map(|m| (i64::from(m.version), m.name))
        .collect();
    assert_eq!(recorded, expected);
    assert_eq!(
        &recorded[..7],
        &[
            (1, "0001_init"),
            (2, "0002_events"),
            (3, "0003_queues"),
            (4, "0004_remote"),
            (5, "0005_schedules"),
            (6, "0006_limits"),
            (7, "0007_workflows")
        ]
    );
    assert!(
        rows.iter().all(|r| r.2 > 0),
        "recorded with the time applied"
    );
}

/// The schema that builds before numbered migrations wrote as version 1 (`user_version` = 1),
/// copied here as it was released: such a file upgrades, keeps its jobs and says what it applied.
const OLD_SCHEMA_V1: &str = "
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, task TEXT NOT NULL, queue TEXT NOT NULL, state TEXT NOT NULL,
    args TEXT NOT NULL, result TEXT, error TEXT, attempts INTEGER NOT NULL DEFAULT 0,
    crashes INTEGER NOT NULL DEFAULT 0, epoch INTEGER NOT NULL DEFAULT 0, max_retries INTEGER,
    max_crashes INTEGER NOT NULL, retry_policy TEXT, time_limit_ms INTEGER,
    idempotency_key TEXT UNIQUE, progress TEXT, worker TEXT, created_at INTEGER NOT NULL,
    scheduled_at INTEGER, started_at INTEGER, finished_at INTEGER, updated_at INTEGER NOT NULL,
    dispatched INTEGER NOT NULL DEFAULT 0, cancel_requested INTEGER NOT NULL DEFAULT 0,
    on_success TEXT, on_failure TEXT
);
CREATE INDEX jobs_state_queue ON jobs(state, queue);
CREATE INDEX jobs_due ON jobs(scheduled_at) WHERE state = 'scheduled';
CREATE INDEX jobs_outbox ON jobs(updated_at) WHERE state = 'queued' AND dispatched = 0;
CREATE INDEX jobs_running ON jobs(worker) WHERE state = 'running';
CREATE TABLE workers (id TEXT PRIMARY KEY, info TEXT NOT NULL, started_at INTEGER NOT NULL,
    last_seen INTEGER NOT NULL, status TEXT NOT NULL);
CREATE TABLE tasks (name TEXT PRIMARY KEY);
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL,
    payload TEXT NOT NULL, consumer TEXT, reserved_at INTEGER,
    generation INTEGER NOT NULL DEFAULT 0);
CREATE INDEX messages_ready ON messages(queue, id) WHERE consumer IS NULL;
CREATE INDEX messages_owned ON messages(consumer) WHERE consumer IS NOT NULL;
CREATE TABLE dead_letters (id INTEGER PRIMARY KEY AUTOINCREMENT, queue TEXT NOT NULL,
    payload TEXT NOT NULL, reason TEXT NOT NULL, at INTEGER NOT NULL);
CREATE TABLE heartbeats (worker TEXT PRIMARY KEY, expires_at INTEGER NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO jobs (id, task, queue, state, args, max_crashes, created_at, updated_at, finished_at)
    VALUES ('0190a0a0-0000-7000-8000-000000000001', 'builtin.noop', 'default', 'succeeded', '{}',
            3, 1700000000000000, 1700000000000000, 1700000000000000);
PRAGMA user_version = 1;
";

/// Version 2 as those builds wrote it: version 1 plus the events outbox, `user_version` = 2.
const OLD_SCHEMA_V2_DELTA: &str = "
ALTER TABLE jobs ADD COLUMN callback_url TEXT;
CREATE INDEX jobs_finished ON jobs(finished_at) WHERE finished_at IS NOT NULL;
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, job_id TEXT,
    worker TEXT, data TEXT NOT NULL, created_at INTEGER NOT NULL, dispatched_at INTEGER);
CREATE INDEX events_pending ON events(id) WHERE dispatched_at IS NULL;
PRAGMA user_version = 2;
";

fn old_database(env: &Env, sql: &[&str]) {
    std::fs::create_dir_all(env.db_path().parent().unwrap()).unwrap();
    let conn = rusqlite::Connection::open(env.db_path()).unwrap();
    for s in sql {
        conn.execute_batch(s).unwrap();
    }
}

#[test]
fn an_old_version_1_sqlite_store_is_upgraded_and_reported() {
    let env = Env::sqlite();
    old_database(&env, &[OLD_SCHEMA_V1]);
    let (code, first, err) = env.run(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    assert!(first.contains("applied 0002_events"), "{first}");
    assert!(first.contains("applied 0003_queues"), "{first}");
    assert!(first.contains("applied 0007_workflows"), "{first}");
    assert!(first.contains("applied 0008_queue_limits"), "{first}");
    assert!(
        !first.contains("0001_init"),
        "version 1 was already there: {first}"
    );
    let (latest, _) = latest();
    assert!(
        first.contains(&format!("schema at version {latest}")),
        "{first}"
    );
    let (second, _) = migrate(&env);
    assert!(
        second.contains(&format!("schema at version {latest}, nothing to apply")),
        "{second}"
    );
    // The old job is still there, readable by this build.
    let (code, job, err) = env.run(&[
        "jobs",
        "get",
        "0190a0a0-0000-7000-8000-000000000001",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let job: serde_json::Value = serde_json::from_str(&job).unwrap();
    assert_eq!(job["state"], "succeeded");
}

#[test]
fn an_old_version_2_sqlite_store_gets_only_the_newer_migrations() {
    let env = Env::sqlite();
    old_database(&env, &[OLD_SCHEMA_V1, OLD_SCHEMA_V2_DELTA]);
    let (code, first, err) = env.run(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    assert!(first.contains("applied 0003_queues"), "{first}");
    assert!(first.contains("applied 0007_workflows"), "{first}");
    assert!(first.contains("applied 0008_queue_limits"), "{first}");
    assert!(!first.contains("0002_events"), "{first}");
    let (text, report) = migrate(&env);
    let (latest, _) = latest();
    assert!(
        text.contains(&format!("schema at version {latest}, nothing to apply")),
        "{text}"
    );
    assert_eq!(report["version"], latest);
    let conn = rusqlite::Connection::open(env.db_path()).unwrap();
    let names: Vec<String> = conn
        .prepare("SELECT name FROM homing_migrations ORDER BY version")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let all: Vec<&str> = homing::sqlite::MIGRATIONS.iter().map(|m| m.name).collect();
    assert_eq!(names, all, "recorded as applied");
}

/// `homing bench --enqueue-only` leaves its jobs queued in the given store, with no worker to
/// take them (scripts/bench-million drains them afterwards), and refuses the embedded default,
/// whose throwaway database would be deleted with the jobs in it.
#[test]
fn bench_enqueue_only_leaves_a_backlog_and_refuses_a_throwaway_database() {
    let env = Env::sqlite();
    let (code, out, err) = env.run(&["bench", "--enqueue-only", "--jobs", "1200", "--json"]);
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    let queue = report["queue"].as_str().expect("queue name").to_string();
    assert_eq!(report["jobs"], 1200, "{report}");
    let (code, out, err) = env.run(&["queues", "--json"]);
    assert_eq!(code, 0, "{err}");
    let queues: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let q = queues["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .find(|q| q["queue"] == queue.as_str())
        .unwrap_or_else(|| panic!("{queue} not listed: {queues}"));
    assert_eq!(q["queued"], 1200, "every job waits, none ran: {q}");

    let mut cmd = env.command(&["bench", "--enqueue-only", "--jobs", "10"]);
    cmd.env_remove("HOMING_BROKER").env_remove("HOMING_STORE");
    let out = cmd.output().expect("run homing");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--enqueue-only needs --broker and --store"),
        "{err}"
    );
}

/// `homing bench` killed with -9 takes its worker processes with it: they would otherwise go
/// on polling a benchmark nobody reads (and, on its throwaway database, one already deleted).
#[test]
fn a_bench_killed_with_9_leaves_no_worker_behind() {
    let env = Env::sqlite();
    let (code, _, err) = env.run(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    let mut bench = env
        .command(&[
            "bench",
            "--jobs",
            "2000000",
            "--workers",
            "2",
            "--concurrency",
            "4",
            "--idle-samples",
            "0",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run homing bench");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let workers = loop {
        let c = children_of(bench.id());
        if c.len() >= 2 {
            break c;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the bench started {} worker processes in 60 s",
            c.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    bench.kill().expect("kill -9 the bench");
    bench.wait().expect("reap the bench");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while workers.iter().any(|&w| process_running(w)) {
        if std::time::Instant::now() > deadline {
            workers.iter().for_each(|&w| kill9_pid(w));
            panic!("the bench's workers {workers:?} outlived it by 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `homing jobs list` searches like `GET /v1/jobs`: by id prefix, creation time, a value at an
/// args path and an args substring, paged with --cursor (the next cursor printed); each bad
/// input is refused with a one-line reason naming its flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_list_searches_by_every_field_and_pages() {
    let env = Env::sqlite();
    let client = env.client().await;
    let q = "cli-search";
    let mut ids = Vec::new();
    for args in [
        serde_json::json!({"customer": {"id": 42, "name": "ann"}, "order": "o-1%"}),
        serde_json::json!({"customer": {"id": 7, "name": "bob"}, "order": "o-2"}),
        serde_json::json!({"customer": {"id": 42, "name": "cy"}, "items": [{"sku": "x-9"}]}),
    ] {
        let mut req = homing::EnqueueRequest::new("builtin.noop", args);
        req.options.queue = Some(q.into());
        ids.push(client.enqueue(req).await.unwrap().id.to_string());
    }
    let list = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["jobs", "list", "--queue", q, "--json"];
        args.extend_from_slice(extra);
        let (code, out, err) = env.run(&args);
        assert_eq!(code, 0, "{extra:?}: {err}");
        let page: serde_json::Value = serde_json::from_str(&out).expect("JSON page");
        page["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_str().unwrap().to_string())
            .collect()
    };
    // Pages are newest first by id; jobs made in the same millisecond order by their ids'
    // random bits, so the expected order is the ids' own.
    let want = |which: &[usize]| -> Vec<String> {
        let mut v: Vec<String> = which.iter().map(|&i| ids[i].clone()).collect();
        v.sort();
        v.reverse();
        v
    };
    assert_eq!(list(&[]), want(&[0, 1, 2]));
    assert_eq!(
        list(&["--args-path", "customer.id", "--args-value", "42"]),
        want(&[0, 2])
    );
    assert_eq!(
        list(&["--args-path", "items[0].sku", "--args-value", "x-9"]),
        want(&[2])
    );
    assert_eq!(list(&["--args-contains", "o-1%"]), want(&[0]));
    assert_eq!(list(&["--args-contains", "o-%"]), Vec::<String>::new());
    // The shortest prefix of one id that no other id shares (jobs of one millisecond share
    // their first 13 characters).
    let k = (13..=36)
        .find(|&k| ids.iter().filter(|i| i.starts_with(&ids[1][..k])).count() == 1)
        .unwrap();
    assert_eq!(list(&["--id", &ids[1][..k]]), want(&[1]));
    assert_eq!(list(&["--id", &ids[1]]), want(&[1]));
    assert_eq!(
        list(&["--created-to", "2000-01-01T00:00:00Z"]),
        Vec::<String>::new()
    );
    assert_eq!(
        list(&[
            "--created-from",
            "2000-01-01T00:00:00Z",
            "--created-to",
            "9999-01-01T00:00:00Z"
        ]),
        want(&[0, 1, 2])
    );

    // Paging: the table prints the next cursor; the next page goes on from it to the end.
    let all = want(&[0, 1, 2]);
    let (code, out, err) = env.run(&["jobs", "list", "--queue", q, "--limit", "2"]);
    assert_eq!(code, 0, "{err}");
    let cursor = out
        .lines()
        .find_map(|l| l.strip_prefix("next_cursor: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no next_cursor line: {out}"))
        .to_string();
    assert!(
        out.contains(&all[0]) && out.contains(&all[1]) && !out.contains(&all[2]),
        "{out}"
    );
    assert_eq!(
        list(&["--limit", "2", "--cursor", &cursor]),
        vec![all[2].clone()]
    );
    let (_, out, _) = env.run(&[
        "jobs", "list", "--queue", q, "--limit", "2", "--cursor", &cursor,
    ]);
    assert!(out.contains("next_cursor: none"), "{out}");

    for (bad, flag) in [
        (&["--id", "xyz"][..], "--id"),
        (&["--created-from", "yesterday"][..], "--created-from"),
        (
            &[
                "--created-from",
                "2026-12-02T00:00:00Z",
                "--created-to",
                "2026-12-01T00:00:00Z",
            ][..],
            "--created-from",
        ),
        (
            &["--args-path", "a..b", "--args-value", "1"][..],
            "--args-path",
        ),
        (&["--args-path", "customer.id"][..], "--args-value"),
        (&["--args-value", "1"][..], "--args-path"),
        (
            &["--args-path", "a", "--args-value", "{\"x\":1}"][..],
            "--args-value",
        ),
        (&["--cursor", "nope"][..], "--cursor"),
        (&["--state", "sleeping"][..], "sleeping"),
    ] {
        let mut args = vec!["jobs", "list"];
        args.extend_from_slice(bad);
        let (code, out, err) = env.run(&args);
        assert_ne!(code, 0, "{bad:?} accepted: {out}");
        let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        assert!(
            first.starts_with("error:") && first.contains(flag),
            "{bad:?}: want a reason naming {flag}, got: {err}"
        );
    }
}
