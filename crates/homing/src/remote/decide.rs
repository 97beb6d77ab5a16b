//! The remote gateway's decisions, as pure functions: what a worker's report commits, which of
//! a session's running jobs its heartbeat shows lost, what a completion the store refused was
//! (already applied, or a zombie's), and the lease a worker hands back. A leaf like
//! [`crate::transition`]: no I/O, so each rule is tested against every input here.

use std::collections::HashSet;
use std::time::Duration;

use super::{Completed, ReportKind, Status, TaskDeclaration};
use crate::job::{Job, JobId, JobState};
use crate::retry::{RetryPolicy, DEFAULT_MAX_RETRIES};
use crate::store::{CompletionState, Outcome, RunningUnder};
use crate::task::{TaskDefaults, TaskError};
use crate::time::{micros, Micros};

/// The defaults a job of a task gets when it did not set the option itself: those the worker's
/// code declared at registration, else homing's.
pub fn defaults(declared: Option<&TaskDeclaration>) -> TaskDefaults {
    let base = TaskDefaults::default();
    let Some(d) = declared else { return base };
    TaskDefaults {
        queue: base.queue,
        max_retries: d.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
        retry_policy: d
            .retry_delay_ms
            .map(|ms| RetryPolicy::Fixed {
                delay: Duration::from_millis(ms),
            })
            .unwrap_or(base.retry_policy),
        time_limit: d
            .time_limit_ms
            .map(Duration::from_millis)
            .unwrap_or(base.time_limit),
    }
}

/// What a worker reported for one run, as read from the wire (already validated).
#[derive(Debug, Clone, PartialEq)]
pub struct ReportIn<'a> {
    pub kind: ReportKind,
    pub result: Option<&'a super::Reported>,
    pub error: Option<&'a str>,
    pub retry_delay: Option<Duration>,
    pub delay: Option<Duration>,
}

/// The outcome a report commits, the same rule as a Rust handler's ([`TaskError`] through the
/// executor's `outcome_for_error`): an error is retried while the job's budget lasts (the job's
/// own `max_retries` / retry policy, else the declared defaults), with the delay the worker
/// asked for, else the policy's; a result that breaks a storage rule fails the job instead of
/// being stored. `job` is the job as it runs (its attempts and options); only an error needs
/// it, and without it (a missing job) the error is committed as failed, which the fence refuses.
pub fn outcome(
    r: &ReportIn<'_>,
    job: Option<&Job>,
    declared: Option<&TaskDeclaration>,
    now: Micros,
) -> Outcome {
    let error = || crate::validate::error_text(r.error.unwrap_or("(no error text)"));
    match r.kind {
        ReportKind::Succeeded => {
            let checked = match r.result {
                None => Ok(serde_json::Value::Null),
                Some(super::Reported::Value(v)) => crate::validate::result(v).map(|()| v.clone()),
                Some(super::Reported::Inexact(e)) => Err(e.clone()),
            };
            match checked {
                Ok(value) => Outcome::Succeeded(value),
                Err(e) => Outcome::Failed {
                    error: format!("the handler's result was refused: {e}"),
                },
            }
        }
        ReportKind::Error => {
            let err = match r.retry_delay {
                Some(d) => TaskError::RetryIn(error(), d),
                None => TaskError::Retry(error()),
            };
            match job {
                Some(job) => crate::worker::outcome_for_error(job, &defaults(declared), err, now),
                None => Outcome::Failed { error: error() },
            }
        }
        ReportKind::Fatal => Outcome::Failed { error: error() },
        ReportKind::Snooze => Outcome::Snooze {
            at: now.saturating_add(micros(r.delay.unwrap_or_default())),
        },
        ReportKind::Cancelled => Outcome::Cancelled,
        ReportKind::Released => Outcome::Released,
    }
}

/// What a completion the store did not apply (its fence did not hold) was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// This epoch's completion was committed earlier: a retried call whose answer was lost.
    AlreadyApplied(JobState),
    /// A write for a run that no longer owns the job (a zombie's), or for a missing job.
    Stale,
}

/// Tells a retried completion from a zombie's: only the last committed completion's epoch is
/// recorded, so a retry that arrives after a later run of the job committed is `Stale` too (its
/// result was applied then, and is overwritten by the later run's anyway).
pub fn refused(found: Option<CompletionState>, epoch: u64) -> Refused {
    match found {
        Some(c) if c.completed_epoch == Some(epoch) => Refused::AlreadyApplied(c.state),
        _ => Refused::Stale,
    }
}

/// The heartbeat's housekeeping: of the jobs the store shows running under a session, those the
/// session did not list as held and that started more than one TTL ago are lost (a server died
/// between starting them and answering `reserve`, or the worker forgot them). A job started
/// less than a TTL ago may still be on its way to the worker in a `reserve` answer.
pub fn unheld(
    running: &[RunningUnder],
    held: &HashSet<JobId>,
    ttl: Duration,
    now: Micros,
) -> Vec<JobId> {
    running
        .iter()
        .filter(|r| !held.contains(&r.id) && r.started_at.saturating_add(micros(ttl)) < now)
        .map(|r| r.id)
        .collect()
}

/// The start of the error the server commits for a remote run it stopped at its time limit,
/// which is also how a late completion of that run is told from a retried one.
pub const SERVER_TIME_LIMIT: &str = "remote time limit";

/// The error committed for a run the server stopped at `limit`.
pub fn time_limit_error(limit: Duration) -> String {
    format!(
        "{SERVER_TIME_LIMIT}: time limit of {} exceeded, and the worker did not report within its grace; the server stopped waiting for it",
        humantime::format_duration(limit)
    )
}

/// Whether a held run started at `started_at` is past its time limit plus `grace` (the
/// session's TTL: time for the worker's own timeout report to arrive first). Such a run is
/// ended by the server exactly as a Rust worker ends a handler at its limit.
pub fn over_limit(started_at: Micros, limit: Duration, grace: Duration, now: Micros) -> bool {
    started_at
        .saturating_add(micros(limit))
        .saturating_add(micros(grace))
        < now
}

/// Whether a refused completion whose epoch matches the job's last completion is a late report
/// of a run the server stopped at its time limit (`Stale`: the worker never sent that
/// completion) rather than a retried call (`AlreadyApplied`). The server's completion of such a
/// run is an error that retries or fails the job, carrying [`SERVER_TIME_LIMIT`].
pub fn stopped_by_server(job: Option<&Job>) -> bool {
    job.is_some_and(|j| {
        !matches!(
            j.state,
            JobState::Succeeded | JobState::Cancelled | JobState::Queued
        ) && j
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with(SERVER_TIME_LIMIT))
    })
}

/// A lease: what acknowledging one delivery needs (its queue and broker tag) and what its
/// metrics are labelled with (its task), opaque to the worker, and the job it was handed out
/// for, so that a completion sent with another job's lease is refused instead of acknowledging
/// that job's message. `<tag>@<job>@<queue>@<task>`: none of them contains `@` (tags are row
/// ids or stream entry ids; names are `[A-Za-z0-9_.:-]`).
pub fn lease(tag: &str, job: JobId, queue: &str, task: &str) -> String {
    format!("{tag}@{job}@{queue}@{task}")
}

/// What a lease says, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub tag: String,
    pub queue: String,
    pub task: String,
}

/// The lease handed out for `job`, or why it is not one.
pub fn parse_lease(lease: &str, job: JobId) -> Result<Lease, String> {
    let mut parts = lease.splitn(4, '@');
    let (tag, id, queue, task) = (parts.next(), parts.next(), parts.next(), parts.next());
    match (tag, id.map(str::parse::<JobId>), queue, task) {
        (Some(tag), Some(Ok(id)), Some(queue), Some(task))
            if !tag.is_empty()
                && tag.len() <= 128
                && crate::validate::name("queue", queue).is_ok()
                && crate::validate::name("task", task).is_ok() =>
        {
            if id == job {
                Ok(Lease {
                    tag: tag.to_string(),
                    queue: queue.to_string(),
                    task: task.to_string(),
                })
            } else {
                Err(format!("the lease was handed out for job {id}, not {job}"))
            }
        }
        _ => Err(
            "lease is not one this server handed out (send it back exactly as reserve returned it)"
                .into(),
        ),
    }
}

/// The counter an applied completion adds to, from the state the store committed (an outcome
/// that could not be stored is committed as `dead`): the same counters a Rust worker's
/// committer keeps.
pub fn outcome_metric(outcome: &Outcome, state: JobState) -> Option<&'static str> {
    use crate::metrics::*;
    Some(match (state, outcome) {
        (JobState::Dead, _) => JOBS_DEAD,
        (JobState::Succeeded, _) => JOBS_SUCCEEDED,
        (JobState::Failed, _) => JOBS_FAILED,
        (JobState::Scheduled, Outcome::Retry { .. }) => JOBS_RETRIED,
        _ => return None,
    })
}

/// How many successors a completion call that also reserves may take: what the worker asked
/// for (one slot per completion it sent, counted free), less the completions answered
/// `unstored`, whose jobs still run under the session and keep their slots.
pub fn refill(asked: u32, results: &[Completed]) -> u32 {
    let unstored = results
        .iter()
        .filter(|c| c.status == Status::Unstored)
        .count();
    asked.saturating_sub(u32::try_from(unstored).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_the_store_could_not_write_frees_no_slot() {
        let done = |status| Completed {
            job_id: uuid::Uuid::now_v7(),
            status,
            state: None,
        };
        let results = [
            done(Status::Applied),
            done(Status::Unstored),
            done(Status::Stale),
            done(Status::AlreadyApplied),
            done(Status::Unstored),
        ];
        assert_eq!(refill(5, &results), 3);
        assert_eq!(refill(1, &results), 0);
        assert_eq!(refill(7, &results[..1]), 7);
    }
    fn job(attempts: u32, max_retries: Option<u32>) -> Job {
        let mut j = crate::transition::sample_job(JobState::Running);
        j.attempts = attempts;
        j.max_retries = max_retries;
        j
    }

    fn report(kind: ReportKind) -> ReportIn<'static> {
        ReportIn {
            kind,
            result: None,
            error: Some("boom"),
            retry_delay: None,
            delay: None,
        }
    }

    fn declared(max_retries: u32, delay_ms: u64) -> TaskDeclaration {
        TaskDeclaration {
            name: "t".into(),
            max_retries: Some(max_retries),
            retry_delay_ms: Some(delay_ms),
            time_limit_ms: None,
        }
    }

    #[test]
    fn an_error_retries_by_the_declared_defaults_when_the_job_set_none() {
        let d = declared(2, 30_000);
        let now = 1_000_000;
        let o = outcome(
            &report(ReportKind::Error),
            Some(&job(0, None)),
            Some(&d),
            now,
        );
        assert_eq!(
            o,
            Outcome::Retry {
                error: "boom".into(),
                at: now + 30_000_000
            }
        );
        // Two retries declared: the third error fails the job.
        let o = outcome(
            &report(ReportKind::Error),
            Some(&job(2, None)),
            Some(&d),
            now,
        );
        assert_eq!(
            o,
            Outcome::Failed {
                error: "boom".into()
            }
        );
    }

    #[test]
    fn the_jobs_own_options_win_over_declared_defaults() {
        let d = declared(5, 30_000);
        let o = outcome(
            &report(ReportKind::Error),
            Some(&job(1, Some(1))),
            Some(&d),
            0,
        );
        assert_eq!(
            o,
            Outcome::Failed {
                error: "boom".into()
            }
        );
    }

    #[test]
    fn the_workers_retry_delay_wins_over_the_policy() {
        let mut r = report(ReportKind::Error);
        r.retry_delay = Some(Duration::from_secs(7));
        let o = outcome(&r, Some(&job(0, None)), Some(&declared(2, 30_000)), 10);
        assert_eq!(
            o,
            Outcome::Retry {
                error: "boom".into(),
                at: 10 + 7_000_000
            }
        );
    }

    #[test]
    fn fatal_snooze_cancel_release_and_results() {
        let j = job(0, None);
        assert_eq!(
            outcome(&report(ReportKind::Fatal), Some(&j), None, 0),
            Outcome::Failed {
                error: "boom".into()
            }
        );
        let mut s = report(ReportKind::Snooze);
        s.delay = Some(Duration::from_millis(1500));
        assert_eq!(
            outcome(&s, Some(&j), None, 5),
            Outcome::Snooze { at: 5 + 1_500_000 }
        );
        assert_eq!(
            outcome(&report(ReportKind::Cancelled), Some(&j), None, 0),
            Outcome::Cancelled
        );
        assert_eq!(
            outcome(&report(ReportKind::Released), Some(&j), None, 0),
            Outcome::Released
        );
        let v = serde_json::json!({"pages": 3});
        let sent = super::super::Reported::Value(v.clone());
        let mut ok = report(ReportKind::Succeeded);
        ok.result = Some(&sent);
        assert_eq!(
            outcome(&ok, Some(&j), None, 0),
            Outcome::Succeeded(v.clone())
        );
        // A result that breaks a storage rule fails the job; it is never stored.
        let deep = super::super::Reported::Value(crate::validate::nested(
            crate::validate::MAX_DEPTH + 1,
            serde_json::json!(1),
        ));
        ok.result = Some(&deep);
        assert!(matches!(
            outcome(&ok, Some(&j), None, 0),
            Outcome::Failed { .. }
        ));
        // So does one the worker sent with an integer beyond 64 bits, read apart from the call.
        let body = r#"[{"job_id": "01a24df1-6141-73cd-b3c3-c9de35fb57f2", "epoch": 1, "lease": "l",
            "outcome": "succeeded", "result": {"n": 123456789012345678901234567890}},
            {"job_id": "01a24df1-6141-73cd-b3c3-c9de35fb57f2", "epoch": 1, "lease": "l",
            "outcome": "succeeded", "result": {"n": 18446744073709551615}}]"#;
        let reports: Vec<super::super::Report> = serde_json::from_str(body).unwrap();
        ok.result = reports[0].result.as_ref();
        let Outcome::Failed { error } = outcome(&ok, Some(&j), None, 0) else {
            panic!("an inexact result was stored")
        };
        assert!(
            error.starts_with("the handler's result was refused: the integer 1234567890"),
            "{error}"
        );
        // A number the raw reader passes and the value reader refuses: this job's failure too.
        let odd: Vec<super::super::Report> = serde_json::from_str(
            r#"[{"job_id": "01a24df1-6141-73cd-b3c3-c9de35fb57f2", "epoch": 1, "lease": "l",
            "outcome": "succeeded", "result": 1e400}]"#,
        )
        .unwrap();
        ok.result = odd[0].result.as_ref();
        assert!(matches!(
            outcome(&ok, Some(&j), None, 0),
            Outcome::Failed { error } if error.contains("cannot be read")
        ));
        ok.result = reports[1].result.as_ref();
        assert_eq!(
            outcome(&ok, Some(&j), None, 0),
            Outcome::Succeeded(serde_json::json!({"n": 18446744073709551615u64}))
        );
        // Error texts are cut like a Rust handler's.
        let long = "x".repeat(100_000);
        let mut e = report(ReportKind::Fatal);
        e.error = Some(&long);
        let Outcome::Failed { error } = outcome(&e, Some(&j), None, 0) else {
            panic!()
        };
        assert!(error.len() <= crate::validate::MAX_ERROR_BYTES);
    }

    #[test]
    fn a_refused_completion_is_already_applied_only_for_the_last_committed_epoch() {
        let c = |epoch, done| {
            Some(CompletionState {
                state: JobState::Succeeded,
                epoch,
                completed_epoch: done,
            })
        };
        assert_eq!(
            refused(c(3, Some(3)), 3),
            Refused::AlreadyApplied(JobState::Succeeded)
        );
        // The zombie of epoch 2 after run 3 committed.
        assert_eq!(refused(c(3, Some(3)), 2), Refused::Stale);
        // Reclaimed (not completed) and not restarted yet: the epoch is still 3, nothing committed.
        assert_eq!(refused(c(3, None), 3), Refused::Stale);
        assert_eq!(refused(c(3, Some(2)), 3), Refused::Stale);
        assert_eq!(refused(None, 3), Refused::Stale);
    }

    #[test]
    fn housekeeping_takes_only_unheld_jobs_older_than_a_ttl() {
        let a = crate::job::new_job_id();
        let b = crate::job::new_job_id();
        let c = crate::job::new_job_id();
        let running = [
            RunningUnder {
                id: a,
                epoch: 1,
                started_at: 0,
            },
            RunningUnder {
                id: b,
                epoch: 1,
                started_at: 0,
            },
            RunningUnder {
                id: c,
                epoch: 1,
                started_at: 9_000_000,
            },
        ];
        let held: HashSet<JobId> = [b].into_iter().collect();
        // At 10 s with a 6 s TTL: a is unheld and old, b is held, c is too young.
        assert_eq!(
            unheld(&running, &held, Duration::from_secs(6), 10_000_000),
            vec![a]
        );
        assert!(unheld(&running, &held, Duration::from_secs(6), 5_000_000).is_empty());
    }

    #[test]
    fn a_run_past_its_limit_and_grace_is_over() {
        let (limit, grace) = (Duration::from_secs(10), Duration::from_secs(3));
        assert!(!over_limit(1_000_000, limit, grace, 14_000_000));
        assert!(over_limit(1_000_000, limit, grace, 14_000_001));
        assert!(!over_limit(i64::MAX - 5, limit, grace, i64::MAX));
    }

    #[test]
    fn only_the_servers_time_limit_error_makes_a_matching_epoch_stale() {
        let mut j = job(1, Some(3));
        j.state = JobState::Scheduled;
        j.error = Some(time_limit_error(Duration::from_secs(5)));
        assert!(stopped_by_server(Some(&j)));
        j.state = JobState::Failed;
        assert!(stopped_by_server(Some(&j)));
        j.error = Some("time limit of 5s exceeded".into());
        assert!(
            !stopped_by_server(Some(&j)),
            "the worker's own timeout report"
        );
        j.error = Some(time_limit_error(Duration::from_secs(5)));
        j.state = JobState::Succeeded;
        assert!(
            !stopped_by_server(Some(&j)),
            "an earlier run's error on a success"
        );
        assert!(!stopped_by_server(None));
    }

    #[test]
    fn leases_round_trip_and_garbage_is_refused() {
        let job = crate::job::new_job_id();
        let l = lease("1700000000000-0", job, "ocr", "ocr.extract");
        let want = Lease {
            tag: "1700000000000-0".into(),
            queue: "ocr".into(),
            task: "ocr.extract".into(),
        };
        assert_eq!(parse_lease(&l, job), Ok(want));
        // Another job's lease is refused: acknowledging it would drop that job's message.
        let other = crate::job::new_job_id();
        assert!(parse_lease(&l, other)
            .unwrap_err()
            .contains("handed out for job"));
        let bad = [
            "".to_string(),
            "@ocr".into(),
            "7@".into(),
            "nope".into(),
            format!("7@{job}@ocr"),
            format!("7@{job}@@t"),
            format!("@{job}@ocr@t"),
            format!("7@{job}@ocr@bad name"),
            "7@x@ocr@t".into(),
        ];
        for b in bad {
            assert!(parse_lease(&b, job).is_err(), "{b}");
        }
    }

    /// Counted as the Rust committer counts: by the state committed, not the outcome asked.
    #[test]
    fn metrics_follow_the_committed_state() {
        use crate::metrics::*;
        let ok = Outcome::Succeeded(serde_json::json!(1));
        let retry = Outcome::Retry {
            error: "e".into(),
            at: 1,
        };
        assert_eq!(
            outcome_metric(&ok, JobState::Succeeded),
            Some(JOBS_SUCCEEDED)
        );
        assert_eq!(outcome_metric(&ok, JobState::Dead), Some(JOBS_DEAD));
        assert_eq!(
            outcome_metric(&retry, JobState::Scheduled),
            Some(JOBS_RETRIED)
        );
        assert_eq!(
            outcome_metric(&Outcome::Failed { error: "e".into() }, JobState::Failed),
            Some(JOBS_FAILED)
        );
        assert_eq!(
            outcome_metric(&Outcome::Snooze { at: 1 }, JobState::Scheduled),
            None
        );
        assert_eq!(outcome_metric(&Outcome::Released, JobState::Queued), None);
    }
}
