//! Workflows with real processes (docs/workflows.md): a fan-in whose workers are killed with
//! SIGKILL, failure propagation and `run_on: any`, the workflow's cancel, validation errors over
//! HTTP, and the same fan-in on Redis + PostgreSQL behind two servers. An external counter of
//! handler calls (keyed by job id: `builtin.http` sends it as the Idempotency-Key) witnesses
//! that the final step ran once, after every parent's call.

#[path = "../../homing/tests/support/redis_server.rs"]
mod redis_server;
mod support;

use std::time::Duration;
use support::*;

use homing::workflow::{StepSpec, WorkflowSpec, WorkflowState};
use homing::JobState;
use redis_server::{unique_prefix, RedisServer};
use serde_json::json;

const PARENTS: usize = 30;

fn http_step(url: &str, queue: &str) -> StepSpec {
    let mut s = StepSpec::new("builtin.http", json!({ "url": url, "timeout": "30s" }));
    s.queue = Some(queue.into());
    s
}

/// 30 parallel steps feeding one final step; the first worker is killed twice while the
/// parents run. The final step runs exactly once, after all 30 succeeded.
async fn fan_in_through_kills(env: Env, servers: usize) {
    let counter = Counter::start().await;
    let client = env.client().await;
    let queue = "fan";
    let mut procs: Vec<Proc> = Vec::new();
    let mut bases = Vec::new();
    for i in 0..servers {
        let listen = format!("127.0.0.1:{}", free_port());
        procs.push(env.spawn(
            &format!("server{i}"),
            &["server", "--listen", &listen, "--rescue-interval", "200ms"],
        ));
        bases.push(format!("http://{listen}"));
    }
    let mut first = env.worker("w0-0", queue, &["--concurrency", "4"]);
    procs.push(env.worker("w1", queue, &["--concurrency", "4"]));
    wait_workers(&client, queue, 2, Duration::from_secs(30)).await;

    let mut spec = WorkflowSpec::new("fan-in");
    let names: Vec<String> = (0..PARENTS).map(|i| format!("p{i:02}")).collect();
    for n in &names {
        spec = spec.with_step(n, http_step(&counter.url("delay_ms=300"), queue));
    }
    let mut last = http_step(&counter.url(""), queue);
    last.after = names.clone();
    spec = spec.with_step("final", last);

    let created = if let Some(base) = bases.first() {
        // Through one server's API; read back through the other.
        let http = http_client();
        eventually(Duration::from_secs(30), "the server to answer", || async {
            http.get(format!("{base}/healthz"))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
        })
        .await;
        let r = http
            .post(format!("{base}/v1/workflows"))
            .json(&json!({ "name": spec.name, "steps": spec.steps }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        serde_json::from_value::<homing::client::CreatedWorkflow>(r.json().await.unwrap()).unwrap()
    } else {
        client.create_workflow(spec).await.unwrap()
    };
    let final_id = created.steps["final"];

    for (round, calls) in [(1, 4), (2, 12)] {
        eventually(Duration::from_secs(60), "parents to be called", || async {
            (counter.total() >= calls).then_some(())
        })
        .await;
        first.kill9();
        first = env.worker(&format!("w0-{round}"), queue, &["--concurrency", "4"]);
    }

    let read = |id| {
        let client = client.clone();
        async move { client.workflow(id).await.unwrap() }
    };
    let w = eventually(
        Duration::from_secs(120),
        "the workflow to finish",
        || async {
            let w = read(created.id).await;
            (w.state != WorkflowState::Running).then_some(w)
        },
    )
    .await;
    assert_eq!(w.state, WorkflowState::Succeeded, "{w:?}");
    if let Some(base) = bases.last() {
        let v: serde_json::Value = http_client()
            .get(format!("{base}/v1/workflows/{}", created.id))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["state"], "succeeded", "{v}");
        assert_eq!(v["steps"]["final"]["job"], json!(final_id));
    }

    let fin = client.get(final_id).await.unwrap();
    assert_eq!(
        counter.count(&final_id.to_string()),
        1,
        "the final step's handler ran once"
    );
    assert_eq!(fin.epoch, 1, "the final step started once: {fin:?}");
    let parents = fin
        .parents
        .as_ref()
        .expect("the final step sees its parents");
    assert_eq!(parents.len(), PARENTS);
    let final_call = counter.calls(&final_id.to_string())[0].at;
    for n in &names {
        let p = &parents[n];
        assert_eq!(p.state, JobState::Succeeded, "{n}");
        assert_eq!(p.result.as_ref().unwrap()["status"], 200, "{n}");
        let job = client.get(p.id).await.unwrap();
        assert!(job.finished_at.unwrap() <= fin.started_at.unwrap(), "{n}");
        for c in counter.calls(&p.id.to_string()) {
            assert!(c.at < final_call, "{n} was called after the final step");
        }
    }
    drop(first);
    drop(procs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_steps_feed_a_final_step_that_runs_once_through_kill_9() {
    fan_in_through_kills(Env::sqlite(), 0).await;
}

/// The same on Redis + PostgreSQL, created through one server and read through another.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fan_in_on_redis_and_postgres_with_two_servers() {
    let server = RedisServer::unix();
    let mut env = Env::sqlite_broker_postgres_store().await;
    env.broker = server.url(&unique_prefix("wf"));
    fan_in_through_kills(env, 2).await;
}

async fn post(base: &str, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let r = http_client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

async fn get(base: &str, path: &str) -> serde_json::Value {
    http_client()
        .get(format!("{base}{path}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn wait_workflow(base: &str, id: &str) -> serde_json::Value {
    eventually(
        Duration::from_secs(60),
        "the workflow to finish",
        || async {
            let w = get(base, &format!("/v1/workflows/{id}")).await;
            (w["state"] != "running").then_some(w)
        },
    )
    .await
}

/// One `homing up`: failure propagation with a `run_on: any` finaliser, the workflow's cancel,
/// every validation error (nothing half-created), and the CLI's view.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failure_propagates_finalisers_run_and_bad_graphs_are_refused() {
    let env = Env::sqlite();
    let counter = Counter::start().await;
    let (_up, base) = start_up(&env, &[]).await;

    let fail = json!({"url": counter.url("fail=1000"), "timeout": "30s"});
    let (status, created) = post(
        &base,
        "/v1/workflows",
        json!({"name": "propagation", "steps": {
            "bad": {"task": "builtin.http", "args": fail, "max_retries": 0},
            "ok": {"task": "builtin.noop", "args": {"v": 1}},
            "child": {"task": "builtin.noop", "after": ["bad", "ok"]},
            "grandchild": {"task": "builtin.noop", "after": ["child"]},
            "fin": {"task": "builtin.noop", "after": ["grandchild", "ok"], "run_on": "any"},
        }}),
    )
    .await;
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let w = wait_workflow(&base, &id).await;
    assert_eq!(w["state"], "failed", "{w}");
    let states: Vec<(&str, &str)> = ["bad", "ok", "child", "grandchild", "fin"]
        .iter()
        .map(|s| (*s, w["steps"][s]["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        vec![
            ("bad", "failed"),
            ("ok", "succeeded"),
            ("child", "cancelled"),
            ("grandchild", "cancelled"),
            ("fin", "succeeded")
        ]
    );
    assert_eq!(
        w["steps"]["child"]["error"],
        "cancelled: its parent step 'bad' is failed"
    );
    let fin = get(
        &base,
        &format!("/v1/jobs/{}", created["steps"]["fin"].as_str().unwrap()),
    )
    .await;
    assert_eq!(fin["workflow"]["id"], json!(id));
    assert_eq!(fin["workflow"]["step"], "fin");
    assert_eq!(fin["parents"]["grandchild"]["state"], "cancelled", "{fin}");
    assert_eq!(fin["parents"]["ok"]["result"], json!({"v": 1}), "{fin}");
    let child_calls = counter.total();
    assert_eq!(child_calls, 1, "the failed step ran once, nothing after it");

    // Cancelling the workflow: the running step is stopped, the waiting one never runs.
    let (status, created) = post(
        &base,
        "/v1/workflows",
        json!({"name": "cancelled", "steps": {
            "slow": {"task": "builtin.sleep", "args": {"ms": 60000}},
            "after": {"task": "builtin.noop", "after": ["slow"], "run_on": "any"},
        }}),
    )
    .await;
    assert_eq!(status, 202, "{created}");
    let cid = created["id"].as_str().unwrap().to_string();
    let slow = created["steps"]["slow"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(30), "the slow step to run", || async {
        (get(&base, &format!("/v1/jobs/{slow}")).await["state"] == "running").then_some(())
    })
    .await;
    // The step waiting for `slow` is counted as `waiting` wherever queues are counted.
    let queues = get(&base, "/v1/queues").await;
    let default = queues["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "default")
        .cloned()
        .unwrap_or_else(|| panic!("no default queue: {queues}"));
    assert_eq!(default["waiting"], 1, "{default}");
    assert_eq!(default["running"], 1, "{default}");
    let (code, out, err) = env.run(&["queues", "--json"]);
    assert_eq!(code, 0, "{err}");
    let cli: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = cli["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "default")
        .cloned()
        .unwrap();
    assert_eq!(row["waiting"], 1, "{row}");
    let (code, out, err) = env.run(&["queues"]);
    assert_eq!(code, 0, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    let col = header.iter().position(|h| *h == "WAITING").expect(&out);
    let row = out.lines().find(|l| l.starts_with("default ")).expect(&out);
    assert_eq!(row.split_whitespace().nth(col), Some("1"), "{out}");
    let metrics = http_client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("homing_queue_jobs{")
            && l.contains("queue=\"default\"")
            && l.contains("state=\"waiting\"")
            && l.ends_with(" 1")),
        "{metrics}"
    );
    let (status, w) = post(&base, &format!("/v1/workflows/{cid}/cancel"), json!({})).await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["steps"]["after"]["state"], "cancelled");
    let w = wait_workflow(&base, &cid).await;
    assert_eq!(w["state"], "cancelled", "{w}");
    assert_eq!(w["steps"]["slow"]["state"], "cancelled");
    let (status, e) = post(
        &base,
        &format!("/v1/workflows/{}/cancel", homing::job::new_job_id()),
        json!({}),
    )
    .await;
    assert_eq!(status, 404, "{e}");

    // Bad graphs: a 400 with the reason, and nothing created.
    let many: serde_json::Map<String, serde_json::Value> = (0..=homing::workflow::MAX_STEPS)
        .map(|i| (format!("s{i}"), json!({"task": "builtin.noop"})))
        .collect();
    let cases = vec![
        (
            json!({"a": {"task": "builtin.noop", "after": ["b"]}, "b": {"task": "builtin.noop", "after": ["a"]}}),
            "cycle",
        ),
        (
            json!({"a": {"task": "builtin.noop", "after": ["nope"]}}),
            "'nope', which is not a step",
        ),
        (json!(many), "at most 200 steps"),
        (json!({"a": {"task": "no spaces allowed"}}), "step 'a'"),
        (json!({"a": {"task": "builtin.webhook"}}), "step 'a'"),
        (
            json!({"a": {"task": "builtin.noop", "queue": "homing.x"}}),
            "step 'a'",
        ),
        (json!({}), "at least one step"),
        (json!({"a b": {"task": "builtin.noop"}}), "step name"),
    ];
    for (steps, want) in cases {
        let (status, e) = post(
            &base,
            "/v1/workflows",
            json!({"name": "bad", "steps": steps}),
        )
        .await;
        assert_eq!(status, 400, "{want}: {e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{msg} lacks {want}");
    }
    // A step named twice, and a field no step has: refused while parsing.
    let r = http_client()
        .post(format!("{base}/v1/workflows"))
        .header("content-type", "application/json")
        .body(r#"{"name": "dup", "steps": {"a": {"task": "builtin.noop"}, "a": {"task": "builtin.noop"}}}"#)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let e: serde_json::Value = r.json().await.unwrap();
    assert!(matches!(status, 400 | 422), "{status} {e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("named twice"),
        "{e}"
    );
    let (status, e) = post(
        &base,
        "/v1/workflows",
        json!({"name": "x", "steps": {"a": {"task": "builtin.noop", "countdown": 5}}}),
    )
    .await;
    assert!(matches!(status, 400 | 422), "{status} {e}");
    let (status, e) = post(
        &base,
        "/v1/workflows",
        json!({"name": "x", "steps": {"a": {"task": "nobody.runs.this"}}}),
    )
    .await;
    assert_eq!(status, 422, "{e}");
    let list = get(&base, "/v1/workflows").await;
    let names: Vec<&str> = list["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec!["cancelled", "propagation"],
        "nothing of a refused workflow exists"
    );
    let jobs = get(&base, "/v1/jobs?limit=1000").await;
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 7, "{jobs}");

    // The CLI's view.
    let (code, out, err) = env.run(&["workflows", "get", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("failed") && out.contains("grandchild"),
        "{out}"
    );
    let (code, out, err) = env.run(&["workflows", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let page: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(page["workflows"].as_array().unwrap().len(), 2);
    let (code, _, err) = env.run(&["workflows", "get", "not-an-id"]);
    assert_ne!(code, 0);
    assert!(err.contains("not a workflow id"), "{err}");
    let file = env.path().join("wf.json");
    std::fs::write(&file, r#"{"name": "from-file", "steps": {"a": {"task": "builtin.noop"}, "b": {"task": "builtin.noop", "after": ["a"]}}}"#).unwrap();
    let (code, out, err) = env.run(&["workflows", "create", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let created: serde_json::Value = serde_json::from_str(&out).unwrap();
    let w = wait_workflow(&base, created["id"].as_str().unwrap()).await;
    assert_eq!(w["state"], "succeeded", "{w}");
    std::fs::write(
        &file,
        r#"{"name": "loop", "steps": {"a": {"task": "builtin.noop", "after": ["a"]}}}"#,
    )
    .unwrap();
    let (code, _, err) = env.run(&["workflows", "create", file.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("after itself"), "{err}");
}

/// psql, from the PostgreSQL 15 packages or the PATH; fails naming the Debian package.
fn psql() -> std::path::PathBuf {
    let pinned = std::path::PathBuf::from("/usr/lib/postgresql/15/bin/psql");
    if pinned.exists() {
        return pinned;
    }
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("psql"))
            .find(|c| c.exists())
    });
    found.expect("psql not found: install the Debian package postgresql-client-15")
}

/// Runs SQL through psql in one session: (exit code, stdout, stderr).
fn run_psql(url: &str, sql: &str) -> (i32, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(psql())
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run psql");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(sql.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Transactional enqueue from psql: a rolled-back transaction leaves no job; a commit made
/// while no homing process runs is picked up by the first one to start; a commit while one
/// runs succeeds; a bad call fails with the reason and rolls back the application's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactional_enqueue_from_psql() {
    let env = Env::sqlite_broker_postgres_store().await;
    let (code, out, err) = env.run(&["migrate"]);
    assert_eq!(code, 0, "{out}{err}");
    let client = env.client().await;
    let url = env.store.clone();
    let (code, _, err) = run_psql(
        &url,
        "CREATE TABLE documents (id SERIAL PRIMARY KEY, title TEXT);",
    );
    assert_eq!(code, 0, "{err}");

    let enqueue = |title: &str, end: &str| {
        format!(
            "BEGIN;\nINSERT INTO documents (title) VALUES ('{title}');\n\
             SELECT homing_enqueue('builtin.noop', '{{\"title\": \"{title}\"}}'::jsonb, queue => 'default');\n{end};\n"
        )
    };
    let (code, out, err) = run_psql(&url, &enqueue("rolled", "ROLLBACK"));
    assert_eq!(code, 0, "{err}");
    let rolled: homing::JobId = out.trim().parse().expect("the job id");
    assert!(client.get(rolled).await.is_err(), "no job after ROLLBACK");

    // Committed while no homing process runs.
    let (code, out, err) = run_psql(&url, &enqueue("offline", "COMMIT"));
    assert_eq!(code, 0, "{err}");
    let offline: homing::JobId = out.trim().parse().unwrap();
    assert_eq!(client.get(offline).await.unwrap().state, JobState::Queued);

    let _worker = env.worker("w", "default", &[]);
    let j = wait_state(
        &client,
        offline,
        JobState::Succeeded,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(j.result, Some(json!({"title": "offline"})));

    let (code, out, err) = run_psql(&url, &enqueue("online", "COMMIT"));
    assert_eq!(code, 0, "{err}");
    let online: homing::JobId = out.trim().parse().unwrap();
    wait_state(
        &client,
        online,
        JobState::Succeeded,
        Duration::from_secs(60),
    )
    .await;

    let (code, _, err) = run_psql(
        &url,
        "BEGIN;\nINSERT INTO documents (title) VALUES ('bad');\n\
         SELECT homing_enqueue('builtin.webhook', '{}');\nCOMMIT;\n",
    );
    assert_ne!(code, 0);
    assert!(err.contains("internal to homing"), "{err}");
    // The door's depth rule, in SQL: 64 levels are accepted, 65 refused in the caller's
    // transaction (not accepted and then made dead at the start).
    let nested = |levels: usize| format!("{}{}", "[".repeat(levels), "]".repeat(levels));
    let (code, _, err) = run_psql(
        &url,
        &format!(
            "BEGIN;\nINSERT INTO documents (title) VALUES ('deep');\n\
             SELECT homing_enqueue('builtin.noop', '{}');\nCOMMIT;\n",
            nested(65)
        ),
    );
    assert_ne!(code, 0);
    assert!(err.contains("nested deeper than 64 levels"), "{err}");
    let (code, out, err) = run_psql(
        &url,
        &format!(
            "SELECT homing_enqueue('builtin.noop', '{}', priority => 7);",
            nested(64)
        ),
    );
    assert_eq!(code, 0, "{err}");
    let deepest: homing::JobId = out.trim().parse().unwrap();
    let j = wait_state(
        &client,
        deepest,
        JobState::Succeeded,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(j.priority, 7, "{j:?}");
    let (code, _, err) = run_psql(
        &url,
        "SELECT homing_enqueue('builtin.noop', priority => 5000);",
    );
    assert_ne!(code, 0);
    assert!(err.contains("priority must be from -1000 to 1000"), "{err}");

    let (_, out, _) = run_psql(
        &url,
        "SELECT string_agg(title, ',' ORDER BY id) FROM documents;",
    );
    assert_eq!(
        out.trim(),
        "offline,online",
        "the failed call rolled the application's write back"
    );
}
