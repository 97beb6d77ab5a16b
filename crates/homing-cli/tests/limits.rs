//! Pause/resume, unique jobs and priorities (docs/limits.md) through the `homing` binary: real
//! worker processes on the embedded backend and on Redis + PostgreSQL, steered by the CLI and
//! the HTTP API.

#[path = "../../homing/tests/support/redis_server.rs"]
mod redis_server;
mod support;

use std::time::Duration;

use homing::{EnqueueRequest, JobId, JobState};
use redis_server::{unique_prefix, RedisServer};
use support::*;

const LIMIT: Duration = Duration::from_secs(60);

async fn redis_postgres(server: &RedisServer, what: &str) -> Env {
    let mut env = Env::sqlite_broker_postgres_store().await;
    env.broker = server.url(&unique_prefix(what));
    env
}

fn noop(queue: &str, n: u32) -> EnqueueRequest {
    let mut r = EnqueueRequest::new("builtin.noop", serde_json::json!({ "n": n }));
    r.options.queue = Some(queue.into());
    r
}

/// A paused queue accepts jobs and starts none; the job running when it was paused finishes;
/// resume runs the held ones.
async fn pause_and_resume(env: Env) {
    let client = env.client().await;
    let counter = Counter::start().await;
    let _w = env.worker("w", "pq", &["--concurrency", "2"]);
    wait_workers(&client, "pq", 1, Duration::from_secs(20)).await;
    // A slow job, running when the pause comes.
    let mut slow = http_job(&counter.url("delay_ms=1500"));
    slow.options.queue = Some("pq".into());
    let slow = client.enqueue(slow).await.unwrap();
    wait_state(&client, slow.id, JobState::Running, LIMIT).await;
    let (code, out, err) = env.run(&["queues", "pause", "pq"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("paused pq"), "{out}");
    let mut held = Vec::new();
    for n in 0..3 {
        held.push(client.enqueue(noop("pq", n)).await.unwrap().id);
    }
    wait_state(&client, slow.id, JobState::Succeeded, LIMIT).await;
    // Deliveries have had every chance to start them: they are parked, not run.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for id in &held {
        let j = client.get(*id).await.unwrap();
        assert_eq!(
            (j.state, j.started_at, j.attempts),
            (JobState::Queued, None, 0),
            "{j:?}"
        );
    }
    let (code, out, _) = env.run(&["queues", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let pq = v["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "pq")
        .cloned()
        .unwrap_or_default();
    assert_eq!(pq["paused"], true, "{out}");
    let (code, out, err) = env.run(&["queues", "resume", "pq"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let mut done = 0;
        for id in &held {
            if client.get(*id).await.unwrap().state == JobState::Succeeded {
                done += 1;
            }
        }
        if done == held.len() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "held jobs did not run after resume; worker log:\n{}",
            _w.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_and_resume_embedded() {
    pause_and_resume(Env::sqlite()).await;
}

// On Redis a message is delivered at once, so a worker can park a job before its producer marks
// it dispatched; the resume must publish that job again (it failed here about one run in four
// before resume republished every queued job of the queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_and_resume_on_redis_and_postgres() {
    let server = redis_server::shared();
    pause_and_resume(redis_postgres(server, "pause").await).await;
}

fn enqueue_unique(env: &Env, args: &str, window: &str) -> JobId {
    let (code, out, err) = env.run(&[
        "enqueue",
        "builtin.noop",
        "--queue",
        "uq",
        "--args",
        args,
        "--unique-for",
        window,
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("a job id: {out}"))
}

/// `--unique-for`: the same job while it waits and within the window after it finished; a new
/// one after the window, or with other args.
async fn unique_windows(env: Env) {
    let client = env.client().await;
    let first = enqueue_unique(&env, r#"{"a":1}"#, "3s");
    assert_eq!(
        enqueue_unique(&env, r#"{"a":1}"#, "3s"),
        first,
        "while queued"
    );
    // The note names what matched (it used to blame an idempotency key nobody gave).
    let (code, _, err) = env.run(&[
        "enqueue",
        "builtin.noop",
        "--queue",
        "uq",
        "--args",
        r#"{"a":1}"#,
        "--unique-for",
        "3s",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!("note: --unique-for (same task, queue and args within its window) matched existing job {first}")),
        "{err}"
    );
    let other = enqueue_unique(&env, r#"{"a":2}"#, "3s");
    assert_ne!(other, first);
    let _w = env.worker("w", "uq", &[]);
    let done = wait_all_terminal(&client, &[first, other], LIMIT).await;
    assert!(done.iter().all(|j| j.state == JobState::Succeeded));
    let finished = done[0].finished_at.unwrap();
    let again = enqueue_unique(&env, r#"{"a":1}"#, "3s");
    let elapsed = homing::time::now() - finished;
    if elapsed < 3_000_000 {
        assert_eq!(again, first, "within the window after its finish");
    }
    // Past the window: a new job.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let late = enqueue_unique(&env, r#"{"a":1}"#, "3s");
    assert_ne!(late, first);
    assert_eq!(
        wait_all_terminal(&client, &[late], LIMIT).await[0].state,
        JobState::Succeeded
    );
    // A window under a second is refused at the door.
    let (code, _, err) = env.run(&[
        "enqueue",
        "builtin.noop",
        "--queue",
        "uq",
        "--unique-for",
        "10ms",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("unique"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unique_windows_embedded() {
    unique_windows(Env::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unique_windows_on_redis_and_postgres() {
    let server = redis_server::shared();
    unique_windows(redis_postgres(server, "unique").await).await;
}

/// The HTTP API: pause/resume routes, `priority` and `unique_for` on enqueue, and their
/// validation (400 with the reason).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_pause_resume_and_options() {
    let env = Env::sqlite();
    let (_up, base) = start_up(&env, &[]).await;
    let http = http_client();
    // `homing up` runs a worker on `default`.
    let r = http
        .post(format!("{base}/v1/queues/default/pause"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v, serde_json::json!({"queue": "default", "paused": true}));
    let body = serde_json::json!({"task": "builtin.noop", "queue": "default", "priority": 5,
                                  "unique_for": "1m", "args": {"x": 1}});
    let a: serde_json::Value = http
        .post(format!("{base}/v1/jobs"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let b: serde_json::Value = http
        .post(format!("{base}/v1/jobs"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(a["id"], b["id"], "{a} {b}");
    let queues: serde_json::Value = http
        .get(format!("{base}/v1/queues"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let hq = queues["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "default")
        .cloned()
        .unwrap();
    assert_eq!(hq["paused"], true);
    let id = a["id"].as_str().unwrap().to_string();
    let client = env.client().await;
    let job_id: JobId = id.parse().unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let j = client.get(job_id).await.unwrap();
    assert_eq!((j.state, j.priority), (JobState::Queued, 5));
    let r = http
        .post(format!("{base}/v1/queues/default/resume"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    wait_state(&client, job_id, JobState::Succeeded, LIMIT).await;
    for (body, word) in [
        (
            serde_json::json!({"task": "builtin.noop", "priority": 5000}),
            "priority",
        ),
        (
            serde_json::json!({"task": "builtin.noop", "unique_for": "0s"}),
            "unique_for",
        ),
    ] {
        let r = http
            .post(format!("{base}/v1/jobs"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let e: serde_json::Value = r.json().await.unwrap();
        assert!(
            e["error"]["message"].as_str().unwrap_or("").contains(word),
            "{e}"
        );
    }
    let r = http
        .post(format!("{base}/v1/queues/bad%20name/pause"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = http
        .post(format!("{base}/v1/queues/homing.webhooks/pause"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

/// One worker running one job at a time starts a queue's backlog (enqueued through the CLI
/// before any worker runs) in strict priority order, equal priorities in enqueue order.
async fn strict_priority_order(env: &Env, priorities: &[i32]) {
    let client = env.client().await;
    let mut ids = Vec::new();
    for (n, p) in priorities.iter().enumerate() {
        let (code, out, err) = env.run(&[
            "enqueue",
            "builtin.noop",
            "--queue",
            "prio",
            "--args",
            &format!(r#"{{"n":{n}}}"#),
            "--priority",
            &p.to_string(),
        ]);
        assert_eq!(code, 0, "{out}\n{err}");
        ids.push(out.trim().parse::<JobId>().unwrap());
    }
    let _w = env.worker("w", "prio", &["--concurrency", "1"]);
    let done = wait_all_terminal(&client, &ids, LIMIT).await;
    let mut by_start: Vec<(i64, usize)> = done
        .iter()
        .enumerate()
        .map(|(n, j)| (j.started_at.expect("started"), n))
        .collect();
    by_start.sort();
    let order: Vec<usize> = by_start.iter().map(|(_, n)| *n).collect();
    let mut want: Vec<usize> = (0..priorities.len()).collect();
    want.sort_by_key(|n| (std::cmp::Reverse(priorities[*n]), *n));
    assert_eq!(order, want, "priorities {priorities:?}");
    for (j, p) in done.iter().zip(priorities) {
        assert_eq!(j.priority, *p);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn strict_priority_order_on_one_worker() {
    let env = Env::sqlite();
    strict_priority_order(&env, &[0, 5, -2, 5, 10, 0, -2, 7]).await;
    // Out of range: refused by the CLI with exit code 2.
    let (code, _, err) = env.run(&["enqueue", "builtin.noop", "--priority", "1001"]);
    assert_eq!(code, 2, "{err}");
}

/// A stand-in for a service that must not be called too often at once (the seeds' inference
/// server): it records, per path, how many calls are in flight and the most there ever were.
#[derive(Clone, Default)]
struct InFlight(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, (u32, u32)>>>);

impl InFlight {
    async fn start() -> (InFlight, String) {
        use axum::extract::{Query, State};
        use axum::http::Uri;
        let me = InFlight::default();
        async fn handle(
            State(me): State<InFlight>,
            uri: Uri,
            Query(q): Query<std::collections::HashMap<String, String>>,
        ) -> String {
            let path = uri.path().to_string();
            {
                let mut m = me.0.lock().unwrap();
                let e = m.entry(path.clone()).or_default();
                e.0 += 1;
                e.1 = e.1.max(e.0);
            }
            // Decremented however the call ends, a dropped connection included.
            struct Done(InFlight, String);
            impl Drop for Done {
                fn drop(&mut self) {
                    if let Some(e) = self.0 .0.lock().unwrap().get_mut(&self.1) {
                        e.0 -= 1;
                    }
                }
            }
            let _done = Done(me.clone(), path);
            let ms = q.get("delay_ms").and_then(|v| v.parse().ok()).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            "{}".into()
        }
        let app = axum::Router::new().fallback(handle).with_state(me.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (me, base)
    }

    /// The most calls to `path` that were ever in flight at once.
    fn max(&self, path: &str) -> u32 {
        self.0.lock().unwrap().get(path).map_or(0, |e| e.1)
    }
}

fn call(queue: &str, url: String) -> EnqueueRequest {
    let mut r = http_job(&url);
    r.options.queue = Some(queue.into());
    r
}

fn limit(env: &Env, args: &[&str]) -> String {
    let mut all = vec!["queues", "limit"];
    all.extend_from_slice(args);
    let (code, out, err) = env.run(&all);
    assert_eq!(code, 0, "{out}\n{err}");
    out
}

/// Issue 13's proof of cluster-wide limits, on one deployment of three workers of concurrency
/// 4: a queue limited to 2 running never has more than 2 calls in flight, even when the worker
/// holding a slot is killed mid-run (the rescue frees the slot and the queue drains); a per-key
/// limit of 1 runs one call per key at a time while keys run beside each other; a rate of 5/1s
/// spreads starts over the windows.
async fn limits_hold(env: Env) {
    let client = env.client().await;
    let (flight, base) = InFlight::start().await;
    assert!(limit(&env, &["lq", "--concurrency", "2"]).contains("concurrency 2"));
    assert!(limit(&env, &["kq", "--concurrency", "1", "--key-arg", "url"]).contains("per url"));
    assert!(limit(&env, &["rq", "--rate", "5/1s"]).contains("rate 5/1s"));
    let (code, out, _) = env.run(&["queues", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let shown = |q: &str| {
        v["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["queue"] == q)
            .map(|x| x["limits"].clone())
            .unwrap_or_default()
    };
    assert_eq!(shown("lq"), serde_json::json!({"concurrency": 2}), "{out}");
    assert_eq!(shown("rq"), serde_json::json!({"rate": "5/1s"}), "{out}");
    // Bad limits: a one-line reason and a non-zero exit, nothing changed.
    for bad in [
        vec!["queues", "limit", "lq", "--rate", "5"],
        vec!["queues", "limit", "lq", "--concurrency", "0"],
        vec!["queues", "limit", "lq"],
    ] {
        let (code, _, err) = env.run(&bad);
        assert_ne!(code, 0, "{bad:?}");
        assert!(!err.trim().is_empty(), "{bad:?}");
    }

    let extra = ["--concurrency", "4", "--queue", "kq", "--queue", "rq"];
    let mut workers: Vec<Proc> = (0..3)
        .map(|i| env.worker(&format!("w{i}"), "lq", &extra))
        .collect();
    wait_workers(&client, "lq", 3, Duration::from_secs(30)).await;

    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(
            client
                .enqueue(call("lq", format!("{base}/lq?delay_ms=400")))
                .await
                .unwrap()
                .id,
        );
    }
    for n in 0..8 {
        let user = if n % 2 == 0 { "a" } else { "b" };
        ids.push(
            client
                .enqueue(call("kq", format!("{base}/kq/{user}?delay_ms=300")))
                .await
                .unwrap()
                .id,
        );
    }
    let mut rate_ids = Vec::new();
    for n in 0..15 {
        rate_ids.push(client.enqueue(noop("rq", n)).await.unwrap().id);
    }

    // Kill -9 a worker while it holds one of lq's two slots.
    let victim = eventually(Duration::from_secs(30), "an lq job running", || async {
        let running = client.store().running(1000).await.ok()?;
        running.iter().find_map(|(id, worker, _)| {
            let pid = worker.rsplit('-').nth(1)?.parse::<u32>().ok()?;
            let idx = workers.iter().position(|w| w.pid() == pid)?;
            ids[..12].contains(id).then_some(idx)
        })
    })
    .await;
    workers[victim].kill9();

    let done = wait_all_terminal(&client, &ids, Duration::from_secs(120)).await;
    for j in &done {
        assert_eq!(j.state, JobState::Succeeded, "{j:?}");
        assert_eq!(j.attempts, 0, "a held job spends no retry: {j:?}");
    }
    assert!(
        done[..12].iter().any(|j| j.crashes > 0),
        "the killed worker's job was reclaimed and run again"
    );
    assert!(
        flight.max("/lq") <= 2,
        "lq had {} in flight",
        flight.max("/lq")
    );
    assert_eq!(
        flight.max("/lq"),
        2,
        "the limit is used, not only respected"
    );
    assert_eq!(flight.max("/kq/a"), 1);
    assert_eq!(flight.max("/kq/b"), 1);

    let rate_done = wait_all_terminal(&client, &rate_ids, Duration::from_secs(120)).await;
    let mut starts: Vec<i64> = rate_done
        .iter()
        .map(|j| j.started_at.expect("started"))
        .collect();
    starts.sort();
    // At most 5 starts in each whole second of the clock (docs/limits.md, "Rate windows"):
    // every start's `started_at` lies in the window that counted it.
    let mut per_window = std::collections::BTreeMap::<i64, usize>::new();
    for t in &starts {
        *per_window.entry(t.div_euclid(1_000_000)).or_default() += 1;
    }
    assert!(
        per_window.values().all(|n| *n <= 5),
        "more than 5 starts in one second: {per_window:?}"
    );
    assert!(
        per_window.len() >= 3,
        "15 starts at 5/1s span 3 windows: {per_window:?}"
    );
    // Cleared: the queue is unlimited again.
    assert!(limit(&env, &["lq", "--clear"]).contains("no limits"));
    let (_, out, _) = env.run(&["queues", "--json"]);
    assert!(!out.contains("\"concurrency\":2"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limits_hold_embedded() {
    limits_hold(Env::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limits_hold_on_redis_and_postgres() {
    let server = RedisServer::unix();
    limits_hold(redis_postgres(&server, "limits").await).await;
}

/// `PUT /v1/queues/{name}` sets limits, `GET` shows them, `{}` clears them; refused limits are
/// 400s and bodies that do not parse 422s, each with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_queue_limits() {
    let env = Env::sqlite();
    let (_up, base) = start_up(&env, &[]).await;
    let http = http_client();
    let body = serde_json::json!({"concurrency": 3, "rate": "10/1s", "key_arg": "user_id"});
    let r = http
        .put(format!("{base}/v1/queues/hq"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        v,
        serde_json::json!({"queue": "hq", "paused": false, "limits": body})
    );
    let got: serde_json::Value = http
        .get(format!("{base}/v1/queues/hq"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["limits"], body);
    let all: serde_json::Value = http
        .get(format!("{base}/v1/queues"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let hq = all["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "hq")
        .cloned();
    assert_eq!(hq.unwrap()["limits"], body);
    for (bad, word, status) in [
        (serde_json::json!({"concurrency": 0}), "concurrency", 400),
        (serde_json::json!({"rate": "10"}), "rate", 422),
        (serde_json::json!({"key_arg": "u"}), "key_arg", 400),
        (serde_json::json!({"concurency": 1}), "concurency", 422),
    ] {
        let r = http
            .put(format!("{base}/v1/queues/hq"))
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{bad}");
        let e: serde_json::Value = r.json().await.unwrap();
        assert!(
            e["error"]["message"].as_str().unwrap_or("").contains(word),
            "{bad}: {e}"
        );
    }
    let r = http
        .put(format!("{base}/v1/queues/bad%20name"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = http
        .put(format!("{base}/v1/queues/hq"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["limits"], serde_json::json!({}));
}

/// The same on the Redis broker, whose order is by band (docs/limits.md: 0; ±1..9; ±10..99;
/// ±100 and beyond), FIFO within one: distinct priorities here are in distinct bands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn strict_priority_order_on_one_worker_redis_postgres() {
    let mut env = Env::sqlite_broker_postgres_store().await;
    env.broker = redis_server::shared().url(&unique_prefix("prio"));
    strict_priority_order(&env, &[0, 50, -20, 50, 500, 0, -20, 5, -300]).await;
}

/// Limits from the `HOMING_CONFIG` file: a worker sets them at start (shown by `homing queues`);
/// a bad entry stops the process at start with a one-line reason naming the queue and field.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limits_from_the_config_file() {
    let env = Env::sqlite();
    let write = |name: &str, v: serde_json::Value| {
        let path = env.path().join(name);
        std::fs::write(&path, v.to_string()).expect("write config");
        path.display().to_string()
    };
    let bad = write(
        "bad.json",
        serde_json::json!({"queues": {"cq": {"concurrency": 1, "rate": "3 per second"}}}),
    );
    let out = env
        .command(&["worker", "--queue", "cq"])
        .env("HOMING_CONFIG", &bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("queues.cq") && err.contains("invalid rate"),
        "{err}"
    );

    let good = write(
        "good.json",
        serde_json::json!({"queues": {"cq": {"concurrency": 1, "rate": "3/1s"},
                                      "kq": {"concurrency": 2, "key_arg": "user_id"}}}),
    );
    let mut w = env.spawn_with_env(
        "w",
        &["worker", "--queue", "cq"],
        &[("HOMING_CONFIG", &good)],
    );
    let shown = eventually(Duration::from_secs(60), "the file's limits set", || async {
        let (code, out, _) = env.run(&["queues", "--json"]);
        if code != 0 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        let limits = |q: &str| {
            v["queues"]
                .as_array()?
                .iter()
                .find(|x| x["queue"] == q)
                .map(|x| x["limits"].clone())
        };
        Some((limits("cq")?, limits("kq")?))
    })
    .await;
    assert_eq!(
        shown,
        (
            serde_json::json!({"concurrency": 1, "rate": "3/1s"}),
            serde_json::json!({"concurrency": 2, "key_arg": "user_id"})
        )
    );
    w.kill9();
}
