//! Celery interoperability against real Celery (the versions pinned in `scripts/celery-venv`):
//! a Python producer's `apply_async` runs on `homing worker --celery-queue`, results come back
//! through `AsyncResult.get()`, a `kill -9` loses nothing, homing's messages run on a stock
//! Python Celery worker, and malformed envelopes are dead-lettered. Each test starts its own
//! `redis-server`; a missing python3, venv or redis-server fails the test with the package name.

#[path = "../../homing/tests/support/redis_server.rs"]
mod redis_server;
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

use homing::celery::{wire, CeleryClient, CelerySend};
use homing::store::JobFilter;
use homing::JobState;
use redis_server::{unique_prefix, RedisServer};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/celery")
}

/// The virtualenv's python, created once by `scripts/celery-venv` (pinned Celery and kombu).
fn python() -> PathBuf {
    let venv = std::env::var("HOMING_CELERY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("target/celery-venv"));
    let out = Command::new(repo_root().join("scripts/celery-venv"))
        .arg(&venv)
        .output()
        .expect("run scripts/celery-venv");
    assert!(
        out.status.success(),
        "scripts/celery-venv failed (install the Debian packages python3 and python3-venv): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    venv.join("bin/python")
}

/// The unix socket of a server started with [`RedisServer::unix`].
fn socket(server: &RedisServer) -> String {
    let url = server.url("x");
    url.trim_start_matches("redis+unix://")
        .split('?')
        .next()
        .unwrap()
        .to_string()
}

struct Setup {
    server: RedisServer,
    env: Env,
    /// Celery's broker and result backend URL, as Python spells it.
    py_url: String,
    /// The same server as homing's `--celery-broker` / `--celery-result-backend`.
    url: String,
}

fn setup(what: &str) -> Setup {
    let server = RedisServer::unix();
    let mut env = Env::sqlite();
    env.broker = server.url(&unique_prefix(what));
    let sock = socket(&server);
    Setup {
        py_url: format!("redis+socket://{sock}"),
        url: format!("redis+unix://{sock}"),
        server,
        env,
    }
}

impl Setup {
    fn worker(&self, name: &str, queue: &str, extra: &[&str]) -> Proc {
        let mut args = vec![
            "worker",
            "--celery-queue",
            queue,
            "--celery-broker",
            &self.url,
            "--celery-result-backend",
            &self.url,
            "--heartbeat-interval",
            "200ms",
        ];
        args.extend_from_slice(extra);
        self.env.spawn(name, &args)
    }

    fn producer(&self, spec: serde_json::Value) -> Child {
        let mut spec = spec;
        spec["broker"] = self.py_url.clone().into();
        spec["backend"] = self.py_url.clone().into();
        let log = std::fs::File::create(self.env.path().join("producer.log")).unwrap();
        Command::new(python())
            .arg(scripts_dir().join("producer.py"))
            .arg(spec.to_string())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start the Python producer")
    }

    fn celery(&self) -> CeleryClient {
        CeleryClient::open(&self.url, Some(&self.url)).expect("celery client")
    }
}

/// Waits for the producer and returns its JSON report.
fn report(child: Child, env: &Env) -> serde_json::Value {
    let out = child.wait_with_output().expect("producer output");
    let log = std::fs::read_to_string(env.path().join("producer.log")).unwrap_or_default();
    assert!(out.status.success(), "producer failed: {log}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("producer printed no report ({e}): {log}"))
}

async fn wait_ingress(w: &Proc) {
    eventually(
        Duration::from_secs(30),
        "the Celery ingress to start",
        || async { w.log_text().contains("celery ingress ready").then_some(()) },
    )
    .await;
}

/// 1. A Python producer's 500 `apply_async` calls (plain, countdown, priority) run on a homing
/// worker and `AsyncResult.get()` returns each result; unknown task names fail with
/// `NotRegistered` as on a Celery worker, and stay in homing's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn python_apply_async_runs_on_homing_and_async_result_gets_each_result() {
    let s = setup("py2homing");
    let w = s.worker("w", "py2homing", &["--concurrency", "8"]);
    wait_ingress(&w).await;

    let r = report(
        s.producer(serde_json::json!({"queue": "py2homing", "n": 500, "kind": "noop"})),
        &s.env,
    );
    assert_eq!(r["sent"], 500);
    assert_eq!(
        r["ok"], 500,
        "every AsyncResult.get() returns its result: {r}"
    );

    let client = s.env.client().await;
    for id in r["ids"].as_array().unwrap() {
        let job = client
            .get(wire::job_id(id.as_str().unwrap()))
            .await
            .expect("the Celery task id is the homing job id");
        assert_eq!(job.state, JobState::Succeeded);
        assert_eq!(job.task, "builtin.noop");
        assert_eq!(job.epoch, 1, "ran once");
    }

    let r = report(
        s.producer(serde_json::json!({"queue": "py2homing", "n": 3, "kind": "unknown"})),
        &s.env,
    );
    assert_eq!(
        r["ok"], 3,
        "NotRegistered, as a Celery worker reports it: {r}"
    );
    for id in r["ids"].as_array().unwrap() {
        let job = client
            .get(wire::job_id(id.as_str().unwrap()))
            .await
            .unwrap();
        assert_eq!(job.state, JobState::Dead, "kept in homing's records");
        assert!(job.error.unwrap().contains("unknown task"));
    }
}

/// 2. `kill -9` of the homing worker mid-run: every task completes once (store and result
/// backend), the handler's external calls repeat only for the jobs the dead worker was running
/// (same idempotency key = Celery task id), and those run again within seconds of the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_run_loses_no_celery_task_and_completes_none_twice() {
    let s = setup("crash");
    let counter = Counter::start().await;
    let mut w1 = s.worker("w1", "crash", &["--concurrency", "8"]);
    wait_ingress(&w1).await;

    let n = 200;
    let producer = s.producer(serde_json::json!({
        "queue": "crash", "n": n, "kind": "http", "url": counter.url("delay_ms=300"), "timeout": 180,
    }));
    eventually(
        Duration::from_secs(60),
        "handlers to be running",
        || async { (counter.total() >= 40).then_some(()) },
    )
    .await;
    w1.kill9();
    let killed = Instant::now();
    let _w2 = s.worker("w2", "crash", &["--concurrency", "8"]);

    let r = report(producer, &s.env);
    assert_eq!(
        r["ok"], n,
        "every task completes and AsyncResult.get() sees it: {r}"
    );
    let client = s.env.client().await;
    let mut repeated = 0;
    for id in r["ids"].as_array().unwrap() {
        let id = id.as_str().unwrap();
        let job = client.get(wire::job_id(id)).await.unwrap();
        assert_eq!(job.state, JobState::Succeeded, "{job:?}");
        let calls = counter.calls(id);
        assert_eq!(
            calls.len() as u32,
            1 + job.crashes,
            "task {id}: one handler call per delivery lost with its worker, no more"
        );
        if job.crashes > 0 {
            repeated += 1;
            let again = calls[1].at.saturating_duration_since(killed);
            assert!(
                again < Duration::from_secs(10),
                "task {id} ran again {again:?} after the kill: liveness, not a visibility timeout"
            );
        }
    }
    assert!(
        repeated <= 8,
        "only the jobs running on the killed worker repeat"
    );
    eprintln!("kill -9: {repeated} in-flight tasks ran again, every one of {n} completed once");
}

/// 3. homing publishes 500 tasks (499 through the library's CeleryClient, one through `homing
/// enqueue --celery`); a stock Python Celery worker runs them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn homing_publishes_tasks_that_a_stock_python_celery_worker_runs() {
    let s = setup("homing2py");
    let celery = s.celery();
    let sends: Vec<CelerySend> = (0..499)
        .map(|i| {
            let args = if i % 2 == 0 {
                serde_json::json!([i, 1])
            } else {
                serde_json::json!({"name": format!("n{i}")})
            };
            let task = if i % 2 == 0 { "demo.add" } else { "demo.greet" };
            let mut send = CelerySend::new(task, "homing2py")
                .with_json_args(args)
                .unwrap();
            send.priority = (i % 10) as u8;
            send
        })
        .collect();
    let ids = celery.send_many(sends).await.expect("publish");
    let (code, out, err) = s.env.run(&[
        "enqueue",
        "--celery",
        "demo.add",
        "--queue",
        "homing2py",
        "--args",
        "[40, 2]",
        "--celery-broker",
        &s.url,
    ]);
    assert_eq!(code, 0, "{err}");
    let cli_id = out.trim().to_string();
    assert!(
        cli_id.parse::<uuid::Uuid>().is_ok(),
        "prints the Celery task id: {out}"
    );

    let log = std::fs::File::create(s.env.path().join("celery-worker.log")).unwrap();
    let mut py = Command::new(python())
        .args(["-m", "celery", "-A", "pytasks", "worker", "-Q", "homing2py"])
        .args([
            "--pool",
            "solo",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "warning",
        ])
        .current_dir(scripts_dir())
        .env("CELERY_BROKER", &s.py_url)
        .env("CELERY_BACKEND", &s.py_url)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start a Python Celery worker");

    let mut want: Vec<(String, serde_json::Value)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let v = if i % 2 == 0 {
                serde_json::json!(i + 1)
            } else {
                serde_json::json!(format!("hello, n{i}!"))
            };
            (id.clone(), v)
        })
        .collect();
    want.push((cli_id, serde_json::json!(42)));
    let outcome = eventually(
        Duration::from_secs(180),
        "the Python worker to run all 500",
        || {
            let celery = celery.clone();
            let want = want.clone();
            async move {
                for (id, v) in &want {
                    let r = celery.result(id).await.ok()??;
                    if r["status"] != "SUCCESS" || &r["result"] != v {
                        return None;
                    }
                }
                Some(want.len())
            }
        },
    )
    .await;
    let _ = py.kill();
    let _ = py.wait();
    assert_eq!(outcome, 500);
}

/// 4. Envelopes with a bad base64 body, a body that is not JSON, or a pickle content type are
/// recorded as dead jobs with the reason; the worker carries on with the next message. A lost
/// ingress's claimed messages come back by liveness.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_envelopes_are_dead_lettered_and_the_worker_continues() {
    let s = setup("garbage");
    let w = s.worker("w", "garbage", &[]);
    wait_ingress(&w).await;

    let good = |task: &str| wire::Outgoing {
        id: wire::new_task_id(),
        task: task.into(),
        queue: "garbage".into(),
        args: vec![],
        kwargs: serde_json::Map::new(),
        eta: None,
        expires: None,
        priority: 0,
    };
    let mut bad_b64: serde_json::Value =
        serde_json::from_str(&wire::encode(&good("builtin.noop"), "t")).unwrap();
    bad_b64["body"] = "!!!not*base64".into();
    let mut bad_json =
        serde_json::from_str::<serde_json::Value>(&wire::encode(&good("builtin.noop"), "t"))
            .unwrap();
    bad_json["body"] = "W1tdLCB7fSwg".into(); // base64 of `[[], {}, ` : truncated JSON
    let mut pickle =
        serde_json::from_str::<serde_json::Value>(&wire::encode(&good("builtin.noop"), "t"))
            .unwrap();
    pickle["content-type"] = "application/x-python-serialize".into();
    for m in [&bad_b64, &bad_json, &pickle] {
        s.server.cli(&["LPUSH", "garbage", &m.to_string()]);
    }
    s.server.cli(&["LPUSH", "garbage", "not even json"]);

    let id = s
        .celery()
        .send(
            CelerySend::new("builtin.noop", "garbage")
                .with_json_args(serde_json::json!({"after": "garbage"}))
                .unwrap(),
        )
        .await
        .unwrap();
    let client = s.env.client().await;
    let job = wait_state(
        &client,
        wire::job_id(&id),
        JobState::Succeeded,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(job.result, Some(serde_json::json!({"after": "garbage"})));

    let filter = JobFilter {
        task: Some("celery.malformed".into()),
        ..JobFilter::default()
    };
    let dead = eventually(Duration::from_secs(10), "four dead records", || async {
        let page = client.list(&filter, None, 50).await.ok()?;
        (page.jobs.len() == 4).then_some(page.jobs)
    })
    .await;
    let reasons: Vec<String> = dead.iter().map(|j| j.error.clone().unwrap()).collect();
    for want in [
        "base64",
        "body is not JSON",
        "pickle",
        "envelope is not JSON",
    ] {
        assert!(
            reasons.iter().any(|r| r.contains(want)),
            "a dead record says '{want}': {reasons:?}"
        );
    }
    assert!(dead.iter().all(|j| j.state == JobState::Dead));
    assert!(
        dead.iter().all(|j| j.args["payload"].is_string()),
        "the payload is kept"
    );

    // A lost ingress (no heartbeat) holding a claimed message: the live ingress puts it back
    // within a sweep, and it runs.
    let lost = good("builtin.noop");
    s.server.cli(&[
        "HSET",
        "homing:celery:claimed:ghost-1",
        "1:1",
        &format!("garbage\n{}", wire::encode(&lost, "t")),
    ]);
    s.server
        .cli(&["SADD", "homing:celery:consumers", "ghost-1"]);
    let t0 = Instant::now();
    wait_state(
        &client,
        wire::job_id(&lost.id),
        JobState::Succeeded,
        Duration::from_secs(10),
    )
    .await;
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "restored by liveness in {:?}",
        t0.elapsed()
    );
    assert_eq!(
        s.server.cli(&["EXISTS", "homing:celery:claimed:ghost-1"]),
        "0"
    );
}
