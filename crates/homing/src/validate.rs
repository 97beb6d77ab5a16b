//! The rules every stored value must pass, at the door. What homing stores has to be readable
//! back by every store and every reader, or one bad value breaks every view that touches it:
//! serde_json refuses documents nested deeper than 128 levels, PostgreSQL refuses U+0000 in
//! text and `jsonb`, and a name with spaces or control characters ends up raw in a metrics
//! label. So each kind of value has one rule here, and every door applies it before anything is
//! written: `Client::enqueue` (hence the HTTP API, the CLI and Rust producers), the Celery
//! ingress, and the worker for results, progress and errors.
//!
//! Depth: stored values (args, results, follow-up args) may be [`MAX_DEPTH`] levels deep. homing
//! derives other values from them by wrapping them a few levels deeper (a follow-up's args hold
//! `parent.result`, an event holds `job.args`, a webhook delivery holds `event.job.args`); the
//! deepest derived value is [`MAX_DEPTH`] + [`DERIVED_WRAP`] levels, well below what can be
//! read back. The module's tests build each derived value from the deepest accepted one.
//!
//! This module is a leaf: plain checks on strings, JSON values and numbers, no I/O.

use std::time::Duration;

/// The deepest JSON value a producer or handler may hand over (arrays and objects count a
/// level each; a scalar is level 0).
pub const MAX_DEPTH: usize = 64;
/// How many levels homing's own derived values add at most around a stored value; with
/// [`MAX_DEPTH`] it stays far below serde_json's read limit of 128.
pub const DERIVED_WRAP: usize = 8;
/// Task and queue names: `[A-Za-z0-9_.:-]`, 1 to this many bytes.
pub const MAX_NAME_LEN: usize = 128;
/// The largest `args` a job may carry, serialised. Big inputs belong in an object store, with
/// their address in the args.
pub const MAX_ARGS_BYTES: usize = 1024 * 1024;
/// The largest result a handler may return, serialised (room for `builtin.http`'s 1 MiB body
/// as an escaped string).
pub const MAX_RESULT_BYTES: usize = 8 * 1024 * 1024;
/// Error messages are cut to this many bytes before they are stored.
pub const MAX_ERROR_BYTES: usize = 8 * 1024;
/// Progress messages are cut to this many bytes.
pub const MAX_PROGRESS_MESSAGE_BYTES: usize = 1024;
/// Idempotency keys: 1 to this many bytes, no control characters.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 512;
/// The longest countdown, time limit or retry delay a job may ask for; beyond it a due date
/// would be meaningless (and arithmetic on it could overflow).
pub const MAX_DELAY: Duration = Duration::from_secs(366 * 24 * 3600);
/// The shortest time limit (zero would time every run out before it starts).
pub const MIN_TIME_LIMIT: Duration = Duration::from_millis(1);
/// Most retries a job may ask for.
pub const MAX_RETRIES: u32 = 10_000;
/// Crash budgets a job may ask for: at least one delivery, at most this many.
pub const MAX_CRASHES: u32 = 1_000;

/// Job priorities run from `-MAX_PRIORITY` to `MAX_PRIORITY` (default 0).
pub const MAX_PRIORITY: i32 = 1_000;
/// The shortest uniqueness window: below a second it would compare clocks more than jobs.
pub const MIN_UNIQUE_FOR: Duration = Duration::from_secs(1);

/// A job's priority: within [`MAX_PRIORITY`] either side of 0.
pub fn priority(p: i32) -> Result<(), String> {
    if (-MAX_PRIORITY..=MAX_PRIORITY).contains(&p) {
        Ok(())
    } else {
        Err(format!(
            "priority must be from -{MAX_PRIORITY} to {MAX_PRIORITY}, not {p}"
        ))
    }
}

/// Tasks only homing itself enqueues: event deliveries (whose args are trusted to be events),
/// Celery result writes and dead Celery records. A producer naming one could forge an alert or
/// a Celery result.
pub const INTERNAL_TASKS: [&str; 3] = ["builtin.webhook", "celery.result", "celery.malformed"];
/// Queues named `homing.…` belong to homing (`homing.webhooks`).
pub const INTERNAL_QUEUE_PREFIX: &str = "homing.";

/// A task or queue name: 1-128 bytes of letters, digits, `_`, `.`, `:` and `-` (what
/// `builtin.http`, `homing.webhooks`, `ocr` and Celery's `tasks.add` use).
pub fn name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-' | b':'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid {what} name {:?}: use 1-{MAX_NAME_LEN} characters of letters, digits, '.', '_', '-', ':'",
            shown(name)
        ))
    }
}

/// The tasks a refusal of an unknown task lists as known: sorted, once each, without the
/// internal ones (a producer that tried one would only be refused again).
pub fn enqueueable_tasks(mut names: Vec<String>) -> Vec<String> {
    names.retain(|t| !INTERNAL_TASKS.contains(&t.as_str()));
    names.sort();
    names.dedup();
    names
}

/// A task a producer may enqueue: a valid name that is not one of [`INTERNAL_TASKS`].
pub fn producer_task(task: &str) -> Result<(), String> {
    name("task", task)?;
    if INTERNAL_TASKS.contains(&task) {
        return Err(format!(
            "task '{task}' is internal to homing: only homing itself enqueues it"
        ));
    }
    Ok(())
}

/// A queue a producer may enqueue on: a valid name outside `homing.…`.
pub fn producer_queue(queue: &str) -> Result<(), String> {
    name("queue", queue)?;
    if queue.starts_with(INTERNAL_QUEUE_PREFIX) {
        return Err(format!(
            "queue '{queue}' is internal to homing (queues named {INTERNAL_QUEUE_PREFIX}… are reserved)"
        ));
    }
    Ok(())
}

/// An idempotency key: 1-512 bytes, no control characters.
pub fn idempotency_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES || key.chars().any(char::is_control)
    {
        return Err(format!(
            "idempotency_key must be 1-{MAX_IDEMPOTENCY_KEY_BYTES} bytes without control characters"
        ));
    }
    Ok(())
}

/// A JSON value to store as `what`: at most [`MAX_DEPTH`] levels, at most `max_bytes`
/// serialised, and no U+0000 in any string or key.
pub fn json(what: &str, v: &serde_json::Value, max_bytes: usize) -> Result<(), String> {
    use serde_json::Value;
    // An explicit stack: a Rust caller can build a value far deeper than any recursion survives.
    let mut stack: Vec<(&Value, usize)> = vec![(v, 0)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Array(a) => {
                if d + 1 > MAX_DEPTH {
                    return Err(too_deep(what));
                }
                stack.extend(a.iter().map(|x| (x, d + 1)));
            }
            Value::Object(m) => {
                if d + 1 > MAX_DEPTH {
                    return Err(too_deep(what));
                }
                for (k, x) in m {
                    if k.contains('\0') {
                        return Err(nul(what));
                    }
                    stack.push((x, d + 1));
                }
            }
            Value::String(s) if s.contains('\0') => return Err(nul(what)),
            _ => {}
        }
    }
    let size = serialised_len(v);
    if size > max_bytes {
        return Err(format!(
            "{what} is {size} bytes serialised; the limit is {max_bytes} (store large data elsewhere and pass its address)"
        ));
    }
    Ok(())
}

fn too_deep(what: &str) -> String {
    format!("{what} is nested deeper than {MAX_DEPTH} levels")
}

fn nul(what: &str) -> String {
    format!("{what} contains the character U+0000, which cannot be stored")
}

/// The length of `v` as JSON, without building the text.
pub fn serialised_len(v: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(b.len());
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    match serde_json::to_writer(&mut c, v) {
        Ok(()) => c.0,
        Err(_) => usize::MAX,
    }
}

/// A handler's result, before it is committed.
pub fn result(v: &serde_json::Value) -> Result<(), String> {
    json("the result", v, MAX_RESULT_BYTES)
}

/// Refuses JSON text holding an integer that does not fit in 64 bits (below -2^63 or above
/// 2^64 - 1). The JSON reader keeps such a number as a double without a word, so
/// 123456789012345678901234567890 would be stored, and handed to the task, as
/// 1.2345678901234568e29: a changed value, where every other rule refuses. `json` is text the
/// JSON reader has accepted; numbers inside strings are not numbers.
pub fn exact_integers(json: &[u8]) -> Result<(), String> {
    let mut i = 0;
    while i < json.len() {
        match json[i] {
            b'"' => {
                i += 1;
                while i < json.len() && json[i] != b'"' {
                    // An escape's next byte is never the closing quote.
                    i += if json[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < json.len()
                    && matches!(json[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let n = &json[start..i];
                let integer = !n.iter().any(|b| matches!(b, b'.' | b'e' | b'E'));
                // ASCII by the match above.
                let text = std::str::from_utf8(n).unwrap_or_default();
                let fits = text.parse::<u64>().is_ok() || text.parse::<i64>().is_ok();
                if integer && !fits {
                    let shown = if text.len() > 40 {
                        format!(
                            "{}… ({} digits)",
                            &text[..40],
                            text.trim_start_matches('-').len()
                        )
                    } else {
                        text.to_string()
                    };
                    return Err(format!(
                        "the integer {shown} does not fit in 64 bits \
                         (-9223372036854775808 to 18446744073709551615): it would be kept as a \
                         double and so changed; send it as a string"
                    ));
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// A text to store (an error, a reason, a progress message): U+0000 replaced, cut to
/// `max_bytes` on a character boundary with a marker saying so.
pub fn text(s: &str, max_bytes: usize) -> String {
    let clean = if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(s)
    };
    if clean.len() <= max_bytes {
        return clean.into_owned();
    }
    const MARK: &str = "… (truncated)";
    let mut cut = max_bytes.saturating_sub(MARK.len());
    while !clean.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{MARK}", &clean[..cut])
}

/// An error message to store: see [`text`], with [`MAX_ERROR_BYTES`].
pub fn error_text(s: &str) -> String {
    text(s, MAX_ERROR_BYTES)
}

/// A duration option of a job between `min` and `max` inclusive.
pub fn duration(what: &str, d: Duration, min: Duration, max: Duration) -> Result<(), String> {
    if d < min || d > max {
        return Err(format!(
            "{what} must be between {} and {} (got {})",
            humantime::format_duration(min),
            humantime::format_duration(max),
            humantime::format_duration(d)
        ));
    }
    Ok(())
}

/// A count option of a job between `min` and `max` inclusive.
pub fn count(what: &str, n: u32, min: u32, max: u32) -> Result<(), String> {
    if n < min || n > max {
        return Err(format!("{what} must be between {min} and {max} (got {n})"));
    }
    Ok(())
}

/// A name as it may be shown in an error: at most 200 bytes of it.
fn shown(s: &str) -> &str {
    let mut cut = s.len().min(200);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// `levels` nested arrays around `inner`: the shape hostile inputs take.
pub fn nested(levels: usize, inner: serde_json::Value) -> serde_json::Value {
    let mut v = inner;
    for _ in 0..levels {
        v = serde_json::Value::Array(vec![v]);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_beyond_64_bits_are_refused_and_the_rest_kept() {
        for ok in [
            r#"{"n": 18446744073709551615, "m": -9223372036854775808}"#,
            r#"[0, -0, 1.5, 1e400, 123456789012345678901234567890.0, 1E+30, -2.5e-7]"#,
            r#"{"s": "123456789012345678901234567890", "e": "\\\"99999999999999999999999"}"#,
            r#"{"123456789012345678901234567890": true}"#,
            "",
        ] {
            assert_eq!(exact_integers(ok.as_bytes()), Ok(()), "{ok}");
        }
        for (wide, shown) in [
            (r#"{"n": 18446744073709551616}"#, "18446744073709551616"),
            (r#"[-9223372036854775809]"#, "-9223372036854775809"),
            (
                r#"{"s": "a\"b", "n": [1, 99999999999999999999]}"#,
                "99999999999999999999",
            ),
        ] {
            let e = exact_integers(wide.as_bytes()).unwrap_err();
            assert!(
                e.contains(&format!("the integer {shown} does not fit in 64 bits")),
                "{e}"
            );
        }
        let long = format!("[{}]", "7".repeat(5000));
        let e = exact_integers(long.as_bytes()).unwrap_err();
        assert!(e.contains("… (5000 digits)") && e.len() < 300, "{e}");
        // Whatever serde_json reads an integer beyond 64 bits as, it is not that integer.
        let v: serde_json::Value = serde_json::from_str("123456789012345678901234567890").unwrap();
        assert!(v.is_f64());
    }

    #[test]
    fn the_known_tasks_of_a_refusal_leave_out_the_internal_ones() {
        let names = ["b.x", "builtin.webhook", "a.y", "b.x", "celery.result"];
        let listed = enqueueable_tasks(names.iter().map(|s| s.to_string()).collect());
        assert_eq!(listed, ["a.y", "b.x"]);
    }

    use serde_json::json;

    /// The longest chain of wrappings in homing: a follow-up (its args hold `parent.result`)
    /// fails, its event holds the follow-up as `job`, and the webhook delivery holds the event.
    #[test]
    fn derived_values_of_the_deepest_accepted_value_read_back() {
        use crate::events::{Event, NewEvent};
        use crate::job::{FollowUp, Job, JobState};
        let deepest = nested(MAX_DEPTH, json!(1));
        assert!(result(&deepest).is_ok());
        assert!(result(&nested(MAX_DEPTH + 1, json!(1))).is_err());
        let mut parent: Job = serde_json::from_value(json!({
            "id": crate::job::new_job_id(), "task": "t", "queue": "q", "state": "succeeded",
            "args": deepest, "result": deepest, "error": null, "attempts": 0, "crashes": 0,
            "epoch": 1, "max_retries": null, "max_crashes": 3, "idempotency_key": null,
            "progress": null, "worker": null, "created_at": "2024-01-01T00:00:00Z",
            "scheduled_at": null, "started_at": null, "finished_at": null,
            "on_success": {"task": "f", "args": nested(MAX_DEPTH - 1, json!(1))}
        }))
        .unwrap();
        let f: FollowUp = parent.on_success.clone().unwrap();
        let follow = f.job_for(&parent, JobState::Succeeded, 0);
        parent.args = follow.args.clone();
        parent.state = JobState::Failed;
        let ev = NewEvent::for_terminal(&parent).unwrap();
        let event = Event {
            id: 1,
            kind: ev.kind,
            job_id: ev.job_id,
            worker: None,
            data: ev.data,
            created_at: 0,
            dispatched_at: None,
        };
        let delivery = event.delivery_job(crate::events::CALLBACK_TARGET, 0);
        for (what, v) in [
            ("follow-up args", &follow.args),
            ("event data", &event.data),
            ("delivery args", &delivery.args),
            ("the job as JSON", &serde_json::to_value(&parent).unwrap()),
        ] {
            let depth = depth_of(v);
            assert!(depth <= MAX_DEPTH + DERIVED_WRAP, "{what} is {depth} deep");
            let text = serde_json::to_string(v).unwrap();
            let back: serde_json::Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{what} cannot be read back: {e}"));
            assert_eq!(&back, v);
        }
    }

    fn depth_of(v: &serde_json::Value) -> usize {
        match v {
            serde_json::Value::Array(a) => 1 + a.iter().map(depth_of).max().unwrap_or(0),
            serde_json::Value::Object(m) => 1 + m.values().map(depth_of).max().unwrap_or(0),
            _ => 0,
        }
    }

    #[test]
    fn internal_names_match_the_modules_that_own_them() {
        assert!(INTERNAL_TASKS.contains(&crate::events::WEBHOOK_TASK));
        assert!(crate::events::WEBHOOK_QUEUE.starts_with(INTERNAL_QUEUE_PREFIX));
        #[cfg(feature = "celery")]
        {
            assert!(INTERNAL_TASKS.contains(&crate::celery::results::RESULT_TASK));
            assert!(INTERNAL_TASKS.contains(&crate::celery::ingress::MALFORMED_TASK));
        }
    }

    #[test]
    fn names() {
        for ok in [
            "builtin.http",
            "homing.webhooks",
            "ocr",
            "tasks.add",
            "a:b-c_d",
            &"x".repeat(128),
        ] {
            assert!(name("task", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "no such task!!",
            "bad queue \u{0} é",
            "a/b",
            "a b",
            &"x".repeat(129),
        ] {
            assert!(name("queue", bad).is_err(), "{bad:?}");
        }
        assert!(producer_task("builtin.webhook")
            .unwrap_err()
            .contains("internal"));
        assert!(producer_task("celery.result").is_err());
        assert!(producer_task("builtin.http").is_ok());
        assert!(producer_queue("homing.webhooks")
            .unwrap_err()
            .contains("reserved"));
        assert!(producer_queue("homing").is_ok());
    }

    #[test]
    fn json_rules() {
        assert!(json("args", &json!({"a": [1, "x"]}), 100).is_ok());
        assert!(json("args", &json!({"a": "x\u{0}"}), 100)
            .unwrap_err()
            .contains("U+0000"));
        assert!(json("args", &json!({"a\u{0}": 1}), 100).is_err());
        assert!(json("args", &json!("0123456789"), 5)
            .unwrap_err()
            .contains("bytes"));
        // Far deeper than any recursion would survive: refused, no stack overflow.
        let mut deep = json!(null);
        for _ in 0..200_000 {
            deep = serde_json::Value::Array(vec![deep]);
        }
        assert!(json("args", &deep, usize::MAX)
            .unwrap_err()
            .contains("deeper"));
        // Dropping a very deep value recurses in serde_json; leak it instead in this test.
        std::mem::forget(deep);
    }

    #[test]
    fn texts_are_scrubbed_and_cut() {
        assert_eq!(text("a\u{0}b", 10), "a\u{FFFD}b");
        let long = "é".repeat(10_000);
        let cut = error_text(&long);
        assert!(cut.len() <= MAX_ERROR_BYTES && cut.ends_with("(truncated)"));
        assert!(idempotency_key("k\u{0}").is_err());
        assert!(idempotency_key("").is_err());
        assert!(idempotency_key("order-42").is_ok());
        assert!(duration("countdown", MAX_DELAY * 2, Duration::ZERO, MAX_DELAY).is_err());
        assert!(count("max_crashes", 0, 1, MAX_CRASHES).is_err());
    }
}
