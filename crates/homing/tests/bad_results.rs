//! What handlers hand back is checked before it is committed (issue #17): a result nested
//! deeper than can be read back, or holding U+0000, fails its job with the reason instead of
//! being stored; error texts are scrubbed and cut; progress messages too; and a `builtin.http`
//! response that could not be stored as JSON is kept as text, so its job finishes, and one far
//! larger than what is kept is read only that far. Each job reads back afterwards, and the
//! worker goes on with the next one.

use std::time::Duration;

use homing::validate::{nested, MAX_DEPTH, MAX_ERROR_BYTES};
use homing::{
    Backends, Client, Context, EnqueueRequest, JobState, Registry, TaskDefaults, TaskError, Worker,
    WorkerConfig,
};
use serde_json::{json, Value};

/// A loopback HTTP server answering every request with 200 and `body`.
async fn serve_once_per_request(body: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = sock.read(&mut buf).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(body.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}/")
}

/// A loopback HTTP server that announces `len` bytes of body and sends zeros until the client
/// goes away or all are sent; counts what it got out, and says when it is done.
async fn serve_huge(
    len: u64,
) -> (
    String,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
    tokio::sync::oneshot::Receiver<()>,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let counted = sent.clone();
    tokio::spawn(async move {
        let Ok((mut sock, _)) = listener.accept().await else {
            return;
        };
        let mut buf = [0u8; 4096];
        let _ = sock.read(&mut buf).await;
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
        );
        let _ = sock.write_all(head.as_bytes()).await;
        let zeros = vec![b'0'; 64 * 1024];
        while counted.load(Ordering::Relaxed) < len {
            if sock.write_all(&zeros).await.is_err() {
                break;
            }
            counted.fetch_add(zeros.len() as u64, Ordering::Relaxed);
        }
        let _ = done_tx.send(());
    });
    (format!("http://{addr}/"), sent, done_rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unstorable_results_fail_their_job_and_nothing_is_poisoned() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/homing.db", dir.path().display());
    let backends = Backends::open(&url, &url).await.unwrap();
    let client = Client::new(backends.broker.clone(), backends.store.clone());

    let mut tasks = Registry::new();
    let d = TaskDefaults::default;
    tasks.register_fn("t.deep", d(), |_c: Context, _a: Value| async {
        Ok(nested(MAX_DEPTH + 60, json!(1)))
    });
    tasks.register_fn("t.nul", d(), |_c: Context, _a: Value| async {
        Ok(json!({"text": "a\u{0}b"}))
    });
    tasks.register_fn("t.deepest", d(), |_c: Context, _a: Value| async {
        Ok(nested(MAX_DEPTH, json!(1)))
    });
    tasks.register_fn("t.error", d(), |_c: Context, _a: Value| async {
        Err::<Value, _>(TaskError::fatal("x\u{0}".repeat(100_000)))
    });
    tasks.register_fn("t.progress", d(), |c: Context, _a: Value| async move {
        c.progress(f64::NAN, "p\u{0}".repeat(10_000)).await;
        Ok(json!("done"))
    });
    // The deep body comes from a server on loopback, which the default policy refuses.
    homing::egress::install(homing::egress::Policy::parse("loopback", "").unwrap());
    tasks.register(homing::builtin::http::Http);
    let worker = Worker::new(
        backends.broker.clone(),
        backends.store.clone(),
        tasks,
        WorkerConfig {
            heartbeat_interval: Duration::from_millis(200),
            ..WorkerConfig::default()
        },
    );
    let stop = homing::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));

    let deep_body = format!("{}{}", "[".repeat(127), "]".repeat(127));
    let http = serve_once_per_request(deep_body.clone()).await;
    let enqueue = |task: &str, args: Value| {
        let mut r = EnqueueRequest::new(task, args);
        // The follow-up nests the parent's result two levels deeper still.
        r.options.on_success = Some(homing::FollowUp {
            task: "t.deepest".into(),
            queue: None,
            args: Value::Null,
        });
        let client = client.clone();
        async move { client.enqueue(r).await.unwrap().id }
    };
    let deep = enqueue("t.deep", json!({})).await;
    let nul = enqueue("t.nul", json!({})).await;
    let deepest = enqueue("t.deepest", json!({})).await;
    let error = enqueue("t.error", json!({})).await;
    let progress = enqueue("t.progress", json!({})).await;
    let http_job = enqueue("builtin.http", json!({"url": http})).await;

    let wait = |id| {
        let client = client.clone();
        async move { client.wait(id, Duration::from_secs(30)).await.unwrap() }
    };
    let j = wait(deep).await;
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    assert!(
        j.error
            .as_deref()
            .unwrap()
            .contains("nested deeper than 64"),
        "{:?}",
        j.error
    );
    assert_eq!(j.result, None);
    let j = wait(nul).await;
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    assert!(
        j.error.as_deref().unwrap().contains("U+0000"),
        "{:?}",
        j.error
    );
    let j = wait(deepest).await;
    assert_eq!(j.state, JobState::Succeeded, "{j:?}");
    assert_eq!(j.result, Some(nested(MAX_DEPTH, json!(1))));
    let j = wait(error).await;
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    let e = j.error.unwrap();
    assert!(
        e.len() <= MAX_ERROR_BYTES && !e.contains('\0'),
        "{}",
        e.len()
    );
    let j = wait(progress).await;
    assert_eq!(j.state, JobState::Succeeded, "{j:?}");
    let p = j.progress.unwrap();
    assert_eq!(p["fraction"], 0.0);
    assert!(!p["message"].as_str().unwrap().contains('\0'));
    let j = wait(http_job).await;
    assert_eq!(j.state, JobState::Succeeded, "{j:?}");
    assert_eq!(j.result.unwrap()["body"], json!(deep_body));

    // A response far larger than what is kept is read only as far as it is kept: the server
    // sees the connection closed after about a megabyte (and what the sockets buffer), not
    // the 256 MiB it announced, which a worker once read whole into memory.
    let (huge, sent, done) = serve_huge(256 << 20).await;
    let huge_job = client
        .enqueue(EnqueueRequest::new(
            "builtin.http",
            json!({"url": huge, "timeout": "60s"}),
        ))
        .await
        .unwrap()
        .id;
    let j = wait(huge_job).await;
    assert_eq!(j.state, JobState::Succeeded, "{j:?}");
    let result = j.result.unwrap();
    assert_eq!(result["truncated"], json!(true));
    assert_eq!(result["body"].as_str().map(str::len), Some(1024 * 1024));
    tokio::time::timeout(Duration::from_secs(30), done)
        .await
        .expect("the server's connection ends")
        .unwrap();
    let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sent < 32 << 20, "the server got {sent} bytes out");

    // The follow-ups of the deepest accepted result (nested further) ran and read back too,
    // and nothing anywhere is left unreadable: every job lists and reads.
    let page = client
        .list(&Default::default(), None, 1000)
        .await
        .expect("every stored job reads back");
    for j in &page.jobs {
        client.get(j.id).await.expect("reads back");
    }
    let followups: Vec<_> = page
        .jobs
        .iter()
        .filter(|j| j.args.get("parent").is_some())
        .collect();
    assert!(!followups.is_empty());
    stop.cancel();
    running.await.unwrap().unwrap();
}
