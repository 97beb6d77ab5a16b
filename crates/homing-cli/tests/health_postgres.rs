//! Issue 17: `/healthz` tells the truth about a store that went away, and the maintenance loops
//! back off instead of spinning while it is gone. Its own test binary, because it stops the
//! PostgreSQL server that every test in a binary shares.

mod support;

use std::time::{Duration, Instant};
use support::*;

async fn health(http: &reqwest::Client, base: &str) -> Option<(u16, serde_json::Value)> {
    let r = http.get(format!("{base}/healthz")).send().await.ok()?;
    let status = r.status().as_u16();
    Some((status, r.json().await.ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn healthz_reports_a_lost_store_and_failing_loops_then_recovers() {
    let env = Env::sqlite_broker_postgres_store().await;
    let listen = format!("127.0.0.1:{}", free_port());
    let mut server = env.spawn(
        "server",
        &[
            "server",
            "--listen",
            &listen,
            "--rescue-interval",
            "200ms",
            "--unhealthy-after",
            "1s",
        ],
    );
    let base = format!("http://{listen}");
    homing::tls::install_crypto_provider();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let (_, ok) = eventually(
        Duration::from_secs(30),
        "a healthy server with its loops reporting",
        || async {
            health(&http, &base).await.filter(|(s, b)| {
                *s == 200
                    && ["rescuer", "scheduler", "reconciler"].iter().all(|name| {
                        b["loops"]
                            .as_array()
                            .is_some_and(|ls| ls.iter().any(|l| l["name"] == *name))
                    })
            })
        },
    )
    .await;
    assert_eq!(ok["status"], "ok");

    let pg = support::postgres::server();
    pg.stop();
    let stopped = Instant::now();
    let (_, down) = eventually(
        Duration::from_secs(60),
        "503 naming the store and the failing loops",
        || async {
            health(&http, &base).await.filter(|(s, b)| {
                *s == 503
                    && b["store_ok"] == false
                    && b["failing"]
                        .as_array()
                        .is_some_and(|f| f.iter().any(|n| n == "scheduler"))
            })
        },
    )
    .await;
    let message = down["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("postgres store cannot be read"), "{down}");
    assert!(message.contains("scheduler"), "{down}");
    // Leave it down a while: a loop that spins would fill the log meanwhile.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(stopped.elapsed())).await;
    let outage = stopped.elapsed();
    let failures_logged = server.log_text().matches("scheduler pass failed").count();
    pg.start();

    let (_, back) = eventually(Duration::from_secs(90), "200 after the restart", || async {
        health(&http, &base).await.filter(|(s, _)| *s == 200)
    })
    .await;
    assert!(
        back["loops"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["failing"] == false),
        "{back}"
    );
    // The scheduler runs every 100 ms: without backoff it would have failed about ten times a
    // second; doubling waits make it a handful over the whole outage.
    assert!(
        outage >= Duration::from_secs(5),
        "the outage lasted {outage:?}"
    );
    assert!(
        (1..=15).contains(&failures_logged),
        "scheduler failures logged during a {outage:?} outage: {failures_logged}"
    );
    assert_eq!(server.terminate(Duration::from_secs(30)), Some(0));
}
