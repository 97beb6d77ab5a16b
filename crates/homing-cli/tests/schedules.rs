//! Periodic schedules with real processes (docs/schedules.md): several servers run an every-1s
//! schedule while they are killed with SIGKILL and restarted, and every tick gets exactly one
//! job, none skipped while one of them lives (embedded backend, and Redis + PostgreSQL); the
//! missed-tick policies after everything was down; pause/resume; the CLI's and the API's errors.

#[path = "../../homing/tests/support/redis_server.rs"]
mod redis_server;
mod support;

use std::collections::BTreeMap;
use std::time::Duration;
use support::*;

use homing::store::JobFilter;
use homing::time::Micros;
use homing::Client;

const SECOND: Micros = 1_000_000;

/// Every job of `schedule`: tick → how many jobs, and tick → the job's creation time.
async fn ticks(
    client: &Client,
    schedule: &str,
) -> (BTreeMap<Micros, usize>, BTreeMap<Micros, Micros>) {
    let mut count = BTreeMap::new();
    let mut created = BTreeMap::new();
    let mut cursor: Option<String> = None;
    let filter = JobFilter {
        task: Some("builtin.noop".into()),
        ..JobFilter::default()
    };
    loop {
        let page = client
            .list(&filter, cursor.as_deref(), 1000)
            .await
            .expect("list jobs");
        for j in &page.jobs {
            if j.schedule.as_deref() == Some(schedule) {
                let tick = j.scheduled_tick.expect("a schedule's job names its tick");
                *count.entry(tick).or_insert(0) += 1;
                created.insert(tick, j.created_at);
            }
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return (count, created),
        }
    }
}

fn config_file(env: &Env, schedules: serde_json::Value) -> String {
    let path = env.path().join("config.json");
    std::fs::write(
        &path,
        serde_json::json!({ "schedules": schedules }).to_string(),
    )
    .expect("write config");
    path.display().to_string()
}

fn server(env: &Env, name: &str, config: &str) -> Proc {
    let listen = format!("127.0.0.1:{}", free_port());
    env.spawn_with_env(
        name,
        &["server", "--listen", &listen, "--rescue-interval", "200ms"],
        &[("HOMING_CONFIG", config)],
    )
}

/// Three servers run an every-1s schedule (from the config file, set again by each at start);
/// they are killed with SIGKILL one after another while a fourth joins, so one always lives.
/// Each tick from the first to the last has exactly one job.
async fn one_job_per_tick_with_kills(env: Env) {
    let config = config_file(
        &env,
        serde_json::json!([{"name": "every-second", "task": "builtin.noop", "every": "1s",
                            "queue": "ticks"}]),
    );
    let mut s1 = server(&env, "s1", &config);
    let mut s2 = server(&env, "s2", &config);
    let mut s3 = server(&env, "s3", &config);
    let client = eventually(Duration::from_secs(30), "the store to open", || async {
        let b = homing::Backends::open(&env.broker, &env.store).await.ok()?;
        Some(Client::new(b.broker, b.store))
    })
    .await;
    eventually(Duration::from_secs(30), "the first ticks", || async {
        (ticks(&client, "every-second").await.0.len() >= 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s1.kill9();
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let _s4 = server(&env, "s4", &config);
    s2.kill9();
    tokio::time::sleep(Duration::from_millis(2700)).await;
    s3.kill9();
    let killed_all_but_s4 = homing::time::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (count, _) = ticks(&client, "every-second").await;
    let dup: Vec<_> = count.iter().filter(|(_, n)| **n != 1).collect();
    assert!(dup.is_empty(), "ticks with more than one job: {dup:?}");
    let all: Vec<Micros> = count.keys().copied().collect();
    let gaps: Vec<_> = all.windows(2).filter(|w| w[1] - w[0] != SECOND).collect();
    assert!(
        gaps.is_empty(),
        "ticks skipped while a server lived: {gaps:?}"
    );
    let last = *all.last().expect("ticks");
    assert!(
        last >= killed_all_but_s4,
        "the surviving server kept ticking: last tick {last}, last kill {killed_all_but_s4}"
    );
    assert!(all.len() >= 8, "about one tick a second: {}", all.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_job_per_tick_across_servers_killed_embedded() {
    one_job_per_tick_with_kills(Env::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_job_per_tick_across_servers_killed_redis_postgres() {
    let mut env = Env::sqlite_broker_postgres_store().await;
    env.broker = redis_server::shared().url(&redis_server::unique_prefix("sched"));
    one_job_per_tick_with_kills(env).await;
}

/// Everything down for longer than the grace (10 s): on restart, `skip` enqueues only on-time
/// ticks, `latest` one missed tick more, `all:3` three more. The three schedules tick on the same
/// whole seconds and are decided in one pass, so their first ticks after the restart compare.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missed_ticks_follow_each_policy() {
    let env = Env::sqlite();
    let config = config_file(
        &env,
        serde_json::json!([
            {"name": "m-skip", "task": "builtin.noop", "every": "1s", "missed": "skip"},
            {"name": "m-latest", "task": "builtin.noop", "every": "1s"},
            {"name": "m-all", "task": "builtin.noop", "every": "1s", "missed": "all:3"},
        ]),
    );
    let mut s = server(&env, "before", &config);
    let client = eventually(Duration::from_secs(30), "the store to open", || async {
        let b = homing::Backends::open(&env.broker, &env.store).await.ok()?;
        Some(Client::new(b.broker, b.store))
    })
    .await;
    for name in ["m-skip", "m-latest", "m-all"] {
        eventually(Duration::from_secs(30), "a tick of each", || async {
            (!ticks(&client, name).await.0.is_empty()).then_some(())
        })
        .await;
    }
    s.kill9();
    let down = homing::time::now();
    tokio::time::sleep(Duration::from_secs(16)).await;
    let _s = server(&env, "after", &config);
    for name in ["m-skip", "m-latest", "m-all"] {
        eventually(
            Duration::from_secs(30),
            "ticks after the restart",
            || async {
                let (_, created) = ticks(&client, name).await;
                (created.values().filter(|c| **c > down).count() >= 3).then_some(())
            },
        )
        .await;
    }
    let mut first_after = BTreeMap::new();
    for name in ["m-skip", "m-latest", "m-all"] {
        let (count, created) = ticks(&client, name).await;
        assert!(count.values().all(|n| *n == 1), "{name}: one job per tick");
        let after: Vec<Micros> = created
            .iter()
            .filter(|(_, c)| **c > down)
            .map(|(t, _)| *t)
            .collect();
        assert!(
            after.windows(2).all(|w| w[1] - w[0] == SECOND),
            "{name}: after the restart the ticks run on, one a second: {after:?}"
        );
        let before = created
            .iter()
            .filter(|(_, c)| **c <= down)
            .map(|(t, _)| *t)
            .max()
            .expect("ticks before");
        assert!(after[0] > before, "{name}");
        first_after.insert(name, after[0]);
    }
    let skip = first_after["m-skip"];
    assert_eq!(
        first_after["m-latest"],
        skip - SECOND,
        "latest: one missed tick"
    );
    assert_eq!(
        first_after["m-all"],
        skip - 3 * SECOND,
        "all:3: three missed ticks"
    );
    // Skip really skipped: its first tick after the restart is well after the last before.
    let (_, created) = ticks(&client, "m-skip").await;
    let last_before = created
        .iter()
        .filter(|(_, c)| **c <= down)
        .map(|(t, _)| *t)
        .max()
        .unwrap();
    assert!(skip - last_before > 5 * SECOND, "{skip} {last_before}");
}

/// Pause stops the ticks, resume starts them again from then on; the CLI and the API refuse
/// bad input with a reason and keep running.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_resume_and_errors() {
    let env = Env::sqlite();
    let (_up, base) = start_up(&env, &[]).await;
    let (code, out, err) = env.run(&[
        "schedules",
        "set",
        "beat",
        "--task",
        "builtin.noop",
        "--every",
        "1s",
        "--args",
        r#"{"n": 7}"#,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let client = env.client().await;
    eventually(Duration::from_secs(30), "two ticks", || async {
        (ticks(&client, "beat").await.0.len() >= 2).then_some(())
    })
    .await;

    let (code, out, _) = env.run(&["schedules", "list", "--json"]);
    assert_eq!(code, 0);
    let list: serde_json::Value = serde_json::from_str(&out).expect("JSON list");
    let beat = &list[0];
    assert_eq!(beat["name"], "beat");
    assert_eq!(beat["args"], serde_json::json!({"n": 7}));
    let last_job: homing::JobId = beat["last_job"].as_str().unwrap().parse().unwrap();
    let job = client.get(last_job).await.unwrap();
    assert_eq!(job.schedule.as_deref(), Some("beat"));
    assert_eq!(
        beat["last_tick"].as_str().map(homing::time::parse_rfc3339),
        Some(job.scheduled_tick)
    );

    let (code, out, err) = env.run(&["schedules", "pause", "beat"]);
    assert_eq!(code, 0, "{out}{err}");
    let paused_at = homing::time::now();
    let n = ticks(&client, "beat").await.0.len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        ticks(&client, "beat").await.0.len(),
        n,
        "no tick while paused"
    );
    let (code, _, _) = env.run(&["schedules", "resume", "beat"]);
    assert_eq!(code, 0);
    let resumed_at = homing::time::now();
    eventually(Duration::from_secs(30), "ticks after resume", || async {
        (ticks(&client, "beat").await.0.len() > n).then_some(())
    })
    .await;
    let (count, _) = ticks(&client, "beat").await;
    let owed: Vec<_> = count
        .keys()
        .filter(|t| **t > paused_at + SECOND && **t < resumed_at - SECOND)
        .collect();
    assert!(owed.is_empty(), "paused ticks are not enqueued: {owed:?}");

    // The CLI: usage errors (exit 2) name the problem; the rest exit 1 with a reason.
    for (args, code_wanted, says) in [
        (vec!["--cron", "0 3 * *"], 2, "5 fields"),
        (vec!["--cron", "0 0 30 2 *"], 2, "never fires"),
        (
            vec!["--cron", "0 3 * * *", "--timezone", "Mars/Olympus"],
            2,
            "unknown time zone",
        ),
        (vec!["--every", "0s"], 2, "out of range"),
        (vec!["--every", "1500ms"], 2, "whole number of seconds"),
        (
            vec!["--every", "1s", "--missed", "all:0"],
            2,
            "missed-tick policy",
        ),
        (
            vec!["--every", "1s", "--cron", "* * * * *"],
            2,
            "cannot be used with",
        ),
        (vec![], 2, "required"),
        (vec!["--every", "1s", "--args", "[1"], 1, "not valid JSON"),
    ] {
        let mut full = vec!["schedules", "set", "bad", "--task", "builtin.noop"];
        full.extend(args.iter().copied());
        let (code, out, err) = env.run(&full);
        assert_eq!(code, code_wanted, "{full:?}: {out}{err}");
        assert!(err.contains(says), "{full:?}: {err}");
    }
    let (code, _, err) = env.run(&["schedules", "set", "a b", "--task", "x", "--every", "1s"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = env.run(&[
        "schedules",
        "set",
        "w",
        "--task",
        "builtin.webhook",
        "--every",
        "1s",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("internal"), "{err}");
    // A task no worker registered is refused as an enqueue refuses it (its ticks' jobs would
    // wait for ever), unless the caller says so.
    let typo = [
        "schedules",
        "set",
        "typo",
        "--task",
        "reports.nightyl",
        "--every",
        "1h",
    ];
    let (code, _, err) = env.run(&typo);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no worker has registered task 'reports.nightyl'"),
        "{err}"
    );
    assert!(err.contains("--allow-unknown-task"), "{err}");
    let (code, _, err) = env.run(&[&typo[..], &["--allow-unknown-task"]].concat());
    assert_eq!(code, 0, "{err}");
    // Set again with the task it has (a new interval): not refused.
    let again = [
        "schedules",
        "set",
        "typo",
        "--task",
        "reports.nightyl",
        "--every",
        "2h",
    ];
    let (code, _, err) = env.run(&again);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = env.run(&["schedules", "delete", "typo"]);
    assert_eq!(code, 0, "{err}");
    // A builtin's args are checked as an enqueue checks them (a bad URL scheme, a bad type):
    // such a schedule made a job that failed at every tick.
    for (task, args, says) in [
        (
            "builtin.http",
            r#"{"url": "gopher://x"}"#,
            "unsupported url scheme",
        ),
        ("builtin.sleep", r#"{"ms": "x"}"#, "invalid type"),
    ] {
        let (code, _, err) = env.run(&[
            "schedules",
            "set",
            "argful",
            "--task",
            task,
            "--args",
            args,
            "--every",
            "1s",
        ]);
        assert_eq!(code, 1, "{task}: {err}");
        assert!(err.contains(says), "{task}: {err}");
    }
    let (code, _, err) = env.run(&["schedules", "delete", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("no schedule named 'nope'"), "{err}");

    // A bad schedule in the config file stops a process at start, naming it.
    let config = config_file(
        &env,
        serde_json::json!([{"name": "broken", "task": "builtin.noop", "cron": "0 3 * * *",
                            "timezone": "Nowhere/Land"}]),
    );
    let out = env
        .command(&["worker", "--queue", "default"])
        .env("HOMING_CONFIG", &config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("schedule 'broken'") && err.contains("unknown time zone"),
        "{err}"
    );
    let config = config_file(
        &env,
        serde_json::json!([{"name": "never", "task": "builtin.noop", "cron": "0 0 30 2 *"}]),
    );
    let out = env
        .command(&["worker", "--queue", "default"])
        .env("HOMING_CONFIG", &config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("schedule 'never'") && err.contains("never fires"),
        "{err}"
    );

    // The API: 400 with the reason, 404 for an unknown name; the good schedule is untouched.
    let http = http_client();
    for (cron, says) in [("61 * * * *", "cron"), ("0 0 31 4 *", "never fires")] {
        let r = http
            .put(format!("{base}/v1/schedules/bad"))
            .json(&serde_json::json!({"task": "builtin.noop", "cron": cron,
                                      "timezone": "Asia/Seoul"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{cron}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{cron}: {body}"
        );
    }
    let r = http
        .put(format!("{base}/v1/schedules/api"))
        .json(
            &serde_json::json!({"task": "builtin.noop", "cron": "0 3 * * *",
                                  "timezone": "Asia/Seoul", "missed": "all:2"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let s: serde_json::Value = r.json().await.unwrap();
    assert!(
        s["next_tick"].as_str().unwrap().ends_with("T18:00:00.000Z"),
        "{s}"
    );
    let typo = serde_json::json!({"task": "reports.nightyl", "every": "1h"});
    let r = http
        .put(format!("{base}/v1/schedules/api-typo"))
        .json(&typo)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unknown_task", "{body}");
    let mut allowed = typo.clone();
    allowed["allow_unknown_task"] = true.into();
    let r = http
        .put(format!("{base}/v1/schedules/api-typo"))
        .json(&allowed)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .delete(format!("{base}/v1/schedules/api-typo"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = http
        .post(format!("{base}/v1/schedules/nope/pause"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = http
        .delete(format!("{base}/v1/schedules/api"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let all: serde_json::Value = http
        .get(format!("{base}/v1/schedules"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = all["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["beat"]);
    assert_eq!(all["next"], serde_json::Value::Null, "one page");

    // The list comes a page at a time, by name.
    for name in ["p1", "p2", "p3"] {
        let r = http
            .put(format!("{base}/v1/schedules/{name}"))
            .json(&serde_json::json!({"task": "builtin.noop", "every": "1h"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    let get = |query: &'static str| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r = http
                .get(format!("{base}/v1/schedules{query}"))
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let names = |page: &serde_json::Value| -> Vec<String> {
        page["schedules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (status, first) = get("?limit=2").await;
    assert_eq!(status, 200);
    assert_eq!(names(&first), ["beat", "p1"]);
    assert_eq!(first["next"], "p1");
    let (_, second) = get("?limit=2&after=p1").await;
    assert_eq!(names(&second), ["p2", "p3"]);
    assert_eq!(second["next"], serde_json::Value::Null);
    for bad in ["?limit=0", "?limit=10001", "?limit=x", "?page=2"] {
        let (status, body) = get(bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
}

/// A cron whose every time falls in a daylight-saving gap (02:00-02:59 on the last Sunday of
/// March, in Paris) is refused after a second or more of searching. Many such PUTs at once are
/// checked one at a time: they do not each keep a thread of the blocking pool the embedded
/// store's calls share busy (hundreds filled it and held every enqueue of `homing up` for
/// minutes), each is answered 400 with the reason, and a job enqueued meanwhile runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_firing_crons_are_checked_one_at_a_time() {
    let env = Env::sqlite();
    let (up, base) = start_up_with(&env, &["--request-timeout", "10m"], &[]).await;
    let http = http_client();
    const PUTS: usize = 6;
    let puts: Vec<_> = (0..PUTS)
        .map(|i| {
            let put = http
                .put(format!("{base}/v1/schedules/gap-{i}"))
                .json(&serde_json::json!({"task": "builtin.noop",
                                          "cron": "* * 2 25-31 3 +SUN",
                                          "timezone": "Europe/Paris"}))
                .send();
            tokio::spawn(async move {
                let r = put.await.expect("PUT answered");
                let status = r.status();
                (status, r.text().await.unwrap_or_default())
            })
        })
        .collect();
    // Which threads work while the checks are pending: with one check at a time, one thread
    // at a time, though the next check may start on another thread before the first is idle
    // (a tick is 10 ms; the server's own loops seldom use 5 of them in 2 s).
    let busy = busy_threads(up.pid(), Duration::from_millis(300), Duration::from_secs(2)).await;
    assert!(
        busy.len() <= 3,
        "{PUTS} checks at once kept {} threads busy (thread, ticks): {busy:?}",
        busy.len()
    );
    let client = env.client().await;
    let id = client
        .enqueue(homing::EnqueueRequest::new(
            "builtin.noop",
            serde_json::json!({}),
        ))
        .await
        .expect("enqueue while checks wait")
        .id;
    wait_state(
        &client,
        id,
        homing::JobState::Succeeded,
        Duration::from_secs(60),
    )
    .await;
    for p in puts {
        let (status, body) = p.await.unwrap();
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("never fires in Europe/Paris"), "{body}");
    }
    let all: serde_json::Value = http
        .get(format!("{base}/v1/schedules"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(all["schedules"], serde_json::json!([]), "nothing stored");
}
