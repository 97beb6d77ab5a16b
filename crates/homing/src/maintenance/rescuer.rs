//! Responsible for lost workers: every sweep it asks the broker which consumers hold messages
//! without a live heartbeat, counts the crash of each job they were running (conditionally on
//! the owner, so concurrent rescuers count it once), puts the messages back, and only then
//! forgets the consumer (docs/design.md section 1, guarantees 5 and 6).

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::error::Result;
use crate::events::{NewEvent, WORKER_LOST};
use crate::job::JobState;
use crate::store::{Lost, Presumption, Store, WorkerStatus};
use crate::time::now;

pub(crate) async fn run(
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut pace = super::Pace::new("rescuer", interval);
    let mut wait = interval;
    while super::tick(wait, &stop).await {
        let outcome = sweep(&*broker, &*store).await;
        wait = pace.after(&outcome);
        if let Err(e) = outcome {
            tracing::warn!(error = %e, retry_in = ?wait, "rescuer sweep failed; will try again");
        }
    }
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    pub lost_workers: usize,
    pub requeued: usize,
    pub dead: usize,
    pub dropped: usize,
    /// Lost consumers left for the next sweep: a start of theirs was still in flight
    /// ([`Presumption::Deferred`]).
    pub deferred: usize,
}

/// Most messages of one consumer listed at a time, beside those of jobs already reclaimed.
const PAGE: usize = 100;

/// Most messages of one consumer listed in one call, whatever this pass has reclaimed.
const MAX_LISTED: usize = 10_000;

/// One pass over every lost consumer, read page by page.
///
/// A worker presumed dead that has not noticed yet (the broker lost its heartbeat with its data,
/// and its next beat is up to an interval away) keeps reserving, and takes back at once the
/// messages put back here. Chasing it until it held nothing counted a crash on each round trip,
/// tens a second: jobs of a healthy worker went `dead` in under a second (`homing chaos`, a Redis
/// restart). Now each job is reclaimed from a consumer at most once a pass: a message of a job
/// already reclaimed (taken back, or a duplicate) is left for the next sweep, by when the worker
/// has usually noticed and stopped. Every process with maintenance runs a rescuer, so such a job
/// can still be reclaimed once by each of them; what keeps that from spending its crash budget
/// is the store's record of the runs the worker had when it was first presumed dead
/// ([`Store::presume_lost`]): only those count a crash.
pub async fn sweep(broker: &dyn Broker, store: &dyn Store) -> Result<SweepReport> {
    let mut report = SweepReport::default();
    for consumer in broker.lost_consumers().await? {
        if store.presume_lost(&consumer, now()).await? == Presumption::Deferred {
            tracing::warn!(worker = %consumer, "the presumption of this lost worker waited too long for a lock (a start of it still in flight: its process paused mid-transaction?); leaving it for the next sweep");
            report.deferred += 1;
            continue;
        }
        let mut reclaimed = 0u64;
        // Messages whose job the store failed on (not for being unavailable): left pending for
        // the next sweep, so one bad job holds up neither its worker's other jobs nor the
        // other lost workers. The consumer is kept while it holds any.
        let mut stuck: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut handled: std::collections::HashSet<crate::job::JobId> =
            std::collections::HashSet::new();
        loop {
            // Past the messages of jobs already reclaimed (which a requeue puts at the head of
            // the queue, so they may be listed first), a page of others.
            let want = (PAGE + handled.len()).min(MAX_LISTED);
            let listed = broker.pending(&consumer, want).await?;
            let pending: Vec<_> = listed
                .into_iter()
                .filter(|d| {
                    !stuck.contains(&d.tag) && !d.job.as_ref().is_ok_and(|id| handled.contains(id))
                })
                .collect();
            if pending.is_empty() {
                break;
            }
            for d in pending {
                let id = match &d.job {
                    Ok(id) => *id,
                    Err(reason) => {
                        tracing::error!(event = "message.dead_lettered", queue = %d.queue, reason, "dead-lettered a lost worker's undecodable message");
                        broker.dead_letter(&d, reason).await?;
                        continue;
                    }
                };
                handled.insert(id);
                let (lost, unparked) = match store
                    .mark_lost_unparking(id, &consumer, true, now())
                    .await
                {
                    Ok(decided) => decided,
                    Err(e) if e.is_transient() => return Err(e),
                    Err(e) => {
                        tracing::error!(job = %id, worker = %consumer, error = %e, "cannot reclaim a lost worker's job; leaving its message for the next sweep");
                        stuck.insert(d.tag.clone());
                        continue;
                    }
                };
                if let Some(next) = unparked {
                    crate::client::publish(broker, store, &[next]).await?;
                }
                let task = || async {
                    match store.get(id).await {
                        Ok(Some(j)) => j.task,
                        _ => "unknown".to_string(),
                    }
                };
                let requeue = match lost {
                    Lost::Requeued => {
                        let task = task().await;
                        crate::metrics::count(crate::metrics::JOBS_RECLAIMED, &d.queue, &task);
                        tracing::warn!(event = "job.reclaimed", job = %id, %task, queue = %d.queue, worker = %consumer, "reclaimed a job from a lost worker");
                        true
                    }
                    Lost::NotOwned(JobState::Queued) => true,
                    Lost::Dead => {
                        let task = task().await;
                        crate::metrics::count(crate::metrics::JOBS_DEAD, &d.queue, &task);
                        tracing::error!(event = "job.dead", job = %id, %task, queue = %d.queue, worker = %consumer, "job lost its worker too often; it is dead");
                        report.dead += 1;
                        false
                    }
                    Lost::Missing => {
                        broker
                            .dead_letter(
                                &d,
                                &format!("message names job {id} which the store does not have"),
                            )
                            .await?;
                        continue;
                    }
                    Lost::Cancelled | Lost::NotOwned(_) => false,
                };
                if requeue {
                    if broker.requeue(&consumer, std::slice::from_ref(&d)).await? > 0 {
                        report.requeued += 1;
                        reclaimed += 1;
                        store.mark_dispatched(&[id]).await?;
                    }
                } else {
                    report.dropped += 1;
                    broker.ack(std::slice::from_ref(&d)).await?;
                }
            }
        }
        if stuck.is_empty() && broker.remove_consumer(&consumer).await? {
            report.lost_workers += 1;
            // Several rescuers may get here for one worker; only the one whose store update
            // changed the row reports it, so the alert goes out once.
            let ev = NewEvent::worker(
                WORKER_LOST,
                &consumer,
                serde_json::json!({ "reclaimed": reclaimed }),
            );
            if store
                .worker_gone(&consumer, WorkerStatus::Lost, Some(ev), now())
                .await?
            {
                tracing::warn!(event = "worker.lost", worker = %consumer, reclaimed, "worker lost: its heartbeat expired");
            }
        }
    }
    Ok(report)
}
