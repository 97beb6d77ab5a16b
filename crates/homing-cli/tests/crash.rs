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
