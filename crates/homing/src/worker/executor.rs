//! Responsible for one delivery: the idempotency guard (`store.start`), running the handler with
//! its time limit and cancellation, and turning how it ended into a fenced outcome for the
//! committer (docs/design.md section 4, steps 2–4).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::committer::{Item, Returning};
use super::{RunningJob, Session, StopReason};
use crate::broker::Delivery;
use crate::job::{Job, JobId, JobState};
use crate::retry::RetryPolicy;
use crate::store::{Completion, Outcome, StartOutcome};
use crate::task::{Context, TaskDefaults, TaskError};
use crate::time::{micros, now};

struct Reserved {
    delivery: Delivery,
    id: JobId,
    reservation: OwnedSemaphorePermit,
}

/// Takes a freshly reserved batch: dead-letters what cannot be decoded, starts at once what has
/// a free slot (one store transaction), and leaves the rest waiting for a slot.
pub(crate) async fn start_batch(
    s: &Arc<Session>,
    deliveries: Vec<Delivery>,
    permits: Vec<OwnedSemaphorePermit>,
) {
    let mut ready = Vec::new();
    for (delivery, reservation) in deliveries.into_iter().zip(permits) {
        let Some(r) = decoded(s, delivery, reservation).await else {
            continue;
        };
        match s.slots.clone().try_acquire_owned() {
            Ok(slot) => ready.push((r, slot)),
            Err(_) => {
                let s2 = s.clone();
                s.executors.spawn(wait_and_start(s2, r));
            }
        }
    }
    if !ready.is_empty() {
        start_ready(s, ready).await;
    }
}

/// Starts the messages a committer round reserved with its acknowledgement
/// (`Broker::ack_and_reserve`): each came with a reservation carried over from an acknowledged
/// message and a slot taken before the reservation, so all of them start at once (one store
/// transaction). What is left of `reservations` and `slots` (fewer messages than asked for) is
/// given back when they drop. Reserved just as shutdown began, they are handed straight back,
/// as the fetcher's are; reserved as the session was presumed dead, they are left to the
/// rescuer.
pub(crate) async fn start_carried(
    s: &Arc<Session>,
    deliveries: Vec<Delivery>,
    reservations: Vec<OwnedSemaphorePermit>,
    slots: Vec<OwnedSemaphorePermit>,
) {
    if deliveries.is_empty() || s.lost.is_cancelled() {
        // Presumed dead: this session starts nothing more, and the rescuer puts back what it
        // holds.
        return;
    }
    if s.stopping.is_cancelled() {
        s.hand_back_or_log(&deliveries).await;
        return;
    }
    let mut ready = Vec::with_capacity(deliveries.len());
    let (mut reservations, mut slots) = (reservations.into_iter(), slots.into_iter());
    for delivery in deliveries {
        let (Some(reservation), Some(slot)) = (reservations.next(), slots.next()) else {
            // Never more messages than reservations; should a broker return more, they stay
            // reserved for the rescuer rather than be run beyond the promise.
            tracing::error!(tag = %delivery.tag, "a round reserved more messages than it had reservations for");
            continue;
        };
        if let Some(r) = decoded(s, delivery, reservation).await {
            ready.push((r, slot));
        }
    }
    drop((reservations, slots));
    if !ready.is_empty() {
        start_ready(s, ready).await;
    }
}

/// A reserved message and the job it names; `None` once a message that names no job (garbage
/// in the broker) is dead-lettered, its reservation given back after that.
async fn decoded(
    s: &Arc<Session>,
    delivery: Delivery,
    reservation: OwnedSemaphorePermit,
) -> Option<Reserved> {
    match &delivery.job {
        Ok(id) => Some(Reserved {
            id: *id,
            delivery,
            reservation,
        }),
        Err(reason) => {
            dead_letter(s, &delivery, reason).await;
            drop(reservation);
            None
        }
    }
}

async fn dead_letter(s: &Arc<Session>, d: &Delivery, reason: &str) {
    tracing::error!(event = "message.dead_lettered", queue = %d.queue, tag = %d.tag, reason, "dead-lettered a message");
    s.received.forget(std::slice::from_ref(d));
    if let Err(e) = s.broker.dead_letter(d, reason).await {
        tracing::warn!(error = %e, "could not dead-letter the message; the stray sweep or the rescuer will find it again");
    }
}

async fn wait_and_start(s: Arc<Session>, r: Reserved) {
    // Stopping and lost first: a slot freed during shutdown must not start a job the grace
    // period no longer covers.
    let slot = tokio::select! {
        biased;
        _ = s.stopping.cancelled() => {
            // Prefetched but never started: hand it back untouched.
            s.hand_back_or_log(std::slice::from_ref(&r.delivery)).await;
            return;
        }
        _ = s.lost.cancelled() => return,
        p = s.slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
    };
    start_ready(&s, vec![(r, slot)]).await;
}

/// Starts jobs that each hold a slot, in one store transaction, and runs those it may.
async fn start_ready(s: &Arc<Session>, items: Vec<(Reserved, OwnedSemaphorePermit)>) {
    let ids: Vec<JobId> = items.iter().map(|(r, _)| r.id).collect();
    let (outcomes, gate) = loop {
        // Taken anew for each call and never held across a pause: a waiting lost-answer check
        // holds back every later start.
        let gate = s.start_gate.clone().read_owned().await;
        match s.store.start(&ids, &s.id, now()).await {
            Ok(o) => {
                // A job the store failed on keeps the count growing, so handing it back slows.
                if !o.iter().any(|x| matches!(x, StartOutcome::Unstartable(_))) {
                    s.start_failures.store(0, Ordering::Relaxed);
                }
                break (o, gate);
            }
            Err(e) if e.is_transient() && !s.lost.is_cancelled() && !s.stopping.is_cancelled() => {
                drop(gate);
                let failures = s.start_failures.fetch_add(1, Ordering::Relaxed) + 1;
                let nap = backoff(failures, TRANSIENT_CAP);
                tracing::warn!(error = %e, retry_in = ?nap, "store unavailable while starting jobs; retrying");
                pause(s, nap).await;
            }
            Err(e) => {
                drop(gate);
                // The store isolates a job whose data it cannot handle, so this is the store
                // itself failing. Keep the messages (and their slots) for a growing pause
                // before handing them back, or the fetcher reserves them again at once and
                // the worker spins on the same failure.
                let failures = s.start_failures.fetch_add(1, Ordering::Relaxed) + 1;
                let nap = backoff(failures, FAILURE_CAP);
                tracing::error!(error = %e, failures, retry_in = ?nap, "cannot start jobs; handing their messages back after a pause");
                pause(s, nap).await;
                let ds: Vec<Delivery> = items.iter().map(|(r, _)| r.delivery.clone()).collect();
                let _ = s.hand_back(&ds).await;
                return;
            }
        }
    };
    take_outcomes(s, items, outcomes, gate).await;
}

/// Runs the jobs of a round's combined transaction (`store::sqlite::complete_and_take`): each
/// message came with a reservation the committer carried over from an acknowledged one and a
/// free slot. Undecodable messages are dead-lettered; what is left of `reservations` and `slots`
/// (fewer messages than asked for) is given back when they drop. `gate` is the start gate the
/// transaction ran under, released once its jobs are claimed.
#[cfg(feature = "sqlite")]
pub(crate) async fn take_started(
    s: &Arc<Session>,
    taken: Vec<(Delivery, Option<StartOutcome>)>,
    mut reservations: Vec<OwnedSemaphorePermit>,
    mut slots: Vec<OwnedSemaphorePermit>,
    gate: tokio::sync::OwnedRwLockReadGuard<()>,
) {
    let mut items = Vec::with_capacity(taken.len());
    let mut outcomes = Vec::with_capacity(taken.len());
    let mut undecodable = Vec::new();
    let mut unstarted = Vec::new();
    for (delivery, outcome) in taken {
        let (Some(reservation), Some(slot)) = (reservations.pop(), slots.pop()) else {
            // Never more messages than reservations; should a store return more, they stay
            // reserved for the rescuer rather than be run beyond the promise.
            tracing::error!(tag = %delivery.tag, "a round took more messages than it had reservations for");
            continue;
        };
        match (&delivery.job, outcome) {
            (Ok(id), Some(outcome)) => {
                let id = *id;
                items.push((
                    Reserved {
                        delivery,
                        id,
                        reservation,
                    },
                    slot,
                ));
                outcomes.push(outcome);
            }
            (Err(_), _) => undecodable.push((delivery, reservation, slot)),
            (Ok(_), None) => unstarted.push((delivery, reservation, slot)),
        }
    }
    take_outcomes(s, items, outcomes, gate).await;
    for (delivery, reservation, slot) in undecodable {
        if let Err(reason) = &delivery.job {
            dead_letter(s, &delivery, reason).await;
        }
        drop((reservation, slot));
    }
    for (delivery, reservation, slot) in unstarted {
        // Not started: hand it back like a start that could not be made.
        let _ = s.hand_back(std::slice::from_ref(&delivery)).await;
        drop((reservation, slot));
    }
}

/// Marks a job as run by this session, before its handler is spawned: from here on a duplicate
/// delivery of it is skipped.
fn claim(s: &Session, id: JobId) -> Arc<RunningJob> {
    let running = Arc::new(RunningJob {
        token: CancellationToken::new(),
        reason: Mutex::new(None),
    });
    s.running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, running.clone());
    running
}

/// Undoes [`claim`], unless a later run of the job (a new epoch started by this session after
/// a rescue) has claimed it since: that entry is the later run's to remove.
fn unclaim(s: &Session, id: JobId, running: &Arc<RunningJob>) {
    let mut map = s.running.lock().unwrap_or_else(|p| p.into_inner());
    if map.get(&id).is_some_and(|r| Arc::ptr_eq(r, running)) {
        map.remove(&id);
    }
}

/// Runs what started, and settles what the idempotency guard turned away. Every job the start
/// began is claimed before `gate` is released and before the first await, so no lost-answer
/// check can find it unclaimed.
async fn take_outcomes(
    s: &Arc<Session>,
    items: Vec<(Reserved, OwnedSemaphorePermit)>,
    outcomes: Vec<StartOutcome>,
    gate: tokio::sync::OwnedRwLockReadGuard<()>,
) {
    let claims: Vec<Option<Arc<RunningJob>>> = outcomes
        .iter()
        .map(|o| match o {
            StartOutcome::Run(job) => Some(claim(s, job.id)),
            _ => None,
        })
        .collect();
    drop(gate);
    let round = Round::of(claims.iter().flatten().count());
    for (((r, slot), outcome), claimed) in items.into_iter().zip(outcomes).zip(claims) {
        match outcome {
            StartOutcome::Run(job) => {
                crate::metrics::count(crate::metrics::JOBS_STARTED, &job.queue, &job.task);
                let ready_since = job.created_at.max(job.scheduled_at.unwrap_or(0));
                let started = job.started_at.unwrap_or(ready_since);
                crate::metrics::duration(
                    crate::metrics::JOB_QUEUE_WAIT,
                    &job.queue,
                    &job.task,
                    Duration::from_micros((started - ready_since).max(0) as u64),
                );
                let s2 = s.clone();
                let claimed = claimed.expect("every started job is claimed");
                let place = InRound(round.clone());
                s.executors.spawn(run(s2, r, *job, slot, claimed, place));
            }
            // Running under this very worker with no handler here: a start that committed
            // although its caller saw an error (an answer lost in a retried call, or an earlier
            // call that failed after committing part of its batch). Nobody else will run it.
            StartOutcome::Skip(JobState::Running) => match started_by_lost_answer(s, r.id).await {
                Ok(Some((job, claimed))) => {
                    tracing::warn!(job = %r.id, "an earlier start committed but its answer was lost: running the job");
                    let s2 = s.clone();
                    let place = InRound(Round::of(1));
                    s.executors.spawn(run(s2, r, job, slot, claimed, place));
                }
                Ok(None) => ack_only(s, r).await,
                Err(e) => {
                    // Acknowledged, a job started by a lost answer would stay `running` under a
                    // live worker; handed back, the check runs again on the next delivery.
                    tracing::warn!(job = %r.id, error = %e, "cannot read a job that runs under this worker; handing its message back");
                    s.hand_back_or_log(std::slice::from_ref(&r.delivery)).await;
                    drop((r, slot));
                }
            },
            StartOutcome::Skip(state) => {
                tracing::debug!(job = %r.id, %state, "duplicate delivery skipped by the idempotency guard");
                ack_only(s, r).await;
            }
            StartOutcome::Parked => {
                tracing::debug!(job = %r.id, queue = %r.delivery.queue, "queue paused: the job stays queued until it is resumed");
                ack_only(s, r).await;
            }
            StartOutcome::Defer(at) => {
                tracing::debug!(job = %r.id, due = %crate::time::rfc3339(at), "early delivery; the scheduler will dispatch it when due");
                ack_only(s, r).await;
            }
            StartOutcome::Dead => {
                let (task, reason) = match s.store.get(r.id).await {
                    Ok(Some(j)) => (j.task, j.error.unwrap_or_default()),
                    _ => ("unknown".into(), String::new()),
                };
                crate::metrics::count(crate::metrics::JOBS_DEAD, &r.delivery.queue, &task);
                tracing::error!(event = "job.dead", job = %r.id, %task, queue = %r.delivery.queue, %reason, "job is dead instead of starting");
                ack_only(s, r).await;
            }
            StartOutcome::Missing => {
                let reason = format!("message names job {} which the store does not have", r.id);
                dead_letter(s, &r.delivery, &reason).await;
            }
            StartOutcome::Presumed => {
                // Back unstarted at once, rather than when a rescuer next sweeps this session.
                super::heartbeater::lost(
                    s,
                    "the store refused a start: a rescuer found its heartbeat gone",
                );
                s.hand_back_or_log(std::slice::from_ref(&r.delivery)).await;
                drop((r, slot));
            }
            StartOutcome::Unstartable(reason) => {
                // The store failed on this job alone; its batch-mates went ahead. Keep its slot
                // for a growing pause before handing the message back, so the worker does not
                // spin on it.
                let failures = s.start_failures.fetch_add(1, Ordering::Relaxed) + 1;
                let nap = backoff(failures, FAILURE_CAP);
                tracing::error!(job = %r.id, %reason, retry_in = ?nap, "cannot start a job; handing its message back after a pause");
                let s2 = s.clone();
                s.executors.spawn(async move {
                    pause(&s2, nap).await;
                    s2.hand_back_or_log(std::slice::from_ref(&r.delivery)).await;
                    drop((r, slot));
                });
            }
        }
    }
}

/// Longest pause between start attempts while the store is unavailable.
const TRANSIENT_CAP: Duration = Duration::from_secs(5);
/// Longest pause before handing back messages that could not be started.
const FAILURE_CAP: Duration = Duration::from_secs(30);

/// The pause after `failures` failed start calls in a row: 100 ms doubled each time, at most
/// `cap`.
pub(super) fn backoff(failures: u32, cap: Duration) -> Duration {
    Duration::from_millis(100)
        .saturating_mul(1u32 << failures.min(16))
        .min(cap)
}

/// Sleeps for `nap`, or less if the session stops or is presumed dead meanwhile.
pub(super) async fn pause(s: &Session, nap: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(nap) => {}
        _ = s.lost.cancelled() => {}
        _ = s.stopping.cancelled() => {}
    }
}

/// The job, if it is `running` under this very worker without a handler here and without an
/// outcome on its way: a start that committed although its caller saw an error. Anything else
/// stays a duplicate to skip.
///
/// Decided under the exclusive start gate, in this order: first whether the job is here
/// (running or committing), then the store. While the gate is held no start of this session can
/// be between its commit and its claim, and a job not here before the read has no outcome of
/// this session on its way, so the read is not overtaken by one; of two duplicate deliveries only
/// one can find the job unclaimed. The usual case, a duplicate of a job running here, is answered
/// before the gate, so it never holds up starts and commits.
async fn started_by_lost_answer(
    s: &Arc<Session>,
    id: JobId,
) -> crate::error::Result<Option<(Job, Arc<RunningJob>)>> {
    let here = |s: &Session| {
        s.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&id)
            || s.committing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&id)
    };
    if here(s) || s.lost.is_cancelled() {
        return Ok(None);
    }
    let _exclusive = s.start_gate.write().await;
    if here(s) || s.lost.is_cancelled() {
        return Ok(None);
    }
    let Some(job) = s.store.get(id).await? else {
        return Ok(None);
    };
    let ours = job.state == JobState::Running && job.worker.as_deref() == Some(s.id.as_str());
    if !ours {
        return Ok(None);
    }
    let claimed = claim(s, id);
    Ok(Some((job, claimed)))
}

async fn ack_only(s: &Arc<Session>, r: Reserved) {
    let item = Item {
        delivery: r.delivery,
        completion: None,
        task: String::new(),
        reservation: Some(Returning::new(r.reservation, &s.returning)),
        round: None,
        unstored: 0,
    };
    let _ = s.commits.send(item).await;
}

fn panic_message(e: tokio::task::JoinError) -> String {
    if e.is_cancelled() {
        return "handler was aborted".into();
    }
    let p = e.into_panic();
    let msg = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into());
    format!("handler panicked: {msg}")
}

/// Chooses the outcome of a handler error: retry while the job's budget lasts, else fail.
pub(crate) fn outcome_for_error(
    job: &Job,
    defaults: &TaskDefaults,
    err: TaskError,
    at: i64,
) -> Outcome {
    match err {
        TaskError::Snooze(d) => Outcome::Snooze {
            at: at.saturating_add(micros(d)),
        },
        TaskError::Fatal(m) => Outcome::Failed { error: m },
        TaskError::Retry(_) | TaskError::RetryIn(_, _) => {
            let max = job.max_retries.unwrap_or(defaults.max_retries);
            let (msg, delay) = match err {
                TaskError::RetryIn(m, d) => (m, Some(d)),
                TaskError::Retry(m) => (m, None),
                _ => unreachable!("matched above"),
            };
            if job.attempts < max {
                let policy: &RetryPolicy =
                    job.retry_policy.as_ref().unwrap_or(&defaults.retry_policy);
                let delay = delay.unwrap_or_else(|| policy.delay(job.attempts));
                Outcome::Retry {
                    error: msg,
                    at: at.saturating_add(micros(delay)),
                }
            } else {
                Outcome::Failed { error: msg }
            }
        }
    }
}

async fn run(
    s: Arc<Session>,
    r: Reserved,
    job: Job,
    slot: OwnedSemaphorePermit,
    running: Arc<RunningJob>,
    round: InRound,
) {
    let Some(handler) = s.registry.get(&job.task).cloned() else {
        let reason = format!(
            "unknown task '{}': no handler is registered on worker {} (it runs: {})",
            job.task,
            s.id,
            s.registry.names().join(", ")
        );
        committing(&s, job.id, true);
        unclaim(&s, job.id, &running);
        drop(slot);
        commit(&s, r, &job, Outcome::Dead { reason }, &round).await;
        return;
    };
    let defaults = handler.defaults();
    let time_limit = job.time_limit.unwrap_or(defaults.time_limit);
    let token = running.token.clone();
    if s.lost.is_cancelled() {
        // Presumed dead before the handler began: the job is the rescuer's; run nothing.
        running.stop(StopReason::Lost);
        unclaim(&s, job.id, &running);
        return;
    }
    let job = Arc::new(job);
    let span = crate::otel::start_run(&job);
    let ctx = Context::new(job.clone(), token.clone(), s.store.clone(), time_limit)
        .with_traceparent(span.as_ref().map(|s| Arc::from(s.traceparent())));
    let began = tokio::time::Instant::now();
    let mut handle = tokio::spawn(handler.call(ctx, job.args.clone()));
    enum Ended {
        Returned(Result<Result<serde_json::Value, TaskError>, tokio::task::JoinError>),
        TimedOut,
        Stopped,
    }
    let ended = tokio::select! {
        r = &mut handle => Ended::Returned(r),
        _ = tokio::time::sleep(time_limit) => Ended::TimedOut,
        _ = token.cancelled() => Ended::Stopped,
    };
    if !matches!(ended, Ended::Returned(_)) {
        token.cancel();
        handle.abort();
    }
    // Marked as committing before it stops counting as running, so that a duplicate delivery
    // arriving before the commit is skipped, never run again (`started_by_lost_answer`).
    committing(&s, job.id, true);
    unclaim(&s, job.id, &running);
    drop(slot);
    crate::metrics::duration(
        crate::metrics::JOB_DURATION,
        &job.queue,
        &job.task,
        began.elapsed(),
    );
    // A stop request decides the outcome unless the handler had already succeeded: a handler
    // that notices the cancellation and returns an error must not be retried.
    let outcome = match (ended, running.reason()) {
        // Presumed dead: the job belongs to the rescuer now. Commit nothing, ack nothing.
        (_, Some(StopReason::Lost)) => {
            committing(&s, job.id, false);
            if let Some(span) = span {
                span.end("lost");
            }
            return;
        }
        (Ended::Returned(Ok(Ok(value))), _) => match crate::validate::result(&value) {
            Ok(()) => Outcome::Succeeded(value),
            // Stored, it could not be read back (or not committed at all): fail the job instead.
            Err(e) => Outcome::Failed {
                error: format!("the handler's result was refused: {e}"),
            },
        },
        (Ended::TimedOut, _) => outcome_for_error(
            &job,
            &defaults,
            TaskError::Retry(format!(
                "time limit of {} exceeded",
                humantime::format_duration(time_limit)
            )),
            now(),
        ),
        (_, Some(StopReason::Cancelled)) | (Ended::Stopped, None) => Outcome::Cancelled,
        (_, Some(StopReason::Shutdown)) => Outcome::Released,
        (Ended::Returned(Ok(Err(err))), None) => {
            tracing::debug!(job = %job.id, task = %job.task, error = %err, "handler returned an error");
            outcome_for_error(&job, &defaults, err, now())
        }
        (Ended::Returned(Err(join)), None) => outcome_for_error(
            &job,
            &defaults,
            TaskError::Retry(panic_message(join)),
            now(),
        ),
    };
    if let Some(span) = span {
        span.end(crate::otel::outcome_name(&outcome));
    }
    commit(&s, r, &job, outcome, &round).await;
}

/// The jobs one start call began that have not yet handed their outcomes to the committer. Jobs
/// started together usually end together, so the committer waits for a batch's round-mates
/// (`committer::gather`), and for nothing else: a long job started earlier holds up no batch.
pub(crate) struct Round(AtomicUsize);

impl Round {
    /// A round of `n` jobs, each of which gets one [`InRound`].
    fn of(n: usize) -> Arc<Round> {
        Arc::new(Round(AtomicUsize::new(n)))
    }

    /// Whether some of its jobs have not yet handed over their outcomes.
    pub fn pending(&self) -> bool {
        self.0.load(Ordering::Acquire) > 0
    }
}

/// One job's place in its round, left when its run ends on any path: after its outcome reached
/// the committer's channel, or when it ends with nothing to commit.
pub(crate) struct InRound(Arc<Round>);

impl Drop for InRound {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Marks (or unmarks) a job whose outcome is on its way to the committer, which unmarks it once
/// the store has answered.
pub(super) fn committing(s: &Session, id: JobId, on: bool) {
    let mut set = s.committing.lock().unwrap_or_else(|p| p.into_inner());
    if on {
        set.insert(id);
    } else {
        set.remove(&id);
    }
}

async fn commit(s: &Arc<Session>, r: Reserved, job: &Job, outcome: Outcome, round: &InRound) {
    committing(s, job.id, true);
    let item = Item {
        delivery: r.delivery,
        completion: Some(Completion {
            id: job.id,
            epoch: job.epoch,
            outcome: bounded(outcome),
        }),
        task: job.task.clone(),
        reservation: Some(Returning::new(r.reservation, &s.returning)),
        round: Some(round.0.clone()),
        unstored: 0,
    };
    let _ = s.commits.send(item).await;
}

/// Error texts come from handlers (and from what remote servers answered): cut and scrubbed
/// so they can always be stored.
fn bounded(outcome: Outcome) -> Outcome {
    use crate::validate::error_text;
    match outcome {
        Outcome::Retry { error, at } => Outcome::Retry {
            error: error_text(&error),
            at,
        },
        Outcome::Failed { error } => Outcome::Failed {
            error: error_text(&error),
        },
        Outcome::Dead { reason } => Outcome::Dead {
            reason: error_text(&reason),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobState;

    fn job(attempts: u32, max_retries: Option<u32>) -> Job {
        Job {
            id: crate::job::new_job_id(),
            task: "t".into(),
            queue: "q".into(),
            state: JobState::Running,
            args: serde_json::Value::Null,
            result: None,
            error: None,
            attempts,
            crashes: 0,
            epoch: 1,
            max_retries,
            max_crashes: 3,
            idempotency_key: None,
            priority: 0,
            progress: None,
            worker: None,
            created_at: 0,
            scheduled_at: None,
            started_at: None,
            finished_at: None,
            retry_policy: Some(RetryPolicy::fixed(Duration::from_secs(30))),
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

    #[test]
    fn start_failures_back_off_exponentially_to_a_cap() {
        let naps: Vec<u64> = (1..=10)
            .map(|n| backoff(n, FAILURE_CAP).as_millis() as u64)
            .collect();
        assert_eq!(
            naps,
            [200, 400, 800, 1_600, 3_200, 6_400, 12_800, 25_600, 30_000, 30_000]
        );
        assert_eq!(backoff(1, TRANSIENT_CAP), Duration::from_millis(200));
        assert_eq!(backoff(u32::MAX, TRANSIENT_CAP), TRANSIENT_CAP);
    }

    #[test]
    fn errors_retry_until_the_budget_is_spent() {
        let d = TaskDefaults::default();
        let r = outcome_for_error(&job(0, Some(2)), &d, TaskError::retry("x"), 0);
        assert_eq!(
            r,
            Outcome::Retry {
                error: "x".into(),
                at: 30_000_000
            }
        );
        let r = outcome_for_error(&job(1, Some(2)), &d, TaskError::retry("x"), 0);
        assert!(matches!(r, Outcome::Retry { .. }));
        let r = outcome_for_error(&job(2, Some(2)), &d, TaskError::retry("x"), 0);
        assert_eq!(r, Outcome::Failed { error: "x".into() });
    }

    #[test]
    fn fatal_fails_at_once_and_snooze_spends_nothing() {
        let d = TaskDefaults::default();
        assert_eq!(
            outcome_for_error(&job(0, None), &d, TaskError::fatal("bad"), 0),
            Outcome::Failed {
                error: "bad".into()
            }
        );
        assert_eq!(
            outcome_for_error(
                &job(9, Some(0)),
                &d,
                TaskError::Snooze(Duration::from_secs(1)),
                5
            ),
            Outcome::Snooze { at: 1_000_005 }
        );
        assert_eq!(
            outcome_for_error(
                &job(0, None),
                &d,
                TaskError::RetryIn("429".into(), Duration::from_secs(2)),
                0
            ),
            Outcome::Retry {
                error: "429".into(),
                at: 2_000_000
            }
        );
    }
}
