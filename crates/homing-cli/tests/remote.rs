//! The remote worker protocol (docs/remote-workers.md) against real `homing` processes: a
//! protocol client written here plays the remote worker over HTTP. One `homing up` serves every
//! embedded case in sequence; the Redis + PostgreSQL case runs two `homing server`s and kills one
//! with SIGKILL between reserve and complete.

#[path = "../../homing/tests/support/redis_server.rs"]
mod redis_server;
mod support;

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;

const TOKEN: &str = "remote-test-token-0123456789";
const LIMIT: Duration = Duration::from_secs(30);

/// The HTTP side of a remote worker: which server it talks to can change between calls.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    base: Arc<Mutex<String>>,
}

impl Api {
    fn new(base: &str) -> Api {
        Api {
            http: http_client(),
            base: Arc::new(Mutex::new(base.to_string())),
        }
    }

    fn switch(&self, base: &str) {
        *self.base.lock().unwrap() = base.to_string();
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base.lock().unwrap())
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let r = self
            .http
            .post(self.url(path))
            .bearer_auth(TOKEN)
            .json(&body)
            .timeout(Duration::from_secs(45))
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = r.status();
        let v = r.json().await.unwrap_or(Value::Null);
        (status, v)
    }

    async fn get(&self, path: &str) -> Value {
        self.http
            .get(self.url(path))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn enqueue(&self, task: &str, queue: &str, args: Value) -> String {
        let (s, job) = self
            .post(
                "/v1/jobs",
                json!({"task": task, "queue": queue, "args": args}),
            )
            .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{job}");
        job["id"].as_str().unwrap().to_string()
    }

    async fn job(&self, id: &str) -> Value {
        self.get(&format!("/v1/jobs/{id}")).await
    }

    async fn wait_state(&self, id: &str, state: &str) -> Value {
        eventually(LIMIT, &format!("job {id} to be {state}"), || async {
            let j = self.job(id).await;
            (j["state"] == state).then_some(j)
        })
        .await
    }

    /// Registers a session; its heartbeats run in the background (listing `held`) when `beat`.
    async fn session(&self, queue: &str, interval_ms: u64, beat: bool) -> Session {
        let (s, r) = self
            .post(
                "/v1/remote/sessions",
                json!({"queues": [queue], "concurrency": 4, "heartbeat_interval_ms": interval_ms,
                       "host": "test", "pid": std::process::id(), "version": "remote.rs",
                       "tasks": [{"name": "py.work", "max_retries": 1, "retry_delay_ms": 100}]}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{r}");
        assert_eq!(r["ttl_ms"], 3 * interval_ms);
        let session = Session {
            id: r["session"].as_str().unwrap().to_string(),
            api: self.clone(),
            held: Arc::new(Mutex::new(Vec::new())),
            cancel: Arc::new(Mutex::new(Vec::new())),
            expired: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            beat: None,
        };
        if beat {
            session.with_heartbeats(interval_ms)
        } else {
            session
        }
    }
}

struct Session {
    id: String,
    api: Api,
    held: Arc<Mutex<Vec<Value>>>,
    cancel: Arc<Mutex<Vec<String>>>,
    expired: Arc<std::sync::atomic::AtomicBool>,
    beat: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(b) = self.beat.take() {
            b.abort();
        }
    }
}

impl Session {
    fn with_heartbeats(mut self, interval_ms: u64) -> Session {
        let (api, id, held, cancel, expired) = (
            self.api.clone(),
            self.id.clone(),
            self.held.clone(),
            self.cancel.clone(),
            self.expired.clone(),
        );
        self.beat = Some(tokio::spawn(async move {
            loop {
                let list: Vec<Value> = held.lock().unwrap().clone();
                // A server being killed answers nothing: keep beating, as a real client does.
                if let Ok(r) = api
                    .http
                    .post(api.url(&format!("/v1/remote/sessions/{id}/heartbeat")))
                    .bearer_auth(TOKEN)
                    .json(&json!({ "held": list }))
                    .send()
                    .await
                {
                    if r.status() == StatusCode::GONE {
                        expired.store(true, std::sync::atomic::Ordering::SeqCst);
                    } else if let Ok(v) = r.json::<Value>().await {
                        for c in v["cancel"].as_array().into_iter().flatten() {
                            cancel.lock().unwrap().push(c.as_str().unwrap().to_string());
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(interval_ms)).await;
            }
        }));
        self
    }

    fn path(&self, call: &str) -> String {
        format!("/v1/remote/sessions/{}/{call}", self.id)
    }

    /// Reserves jobs (waiting up to 5 s for one) and lists them as held.
    async fn reserve(&self, max: u32) -> Vec<Value> {
        let (s, r) = self
            .api
            .post(&self.path("reserve"), json!({"max": max, "wait_ms": 5000}))
            .await;
        assert_eq!(s, StatusCode::OK, "{r}");
        let jobs = r["jobs"].as_array().unwrap().clone();
        let mut held = self.held.lock().unwrap();
        for j in &jobs {
            held.push(json!({"job_id": j["job_id"], "epoch": j["epoch"]}));
        }
        jobs
    }

    /// Reserves until `id` is handed over (other jobs reserved meanwhile are released).
    async fn reserve_job(&self, id: &str) -> Value {
        eventually(LIMIT, &format!("job {id} to be reserved"), || async {
            let mut found = None;
            for j in self.reserve(4).await {
                if j["job_id"] == id {
                    found = Some(j);
                } else {
                    self.complete_one(&j, json!({"outcome": "released"})).await;
                }
            }
            found
        })
        .await
    }

    async fn complete(&self, results: Vec<Value>) -> (StatusCode, Value) {
        self.api
            .post(&self.path("complete"), json!({ "results": results }))
            .await
    }

    /// Completes one run; answers its status. The job stops being held once answered.
    async fn complete_one(&self, job: &Value, report: Value) -> String {
        let mut r = json!({"job_id": job["job_id"], "epoch": job["epoch"], "lease": job["lease"]});
        for (k, v) in report.as_object().unwrap() {
            r[k] = v.clone();
        }
        let (s, v) = self.complete(vec![r]).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        self.held
            .lock()
            .unwrap()
            .retain(|h| h["job_id"] != job["job_id"]);
        v["results"][0]["status"].as_str().unwrap().to_string()
    }
}

/// A POST that declares a body of `len` bytes and sends none: the status and text answered.
async fn declared_only(url: &str, len: usize) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.trim_start_matches("http://");
    let (addr, path) = rest.split_at(rest.find('/').unwrap());
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\nauthorization: Bearer {TOKEN}\r\n\
         content-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    );
    sock.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

async fn metric(api: &Api, name: &str) -> f64 {
    let text = api
        .http
        .get(api.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Every embedded case, in sequence on one `homing up`: happy path, progress, a lost answer,
/// retry by the declared defaults, fatal, snooze, cancel through the heartbeat, release, the
/// housekeeping of a job whose reserve answer was lost, a zombie, validation and tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remote_protocol_on_the_embedded_backend() {
    let env = Env::sqlite();
    let (up, base) = start_up(&env, &[("HOMING_API_TOKEN", TOKEN)]).await;
    let api = Api::new(&base);
    let w = api.session("py", 200, true).await;

    // Bad token: 401, whatever the route.
    let r = api
        .http
        .post(api.url(&w.path("reserve")))
        .bearer_auth("wrong")
        .json(&json!({"max": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    // The registered task is known to producers; the session shows as a worker.
    let id = api.enqueue("py.work", "py", json!({"n": 1})).await;
    let workers = api.get("/v1/workers").await;
    let me = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == w.id.as_str())
        .expect("the session is listed as a worker")
        .clone();
    assert_eq!(me["queues"], json!(["py"]));
    assert_eq!(me["remote"]["version"], "remote.rs");

    // Happy path with progress; then the same completion again (its answer "lost").
    let job = w.reserve_job(&id).await;
    assert_eq!(job["task"], "py.work");
    assert_eq!(job["args"], json!({"n": 1}));
    assert_eq!(job["attempt"], 0);
    assert_eq!(job["max_retries"], 1, "the declared default applies");
    assert_eq!(job["idempotency_key"], id.as_str());
    let (s, p) = api
        .post(
            &w.path("progress"),
            json!({"job_id": id, "epoch": job["epoch"], "progress": {"page": 1}}),
        )
        .await;
    assert_eq!((s, p["status"].as_str()), (StatusCode::OK, Some("applied")));
    assert_eq!(api.job(&id).await["progress"], json!({"page": 1}));
    let ok = json!({"outcome": "succeeded", "result": {"pages": 3}});
    assert_eq!(w.complete_one(&job, ok.clone()).await, "applied");
    let done = api.job(&id).await;
    assert_eq!(
        (done["state"].as_str(), &done["result"]),
        (Some("succeeded"), &json!({"pages": 3}))
    );
    assert_eq!(w.complete_one(&job, ok.clone()).await, "already_applied");
    let (s, p) = api
        .post(
            &w.path("progress"),
            json!({"job_id": id, "epoch": job["epoch"], "progress": {"page": 2}}),
        )
        .await;
    assert_eq!((s, p["status"].as_str()), (StatusCode::OK, Some("stale")));

    // Retry by the declared defaults (max_retries 1, 100 ms apart), then failed.
    let id = api.enqueue("py.work", "py", json!({"n": 2})).await;
    let job = w.reserve_job(&id).await;
    let err = json!({"outcome": "error", "error": "Traceback: boom"});
    assert_eq!(w.complete_one(&job, err.clone()).await, "applied");
    assert_eq!(api.job(&id).await["state"], "scheduled");
    let job = w.reserve_job(&id).await;
    assert_eq!(job["attempt"], 1);
    assert_eq!(w.complete_one(&job, err.clone()).await, "applied");
    let failed = api.job(&id).await;
    assert_eq!(
        (failed["state"].as_str(), failed["attempts"].as_u64()),
        (Some("failed"), Some(2))
    );
    assert_eq!(failed["error"], "Traceback: boom");

    // Fatal: failed at once.
    let id = api.enqueue("py.work", "py", json!({"n": 3})).await;
    let job = w.reserve_job(&id).await;
    assert_eq!(
        w.complete_one(&job, json!({"outcome": "fatal", "error": "bad input"}))
            .await,
        "applied"
    );
    assert_eq!(api.job(&id).await["state"], "failed");

    // Snooze: scheduled, nothing counted, then it runs again.
    let id = api.enqueue("py.work", "py", json!({"n": 4})).await;
    let job = w.reserve_job(&id).await;
    assert_eq!(
        w.complete_one(&job, json!({"outcome": "snooze", "delay_ms": 200}))
            .await,
        "applied"
    );
    let again = w.reserve_job(&id).await;
    assert_eq!(again["attempt"], 0);
    assert!(again["epoch"].as_u64() > job["epoch"].as_u64());
    assert_eq!(w.complete_one(&again, ok.clone()).await, "applied");

    // Cancel: the request arrives in the heartbeat's answer.
    let id = api.enqueue("py.work", "py", json!({"n": 5})).await;
    let job = w.reserve_job(&id).await;
    let (s, _) = api.post(&format!("/v1/jobs/{id}/cancel"), json!({})).await;
    assert_eq!(s, StatusCode::OK);
    eventually(LIMIT, "the cancel request in a heartbeat", || async {
        w.cancel.lock().unwrap().contains(&id).then_some(())
    })
    .await;
    assert_eq!(
        w.complete_one(&job, json!({"outcome": "cancelled"})).await,
        "applied"
    );
    assert_eq!(api.job(&id).await["state"], "cancelled");

    // Release: back to queued with nothing counted.
    let id = api.enqueue("py.work", "py", json!({"n": 6})).await;
    let job = w.reserve_job(&id).await;
    assert_eq!(
        w.complete_one(&job, json!({"outcome": "released"})).await,
        "applied"
    );
    let again = w.reserve_job(&id).await;
    assert_eq!(
        (again["attempt"].as_u64(), again["crashes"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(w.complete_one(&again, ok.clone()).await, "applied");

    // A reserve answer that never reached the worker: the job runs under the live session,
    // which does not hold it; the heartbeat's housekeeping reclaims it after one TTL.
    let id = api.enqueue("py.work", "py", json!({"n": 7})).await;
    let lost = w.reserve_job(&id).await;
    w.held
        .lock()
        .unwrap()
        .retain(|h| h["job_id"] != id.as_str());
    let requeued = eventually(
        LIMIT,
        "the housekeeping to reclaim the unheld job",
        || async {
            let j = api.job(&id).await;
            (j["state"] != "running" && j["crashes"] == 1).then_some(j)
        },
    )
    .await;
    assert!(
        matches!(requeued["state"].as_str(), Some("queued")),
        "{requeued}"
    );
    let again = w.reserve_job(&id).await;
    assert!(again["epoch"].as_u64() > lost["epoch"].as_u64());
    assert_eq!(w.complete_one(&again, ok.clone()).await, "applied");

    // A zombie: a session whose heartbeats stop (paused past its TTL). The rescuer reclaims its
    // job, another session runs it; the zombie's completion is stale and counted, its heartbeat
    // answers 410, and the job keeps the new run's result.
    let stale_before = metric(&api, "homing_remote_stale_total").await;
    let zombie = api.session("py", 200, false).await;
    let id = api.enqueue("py.work", "py", json!({"n": 8})).await;
    let zjob = zombie.reserve_job(&id).await;
    let new = w.reserve_job(&id).await;
    assert!(new["epoch"].as_u64() > zjob["epoch"].as_u64());
    assert_eq!(
        api.job(&id).await["crashes"],
        1,
        "the zombie's run counted as a crash"
    );
    assert_eq!(
        w.complete_one(&new, json!({"outcome": "succeeded", "result": "new"}))
            .await,
        "applied"
    );
    let z = json!({"outcome": "succeeded", "result": "zombie"});
    assert_eq!(zombie.complete_one(&zjob, z).await, "stale");
    assert_eq!(api.job(&id).await["result"], "new");
    let (s, e) = api
        .post(&zombie.path("heartbeat"), json!({"held": []}))
        .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (StatusCode::GONE, Some("session_expired"))
    );
    let (s, _) = api.post(&zombie.path("reserve"), json!({"max": 1})).await;
    assert_eq!(s, StatusCode::GONE);
    assert!(metric(&api, "homing_remote_stale_total").await >= stale_before + 1.0);
    up.wait_log("job.zombie_write_rejected").await;
    // Remote outcomes count like a Rust worker's, labelled by queue and task.
    let label = r#"{queue="py",task="py.work"}"#;
    assert!(metric(&api, &format!("homing_jobs_succeeded_total{label}")).await >= 5.0);
    assert!(metric(&api, &format!("homing_jobs_retried_total{label}")).await >= 1.0);
    assert!(metric(&api, &format!("homing_remote_stale_total{label}")).await >= 1.0);

    // A run past its time limit (plus a TTL of grace) is ended by the server as a Rust handler
    // at its limit is: an error that retries per the job's policy (here the declared 1 retry),
    // and the heartbeat tells the worker to stop it. Its late completion is stale, and the job
    // keeps the retry's result.
    let (s, j) = api
        .post(
            "/v1/jobs",
            json!({"task": "py.work", "queue": "py", "args": {"n": 10}, "time_limit": "300ms"}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{j}");
    let id = j["id"].as_str().unwrap().to_string();
    let slow = w.reserve_job(&id).await;
    assert_eq!(slow["time_limit_ms"], 300);
    let ended = eventually(LIMIT, "the server to end the run at its limit", || async {
        let j = api.job(&id).await;
        (j["state"] != "running").then_some(j)
    })
    .await;
    // Retried (declared: 1 retry, 100 ms apart): scheduled, or already queued again.
    assert!(
        matches!(ended["state"].as_str(), Some("scheduled" | "queued")),
        "{ended}"
    );
    assert_eq!(ended["attempts"], 1, "{ended}");
    assert!(
        ended["error"]
            .as_str()
            .is_some_and(|e| e.contains("time limit of 300ms exceeded")),
        "{ended}"
    );
    eventually(
        LIMIT,
        "the heartbeat to tell the worker to stop it",
        || async { w.cancel.lock().unwrap().contains(&id).then_some(()) },
    )
    .await;
    let late = json!({"outcome": "succeeded", "result": "late"});
    assert_eq!(w.complete_one(&slow, late).await, "stale");
    let again = w.reserve_job(&id).await;
    assert_eq!(again["attempt"], 1);
    assert_eq!(
        w.complete_one(&again, json!({"outcome": "succeeded", "result": "in time"}))
            .await,
        "applied"
    );
    assert_eq!(api.job(&id).await["result"], "in time");
    up.wait_log("job.time_limit").await;

    // A completion that reserves the next job in the same round trip; a bad reserve.max is
    // refused before anything is committed.
    let first = api.enqueue("py.work", "py", json!({"n": 12})).await;
    let next = api.enqueue("py.work", "py", json!({"n": 13})).await;
    let job = w.reserve_job(&first).await;
    let report = json!({"job_id": job["job_id"], "epoch": job["epoch"], "lease": job["lease"],
                        "outcome": "succeeded", "result": 12});
    let (s, e) = api
        .post(
            &w.path("complete"),
            json!({"results": [report.clone()], "reserve": {"max": 0}}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    assert_eq!(api.job(&first).await["state"], "running");
    let (s, r) = api
        .post(
            &w.path("complete"),
            json!({"results": [report], "reserve": {"max": 1}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    w.held
        .lock()
        .unwrap()
        .retain(|h| h["job_id"] != first.as_str());
    assert_eq!(r["results"][0]["status"], "applied", "{r}");
    let got = r["jobs"].as_array().expect("jobs with the answer").clone();
    assert_eq!(got.len(), 1, "{r}");
    assert_eq!(got[0]["job_id"], next.as_str(), "{r}");
    assert_eq!(api.job(&next).await["state"], "running");
    assert_eq!(w.complete_one(&got[0], ok.clone()).await, "applied");

    // A session that ends while its reserve long-polls (a worker stopping on SIGTERM): what
    // the abandoned poll reserves goes back unstarted, with no crash counted.
    let leaving = api.session("py", 200, false).await;
    let poll = {
        let api = api.clone();
        let path = leaving.path("reserve");
        tokio::spawn(async move { api.post(&path, json!({"max": 4, "wait_ms": 3000})).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = api
        .http
        .delete(api.url(&format!("/v1/remote/sessions/{}", leaving.id)))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let id = api.enqueue("py.work", "py", json!({"n": 11})).await;
    let (s, _) = poll.await.unwrap();
    assert!(
        s == StatusCode::GONE || s == StatusCode::OK,
        "the abandoned poll answered {s}"
    );
    let job = w.reserve_job(&id).await;
    assert_eq!(job["crashes"], 0, "{job}");
    assert_eq!(w.complete_one(&job, ok.clone()).await, "applied");

    // Validation at the door.
    for (path, body) in [
        (
            "/v1/remote/sessions",
            json!({"queues": ["py"], "concurrency": 0}),
        ),
        (
            "/v1/remote/sessions",
            json!({"queues": [], "concurrency": 1}),
        ),
        (
            "/v1/remote/sessions",
            json!({"queues": ["homing.webhooks"], "concurrency": 1}),
        ),
        (
            "/v1/remote/sessions",
            json!({"queues": ["py"], "concurrency": 1, "heartbeat_interval_ms": 10}),
        ),
        (
            "/v1/remote/sessions",
            json!({"queues": ["py"], "concurrency": 1, "tasks": [{"name": "builtin.webhook"}]}),
        ),
        (&w.path("reserve"), json!({"max": 1, "wait_ms": 60000})),
        (&w.path("reserve"), json!({"max": 0})),
        (
            &w.path("complete"),
            json!({"results": [{"job_id": id, "epoch": 1, "lease": "nope", "outcome": "succeeded"}]}),
        ),
        (
            &w.path("progress"),
            json!({"job_id": id, "epoch": 1, "progress": "\u{0}"}),
        ),
    ] {
        let (s, e) = api.post(path, body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{path} {body}: {e}");
        assert!(e["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    // Another job's lease is refused (acknowledging it would drop that job's message); a
    // result over 8 MiB fails its job and is never stored; a body over 16 MiB is refused.
    let x = api.enqueue("py.work", "py", json!({"n": 9})).await;
    let xjob = w.reserve_job(&x).await;
    let (s, e) = w
        .complete(vec![
            json!({"job_id": id, "epoch": 1, "lease": xjob["lease"], "outcome": "succeeded"}),
        ])
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    let big = "x".repeat(9 * 1024 * 1024);
    assert_eq!(
        w.complete_one(&xjob, json!({"outcome": "succeeded", "result": big}))
            .await,
        "applied"
    );
    let refused = api.job(&x).await;
    assert_eq!(refused["state"], "failed");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("result was refused"),
        "{refused}"
    );
    assert!(refused["result"].is_null());
    // A result holding an integer beyond 64 bits (which the JSON reader would keep as a
    // double) fails its own job with the reason; the call's other completion stands, exact.
    let y = api.enqueue("py.work", "py", json!({"n": 10})).await;
    let z = api.enqueue("py.work", "py", json!({"n": 11})).await;
    let yjob = w.reserve_job(&y).await;
    let zjob = w.reserve_job(&z).await;
    let one = |j: &Value, result: &str| {
        format!(
            r#"{{"job_id": {}, "epoch": {}, "lease": {}, "outcome": "succeeded", "result": {result}}}"#,
            j["job_id"], j["epoch"], j["lease"]
        )
    };
    let body = format!(
        r#"{{"results": [{}, {}]}}"#,
        one(&yjob, r#"{"n": 123456789012345678901234567890}"#),
        one(&zjob, r#"{"n": 18446744073709551615}"#)
    );
    let r = api
        .http
        .post(api.url(&w.path("complete")))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["results"][0]["status"], "applied", "{answer}");
    assert_eq!(answer["results"][1]["status"], "applied", "{answer}");
    w.held
        .lock()
        .unwrap()
        .retain(|h| h["job_id"] != yjob["job_id"] && h["job_id"] != zjob["job_id"]);
    let inexact = api.job(&y).await;
    assert_eq!(inexact["state"], "failed", "{inexact}");
    assert!(
        inexact["error"]
            .as_str()
            .unwrap()
            .contains("result was refused: the integer 123456789012345678901234567890 does not fit in 64 bits"),
        "{inexact}"
    );
    let exact = api.job(&z).await;
    assert_eq!(exact["state"], "succeeded", "{exact}");
    assert_eq!(exact["result"]["n"], json!(18446744073709551615u64));
    // Refused from the declared length, before any of the body is read.
    let (status, text) = declared_only(&api.url(&w.path("complete")), 17 * 1024 * 1024).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("payload_too_large"), "{text}");

    let (s, e) = api
        .post(
            "/v1/remote/sessions",
            json!({"queues": ["py"], "concurrency": 1, "typo": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    let (s, e) = api
        .post("/v1/remote/sessions/not-a-session/heartbeat", json!({}))
        .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_session"))
    );
    let unknown = "/v1/remote/sessions/remote-0190a0a0-0000-7000-8000-000000000001/reserve";
    let (s, _) = api.post(unknown, json!({"max": 1})).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // A graceful end: the session is stopped, and calls for it answer 410.
    let r = api
        .http
        .delete(api.url(&format!("/v1/remote/sessions/{}", w.id)))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (s, _) = api.post(&w.path("reserve"), json!({"max": 1})).await;
    assert_eq!(s, StatusCode::GONE);
    assert!(!up.log_text().contains("panicked"));
}

/// Redis broker + PostgreSQL store, two `homing server`s. A worker reserves two jobs through
/// server A, which is then killed with SIGKILL: one job is completed through server B; the other
/// one's reserve answer is treated as lost (never held), and B's heartbeat housekeeping reclaims
/// it so that it runs again. Every job ends succeeded, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_killed_between_reserve_and_complete_on_redis_postgres() {
    let redis = redis_server::RedisServer::unix();
    let mut env = Env::sqlite_broker_postgres_store().await;
    env.broker = redis.url(&redis_server::unique_prefix("remote"));
    let mut servers = Vec::new();
    let mut bases = Vec::new();
    for i in 0..2 {
        let listen = format!("127.0.0.1:{}", free_port());
        servers.push(env.spawn_with_env(
            &format!("server{i}"),
            &["server", "--listen", &listen, "--rescue-interval", "200ms"],
            &[("HOMING_API_TOKEN", TOKEN)],
        ));
        let base = format!("http://{listen}");
        let http = http_client();
        eventually(LIMIT, "the server to answer", || async {
            http.get(format!("{base}/healthz"))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
        })
        .await;
        bases.push(base);
    }
    let api = Api::new(&bases[0]);
    let w = api.session("gpu", 300, true).await;
    let a = api.enqueue("py.work", "gpu", json!({"n": "a"})).await;
    let b = api.enqueue("py.work", "gpu", json!({"n": "b"})).await;
    let ja = w.reserve_job(&a).await;
    let jb = w.reserve_job(&b).await;
    // The answer for b "never arrived": the worker does not hold it.
    w.held.lock().unwrap().retain(|h| h["job_id"] != b.as_str());
    servers[0].kill9();
    api.switch(&bases[1]);

    let ok = json!({"outcome": "succeeded", "result": "done"});
    assert_eq!(w.complete_one(&ja, ok.clone()).await, "applied");
    assert_eq!(w.complete_one(&ja, ok.clone()).await, "already_applied");
    let again = w.reserve_job(&b).await;
    assert!(again["epoch"].as_u64() > jb["epoch"].as_u64());
    assert_eq!(w.complete_one(&again, ok.clone()).await, "applied");
    // The first run's completion, if it ever came, is a zombie's.
    assert_eq!(w.complete_one(&jb, ok.clone()).await, "stale");
    for id in [&a, &b] {
        let j = api.wait_state(id, "succeeded").await;
        assert_eq!(j["result"], "done");
    }
    assert_eq!(api.job(&b).await["crashes"], 1);
    assert!(
        !w.expired.load(std::sync::atomic::Ordering::SeqCst),
        "the session stayed alive"
    );
    assert!(!servers[1].log_text().contains("panicked"));
}
