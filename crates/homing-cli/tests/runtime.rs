//! Behaviour of real worker processes beyond crashes: retries and durable delays, the
//! idempotency guard, graceful shutdown, bad input, and many processes sharing one SQLite file.

mod support;

use std::time::{Duration, Instant};
use support::*;

use homing::store::ToPublish;
use homing::{EnqueueRequest, JobState, RetryPolicy};

/// Issue 2, test 4a: fails twice then succeeds → attempts = 2, with the retry delay honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retries_honour_their_delay_and_count_attempts() {
    let env = Env::sqlite();
    let counter = Counter::start().await;
    let client = env.client().await;
    let _w = env.worker("w", "retry", &[]);
    let mut r = http_job(&counter.url("fail=2"));
    r.options.queue = Some("retry".into());
    r.options.retry_policy = Some(RetryPolicy::fixed(Duration::from_millis(700)));
    let id = client.enqueue(r).await.unwrap().id;
    let j = wait_state(&client, id, JobState::Succeeded, Duration::from_secs(30)).await;
    assert_eq!(j.attempts, 2);
    assert_eq!(j.epoch, 3);
    assert_eq!(j.crashes, 0);
    let calls = counter.calls(&id.to_string());
    assert_eq!(calls.len(), 3);
    for pair in calls.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(
            gap >= Duration::from_millis(700),
            "retry came after {gap:?}, before its delay"
        );
    }
}

/// A handler error with no retries left fails the job; its `on_failure` follow-up runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exhausted_retries_fail_and_trigger_the_follow_up() {
    let env = Env::sqlite();
    let counter = Counter::start().await;
    let client = env.client().await;
    let _w = env.worker("w", "fu", &[]);
    let mut r = http_job(&counter.url("fail=100"));
    r.options.queue = Some("fu".into());
    r.options.max_retries = Some(1);
    r.options.retry_policy = Some(RetryPolicy::fixed(Duration::from_millis(100)));
    r.options.on_failure = Some(homing::FollowUp {
        task: "builtin.noop".into(),
        queue: Some("fu".into()),
        args: serde_json::json!({"notify": "SUCCESS"}),
    });
    let id = client.enqueue(r).await.unwrap().id;
    let j = wait_state(&client, id, JobState::Failed, Duration::from_secs(30)).await;
    assert_eq!(j.attempts, 2);
    assert!(j.error.unwrap().contains("500"));
    let follow = eventually(
        Duration::from_secs(20),
        "the follow-up to succeed",
        || async {
            let page = client
                .list(
                    &homing::store::JobFilter {
                        task: Some("builtin.noop".into()),
                        ..Default::default()
                    },
                    None,
                    10,
                )
                .await
                .ok()?;
            page.jobs
                .into_iter()
                .find(|f| f.state == JobState::Succeeded)
        },
    )
    .await;
    let result = follow.result.unwrap();
    assert_eq!(result["notify"], "SUCCESS");
    assert_eq!(result["parent"]["id"], id.to_string());
    assert_eq!(result["parent"]["state"], "failed");
}

/// Issue 2, test 4b: a countdown survives the death of every worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn countdown_survives_every_worker_dying() {
    let env = Env::sqlite();
    let counter = Counter::start().await;
    let client = env.client().await;
    let mut w = env.worker("w1", "cd", &[]);
    wait_workers(&client, "cd", 1, Duration::from_secs(20)).await;
    let mut r = http_job(&counter.url(""));
    r.options.queue = Some("cd".into());
    r.options.countdown = Some(Duration::from_secs(2));
    let ins = client.enqueue(r).await.unwrap();
    assert_eq!(ins.state, JobState::Scheduled);
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.kill9();
    // Nobody is alive when the job becomes due.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(client.get(ins.id).await.unwrap().state, JobState::Scheduled);
    assert_eq!(counter.count(&ins.id.to_string()), 0);
    let _w2 = env.worker("w2", "cd", &[]);
    let j = wait_state(
        &client,
        ins.id,
        JobState::Succeeded,
        Duration::from_secs(20),
    )
    .await;
    assert!(
        j.started_at.unwrap() >= j.created_at + 2_000_000,
        "ran before its countdown"
    );
    assert_eq!(counter.count(&ins.id.to_string()), 1);
}

/// Issue 2, test 5: the same idempotency key gives the same job; a duplicate message for a
/// finished job never reaches the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotency_key_and_duplicate_messages() {
    let env = Env::sqlite();
    let client = env.client().await;
    let counter = Counter::start().await;
    let url = counter.url("");
    let args = serde_json::json!({ "url": url }).to_string();
    let (c1, out1, err1) = env.run(&[
        "enqueue",
        "builtin.http",
        "--queue",
        "idem",
        "--args",
        &args,
        "--idempotency-key",
        "order-42",
    ]);
    let (c2, out2, err2) = env.run(&[
        "enqueue",
        "builtin.http",
        "--queue",
        "idem",
        "--args",
        &args,
        "--idempotency-key",
        "order-42",
    ]);
    assert_eq!((c1, c2), (0, 0), "{err1} {err2}");
    assert_eq!(
        out1.trim(),
        out2.trim(),
        "the same key must return the same job"
    );
    assert!(err2.contains("matched existing job"));
    let id: homing::JobId = out1.trim().parse().unwrap();

    let _w = env.worker("w", "idem", &[]);
    let j = wait_state(&client, id, JobState::Succeeded, Duration::from_secs(20)).await;
    assert_eq!(counter.count(&id.to_string()), 1);
    // Redeliver the finished job's message, as a broker replay or a reclaim race would.
    let b = env.backends().await;
    b.broker
        .publish(&[
            ToPublish {
                id,
                queue: "idem".into(),
                priority: 0,
            },
            ToPublish {
                id,
                queue: "idem".into(),
                priority: 0,
            },
        ])
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "the duplicates to be consumed",
        || async {
            let d = b.broker.depths().await.ok()?;
            d.iter().all(|q| q.ready + q.reserved == 0).then_some(())
        },
    )
    .await;
    let after = client.get(id).await.unwrap();
    assert_eq!(
        counter.count(&id.to_string()),
        1,
        "the guard must skip a finished job's duplicate"
    );
    assert_eq!(after.epoch, j.epoch);
    assert_eq!(after.result, j.result);
}

/// Issue 2, test 6: SIGTERM lets a short job finish, and SIGHUP (like SIGTERM) releases a long
/// one to another worker without counting a crash or an attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_finishes_short_jobs_and_releases_long_ones() {
    let env = Env::sqlite();
    let counter = Counter::start().await;
    let client = env.client().await;

    let mut w1 = env.worker("w1", "gs", &["--shutdown-grace", "3s"]);
    wait_workers(&client, "gs", 1, Duration::from_secs(20)).await;
    let mut short = http_job(&counter.url("delay_ms=1000"));
    short.options.queue = Some("gs".into());
    let short_id = client.enqueue(short).await.unwrap().id;
    wait_state(
        &client,
        short_id,
        JobState::Running,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        w1.terminate(Duration::from_secs(10)),
        Some(0),
        "worker exits cleanly"
    );
    let j = client.get(short_id).await.unwrap();
    assert_eq!(
        j.state,
        JobState::Succeeded,
        "the short job finished within the grace"
    );
    assert_eq!(counter.count(&short_id.to_string()), 1);
    assert!(w1.log_text().contains("worker.shutdown"));

    let mut w2 = env.worker("w2", "gs", &["--shutdown-grace", "500ms"]);
    wait_workers(&client, "gs", 1, Duration::from_secs(20)).await;
    let mut long = http_job(&counter.url("delay_ms=3000"));
    long.options.queue = Some("gs".into());
    let long_id = client.enqueue(long).await.unwrap().id;
    let running = wait_state(&client, long_id, JobState::Running, Duration::from_secs(10)).await;
    let first_worker = running.worker.clone().unwrap();
    // A hangup (the terminal or session it was started from went away) stops it as SIGTERM
    // does; it used to kill it, and the job was taken back as crashed.
    assert_eq!(w2.stop_with("-HUP", Duration::from_secs(10)), Some(0));
    assert!(w2.log_text().contains("SIGHUP received"));
    let released = client.get(long_id).await.unwrap();
    assert_eq!(
        released.state,
        JobState::Queued,
        "released back to the queue: {released:?}"
    );
    assert_eq!((released.crashes, released.attempts), (0, 0));
    let _w3 = env.worker("w3", "gs", &[]);
    let done = wait_state(
        &client,
        long_id,
        JobState::Succeeded,
        Duration::from_secs(20),
    )
    .await;
    assert_ne!(
        done.worker.unwrap(),
        first_worker,
        "finished on another worker"
    );
    assert_eq!((done.crashes, done.attempts, done.epoch), (0, 0, 2));
}

/// Issue 2, test 7: bad input gets a clear error or a dead job with the reason; workers keep going.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_is_refused_or_dead_lettered_and_nothing_else_is_lost() {
    let env = Env::sqlite();
    let client = env.client().await;
    // CLI refusals: a clear one-line reason and a non-zero exit, nothing enqueued.
    let (code, _, err) = env.run(&["enqueue", "builtin.noop", "--args", "{not json"]);
    assert_ne!(code, 0);
    assert!(err.contains("--args is not valid JSON"), "{err}");
    let (code, _, err) = env.run(&["enqueue", "no.such.task"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("no worker has registered task 'no.such.task'"),
        "{err}"
    );
    let huge = serde_json::json!({ "blob": "x".repeat(2 * 1024 * 1024) }).to_string();
    let path = env.path().join("huge.json");
    std::fs::write(&path, huge).unwrap();
    let (code, _, err) = env.run(&[
        "enqueue",
        "builtin.noop",
        "--args",
        &format!("@{}", path.display()),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("the limit is"), "{err}");
    assert!(client
        .list(&Default::default(), None, 10)
        .await
        .unwrap()
        .jobs
        .is_empty());

    let _w = env.worker("w", "bad", &[]);
    wait_workers(&client, "bad", 1, Duration::from_secs(20)).await;
    // Garbage rows in the broker table, and a message for a job the store never had.
    let conn = rusqlite::Connection::open(env.db_path()).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    for garbage in ["", "not-a-uuid", "{\"job\": 1}", "\u{0}\u{1}binary"] {
        conn.execute(
            "INSERT INTO messages (queue, payload) VALUES ('bad', ?1)",
            [garbage],
        )
        .unwrap();
    }
    let ghost = homing::job::new_job_id();
    conn.execute(
        "INSERT INTO messages (queue, payload) VALUES ('bad', ?1)",
        [ghost.to_string()],
    )
    .unwrap();
    // An unknown task (let through on purpose), invalid args for a known task, and good jobs.
    let mut unknown = EnqueueRequest::new("not.registered", serde_json::json!({}));
    unknown.options.queue = Some("bad".into());
    let unknown_id = client.enqueue(unknown).await.unwrap().id;
    let mut bad_args = EnqueueRequest::new("builtin.sleep", serde_json::json!({ "ms": "soon" }));
    bad_args.options.queue = Some("bad".into());
    let bad_args_id = client.enqueue(bad_args).await.unwrap().id;
    let good: Vec<_> = (0..20)
        .map(|i| {
            let mut r = EnqueueRequest::new("builtin.noop", serde_json::json!({ "i": i }));
            r.options.queue = Some("bad".into());
            r
        })
        .collect();
    let good_ids: Vec<_> = client
        .enqueue_many(good)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();

    let u = wait_state(&client, unknown_id, JobState::Dead, Duration::from_secs(20)).await;
    assert!(u.error.unwrap().contains("unknown task 'not.registered'"));
    let b = wait_state(
        &client,
        bad_args_id,
        JobState::Failed,
        Duration::from_secs(20),
    )
    .await;
    assert!(b.error.unwrap().contains("invalid args for builtin.sleep"));
    for id in good_ids {
        wait_state(&client, id, JobState::Succeeded, Duration::from_secs(20)).await;
    }
    let backends = env.backends().await;
    let dead = eventually(Duration::from_secs(10), "five dead letters", || async {
        let d = backends.broker.dead_letters(100).await.ok()?;
        (d.len() == 5).then_some(d)
    })
    .await;
    assert!(dead
        .iter()
        .any(|d| d.reason.contains("does not have") && d.payload == ghost.to_string()));
    assert!(
        dead.iter()
            .filter(|d| d.reason.contains("undecodable"))
            .count()
            == 4
    );
}

/// Several worker processes and a server share one SQLite file: every job runs exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_processes_share_one_sqlite_file() {
    let env = Env::sqlite();
    let client = env.client().await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _server = env.spawn("server", &["server", "--listen", &listen]);
    let _workers: Vec<Proc> = (0..3)
        .map(|i| env.worker(&format!("w{i}"), "shared", &["--concurrency", "4"]))
        .collect();
    wait_workers(&client, "shared", 3, Duration::from_secs(20)).await;
    let http = http_client();
    eventually(Duration::from_secs(20), "the server to answer", || async {
        http.get(format!("http://{listen}/healthz"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
    let mut ids = Vec::new();
    let started = Instant::now();
    for i in 0..300 {
        let resp = http
            .post(format!("http://{listen}/v1/jobs"))
            .json(&serde_json::json!({ "task": "builtin.noop", "queue": "shared", "args": { "i": i } }))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        let job: serde_json::Value = resp.json().await.unwrap();
        ids.push(job["id"].as_str().unwrap().parse().unwrap());
    }
    let jobs = wait_all_terminal(&client, &ids, Duration::from_secs(60)).await;
    for (i, j) in jobs.iter().enumerate() {
        assert_eq!(j.state, JobState::Succeeded);
        assert_eq!(j.epoch, 1, "each job started exactly once");
        assert_eq!(j.result.as_ref().unwrap()["i"], i);
    }
    let workers: std::collections::HashSet<_> =
        jobs.iter().filter_map(|j| j.worker.clone()).collect();
    assert!(
        workers.len() >= 2,
        "work was shared between processes ({started:?})"
    );
}

/// A panic and a time-out are handler errors: counted as attempts, retried while the budget
/// lasts, then failed with the reason; the worker survives both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn panics_and_time_limits_are_errors() {
    let env = Env::sqlite();
    let client = env.client().await;
    let mut w = env.worker("w", "errs", &[]);
    let mut panic = EnqueueRequest::new("test.panic", serde_json::json!({}));
    panic.options.queue = Some("errs".into());
    panic.options.max_retries = Some(1);
    panic.options.retry_policy = Some(RetryPolicy::fixed(Duration::from_millis(50)));
    let mut slow = EnqueueRequest::new("builtin.sleep", serde_json::json!({ "ms": 10_000 }));
    slow.options.queue = Some("errs".into());
    slow.options.max_retries = Some(0);
    slow.options.time_limit = Some(Duration::from_millis(300));
    let ids: Vec<_> = client
        .enqueue_many(vec![panic, slow])
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    let p = wait_state(&client, ids[0], JobState::Failed, Duration::from_secs(20)).await;
    assert_eq!((p.attempts, p.crashes, p.epoch), (2, 0, 2));
    assert!(p.error.unwrap().contains("handler panicked: planned panic"));
    let s = wait_state(&client, ids[1], JobState::Failed, Duration::from_secs(20)).await;
    assert_eq!(s.attempts, 1);
    assert!(s.error.unwrap().contains("time limit of 300ms exceeded"));
    let took = s.finished_at.unwrap() - s.started_at.unwrap();
    assert!(
        took < 5_000_000,
        "the handler was not stopped at its time limit ({took} µs)"
    );
    assert!(!w.exited(), "the worker survives panics and time-outs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_deletes_finished_history_and_nothing_else() {
    let env = Env::sqlite();
    let client = env.client().await;
    let mut w = env.worker("w", "ret", &["--retention", "3s"]);
    wait_workers(&client, "ret", 1, Duration::from_secs(20)).await;
    let mut done = EnqueueRequest::new("builtin.noop", serde_json::json!({}));
    done.options.queue = Some("ret".into());
    let mut later = done.clone();
    later.options.countdown = Some(Duration::from_secs(3600));
    let done = client.enqueue(done).await.unwrap().id;
    let later = client.enqueue(later).await.unwrap().id;
    wait_state(&client, done, JobState::Succeeded, Duration::from_secs(20)).await;
    let (code, out, err) = env.run(&["jobs", "get", &done.to_string()]);
    assert_eq!(code, 0, "kept until the retention has passed: {out}{err}");
    // Its timeline (docs/timeline.md), through the CLI: each transition with its worker.
    let (code, out, err) = env.run(&["jobs", "history", &done.to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    let worker = client.get(done).await.unwrap().worker.unwrap();
    for want in ["enqueued", "started", "succeeded", worker.as_str()] {
        assert!(out.contains(want), "{want} in {out}");
    }
    let (code, out, _) = env.run(&["jobs", "history", &done.to_string(), "--json"]);
    assert_eq!(code, 0);
    let h: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(h["entries"].as_array().unwrap().len(), 3, "{h:#}");
    eventually(
        Duration::from_secs(20),
        "the finished job is deleted",
        || async { (env.run(&["jobs", "get", &done.to_string()]).0 != 0).then_some(()) },
    )
    .await;
    let (_, _, err) = env.run(&["jobs", "get", &done.to_string()]);
    assert!(err.contains("not found"), "{err}");
    // Its timeline went with it (the pruner's delete takes the entries in the same transaction).
    assert!(client
        .store()
        .history(done)
        .await
        .unwrap()
        .entries
        .is_empty());
    let (code, _, err) = env.run(&["jobs", "history", &done.to_string()]);
    assert!(code != 0 && err.contains("not found"), "{err}");
    let kept = client.get(later).await.unwrap();
    assert_eq!(kept.state, JobState::Scheduled, "unfinished jobs stay");
    w.wait_log("deleted history older than the retention period")
        .await;
    assert!(!w.exited());
}

/// Issue 17: a job whose stored args cannot be read (nested deeper than the decoder reads, as
/// older versions could write) is made dead with the reason; a good job reserved in the same
/// batch on the same queue still succeeds, and `homing jobs list` still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poisoned_job_does_not_stop_its_queue() {
    let env = Env::sqlite();
    let client = env.client().await;
    let enqueue = |args| {
        let mut r = EnqueueRequest::new("builtin.noop", args);
        r.options.queue = Some("poison".into());
        r
    };
    // Both are queued before any worker runs, so its first reservation takes them together.
    let bad = client
        .enqueue(enqueue(serde_json::json!({"n": 1})))
        .await
        .unwrap()
        .id;
    let good = client
        .enqueue(enqueue(serde_json::json!({"n": 2})))
        .await
        .unwrap()
        .id;
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let db = rusqlite::Connection::open(env.db_path()).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    let n = db
        .execute(
            "UPDATE jobs SET args = ?1 WHERE id = ?2",
            rusqlite::params![deep, bad.to_string()],
        )
        .unwrap();
    assert_eq!(n, 1);
    drop(db);

    let w = env.worker("w", "poison", &[]);
    let j = wait_state(&client, good, JobState::Succeeded, Duration::from_secs(30)).await;
    assert_eq!(j.result, Some(serde_json::json!({"n": 2})));
    let b = wait_state(&client, bad, JobState::Dead, Duration::from_secs(30)).await;
    let error = b.error.unwrap_or_default();
    assert!(error.starts_with("stored args cannot be read"), "{error}");

    // A later job on the same queue runs too.
    let later = client
        .enqueue(enqueue(serde_json::json!({"n": 3})))
        .await
        .unwrap()
        .id;
    wait_state(&client, later, JobState::Succeeded, Duration::from_secs(30)).await;

    let (code, out, err) = env.run(&["jobs", "list", "--queue", "poison", "--json"]);
    assert_eq!(code, 0, "jobs list fails on a poisoned row: {err}");
    assert!(
        out.contains(&bad.to_string()) && out.contains("unreadable"),
        "{out}"
    );
    assert!(
        !w.log_text().contains("cannot start jobs"),
        "the worker failed whole batches:\n{}",
        w.log_text()
    );
}

/// A worker whose standard error nobody reads keeps working: its log lines wait for the pipe,
/// beyond a bound they are dropped and counted, and a warning says how many once the pipe is
/// read again (every job's line is either written or in that count); a panicking job's message
/// waits the same way. Written in place, the first full pipe (64 KiB here, about 500 jobs'
/// lines at `debug`) stopped the worker for good, and a SIGTERM with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_log_is_not_read_keeps_working() {
    use std::io::Read;
    let env = Env::sqlite();
    let client = env.client().await;
    let jobs = |n: usize| -> Vec<EnqueueRequest> {
        (0..n)
            .map(|_| {
                let mut r = EnqueueRequest::new("builtin.noop", serde_json::json!({}));
                r.options.queue = Some("unread".into());
                r
            })
            .collect()
    };
    let succeeded = |n: u64| {
        let client = &client;
        async move {
            eventually(
                Duration::from_secs(120),
                &format!("{n} jobs to succeed"),
                || async {
                    let stats = client.store().queue_stats().await.ok()?;
                    let s = stats.into_iter().find(|s| s.queue == "unread")?;
                    (s.succeeded >= n).then_some(())
                },
            )
            .await
        }
    };
    let start = || {
        env.command(&["worker", "--queue", "unread"])
            .env("HOMING_LOG", "debug")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn homing worker")
    };

    // More lines than the pipe and the queue hold: about 130 bytes a job, 1 MiB queued.
    let mut w = start();
    for chunk in [10_000, 2_000] {
        client.enqueue_batch(jobs(chunk)).await.unwrap();
    }
    succeeded(12_000).await;
    let mut stderr = w.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !text.contains("log lines were dropped") {
        assert!(
            Instant::now() < deadline,
            "no warning of dropped lines; the log's end:\n{}",
            &text[text.len().saturating_sub(2000)..]
        );
        if let Ok(b) = rx.recv_timeout(Duration::from_millis(200)) {
            text.push_str(&String::from_utf8_lossy(&b));
        }
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &w.id().to_string()])
        .status();
    let status = w.wait().unwrap();
    assert!(status.success(), "{status:?}");
    while let Ok(b) = rx.recv_timeout(Duration::from_secs(5)) {
        text.push_str(&String::from_utf8_lossy(&b));
    }
    // Every job's line was either written or counted as dropped.
    let committed = text.matches("job committed").count();
    let dropped: usize = text
        .split("dropped=")
        .skip(1)
        .filter_map(|rest| {
            let n: String = rest.chars().take_while(char::is_ascii_digit).collect();
            n.parse::<usize>().ok()
        })
        .sum();
    assert!(
        dropped > 0 && committed + dropped >= 12_000,
        "{committed} lines of committed jobs written and {dropped} lines reported dropped, \
         for 12,000 jobs"
    );
    assert!(
        text.contains("worker.shutdown"),
        "the lines logged on the way out were written before the exit:\n{}",
        &text[text.len().saturating_sub(2000)..]
    );

    // With the pipe full, jobs that panic: their messages queue like log lines (the standard
    // panic hook would wait for the pipe at the first one), and the jobs after them run.
    let mut w = start();
    client.enqueue_batch(jobs(2_000)).await.unwrap();
    succeeded(14_000).await;
    let mut panics = Vec::new();
    for _ in 0..20 {
        let mut r = EnqueueRequest::new("test.panic", serde_json::json!({}));
        r.options.queue = Some("unread".into());
        r.options.max_retries = Some(0);
        panics.push(client.enqueue(r).await.unwrap().id);
    }
    client.enqueue_batch(jobs(100)).await.unwrap();
    for id in &panics {
        wait_state(&client, *id, JobState::Failed, Duration::from_secs(60)).await;
    }
    succeeded(14_100).await;
    // A SIGTERM while the pipe is still full: the worker stops, the queued lines are given up.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &w.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = w.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the worker did not stop with its log unread"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
}
