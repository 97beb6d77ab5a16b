//! Crash tests with real processes (docs/design.md section 10): workers are killed with SIGKILL in the
//! middle of jobs, and the guarantees of section 1 are checked from the store and from an
//! external counter of handler calls.

mod support;

use std::time::{Duration, Instant};
use support::*;

use homing::{EnqueueRequest, JobState};

/// Guarantees 1, 2, 3 and 5: 200 jobs calling an external service, one worker killed mid-job
/// three times and restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_job_loses_nothing_and_completes_nothing_twice() {
    kill_9_scenario(Env::sqlite(), Scenario::default()).await;
}

/// The same scenario with the store in PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_job_with_a_postgres_store() {
    kill_9_scenario(
        Env::sqlite_broker_postgres_store().await,
        Scenario::default(),
    )
    .await;
}

/// Guarantee 4: a job far longer than the heartbeat TTL is never redelivered while its worker lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn long_job_runs_exactly_once_while_its_worker_lives() {
    let env = Env::sqlite();
    let counter = Counter::start().await;
    let client = env.client().await;
    let _w1 = env.worker("w1", "long", &["--concurrency", "2"]);
    let _w2 = env.worker("w2", "long", &["--concurrency", "2"]);
    wait_workers(&client, "long", 2, Duration::from_secs(20)).await;
    let mut r = http_job(&counter.url("delay_ms=5000"));
    r.options.queue = Some("long".into());
    let id = client.enqueue(r).await.unwrap().id;
    let jobs = wait_all_terminal(&client, &[id], Duration::from_secs(30)).await;
    let j = &jobs[0];
    assert_eq!(j.state, JobState::Succeeded);
    assert_eq!(
        counter.count(&id.to_string()),
        1,
        "the handler ran more than once"
    );
    assert_eq!((j.epoch, j.crashes, j.attempts), (1, 0, 0));
}

/// Guarantee 6: a job that kills its worker every time is dead after 3 crashes, with the reason,
/// and the queue keeps flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_job_is_dead_after_three_crashes_and_the_queue_flows() {
    let env = Env::sqlite();
    let client = env.client().await;
    let queue = "poison";
    let mut poison = EnqueueRequest::new("test.abort", serde_json::json!({}));
    poison.options.queue = Some(queue.into());
    let poison_id = client.enqueue(poison).await.unwrap().id;
    let others: Vec<EnqueueRequest> = (0..30)
        .map(|i| {
            let mut r = EnqueueRequest::new("builtin.sleep", serde_json::json!({ "ms": 20 + i }));
            r.options.queue = Some(queue.into());
            r
        })
        .collect();
    let other_ids: Vec<_> = client
        .enqueue_many(others)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();

    // A supervisor, as systemd or Kubernetes would be: restart workers that die.
    let mut workers: Vec<Proc> = (0..2)
        .map(|i| env.worker(&format!("w{i}-0"), queue, &["--concurrency", "2"]))
        .collect();
    let mut restarts = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let p = client.get(poison_id).await.unwrap();
        let others_done = {
            let mut done = true;
            for id in &other_ids {
                if !client.get(*id).await.unwrap().state.is_terminal() {
                    done = false;
                    break;
                }
            }
            done
        };
        if p.state.is_terminal() && others_done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "poison scenario did not settle: poison is {:?}",
            p.state
        );
        for (i, w) in workers.iter_mut().enumerate() {
            if w.exited() {
                restarts += 1;
                *w = env.worker(&format!("w{i}-{restarts}"), queue, &["--concurrency", "2"]);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let p = client.get(poison_id).await.unwrap();
    assert_eq!(p.state, JobState::Dead, "{p:?}");
    assert_eq!(p.crashes, 3);
    assert_eq!(p.attempts, 0);
    let reason = p.error.unwrap_or_default();
    assert!(
        reason.contains("lost its worker 3 times"),
        "reason: {reason}"
    );
    assert_eq!(
        restarts, 3,
        "the poison job should have killed exactly three workers"
    );
    for id in other_ids {
        assert_eq!(client.get(id).await.unwrap().state, JobState::Succeeded);
    }
}

/// Guarantees 2 and 4: a worker paused longer than its heartbeat TTL (a zombie) is presumed dead;
/// its job runs again elsewhere under a new epoch; when it wakes its write is rejected, and it
/// rejoins under a new identity and keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zombie_worker_cannot_overwrite_the_newer_run() {
    let env = Env::sqlite();
    let counter = Counter::start().await;
    let client = env.client().await;
    let zombie = env.worker("zombie", "z", &["--concurrency", "1"]);
    wait_workers(&client, "z", 1, Duration::from_secs(20)).await;
    let mut r = http_job(&counter.url("delay_ms=1500"));
    r.options.queue = Some("z".into());
    let id = client.enqueue(r).await.unwrap().id;
    let first = wait_state(&client, id, JobState::Running, Duration::from_secs(10)).await;
    let zombie_identity = first.worker.clone().unwrap();
    // Paused only once its handler's call is out: paused between the start and the call (a
    // loaded machine), the zombie's call would come after the newer run's.
    eventually(Duration::from_secs(10), "the first run's call", || async {
        (counter.count(&id.to_string()) == 1).then_some(())
    })
    .await;
    std::process::Command::new("kill")
        .args(["-STOP", &zombie.pid().to_string()])
        .status()
        .unwrap();

    let _other = env.worker("other", "z", &["--concurrency", "1"]);
    let done = wait_state(&client, id, JobState::Succeeded, Duration::from_secs(20)).await;
    assert_eq!(done.epoch, 2);
    assert_eq!(done.crashes, 1);
    assert_ne!(done.worker.as_deref(), Some(zombie_identity.as_str()));
    assert_eq!(
        done.result.as_ref().unwrap()["body"]["call"],
        2,
        "the newer run's result is committed"
    );

    std::process::Command::new("kill")
        .args(["-CONT", &zombie.pid().to_string()])
        .status()
        .unwrap();
    // The zombie wakes, learns it was presumed dead, and comes back under a new name.
    eventually(Duration::from_secs(10), "the zombie to rejoin", || async {
        let log = zombie.log_text();
        (log.contains("presumed dead") && log.matches("worker.ready").count() >= 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = client.get(id).await.unwrap();
    assert_eq!(
        after.result, done.result,
        "the zombie's write must be rejected"
    );
    assert_eq!(after.epoch, 2);
    // The rejoined zombie still works: more jobs than one worker would take all finish.
    let reqs: Vec<_> = (0..6)
        .map(|_| {
            let mut r = http_job(&counter.url("delay_ms=300"));
            r.options.queue = Some("z".into());
            r
        })
        .collect();
    let ids: Vec<_> = client
        .enqueue_many(reqs)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    let jobs = wait_all_terminal(&client, &ids, Duration::from_secs(30)).await;
    assert!(jobs.iter().all(|j| j.state == JobState::Succeeded));
    let workers: std::collections::HashSet<_> =
        jobs.iter().filter_map(|j| j.worker.clone()).collect();
    assert_eq!(
        workers.len(),
        2,
        "both the other worker and the rejoined zombie ran jobs: {workers:?}"
    );
}

/// The worker view over the API (docs/workers.md): a worker killed with SIGKILL while it runs a
/// job is listed `lost`, with when it was declared lost and the job reclaimed from it (its id,
/// the lost run's epoch, `requeued`); a worker stopped with SIGTERM is `stopped`, never `lost`,
/// with nothing reclaimed. Both show the version and heartbeat TTL they registered with; while
/// live, the victim shows its heartbeat's age (under the TTL), host, pid, concurrency and the
/// job it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_worker_is_listed_lost_with_its_reclaimed_job() {
    let env = Env::sqlite();
    // The `up` process serves the API and runs the rescuer; it does not serve queue `wv`.
    let (_up, base) = start_up_with(&env, &["--queue", "elsewhere"], &[]).await;
    let http = http_client();
    let client = env.client().await;
    // Not the default concurrency (8), so the view is seen to carry the worker's own.
    let mut victim = env.worker("victim", "wv", &["--no-maintenance", "--concurrency", "3"]);
    let mut quitter = env.worker("quitter", "wv-quit", &["--no-maintenance"]);
    wait_workers(&client, "wv", 1, Duration::from_secs(30)).await;
    wait_workers(&client, "wv-quit", 1, Duration::from_secs(30)).await;
    let id = http
        .post(format!("{base}/v1/jobs"))
        .json(&serde_json::json!({"task": "builtin.sleep", "queue": "wv", "args": {"ms": 600000}}))
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let job_id: homing::JobId = id.parse().unwrap();
    let running = wait_state(&client, job_id, JobState::Running, Duration::from_secs(30)).await;
    let worker = running
        .worker
        .clone()
        .expect("a running job names its worker");
    let get = |path: String| {
        let http = http.clone();
        async move {
            let r = http.get(path).send().await.unwrap();
            (
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let (status, live) = get(format!("{base}/v1/workers/{worker}")).await;
    assert_eq!(status, 200, "{live}");
    assert_eq!(live["status"], "live");
    assert_eq!(live["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(live["heartbeat_ttl_ms"], 600);
    assert!(
        live["lost_at"].is_null()
            && live["ended_at"].is_null()
            && live["presumed_dead_at"].is_null(),
        "{live}"
    );
    assert_eq!(live["pid"], victim.pid());
    assert_eq!(live["concurrency"], 3, "{live}");
    // The worker names its host from /etc/hostname (empty without one).
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    assert_eq!(live["hostname"], host.trim(), "{live}");
    // Its heartbeat: current, and its age is the TTL minus the time it has left.
    assert_eq!(live["alive"], true, "{live}");
    let ttl = live["heartbeat_ttl_s"]
        .as_f64()
        .expect("the TTL in seconds");
    assert!((ttl - 0.6).abs() < 1e-9, "{live}");
    let age = live["heartbeat_age_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("a live worker's heartbeat age is a number: {live}"));
    assert!(
        (0.0..ttl).contains(&age),
        "heartbeat age in [0, TTL): {live}"
    );
    let left = live["heartbeat_expires_in_s"].as_f64().expect("time left");
    assert!(
        (age + left - ttl).abs() < 1e-6,
        "age = TTL - time left: {live}"
    );
    // The job it runs is listed under it, by id.
    let jobs = live["running_jobs"].as_array().expect("running_jobs");
    assert_eq!(jobs.len(), 1, "{live}");
    assert_eq!(jobs[0]["id"], id.as_str());
    assert_eq!(jobs[0]["task"], "builtin.sleep");
    assert_eq!(jobs[0]["queue"], "wv");
    assert!(
        jobs[0]["running_for_s"].as_f64().is_some_and(|s| s >= 0.0),
        "{live}"
    );
    assert_eq!(live["running"], serde_json::json!([id.as_str()]), "{live}");

    victim.kill9();
    let lost = eventually(
        Duration::from_secs(60),
        "the killed worker listed lost with its reclaimed job",
        || {
            let (get, url) = (&get, format!("{base}/v1/workers/{worker}"));
            async move {
                let (_, w) = get(url).await;
                (w["status"] == "lost" && !w["reclaimed"].as_array()?.is_empty()).then_some(w)
            }
        },
    )
    .await;
    assert!(lost["lost_at"].is_string(), "{lost}");
    assert_eq!(lost["lost_at"], lost["ended_at"]);
    // First found without a heartbeat no later than declared lost (RFC 3339 in UTC with
    // milliseconds: the strings sort as the times do).
    let presumed = lost["presumed_dead_at"].as_str().expect("presumed_dead_at");
    assert!(presumed <= lost["lost_at"].as_str().unwrap(), "{lost}");
    let reclaimed = lost["reclaimed"].as_array().unwrap();
    assert_eq!(reclaimed.len(), 1, "{lost}");
    assert_eq!(reclaimed[0]["job"], id.as_str());
    assert_eq!(reclaimed[0]["epoch"], running.epoch);
    assert_eq!(reclaimed[0]["outcome"], "requeued");
    // The list carries the same.
    let (_, list) = get(format!("{base}/v1/workers")).await;
    let listed = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == worker.as_str())
        .expect("the lost worker stays listed");
    assert_eq!(listed["reclaimed"], lost["reclaimed"]);
    let job = client.get(job_id).await.unwrap();
    assert_eq!(job.crashes, 1);

    // A clean stop is `stopped`.
    let quitter_id = {
        let (_, list) = get(format!("{base}/v1/workers")).await;
        list["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["queues"][0] == "wv-quit" && w["status"] == "live")
            .expect("the quitter is live")["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(quitter.terminate(Duration::from_secs(30)), Some(0));
    let (_, stopped) = get(format!("{base}/v1/workers/{quitter_id}")).await;
    assert_eq!(stopped["status"], "stopped", "{stopped}");
    assert!(stopped["ended_at"].is_string() && stopped["lost_at"].is_null());
    assert_eq!(stopped["reclaimed"], serde_json::json!([]));
    // An unknown worker is a 404 with the error body.
    let (status, body) = get(format!("{base}/v1/workers/no-such-worker")).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "not_found");
    // The CLI shows the version, the heartbeat against its TTL and when it ended.
    let (code, out, err) = env.run(&["workers"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("VERSION") && out.contains("HEARTBEAT AGE / TTL"),
        "{out}"
    );
    let line = out.lines().find(|l| l.starts_with(&worker)).unwrap();
    assert!(
        line.contains("lost") && line.contains("1 job reclaimed"),
        "{line}"
    );
}
