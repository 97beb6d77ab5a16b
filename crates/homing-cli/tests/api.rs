//! The HTTP API of a real `homing up` process: the job lifecycle over HTTP, cancellation of a
//! running job, and clear 4xx errors for every kind of bad request.

mod support;

use std::time::Duration;
use support::*;

use homing::JobState;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start_up(env: &Env) -> (Proc, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let args = [
        "up",
        "--listen",
        listen.as_str(),
        "--heartbeat-interval",
        "200ms",
        "--queue",
        "default",
        "--queue",
        "api",
    ];
    let proc = env.spawn("up", &args);
    let base = format!("http://{listen}");
    let http = http_client();
    eventually(Duration::from_secs(20), "homing up to answer", || async {
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    (proc, base)
}

/// Sends only a request's head and reads the answer: for limits the server enforces up front.
async fn raw_request(base: &str, line: &str, headers: &[(&str, &str)]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{line} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
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

async fn error_code(resp: reqwest::Response) -> (u16, String) {
    let status = resp.status().as_u16();
    let body: serde_json::Value = resp.json().await.expect("errors are JSON");
    let code = body["error"]["code"]
        .as_str()
        .expect("error.code")
        .to_string();
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "error.message: {body}"
    );
    (status, code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_lifecycle_over_http() {
    let env = Env::sqlite();
    let (_up, base) = start_up(&env).await;
    let http = http_client();

    let resp = http
        .post(format!("{base}/v1/jobs"))
        .json(
            &serde_json::json!({"task": "builtin.noop", "args": {"x": 1}, "idempotency_key": "k1"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let job: serde_json::Value = resp.json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    for field in [
        "id",
        "task",
        "queue",
        "state",
        "args",
        "result",
        "error",
        "attempts",
        "crashes",
        "epoch",
        "max_retries",
        "idempotency_key",
        "progress",
        "worker",
        "created_at",
        "scheduled_at",
        "started_at",
        "finished_at",
    ] {
        assert!(job.get(field).is_some(), "job JSON lacks {field}: {job}");
    }
    // The same idempotency key: the existing job, 200 instead of 202.
    let again = http
        .post(format!("{base}/v1/jobs"))
        .json(
            &serde_json::json!({"task": "builtin.noop", "args": {"x": 2}, "idempotency_key": "k1"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.json::<serde_json::Value>().await.unwrap()["id"], id);

    let done = eventually(Duration::from_secs(10), "the job to succeed", || async {
        let j: serde_json::Value = http
            .get(format!("{base}/v1/jobs/{id}"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (j["state"] == "succeeded").then_some(j)
    })
    .await;
    assert_eq!(done["result"], serde_json::json!({"x": 1}));
    assert!(done["finished_at"].as_str().unwrap().ends_with('Z'));

    // Pagination: 7 more jobs, pages of 3, nothing missed or repeated.
    for i in 0..7 {
        http.post(format!("{base}/v1/jobs"))
            .json(&serde_json::json!({"task": "builtin.noop", "args": {"i": i}}))
            .send()
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let page: serde_json::Value = http
            .get(format!("{base}/v1/jobs?limit=3&cursor={cursor}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for j in page["jobs"].as_array().unwrap() {
            seen.push(j["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    assert_eq!(seen.len(), 8);
    let unique: std::collections::HashSet<_> = seen.iter().collect();
    assert_eq!(unique.len(), 8);

    // Cancel a running job: its handler stops and the job ends cancelled.
    let resp = http
        .post(format!("{base}/v1/jobs"))
        .json(&serde_json::json!({"task": "builtin.sleep", "queue": "api", "args": {"ms": 60000}}))
        .send()
        .await
        .unwrap();
    let sleeper = resp.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let client = env.client().await;
    let sid: homing::JobId = sleeper.parse().unwrap();
    wait_state(&client, sid, JobState::Running, Duration::from_secs(10)).await;
    let c = http
        .post(format!("{base}/v1/jobs/{sleeper}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(c.status(), 200);
    let cancelled = wait_state(&client, sid, JobState::Cancelled, Duration::from_secs(10)).await;
    assert!(cancelled.finished_at.is_some());

    // Only failed, dead or cancelled jobs can be retried.
    let r = http
        .post(format!("{base}/v1/jobs/{id}/retry"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(r).await,
        (409, "conflict".into()),
        "a succeeded job cannot be retried"
    );

    let queues: serde_json::Value = http
        .get(format!("{base}/v1/queues"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let default = queues["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "default")
        .unwrap();
    assert_eq!(default["succeeded"], 8);
    let workers: serde_json::Value = http
        .get(format!("{base}/v1/workers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let w = &workers["workers"][0];
    assert_eq!(w["alive"], true);
    assert_eq!(w["status"], "live");
    let page = http.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("/dashboard/app.js"));
    let script = http
        .get(format!("{base}/dashboard/app.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(script.status(), 200);
    assert!(script.text().await.unwrap().contains("/v1/queues"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_get_clear_4xx_errors() {
    let env = Env::sqlite();
    let (_up, base) = start_up(&env).await;
    // No pooled connections: after refusing a request the server may close its connection.
    homing::tls::install_crypto_provider();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let post = |body: String| {
        http.post(format!("{base}/v1/jobs"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    assert_eq!(
        error_code(post("{not json".into()).await.unwrap()).await,
        (400, "invalid_json".into())
    );
    assert_eq!(
        error_code(post("{\"args\": {}}".into()).await.unwrap()).await,
        (422, "invalid_json".into())
    );
    assert_eq!(
        error_code(
            post("{\"task\": \"builtin.noop\", \"argz\": 1}".into())
                .await
                .unwrap()
        )
        .await,
        (422, "invalid_json".into())
    );
    assert_eq!(
        error_code(post("{\"task\": \"no.such\"}".into()).await.unwrap()).await,
        (422, "unknown_task".into())
    );
    assert_eq!(
        error_code(post("{\"task\": \"bad name!\"}".into()).await.unwrap()).await,
        (400, "invalid_request".into())
    );
    assert_eq!(
        error_code(
            post("{\"task\": \"builtin.noop\", \"countdown\": \"soon\"}".into())
                .await
                .unwrap()
        )
        .await,
        (422, "invalid_json".into())
    );
    // Oversized: the server answers 413 from the declared length, before reading the body.
    let (status, body) = raw_request(
        &base,
        "POST /v1/jobs",
        &[
            ("content-type", "application/json"),
            ("content-length", "3145728"),
        ],
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("payload_too_large"), "{body}");
    let big_args = format!(
        "{{\"task\": \"builtin.noop\", \"args\": \"{}\"}}",
        "x".repeat(1536 * 1024)
    );
    assert_eq!(
        error_code(post(big_args).await.unwrap()).await,
        (400, "invalid_request".into())
    );
    let text = http
        .post(format!("{base}/v1/jobs"))
        .body("{\"task\": \"builtin.noop\"}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(text).await,
        (415, "unsupported_media_type".into())
    );
    let missing = homing::job::new_job_id();
    let gets = [
        ("/v1/jobs/not-a-uuid".to_string(), 400, "invalid_request"),
        (format!("/v1/jobs/{missing}"), 404, "not_found"),
        ("/v1/jobs?state=pending".to_string(), 400, "invalid_request"),
        ("/v1/jobs?limit=0".to_string(), 400, "invalid_request"),
        ("/v1/jobs?cursor=zzz".to_string(), 400, "invalid_request"),
        ("/v2/nothing".to_string(), 404, "not_found"),
    ];
    for (path, status, code) in gets {
        let r = http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(error_code(r).await, (status, code.into()), "GET {path}");
    }
    let r = http
        .post(format!("{base}/v1/jobs/{missing}/retry"))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(r).await, (404, "not_found".into()));
    // After all of that the server still works.
    let ok = post("{\"task\": \"builtin.noop\"}".into()).await.unwrap();
    assert_eq!(ok.status(), 202);
}
