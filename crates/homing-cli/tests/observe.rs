//! Seeing and steering a running system, against real processes: API tokens on every route,
//! `/metrics` parsed by Prometheus's own parser and matched against what the test did, the job
//! event stream, and webhooks reaching a local stand-in for Discord — exactly once each, through
//! a `kill -9` and a `429 Retry-After`.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;

use homing::JobState;

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

/// Every (method, path) the OpenAPI document lists, with `{id}` filled in.
fn documented_routes(doc: &serde_json::Value, id: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for method in ops.as_object().expect("operations").keys() {
            out.push((method.to_uppercase(), path.replace("{id}", id)));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_route_but_healthz_needs_a_token() {
    let env = Env::sqlite();
    let config = env.path().join("config.json");
    std::fs::write(
        &config,
        r#"{"api_tokens": ["first-token-123"], "webhooks": []}"#,
    )
    .unwrap();
    let (_up, base) = start_up(
        &env,
        &[
            ("HOMING_CONFIG", config.to_str().unwrap()),
            ("HOMING_API_TOKEN", "second-token-456"),
        ],
    )
    .await;
    let http = http_client();
    let doc: serde_json::Value = http
        .get(format!("{base}/v1/openapi.json"))
        .header("authorization", bearer("first-token-123"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let job: serde_json::Value = http
        .post(format!("{base}/v1/jobs"))
        .header("authorization", bearer("second-token-456"))
        .json(&serde_json::json!({"task": "builtin.noop"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = job["id"].as_str().expect("job id").to_string();
    let routes = documented_routes(&doc, &id);
    assert!(
        routes.len() >= 14,
        "the document lists every route: {routes:?}"
    );
    let open = [
        "/healthz",
        "/",
        "/dashboard/app.js",
        "/dashboard/style.css",
        "/dashboard/charts.js",
        "/dashboard/vendor/uplot.min.js",
        "/dashboard/vendor/uplot.min.css",
        "/dashboard/views.js",
        "/dashboard/workers.js",
        "/dashboard/timeline.js",
    ];
    let mut protected = 0;
    for (method, path) in &routes {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        for auth in [None, Some("wrong-token"), Some("first-token-12"), Some("")] {
            let mut req = http.request(m.clone(), format!("{base}{path}"));
            if let Some(t) = auth {
                req = req.header("authorization", bearer(t));
            }
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            if open.contains(&path.as_str()) {
                assert_ne!(status, 401, "{method} {path} is open");
                continue;
            }
            assert_eq!(status, 401, "{method} {path} with {auth:?}");
            let body: serde_json::Value = resp.json().await.expect("a JSON error");
            assert_eq!(body["error"]["code"], "unauthorized");
        }
        if !open.contains(&path.as_str()) {
            protected += 1;
        }
        // Either configured token opens it. (The event stream is read below, not here.)
        if path.ends_with("/events") {
            continue;
        }
        for t in ["first-token-123", "second-token-456"] {
            let resp = http
                .request(m.clone(), format!("{base}{path}"))
                .header("authorization", bearer(t))
                .send()
                .await
                .unwrap();
            assert_ne!(
                resp.status().as_u16(),
                401,
                "{method} {path} with a good token"
            );
        }
    }
    assert!(protected >= 9, "{protected} protected routes");
    // An undocumented route is protected too (no probing without a token).
    let r = http.get(format!("{base}/v1/nope")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
}

type Labels = Vec<(String, String)>;
/// Samples by (name, sorted labels).
type Samples = HashMap<(String, Labels), f64>;

/// Parses Prometheus text with `prometheus_client`'s parser.
fn parse_prometheus(text: &str) -> Samples {
    let venv = test_venv();
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append([s.name, sorted(s.labels.items()), s.value])
print(json.dumps(out))
"#;
    let mut child = std::process::Command::new(venv.join("bin/python"))
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python from the test venv");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client refused /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<(String, Labels, f64)> = serde_json::from_slice(&out.stdout).unwrap();
    samples.into_iter().map(|(n, l, v)| ((n, l), v)).collect()
}

fn sample(m: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut l: Labels = labels
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    l.sort();
    *m.get(&(name.to_string(), l.clone()))
        .unwrap_or_else(|| panic!("no sample {name}{l:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_parse_and_count_what_happened() {
    let env = Env::sqlite();
    let (_up, base) = start_up(&env, &[]).await;
    let http = http_client();
    let mut ids = Vec::new();
    let enqueue = |body: serde_json::Value| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let r = http
                .post(format!("{base}/v1/jobs"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 202);
            r.json::<serde_json::Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .parse::<homing::JobId>()
                .unwrap()
        }
    };
    for i in 0..3 {
        ids.push(enqueue(serde_json::json!({"task": "builtin.noop", "args": {"i": i}})).await);
    }
    let fast_retry = serde_json::json!({"kind": "fixed", "delay": 50});
    for _ in 0..2 {
        ids.push(
            enqueue(serde_json::json!({"task": "test.flaky", "args": {"fail_times": 1}, "retry_policy": fast_retry}))
                .await,
        );
    }
    ids.push(
        enqueue(
            serde_json::json!({"task": "test.flaky", "args": {"fail_times": 9}, "max_retries": 0}),
        )
        .await,
    );
    // The same idempotency key twice is one enqueue.
    let key =
        serde_json::json!({"task": "builtin.noop", "queue": "other", "idempotency_key": "once"});
    ids.push(enqueue(key.clone()).await);
    let again = http
        .post(format!("{base}/v1/jobs"))
        .json(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);

    let client = env.client().await;
    let done = wait_all_terminal(&client, &ids[..6], Duration::from_secs(30)).await;
    let failed = done.iter().filter(|j| j.state == JobState::Failed).count();
    assert_eq!(failed, 1);
    // Counters are bumped after the store commit; give the committer a moment to finish.
    let m = eventually(Duration::from_secs(10), "metrics to settle", || async {
        let text = http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let m = parse_prometheus(&text);
        let key = (
            "homing_jobs_succeeded_total".to_string(),
            vec![
                ("queue".to_string(), "default".to_string()),
                ("task".to_string(), "test.flaky".to_string()),
            ],
        );
        (m.get(&key) == Some(&2.0)).then_some(m)
    })
    .await;
    let noop = [("queue", "default"), ("task", "builtin.noop")];
    let flaky = [("queue", "default"), ("task", "test.flaky")];
    assert_eq!(sample(&m, "homing_jobs_enqueued_total", &noop), 3.0);
    assert_eq!(sample(&m, "homing_jobs_enqueued_total", &flaky), 3.0);
    assert_eq!(
        sample(
            &m,
            "homing_jobs_enqueued_total",
            &[("queue", "other"), ("task", "builtin.noop")]
        ),
        1.0,
        "an idempotent repeat is not counted"
    );
    assert_eq!(sample(&m, "homing_jobs_started_total", &noop), 3.0);
    assert_eq!(sample(&m, "homing_jobs_succeeded_total", &noop), 3.0);
    assert_eq!(sample(&m, "homing_jobs_started_total", &flaky), 5.0);
    assert_eq!(sample(&m, "homing_jobs_retried_total", &flaky), 2.0);
    assert_eq!(sample(&m, "homing_jobs_failed_total", &flaky), 1.0);
    assert_eq!(sample(&m, "homing_job_duration_seconds_count", &noop), 3.0);
    assert_eq!(
        sample(&m, "homing_job_queue_wait_seconds_count", &flaky),
        5.0
    );
    let inf = [
        ("queue", "default"),
        ("task", "builtin.noop"),
        ("le", "+Inf"),
    ];
    assert_eq!(sample(&m, "homing_job_duration_seconds_bucket", &inf), 3.0);
    // Gauges come from the store.
    assert_eq!(
        sample(
            &m,
            "homing_queue_jobs",
            &[("queue", "default"), ("state", "failed")]
        ),
        1.0
    );
    assert_eq!(
        sample(
            &m,
            "homing_queue_jobs",
            &[("queue", "default"), ("state", "succeeded")]
        ),
        5.0
    );
    assert_eq!(
        sample(
            &m,
            "homing_queue_jobs",
            &[("queue", "other"), ("state", "queued")]
        ),
        1.0
    );
    // `homing up`'s workers: default, the webhook deliveries, and the pipelines' ocr, emotion, bgm.
    assert_eq!(sample(&m, "homing_workers_live", &[]), 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_events_stream_until_terminal() {
    let env = Env::sqlite();
    let (_up, base) = start_up(&env, &[]).await;
    let http = http_client();
    let job: serde_json::Value = http
        .post(format!("{base}/v1/jobs"))
        .json(&serde_json::json!({"task": "builtin.sleep", "args": {"ms": 1200}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = job["id"].as_str().unwrap();
    let mut resp = http
        .get(format!("{base}/v1/jobs/{id}/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut text = String::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(chunk) = resp.chunk().await.unwrap() {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the stream ends once the job is terminal: {text}"
    );
    let mut states = Vec::new();
    let mut progress = Vec::new();
    for block in text.split("\n\n") {
        let name = block.lines().find_map(|l| l.strip_prefix("event: "));
        let data = block.lines().find_map(|l| l.strip_prefix("data: "));
        let (Some(name), Some(data)) = (name, data) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        match name {
            "state" => states.push(v["state"].as_str().unwrap().to_string()),
            "progress" => progress.push(v["progress"]["fraction"].as_f64().unwrap()),
            other => panic!("unexpected event {other}"),
        }
    }
    assert_eq!(
        states.last().map(String::as_str),
        Some("succeeded"),
        "{states:?}"
    );
    assert!(states.contains(&"running".to_string()), "{states:?}");
    assert!(!progress.is_empty(), "progress events: {text}");
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "{progress:?}");
    // A missing job is a 404 before any stream starts.
    let r = http
        .get(format!(
            "{base}/v1/jobs/{}/events",
            homing::job::new_job_id()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// One request the Discord stand-in received.
#[derive(Debug, Clone)]
struct Hook {
    at: Instant,
    path: String,
    body: serde_json::Value,
    key: String,
    status: u16,
}

/// A local server standing in for Discord's webhook endpoint: the first request is refused with
/// `429 Retry-After: 1`, every later one is accepted.
async fn discord_stand_in() -> (std::net::SocketAddr, Arc<Mutex<Vec<Hook>>>) {
    use axum::http::{HeaderMap, StatusCode, Uri};
    type Hooks = Arc<Mutex<Vec<Hook>>>;
    let hooks: Hooks = Arc::default();
    async fn handle(
        axum::extract::State(hooks): axum::extract::State<Hooks>,
        uri: Uri,
        headers: HeaderMap,
        body: String,
    ) -> (StatusCode, HeaderMap, String) {
        let mut hs = hooks.lock().unwrap();
        let status = if hs.is_empty() { 429 } else { 204 };
        hs.push(Hook {
            at: Instant::now(),
            path: uri.path().to_string(),
            body: serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
            key: headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string(),
            status,
        });
        let mut h = HeaderMap::new();
        if status == 429 {
            h.insert("retry-after", "1".parse().unwrap());
        }
        (StatusCode::from_u16(status).unwrap(), h, String::new())
    }
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(hooks.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, hooks)
}

/// `(event, worker id)` of a Discord message such as "🟢 **worker.ready** `w-1` is up …".
fn parse_discord(content: &str) -> Option<(String, String)> {
    let kind = content.split("**").nth(1)?.to_string();
    let worker = content.split('`').nth(1)?.to_string();
    Some((kind, worker))
}

/// Accepted (2xx) deliveries of `kind` for `worker`.
fn accepted(hooks: &[Hook], kind: &str, worker: &str) -> usize {
    hooks
        .iter()
        .filter(|h| h.status < 300 && h.path.starts_with("/api/webhooks/"))
        .filter_map(|h| parse_discord(h.body["content"].as_str()?))
        .filter(|(k, w)| k == kind && w == worker)
        .count()
}

async fn live_worker_ids(client: &homing::Client, queue: &str) -> Vec<String> {
    client
        .store()
        .workers(0)
        .await
        .unwrap()
        .into_iter()
        .filter(|w| {
            w.status == homing::store::WorkerStatus::Live
                && w.info.queues.iter().any(|q| q == queue)
        })
        .map(|w| w.info.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn worker_alerts_reach_discord_exactly_once() {
    let env = Env::sqlite();
    let (addr, hooks) = discord_stand_in().await;
    let secret_path = "/api/webhooks/1234/s3cr3t-t0ken";
    let webhooks = serde_json::json!([{
        "name": "discord",
        "url": format!("http://{addr}{secret_path}"),
        "format": "discord",
        "events": ["worker.ready", "worker.shutdown", "worker.lost"],
    }])
    .to_string();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut server = env.spawn_with_env(
        "server",
        &["server", "--listen", &listen, "--rescue-interval", "200ms"],
        &[("HOMING_WEBHOOKS", &webhooks)],
    );
    let client = env.client().await;
    let http = http_client();
    let base = format!("http://{listen}");
    eventually(Duration::from_secs(30), "server to answer", || async {
        http.get(format!("{base}/healthz")).send().await.ok()
    })
    .await;

    // Worker A starts and stops gracefully: worker.ready, then worker.shutdown.
    let mut a = env.worker("a", "default", &[]);
    wait_workers(&client, "default", 1, Duration::from_secs(20)).await;
    let a_id = live_worker_ids(&client, "default").await.remove(0);
    // A job with a callback URL, delivered (as JSON) when it finishes.
    let cb = http
        .post(format!("{base}/v1/jobs"))
        .json(&serde_json::json!({
            "task": "builtin.noop",
            "args": {"n": 1},
            "callback_url": format!("http://{addr}/callback/secret-cb"),
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(cb.status(), 202);
    let cb: serde_json::Value = cb.json().await.unwrap();
    assert_eq!(
        cb["callback_url"],
        format!("http://{addr}/…"),
        "the callback URL is shown redacted"
    );
    let cb_id = cb["id"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(20), "worker.ready of A", || async {
        (accepted(&hooks.lock().unwrap(), "worker.ready", &a_id) >= 1).then_some(())
    })
    .await;
    assert_eq!(a.terminate(Duration::from_secs(20)), Some(0));
    eventually(Duration::from_secs(20), "worker.shutdown of A", || async {
        (accepted(&hooks.lock().unwrap(), "worker.shutdown", &a_id) >= 1).then_some(())
    })
    .await;

    // Worker B is killed; worker C (alive, with its own rescuer) and the server both sweep.
    let mut b = env.worker("b", "default", &[]);
    wait_workers(&client, "default", 1, Duration::from_secs(20)).await;
    let b_id = live_worker_ids(&client, "default").await.remove(0);
    let _c = env.worker("c", "other", &[]);
    wait_workers(&client, "other", 1, Duration::from_secs(20)).await;
    eventually(Duration::from_secs(20), "worker.ready of B", || async {
        (accepted(&hooks.lock().unwrap(), "worker.ready", &b_id) >= 1).then_some(())
    })
    .await;
    b.kill9();
    eventually(Duration::from_secs(20), "worker.lost of B", || async {
        (accepted(&hooks.lock().unwrap(), "worker.lost", &b_id) >= 1).then_some(())
    })
    .await;
    eventually(Duration::from_secs(20), "the callback", || async {
        hooks
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.path.starts_with("/callback/") && h.status < 300)
            .then_some(())
    })
    .await;
    // Let every sweep and notifier run a few more times: nothing may arrive twice.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let hs = hooks.lock().unwrap().clone();
    assert_eq!(accepted(&hs, "worker.ready", &a_id), 1);
    assert_eq!(accepted(&hs, "worker.shutdown", &a_id), 1);
    assert_eq!(accepted(&hs, "worker.lost", &a_id), 0);
    assert_eq!(accepted(&hs, "worker.ready", &b_id), 1);
    assert_eq!(
        accepted(&hs, "worker.lost", &b_id),
        1,
        "several rescuers, one alert"
    );
    assert_eq!(accepted(&hs, "worker.shutdown", &b_id), 0);
    // The first request was refused with 429: the same delivery (same Idempotency-Key) came
    // back after Retry-After and was accepted once.
    let first = &hs[0];
    assert_eq!(first.status, 429);
    let retried: Vec<&Hook> = hs.iter().filter(|h| h.key == first.key).collect();
    assert_eq!(
        retried.len(),
        2,
        "refused once, delivered once: {retried:?}"
    );
    assert!(retried[1].status < 300 && retried[1].body == first.body);
    assert!(
        retried[1].at.duration_since(first.at) >= Duration::from_millis(900),
        "Retry-After was honoured"
    );
    // Every accepted delivery has a distinct key: no duplicates anywhere.
    let mut keys: Vec<&str> = hs
        .iter()
        .filter(|h| h.status < 300)
        .map(|h| h.key.as_str())
        .collect();
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "a delivery arrived twice");
    // The callback: the event as JSON, once, with the job finished.
    let cbs: Vec<&Hook> = hs
        .iter()
        .filter(|h| h.path.starts_with("/callback/") && h.status < 300)
        .collect();
    assert_eq!(cbs.len(), 1);
    assert_eq!(cbs[0].body["event"], "job.succeeded");
    assert_eq!(cbs[0].body["job"]["id"], cb_id.as_str());
    assert_eq!(cbs[0].body["job"]["state"], "succeeded");
    // The secret URLs never reach the logs.
    server.terminate(Duration::from_secs(20));
    for log in [server.log_text(), a.log_text()] {
        assert!(
            !log.contains("s3cr3t-t0ken") && !log.contains("secret-cb"),
            "{log}"
        );
    }
    assert!(server.log_text().contains("worker.lost"));
}
