//! Responsible for reserving messages: never more than the free reservations (prefetch), so a
//! crash puts at risk only what this worker holds (docs/design.md section 1, guarantee 8).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{executor, Session};

/// How long one reservation call may wait for a message before the loop looks around again.
const RESERVE_WAIT: Duration = Duration::from_millis(500);

/// Longest the fetcher waits for reservations on their way back before it reserves with what it
/// has ([`settle`]): a few commits' time, so a slow store holds back no start for long.
const SETTLE: Duration = Duration::from_millis(5);

pub(crate) async fn run(s: Arc<Session>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if s.stopping.is_cancelled() || s.lost.is_cancelled() {
            return;
        }
        let first = tokio::select! {
            p = s.reservations.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = s.stopping.cancelled() => return,
            _ = s.lost.cancelled() => return,
        };
        let mut permits = vec![first];
        while let Ok(p) = s.reservations.clone().try_acquire_owned() {
            permits.push(p);
        }
        #[cfg(feature = "sqlite")]
        if let Some(db) = super::shared_db(&s) {
            match take_at_once(&s, &db, permits).await {
                Some(rest) => permits = rest,
                None => continue,
            }
        }
        settle(&s, &mut permits).await;
        if s.stopping.is_cancelled() || s.lost.is_cancelled() {
            return;
        }
        // Not cancelled mid-call: a reservation that completes after its caller went away would
        // leave messages owned by a worker that no longer waits for them.
        let reserved = s
            .broker
            .reserve(&s.id, &s.config.queues, permits.len(), RESERVE_WAIT)
            .await;
        match reserved {
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "cannot reserve messages");
                drop(permits);
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = s.stopping.cancelled() => return,
                    _ = s.lost.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Ok(deliveries) => {
                s.received.note(&deliveries);
                backoff = Duration::from_millis(50);
                permits.truncate(deliveries.len());
                if deliveries.is_empty() {
                    continue;
                }
                if s.stopping.is_cancelled() {
                    // Reserved just as shutdown began: hand them straight back.
                    s.hand_back_or_log(&deliveries).await;
                    return;
                }
                executor::start_batch(&s, deliveries, permits).await;
            }
        }
    }
}

/// Waits, at most [`SETTLE`], for the reservations the committer is about to give back, so that
/// under load the fetcher reserves one batch rather than several small ones. Without it a round
/// whose jobs commit in two batches gives its reservations back in two steps, the fetcher
/// reserves (and the store starts) two smaller batches, and the split never heals: at the
/// default concurrency of 8, rounds averaged 3.4 jobs, each round costing a start and a commit
/// transaction. A reservation comes back right after its commit and acknowledgement, so
/// the wait is about one commit; it is skipped when nothing is on its way back (an idle worker,
/// or one whose other reservations belong to jobs still running).
async fn settle(s: &Session, permits: &mut Vec<tokio::sync::OwnedSemaphorePermit>) {
    let want = s.config.prefetch();
    let until = tokio::time::Instant::now() + SETTLE;
    while permits.len() < want && s.returning.load(Ordering::Acquire) > 0 {
        match tokio::time::timeout_at(until, s.reservations.clone().acquire_owned()).await {
            Ok(Ok(p)) => permits.push(p),
            _ => return,
        }
        while let Ok(p) = s.reservations.clone().try_acquire_owned() {
            permits.push(p);
        }
    }
}

/// On the embedded file (store and broker in one SQLite file): waits until a message is ready
/// (or a publish woke it), then looks and, if one is ready, reserves and starts as many as there
/// are free slots in one write transaction (`store::sqlite::take_if_ready`, the look and the
/// write in one trip to the blocking pool), instead of a reservation and then a start: an idle
/// worker's job starts one transaction and two thread hand-offs sooner. Each message taken holds
/// a reservation and a slot from before the transaction, so the messages held never exceed the
/// prefetch (docs/fastpath.md, "The at-risk bound").
///
/// Gives the reservations back (`Some`) when the ordinary reservation should run instead: a
/// message looked ready and no slot is free (it then waits for one, after those already
/// waiting), the look or the write failed or was refused (the ordinary path isolates a job the
/// store cannot start, and backs off), or the write found nothing after all. `None`: done,
/// nothing came within the wait, or a wake after which no slot was free or the look found
/// nothing ready (the next turn looks and waits again).
#[cfg(feature = "sqlite")]
async fn take_at_once(
    s: &Arc<Session>,
    db: &Arc<crate::sqlite::Db>,
    mut permits: Vec<tokio::sync::OwnedSemaphorePermit>,
) -> Option<Vec<tokio::sync::OwnedSemaphorePermit>> {
    use crate::broker::Readiness;
    let seen = match s.broker.wait_ready(&s.config.queues, RESERVE_WAIT).await {
        Ok(Readiness::Nothing) => return None,
        Ok(seen) => seen,
        Err(e) => {
            // The ordinary reservation reports what persists; this only says why the fast
            // path was skipped (`HOMING_LOG=homing=debug`).
            tracing::debug!(error = %e, "looking for a ready message failed; taking the ordinary way");
            return Some(permits);
        }
    };
    if s.stopping.is_cancelled() || s.lost.is_cancelled() {
        return None;
    }
    let mut slots = Vec::new();
    while slots.len() < permits.len() {
        match s.slots.clone().try_acquire_owned() {
            Ok(slot) => slots.push(slot),
            Err(_) => break,
        }
    }
    if slots.is_empty() {
        if seen == Readiness::Woken {
            // Perhaps nothing for this worker: the next turn looks first, and a message it
            // finds ready then waits for a slot the ordinary way.
            return None;
        }
        tracing::trace!("no handler slot free; the message waits the ordinary way");
        return Some(permits);
    }
    // The reservations beyond the free slots go back now; the next turn reserves for them the
    // ordinary way, and their messages wait for slots.
    permits.truncate(slots.len());
    // Held until the jobs it takes are spawned, so a shutdown waiting for the executors cannot
    // miss them; the start gate as every start holds it (`executor::started_by_lost_answer`).
    let _spawning = s.executors.token();
    let gate = s.start_gate.clone().read_owned().await;
    let take = crate::store::sqlite::Take {
        worker: s.id.clone(),
        queues: s.config.queues.clone(),
        max: slots.len(),
    };
    match crate::store::sqlite::take_if_ready(db, take, crate::time::now()).await {
        Ok(Some(taken)) if !taken.is_empty() => {
            executor::take_started(s, taken, permits, slots, gate).await;
            None
        }
        Ok(None) => {
            // A publish of another queue, or one another worker took before this look. A wake
            // of that kind costs two looks (this one and the next turn's first), where it cost
            // one when the wait looked after every wake.
            tracing::trace!("woken, but nothing is ready; waiting again");
            None
        }
        Ok(_) => {
            // Another worker, or this worker's own committer round, reserved it between the
            // read and the write.
            tracing::trace!("the message was taken first; taking the ordinary way");
            Some(permits)
        }
        Err(e) => {
            // The error says whether it was the look or the write.
            if e.is_transient() {
                // Said, though quietly: a file that keeps failing here loses the fast path,
                // and nothing else would show it.
                tracing::debug!(error = %e, "looking, reserving and starting in one trip failed; taking the ordinary way");
            } else {
                tracing::warn!(error = %e, "looking, reserving and starting in one trip was refused; taking the ordinary way");
            }
            Some(permits)
        }
    }
}
