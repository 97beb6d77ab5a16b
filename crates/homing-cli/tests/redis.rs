//! The `homing` binary with `--broker redis://…` (the store stays SQLite): the CLI opens the
//! Redis broker, and the crash guarantees hold with real worker processes killed with SIGKILL.
//! The test binary starts its own `redis-server` on a loopback port.

#[path = "../../homing/tests/support/redis_server.rs"]
mod redis_server;
mod support;

use std::time::Duration;
use support::*;

use homing::{EnqueueRequest, JobState};
use redis_server::{unique_prefix, RedisServer};

/// An environment whose broker is the Redis server and whose store is an SQLite file.
fn redis_env(server: &RedisServer, what: &str) -> Env {
    let mut env = Env::sqlite();
    env.broker = server.url(&unique_prefix(what));
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn enqueue_and_run_through_the_cli() {
    let server = RedisServer::tcp("cli-pw");
    let env = redis_env(&server, "cli");
    let _worker = env.worker("w", "default", &["--concurrency", "2"]);
    wait_workers(&env.client().await, "default", 1, Duration::from_secs(20)).await;
    let (code, out, err) = env.run(&[
        "enqueue",
        "builtin.noop",
        "--args",
        r#"{"hello":"redis"}"#,
        "--wait",
    ]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let job: serde_json::Value = serde_json::from_str(&out).expect("the final record as JSON");
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["result"], serde_json::json!({"hello": "redis"}));
    assert!(
        !err.contains("cli-pw") && !out.contains("cli-pw"),
        "the Redis password must never be printed"
    );
}

/// The core issue's crash scenario on the Redis broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_job_on_redis_loses_nothing_and_completes_nothing_twice() {
    let server = RedisServer::unix();
    kill_9_scenario(redis_env(&server, "crash"), Scenario::default()).await;
}

/// The distributed deployment: Redis broker + PostgreSQL store, 3 workers and 2 servers, every
/// process running a rescuer; each reclaim happens exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_with_redis_postgres_three_workers_two_servers() {
    let server = RedisServer::unix();
    let mut env = Env::sqlite_broker_postgres_store().await;
    env.broker = server.url(&unique_prefix("dist"));
    kill_9_scenario(
        env,
        Scenario {
            workers: 3,
            servers: 2,
            jobs: 200,
            kills: 3,
        },
    )
    .await;
}

/// Issue 3, test 3a: FLUSHALL in the middle of 1,000 jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flushall_mid_run_loses_nothing() {
    let server = RedisServer::unix();
    let env = redis_env(&server, "flush");
    let counter = Counter::start().await;
    let _w: Vec<Proc> = (0..2)
        .map(|i| env.worker(&format!("w{i}"), "flush", &["--concurrency", "8"]))
        .collect();
    wait_workers(&env.client().await, "flush", 2, Duration::from_secs(20)).await;
    let ids = load(&env, &counter, "flush", 1000).await;
    wait_progress(&env, &ids, 200).await;
    server.cli(&["FLUSHALL"]);
    assert_all_once(&env, &counter, &ids, Duration::from_secs(120)).await;
}

/// Issue 3, test 3b: Redis restarted without persistence in the middle of 1,000 jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restart_without_persistence_loses_nothing() {
    let mut server = RedisServer::unix();
    let env = redis_env(&server, "restart");
    let counter = Counter::start().await;
    let _w: Vec<Proc> = (0..2)
        .map(|i| env.worker(&format!("w{i}"), "restart", &["--concurrency", "8"]))
        .collect();
    wait_workers(&env.client().await, "restart", 2, Duration::from_secs(20)).await;
    let ids = load(&env, &counter, "restart", 1000).await;
    wait_progress(&env, &ids, 200).await;
    server.restart();
    assert_all_once(&env, &counter, &ids, Duration::from_secs(120)).await;
}

/// Issue 3, test 4: Redis down for 10 s mid-run (and enqueues made during the outage are kept),
/// then back: work resumes by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_down_for_ten_seconds_then_work_resumes() {
    let mut server = RedisServer::unix();
    let env = redis_env(&server, "down");
    let counter = Counter::start().await;
    let workers: Vec<Proc> = (0..2)
        .map(|i| env.worker(&format!("w{i}"), "down", &["--concurrency", "8"]))
        .collect();
    wait_workers(&env.client().await, "down", 2, Duration::from_secs(20)).await;
    let mut ids = load(&env, &counter, "down", 400).await;
    wait_progress(&env, &ids, 100).await;
    server.stop();
    // Accepted while the broker is away: the store has them, the reconciler publishes them later.
    ids.extend(load(&env, &counter, "down", 50).await);
    tokio::time::sleep(Duration::from_secs(10)).await;
    server.restart();
    assert_all_once(&env, &counter, &ids, Duration::from_secs(120)).await;
    for w in &workers {
        let log = w.log_text();
        assert!(
            log.contains("unavailable") || log.contains("presumed dead"),
            "the outage is logged"
        );
    }
}

/// Issue 3, test 5: garbage pushed into a queue stream is dead-lettered with the reason; the
/// worker keeps going.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn garbage_in_the_stream_is_dead_lettered_and_work_continues() {
    let server = RedisServer::unix();
    let env = redis_env(&server, "garbage");
    let counter = Counter::start().await;
    let mut w = env.worker("w", "garbage", &["--concurrency", "4"]);
    wait_workers(&env.client().await, "garbage", 1, Duration::from_secs(20)).await;
    let first = load(&env, &counter, "garbage", 1).await;
    assert_all_once(&env, &counter, &first, Duration::from_secs(20)).await;
    let prefix = env.broker.rsplit('=').next().unwrap().to_string();
    let stream = format!("{prefix}:{{q:garbage}}:stream");
    server.cli(&["XADD", &stream, "*", "job", "not-a-uuid"]);
    server.cli(&["XADD", &stream, "*", "nonsense", "1"]);
    server.cli(&[
        "XADD",
        &stream,
        "*",
        "job",
        &homing::job::new_job_id().to_string(),
    ]);
    let ids = load(&env, &counter, "garbage", 20).await;
    assert_all_once(&env, &counter, &ids, Duration::from_secs(30)).await;
    let b = env.backends().await;
    let dead = eventually(Duration::from_secs(10), "three dead letters", || async {
        let d = b.broker.dead_letters(100).await.ok()?;
        (d.len() >= 3).then_some(d)
    })
    .await;
    assert_eq!(dead.len(), 3, "{dead:?}");
    assert!(dead.iter().all(|d| !d.reason.is_empty()));
    assert!(!w.exited(), "the worker keeps running");
}

/// Issue 4, test 4: two servers running the scheduler at once never dispatch a due job twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_schedulers_dispatch_each_due_job_once() {
    let server = RedisServer::unix();
    let mut env = Env::sqlite_broker_postgres_store().await;
    env.broker = server.url(&unique_prefix("sched"));
    let client = env.client().await;
    let http = http_client();
    let mut servers = Vec::new();
    for i in 0..2 {
        let listen = format!("127.0.0.1:{}", free_port());
        servers.push(env.spawn(&format!("server{i}"), &["server", "--listen", &listen]));
        eventually(Duration::from_secs(20), "the server to answer", || async {
            http.get(format!("http://{listen}/healthz"))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
        })
        .await;
    }
    let reqs: Vec<EnqueueRequest> = (0..300)
        .map(|i| {
            let mut r = EnqueueRequest::new("builtin.noop", serde_json::json!({ "i": i }));
            r.options.queue = Some("sched".into());
            r.options.countdown = Some(Duration::from_millis(1000 + (i % 10) * 100));
            r
        })
        .collect();
    let ids: Vec<_> = client
        .enqueue_many(reqs)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    eventually(
        Duration::from_secs(30),
        "every job to be claimed as due",
        || async {
            let page = client
                .list(
                    &homing::store::JobFilter {
                        queue: Some("sched".into()),
                        state: Some(JobState::Queued),
                        ..Default::default()
                    },
                    None,
                    1000,
                )
                .await
                .ok()?;
            (page.jobs.len() == 300).then_some(())
        },
    )
    .await;
    // Give both servers' schedulers and reconcilers several more passes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let prefix = env.broker.rsplit('=').next().unwrap().to_string();
    let stream = format!("{prefix}:{{q:sched}}:stream");
    assert_eq!(
        server.cli(&["XLEN", &stream]),
        "300",
        "each due job is published exactly once"
    );
    let _w = env.worker("w", "sched", &["--concurrency", "8"]);
    let jobs = wait_all_terminal(&client, &ids, Duration::from_secs(60)).await;
    assert!(jobs
        .iter()
        .all(|j| j.state == JobState::Succeeded && j.epoch == 1));
}

/// Bulk enqueue on the Redis broker (docs/batch.md): a file of jobs committed in chunks is
/// published after each commit, and a worker runs every one of them once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn enqueue_from_file_is_published_to_redis() {
    let server = RedisServer::tcp("batch-pw");
    let env = redis_env(&server, "batch");
    let _worker = env.worker("w", "default", &["--concurrency", "16"]);
    let client = env.client().await;
    wait_workers(&client, "default", 1, Duration::from_secs(20)).await;
    let path = env.path().join("jobs.jsonl");
    let lines: Vec<String> = (0..10_500)
        .map(|n| format!(r#"{{"task": "builtin.noop", "args": {{"n": {n}}}}}"#))
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let (code, out, err) = env.run(&["enqueue", "--from-file", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let ids: Vec<homing::JobId> = out.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(ids.len(), 10_500);
    let jobs = wait_all_terminal(&client, &ids, Duration::from_secs(300)).await;
    let odd: Vec<_> = jobs
        .iter()
        .filter(|j| j.state != JobState::Succeeded || j.crashes != 0)
        .map(|j| (j.id, j.state, j.attempts, j.crashes))
        .take(5)
        .collect();
    assert!(odd.is_empty(), "{odd:?}");
}
