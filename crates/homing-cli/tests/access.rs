//! Access roles, the audit log and bulk actions (docs/access.md) against a real `homing up`:
//! every route of the OpenAPI document is tried with a read and an admin token, so a route added
//! to the document (and tests/openapi.rs keeps the document equal to the router) cannot skip the
//! role check. One server serves every test of this file.

mod support;

use std::time::Duration;
use support::*;
use tokio::sync::OnceCell;

const ADMIN: &str = "admin-token-0123456789";
const READ: &str = "read-token-0123456789";

struct Server {
    _env: Env,
    up: Proc,
    base: String,
}

static SERVER: OnceCell<Server> = OnceCell::const_new();

async fn server() -> &'static Server {
    SERVER
        .get_or_init(|| async {
            let env = Env::sqlite();
            let config = env.path().join("config.json");
            std::fs::write(
                &config,
                format!(
                    r#"{{"api_tokens": [{{"token": "{READ}", "role": "read", "name": "ops-bob"}}, {{"token": "{ADMIN}", "role": "admin", "name": "ops-alice"}}]}}"#
                ),
            )
            .unwrap();
            let (up, base) = start_up_with(
                &env,
                &["--queue", "default"],
                // A bulk call answers after its first step (docs/bulk.md), so a walk longer
                // than one step is answered in parts here; shorter walks are not affected.
                &[
                    ("HOMING_CONFIG", config.to_str().unwrap()),
                    ("HOMING_BULK_PART", "1ms"),
                ],
            )
            .await;
            Server {
                _env: env,
                up,
                base,
            }
        })
        .await
}

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

/// A concrete path for a templated one: unknown ids and names, so nothing real is touched.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|seg| match seg {
            "{id}" | "{session}" => "00000000-0000-4000-8000-000000000000".to_string(),
            "{index}" => "0".to_string(),
            s if s.starts_with('{') => "access-probe".to_string(),
            s => s.to_string(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

async fn call(http: &reqwest::Client, method: &str, url: &str, token: &str) -> (u16, String) {
    let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
    let resp = tokio::time::timeout(
        Duration::from_secs(30),
        http.request(m, url)
            .header("authorization", bearer(token))
            .send(),
    )
    .await
    .unwrap_or_else(|_| panic!("{method} {url}: no answer"))
    .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = resp.status().as_u16();
    // The event stream never ends: read only the status of a 200 there.
    let body = if url.ends_with("/events") && status == 200 {
        String::new()
    } else {
        resp.text().await.unwrap_or_default()
    };
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_route_of_the_document_honours_the_roles() {
    let s = server().await;
    let http = http_client();
    let doc: serde_json::Value =
        serde_json::from_str(include_str!("../src/api/openapi.json")).unwrap();
    let mut tried = 0;
    let mut writes = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, _) in ops.as_object().unwrap() {
            if !["get", "post", "put", "patch", "delete", "head"].contains(&method.as_str()) {
                continue;
            }
            tried += 1;
            let url = format!("{}{}", s.base, concrete(path));
            let (read_status, body) = call(&http, method, &url, READ).await;
            if method == "get" {
                assert!(
                    read_status != 401 && read_status != 403,
                    "GET {path} with a read token: {read_status} {body}"
                );
            } else {
                writes += 1;
                assert_eq!(
                    read_status, 403,
                    "{method} {path} with a read token: {body}"
                );
                let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert_eq!(v["error"]["code"], "forbidden", "{method} {path}: {body}");
                assert!(v["error"]["message"].as_str().unwrap().contains("ops-bob"));
            }
            let (admin_status, body) = call(&http, method, &url, ADMIN).await;
            assert!(
                admin_status != 401 && admin_status != 403,
                "{method} {path} with an admin token: {admin_status} {body}"
            );
            let (none, _) = call(&http, method, &url, "wrong-token").await;
            let open = matches!(
                path.as_str(),
                "/healthz"
                    | "/"
                    | "/dashboard/app.js"
                    | "/dashboard/style.css"
                    | "/dashboard/charts.js"
                    | "/dashboard/vendor/uplot.min.js"
                    | "/dashboard/vendor/uplot.min.css"
                    | "/dashboard/views.js"
                    | "/dashboard/workers.js"
                    | "/dashboard/timeline.js"
            );
            assert!(
                open || none == 401,
                "{method} {path} with a wrong token: {none}"
            );
        }
    }
    // The document is not empty by mistake: it has the routes this file is about.
    assert!(tried > 30 && writes > 15, "{tried} routes, {writes} writes");

    // The refusals are in the audit log with who tried (never the token) and the answer.
    let page: serde_json::Value = http
        .get(format!("{}/v1/audit?limit=1000", s.base))
        .header("authorization", bearer(READ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = page["entries"].as_array().unwrap();
    let refused = entries
        .iter()
        .filter(|e| e["actor"] == "ops-bob" && e["status"] == 403)
        .count();
    assert!(refused > 5, "{page}");
    assert!(entries.iter().any(|e| e["actor"] == "ops-alice"
        && e["action"] == "POST /v1/queues/{name}/pause"
        && e["target"] == "/v1/queues/access-probe/pause"
        && e["status"] == 200));
    // Producers' and remote workers' traffic is not an operator action.
    assert!(!entries.iter().any(|e| e["action"]
        .as_str()
        .is_some_and(|a| a.starts_with("POST /v1/jobs ")
            || a == "POST /v1/jobs"
            || a.contains("/v1/remote/"))));
    let text = page.to_string();
    assert!(
        !text.contains(READ) && !text.contains(ADMIN),
        "no token in the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whoami_names_the_token_and_its_role() {
    let s = server().await;
    let http = http_client();
    for (token, name, role) in [(READ, "ops-bob", "read"), (ADMIN, "ops-alice", "admin")] {
        let v: serde_json::Value = http
            .get(format!("{}/v1/whoami", s.base))
            .header("authorization", bearer(token))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"name": name, "role": role, "auth": true})
        );
    }
}

async fn post_json(url: &str, token: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let resp = http_client()
        .post(url)
        .header("authorization", bearer(token))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

async fn get_json(url: &str, token: &str) -> serde_json::Value {
    http_client()
        .get(url)
        .header("authorization", bearer(token))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bulk_actions_count_change_and_are_audited() {
    let s = server().await;
    let b = &s.base;
    // A queue nobody serves: its jobs stay queued until cancelled.
    let q = format!("parked-{}", std::process::id());
    for _ in 0..7 {
        let (st, v) = post_json(
            &format!("{b}/v1/jobs"),
            ADMIN,
            serde_json::json!({"task": "builtin.noop", "queue": q}),
        )
        .await;
        assert_eq!(st, 202, "{v}");
    }
    let count = |state: &str| {
        let url = format!("{b}/v1/jobs/count?state={state}&queue={q}");
        async move { get_json(&url, READ).await["count"].as_u64().unwrap() }
    };
    assert_eq!(count("queued").await, 7);

    // Bad filters are 400s naming what is allowed; nothing changes.
    for url in [
        format!("{b}/v1/jobs/cancel?queue={q}"),
        format!("{b}/v1/jobs/delete?state=queued&queue={q}"),
        format!("{b}/v1/jobs/retry?state=bogus"),
        format!("{b}/v1/jobs/retry?state=failed&nope=1"),
    ] {
        let (st, v) = post_json(&url, ADMIN, serde_json::json!(null)).await;
        assert_eq!(st, 400, "{url}: {v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    assert_eq!(count("queued").await, 7);

    let (st, v) = post_json(
        &format!("{b}/v1/jobs/cancel?state=queued&queue={q}"),
        ADMIN,
        serde_json::json!(null),
    )
    .await;
    assert_eq!(
        (st, &v),
        (
            200,
            &serde_json::json!({"action": "cancel", "count": 7, "skipped": 0, "done": true, "next_cursor": null})
        )
    );
    assert_eq!(count("cancelled").await, 7);
    let (_, v) = post_json(
        &format!("{b}/v1/jobs/retry?state=cancelled&queue={q}&task=builtin.noop"),
        ADMIN,
        serde_json::json!(null),
    )
    .await;
    assert_eq!(v["count"], 7);
    assert_eq!(count("queued").await, 7);
    post_json(
        &format!("{b}/v1/jobs/cancel?state=queued&queue={q}"),
        ADMIN,
        serde_json::json!(null),
    )
    .await;
    let (_, v) = post_json(
        &format!("{b}/v1/jobs/delete?state=cancelled&queue={q}"),
        ADMIN,
        serde_json::json!(null),
    )
    .await;
    assert_eq!(v["count"], 7);
    let all = get_json(&format!("{b}/v1/jobs/count?queue={q}"), READ).await;
    assert_eq!(all["count"], 0);

    let page = get_json(&format!("{b}/v1/audit?limit=1000"), READ).await;
    let bulk: Vec<_> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["target"].as_str().is_some_and(|t| t.contains(&q)) && e["status"] == 200)
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_string(),
                e["count"].clone(),
            )
        })
        .collect();
    assert_eq!(
        bulk,
        vec![
            ("POST /v1/jobs/delete".to_string(), serde_json::json!(7)),
            ("POST /v1/jobs/cancel".to_string(), serde_json::json!(7)),
            ("POST /v1/jobs/retry".to_string(), serde_json::json!(7)),
            ("POST /v1/jobs/cancel".to_string(), serde_json::json!(7)),
        ]
    );
}

/// A walk longer than a call's budget is answered in parts: each call says exactly what it did
/// (committed), `done: false` and the cursor to go on from; the parts add up to every job, each
/// call has its own audit entry with its own count, and a bad cursor is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_bulk_action_answers_in_truthful_parts() {
    let s = server().await;
    let b = &s.base;
    let q = format!("parts-{}", std::process::id());
    let n = 1100;
    let jobs: Vec<_> = (0..n)
        .map(|_| serde_json::json!({"task": "builtin.noop", "queue": q}))
        .collect();
    let (st, v) = post_json(
        &format!("{b}/v1/jobs/batch"),
        ADMIN,
        serde_json::json!({ "jobs": jobs }),
    )
    .await;
    assert_eq!(st, 202, "{v}");

    let (st, v) = post_json(
        &format!("{b}/v1/jobs/cancel?state=queued&queue={q}&cursor=nope"),
        ADMIN,
        serde_json::json!(null),
    )
    .await;
    assert_eq!(st, 400, "{v}");

    let mut parts = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let url = match &next {
            Some(c) => format!("{b}/v1/jobs/cancel?state=queued&queue={q}&cursor={c}"),
            None => format!("{b}/v1/jobs/cancel?state=queued&queue={q}"),
        };
        let (st, v) = post_json(&url, ADMIN, serde_json::json!(null)).await;
        assert_eq!(st, 200, "{v}");
        let count = v["count"].as_u64().unwrap();
        parts.push(count);
        // What the answer counts has happened: the queue holds exactly that many fewer.
        let left = get_json(&format!("{b}/v1/jobs/count?state=queued&queue={q}"), READ).await;
        assert_eq!(
            left["count"].as_u64().unwrap(),
            n - parts.iter().sum::<u64>(),
            "{v}"
        );
        if v["done"] == true {
            assert!(v["next_cursor"].is_null(), "{v}");
            break;
        }
        next = Some(v["next_cursor"].as_str().expect("a cursor").to_string());
        assert!(parts.len() < 50, "the walk does not end: {parts:?}");
    }
    assert!(parts.len() >= 2, "{parts:?}");
    assert_eq!(parts.iter().sum::<u64>(), n);

    let page = get_json(&format!("{b}/v1/audit?limit=1000"), READ).await;
    let mut audited: Vec<u64> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["target"].as_str().is_some_and(|t| t.contains(&q)) && e["status"] == 200)
        .map(|e| e["count"].as_u64().unwrap())
        .collect();
    audited.reverse();
    assert_eq!(audited, parts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_bulk_shows_the_count_and_asks_before_it_runs() {
    let env = Env::sqlite();
    let client = env.client().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let mut req = homing::EnqueueRequest::new("builtin.noop", serde_json::json!({}));
        req.options.queue = Some("cli-parked".into());
        ids.push(client.enqueue(req).await.unwrap().id);
    }
    // stdin is not a terminal: without --yes nothing runs, and the count is said.
    let (code, _, err) = env.run(&[
        "jobs",
        "cancel",
        "--state",
        "queued",
        "--queue",
        "cli-parked",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("3 jobs match") && err.contains("--yes"),
        "{err}"
    );
    let queued = |c: homing::Client| async move {
        c.count(&homing::store::JobFilter {
            state: Some(homing::JobState::Queued),
            queue: Some("cli-parked".into()),
            task: None,
        })
        .await
        .unwrap()
    };
    assert_eq!(queued(client.clone()).await, 3);
    // Mistakes are one-line refusals.
    for args in [
        &["jobs", "delete", "--state", "queued", "--yes"][..],
        &["jobs", "retry", "--yes"][..],
        &["jobs", "retry", "--state", "nope", "--yes"][..],
        &[
            "jobs",
            "cancel",
            "00000000-0000-4000-8000-000000000000",
            "--state",
            "queued",
        ][..],
    ] {
        let (code, _, err) = env.run(args);
        assert_ne!(code, 0, "{args:?}");
        assert!(
            !err.trim().is_empty() && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    let (code, out, err) = env.run(&[
        "jobs",
        "cancel",
        "--state",
        "queued",
        "--queue",
        "cli-parked",
        "--yes",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"action": "cancel", "count": 3, "skipped": 0})
    );
    assert_eq!(queued(client.clone()).await, 0);
    let (code, out, err) = env.run(&[
        "jobs",
        "delete",
        "--state",
        "cancelled",
        "--queue",
        "cli-parked",
        "--yes",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("delete: 3 jobs"), "{out}");
    for id in ids {
        assert!(client.get(id).await.is_err(), "{id} is gone");
    }
}

/// The CLI writes to the store directly, not through the API, and records its own audit entry
/// for each operator write: the actor names the CLI and the local user, a bulk action's entry
/// its filter and the jobs it changed, a failed write its status; a bulk action declined at the
/// prompt did nothing and records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_writes_are_audited_with_the_local_user_and_the_count() {
    let env = Env::sqlite();
    let client = env.client().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let mut req = homing::EnqueueRequest::new("builtin.noop", serde_json::json!({}));
        req.options.queue = Some("cli-audited".into());
        ids.push(client.enqueue(req).await.unwrap().id);
    }
    let run = |args: &[&str]| {
        let out = env
            .command(args)
            .env("USER", "ops-carol")
            .output()
            .expect("run homing");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code().unwrap_or(-1), err)
    };
    let bulk = ["--queue", "cli-audited"];
    // Refused without --yes: nothing done, nothing recorded.
    let (code, _) = run(&[&["jobs", "cancel", "--state", "queued"][..], &bulk].concat());
    assert_ne!(code, 0);
    for args in [
        &["jobs", "cancel", "--state", "queued", "--yes"][..],
        &[
            "jobs",
            "retry",
            "--state",
            "cancelled",
            "--task",
            "builtin.noop",
            "--yes",
        ][..],
    ] {
        let (code, err) = run(&[args, &bulk].concat());
        assert_eq!(code, 0, "{args:?}: {err}");
    }
    let id = ids[0].to_string();
    let (code, err) = run(&["jobs", "cancel", &id]);
    assert_eq!(code, 0, "{err}");
    let (code, err) = run(&["queues", "pause", "cli-audited"]);
    assert_eq!(code, 0, "{err}");
    let (code, _) = run(&["schedules", "pause", "no-such-schedule"]);
    assert_ne!(code, 0);

    let page = client.store().audit(None, 100).await.unwrap();
    let got: Vec<_> = page
        .entries
        .iter()
        .rev()
        .map(|e| {
            let e = &e.entry;
            (
                e.actor.as_str(),
                e.role.as_str(),
                e.action.as_str(),
                e.target.as_str(),
                e.status,
                e.count,
            )
        })
        .collect();
    let target = format!("id={id}");
    let u = "cli:ops-carol";
    assert_eq!(
        got,
        vec![
            (
                u,
                "admin",
                "cli jobs cancel",
                "state=queued&queue=cli-audited",
                200,
                Some(3)
            ),
            (
                u,
                "admin",
                "cli jobs retry",
                "state=cancelled&queue=cli-audited&task=builtin.noop",
                200,
                Some(3)
            ),
            (u, "admin", "cli jobs cancel", target.as_str(), 200, None),
            (
                u,
                "admin",
                "cli queues pause",
                "queue=cli-audited",
                200,
                None
            ),
            (
                u,
                "admin",
                "cli schedules pause",
                "name=no-such-schedule",
                404,
                None
            ),
        ]
    );
}

/// A bulk cancel killed with SIGKILL halfway leaves every job queued or cancelled (nothing lost,
/// nothing half-written), and running the same command again finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_action_killed_halfway_is_finished_by_running_it_again() {
    let env = Env::sqlite();
    let client = env.client().await;
    let n = 8000usize;
    for _ in 0..n / 1000 {
        let reqs = (0..1000)
            .map(|_| {
                let mut r = homing::EnqueueRequest::new("builtin.noop", serde_json::json!({}));
                r.options.queue = Some("crash-parked".into());
                r
            })
            .collect();
        client.enqueue_many(reqs).await.unwrap();
    }
    let count = |state| {
        let c = client.clone();
        async move {
            c.count(&homing::store::JobFilter {
                state: Some(state),
                queue: Some("crash-parked".into()),
                task: None,
            })
            .await
            .unwrap() as usize
        }
    };
    let args = [
        "jobs",
        "cancel",
        "--state",
        "queued",
        "--queue",
        "crash-parked",
        "--yes",
    ];
    let mut bulk = env.spawn("bulk", &args);
    eventually(Duration::from_secs(60), "the first cancels", || async {
        (count(homing::JobState::Cancelled).await > 0).then_some(())
    })
    .await;
    bulk.kill9();
    let (queued, cancelled) = (
        count(homing::JobState::Queued).await,
        count(homing::JobState::Cancelled).await,
    );
    assert_eq!(queued + cancelled, n, "every job is queued or cancelled");
    assert!(
        cancelled < n,
        "killed before it finished ({cancelled} of {n})"
    );

    let (code, out, err) = env.run(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("cancel: {queued} jobs")), "{out}");
    assert_eq!(count(homing::JobState::Cancelled).await, n);
}

/// The shared server above lives in a `static`, which Rust never drops: it used to outlive the
/// test binary (one `homing up` left running per CI run). The harness now kills every process
/// it started when the binary exits, even after a failed test. This test runs itself as a child
/// test binary that starts the shared server and then fails, and checks the server is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_server_dies_with_the_test_binary_even_after_a_failure() {
    const NAME: &str = "the_shared_server_dies_with_the_test_binary_even_after_a_failure";
    if let Some(out) = std::env::var_os("HOMING_TEST_LEAK_PROBE") {
        // The inner run: start the shared server, say its pid, then fail.
        std::fs::write(out, server().await.up.pid().to_string()).unwrap();
        panic!("the probe fails on purpose: the shared server must die all the same");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pid");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--test-threads=1"])
        .env("HOMING_TEST_LEAK_PROBE", &file)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run this test binary");
    assert!(
        !out.status.success(),
        "the probe fails: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let pid: u32 = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| {
            panic!(
                "the probe's pid ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .parse()
        .unwrap();
    assert!(pid > 0);
    eventually(
        Duration::from_secs(20),
        "the probe's server to be gone",
        || async { (!process_running(pid)).then_some(()) },
    )
    .await;
}
