//! Responsible for retention: finished jobs, delivered events, departed workers, the charts'
//! rollups (docs/charts.md) and the broker's dead letters older than the retention period are deleted, a batch per transaction. Without it the store only grows, and
//! what reads all of it (queue counts on the dashboard, listings) slows down month by month.
//! Nothing unfinished is ever deleted; the store's `purge` decides that row by row.

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::error::Result;
use crate::store::{Purged, Store};
use crate::time::{micros, now, Micros};

/// Rows deleted per transaction: short enough that other writers barely wait for it.
const BATCH: usize = 500;

pub(crate) async fn run(
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    retention: Duration,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut pace = super::Pace::new("pruner", interval);
    let mut wait = interval;
    while super::tick(wait, &stop).await {
        let before = now() - micros(retention);
        let dead_letters = broker.purge_dead_letters(before).await;
        if let Err(e) = &dead_letters {
            tracing::warn!(error = %e, "could not delete old dead letters; will try again");
        }
        let purged = purge_before(&*store, before, &stop).await;
        match &purged {
            Ok(p) if *p != Purged::default() || dead_letters.as_ref().is_ok_and(|n| *n > 0) => {
                tracing::info!(
                    jobs = p.jobs,
                    events = p.events,
                    workers = p.workers,
                    audit = p.audit,
                    workflows = p.workflows,
                    stats = p.stats,
                    dead_letters = dead_letters.as_ref().copied().unwrap_or(0),
                    retention = %humantime::format_duration(retention),
                    "deleted history older than the retention period"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention pass failed; will try again"),
        }
        wait = pace.after(&purged.and(dead_letters));
    }
}

/// Deletes everything [`Store::purge`] allows from before `before`, batch by batch, until a
/// batch comes back short or `stop` is cancelled; returns the totals.
pub async fn purge_before(
    store: &dyn Store,
    before: Micros,
    stop: &CancellationToken,
) -> Result<Purged> {
    let mut total = Purged::default();
    loop {
        let p = store.purge(before, BATCH).await?;
        total.jobs += p.jobs;
        total.events += p.events;
        total.workers += p.workers;
        total.audit += p.audit;
        total.workflows += p.workflows;
        total.stats += p.stats;
        let full = |n: u64| n as usize >= BATCH;
        if !(full(p.jobs) || full(p.events) || full(p.audit) || full(p.workflows) || full(p.stats))
            || stop.is_cancelled()
        {
            return Ok(total);
        }
        // Between batches, let the workers' own commits through.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
