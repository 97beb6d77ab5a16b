//! The HTTP API of a real `homing up` process: the job lifecycle over HTTP, cancellation of a
//! running job, and clear 4xx errors for every kind of bad request.

mod support;

use std::time::Duration;
use support::*;

use homing::JobState;

/// `homing up` serving the queue these tests use besides `default`.
async fn start_api(env: &Env) -> (Proc, String) {
    start_up_with(env, &["--queue", "default", "--queue", "api"], &[]).await
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
    let (_up, base) = start_api(&env).await;
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
    // What the views show as the heartbeat is the broker's, which decides liveness: for every
    // live worker it stays within the TTL (3 × 200 ms here). The store's last_seen, written
    // every fifth beat, routinely lags past the TTL; it may not stand in for the heartbeat.
    let ttl = 0.6;
    for _ in 0..8 {
        let workers: serde_json::Value = http
            .get(format!("{base}/v1/workers"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for w in workers["workers"].as_array().unwrap() {
            if w["alive"] != true {
                continue;
            }
            let left = w["heartbeat_expires_in_s"]
                .as_f64()
                .unwrap_or_else(|| panic!("a live worker's heartbeat expiry: {w}"));
            assert!(left > 0.0 && left <= ttl, "{w}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
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
    let (_up, base) = start_api(&env).await;
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
    let unknown = post("{\"task\": \"no.such\"}".into()).await.unwrap();
    let body: serde_json::Value = unknown.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unknown_task", "{body}");
    // The refusal lists what can be enqueued instead, not the internal tasks.
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("builtin.noop"), "{message}");
    assert!(!message.contains("builtin.webhook"), "{message}");
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
    // An integer beyond 64 bits would be kept as a double, a changed value: refused, saying so.
    let wide = post(
        "{\"task\": \"builtin.noop\", \"args\": {\"n\": 123456789012345678901234567890}}".into(),
    )
    .await
    .unwrap();
    assert_eq!(wide.status(), 400);
    let body: serde_json::Value = wide.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_json", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the integer 123456789012345678901234567890 does not fit in 64 bits"),
        "{message}"
    );
    let widest = post("{\"task\": \"builtin.noop\", \"args\": {\"n\": 18446744073709551615}, \"queue\": \"parked\"}".into())
        .await
        .unwrap();
    assert_eq!(widest.status(), 202);
    let job: serde_json::Value = widest.json().await.unwrap();
    assert_eq!(
        job["args"]["n"],
        serde_json::json!(18446744073709551615u64),
        "{job}"
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

/// Bodies from the adversarial pass of issue #17, each refused with its status and code while
/// the server keeps answering, none stored: values nested deeper than can be read back (also
/// once a follow-up nests them further), NUL and bad names (also in follow-ups), homing's
/// internal tasks and queues, and numbers that used to panic the handler or overflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_bodies_are_refused_and_nothing_is_stored() {
    use serde_json::json;
    let env = Env::sqlite();
    let (_up, base) = start_api(&env).await;
    homing::tls::install_crypto_provider();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let deep = |n: usize| homing::validate::nested(n, json!(1));
    let noop = |extra: serde_json::Value| {
        let mut b = json!({"task": "builtin.noop", "queue": "api"});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let table: Vec<(&str, serde_json::Value, u16, &str)> = vec![
        (
            "126 deep with a follow-up",
            noop(json!({"args": deep(126), "on_success": {"task": "builtin.noop"}})),
            400,
            "invalid_request",
        ),
        (
            "65 deep",
            noop(json!({"args": deep(65)})),
            400,
            "invalid_request",
        ),
        (
            "follow-up args 65 deep",
            noop(json!({"on_success": {"task": "builtin.noop", "args": deep(65)}})),
            400,
            "invalid_request",
        ),
        (
            "130 deep (unreadable)",
            noop(json!({"args": deep(130)})),
            400,
            "invalid_json",
        ),
        (
            "NUL in args",
            noop(json!({"args": {"a": "x\u{0}"}})),
            400,
            "invalid_request",
        ),
        (
            "NUL in a key",
            noop(json!({"args": {"a\u{0}": 1}})),
            400,
            "invalid_request",
        ),
        (
            "builtin.http timeout 1e30",
            json!({"task": "builtin.http", "queue": "api",
                   "args": {"url": "http://127.0.0.1:9/", "timeout": "1e30"}}),
            400,
            "invalid_request",
        ),
        (
            "builtin.http timeout 1e30 as a number",
            json!({"task": "builtin.http", "queue": "api",
                   "args": {"url": "http://127.0.0.1:9/", "timeout": 1e30}}),
            400,
            "invalid_request",
        ),
        (
            "builtin.http without a URL",
            json!({"task": "builtin.http", "queue": "api", "args": {}}),
            400,
            "invalid_request",
        ),
        (
            "builtin.sleep with a string",
            json!({"task": "builtin.sleep", "queue": "api", "args": {"ms": "long"}}),
            400,
            "invalid_request",
        ),
        (
            "bad task",
            json!({"task": "no such task!!", "allow_unknown_task": true}),
            400,
            "invalid_request",
        ),
        (
            "NUL queue",
            noop(json!({"queue": "bad queue \u{0} é"})),
            400,
            "invalid_request",
        ),
        (
            "long queue",
            noop(json!({"queue": "q".repeat(129)})),
            400,
            "invalid_request",
        ),
        (
            "bad follow-up",
            noop(json!({"on_success": {"task": "no such task!!", "queue": "bad queue \u{0} é"}})),
            400,
            "invalid_request",
        ),
        (
            "internal task",
            json!({"task": "builtin.webhook", "args": {"subscription": "ops", "event": {"event": "job.dead"}}}),
            400,
            "invalid_request",
        ),
        (
            "internal result task",
            json!({"task": "celery.result", "allow_unknown_task": true}),
            400,
            "invalid_request",
        ),
        (
            "internal queue",
            noop(json!({"queue": "homing.webhooks"})),
            400,
            "invalid_request",
        ),
        (
            "internal follow-up",
            noop(json!({"on_failure": {"task": "builtin.webhook"}})),
            400,
            "invalid_request",
        ),
        (
            "internal follow-up queue",
            noop(json!({"on_success": {"task": "builtin.noop", "queue": "homing.x"}})),
            400,
            "invalid_request",
        ),
        (
            "countdown 1e30",
            noop(json!({"countdown": "1e30"})),
            422,
            "invalid_json",
        ),
        (
            "countdown 1e30 ms",
            noop(json!({"countdown": 1e30})),
            422,
            "invalid_json",
        ),
        (
            "countdown u64::MAX ms",
            noop(json!({"countdown": u64::MAX})),
            400,
            "invalid_request",
        ),
        (
            "countdown 367d",
            noop(json!({"countdown": "367d"})),
            400,
            "invalid_request",
        ),
        (
            "time_limit 1e30",
            noop(json!({"time_limit": "1e30"})),
            422,
            "invalid_json",
        ),
        (
            "time_limit huge",
            noop(json!({"time_limit": "18446744073709551615s"})),
            422,
            "invalid_json",
        ),
        (
            "time_limit 0",
            noop(json!({"time_limit": 0})),
            400,
            "invalid_request",
        ),
        (
            "retry delay 1e30",
            noop(json!({"retry_policy": {"kind": "fixed", "delay": "1e30"}})),
            422,
            "invalid_json",
        ),
        (
            "retry delay huge",
            noop(json!({"retry_policy": {"kind": "fixed", "delay": u64::MAX}})),
            400,
            "invalid_request",
        ),
        (
            "max_crashes 0",
            noop(json!({"max_crashes": 0})),
            400,
            "invalid_request",
        ),
        (
            "max_retries huge",
            noop(json!({"max_retries": u32::MAX})),
            400,
            "invalid_request",
        ),
        (
            "NUL key",
            noop(json!({"idempotency_key": "k\u{0}"})),
            400,
            "invalid_request",
        ),
        (
            "long key",
            noop(json!({"idempotency_key": "k".repeat(513)})),
            400,
            "invalid_request",
        ),
        (
            "callback scheme",
            noop(json!({"callback_url": "file:///etc/passwd"})),
            400,
            "invalid_request",
        ),
        (
            "callback length",
            noop(json!({"callback_url": format!("http://h/{}", "a".repeat(2100))})),
            400,
            "invalid_request",
        ),
    ];
    for (what, body, status, code) in table {
        let resp = http
            .post(format!("{base}/v1/jobs"))
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{what}: no answer (did the handler panic?): {e}"));
        assert_eq!(error_code(resp).await, (status, code.into()), "{what}");
        let health = http.get(format!("{base}/healthz")).send().await.unwrap();
        assert!(
            health.status().is_success(),
            "{what}: server unhealthy after it"
        );
    }
    // Nothing was stored, the queue views never saw the bad names, and the door still opens.
    let jobs: serde_json::Value = http
        .get(format!("{base}/v1/jobs?limit=1000"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(jobs["jobs"], json!([]), "{jobs}");
    let queues = http
        .get(format!("{base}/v1/queues"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !queues.contains("bad queue") && !queues.contains("homing.x"),
        "{queues}"
    );
    let ok = http
        .post(format!("{base}/v1/jobs"))
        .json(&noop(
            json!({"args": deep(60), "on_success": {"task": "builtin.noop"}}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 202);
    let id = ok.json::<serde_json::Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let done: serde_json::Value = eventually(
        Duration::from_secs(30),
        "the deep job to finish",
        || async {
            let j: serde_json::Value = http
                .get(format!("{base}/v1/jobs/{id}"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            (j["state"] == "succeeded").then_some(j)
        },
    )
    .await;
    assert_eq!(
        done["result"],
        deep(60),
        "the deepest accepted args come back as the result"
    );
}

/// `GET /v1/jobs` as a search: each parameter narrows the page, pages follow the cursor, and
/// every hostile value is a 400 naming the parameter, or (a substring's `%` and `_`) plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn search_over_http_finds_jobs_and_refuses_hostile_input() {
    let env = Env::sqlite();
    let (_up, base) = start_api(&env).await;
    let http = http_client();
    // A queue no worker serves, so the jobs stay as enqueued.
    let mut ids = Vec::new();
    for (i, args) in [
        serde_json::json!({"customer": {"id": 7}, "code": "50%_off"}),
        serde_json::json!({"customer": {"id": 8}, "code": "50xyoff"}),
        serde_json::json!({"customer": {"id": 7}, "items": [{"sku": "A-1"}]}),
    ]
    .into_iter()
    .enumerate()
    {
        let resp = http
            .post(format!("{base}/v1/jobs"))
            .json(
                &serde_json::json!({"task": format!("t.search{}", i % 2), "queue": "searchq",
                "args": args, "allow_unknown_task": true}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        let job: serde_json::Value = resp.json().await.unwrap();
        ids.push(job["id"].as_str().unwrap().to_string());
    }
    let found = |query: &str| {
        let url = format!("{base}/v1/jobs?queue=searchq&{query}");
        let query = query.to_string();
        let http = http.clone();
        async move {
            let resp = http.get(url).send().await.unwrap();
            assert_eq!(resp.status(), 200, "{query}");
            let page: serde_json::Value = resp.json().await.unwrap();
            page["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    let (a, b, c) = (ids[0].clone(), ids[1].clone(), ids[2].clone());
    assert_eq!(found("").await, vec![c.clone(), b.clone(), a.clone()]);
    assert_eq!(found("task=t.search0").await, vec![c.clone(), a.clone()]);
    assert_eq!(
        found("args_path=customer.id&args_value=7").await,
        vec![c.clone(), a.clone()]
    );
    assert_eq!(
        found("args_path=items%5B0%5D.sku&args_value=A-1").await,
        vec![c.clone()]
    );
    assert_eq!(found("args_contains=%25_").await, vec![a.clone()]);
    assert_eq!(found(&format!("id={}", &b[..33])).await, vec![b.clone()]);
    assert_eq!(
        found("created_from=2000-01-01T00:00:00Z&created_to=2000-01-02T00:00:00Z").await,
        Vec::<String>::new()
    );
    // Paging: one job a page, newest first, then no cursor.
    let resp: serde_json::Value = http
        .get(format!(
            "{base}/v1/jobs?queue=searchq&args_path=customer.id&args_value=7&limit=1"
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resp["jobs"][0]["id"], c.as_str());
    let next = resp["next_cursor"].as_str().unwrap().to_string();
    let resp: serde_json::Value = http
        .get(format!(
            "{base}/v1/jobs?queue=searchq&args_path=customer.id&args_value=7&limit=1&cursor={next}"
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resp["jobs"][0]["id"], a.as_str());
    assert!(resp["next_cursor"].is_null());

    let long = "x".repeat(2000);
    let deep = vec!["a"; 17].join(".");
    for bad in [
        "id=%25".to_string(),
        "id=' OR 1=1 --".into(),
        "id=0123456789abcdef0123456789abcdef0".into(),
        "created_from=yesterday".into(),
        "created_from=20&created_to=10".into(),
        "args_path=a;DROP TABLE jobs&args_value=1".into(),
        "args_path=a\"b&args_value=1".into(),
        "args_path=a[x]&args_value=1".into(),
        format!("args_path={deep}&args_value=1"),
        "args_path=a".into(),
        "args_value=1".into(),
        "args_path=a&args_value={\"b\":1}".into(),
        format!("args_path=a&args_value={long}"),
        format!("args_contains={long}"),
        "args_contains=a%00b".into(),
        "state=lost".into(),
        "cursor=nope".into(),
        "limit=0".into(),
        "argz=1".into(),
    ] {
        let resp = http
            .get(format!("{base}/v1/jobs?{bad}"))
            .send()
            .await
            .unwrap();
        assert_eq!(error_code(resp).await.0, 400, "{bad}");
    }
}
