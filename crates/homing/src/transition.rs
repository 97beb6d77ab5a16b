//! Every decision about a job's state change, made once, as pure functions.
//!
//! Each store (SQLite, PostgreSQL) reads a job's row, asks this module what to do with it, and
//! applies the answer as one fenced write in its own SQL. Before this module each store took the
//! same decisions separately, with the same reason texts typed twice, and a rule changed in one
//! could silently differ in the other. Here a rule is written once and tested against every
//! input state; the stores only translate an answer ([`Change`], a follow-up, an event) into
//! statements, and the conformance suite checks that both translate it alike.
//!
//! A leaf: it knows jobs, time and which transitions produce events, nothing about storage.

use crate::events::NewEvent;
use crate::job::{Job, JobState, NewJob};
use crate::time::Micros;

/// How a run ended, as committed by [`crate::store::Store::complete`].
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Succeeded(serde_json::Value),
    /// A handler error with retries left: `attempts + 1`, `scheduled` at `at`.
    Retry {
        error: String,
        at: Micros,
    },
    /// A handler error with no retries left, or a fatal one: `attempts + 1`, `failed`.
    Failed {
        error: String,
    },
    /// The handler asked to run again later: `scheduled` at `at`, nothing counted.
    Snooze {
        at: Micros,
    },
    /// Stopped on request: `cancelled`.
    Cancelled,
    /// Not the handler's fault and not a crash (graceful shutdown): back to `queued`, nothing counted.
    Released,
    /// The worker cannot run it at all (unknown task): `dead` with the reason.
    Dead {
        reason: String,
    },
}

/// The columns one transition writes. Fields left `false`/`None` keep the column as it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub state: JobState,
    /// `attempts + 1`: the run ended in a handler error.
    pub count_attempt: bool,
    /// `crashes + 1`: the run was lost with its worker.
    pub count_crash: bool,
    /// `None` keeps the error; `Some(None)` clears it; `Some(Some(e))` sets it.
    pub error: Option<Option<String>>,
    /// Sets the result.
    pub result: Option<serde_json::Value>,
    /// Sets `scheduled_at`.
    pub scheduled_at: Option<Micros>,
    /// Sets `finished_at` to now.
    pub finished: bool,
    /// Clears `worker`: no worker holds the job any more.
    pub release_worker: bool,
    /// Marks the job undispatched: its message must be published (again).
    pub republish: bool,
}

impl Change {
    fn to(state: JobState) -> Self {
        Change {
            state,
            count_attempt: false,
            count_crash: false,
            error: None,
            result: None,
            scheduled_at: None,
            finished: false,
            release_worker: false,
            republish: false,
        }
    }

    /// A terminal `dead` with its reason.
    pub fn dead(reason: String) -> Self {
        Change {
            error: Some(Some(reason)),
            finished: true,
            ..Change::to(JobState::Dead)
        }
    }

    /// `cancelled`, as every path to it (cancel, a stopped handler, a lost worker) writes it.
    pub fn cancelled() -> Self {
        Change {
            error: Some(Some(CANCELLED.into())),
            finished: true,
            ..Change::to(JobState::Cancelled)
        }
    }

    /// The job as it is after this change, as far as a [`Job`] shows it.
    pub fn apply(&self, before: &Job, now: Micros) -> Job {
        let mut j = before.clone();
        j.state = self.state;
        if self.count_attempt {
            j.attempts = j.attempts.saturating_add(1);
        }
        if self.count_crash {
            j.crashes = j.crashes.saturating_add(1);
        }
        if let Some(e) = &self.error {
            j.error = e.clone();
        }
        if let Some(r) = &self.result {
            j.result = Some(r.clone());
        }
        if let Some(at) = self.scheduled_at {
            j.scheduled_at = Some(at);
        }
        if self.finished {
            j.finished_at = Some(now);
        }
        if self.release_worker {
            j.worker = None;
        }
        j
    }
}

/// The error text of a cancelled job.
pub const CANCELLED: &str = "cancelled";

/// What a transition writes besides the job's own row, in the same transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Effects {
    /// The follow-up job the state reached asks for (`on_success`, `on_failure`).
    pub follow_up: Option<NewJob>,
    /// Whether the transition writes an event (`job.failed`, `job.dead`, callbacks).
    pub event: bool,
}

/// The follow-up and event of `change` applied to `before`.
pub fn effects(before: &Job, change: &Change, now: Micros) -> Effects {
    effects_after(&change.apply(before, now), now)
}

/// The follow-up and event of a transition, from the job as committed: reaching `succeeded`
/// enqueues `on_success`, reaching `failed` or `dead` enqueues `on_failure`; the event is the
/// one [`NewEvent::wanted`] names for the state reached.
pub fn effects_after(after: &Job, now: Micros) -> Effects {
    let follow = match after.state {
        JobState::Succeeded => after.on_success.as_ref(),
        JobState::Failed | JobState::Dead => after.on_failure.as_ref(),
        _ => None,
    };
    Effects {
        follow_up: follow.map(|f| f.job_for(after, after.state, now)),
        event: NewEvent::wanted(after, after.state),
    }
}

/// The stored columns a run needs: its input, its retry policy, the follow-ups its end may
/// enqueue (running without those would lose them silently), its state, and the counters and
/// epoch its budgets and fencing decide on. A previous run's unreadable `result` or `progress`
/// does not stop a new run, which overwrites them.
const NEEDED_TO_RUN: [&str; 10] = [
    "args",
    "retry_policy",
    "on_success",
    "on_failure",
    "state",
    "attempts",
    "crashes",
    "epoch",
    "max_retries",
    "max_crashes",
];

/// The reason a job whose stored data cannot be decoded is made `dead` instead of run, if it
/// has such data among the columns a run needs.
pub fn unreadable_reason(job: &Job) -> Option<String> {
    let notes: Vec<String> = job
        .unreadable
        .iter()
        .filter(|n| {
            NEEDED_TO_RUN
                .iter()
                .any(|c| n.strip_prefix(c).is_some_and(|rest| rest.starts_with(' ')))
        })
        .map(|n| format!("stored {n}"))
        .collect();
    (!notes.is_empty()).then(|| notes.join("; "))
}

/// What [`start`] decided for one delivery (docs/design.md section 4, step 2).
#[derive(Debug, Clone, PartialEq)]
pub enum Start {
    /// Run it: `running` under the worker with `epoch + 1`, `started_at` = now, dispatched.
    Run,
    /// Do not run it (finished, or running under a worker): acknowledge the message.
    Skip(JobState),
    /// Scheduled and not yet due: acknowledge; the scheduler dispatches it when due.
    Defer(Micros),
    /// Make it `dead` with this reason ([`Change::dead`]) and acknowledge.
    Dead(String),
    /// It would run, but its queue is paused: write [`park`] (it stays `queued`, undispatched)
    /// and acknowledge. The reconciler publishes it again once the queue is resumed.
    Park,
}

/// What a job's queue allows at the moment of a start, as read in the start's transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueGate {
    /// `homing queues pause`: no new start from this queue.
    pub paused: bool,
    /// The queue's (or the job's key's) cluster-wide limit has no room now
    /// ([`crate::limit::admits`], counted in the start's transaction).
    pub full: bool,
}

/// The start rule of a job in a queue: [`start`]'s decision, except that a job that would run
/// from a paused queue, or from one whose limit has no room, is parked instead. A paused queue holds back only what would start: a
/// finished job is still skipped, a job whose data cannot be read is still made dead.
pub fn start_gated(job: &Job, now: Micros, gate: QueueGate) -> Start {
    match start(job, now) {
        Start::Run if gate.paused || gate.full => Start::Park,
        other => other,
    }
}

/// What a parked start writes: `queued` (a due `scheduled` job becomes `queued` too), and
/// undispatched, so the message is published again when the queue may start it. Nothing is
/// counted: being held back is not a run.
pub fn park() -> Change {
    Change {
        republish: true,
        ..Change::to(JobState::Queued)
    }
}

/// The start rule. In order: a finished or running job is skipped; a scheduled job not yet due
/// is deferred; a job whose stored data that a run needs cannot be read ([`unreadable_reason`]),
/// or whose crash budget is spent, is dead; anything else runs.
///
/// For a job whose data can be read, `Run` is exactly: `crashes < max_crashes` and (`queued`, or
/// `scheduled` with `scheduled_at` (absent = 0) `<= now`). The SQLite store's one-statement fast
/// path is that condition as a WHERE clause; a test there checks it against this function.
pub fn start(job: &Job, now: Micros) -> Start {
    // A waiting workflow step is never published; a stray message for one (an operator's
    // republish) is acknowledged, and the step is published when it becomes runnable.
    if job.state.is_terminal() || matches!(job.state, JobState::Running | JobState::Waiting) {
        return Start::Skip(job.state);
    }
    if job.state == JobState::Scheduled {
        let due = job.scheduled_at.unwrap_or(0);
        if due > now {
            return Start::Defer(due);
        }
    }
    if let Some(reason) = unreadable_reason(job) {
        return Start::Dead(reason);
    }
    if job.crashes >= job.max_crashes {
        return Start::Dead(format!(
            "lost its worker {} times (max_crashes = {})",
            job.crashes, job.max_crashes
        ));
    }
    Start::Run
}

/// The fence of every completion: it applies only to the run that started under `epoch` and
/// is still running. Anything else is a stale (zombie) write.
pub fn fence_holds(job: &Job, epoch: u64) -> bool {
    job.state == JobState::Running && job.epoch == epoch
}

/// What a completion writes, once [`fence_holds`].
pub fn complete(outcome: &Outcome) -> Change {
    match outcome {
        Outcome::Succeeded(v) => Change {
            result: Some(v.clone()),
            error: Some(None),
            finished: true,
            ..Change::to(JobState::Succeeded)
        },
        Outcome::Retry { error, at } => Change {
            count_attempt: true,
            error: Some(Some(error.clone())),
            scheduled_at: Some(*at),
            release_worker: true,
            ..Change::to(JobState::Scheduled)
        },
        Outcome::Failed { error } => Change {
            count_attempt: true,
            error: Some(Some(error.clone())),
            finished: true,
            ..Change::to(JobState::Failed)
        },
        Outcome::Snooze { at } => Change {
            scheduled_at: Some(*at),
            release_worker: true,
            ..Change::to(JobState::Scheduled)
        },
        Outcome::Cancelled => Change::cancelled(),
        Outcome::Released => Change {
            release_worker: true,
            republish: true,
            ..Change::to(JobState::Queued)
        },
        Outcome::Dead { reason } => Change::dead(reason.clone()),
    }
}

/// The reason a completion that the store could not write is replaced by `dead`.
pub fn uncommittable_reason(error: &dyn std::fmt::Display) -> String {
    format!("its outcome cannot be stored: {error}")
}

/// The reason a job that the store could not start is made `dead` instead.
pub fn unstartable_reason(error: &dyn std::fmt::Display) -> String {
    format!("it cannot be started: {error}")
}

/// The reason a lost worker's job whose new state the store could not write is made `dead`.
pub fn unreclaimable_reason(worker: &str, error: &dyn std::fmt::Display) -> String {
    format!("lost its worker {worker}, and it cannot be reclaimed: {error}")
}

/// What [`lost`] decided for a job whose worker `worker` is gone.
#[derive(Debug, Clone, PartialEq)]
pub enum Lost {
    /// It was not running under that worker: nothing changes.
    NotOwned(JobState),
    /// The run is over, with this change: back to `queued` (undispatched), `cancelled` (a cancel
    /// was requested), or `dead` (the crash budget is now spent). It counts a crash
    /// (`crashes + 1`) unless the run began after the worker was presumed dead.
    Reclaimed(Change),
}

/// The rescuer's rule for a job whose worker was lost. A crash is counted only for the worker
/// that owns the run, so concurrent rescuers (which decide on the locked, committed row) count
/// it once.
///
/// `begun_after_presumed_dead`: the worker was presumed dead (a rescuer found it without a
/// heartbeat) and this run was not running under it then ([`crate::store::Store::presume_lost`]).
/// Such a run says nothing about the task: the worker had not noticed (the broker lost its
/// heartbeat with its data, or it was paused) and took back a message a rescuer had put back.
/// It is requeued without counting a crash, or every rescuer that reclaimed it again would
/// count one, and a healthy job went `dead` after a Redis restart. The store decides it from
/// what ran at the presumption, never from clocks, which differ between hosts: a worker whose
/// clock runs ahead must not have its real crashes left uncounted.
pub fn lost(job: &Job, worker: &str, begun_after_presumed_dead: bool) -> Lost {
    if job.state != JobState::Running || job.worker.as_deref() != Some(worker) {
        return Lost::NotOwned(job.state);
    }
    if begun_after_presumed_dead && unreadable_reason(job).is_none() {
        let change = if job.cancel_requested {
            Change::cancelled()
        } else {
            Change {
                release_worker: true,
                republish: true,
                ..Change::to(JobState::Queued)
            }
        };
        return Lost::Reclaimed(change);
    }
    let crashes = job.crashes.saturating_add(1);
    let change = if job.cancel_requested {
        Change::cancelled()
    } else if let Some(reason) = unreadable_reason(job) {
        // Requeued, it would only be made dead at its next start: its budget cannot be read.
        Change::dead(format!("lost its worker {worker}, and its {reason}"))
    } else if crashes >= job.max_crashes {
        Change::dead(format!(
            "lost its worker {crashes} times, last {worker} (max_crashes = {}): \
             the task may be killing its worker",
            job.max_crashes
        ))
    } else {
        Change {
            release_worker: true,
            republish: true,
            ..Change::to(JobState::Queued)
        }
    };
    Lost::Reclaimed(Change {
        count_crash: true,
        ..change
    })
}

/// What an operator's cancel does.
#[derive(Debug, Clone, PartialEq)]
pub enum Cancel {
    /// Not running yet: `cancelled` now ([`Change::cancelled`]).
    Now,
    /// Running: set `cancel_requested`; the worker stops the handler and commits `cancelled`.
    Request,
    /// Finished: refused with this message.
    Refuse(&'static str),
}

pub fn cancel(job: &Job) -> Cancel {
    match job.state {
        JobState::Queued | JobState::Scheduled | JobState::Waiting => Cancel::Now,
        JobState::Running => Cancel::Request,
        _ => Cancel::Refuse("a finished job cannot be cancelled"),
    }
}

/// An operator's retry: `Ok` means back to `queued` (undispatched) with attempts, crashes and
/// the cancel request reset, no worker, no finish or schedule time; `Err` refuses with a message.
pub fn operator_retry(job: &Job) -> Result<(), &'static str> {
    if retryable(job.state) {
        Ok(())
    } else {
        Err("only failed, dead or cancelled jobs can be retried")
    }
}

/// Whether an operator's retry takes a job in `state` ([`operator_retry`]); a bulk retry
/// (docs/access.md) admits only these states as its filter.
pub fn retryable(state: JobState) -> bool {
    matches!(
        state,
        JobState::Failed | JobState::Dead | JobState::Cancelled
    )
}

/// Whether an operator's cancel takes a job in `state` ([`cancel`] does not refuse it).
pub fn cancellable(state: JobState) -> bool {
    !state.is_terminal()
}

/// Whether an operator may delete a job in `state`: only a finished one, whose row nobody
/// reads again (a job still to run, or running, would lose its run; docs/access.md).
pub fn deletable(state: JobState) -> bool {
    state.is_terminal()
}

/// A plain job in `state`, for the unit tests of the stores' decisions.
#[cfg(test)]
pub(crate) fn sample_job(state: JobState) -> Job {
    Job {
        id: crate::job::new_job_id(),
        task: "t".into(),
        queue: "q".into(),
        state,
        args: serde_json::json!({"n": 1}),
        result: None,
        error: None,
        attempts: 0,
        crashes: 0,
        epoch: 4,
        max_retries: None,
        max_crashes: 3,
        idempotency_key: None,
        priority: 0,
        progress: None,
        worker: (state == JobState::Running).then(|| "w".to_string()),
        created_at: 0,
        scheduled_at: None,
        started_at: None,
        finished_at: None,
        retry_policy: None,
        time_limit: None,
        on_success: None,
        on_failure: None,
        cancel_requested: false,
        callback_url: None,
        schedule: None,
        scheduled_tick: None,
        unreadable: Vec::new(),
        workflow: None,
        parents: None,
        traceparent: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::WEBHOOK_TASK;
    use crate::job::FollowUp;

    const NOW: Micros = 1_000_000;

    fn job(state: JobState) -> Job {
        sample_job(state)
    }

    fn follow(task: &str) -> Option<FollowUp> {
        Some(FollowUp {
            task: task.into(),
            queue: Some("f".into()),
            args: serde_json::json!({}),
        })
    }

    #[test]
    fn start_decides_every_state() {
        // (state, scheduled_at, crashes, unreadable, expected)
        let early = Some(NOW + 1);
        let due = Some(NOW);
        let dead_budget = "lost its worker 3 times (max_crashes = 3)".to_string();
        let bad = "stored args cannot be read: recursion limit exceeded".to_string();
        use JobState::*;
        #[rustfmt::skip]
        let cases: Vec<(JobState, Option<Micros>, u32, bool, Start)> = vec![
            (Queued, None, 0, false, Start::Run),
            (Queued, early, 0, false, Start::Run),
            (Queued, None, 2, false, Start::Run),
            (Queued, None, 3, false, Start::Dead(dead_budget.clone())),
            (Queued, None, 0, true, Start::Dead(bad.clone())),
            (Queued, None, 3, true, Start::Dead(bad.clone())),
            (Scheduled, due, 0, false, Start::Run),
            (Scheduled, None, 0, false, Start::Run),
            (Scheduled, early, 0, false, Start::Defer(NOW + 1)),
            (Scheduled, early, 3, true, Start::Defer(NOW + 1)),
            (Scheduled, due, 3, false, Start::Dead(dead_budget.clone())),
            (Scheduled, due, 0, true, Start::Dead(bad.clone())),
            (Running, None, 0, false, Start::Skip(Running)),
            (Running, None, 3, true, Start::Skip(Running)),
            (Waiting, None, 0, false, Start::Skip(Waiting)),
            (Succeeded, None, 0, false, Start::Skip(Succeeded)),
            (Failed, None, 0, true, Start::Skip(Failed)),
            (Dead, None, 3, false, Start::Skip(Dead)),
            (Cancelled, early, 0, false, Start::Skip(Cancelled)),
        ];
        for (state, at, crashes, unreadable, want) in cases {
            let mut j = job(state);
            j.scheduled_at = at;
            j.crashes = crashes;
            if unreadable {
                j.unreadable = vec!["args cannot be read: recursion limit exceeded".into()];
            }
            assert_eq!(
                start(&j, NOW),
                want,
                "{state} at={at:?} crashes={crashes} unreadable={unreadable}"
            );
        }
    }

    #[test]
    fn a_paused_queue_parks_only_what_would_run() {
        let paused = QueueGate {
            paused: true,
            full: false,
        };
        let full = QueueGate {
            paused: false,
            full: true,
        };
        for state in JobState::ALL {
            for at in [None, Some(NOW + 1)] {
                let mut j = job(state);
                j.scheduled_at = at;
                let open = start(&j, NOW);
                let want = if open == Start::Run {
                    Start::Park
                } else {
                    open.clone()
                };
                assert_eq!(start_gated(&j, NOW, paused), want, "{state} {at:?}");
                assert_eq!(start_gated(&j, NOW, full), want, "{state} {at:?}");
                assert_eq!(start_gated(&j, NOW, QueueGate::default()), open);
            }
        }
        // A job that cannot run is made dead even from a paused queue.
        let mut j = job(JobState::Queued);
        j.crashes = 3;
        assert!(matches!(start_gated(&j, NOW, paused), Start::Dead(_)));
        let c = park();
        assert_eq!((c.state, c.republish), (JobState::Queued, true));
        assert!(!c.count_attempt && !c.count_crash && !c.release_worker && !c.finished);
    }

    #[test]
    fn several_unreadable_columns_are_all_named() {
        let mut j = job(JobState::Queued);
        j.unreadable = vec![
            "args cannot be read: x".into(),
            "result cannot be read: y".into(),
            "on_failure cannot be read: z".into(),
        ];
        assert_eq!(
            unreadable_reason(&j).unwrap(),
            "stored args cannot be read: x; stored on_failure cannot be read: z"
        );
        assert_eq!(unreadable_reason(&job(JobState::Queued)), None);
        // A previous run's result or progress is overwritten by the next run: it may start.
        j.unreadable = vec![
            "result cannot be read: y".into(),
            "progress cannot be read: w".into(),
        ];
        assert_eq!(unreadable_reason(&j), None);
        assert_eq!(start(&j, NOW), Start::Run);
        for column in NEEDED_TO_RUN {
            j.unreadable = vec![format!("{column} cannot be read: v")];
            assert!(matches!(start(&j, NOW), Start::Dead(_)), "{column}");
        }
    }

    #[test]
    fn the_fence_needs_running_and_the_same_epoch() {
        for state in JobState::ALL {
            for epoch in [3, 4, 5] {
                let want = state == JobState::Running && epoch == 4;
                assert_eq!(fence_holds(&job(state), epoch), want, "{state} {epoch}");
            }
        }
    }

    #[test]
    fn complete_writes_per_outcome() {
        let v = serde_json::json!({"ok": true});
        // (outcome, state, attempt, error, result, scheduled_at, finished, release, republish)
        type Row = (
            Outcome,
            JobState,
            bool,
            Option<Option<&'static str>>,
            bool,
            Option<Micros>,
            bool,
            bool,
            bool,
        );
        #[rustfmt::skip]
        let cases: Vec<Row> = vec![
            (Outcome::Succeeded(v.clone()), JobState::Succeeded, false, Some(None), true, None, true, false, false),
            (Outcome::Retry { error: "e".into(), at: 9 }, JobState::Scheduled, true, Some(Some("e")), false, Some(9), false, true, false),
            (Outcome::Failed { error: "e".into() }, JobState::Failed, true, Some(Some("e")), false, None, true, false, false),
            (Outcome::Snooze { at: 7 }, JobState::Scheduled, false, None, false, Some(7), false, true, false),
            (Outcome::Cancelled, JobState::Cancelled, false, Some(Some("cancelled")), false, None, true, false, false),
            (Outcome::Released, JobState::Queued, false, None, false, None, false, true, true),
            (Outcome::Dead { reason: "r".into() }, JobState::Dead, false, Some(Some("r")), false, None, true, false, false),
        ];
        for (o, state, attempt, error, result, at, finished, release, republish) in cases {
            let c = complete(&o);
            assert_eq!(c.state, state, "{o:?}");
            assert_eq!(c.count_attempt, attempt, "{o:?}");
            assert_eq!(c.error, error.map(|e| e.map(String::from)), "{o:?}");
            assert_eq!(c.result.is_some(), result, "{o:?}");
            assert_eq!(c.scheduled_at, at, "{o:?}");
            assert_eq!(c.finished, finished, "{o:?}");
            assert_eq!(c.release_worker, release, "{o:?}");
            assert_eq!(c.republish, republish, "{o:?}");
        }
    }

    #[test]
    fn effects_follow_the_state_reached() {
        let mut j = job(JobState::Running);
        j.on_success = follow("ok.next");
        j.on_failure = follow("fail.next");
        let outcomes = [
            (
                Outcome::Succeeded(serde_json::json!(1)),
                Some("ok.next"),
                false,
            ),
            (
                Outcome::Retry {
                    error: "e".into(),
                    at: 9,
                },
                None,
                false,
            ),
            (
                Outcome::Failed { error: "e".into() },
                Some("fail.next"),
                true,
            ),
            (Outcome::Snooze { at: 9 }, None, false),
            (Outcome::Cancelled, None, false),
            (Outcome::Released, None, false),
            (
                Outcome::Dead { reason: "r".into() },
                Some("fail.next"),
                true,
            ),
        ];
        for (o, task, event) in outcomes {
            let e = effects(&j, &complete(&o), NOW);
            assert_eq!(e.follow_up.as_ref().map(|f| f.task.as_str()), task, "{o:?}");
            assert_eq!(e.event, event, "{o:?}");
        }
        // The follow-up sees the parent as committed: its result, its error, its new state.
        let e = effects(
            &j,
            &complete(&Outcome::Succeeded(serde_json::json!(42))),
            NOW,
        );
        let f = e.follow_up.unwrap();
        assert_eq!(f.args["parent"]["result"], 42);
        assert_eq!(f.args["parent"]["state"], "succeeded");
        assert_eq!(f.queue, "f");
        let e = effects(
            &j,
            &complete(&Outcome::Failed {
                error: "boom".into(),
            }),
            NOW,
        );
        assert_eq!(e.follow_up.unwrap().args["parent"]["error"], "boom");
        // A job with a callback URL reports every terminal state, and only terminal ones.
        j.callback_url = Some("http://127.0.0.1:9/cb".into());
        assert!(
            effects(
                &j,
                &complete(&Outcome::Succeeded(serde_json::json!(1))),
                NOW
            )
            .event
        );
        assert!(effects(&j, &complete(&Outcome::Cancelled), NOW).event);
        assert!(!effects(&j, &complete(&Outcome::Released), NOW).event);
        // Deliveries never alert about themselves.
        j.task = WEBHOOK_TASK.into();
        assert!(!effects(&j, &complete(&Outcome::Failed { error: "e".into() }), NOW).event);
    }

    #[test]
    fn lost_decides_every_state_and_owner() {
        for state in JobState::ALL {
            let j = job(state);
            let want_owned = state == JobState::Running;
            assert_eq!(
                matches!(lost(&j, "w", false), Lost::Reclaimed(_)),
                want_owned,
                "{state}"
            );
            assert_eq!(lost(&j, "other", false), Lost::NotOwned(state), "{state}");
        }
        let mut j = job(JobState::Running);
        let Lost::Reclaimed(c) = lost(&j, "w", false) else {
            panic!()
        };
        assert_eq!(
            (c.state, c.release_worker, c.republish, c.count_crash),
            (JobState::Queued, true, true, true)
        );
        j.crashes = 2;
        let Lost::Reclaimed(c) = lost(&j, "w", false) else {
            panic!()
        };
        assert_eq!((c.state, c.count_crash), (JobState::Dead, true));
        assert_eq!(
            c.error,
            Some(Some(
                "lost its worker 3 times, last w (max_crashes = 3): the task may be killing its worker"
                    .into()
            ))
        );
        // A cancel request wins over the crash budget.
        j.cancel_requested = true;
        let cancelled = Change {
            count_crash: true,
            ..Change::cancelled()
        };
        assert_eq!(lost(&j, "w", false), Lost::Reclaimed(cancelled));
        // A budget that cannot be read: dead with the reason, not requeued to die at start.
        let mut j = job(JobState::Running);
        j.unreadable = vec!["crashes cannot be read: out of range".into()];
        let Lost::Reclaimed(c) = lost(&j, "w", false) else {
            panic!()
        };
        assert_eq!((c.state, c.count_crash), (JobState::Dead, true));
        assert_eq!(
            c.error,
            Some(Some(
                "lost its worker w, and its stored crashes cannot be read: out of range".into()
            ))
        );
    }

    #[test]
    fn a_run_begun_after_its_worker_was_presumed_dead_counts_no_crash() {
        let mut j = job(JobState::Running);
        j.crashes = 2;
        // Begun before: the crash counts, and spends the budget.
        let Lost::Reclaimed(c) = lost(&j, "w", false) else {
            panic!()
        };
        assert_eq!((c.state, c.count_crash), (JobState::Dead, true));
        // Begun after: requeued, budget untouched.
        let Lost::Reclaimed(c) = lost(&j, "w", true) else {
            panic!()
        };
        assert_eq!(
            (c.state, c.count_crash, c.release_worker, c.republish),
            (JobState::Queued, false, true, true)
        );
        // A cancel request still ends it; another worker's run is still not ours.
        j.cancel_requested = true;
        assert_eq!(lost(&j, "w", true), Lost::Reclaimed(Change::cancelled()));
        assert_eq!(lost(&j, "other", true), Lost::NotOwned(JobState::Running));
        // Unreadable data: dead, as before.
        j.cancel_requested = false;
        j.unreadable = vec!["crashes cannot be read: out of range".into()];
        let Lost::Reclaimed(c) = lost(&j, "w", true) else {
            panic!()
        };
        assert_eq!(c.state, JobState::Dead);
    }

    #[test]
    fn counters_state_and_epoch_are_needed_to_run() {
        for column in [
            "state",
            "attempts",
            "crashes",
            "epoch",
            "max_retries",
            "max_crashes",
        ] {
            let mut j = job(JobState::Queued);
            j.unreadable = vec![format!("{column} cannot be read: x")];
            assert_eq!(
                start(&j, NOW),
                Start::Dead(format!("stored {column} cannot be read: x")),
                "{column}"
            );
        }
        let mut j = job(JobState::Queued);
        j.unreadable = vec!["progress cannot be read: x".into()];
        assert_eq!(start(&j, NOW), Start::Run);
    }

    #[test]
    fn cancel_and_operator_retry_per_state() {
        use JobState::*;
        for (state, c, r) in [
            (Scheduled, Cancel::Now, false),
            (Queued, Cancel::Now, false),
            (Waiting, Cancel::Now, false),
            (Running, Cancel::Request, false),
            (
                Succeeded,
                Cancel::Refuse("a finished job cannot be cancelled"),
                false,
            ),
            (
                Failed,
                Cancel::Refuse("a finished job cannot be cancelled"),
                true,
            ),
            (
                Dead,
                Cancel::Refuse("a finished job cannot be cancelled"),
                true,
            ),
            (
                Cancelled,
                Cancel::Refuse("a finished job cannot be cancelled"),
                true,
            ),
        ] {
            assert_eq!(cancel(&job(state)), c, "{state}");
            assert_eq!(operator_retry(&job(state)).is_ok(), r, "{state}");
        }
    }

    #[test]
    fn apply_shows_the_committed_job() {
        let j = job(JobState::Running);
        let after = complete(&Outcome::Retry {
            error: "e".into(),
            at: 9,
        })
        .apply(&j, NOW);
        assert_eq!(after.state, JobState::Scheduled);
        assert_eq!((after.attempts, after.scheduled_at), (1, Some(9)));
        assert_eq!((after.worker, after.finished_at), (None, None));
        let after = Change::dead("r".into()).apply(&j, NOW);
        assert_eq!(
            (after.error.as_deref(), after.finished_at),
            (Some("r"), Some(NOW))
        );
        assert_eq!(after.worker.as_deref(), Some("w"));
    }

    #[test]
    fn bulk_admissions_agree_with_the_single_decisions() {
        for state in JobState::ALL {
            let job = sample_job(state);
            assert_eq!(retryable(state), operator_retry(&job).is_ok(), "{state}");
            assert_eq!(
                cancellable(state),
                !matches!(cancel(&job), Cancel::Refuse(_)),
                "{state}"
            );
            assert_eq!(deletable(state), state.is_terminal(), "{state}");
        }
    }
}
