//! Responsible for making the broker agree with the store, the source of truth
//! (docs/design.md section 1, guarantee 9):
//! - jobs the store lists as queued but undispatched (a producer or scheduler that crashed
//!   between its store commit and its publish) are published;
//! - a broker whose marker vanished has lost its data: every queued job is published again;
//! - a job running under a worker that is gone and holds no message (its message was lost with
//!   the broker's data) is put back, its crash counted if it was running when the worker was
//!   first presumed dead (`Store::presume_lost`; a run begun after that counts none).

use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use super::MaintenanceConfig;
use crate::broker::Broker;
use crate::client::publish;
use crate::error::Result;
use crate::store::{Lost, Presumption, Store, ToPublish};
use crate::time::{micros, now};

const BATCH: usize = 1000;

pub(crate) async fn run(
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    config: MaintenanceConfig,
    stop: CancellationToken,
) {
    let mut first = true;
    let mut pace = super::Pace::new("reconciler", config.reconcile_interval);
    loop {
        let outcome = pass(&*broker, &*store, &config, first).await;
        let wait = pace.after(&outcome);
        if let Err(e) = outcome {
            tracing::warn!(error = %e, retry_in = ?wait, "reconciler pass failed; will try again");
        } else {
            first = false;
        }
        if !super::tick(wait, &stop).await {
            return;
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    pub broker_data_lost: bool,
    pub published: usize,
    pub orphans_requeued: usize,
}

/// One reconciliation pass.
pub async fn pass(
    broker: &dyn Broker,
    store: &dyn Store,
    config: &MaintenanceConfig,
    first: bool,
) -> Result<PassReport> {
    let mut report = PassReport::default();
    if !broker.check_marker().await? {
        let n = store.redispatch_all().await?;
        report.broker_data_lost = !first || n > 0;
        if n > 0 {
            tracing::warn!(
                event = "broker.data_lost",
                jobs = n,
                "the broker's marker was missing (first start, or the broker lost its data): publishing every queued job again"
            );
        }
    }
    let mut orphans = Vec::new();
    let mut freed = Vec::new();
    // A lost worker usually leaves several orphans; it is presumed dead once a pass. One whose
    // presumption is deferred (a start of it still in flight) keeps its orphans until the next.
    let mut presumed: std::collections::HashMap<String, Presumption> =
        std::collections::HashMap::new();
    for (id, worker, _started) in store.running(BATCH).await? {
        if worker.is_empty()
            || presumed.get(&worker) == Some(&Presumption::Deferred)
            || broker.is_alive(&worker).await?
        {
            continue;
        }
        // The rescuer handles workers that still hold messages; only orphans are ours.
        if !broker.pending(&worker, 1).await?.is_empty() {
            continue;
        }
        // A deferred worker was skipped above; one already presumed this pass needs nothing.
        if !presumed.contains_key(&worker) {
            let p = store.presume_lost(&worker, now()).await?;
            presumed.insert(worker.clone(), p);
            if p == Presumption::Deferred {
                tracing::warn!(%worker, "the presumption of this lost worker waited too long for a lock (a start of it still in flight: its process paused mid-transaction?); leaving its orphaned jobs for the next pass");
                continue;
            }
        }
        let (lost, unparked) = match store.mark_lost_unparking(id, &worker, true, now()).await {
            Ok(decided) => decided,
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => {
                // One job the store fails on must not stop the outbox below for everyone.
                tracing::error!(job = %id, %worker, error = %e, "cannot reclaim an orphaned running job; skipping it");
                continue;
            }
        };
        // The job its freed slot unparked, published here rather than by the outbox below.
        freed.extend(unparked);
        if let Lost::Requeued = lost {
            tracing::warn!(event = "job.reclaimed", job = %id, %worker, "reclaimed a running job whose worker and message are gone");
            if let Some(job) = store.get(id).await? {
                crate::metrics::count(crate::metrics::JOBS_RECLAIMED, &job.queue, &job.task);
                orphans.push(ToPublish {
                    id,
                    queue: job.queue,
                    priority: job.priority,
                });
            }
        }
    }
    report.orphans_requeued = orphans.len();
    orphans.append(&mut freed);
    publish(broker, store, &orphans).await?;
    let before = now() - micros(config.dispatch_grace);
    loop {
        let due: Vec<ToPublish> = store.undispatched(before, BATCH).await?;
        if due.is_empty() {
            break;
        }
        publish(broker, store, &due).await?;
        report.published += due.len();
        if due.len() < BATCH {
            break;
        }
    }
    Ok(report)
}
