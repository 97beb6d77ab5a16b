//! Issue 4, test 3: PostgreSQL restarted in the middle of 1,000 jobs. Its own test binary,
//! because it restarts the PostgreSQL server that every test in a binary shares.

mod support;

use std::time::Duration;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_mid_run_loses_nothing() {
    let env = Env::sqlite_broker_postgres_store().await;
    let counter = Counter::start().await;
    let w: Vec<Proc> = (0..2)
        .map(|i| env.worker(&format!("w{i}"), "pgr", &["--concurrency", "8"]))
        .collect();
    wait_workers(&env.client().await, "pgr", 2, Duration::from_secs(20)).await;
    let ids = load(&env, &counter, "pgr", 1000).await;
    // One grouped count per poll, not a read per job: the load must still be running when the
    // store goes away, and reading 1,000 jobs one by one can take longer than the load itself.
    let client = env.client().await;
    eventually(
        Duration::from_secs(60),
        "part of the load to finish",
        || async {
            let stats = client.store().queue_stats().await.ok()?;
            let q = stats.into_iter().find(|q| q.queue == "pgr")?;
            (q.succeeded >= 100).then_some(())
        },
    )
    .await;
    let pg = support::postgres::server();
    pg.stop();
    let stopped_at = homing::time::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    pg.start();
    assert_all_once(&env, &counter, &ids, Duration::from_secs(180)).await;
    assert!(
        w.iter().any(|p| p.log_text().contains("unavailable")),
        "the workers noticed the outage"
    );
    let mut after = 0;
    for id in &ids {
        if client.get(*id).await.unwrap().finished_at > Some(stopped_at) {
            after += 1;
        }
    }
    assert!(
        after > 0,
        "the restart should happen mid-run: every job finished before it"
    );
}
