//! Python workers (the `homing` package in clients/python, installed in a virtualenv by
//! scripts/python-venv) against real `homing` processes, under the faults of the remote worker
//! protocol's crash table: a worker killed with SIGKILL mid-job, a worker paused past its TTL
//! (a zombie), and a `homing server` killed while workers hold jobs, on Redis + PostgreSQL with
//! two servers. The witness of how often a handler really ran is the counter service, called by
//! the task with the job's id as its idempotency key.

#[path = "../../homing/tests/support/redis_server.rs"]
mod redis_server;
mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use homing::{Job, JobId, JobState};
use redis_server::{unique_prefix, RedisServer};
use serde_json::json;
use support::*;

const QUEUE: &str = "py";

/// The package's virtualenv (created or refreshed by scripts/python-venv). Fails, naming the
/// Debian packages, when python3 or its venv module is missing.
fn python_venv() -> PathBuf {
    static VENV: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    VENV.get_or_init(|| {
        let venv = std::env::var_os("HOMING_PYTHON_VENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join("target/python-venv"));
        let out = Command::new(repo_root().join("scripts/python-venv"))
            .arg(&venv)
            .current_dir(repo_root())
            .output()
            .expect("run scripts/python-venv (needs bash)");
        assert!(
            out.status.success(),
            "scripts/python-venv failed (install the Debian packages python3 and python3-venv): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        venv
    })
    .clone()
}

/// `python -m homing worker proc_tasks` talking to `url`, its log in the env's directory.
fn py_worker(env: &Env, name: &str, url: &str, extra: &[&str]) -> Proc {
    let python = python_venv().join("bin/python");
    let log_path = env.path().join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path).expect("log file");
    let child = Command::new(python)
        .args(["-m", "homing", "worker", "proc_tasks"])
        // 500 ms (TTL 1.5 s): a loaded CI machine can starve a Python process for a few
        // hundred milliseconds, which must not look like a crash.
        .args(["--heartbeat-interval", "500ms", "--poll", "1s"])
        .args(extra)
        .env("HOMING_URL", url)
        .env_remove("HOMING_API_TOKEN")
        .current_dir(repo_root().join("clients/python/tests"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start a Python worker");
    Proc::adopt(child, log_path, name)
}

/// Sessions of these workers that the server presumed dead (a worker starved past its TTL
/// on a loaded machine): each lets its held jobs run again, like a kill.
fn presumed_dead(workers: &[&Proc]) -> usize {
    workers
        .iter()
        .map(|w| w.log_text().matches("presumed dead by the server").count())
        .sum()
}

fn signal(p: &Proc, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &p.pid().to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill {sig} {}", p.pid());
}

async fn wait_healthy(base: &str) {
    let http = http_client();
    eventually(
        Duration::from_secs(30),
        "homing server to answer",
        || async {
            http.get(format!("{base}/healthz"))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
        },
    )
    .await;
}

/// Enqueues `n` (≥ 1) jobs of `py.call` through the HTTP API, the first as soon as a Python
/// worker has declared the task (before that the server refuses it as unknown).
async fn enqueue_calls(base: &str, counter: &Counter, n: usize, hold: f64) -> Vec<JobId> {
    let http = http_client();
    let body = json!({"task": "py.call", "queue": QUEUE,
                      "args": {"url": counter.url(""), "hold": hold}});
    let mut ids = Vec::new();
    while ids.len() < n {
        let first = ids.is_empty();
        let id = eventually(
            Duration::from_secs(30),
            "py.call to be accepted",
            || async {
                let r = http
                    .post(format!("{base}/v1/jobs"))
                    .json(&body)
                    .send()
                    .await
                    .ok()?;
                if !r.status().is_success() {
                    assert!(first, "enqueue refused: {}", r.status());
                    return None;
                }
                let job: serde_json::Value = r.json().await.ok()?;
                job["id"].as_str()?.parse::<JobId>().ok()
            },
        )
        .await;
        ids.push(id);
    }
    ids
}

/// Every job succeeded once: its result is its own call, one start per delivery
/// (epoch = crashes + 1) and any extra call of the external service is explained by a crash.
fn assert_each_once(jobs: &[Job], counter: &Counter) -> usize {
    let mut extra = 0;
    for j in jobs {
        assert_eq!(j.state, JobState::Succeeded, "{j:?}");
        let result = j.result.as_ref().expect("a result");
        assert_eq!(result["key"], j.id.to_string(), "{j:?}");
        assert_eq!(
            result["epoch"],
            json!(j.epoch),
            "the result is the last run's: {j:?}"
        );
        assert_eq!(j.epoch, u64::from(j.crashes) + 1, "{j:?}");
        assert_eq!(j.attempts, 0, "crashes must not spend retries: {j:?}");
        let calls = counter.count(&j.id.to_string());
        assert!(
            calls >= 1 && calls <= 1 + j.crashes as usize,
            "job {} called {calls} times with {} crashes",
            j.id,
            j.crashes
        );
        extra += calls - 1;
    }
    extra
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_python_workers_mid_job_every_job_succeeds() {
    let env = Env::sqlite();
    let counter = Counter::start().await;
    let (_up, base) = start_up(&env, &[]).await;
    let mut first = py_worker(&env, "py-a", &base, &["--concurrency", "2"]);
    let second = py_worker(&env, "py-b", &base, &["--concurrency", "2"]);
    let ids = enqueue_calls(&base, &counter, 16, 0.4).await;
    eventually(
        Duration::from_secs(30),
        "the workers to be busy",
        || async { (counter.total() >= 4).then_some(()) },
    )
    .await;
    first.kill9();
    let third = py_worker(&env, "py-c", &base, &["--concurrency", "2"]);
    let client = env.client().await;
    let jobs = wait_all_terminal(&client, &ids, Duration::from_secs(90)).await;
    let extra = assert_each_once(&jobs, &counter);
    // Only the killed worker's jobs can have run twice, and it held at most 2 at once (plus
    // 2 for each session of another worker presumed dead meanwhile, counted from its log).
    let lost = presumed_dead(&[&second, &third]);
    assert!(
        extra <= 2 * (1 + lost),
        "{extra} repeated calls after killing a worker of concurrency 2 ({lost} other sessions presumed dead)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn python_worker_paused_past_its_ttl_is_fenced_off() {
    let env = Env::sqlite();
    let counter = Counter::start().await;
    let (up, base) = start_up(&env, &[]).await;
    let zombie = py_worker(&env, "zombie", &base, &["--concurrency", "1"]);
    // Two jobs of 2 s: the zombie (concurrency 1) holds one mid-call when it is paused.
    let ids = enqueue_calls(&base, &counter, 2, 2.0).await;
    let client = env.client().await;
    eventually(
        Duration::from_secs(30),
        "the zombie to be mid-job",
        || async { (counter.total() >= 1).then_some(()) },
    )
    .await;
    signal(&zombie, "-STOP");
    let fresh = py_worker(&env, "fresh", &base, &["--concurrency", "1"]);
    // Past the TTL (3 × 200 ms) the job is reclaimed and run again by the fresh worker.
    eventually(
        Duration::from_secs(60),
        "the paused worker's job to be rerun",
        || async {
            let mut rerun = false;
            for id in &ids {
                let j = client.get(*id).await.ok()?;
                rerun |= j.crashes > 0 && j.state == JobState::Succeeded;
            }
            rerun.then_some(())
        },
    )
    .await;
    signal(&zombie, "-CONT");
    let jobs = wait_all_terminal(&client, &ids, Duration::from_secs(60)).await;
    assert_each_once(&jobs, &counter);
    let rerun: Vec<&Job> = jobs.iter().filter(|j| j.crashes > 0).collect();
    assert!(
        !rerun.is_empty(),
        "the paused worker's job was never reclaimed"
    );
    for j in &rerun {
        assert_eq!(
            j.result.as_ref().unwrap()["pid"],
            json!(fresh.pid()),
            "the final result comes from the new run: {j:?}"
        );
    }
    // Resumed, the zombie learns it was presumed dead: its result is not committed (dropped by
    // the worker or refused as stale by the server), and it joins again as a new session.
    let log = eventually(Duration::from_secs(30), "the zombie to rejoin", || async {
        let log = zombie.log_text();
        (log.matches("registered at").count() >= 2).then_some(log)
    })
    .await;
    assert!(
        log.contains("presumed dead") || log.contains("refused as stale"),
        "the zombie never noticed it was fenced off:\n{log}"
    );
    // Refused by the server: counted there (logged as a zombie write); dropped by the worker:
    // counted in its log.
    let log = eventually(
        Duration::from_secs(30),
        "the zombie's result to be refused or dropped",
        || async {
            let log = zombie.log_text();
            (log.contains("refused as stale")
                || log.contains("not sent: its session was presumed dead"))
            .then_some(log)
        },
    )
    .await;
    if log.contains("refused as stale") {
        // Refused, so counted by the server (its log line may land a moment after the answer).
        up.wait_log("job.zombie_write_rejected").await;
    }
    // And it works again.
    let more = enqueue_calls(&base, &counter, 4, 0.0).await;
    let done = wait_all_terminal(&client, &more, Duration::from_secs(60)).await;
    assert_each_once(&done, &counter);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn homing_server_killed_while_python_workers_hold_jobs_redis_postgres() {
    let redis = RedisServer::unix();
    let mut env = Env::sqlite_broker_postgres_store().await;
    env.broker = redis.url(&unique_prefix("pyremote"));
    let counter = Counter::start().await;
    let listen = |port: u16| format!("127.0.0.1:{port}");
    let (p1, p2) = (free_port(), free_port());
    let server_args = |addr: &str| -> Vec<String> {
        ["server", "--listen", addr, "--rescue-interval", "200ms"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let spawn_server = |name: &str, addr: &str| {
        let args = server_args(addr);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        env.spawn(name, &refs)
    };
    let mut s1 = spawn_server("server1", &listen(p1));
    let _s2 = spawn_server("server2", &listen(p2));
    let (b1, b2) = (
        format!("http://{}", listen(p1)),
        format!("http://{}", listen(p2)),
    );
    wait_healthy(&b1).await;
    wait_healthy(&b2).await;
    let w1 = py_worker(&env, "py-1", &b1, &["--concurrency", "2"]);
    let w2 = py_worker(&env, "py-2", &b2, &["--concurrency", "2"]);
    let ids = enqueue_calls(&b2, &counter, 16, 0.4).await;
    eventually(
        Duration::from_secs(30),
        "the workers to be busy",
        || async { (counter.total() >= 4).then_some(()) },
    )
    .await;
    s1.kill9();
    // The worker on the dead server cannot heartbeat: after its TTL its jobs are reclaimed and
    // run by the other worker. Then the server comes back and the first worker rejoins.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _s1b = spawn_server("server1-again", &listen(p1));
    let client = env.client().await;
    let jobs = wait_all_terminal(&client, &ids, Duration::from_secs(90)).await;
    let extra = assert_each_once(&jobs, &counter);
    let lost = presumed_dead(&[&w2]);
    assert!(
        extra <= 2 * (1 + lost),
        "{extra} repeated calls; the cut-off worker held at most 2 jobs ({lost} other sessions presumed dead)"
    );
    let log = eventually(
        Duration::from_secs(30),
        "the cut-off worker to rejoin",
        || async {
            let log = w1.log_text();
            (log.matches("registered at").count() >= 2).then_some(log)
        },
    )
    .await;
    assert!(
        log.contains("unreachable") || log.contains("failed"),
        "{log}"
    );
}
