//! Bulk enqueue (docs/batch.md) through a real `homing up` and the real `homing` binary:
//! `POST /v1/jobs/batch` answering ids in order, all or nothing, idempotency keys per job, hostile
//! bodies refused with the index at fault, and audited; `homing enqueue --from-file` in chunks,
//! stopping at a bad line with nothing of its chunk stored.

mod support;

use std::io::Write;
use std::time::Duration;
use support::*;

use homing::store::JobFilter;
use homing::JobState;

async fn stored(env: &Env) -> u64 {
    env.backends()
        .await
        .store
        .count(&JobFilter::default())
        .await
        .unwrap()
}

async fn error_of(resp: reqwest::Response) -> (u16, String, String) {
    let status = resp.status().as_u16();
    let body: serde_json::Value = resp.json().await.expect("errors are JSON");
    (
        status,
        body["error"]["code"].as_str().unwrap_or("").to_string(),
        body["error"]["message"].as_str().unwrap_or("").to_string(),
    )
}

fn noop(n: usize) -> serde_json::Value {
    serde_json::json!({"task": "builtin.noop", "args": {"n": n}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_route_is_all_or_nothing_in_order_and_audited() {
    let env = Env::sqlite();
    let (_up, base) = start_up(&env, &[]).await;
    homing::tls::install_crypto_provider();
    // No pooled connections: after refusing a request the server may close its connection.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let url = format!("{base}/v1/jobs/batch");
    let post = |body: serde_json::Value| http.post(&url).json(&body).send();
    let post_raw = |body: String| {
        http.post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    // A key stored before the batch, one repeated inside it, a priority and a countdown.
    let single = http
        .post(format!("{base}/v1/jobs"))
        .json(&serde_json::json!({"task": "builtin.noop", "idempotency_key": "old"}))
        .send()
        .await
        .unwrap();
    assert_eq!(single.status(), 202);
    let old_id = single.json::<serde_json::Value>().await.unwrap()["id"].clone();
    let resp = post(serde_json::json!({"jobs": [
        {"task": "builtin.noop", "idempotency_key": "k"},
        {"task": "builtin.noop", "idempotency_key": "k"},
        {"task": "builtin.noop", "idempotency_key": "old"},
        {"task": "builtin.noop", "priority": 7},
        {"task": "builtin.noop", "countdown": "1h"},
    ]}))
    .await
    .unwrap();
    assert_eq!(resp.status(), 202);
    let body: serde_json::Value = resp.json().await.unwrap();
    let jobs = body["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 5);
    assert_eq!(body["created"], 3);
    let existed: Vec<bool> = jobs.iter().map(|j| j["existed"] == true).collect();
    assert_eq!(existed, [false, true, true, false, false]);
    assert_eq!(jobs[1]["id"], jobs[0]["id"]);
    assert_eq!(jobs[2]["id"], old_id);
    assert_eq!(jobs[4]["state"], "scheduled");
    let client = env.client().await;
    let first: homing::JobId = jobs[0]["id"].as_str().unwrap().parse().unwrap();
    let prio: homing::JobId = jobs[3]["id"].as_str().unwrap().parse().unwrap();
    // Published after the commit: the worker of `homing up` runs them.
    wait_state(&client, first, JobState::Succeeded, Duration::from_secs(60)).await;
    let p = wait_state(&client, prio, JobState::Succeeded, Duration::from_secs(60)).await;
    assert_eq!(p.priority, 7);
    // Sent again: every job exists, nothing new.
    let again = post(serde_json::json!({"jobs": [
        {"task": "builtin.noop", "idempotency_key": "k"},
    ]}))
    .await
    .unwrap();
    assert_eq!(again.status(), 200);
    let before = stored(&env).await;
    assert_eq!(before, 4);

    // The maximum, with one bad job at its last index: refused whole, naming it.
    let mut many: Vec<_> = (0..10_000).map(noop).collect();
    many[9_999] = serde_json::json!({"task": "builtin.noop", "priority": 5000});
    let (status, code, msg) =
        error_of(post(serde_json::json!({"jobs": many})).await.unwrap()).await;
    assert_eq!((status, code.as_str()), (400, "invalid_request"), "{msg}");
    assert!(msg.starts_with("job 9999: "), "{msg}");
    assert_eq!(
        stored(&env).await,
        before,
        "nothing of a refused batch is stored"
    );
    // The maximum itself is taken.
    many[9_999] = noop(9_999);
    let resp = post(serde_json::json!({"jobs": many})).await.unwrap();
    assert_eq!(resp.status(), 202);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["jobs"].as_array().unwrap().len(), 10_000);
    assert_eq!(stored(&env).await, before + 10_000);
    let before = before + 10_000;

    // Hostile bodies: each refused with a reason, nothing stored.
    let refused: Vec<(String, u16, &str, &str)> = vec![
        (r#"{"jobs": []}"#.into(), 400, "invalid_request", "at least one job"),
        (
            serde_json::json!({"jobs": (0..10_001).map(noop).collect::<Vec<_>>()}).to_string(),
            400,
            "invalid_request",
            "at most 10000",
        ),
        (
            r#"{"jobs": [{"task": "builtin.noop"}, 7]}"#.into(),
            422,
            "invalid_json",
            "job 1: ",
        ),
        (
            r#"{"jobs": [{"task": "builtin.noop", "priority": 1e300}]}"#.into(),
            422,
            "invalid_json",
            "job 0: ",
        ),
        (
            r#"{"jobs": [{"task": "builtin.noop", "max_retries": 99999999999999999999999}]}"#
                .into(),
            422,
            "invalid_json",
            "job 0: ",
        ),
        (
            r#"{"jobs": [{"task": "builtin.noop"}, {"task": "builtin.noop", "countdown": "999999999d"}]}"#.into(),
            422,
            "invalid_json",
            "job 1: ",
        ),
        (
            r#"{"jobs": [{"task": "builtin.noop"}, {"task": "builtin.noop", "task": "x"}]}"#
                .into(),
            422,
            "invalid_json",
            "job 1: ",
        ),
        (
            r#"{"jobs": [{"task": "builtin.noop"}, {"task": "builtin.noop", "args": {"n": 123456789012345678901234567890}}]}"#.into(),
            400,
            "invalid_json",
            "job 1: the integer 123456789012345678901234567890 does not fit in 64 bits",
        ),
        (
            r#"{"jobs": [{"task": "builtin.noop"}, {"task": "builtin.noop", "argz": 1}]}"#.into(),
            422,
            "invalid_json",
            "job 1: ",
        ),
        (
            r#"{"jobs": [{"task": "builtin.noop"}, {"task": "builtin.noop"}, {"task": "no.such"}]}"#
                .into(),
            422,
            "unknown_task",
            "job 2: ",
        ),
        (
            r#"{"jobs": [{"task": "builtin.noop", "queue": "homing.internal"}]}"#.into(),
            400,
            "invalid_request",
            "job 0: ",
        ),
        (r#"{"jobs": {"task": "builtin.noop"}}"#.into(), 422, "invalid_json", ""),
        (r#"{"jobz": []}"#.into(), 422, "invalid_json", ""),
        (r#"[{"task": "builtin.noop"}]"#.into(), 422, "invalid_json", ""),
        ("{not json".into(), 400, "invalid_json", ""),
    ];
    for (body, want_status, want_code, want_msg) in refused {
        let shown: String = body.chars().take(80).collect();
        let (status, code, msg) = error_of(post_raw(body).await.unwrap()).await;
        assert_eq!(
            (status, code.as_str()),
            (want_status, want_code),
            "{shown}: {msg}"
        );
        assert!(!msg.is_empty());
        assert!(msg.contains(want_msg), "{shown}: {msg}");
    }
    assert_eq!(stored(&env).await, before);

    // The route takes bodies beyond the other routes' 2 MiB, up to its own limit.
    let big: Vec<_> = (0..2_000)
        .map(|n| serde_json::json!({"task": "builtin.noop", "args": {"pad": "x".repeat(1_500), "n": n}}))
        .collect();
    let resp = post(serde_json::json!({"jobs": big})).await.unwrap();
    assert_eq!(resp.status(), 202);
    // Past it: refused from the declared length alone (sending the body would race the answer).
    let (status, answer) = declared_only(&base, homing_limit() + 1).await;
    assert_eq!(status, 413, "{answer}");

    // Each batch is one audit entry with the number of jobs it created.
    let audit: serde_json::Value = http
        .get(format!("{base}/v1/audit?limit=1000"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries: Vec<_> = audit["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["action"] == "POST /v1/jobs/batch")
        .collect();
    assert!(
        entries
            .iter()
            .any(|e| e["status"] == 202 && e["count"] == 10_000),
        "{entries:?}"
    );
    assert!(entries.iter().any(|e| e["status"] == 400));

    // A paused queue takes a batch as it takes one job: stored, started only once resumed.
    let pause = http
        .post(format!("{base}/v1/queues/default/pause"))
        .send()
        .await
        .unwrap();
    assert!(pause.status().is_success(), "{}", pause.status());
    let resp = post(serde_json::json!({"jobs": [noop(1), noop(2)]}))
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let body: serde_json::Value = resp.json().await.unwrap();
    let held: Vec<homing::JobId> = body["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().parse().unwrap())
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for id in &held {
        assert_eq!(client.get(*id).await.unwrap().state, JobState::Queued);
    }
    let resume = http
        .post(format!("{base}/v1/queues/default/resume"))
        .send()
        .await
        .unwrap();
    assert!(resume.status().is_success(), "{}", resume.status());
    for id in held {
        wait_state(&client, id, JobState::Succeeded, Duration::from_secs(60)).await;
    }
}

/// Sends only the head of a batch POST declaring `len` bytes, and reads the answer.
async fn declared_only(base: &str, len: usize) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/jobs/batch HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
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

/// `BATCH_BODY_LIMIT` of the API (32 MiB).
fn homing_limit() -> usize {
    32 * 1024 * 1024
}

/// The ids' reader gone (`homing enqueue --from-file jobs.jsonl | head -1` once `head` has
/// exited): the command stops and still reports what it stored, so the run can be resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_from_file_reports_what_it_stored_when_its_reader_is_gone() {
    let env = Env::sqlite();
    let (code, _, err) = env.run(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    let path = env.path().join("three.jsonl");
    std::fs::write(&path, "{\"task\": \"builtin.noop\"}\n".repeat(3)).unwrap();
    let (code, err) = env.run_without_reader(&["enqueue", "--from-file", path.to_str().unwrap()]);
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("cannot write the jobs' ids"), "{err}");
    assert!(err.contains("enqueued 3 jobs"), "{err}");
    assert!(err.contains("lines 1 to 3"), "{err}");
    assert_eq!(stored(&env).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_from_file_in_chunks_stops_at_a_bad_line() {
    let env = Env::sqlite();
    // The CLI refuses to create an embedded database: make it first.
    let (code, _, err) = env.run(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    let path = env.path().join("jobs.jsonl");
    let mut f = std::fs::File::create(&path).unwrap();
    for n in 1..=25_000 {
        if n == 100 {
            writeln!(f).unwrap();
        }
        let line = if n == 22_000 {
            r#"{"task": "builtin.noop", "priority": 5000}"#.to_string()
        } else {
            format!(
                r#"{{"task": "builtin.noop", "args": {{"n": {n}}}, "idempotency_key": "f{n}"}}"#
            )
        };
        writeln!(f, "{line}").unwrap();
    }
    drop(f);
    let file = path.to_str().unwrap();
    let (code, out, err) = env.run(&["enqueue", "--from-file", file]);
    assert_ne!(code, 0);
    // 25 000 jobs + 1 blank line: the bad job is on line 22 001, in the third chunk.
    assert!(err.contains("line 22001: "), "{err}");
    assert!(err.contains("priority"), "{err}");
    assert!(err.contains("enqueued 20000 jobs"), "{err}");
    assert!(err.contains("lines 1 to 20001"), "{err}");
    assert_eq!(out.lines().count(), 20_000);
    assert_eq!(stored(&env).await, 20_000);

    // The same file fixed and sent again: the keys make the committed chunks existing jobs.
    let text = std::fs::read_to_string(&path).unwrap().replace(
        r#"{"task": "builtin.noop", "priority": 5000}"#,
        r#"{"task": "builtin.noop", "priority": 5}"#,
    );
    std::fs::write(&path, text).unwrap();
    let (code, out, err) = env.run(&["enqueue", "--from-file", file]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("enqueued 25000 jobs (20000 of them already existed)"),
        "{err}"
    );
    let ids: Vec<&str> = out.lines().collect();
    assert_eq!(ids.len(), 25_000);
    assert_eq!(stored(&env).await, 25_000);
    let client = env.client().await;
    let job = client.get(ids[21_999].parse().unwrap()).await.unwrap();
    assert_eq!(job.priority, 5);

    // Standard input; a line that is not a job object.
    let mut c = env.command(&["enqueue", "--from-file", "-"]);
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"task\": \"builtin.noop\"}\n[1, 2]\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("line 2: not a job"), "{err}");
    assert!(err.contains("nothing was enqueued"), "{err}");
    assert_eq!(stored(&env).await, 25_000);

    // Unknown tasks are refused unless allowed; options per job are not mixed with the file.
    let (code, _, err) = env.run(&["enqueue", "--from-file", file, "--queue", "q"]);
    assert_ne!(code, 0);
    assert!(err.contains("--from-file"), "{err}");
    std::fs::write(&path, "{\"task\": \"no.such\"}\n").unwrap();
    let (code, _, err) = env.run(&["enqueue", "--from-file", file]);
    assert_ne!(code, 0);
    assert!(
        err.contains("line 1: no worker has registered task 'no.such'"),
        "{err}"
    );
    let (code, out, err) = env.run(&["enqueue", "--from-file", file, "--allow-unknown-task"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 1);
}

/// The same file on a PostgreSQL store: a full chunk of 10,000 jobs in one transaction, keys
/// repeated across chunks resolving to the first job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_from_file_on_postgres() {
    let env = Env::sqlite_broker_postgres_store().await;
    // Opening creates the broker's file and migrates the store.
    env.backends().await;
    let path = env.path().join("jobs.jsonl");
    let lines: Vec<String> = (0..10_500)
        .map(|n| {
            format!(
                r#"{{"task": "builtin.noop", "args": {{"n": {n}}}, "idempotency_key": "p{}"}}"#,
                n % 10_200
            )
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let (code, out, err) = env.run(&["enqueue", "--from-file", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("enqueued 10500 jobs (300 of them already existed)"),
        "{err}"
    );
    let ids: Vec<&str> = out.lines().collect();
    assert_eq!(ids.len(), 10_500);
    assert_eq!(ids[10_200], ids[0]);
    assert_eq!(stored(&env).await, 10_200);
}
