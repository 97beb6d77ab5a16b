//! Issue 17, the server half: what a hostile or careless client, producer or disk can do to a
//! running `homing` process, each against the real binary. Slow and idle sockets are cut off
//! while `/healthz` keeps answering; queue names are bounded; outgoing HTTP cannot reach the
//! metadata service or be redirected past the policy; an empty API token and a damaged database
//! file are refused at start.

mod support;

use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How one slow socket ended: whether the server closed it within the limit.
#[derive(Debug)]
struct Ended {
    kind: &'static str,
    closed: bool,
    answer: String,
}

/// Reads until the server closes the socket (EOF or reset) or `limit` passes.
async fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (bool, String) {
    let deadline = tokio::time::Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return (false, String::from_utf8_lossy(&got).into_owned()),
            Ok(Ok(0)) | Ok(Err(_)) => return (true, String::from_utf8_lossy(&got).into_owned()),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A socket that sends `head` and then nothing more.
async fn stalled(addr: &str, kind: &'static str, head: &'static str, limit: Duration) -> Ended {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.expect("send");
    let (closed, answer) = read_until_closed(&mut s, limit).await;
    Ended {
        kind,
        closed,
        answer,
    }
}

/// A request whose body arrives one byte every 300 ms, until the server stops listening.
async fn trickle(addr: &str, limit: Duration) -> Ended {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
    )
    .await
    .expect("send head");
    let start = Instant::now();
    let (rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        while start.elapsed() < limit {
            if wr.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let mut s = rd;
    let deadline = tokio::time::Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => break false,
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    };
    writer.abort();
    Ended {
        kind: "trickled body",
        closed,
        answer: String::from_utf8_lossy(&got).into_owned(),
    }
}

/// A keep-alive connection that asks once, then stays idle.
async fn idle_keep_alive(addr: &str, limit: Duration) -> Ended {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("send");
    let (closed, answer) = read_until_closed(&mut s, limit).await;
    Ended {
        kind: "idle keep-alive",
        closed,
        answer,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_and_idle_clients_are_cut_off_and_healthz_still_answers() {
    let env = Env::sqlite();
    let (_up, base) = start_up_with(
        &env,
        &[
            "--header-timeout",
            "1s",
            "--request-timeout",
            "2s",
            "--max-connections",
            "40",
        ],
        &[],
    )
    .await;
    let addr = base.trim_start_matches("http://").to_string();
    // Far longer than any timeout above: a socket still open then was never cut off.
    let limit = Duration::from_secs(40);
    let mut slow = Vec::new();
    for i in 0..80 {
        let addr = addr.clone();
        slow.push(tokio::spawn(async move {
            match i % 4 {
                0 => stalled(&addr, "partial header", "GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: ", limit).await,
                1 => trickle(&addr, limit).await,
                2 => stalled(
                    &addr,
                    "unterminated chunked body",
                    "POST /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"ta\r\n",
                    limit,
                )
                .await,
                _ => idle_keep_alive(&addr, limit).await,
            }
        }));
    }
    // More slow sockets than the cap are open: the server still answers, on a new connection.
    tokio::time::sleep(Duration::from_millis(300)).await;
    homing::tls::install_crypto_provider();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "/healthz to answer beside 80 slow sockets",
        || async {
            http.get(format!("{base}/healthz"))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
        },
    )
    .await;
    for t in slow {
        let e = t.await.expect("socket task");
        assert!(e.closed, "the server left a slow socket open: {e:?}");
        match e.kind {
            "trickled body" | "unterminated chunked body" => {
                assert!(e.answer.starts_with("HTTP/1.1 408"), "{e:?}");
                assert!(e.answer.contains("request_timeout"), "{e:?}");
            }
            "idle keep-alive" => assert!(e.answer.starts_with("HTTP/1.1 200"), "{e:?}"),
            _ => {}
        }
    }
    // And it keeps serving normally afterwards.
    let r = http.get(format!("{base}/v1/queues")).send().await.unwrap();
    assert!(r.status().is_success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_server_limits_are_refused() {
    let env = Env::sqlite();
    for (args, why) in [
        (["up", "--max-connections", "0"], "0 is not in 1..=100000"),
        (
            ["up", "--header-timeout", "0s"],
            "'0s' is out of range: must be between 10ms",
        ),
        (
            ["server", "--request-timeout", "1ms"],
            "'1ms' is out of range: must be between 10ms",
        ),
    ] {
        let (code, _, err) = env.run(&args);
        assert_ne!(code, 0, "{args:?} must be refused");
        assert!(err.contains(why), "{args:?}: {err}");
    }
}

/// Runs `homing up` expecting it to exit by itself; returns (code, stderr).
fn up_must_exit(env: &Env, vars: &[(&str, &str)]) -> (i32, String) {
    let mut c = env.command(&["up", "--listen", "127.0.0.1:0"]);
    c.envs(vars.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("spawn homing up");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read as _;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (st.code().unwrap_or(-1), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("homing up kept running ({vars:?}): it must refuse to start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_api_token_refuses_to_start() {
    let env = Env::sqlite();
    let (code, err) = up_must_exit(&env, &[("HOMING_API_TOKEN", "")]);
    assert_ne!(code, 0);
    assert!(err.contains("HOMING_API_TOKEN is set but empty"), "{err}");
    let config = env.path().join("config.json");
    std::fs::write(&config, r#"{"api_tokens": ["good-token", "  "]}"#).unwrap();
    let (code, err) = up_must_exit(&env, &[("HOMING_CONFIG", config.to_str().unwrap())]);
    assert_ne!(code, 0);
    assert!(err.contains("empty API token"), "{err}");
    // No secret in the message.
    assert!(!err.contains("good-token"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_database_file_refuses_to_start() {
    let env = Env::sqlite();
    {
        let client = env.client().await;
        let padding = "x".repeat(2000);
        for i in 0..1500 {
            client
                .enqueue(homing::EnqueueRequest::new(
                    "builtin.noop",
                    serde_json::json!({ "i": i, "pad": padding }),
                ))
                .await
                .expect("enqueue");
        }
    }
    // Everything into the main file, so the damage lands on live pages.
    let conn = rusqlite::Connection::open(env.db_path()).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    let len = std::fs::metadata(env.db_path()).unwrap().len();
    assert!(len > 1_000_000, "the database holds the jobs: {len} bytes");
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(env.db_path())
            .unwrap();
        // 64 KiB of garbage at a 4 KiB boundary: whole pages at 2 KiB (new files) or 4 KiB.
        let page = 4096;
        let start = (len / 2) / page * page;
        f.seek(SeekFrom::Start(start)).unwrap();
        let garbage: Vec<u8> = (0..16 * page).map(|i| (i * 7919 % 251) as u8).collect();
        f.write_all(&garbage).unwrap();
        f.sync_all().unwrap();
    }
    let (code, err) = up_must_exit(&env, &[]);
    assert_ne!(code, 0);
    assert!(err.contains("is damaged"), "{err}");
    assert!(err.contains(&env.db_path().display().to_string()), "{err}");
    assert!(err.contains("quick_check"), "{err}");
    // A one-shot command does not read every page first (a second at a million jobs): it is
    // not refused at open; one that meets a damaged page says the file is damaged.
    let (code, out, err) = env.run(&["jobs", "list", "--limit", "1"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = env.run(&["jobs", "list", "--limit", "1000", "--json"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("the database file is damaged"), "{err}");
    assert!(!err.contains("quick_check"), "{err}");
}

/// The database file removed from under a running server (`rm homing.db*`). Before, the server
/// went on answering 202 to enqueues into the removed file (or 500, when a read opened a new,
/// empty file at the path) and every job it accepted so was gone at its next start. Now its
/// calls are refused with the reason within a second, every job it accepted is in the copy it
/// saves beside the path, and the copy moved back holds them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_file_removed_under_the_server_loses_no_accepted_job() {
    let env = Env::sqlite();
    let (mut up, base) = start_up(&env, &[]).await;
    let http = http_client();
    let enqueue = |i: usize| {
        http.post(format!("{base}/v1/jobs"))
            .json(&serde_json::json!({"task": "builtin.noop", "queue": "parked", "args": {"i": i}}))
            .send()
    };
    let mut accepted = Vec::new();
    for i in 0..20 {
        let r = enqueue(i).await.unwrap();
        assert_eq!(r.status(), 202, "{:?}", r.text().await);
        let job: serde_json::Value = r.json().await.unwrap();
        accepted.push(job["id"].as_str().unwrap().to_string());
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut p = env.db_path().into_os_string();
        p.push(suffix);
        std::fs::remove_file(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    }
    let started = Instant::now();
    let refused = loop {
        let r = enqueue(accepted.len()).await.unwrap();
        if r.status() != 202 {
            break (r.status(), r.text().await.unwrap());
        }
        let job: serde_json::Value = r.json().await.unwrap();
        accepted.push(job["id"].as_str().unwrap().to_string());
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still accepting jobs into the removed file: {} since",
            accepted.len() - 20
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(refused.0, 503, "{}", refused.1);
    assert!(refused.1.contains("\"unavailable\""), "{}", refused.1);
    up.wait_log("was removed or replaced while this process had it open")
        .await;
    up.wait_log("saved what").await;
    let saved: Vec<_> = std::fs::read_dir(env.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("homing.db.removed-"))
        .collect();
    assert_eq!(saved.len(), 1, "one copy and no part left: {saved:?}");
    assert!(up.log_text().contains(&saved[0].display().to_string()));
    up.terminate(Duration::from_secs(10));

    // Put back as the log says, every accepted job is there.
    for suffix in ["", "-wal", "-shm"] {
        let mut p = env.db_path().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(&p);
    }
    std::fs::rename(&saved[0], env.db_path()).unwrap();
    let (_up, base) = start_up(&env, &[]).await;
    for id in &accepted {
        let r = http
            .get(format!("{base}/v1/jobs/{id}"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            200,
            "job {id} accepted before the refusal is lost"
        );
    }
}

/// The embedded file's write lock held by another program past the heartbeat TTL (an `sqlite3`
/// shell with a transaction left open, a backup tool, a long write): nobody can write, so no
/// worker can refresh its heartbeat. Before, once the lock was free every running job was taken
/// for a crash, reclaimed and run again (by hand: 6 of 6 jobs of `homing up`, a 3 s hold, a
/// 600 ms TTL). Now the time nobody could write does not count against a heartbeat, in the
/// server's own workers and in a worker process of its own: each job runs once, no crash counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_past_the_heartbeat_ttl_is_not_taken_for_crashes() {
    let env = Env::sqlite();
    let (up, _base) = start_up(&env, &[]).await;
    let other = env.worker("other", "other", &[]);
    let client = env.client().await;
    wait_workers(&client, "other", 1, Duration::from_secs(30)).await;
    let mut ids = Vec::new();
    for queue in ["default", "default", "default", "default", "other", "other"] {
        let mut req = homing::EnqueueRequest::new("builtin.sleep", serde_json::json!({"ms": 5000}));
        req.options.queue = Some(queue.to_string());
        ids.push(client.enqueue(req).await.unwrap().id);
    }
    for id in &ids {
        wait_state(
            &client,
            *id,
            homing::JobState::Running,
            Duration::from_secs(30),
        )
        .await;
    }
    // Five times the TTL (3 x 200 ms).
    let db = env.db_path();
    tokio::task::spawn_blocking(move || {
        let c = rusqlite::Connection::open(db).unwrap();
        c.busy_timeout(Duration::from_secs(30)).unwrap();
        c.execute_batch("BEGIN IMMEDIATE").unwrap();
        std::thread::sleep(Duration::from_secs(3));
        c.execute_batch("COMMIT").unwrap();
    })
    .await
    .unwrap();
    let jobs = wait_all_terminal(&client, &ids, Duration::from_secs(60)).await;
    let logs = || format!("{}\n{}", up.log_text(), other.log_text());
    for j in &jobs {
        assert_eq!(j.state, homing::JobState::Succeeded, "{j:?}");
        assert_eq!(
            j.crashes,
            0,
            "the held lock was taken for a crash: {j:?}\n{}",
            logs()
        );
        assert_eq!(j.epoch, 1, "started more than once: {j:?}\n{}", logs());
    }
    for p in [&up, &other] {
        assert!(
            !p.log_text().contains("presumed dead"),
            "{}: {}",
            p.name,
            p.log_text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queue_names_are_bounded_and_the_list_is_paged() {
    let env = Env::sqlite();
    let (_up, base) = start_up_with(&env, &[], &[("HOMING_MAX_QUEUES", "4")]).await;
    let http = http_client();
    let post = |queue: String| {
        let http = http.clone();
        let base = base.clone();
        async move {
            http.post(format!("{base}/v1/jobs"))
                .json(&serde_json::json!({"task": "builtin.noop", "queue": queue}))
                .send()
                .await
                .unwrap()
        }
    };
    // `default` (the up's worker queue) may or may not be registered yet: fill up to the limit.
    let mut accepted = Vec::new();
    let mut refused = None;
    for i in 0..6 {
        let q = format!("q{i}");
        let r = post(q.clone()).await;
        if r.status().is_success() {
            accepted.push(q);
        } else {
            assert_eq!(r.status(), 400);
            let body: serde_json::Value = r.json().await.unwrap();
            let msg = body["error"]["message"].as_str().unwrap().to_string();
            assert!(msg.contains("too many queues"), "{body}");
            refused = Some(q);
        }
    }
    assert!(refused.is_some(), "a new queue over the limit is refused");
    assert!((3..=4).contains(&accepted.len()), "{accepted:?}");
    for q in &accepted {
        assert!(post(q.clone()).await.status().is_success(), "existing {q}");
    }
    // The CLI, writing to the store itself with the same limit, says the same and exits non-zero.
    let out = env
        .command(&["enqueue", "builtin.noop", "--queue", "brand-new"])
        .env("HOMING_MAX_QUEUES", "4")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("too many queues"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    // Pages by name.
    let page = |q: &str| {
        let http = http.clone();
        let url = format!("{base}/v1/queues?{q}");
        async move {
            let r = http.get(url).send().await.unwrap();
            let status = r.status();
            (status, r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (_, all) = page("").await;
    let names: Vec<String> = all["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["queue"].as_str().unwrap().to_string())
        .collect();
    assert!(all["next"].is_null());
    let (_, first) = page("limit=2").await;
    assert_eq!(first["queues"].as_array().unwrap().len(), 2);
    let next = first["next"].as_str().expect("a next page").to_string();
    let (_, second) = page(&format!("limit=100&after={next}")).await;
    assert!(second["next"].is_null());
    let mut paged: Vec<String> = first["queues"]
        .as_array()
        .unwrap()
        .iter()
        .chain(second["queues"].as_array().unwrap())
        .map(|q| q["queue"].as_str().unwrap().to_string())
        .collect();
    paged.dedup();
    assert_eq!(paged, names);
    let (status, body) = page("limit=0").await;
    assert_eq!(status, 400, "{body}");
}

/// A local server that answers every request with a redirect to `to`.
async fn redirector(to: String) -> std::net::SocketAddr {
    let app = axum::Router::new().fallback(move || {
        let to = to.clone();
        async move { axum::response::Redirect::temporary(&to) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

async fn wait_finished(base: &str, id: &str) -> serde_json::Value {
    let http = http_client();
    eventually(Duration::from_secs(60), "the job to finish", || async {
        let j: serde_json::Value = http
            .get(format!("{base}/v1/jobs/{id}"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        matches!(j["state"].as_str(), Some("succeeded" | "failed" | "dead")).then_some(j)
    })
    .await
}

async fn http_job(base: &str, url: &str) -> serde_json::Value {
    let r = http_client()
        .post(format!("{base}/v1/jobs"))
        .json(&serde_json::json!({"task": "builtin.http", "args": {"url": url}, "max_retries": 3}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let job: serde_json::Value = r.json().await.unwrap();
    wait_finished(base, job["id"].as_str().unwrap()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outgoing_http_obeys_the_egress_policy() {
    let env = Env::sqlite();
    // Only 127.0.0.1 is allowed: the rest of loopback stands in for an internal network.
    let hooks = r#"[{"name": "meta", "url": "http://169.254.169.254/hook", "format": "json",
                     "events": ["worker.ready"]}]"#;
    let (_up, base) = start_up_with(
        &env,
        &[],
        &[
            ("HOMING_HTTP_ALLOW", "127.0.0.1/32"),
            ("HOMING_WEBHOOKS", hooks),
        ],
    )
    .await;
    let counter = Counter::start().await;

    // Allowed: the counter on 127.0.0.1.
    let ok = http_job(&base, &counter.url("k=ok")).await;
    assert_eq!(ok["state"], "succeeded", "{ok}");

    // The metadata service: refused before any connection, failed at once without retries.
    let meta = http_job(&base, "http://169.254.169.254/latest/meta-data/").await;
    assert_eq!(meta["state"], "failed", "{meta}");
    assert!(
        meta["error"].as_str().unwrap().contains("refused"),
        "{meta}"
    );
    assert_eq!(meta["attempts"], 1, "a refusal is not retried: {meta}");

    // A redirect from the allowed host to a refused address is not followed.
    let internal = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind 127.0.0.2 (loopback)");
    let internal_addr = internal.local_addr().unwrap();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = internal.accept().await {
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let hop = redirector(format!("http://{internal_addr}/secret")).await;
    let redirected = http_job(&base, &format!("http://{hop}/start")).await;
    assert_eq!(redirected["state"], "failed", "{redirected}");
    assert!(
        redirected["error"].as_str().unwrap().contains("refused"),
        "{redirected}"
    );
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0);

    // Webhook deliveries obey the same policy: refused, failed without retries.
    let http = http_client();
    let delivery = eventually(Duration::from_secs(60), "the refused delivery", || async {
        let page: serde_json::Value = http
            .get(format!("{base}/v1/jobs?task=builtin.webhook&state=failed"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        page["jobs"].as_array()?.first().cloned()
    })
    .await;
    assert!(
        delivery["error"].as_str().unwrap().contains("refused"),
        "{delivery}"
    );
    assert_eq!(delivery["attempts"], 1, "{delivery}");

    // Callback URLs are checked at enqueue.
    let r = http_client()
        .post(format!("{base}/v1/jobs"))
        .json(&serde_json::json!({"task": "builtin.noop",
                                  "callback_url": "http://169.254.169.254/latest/meta-data/"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("callback_url refused"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loopback_is_allowed_only_when_configured() {
    let env = Env::sqlite();
    let counter = Counter::start().await;
    // An empty allow list: loopback refused, by address and by name.
    let (mut up, base) = start_up_with(&env, &[], &[("HOMING_HTTP_ALLOW", "")]).await;
    let refused = http_job(&base, &counter.url("k=no")).await;
    assert_eq!(refused["state"], "failed", "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("loopback"),
        "{refused}"
    );
    let port = counter.addr.port();
    let by_name = http_job(&base, &format!("http://localhost:{port}/call?k=name")).await;
    assert_eq!(by_name["state"], "failed", "{by_name}");
    assert_eq!(counter.total(), 0, "nothing reached the loopback server");
    up.terminate(Duration::from_secs(20));

    // `homing up` on its embedded store allows loopback by default (the README's tour). The
    // harness sets HOMING_HTTP_ALLOW=loopback for every process: this one runs without it.
    let env = Env::sqlite();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut cmd = env.command(&["up", "--listen", &listen, "--heartbeat-interval", "200ms"]);
    cmd.env_remove("HOMING_HTTP_ALLOW")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let child = cmd.spawn().expect("spawn up");
    let _default = Proc::adopt(child, env.path().join("up.log"), "up-default");
    let base = format!("http://{listen}");
    let http = http_client();
    eventually(Duration::from_secs(30), "homing up to answer", || async {
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    let ok = http_job(&base, &counter.url("k=default")).await;
    assert_eq!(ok["state"], "succeeded", "{ok}");
    assert_eq!(counter.total(), 1);
}

/// Slow requests at once take at most the requests' share of the embedded store's threads
/// (homing::requests): an args search with no match reads every row, and 600 such searches at
/// once at a million jobs filled the blocking pool a `homing up`'s workers need; it ran no job
/// for minutes. Here another connection holds the file's write lock while eight times the share
/// of enqueues arrive: each would hold a thread while it waits for the lock, so the process's
/// threads grow by at most the share (and the few its own loops use while they wait too); once
/// the lock is let go every enqueue is answered and its job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_requests_take_only_their_share_of_the_store() {
    let env = Env::sqlite();
    let (up, base) = start_up_with(&env, &["--request-timeout", "10m"], &[]).await;
    let share = homing::requests::budget();
    let http = http_client();
    let known = env
        .client()
        .await
        .enqueue(homing::EnqueueRequest::new(
            "builtin.noop",
            serde_json::json!({}),
        ))
        .await
        .unwrap()
        .id;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = thread_count(up.pid());
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let db = env.db_path();
    let released = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let released_by_holder = released.clone();
    let holder = std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(db).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        locked_tx.send(()).unwrap();
        let _ = release_rx.recv_timeout(Duration::from_secs(20));
        conn.execute_batch("COMMIT").unwrap();
        released_by_holder.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    locked_rx.recv().unwrap();
    let posts: Vec<_> = (0..8 * share)
        .map(|_| {
            let post = http
                .post(format!("{base}/v1/jobs"))
                .json(&serde_json::json!({"task": "builtin.noop"}))
                .send();
            tokio::spawn(async move {
                let r = post.await.expect("enqueue answered");
                let status = r.status();
                let body: serde_json::Value = r.json().await.unwrap_or_default();
                (status, body)
            })
        })
        .collect();
    let mut most = before;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        most = most.max(thread_count(up.pid()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Reads are answered while the writes wait (they have permits of their own), and the
    // health check too (outside the budget): both before the lock is let go.
    let r = http
        .get(format!("{base}/v1/jobs/{known}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        !released.load(std::sync::atomic::Ordering::SeqCst),
        "a read waited for the writes behind the lock"
    );
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    assert!(
        most <= before + share + 16,
        "{} enqueues waiting for the lock took {} more threads (from {before}); the share is {share}",
        8 * share,
        most - before
    );
    let client = env.client().await;
    for p in posts {
        let (status, body) = p.await.unwrap();
        assert_eq!(status, 202, "{body}");
        let id: homing::JobId = body["id"].as_str().unwrap().parse().unwrap();
        wait_state(
            &client,
            id,
            homing::JobState::Succeeded,
            Duration::from_secs(60),
        )
        .await;
    }
}

/// Large answers are made off the runtime's threads: a page of jobs with a megabyte of args
/// each is tens of megabytes of JSON, and a few such requests at once held `homing up`'s
/// runtime threads long enough that its workers' heartbeats expired and a running job was
/// taken back as crashed. Here a job sleeps 5 s while eight clients fetch such pages again and again
/// (heartbeats every 200 ms); it ends succeeded, with no crash counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_answers_do_not_hold_up_heartbeats() {
    let env = Env::sqlite();
    {
        let client = env.client().await;
        let zeros = vec![0u8; 400_000];
        let reqs: Vec<_> = (0..6)
            .map(|i| {
                let mut r = homing::EnqueueRequest::new(
                    "builtin.noop",
                    serde_json::json!({"i": i, "zeros": zeros}),
                );
                r.options.queue = Some("parked".into());
                r
            })
            .collect();
        client.enqueue_batch(reqs).await.expect("enqueue the rows");
    }
    let (_up, base) = start_up(&env, &[]).await;
    let client = env.client().await;
    let id = client
        .enqueue(homing::EnqueueRequest::new(
            "builtin.sleep",
            serde_json::json!({"ms": 5000}),
        ))
        .await
        .expect("enqueue the sleeper")
        .id;
    wait_state(
        &client,
        id,
        homing::JobState::Running,
        Duration::from_secs(30),
    )
    .await;
    let until = Instant::now() + Duration::from_secs(5);
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let http = http_client();
            let url = format!("{base}/v1/jobs?queue=parked&limit=6");
            tokio::spawn(async move {
                let mut pages = 0;
                while Instant::now() < until {
                    let r = http.get(&url).send().await.expect("page answered");
                    assert_eq!(r.status(), 200);
                    // Not parsed here: the test's own CPU would compete with the server's.
                    let page = r.bytes().await.unwrap();
                    assert!(page.len() > 6 * 400_000, "{} bytes", page.len());
                    pages += 1;
                }
                pages
            })
        })
        .collect();
    let mut pages = 0;
    for r in readers {
        pages += r.await.unwrap();
    }
    let job = wait_state(
        &client,
        id,
        homing::JobState::Succeeded,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        (job.crashes, job.epoch),
        (0, 1),
        "the sleeper was taken back while {pages} large pages were read"
    );
}

/// Job event streams are exempt from the request timeout, so a client that opened as many as
/// the server has connections held every one for as long as it liked. At most half the
/// connections carry streams: the one past that gets 503 `too_many_streams`, the API still
/// answers beside them, and a closed stream frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn event_streams_leave_connections_for_the_api() {
    let env = Env::sqlite();
    let (_up, base) = start_up_with(&env, &["--max-connections", "8"], &[]).await;
    let http = http_client();
    let mut parked = homing::EnqueueRequest::new("builtin.noop", serde_json::json!({}));
    parked.options.queue = Some("parked".into());
    let id = env.client().await.enqueue(parked).await.unwrap().id;
    let url = format!("{base}/v1/jobs/{id}/events");
    let mut open = Vec::new();
    for _ in 0..4 {
        let r = http.get(&url).send().await.expect("stream opened");
        assert_eq!(r.status(), 200);
        open.push(r);
    }
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_streams", "{body}");
    let r = http
        .get(format!("{base}/v1/jobs/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the API answers beside the streams");
    drop(open.pop());
    eventually(
        Duration::from_secs(10),
        "a closed stream's place",
        || async {
            let r = http.get(&url).send().await.ok()?;
            (r.status() == 200).then_some(r)
        },
    )
    .await;
}
