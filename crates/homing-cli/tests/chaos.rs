//! The short form of `homing chaos` that runs on every CI run (docs/design.md section 10): a minute of
//! load and faults on the embedded backend, and a minute on Redis + PostgreSQL with every fault
//! kind, each failing the build on any violation of the guarantees; and 40 s of the same with
//! Python workers (`--worker-kind python`, the package in scripts/python-venv's virtualenv). The
//! long runs and their reports are in RELIABILITY.md.

use std::process::Command;

fn chaos(args: &[&str]) -> serde_json::Value {
    chaos_for(60, args)
}

fn chaos_for(seconds: u64, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_homing"))
        .arg("chaos")
        .args([
            "--duration",
            &format!("{seconds}s"),
            "--json",
            "--rate",
            "100",
            "--workers",
            "3",
        ])
        .args(["--drain-limit", "90s"])
        .args(args)
        .env_remove("HOMING_BROKER")
        .env_remove("HOMING_STORE")
        .output()
        .expect("run homing chaos");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("homing chaos printed no JSON report ({e}); exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status)
    });
    // The violations come first: a CI log cut short keeps its head.
    assert!(
        out.status.success() && report["ok"] == true,
        "chaos run failed (exit {:?}); violations: {}\n{}\nstderr:\n{stderr}",
        out.status,
        report["violations"],
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
    assert_eq!(report["lost"], 0);
    assert_eq!(report["completed_twice"], 0);
    assert_eq!(report["unexplained_duplicates"], 0);
    assert!(report["jobs"].as_u64().unwrap_or(0) > 1000, "{report}");
    // Hostile bodies ran beside the load and were all refused, none stored.
    assert!(
        report["hostile_sent"].as_u64().unwrap_or(0) > 100,
        "{report}"
    );
    assert_eq!(report["hostile_violations"], 0, "{report}");
    // The deployment's every-1s schedule: one job per tick, none missing, under every fault.
    let ticks = &report["schedule"];
    assert!(
        ticks["ticks"].as_u64().unwrap_or(0) >= seconds - 10,
        "{report}"
    );
    assert_eq!(ticks["duplicated"], 0, "{report}");
    assert_eq!(ticks["missing"], 0, "{report}");
    // The limited queue (concurrency 2): fed in bursts of four, never more than two calls in
    // flight, bar a presumed-dead worker's zombie call (explained, counted apart).
    let limited = &report["limited"];
    assert!(limited["jobs"].as_u64().unwrap_or(0) >= 40, "{report}");
    if limited["explained_excess"] == 0 {
        assert!(
            limited["max_in_flight"].as_u64().unwrap_or(99)
                <= limited["limit"].as_u64().unwrap_or(0),
            "{report}"
        );
    }
    // The counts kept by trigger (jobs per state; the embedded broker's depths) equal a recount.
    let kept = &report["kept_counts"];
    assert_eq!(kept["job_counts_drifted"], 0, "{report}");
    assert_eq!(kept["broker_depths_drifted"], 0, "{report}");
    for (kind, n) in report["faults"].as_object().expect("faults") {
        if kind != "unplanned_worker_exits" {
            assert!(
                n.as_u64().unwrap_or(0) >= 1,
                "fault {kind} was never injected: {report}"
            );
        }
    }
    report
}

#[test]
fn chaos_embedded_loses_nothing_and_completes_nothing_twice() {
    let r = chaos(&["--seed", "7"]);
    assert!(r["recovery_s"]["samples"].as_u64().unwrap_or(0) > 0, "{r}");
    // The write lock held past the TTL, and no second call explained by that alone.
    assert!(r["faults"]["lock_hold"].as_u64().unwrap_or(0) >= 1, "{r}");
}

#[test]
fn chaos_redis_postgres_with_every_fault_kind() {
    let r = chaos(&["--seed", "11", "--broker", "redis", "--store", "postgres"]);
    for kind in [
        "redis_restart",
        "redis_flushall",
        "net_cut",
        "postgres_restart",
    ] {
        assert!(r["faults"][kind].as_u64().unwrap_or(0) >= 1, "{r}");
    }
}

/// The Python package's interpreter, as scripts/python-venv makes it (CI runs that script
/// before the tests), or $HOMING_PYTHON.
fn python() -> String {
    let py = std::env::var("HOMING_PYTHON").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/python-venv/bin/python"
        )
        .to_string()
    });
    assert!(
        std::path::Path::new(&py).exists(),
        "{py} is missing: run scripts/python-venv first (it needs the Debian packages python3 and python3-venv), or set HOMING_PYTHON"
    );
    py
}

#[test]
fn chaos_python_workers_on_redis_postgres_with_every_fault_kind() {
    let py = python();
    let r = chaos_for(
        40,
        &[
            "--seed",
            "13",
            "--broker",
            "redis",
            "--store",
            "postgres",
            "--worker-kind",
            "python",
            "--python",
            &py,
            "--fault-every",
            "2s",
        ],
    );
    assert_eq!(r["worker_kind"], "python", "{r}");
    for kind in [
        "kill9",
        "kill9_mid_commit",
        "pause",
        "redis_restart",
        "redis_flushall",
        "net_cut",
        "postgres_restart",
        "server_kill",
    ] {
        assert!(r["faults"][kind].as_u64().unwrap_or(0) >= 1, "{r}");
    }
}
