//! Responsible for committing outcomes and only then acknowledging (late ack, docs/design.md
//! section 4, steps 4–5). Completions that arrive together are committed in one store
//! transaction and acknowledged in one broker call: batching is what makes full state tracking
//! cheap.
//!
//! Batches come from time and load, not from the number of slots (docs/fastpath.md): the
//! committer takes whatever has arrived, and while jobs started together with those are still
//! running it waits for them (at most [`LINGER`]) so that jobs finishing together commit
//! together. A store that overlaps transactions well (PostgreSQL, whose commit waits for its WAL
//! flush) gets several batches in flight at once, each on its own connection; the next batch
//! gathers meanwhile. When the broker lives in the store's own SQLite file, the acknowledgement
//! is written in the commit's transaction, and so are the next batch's reservation and start,
//! which reuse the acknowledged messages' reservations ([`carry_over`]): one write per round.
//! Elsewhere a whole round (a batch holding every reservation of the worker) acknowledges its
//! messages and reserves their successors in one broker call (`Broker::ack_and_reserve`, one
//! round trip on Redis), again with the acknowledged messages' reservations; any other batch
//! gives its reservations back together, after its acknowledgement, and the fetcher waits for
//! those on their way ([`Returning`]), so it reserves one batch, not one message at a time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::executor::Round;
use super::Session;
use crate::broker::Delivery;
use crate::client::publish;
use crate::job::JobState;
use crate::store::{Committed, Completion, Outcome, ToPublish};
use crate::time::now;

/// Most completions committed in one transaction.
const MAX_BATCH: usize = 512;

/// Longest pause before committing again an outcome the store could not store.
const UNSTORED_CAP: Duration = Duration::from_secs(30);

/// Longest a batch waits for jobs started with its own. The runtime's timer counts whole
/// milliseconds and rounds a deadline up, so the wait is 1–2 ms at most.
const LINGER: Duration = Duration::from_millis(1);

/// One delivery to finish: commit its completion (if any), then acknowledge its message.
pub(crate) struct Item {
    pub delivery: Delivery,
    pub completion: Option<Completion>,
    pub task: String,
    /// Given back only after the ack, so reserved-but-unacknowledged messages never exceed
    /// prefetch.
    pub reservation: Option<Returning>,
    /// The jobs started with this one, whose outcomes the batch waits for.
    pub round: Option<Arc<Round>>,
    /// How many commits of this completion the store has answered unstored: it is tried again
    /// after a pause that grows with this ([`try_again_later`]).
    pub unstored: u32,
}

/// A reservation on its way back to the fetcher through the committer, counted in
/// `Session::returning` meanwhile: a fetcher that finds reservations about to come back waits
/// for them and reserves one batch instead of several small ones (`fetcher::settle`). The count
/// drops before the reservation is given back, so a fetcher woken by it never waits for a
/// reservation already returned.
pub(crate) struct Returning {
    permit: Option<OwnedSemaphorePermit>,
    count: Arc<AtomicUsize>,
}

impl Returning {
    pub fn new(permit: OwnedSemaphorePermit, count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Returning {
            permit: Some(permit),
            count: count.clone(),
        }
    }

    /// The reservation itself, for a caller that gives it back (or passes it on) once this,
    /// now dropped, has left the count.
    fn into_permit(mut self) -> Option<OwnedSemaphorePermit> {
        self.permit.take()
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        // The permit field drops after this: given back once it has left the count.
    }
}

pub(crate) async fn run(s: Arc<Session>, mut rx: mpsc::Receiver<Item>, done: CancellationToken) {
    let in_flight = Arc::new(Semaphore::new(s.store.commits_in_flight().max(1)));
    let commits = TaskTracker::new();
    loop {
        let first = tokio::select! {
            biased;
            x = rx.recv() => match x { Some(x) => x, None => break },
            _ = done.cancelled() => match rx.try_recv() { Ok(x) => x, Err(_) => break },
        };
        let mut batch = vec![first];
        gather(&mut rx, &mut batch).await;
        // Waiting for a free commit lets the batch grow meanwhile.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        top_up(&mut rx, &mut batch);
        let (s2, done2) = (s.clone(), done.clone());
        commits.spawn(async move {
            commit(&s2, batch, &done2).await;
            drop(permit);
        });
    }
    commits.close();
    commits.wait().await;
}

/// Takes what is waiting, without waiting.
fn top_up(rx: &mut mpsc::Receiver<Item>, batch: &mut Vec<Item>) {
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(x) => batch.push(x),
            Err(_) => break,
        }
    }
}

/// Grows a batch with the outcomes of jobs started together with those in it ([`Round`]),
/// while any of them is still running or on its way, for at most [`LINGER`]: jobs that end
/// together commit together, and a long job costs a batch no more than that (and none at all
/// once it runs alone). It sleeps on the channel rather than yielding in a loop: a yielding
/// committer keeps its scheduler thread busy, so the handlers queued there wait for the other
/// thread, and a round of eight no-op jobs used to split into a batch of one and a batch of
/// seven (two commits, and two starts after them).
async fn gather(rx: &mut mpsc::Receiver<Item>, batch: &mut Vec<Item>) {
    let until = tokio::time::Instant::now() + LINGER;
    loop {
        top_up(rx, batch);
        if batch.len() >= MAX_BATCH {
            return;
        }
        let waiting = batch
            .iter()
            .any(|i| i.round.as_ref().is_some_and(|r| r.pending()));
        if !waiting {
            // A job leaves its round after its outcome is sent: what was sent before that
            // look is in the channel now.
            top_up(rx, batch);
            return;
        }
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Some(x)) => batch.push(x),
            _ => return,
        }
    }
}

/// Retries a transient failure while this session is alive; after `done` only a few times.
async fn retrying<T, F, Fut>(
    s: &Session,
    done: &CancellationToken,
    what: &str,
    mut op: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = crate::error::Result<T>>,
{
    let mut tries = 0u32;
    let mut nap = Duration::from_millis(50);
    loop {
        match op().await {
            Ok(v) => return Some(v),
            Err(e) => {
                tries += 1;
                let give_up = s.lost.is_cancelled()
                    || (done.is_cancelled() && tries >= 5)
                    || !e.is_transient() && tries >= 3;
                if give_up {
                    tracing::error!(error = %e, "{what} failed; leaving it to the rescuer");
                    return None;
                }
                tracing::warn!(error = %e, retry_in = ?nap, "{what} failed; retrying");
                tokio::time::sleep(nap).await;
                nap = (nap * 2).min(Duration::from_secs(2));
            }
        }
    }
}

async fn commit(s: &Arc<Session>, mut batch: Vec<Item>, done: &CancellationToken) {
    let completions: Vec<Completion> = batch.iter().filter_map(|i| i.completion.clone()).collect();
    // Whatever the store answered (applied, stale, or no answer at all), these jobs' outcomes
    // are no longer on their way: a later delivery may find one still running here (given up)
    // and must then run it. An outcome answered unstored is still on its way (it is committed
    // again), so its job stays marked.
    let mut answered = Answered(s, completions.iter().map(|c| c.id).collect());
    let mut to_dispatch: Vec<ToPublish> = Vec::new();
    let mut unstored: Vec<Delivery> = Vec::new();
    let all: Vec<Delivery> = batch.iter().map(|i| i.delivery.clone()).collect();
    // Broker and store in one SQLite file: the acknowledgement goes in the commit's own
    // transaction, and so do the next round's reservation and start, which reuse the
    // acknowledged messages' reservations: one write per round instead of three. A batch the
    // combined write refuses for its data takes the ordinary path below, which isolates the
    // culprit; its reservations then go back to the fetcher after its acknowledgement.
    let mut acked = false;
    #[cfg_attr(not(feature = "sqlite"), allow(unused_mut))]
    let mut early: Option<Vec<Committed>> = None;
    // Reservations carried over for a round that was then refused: still those of this batch's
    // messages, so they go back only after the acknowledgement below.
    let mut carried_back: Vec<OwnedSemaphorePermit> = Vec::new();
    #[cfg(feature = "sqlite")]
    if let Some(db) = super::shared_db(s) {
        // Held until the jobs it takes are spawned, so a shutdown waiting for the executors
        // cannot miss them.
        let _spawning = s.executors.token();
        let (reservations, slots) = carry_over(s, &mut batch, done, &[]);
        let take = crate::store::sqlite::Take {
            worker: s.id.clone(),
            queues: s.config.queues.clone(),
            max: reservations.len(),
        };
        let combined = retrying(s, done, "committing outcomes", || async {
            // The round starts jobs: it runs under the start gate until they are claimed.
            let gate = s.start_gate.clone().read_owned().await;
            let r = crate::store::sqlite::complete_and_take(
                &db,
                &completions,
                &all,
                take.clone(),
                now(),
            )
            .await;
            match r {
                Ok(r) => Ok(Some((r, gate))),
                Err(e) if !e.is_transient() => {
                    // Nothing of it was written; the ordinary path below isolates the culprit.
                    // Said aloud, because a round that always lands here loses the fast path.
                    tracing::warn!(error = %e, "the combined round was refused; committing the batch the ordinary way");
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        })
        .await;
        match combined {
            None => return,
            Some(Some(((r, taken), gate))) => {
                acked = true;
                early = Some(r);
                super::executor::take_started(s, taken, reservations, slots, gate).await;
            }
            Some(None) => carried_back.extend(reservations),
        }
    }
    if !completions.is_empty() {
        let results = match early {
            Some(r) => r,
            None => {
                let Some(r) = retrying(s, done, "committing outcomes", || {
                    s.store.complete(&completions, now())
                })
                .await
                else {
                    return;
                };
                r
            }
        };
        let items = batch.iter().filter(|i| i.completion.is_some());
        for ((item, c), r) in items.zip(&completions).zip(results) {
            match r {
                Committed::Applied { state, dispatch } => {
                    log_outcome(item, c, state);
                    if let Some(name) = outcome_metric(&c.outcome, state) {
                        crate::metrics::count(name, &item.delivery.queue, &item.task);
                    }
                    to_dispatch.extend(dispatch);
                }
                Committed::Unstored(reason) => {
                    tracing::error!(job = %c.id, task = %item.task, %reason, "an outcome cannot be stored; keeping its message and trying again");
                    unstored.push(item.delivery.clone());
                }
                Committed::Stale => {
                    tracing::warn!(
                        event = "job.zombie_write_rejected",
                        job = %c.id,
                        epoch = c.epoch,
                        "outcome discarded: a newer run of this job owns it (fencing epoch)"
                    );
                }
            }
        }
    }
    if !to_dispatch.is_empty() {
        if let Err(e) = publish(&*s.broker, &*s.store, &to_dispatch).await {
            tracing::warn!(error = %e, "publish failed; the reconciler will publish these jobs");
        }
    }
    if !unstored.is_empty() {
        // Held from before the check until the retry is spawned, so a shutdown waiting for the
        // executors cannot miss it (and its item reach a committer that has finished).
        let _spawning = s.executors.token();
        if ending(s, done) {
            // The run stays `running` under this worker until the session's end makes it an
            // orphan, which the reconciler requeues; the message goes back meanwhile.
            tracing::warn!(
                count = unstored.len(),
                "stopping: handing back the messages of outcomes not stored"
            );
            s.hand_back_or_log(&unstored).await;
        } else {
            // Handed back, the message could reach another worker, which would skip the job
            // (it runs here) and acknowledge it: the job would stay `running` as long as this
            // worker lives. Kept, with its outcome, it is what this worker holds, and the
            // outcome is committed again after a pause.
            let (again, rest): (Vec<Item>, Vec<Item>) = std::mem::take(&mut batch)
                .into_iter()
                .partition(|i| unstored.contains(&i.delivery));
            batch = rest;
            for mut item in again {
                if let Some(c) = &item.completion {
                    answered.keep(c.id);
                }
                // A reservation carried over to a combined round that was then refused is in
                // `carried_back`; any one of those stands for this message's.
                let permit = item
                    .reservation
                    .take()
                    .and_then(Returning::into_permit)
                    .or_else(|| carried_back.pop());
                try_again_later(s, item, permit);
            }
        }
    }
    if !acked {
        let deliveries: Vec<Delivery> = all.into_iter().filter(|d| !unstored.contains(d)).collect();
        // Elsewhere a whole round's acknowledgement reserves the next round's messages in the
        // same broker call where it can (one round trip on Redis), with the acknowledged
        // messages' reservations: the fetcher has nothing to wait for, and the start goes ahead
        // at once.
        //
        // Only a whole round carries over, and that is decided before any reservation leaves
        // the `Returning` count, so a fetcher waiting for a partial round's reservations keeps
        // waiting for them. A partial one (the queue ran short, or a round split) gives its
        // reservations back after the ack, and the fetcher gathers them into one batch
        // (`fetcher::settle`). Carried over, a part of a split round keeps its size, each part
        // paying whole transactions, until the committer happens to gather the parts into one
        // batch: with every round carrying over, 2 of 8 bench runs on Redis + PostgreSQL fell
        // to a third and a half of the throughput, at two and three times the CPU
        // (BENCHMARKS.md).
        if whole_round(s, &batch, &unstored) {
            // Held from before the stop check in `carry_over` until the start is spawned, so a
            // shutdown waiting for the executors cannot miss it.
            let spawning = s.executors.token();
            let (reservations, slots) = carry_over(s, &mut batch, done, &unstored);
            let max = reservations.len();
            let queues = &s.config.queues;
            let combined = match max {
                0 => None,
                _ => Some(
                    s.broker
                        .ack_and_reserve(&deliveries, &s.id, queues, max)
                        .await,
                ),
            };
            match combined {
                Some(Ok(next)) => {
                    s.received.note(&next);
                    acked = true;
                    let s2 = s.clone();
                    s.executors.spawn(async move {
                        super::executor::start_carried(&s2, next, reservations, slots).await;
                    });
                }
                Some(Err(e)) => {
                    // Acknowledged below, the ordinary way; the reservations go back after that.
                    tracing::debug!(error = %e, "acknowledging and reserving in one call failed; acknowledging the ordinary way");
                    carried_back.extend(reservations);
                }
                // Stopping, or no slot free after all: the ordinary way.
                None => carried_back.extend(reservations),
            }
            drop(spawning);
        }
        if !acked {
            retrying(s, done, "acknowledging messages", || {
                s.broker.ack(&deliveries)
            })
            .await;
        }
    }
    drop(carried_back);
    release_together(batch);
}

/// Whether the session is ending (stopping, presumed dead, or its committer told to finish).
fn ending(s: &Session, done: &CancellationToken) -> bool {
    s.stopping.is_cancelled() || s.lost.is_cancelled() || done.is_cancelled()
}

/// Sends an item whose outcome the store answered unstored back to the committer after a
/// pause (100 ms, doubled each time, at most [`UNSTORED_CAP`]; cut short when the session
/// stops, so a stopping worker tries once more and then hands the message back). Its job stays
/// marked as committing meanwhile, so a duplicate delivery does not run it again, and its
/// delivery stays noted as held, so the stray sweep leaves it. Its reservation waits outside
/// the count of those on their way back: the fetcher must not wait for it.
fn try_again_later(s: &Arc<Session>, mut item: Item, permit: Option<OwnedSemaphorePermit>) {
    item.unstored += 1;
    item.round = None;
    let nap = super::executor::backoff(item.unstored - 1, UNSTORED_CAP);
    let s2 = s.clone();
    s.executors.spawn(async move {
        super::executor::pause(&s2, nap).await;
        item.reservation = permit.map(|p| Returning::new(p, &s2.returning));
        if let Err(mpsc::error::SendError(item)) = s2.commits.send(item).await {
            // The committer has finished: only at the session's end, after the executors.
            s2.hand_back_or_log(std::slice::from_ref(&item.delivery))
                .await;
            if let Some(c) = &item.completion {
                super::executor::committing(&s2, c.id, false);
            }
        }
    });
}

/// The reservations (and free slots) a round carries over from its acknowledged messages to the
/// messages it reserves in the same transaction (embedded file) or the same broker call
/// (`Broker::ack_and_reserve`): one per item not handed back, as long as a slot is free, and
/// none once the session is stopping or lost. A reservation moves from a message to its
/// successor inside one transaction or script, after the acknowledgement, so the messages this
/// worker holds never exceed its prefetch; a slot is taken only if free, so jobs waiting for one
/// (prefetch above concurrency) go first.
fn carry_over(
    s: &Session,
    batch: &mut [Item],
    done: &CancellationToken,
    handed_back: &[Delivery],
) -> (Vec<OwnedSemaphorePermit>, Vec<OwnedSemaphorePermit>) {
    let (mut reservations, mut slots) = (Vec::new(), Vec::new());
    if s.stopping.is_cancelled() || s.lost.is_cancelled() || done.is_cancelled() {
        return (reservations, slots);
    }
    for item in batch.iter_mut() {
        if item.reservation.is_none() || handed_back.contains(&item.delivery) {
            continue;
        }
        let Ok(slot) = s.slots.clone().try_acquire_owned() else {
            break;
        };
        if let Some(r) = item.reservation.take().and_then(Returning::into_permit) {
            reservations.push(r);
            slots.push(slot);
        }
    }
    (reservations, slots)
}

/// Whether a batch (outside the embedded file) is a whole round that may carry its reservations
/// over: it holds every reservation of the worker (its prefetch), none of them for a message
/// handed back, and a slot is free for each. With a prefetch above the concurrency that never
/// happens (some reservations wait for slots), and every round takes the ordinary way.
fn whole_round(s: &Session, batch: &[Item], handed_back: &[Delivery]) -> bool {
    let held = batch
        .iter()
        .filter(|i| i.reservation.is_some() && !handed_back.contains(&i.delivery))
        .count();
    held >= s.config.prefetch() && s.slots.available_permits() >= held
}

/// Gives a batch's reservations back in one step: one by one, the fetcher (woken by the first)
/// could reserve a single message before the others are free, and batches would shrink to one.
fn release_together(batch: Vec<Item>) {
    let mut held: Option<OwnedSemaphorePermit> = None;
    for item in batch {
        if let Some(p) = item.reservation.and_then(Returning::into_permit) {
            match held.as_mut() {
                Some(h) => h.merge(p),
                None => held = Some(p),
            }
        }
    }
    drop(held);
}

/// Unmarks a batch's jobs as committing when the batch is done with, on every path out.
struct Answered<'a>(&'a Session, Vec<crate::job::JobId>);

impl Answered<'_> {
    /// Leaves a job marked: its outcome is to be committed again.
    fn keep(&mut self, id: crate::job::JobId) {
        self.1.retain(|x| *x != id);
    }
}

impl Drop for Answered<'_> {
    fn drop(&mut self) {
        let mut set = self.0.committing.lock().unwrap_or_else(|p| p.into_inner());
        for id in &self.1 {
            set.remove(id);
        }
    }
}

/// The counter a committed outcome adds to, from the state the store committed (a completion it
/// could not store is committed as `dead` instead of what was asked).
fn outcome_metric(outcome: &Outcome, state: JobState) -> Option<&'static str> {
    use crate::metrics::*;
    Some(match (state, outcome) {
        (JobState::Dead, _) => JOBS_DEAD,
        (JobState::Succeeded, _) => JOBS_SUCCEEDED,
        (JobState::Failed, _) => JOBS_FAILED,
        (JobState::Scheduled, Outcome::Retry { .. }) => JOBS_RETRIED,
        _ => return None,
    })
}

fn log_outcome(item: &Item, c: &Completion, state: JobState) {
    match (&c.outcome, state) {
        (Outcome::Dead { reason }, _) => {
            tracing::error!(event = "job.dead", job = %c.id, task = %item.task, %reason, "job is dead");
        }
        (_, JobState::Dead) => {
            tracing::error!(event = "job.dead", job = %c.id, task = %item.task, "job is dead: its outcome could not be stored (the job's error says why)");
        }
        (Outcome::Failed { error }, _) => {
            tracing::warn!(event = "job.failed", job = %c.id, task = %item.task, %error, "job failed");
        }
        (Outcome::Retry { error, at }, _) => {
            tracing::info!(job = %c.id, task = %item.task, %error, retry_at = %crate::time::rfc3339(*at), "job will be retried");
        }
        (Outcome::Released, _) => {
            tracing::info!(job = %c.id, task = %item.task, "job released for another worker");
        }
        // With the epoch, so the chaos checker can tell which run's result was applied.
        _ => {
            tracing::debug!(job = %c.id, task = %item.task, %state, epoch = c.epoch, "job committed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::*;

    /// A completion the store could not write is committed as `dead`: it counts as dead, not as
    /// what the handler asked for.
    #[test]
    fn metrics_follow_the_committed_state() {
        let ok = Outcome::Succeeded(serde_json::json!(1));
        let failed = Outcome::Failed { error: "e".into() };
        let retry = Outcome::Retry {
            error: "e".into(),
            at: 1,
        };
        assert_eq!(outcome_metric(&ok, JobState::Dead), Some(JOBS_DEAD));
        assert_eq!(outcome_metric(&failed, JobState::Dead), Some(JOBS_DEAD));
        assert_eq!(outcome_metric(&retry, JobState::Dead), Some(JOBS_DEAD));
        assert_eq!(
            outcome_metric(&ok, JobState::Succeeded),
            Some(JOBS_SUCCEEDED)
        );
        assert_eq!(outcome_metric(&failed, JobState::Failed), Some(JOBS_FAILED));
        assert_eq!(
            outcome_metric(&retry, JobState::Scheduled),
            Some(JOBS_RETRIED)
        );
        assert_eq!(
            outcome_metric(&Outcome::Snooze { at: 1 }, JobState::Scheduled),
            None
        );
        assert_eq!(outcome_metric(&Outcome::Released, JobState::Queued), None);
    }
}
