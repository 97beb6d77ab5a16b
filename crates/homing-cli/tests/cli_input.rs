//! Every number and name a user can type into the `homing` command: out of range, huge, zero,
//! negative or malformed, each is refused with a one-line reason and a usage (2) or plain (1)
//! exit code before anything starts. Exit code 101 (a panic) must never happen: it used to, for
//! `--countdown 1e30`, and `--heartbeat-interval 18446744073709551615s` started workers that
//! overflowed at once.

use std::process::{Command, Output};

fn homing(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let url = format!("sqlite://{}/homing.db", dir.display());
    Command::new(env!("CARGO_BIN_EXE_homing"))
        .args(args)
        .env("HOMING_BROKER", &url)
        .env("HOMING_STORE", &url)
        .env_remove("HOMING_RETENTION")
        .envs(env.iter().copied())
        .current_dir(dir)
        .output()
        .expect("run homing")
}

/// Runs `args` and checks it was refused with `code`, a reason mentioning `about` on the first
/// line, and no panic.
fn refused(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)], code: i32, about: &str) {
    let out = homing(dir, args, env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        !stderr.contains("panicked"),
        "{args:?} {env:?} panicked:\n{stderr}"
    );
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?} {env:?} exit code; stderr:\n{stderr}"
    );
    assert!(
        first.starts_with("error:") && first.contains(about),
        "{args:?} {env:?}: first line should give the reason ({about}): {stderr}"
    );
}

#[test]
fn hostile_numbers_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let hostile = ["1e30", "18446744073709551615s", "-1", "-5s", "NaN", "soon"];
    // `--flag=VALUE`, so that "-1" is read as the flag's value rather than as a flag.
    let set = |flag: &str, v: &str| format!("{flag}={v}");
    for flag in ["--countdown", "--retry-delay", "--time-limit"] {
        for v in hostile.iter().chain(&["367d"]) {
            refused(d, &["enqueue", "builtin.noop", &set(flag, v)], &[], 2, flag);
        }
    }
    for v in hostile.iter().chain(&["367d"]) {
        let timeout = set("--timeout", v);
        refused(
            d,
            &["enqueue", "builtin.noop", "--wait", &timeout],
            &[],
            2,
            "--timeout",
        );
    }
    refused(
        d,
        &["enqueue", "builtin.noop", "--time-limit=0s"],
        &[],
        2,
        "between 1ms",
    );
    for (flag, bad) in [
        ("--max-crashes", "0"),
        ("--max-crashes", "1001"),
        ("--max-retries", "99999999999"),
        ("--max-retries", "-1"),
    ] {
        refused(
            d,
            &["enqueue", "builtin.noop", &set(flag, bad)],
            &[],
            2,
            flag,
        );
    }
    for cmd in [&["up"][..], &["worker", "--queue", "default"][..]] {
        for (flag, values) in [
            ("--heartbeat-interval", &["0", "5ms", "2h"][..]),
            ("--shutdown-grace", &["2h"][..]),
            ("--concurrency", &["0", "99999999999999999999", "1e30"][..]),
            ("--prefetch", &["0", "-3"][..]),
        ] {
            for v in hostile.iter().chain(values) {
                let arg = set(flag, v);
                let mut args = cmd.to_vec();
                args.push(&arg);
                refused(d, &args, &[], 2, flag);
            }
        }
        for v in ["1e30", "18446744073709551615s", "0", "-1", "500ms"] {
            refused(d, cmd, &[("HOMING_RETENTION", v)], 2, "--retention");
        }
    }
    for v in hostile {
        let arg = set("--rescue-interval", v);
        refused(d, &["server", &arg], &[], 2, "--rescue-interval");
    }
    refused(d, &["jobs", "list", "--limit=0"], &[], 2, "--limit");
    for (flag, v) in [
        ("--rate", "1e30"),
        ("--rate", "-1"),
        ("--duration", "1e30"),
        ("--max-crashes", "0"),
        ("--hostile-rate", "NaN"),
    ] {
        refused(d, &["chaos", &set(flag, v)], &[], 2, flag);
    }
}

#[test]
fn hostile_names_and_values_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A store to look into afterwards.
    let out = homing(d, &["migrate"], &[]);
    assert!(out.status.success(), "{out:?}");
    refused(
        d,
        &["enqueue", "no such task!!", "--allow-unknown-task"],
        &[],
        1,
        "invalid task name",
    );
    refused(d, &["enqueue", "builtin.webhook"], &[], 1, "internal");
    refused(
        d,
        &["enqueue", "builtin.noop", "--queue", "homing.webhooks"],
        &[],
        1,
        "internal",
    );
    refused(
        d,
        &["enqueue", "builtin.noop", "--queue", "bad queue é"],
        &[],
        1,
        "invalid queue name",
    );
    let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
    refused(
        d,
        &["enqueue", "builtin.noop", "--args", &deep],
        &[],
        1,
        "deeper than 64",
    );
    // An integer the JSON reader would keep as a double, changed: refused, not rounded.
    refused(
        d,
        &[
            "enqueue",
            "builtin.noop",
            "--args",
            r#"{"n": 123456789012345678901234567890}"#,
        ],
        &[],
        1,
        "does not fit in 64 bits",
    );
    // A HOMING_LOG that would silence every line (a bare word that is not a level) is refused;
    // a blank one is the default.
    refused(
        d,
        &["jobs", "list"],
        &[("HOMING_LOG", "garbage")],
        2,
        "HOMING_LOG",
    );
    let out = homing(d, &["jobs", "list"], &[("HOMING_LOG", "")]);
    assert!(out.status.success(), "{out:?}");
    // An endless file is read no further than twice the args limit (it once read until
    // memory ran out).
    refused(
        d,
        &["enqueue", "builtin.noop", "--args", "@/dev/zero"],
        &[],
        1,
        "longer than 2097152 bytes",
    );
    // A header no request can carry: refused at enqueue, not retried at every attempt.
    refused(
        d,
        &[
            "enqueue",
            "builtin.http",
            "--args",
            r#"{"url": "http://example.com/", "headers": {"bad header": "x"}}"#,
        ],
        &[],
        1,
        "invalid header name",
    );
    refused(
        d,
        &[
            "enqueue",
            "builtin.noop",
            "--callback-url",
            "file:///etc/passwd",
        ],
        &[],
        1,
        "callback_url",
    );
    refused(
        d,
        &["worker", "--queue", "a b"],
        &[],
        2,
        "invalid queue name",
    );
    // None of them was stored: the store holds no job at all.
    let out = homing(d, &["jobs", "list", "--json"], &[]);
    assert!(out.status.success(), "{out:?}");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list["jobs"], serde_json::json!([]), "{list}");
}
