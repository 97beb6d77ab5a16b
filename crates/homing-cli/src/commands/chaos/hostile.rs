//! Responsible for the hostile load: a few requests per second that a careless or malicious
//! producer could send to `POST /v1/jobs` (nesting deeper than can be read back, NUL in names,
//! numbers that used to overflow, homing's own internal tasks and queues). Each must be refused
//! with a 4xx while faults are injected; the checker then demands that none of them was stored
//! and that the good jobs kept every guarantee beside them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use homing::validate::nested;
use homing::Job;
use serde_json::{json, Value};

/// The marker every hostile body carries in its args (where it has args), so a stored one is
/// found however it got in.
pub const MARKER: &str = "chaos_hostile";

/// What the hostile load saw.
#[derive(Debug, Default)]
pub struct Outcome {
    pub sent: u64,
    /// Answers by case name and status, e.g. `deep_args 400`.
    pub answers: BTreeMap<String, u64>,
    /// Requests that were not refused with a 4xx: accepted or a 5xx.
    pub violations: Vec<String>,
    /// Requests that got no answer at all, with when they were sent: a violation unless a
    /// `server_kill` fault explains it ([`Outcome::unexplained`]).
    pub unanswered: Vec<(homing::time::Micros, String)>,
}

impl Outcome {
    /// The unanswered requests that no server kill in `kills` (start, end) explains.
    pub fn unexplained(
        &self,
        kills: &[(homing::time::Micros, homing::time::Micros)],
    ) -> Vec<String> {
        // A request may wait up to its client timeout before the kill cuts it.
        let before = homing::time::micros(Duration::from_secs(30));
        let after = homing::time::micros(Duration::from_secs(1));
        self.unanswered
            .iter()
            .filter(|(t, _)| {
                !kills
                    .iter()
                    .any(|(a, b)| *t + before >= *a && *t <= *b + after)
            })
            .map(|(_, m)| m.clone())
            .collect()
    }
}

/// The hostile bodies, by case name. `n` makes each body unique.
pub fn cases(n: u64) -> Vec<(&'static str, Value)> {
    let args = |extra: Value| json!({ MARKER: n, "x": extra });
    vec![
        // The observed attack: 126 levels parse, but the follow-up nests them deeper still.
        (
            "deep_args_with_follow_up",
            json!({"task": "builtin.noop", "args": nested(126, json!(n)),
                   "on_success": {"task": "builtin.noop"}, "queue": "chaos"}),
        ),
        (
            "args_past_depth_limit",
            json!({"task": "builtin.noop", "args": args(nested(70, json!(1))), "queue": "chaos"}),
        ),
        (
            "follow_up_args_too_deep",
            json!({"task": "builtin.noop", "args": args(json!(1)), "queue": "chaos",
                   "on_success": {"task": "builtin.noop", "args": nested(70, json!(1))}}),
        ),
        (
            "bad_task_name",
            json!({"task": "no such task!!", "args": args(json!(1)), "allow_unknown_task": true}),
        ),
        (
            "nul_in_queue",
            json!({"task": "builtin.noop", "args": args(json!(1)), "queue": "bad queue \u{0} é"}),
        ),
        (
            "bad_follow_up_names",
            json!({"task": "builtin.noop", "args": args(json!(1)), "queue": "chaos",
                   "on_success": {"task": "no such task!!", "queue": "bad queue \u{0} é"}}),
        ),
        (
            "internal_task",
            json!({"task": "builtin.webhook", "queue": "chaos", "args": {
                MARKER: n, "subscription": "ops",
                "event": {"id": 1, "event": "job.dead", "job": {"id": "forged"}}}}),
        ),
        (
            "internal_queue",
            json!({"task": "builtin.noop", "args": args(json!(1)), "queue": "homing.webhooks"}),
        ),
        (
            "internal_follow_up",
            json!({"task": "builtin.noop", "args": args(json!(1)), "queue": "chaos",
                   "on_failure": {"task": "celery.result", "args": {"celery": {"id": "x"}}}}),
        ),
        (
            "nul_in_args",
            json!({"task": "builtin.noop", "args": args(json!("a\u{0}b")), "queue": "chaos"}),
        ),
        (
            "huge_countdown",
            json!({"task": "builtin.noop", "args": args(json!(1)), "queue": "chaos", "countdown": "1e30"}),
        ),
        (
            "huge_time_limit",
            json!({"task": "builtin.noop", "args": args(json!(1)), "queue": "chaos",
                   "time_limit": "18446744073709551615s"}),
        ),
        (
            "huge_retry_delay",
            json!({"task": "builtin.noop", "args": args(json!(1)), "queue": "chaos",
                   "retry_policy": {"kind": "fixed", "delay": "1e30"}}),
        ),
        (
            "zero_max_crashes",
            json!({"task": "builtin.noop", "args": args(json!(1)), "queue": "chaos", "max_crashes": 0}),
        ),
        (
            "nul_idempotency_key",
            json!({"task": "builtin.noop", "args": args(json!(1)), "queue": "chaos",
                   "idempotency_key": format!("k\u{0}{n}")}),
        ),
        (
            "bad_callback_url",
            json!({"task": "builtin.noop", "args": args(json!(1)), "queue": "chaos",
                   "callback_url": "file:///etc/passwd"}),
        ),
    ]
}

/// Sends `rate` hostile bodies per second (cycling through [`cases`]) until `stop`.
pub async fn run(api: String, rate: f64, out: Arc<Mutex<Outcome>>, stop: CancellationToken) {
    if rate <= 0.0 {
        return;
    }
    let Ok(http) = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
    else {
        return;
    };
    let url = format!("{api}/v1/jobs");
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let all = cases(n);
        let (name, body) = &all[(n as usize) % all.len()];
        n += 1;
        let sent_at = homing::time::now();
        let answer = http.post(&url).json(body).send().await;
        let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
        o.sent += 1;
        match answer {
            Ok(r) => {
                let status = r.status().as_u16();
                *o.answers.entry(format!("{name} {status}")).or_default() += 1;
                if !(400..500).contains(&status) {
                    o.violations.push(format!(
                        "hostile request {name} was answered {status} instead of being refused with a 4xx"
                    ));
                }
            }
            Err(e) => o.unanswered.push((
                sent_at,
                format!(
                    "hostile request {name} got no answer (the handler may have panicked): {e}"
                ),
            )),
        }
    }
}

/// The stored jobs that a hostile request put there: any job off the load's queue and task,
/// or carrying the hostile marker.
pub fn stored(jobs: &[Job], queue: &str, task: &str) -> Vec<String> {
    jobs.iter()
        .filter(|j| {
            let ours = (j.queue == queue && j.task == task)
                // Event deliveries, if the environment configured webhooks.
                || (j.queue == homing::events::WEBHOOK_QUEUE
                    && j.task == homing::events::WEBHOOK_TASK);
            // The deep-nesting case has no object to carry the marker.
            !ours || j.args.get(MARKER).is_some() || matches!(j.args, Value::Array(_))
        })
        .map(|j| {
            format!(
                "job {} (task {:?} on queue {:?}) was stored although the load never sends it",
                j.id, j.task, j.queue
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every hostile body is refused by the library's rules or by the API's JSON reading, so
    /// the chaos invariant tests the server, not a body that is in fact valid.
    #[test]
    fn every_case_breaks_a_rule() {
        for (name, body) in cases(3) {
            // The API's body is the job options plus task, args and allow_unknown_task.
            let Ok(options) = serde_json::from_value::<homing::JobOptions>(body.clone()) else {
                continue; // refused while reading the body (a 4xx)
            };
            let req = homing::EnqueueRequest {
                task: body["task"].as_str().unwrap_or_default().to_string(),
                args: body["args"].clone(),
                options,
            };
            assert!(
                homing::client::validate_request(&req).is_err(),
                "{name} would be accepted"
            );
        }
    }
}
