//! Responsible for retention: finished jobs, delivered events, departed workers and the broker's
//! dead letters older than the retention period are deleted, a batch per transaction. Without it the store only grows, and
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
    while super::tick(interval, &stop).await {
        let before = now() - micros(retention);
        let dead_letters = match broker.purge_dead_letters(before).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "could not delete old dead letters; will try again");
                0
            }
        };
        match purge_before(&*store, before, &stop).await {
            Ok(p) if p != Purged::default() || dead_letters > 0 => {
                tracing::info!(
                    jobs = p.jobs,
                    events = p.events,
                    workers = p.workers,
                    dead_letters,
                    retention = %humantime::format_duration(retention),
                    "deleted history older than the retention period"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention pass failed; will try again"),
        }
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
        if (p.jobs as usize) < BATCH && (p.events as usize) < BATCH || stop.is_cancelled() {
            return Ok(total);
        }
        // Between batches, let the workers' own commits through.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
