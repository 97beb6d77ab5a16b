//! The `homing` binary with `--broker redis://…` (the store stays SQLite): the CLI opens the
//! Redis broker, and the crash guarantees hold with real worker processes killed with SIGKILL.
//! The test binary starts its own `redis-server` on a loopback port.

#[path = "../../homing/tests/support/redis_server.rs"]
mod redis_server;
mod support;

use std::time::{Duration, Instant};
use support::*;

use homing::{EnqueueRequest, JobState};
use redis_server::{unique_prefix, RedisServer};

/// An environment whose broker is the Redis server and whose store is an SQLite file.
fn redis_env(server: &RedisServer, what: &str) -> Env {
    let mut env = Env::sqlite();
    env.broker = server.url(&unique_prefix(what));
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn enqueue_and_run_through_the_cli() {
    let server = RedisServer::tcp("cli-pw");
    let env = redis_env(&server, "cli");
    let _worker = env.worker("w", "default", &["--concurrency", "2"]);
    wait_workers(&env.client().await, "default", 1, Duration::from_secs(20)).await;
    let (code, out, err) = env.run(&[
        "enqueue",
        "builtin.noop",
        "--args",
        r#"{"hello":"redis"}"#,
        "--wait",
    ]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let job: serde_json::Value = serde_json::from_str(&out).expect("the final record as JSON");
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["result"], serde_json::json!({"hello": "redis"}));
    assert!(
        !err.contains("cli-pw") && !out.contains("cli-pw"),
        "the Redis password must never be printed"
    );
}

/// Guarantees 1, 2 and 5 on the Redis broker: jobs calling an external service, one worker
/// killed mid-job twice; every job succeeds, none runs twice without a kill in between, and
/// reclaimed jobs run again within the heartbeat TTL plus a sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_job_on_redis_loses_nothing_and_completes_nothing_twice() {
    let server = RedisServer::unix();
    let env = redis_env(&server, "crash");
    let counter = Counter::start().await;
    let client = env.client().await;
    let queue = "crash";
    let mut w1 = env.worker("w1-0", queue, &["--concurrency", "4"]);
    let _w2 = env.worker("w2", queue, &["--concurrency", "4"]);
    wait_workers(&client, queue, 2, Duration::from_secs(20)).await;

    let reqs: Vec<EnqueueRequest> = (0..80)
        .map(|_| {
            let mut r = http_job(&counter.url("delay_ms=300"));
            r.options.queue = Some(queue.into());
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

    let mut kills = Vec::new();
    for round in 1..=2 {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        w1.kill9();
        kills.push(Instant::now());
        w1 = env.worker(&format!("w1-{round}"), queue, &["--concurrency", "4"]);
    }

    let jobs = wait_all_terminal(&client, &ids, Duration::from_secs(90)).await;
    let mut reclaimed = 0;
    for j in &jobs {
        assert_eq!(j.state, JobState::Succeeded, "{j:?}");
        assert_eq!(
            j.epoch,
            u64::from(j.crashes) + 1,
            "one start per delivery: {j:?}"
        );
        if j.crashes > 0 {
            reclaimed += 1;
        }
        let calls = counter.calls(&j.id.to_string());
        assert!(!calls.is_empty(), "job {} never called the service", j.id);
        for pair in calls.windows(2) {
            let kill = kills
                .iter()
                .find(|k| **k >= pair[0].at && **k <= pair[1].at)
                .unwrap_or_else(|| panic!("job {} called twice without a kill in between", j.id));
            let recovery = pair[1].at.duration_since(*kill);
            assert!(
                recovery <= Duration::from_millis(600 + 200 + 1000),
                "job {} ran again {recovery:?} after the kill",
                j.id
            );
        }
    }
    assert!(
        reclaimed >= 2,
        "each kill should have interrupted at least one job (reclaimed {reclaimed})"
    );
    // Everything gets acknowledged, including the duplicates the workers' first reconciler
    // pass published (a fresh namespace has no marker): the queue's stream empties.
    let stream = format!(
        "{}:{{q:{queue}}}:stream",
        env.broker.rsplit('=').next().unwrap()
    );
    eventually(Duration::from_secs(20), "the stream to empty", || async {
        (server.cli(&["XLEN", &stream]) == "0").then_some(())
    })
    .await;
}
