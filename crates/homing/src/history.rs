//! A job's timeline (docs/timeline.md): which entry each transition leaves, decided once.
//!
//! The job row keeps only the present (current state, epoch, latest progress); an operator at
//! 3 a.m. needs the past too: every run with its epoch and worker, every crash, every error.
//! Each transition's store transaction also writes one entry here, so the timeline can never
//! disagree with the row. This module decides the entry from what [`crate::transition`]
//! decided; the stores only write it, next to the row's own write, in the same transaction.
//!
//! A leaf beside `transition`: it knows jobs, changes and time, nothing about storage.

use serde::{Deserialize, Serialize};

use crate::job::{Job, JobState};
use crate::time::Micros;
use crate::transition::Change;

/// How many entries a job keeps: its first (the enqueue) and the latest [`KEEP_LATEST`].
pub const KEEP_LATEST: usize = 100;

/// How many progress entries one run keeps as separate entries; later updates of the same run
/// overwrite the last of them, so a chatty handler cannot push its run's start out of the
/// timeline, and the latest value is still shown.
pub const PROGRESS_PER_RUN: usize = 20;

/// The longest message an entry stores (an error with its traceback); longer ones are cut.
pub const MAX_MESSAGE: usize = 16 * 1024;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Inserted (`queued`, `scheduled` with its time, or `waiting` for workflow parents).
    Enqueued,
    /// A run began: `running` under `worker` with the new `epoch`.
    Started,
    /// The handler returned: `succeeded` with its result.
    Succeeded,
    /// A handler error with retries left: `scheduled` at `data.at`, the error in `message`.
    RetryScheduled,
    /// A handler error with no retries left, or a fatal one: `failed`.
    Failed,
    /// The handler asked to run later: `scheduled` at `data.at`.
    Snoozed,
    /// Given back without running to its end (graceful shutdown; or reclaimed from a worker
    /// that began the run after it was presumed dead, which counts no crash and says so in
    /// `message`): `queued`.
    Released,
    /// The run's worker was presumed dead (its heartbeat lapsed): the crash is counted, and the
    /// job is `queued` again, or `dead`/`cancelled`.
    Crashed,
    /// Made `dead` (outside a crash): crash budget spent at start, unreadable data, unknown
    /// task, an outcome that could not be stored.
    Dead,
    /// `cancelled` (by an operator, a handler that stopped on request, or its workflow).
    Cancelled,
    /// An operator's cancel of a running job: the worker is asked to stop it.
    CancelRequested,
    /// An operator's retry: `queued` again with its counters reset.
    Retried,
    /// Held back at start by a paused or full queue: `queued`, published again later.
    Parked,
    /// A waiting workflow step's parents all finished: `queued`.
    Ready,
    /// Its scheduled time (a countdown, a retry delay, a snooze) came: `queued`.
    Due,
    /// The handler reported progress (`data`).
    Progress,
    /// A stored kind this version does not know (written by a newer one).
    #[serde(other)]
    Unknown,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Enqueued => "enqueued",
            Kind::Started => "started",
            Kind::Succeeded => "succeeded",
            Kind::RetryScheduled => "retry_scheduled",
            Kind::Failed => "failed",
            Kind::Snoozed => "snoozed",
            Kind::Released => "released",
            Kind::Crashed => "crashed",
            Kind::Dead => "dead",
            Kind::Cancelled => "cancelled",
            Kind::CancelRequested => "cancel_requested",
            Kind::Retried => "retried",
            Kind::Parked => "parked",
            Kind::Ready => "ready",
            Kind::Due => "due",
            Kind::Progress => "progress",
            Kind::Unknown => "unknown",
        }
    }

    /// The stored text back; anything else is [`Kind::Unknown`], never an error (one odd row
    /// must not hide a job's timeline).
    pub fn parse(s: &str) -> Kind {
        serde_json::from_value(serde_json::Value::String(s.to_string())).unwrap_or(Kind::Unknown)
    }
}

/// One entry of a job's timeline, as written and as read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// When it was committed (RFC 3339 in JSON, like the job's times).
    #[serde(with = "crate::time::as_rfc3339")]
    pub at: Micros,
    pub kind: Kind,
    /// The job's state right after.
    pub state: JobState,
    /// The run it concerns: the epoch a start began, the epoch a completion or crash ended.
    /// `None` where no run is concerned and the row could not say (a last-resort burial).
    pub epoch: Option<u64>,
    /// The worker that ran it (for a crash: the worker presumed dead).
    pub worker: Option<String>,
    /// Handler errors counted so far (the job's `attempts` right after).
    pub attempts: u32,
    /// Crashes counted so far (the job's `crashes` right after).
    pub crashes: u32,
    /// An error with its traceback, a reason.
    pub message: Option<String>,
    /// A result, a progress value, or `{"at": RFC 3339}` for a time the job is scheduled at.
    pub data: Option<serde_json::Value>,
}

impl Entry {
    /// Whether the entry ends the run of its `epoch` (only an entry decided on a running row
    /// carries one besides a start and what happens during a run).
    pub fn ends_run(&self) -> bool {
        self.epoch.is_some()
            && !matches!(
                self.kind,
                Kind::Started
                    | Kind::Progress
                    | Kind::CancelRequested
                    | Kind::Enqueued
                    | Kind::Retried
                    | Kind::Ready
                    | Kind::Unknown
            )
    }
}

/// A job's timeline ([`crate::store::Store::history`]): oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct History {
    pub entries: Vec<Entry>,
    /// The timeline reached its bound ([`KEEP_LATEST`] after the first entry): entries between
    /// the first and the latest kept may have been dropped.
    pub truncated: bool,
}

impl History {
    /// A timeline as read: oldest first, `truncated` when it holds as many as are kept.
    pub fn from_entries(entries: Vec<Entry>) -> History {
        let truncated = entries.len() > KEEP_LATEST;
        History { entries, truncated }
    }
}

fn cut(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_string();
    }
    let mut end = MAX_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

fn entry(kind: Kind, job: &Job, now: Micros) -> Entry {
    Entry {
        at: now,
        kind,
        state: job.state,
        epoch: Some(job.epoch),
        worker: job.worker.clone(),
        attempts: job.attempts,
        crashes: job.crashes,
        message: None,
        data: None,
    }
}

/// The entry of a job just inserted in `state` (`scheduled` at `scheduled_at`).
pub fn enqueued(state: JobState, scheduled_at: Option<Micros>, now: Micros) -> Entry {
    Entry {
        at: now,
        kind: Kind::Enqueued,
        state,
        epoch: Some(0),
        worker: None,
        attempts: 0,
        crashes: 0,
        message: None,
        data: scheduled_at
            .filter(|_| state == JobState::Scheduled)
            .map(|at| serde_json::json!({ "at": crate::time::rfc3339(at) })),
    }
}

/// The entry of a start (`after`: the row as the start committed it).
pub fn started(after: &Job, now: Micros) -> Entry {
    entry(Kind::Started, after, now)
}

/// Why a [`Change`] was written: the same change means different things on different paths
/// (`queued` again is a release after a run, a park at start, a requeue after a crash).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause<'a> {
    /// A fenced completion of a run.
    Completion,
    /// The run's worker was lost (the rescuer, a remote session's expiry).
    Lost { worker: &'a str },
    /// Decided at start (parked, or made dead instead of running).
    Start,
    /// Anything else (an operator's cancel, a workflow settling, a last resort).
    Other,
}

/// The entry a decided [`Change`] leaves. `after` is the row as the change committed it;
/// `ran_under` names the worker whose run the change ended (`None` when the job was not
/// running: parked, made dead at start, cancelled before it ran), which the row may no longer
/// show (a retry releases its worker). For a crash it is the worker presumed dead.
pub fn changed(
    after: &Job,
    change: &Change,
    cause: Cause<'_>,
    ran_under: Option<&str>,
    now: Micros,
) -> Entry {
    let kind = match (cause, change.state) {
        (Cause::Lost { .. }, _) if change.count_crash => Kind::Crashed,
        (_, JobState::Succeeded) => Kind::Succeeded,
        (_, JobState::Failed) => Kind::Failed,
        (_, JobState::Scheduled) if change.count_attempt => Kind::RetryScheduled,
        (_, JobState::Scheduled) => Kind::Snoozed,
        (_, JobState::Dead) => Kind::Dead,
        (_, JobState::Cancelled) => Kind::Cancelled,
        (Cause::Start, JobState::Queued) => Kind::Parked,
        (_, JobState::Queued) => Kind::Released,
        (_, JobState::Running | JobState::Waiting) => Kind::Unknown,
    };
    let mut e = entry(kind, after, now);
    let ran_under = match cause {
        Cause::Lost { worker } => Some(worker),
        Cause::Start => None,
        _ => ran_under,
    };
    e.worker = ran_under.map(str::to_string);
    if ran_under.is_none() {
        // No run is concerned: its epoch is the previous run's, not this entry's.
        e.epoch = None;
    }
    if let Some(Some(error)) = &change.error {
        if kind != Kind::Cancelled || error != crate::transition::CANCELLED {
            e.message = Some(cut(error));
        }
    }
    if let (Cause::Lost { worker }, Kind::Released) = (cause, kind) {
        e.message = Some(format!(
            "reclaimed from {worker}, presumed dead before this run began: no crash counted"
        ));
    }
    if let Some(r) = &change.result {
        e.data = Some(r.clone());
    }
    if let Some(at) = change.scheduled_at {
        e.data = Some(serde_json::json!({ "at": crate::time::rfc3339(at) }));
    }
    e
}

/// The entry of a last-resort burial (`dead` with `reason`), where the row is not decoded: its
/// epoch and counters are unknown to the store, which writes what it can read.
pub fn buried(reason: &str, worker: Option<String>, now: Micros) -> Entry {
    Entry {
        at: now,
        kind: Kind::Dead,
        state: JobState::Dead,
        epoch: None,
        worker,
        attempts: 0,
        crashes: 0,
        message: Some(cut(reason)),
        data: None,
    }
}

/// The entry of an operator's retry (`after`: the row as the retry committed it).
pub fn retried(after: &Job, now: Micros) -> Entry {
    let mut e = entry(Kind::Retried, after, now);
    e.worker = None;
    e
}

/// The entry of an operator's cancel request for a running job.
pub fn cancel_requested(job: &Job, now: Micros) -> Entry {
    entry(Kind::CancelRequested, job, now)
}

/// The entry of a job that became `queued` without a run (`kind` is [`Kind::Ready`] or
/// [`Kind::Due`]), with its counters as the row has them.
pub fn queued(kind: Kind, attempts: u32, crashes: u32, now: Micros) -> Entry {
    Entry {
        at: now,
        kind,
        state: JobState::Queued,
        epoch: None,
        worker: None,
        attempts,
        crashes,
        message: None,
        data: None,
    }
}

/// The entry of a progress report of run `epoch` by `worker`.
pub fn progress(
    epoch: u64,
    worker: Option<String>,
    attempts: u32,
    crashes: u32,
    value: serde_json::Value,
    now: Micros,
) -> Entry {
    Entry {
        at: now,
        kind: Kind::Progress,
        state: JobState::Running,
        epoch: Some(epoch),
        worker,
        attempts,
        crashes,
        message: None,
        data: Some(value),
    }
}

/// What a timeline shows as consistent with its job row (the chaos invariant and the
/// conformance suite check this): `None` when it is, or the first disagreement.
///
/// Only a timeline that is not [`History::truncated`] is checked for counts: the latest entry's state
/// is the row's state (progress and cancel requests leave it `running`), epochs never go down,
/// every start has a greater epoch than the one before, and since the last operator retry the
/// `crashed` entries are the row's `crashes` and the counted errors its `attempts`.
pub fn disagreement(job: &Job, history: &History) -> Option<String> {
    let entries = &history.entries;
    let Some(last) = entries.iter().rev().find(|e| e.kind != Kind::Unknown) else {
        return Some("no timeline entry".into());
    };
    if last.state != job.state {
        return Some(format!(
            "latest entry {} says {}, the job is {}",
            last.kind.as_str(),
            last.state,
            job.state
        ));
    }
    let mut last_start: Option<u64> = None;
    let mut high = 0u64;
    for e in entries {
        if let Some(ep) = e.epoch {
            if ep < high {
                return Some(format!("epoch went down to {ep} after {high}"));
            }
            high = ep;
            if e.kind == Kind::Started {
                if last_start.is_some_and(|s| s >= ep) {
                    return Some(format!("start under epoch {ep} did not raise it"));
                }
                last_start = Some(ep);
            }
        }
    }
    if job.epoch != high && !entries.is_empty() {
        return Some(format!(
            "the job's epoch is {}, the timeline's {high}",
            job.epoch
        ));
    }
    if history.truncated {
        return None;
    }
    let since = entries
        .iter()
        .rposition(|e| e.kind == Kind::Retried)
        .map_or(0, |i| i + 1);
    let tail = &entries[since..];
    let crashes = tail.iter().filter(|e| e.kind == Kind::Crashed).count();
    let errors = tail
        .iter()
        .filter(|e| matches!(e.kind, Kind::RetryScheduled | Kind::Failed))
        .count();
    if crashes != job.crashes as usize {
        return Some(format!(
            "{crashes} crash entries, the job counts {}",
            job.crashes
        ));
    }
    if errors != job.attempts as usize {
        return Some(format!(
            "{errors} error entries, the job counts {} attempts",
            job.attempts
        ));
    }
    // Every run ends once (an outcome, a crash, a cancel or death while running), except the
    // one running now and one whose end could not be written and was buried (epoch unknown).
    let starts = tail.iter().filter(|e| e.kind == Kind::Started).count();
    let ended = tail.iter().filter(|e| e.ends_run()).count();
    let running = usize::from(job.state == JobState::Running);
    let buried = tail
        .iter()
        .filter(|e| e.kind == Kind::Dead && e.epoch.is_none())
        .count();
    if ended > starts || starts > ended + running + buried {
        return Some(format!("{starts} starts but {ended} runs ended"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transition::{self, Outcome};

    fn running() -> Job {
        let mut j = transition::sample_job(JobState::Running);
        j.epoch = 4;
        j
    }

    #[test]
    fn each_outcome_leaves_its_kind_with_the_runs_worker() {
        let j = running();
        for (outcome, kind) in [
            (Outcome::Succeeded(serde_json::json!(1)), Kind::Succeeded),
            (
                Outcome::Retry {
                    error: "e".into(),
                    at: 9,
                },
                Kind::RetryScheduled,
            ),
            (Outcome::Failed { error: "e".into() }, Kind::Failed),
            (Outcome::Snooze { at: 9 }, Kind::Snoozed),
            (Outcome::Cancelled, Kind::Cancelled),
            (Outcome::Released, Kind::Released),
            (Outcome::Dead { reason: "r".into() }, Kind::Dead),
        ] {
            let c = transition::complete(&outcome);
            let e = changed(&c.apply(&j, 7), &c, Cause::Completion, Some("w"), 7);
            assert_eq!(e.kind, kind, "{outcome:?}");
            assert_eq!(e.state, c.state, "{outcome:?}");
            assert_eq!(e.epoch, Some(4), "{outcome:?}");
            assert_eq!(e.worker.as_deref(), Some("w"), "{outcome:?}");
        }
        let c = transition::complete(&Outcome::Retry {
            error: "boom\nTraceback".into(),
            at: 9,
        });
        let e = changed(&c.apply(&j, 7), &c, Cause::Completion, Some("w"), 7);
        assert_eq!(
            (e.message.as_deref(), e.attempts),
            (Some("boom\nTraceback"), 1)
        );
        assert_eq!(
            e.data,
            Some(serde_json::json!({"at": crate::time::rfc3339(9)}))
        );
    }

    #[test]
    fn a_crash_names_the_lost_worker_and_counts() {
        let j = running();
        let transition::Lost::Reclaimed(c) = transition::lost(&j, "w", false) else {
            panic!()
        };
        let e = changed(&c.apply(&j, 7), &c, Cause::Lost { worker: "w" }, None, 7);
        assert_eq!(e.kind, Kind::Crashed);
        assert_eq!(
            (e.state, e.crashes, e.epoch),
            (JobState::Queued, 1, Some(4))
        );
        assert_eq!(e.worker.as_deref(), Some("w"));
        let q = transition::sample_job(JobState::Queued);
        let parked = changed(&q, &transition::park(), Cause::Start, Some("w"), 7);
        assert_eq!((parked.kind, parked.epoch), (Kind::Parked, None));
    }

    #[test]
    fn kinds_round_trip_and_unknown_is_tolerated() {
        for k in [Kind::Started, Kind::RetryScheduled, Kind::CancelRequested] {
            assert_eq!(Kind::parse(k.as_str()), k);
        }
        assert_eq!(Kind::parse("from_the_future"), Kind::Unknown);
        let long = "é".repeat(MAX_MESSAGE);
        assert!(cut(&long).len() <= MAX_MESSAGE + 3);
    }

    #[test]
    fn disagreement_finds_a_wrong_count_and_a_wrong_state() {
        let mut j = transition::sample_job(JobState::Queued);
        j.epoch = 1;
        j.crashes = 1;
        j.worker = None;
        let mut r = running();
        r.epoch = 1;
        let transition::Lost::Reclaimed(c) = transition::lost(&r, "w", false) else {
            panic!()
        };
        let h = History {
            entries: vec![
                enqueued(JobState::Queued, None, 1),
                started(&r, 2),
                changed(&c.apply(&r, 3), &c, Cause::Lost { worker: "w" }, None, 3),
            ],
            truncated: false,
        };
        assert_eq!(disagreement(&j, &h), None);
        j.crashes = 2;
        assert!(disagreement(&j, &h).unwrap().contains("crash"));
        j.crashes = 1;
        j.state = JobState::Succeeded;
        assert!(disagreement(&j, &h).unwrap().contains("latest entry"));
    }
}
