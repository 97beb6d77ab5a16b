//! Responsible for retention: finished jobs, delivered events, departed workers, the charts'
//! rollups (docs/charts.md) and the broker's dead letters older than the retention period are deleted, a batch per transaction. Without it the store only grows, and
//! what reads all of it (queue counts on the dashboard, listings) slows down month by month.
//! Nothing unfinished is ever deleted; the store's `purge` decides that row by row.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::error::Result;
use crate::store::{Purged, Store};
use crate::time::{micros, now, Micros};

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
/// batch comes back short or `stop` is cancelled; returns the totals. Each batch is one short
/// transaction and the pause after it is paced by [`Pacer`], so the job path keeps the store.
pub async fn purge_before(
    store: &dyn Store,
    before: Micros,
    stop: &CancellationToken,
) -> Result<Purged> {
    let mut total = Purged::default();
    let mut pacer = Pacer::new();
    loop {
        let batch = pacer.batch();
        let started = Instant::now();
        let p = store.purge(before, batch).await?;
        let took = started.elapsed();
        total.jobs += p.jobs;
        total.events += p.events;
        total.workers += p.workers;
        total.audit += p.audit;
        total.workflows += p.workflows;
        total.stats += p.stats;
        let full = |n: u64| n as usize >= batch;
        if !(full(p.jobs) || full(p.events) || full(p.audit) || full(p.workflows) || full(p.stats))
        {
            return Ok(total);
        }
        let pause = pacer.after(took);
        tokio::select! {
            _ = stop.cancelled() => return Ok(total),
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// The size of the pruner's next batch and its pause after each, decided from how long the
/// last batch took (its transaction, and the wait for the store's writer before it). Two rules:
/// a batch should take about [`Pacer::TARGET`], so the transaction other writers may queue behind
/// stays short; and the pruner should hold the store at most [`Pacer::SHARE`] of the time, so
/// the jobs' own commits get the rest. A busy store makes every batch slower (it waits for the
/// writer), which lengthens the pauses and shrinks the batches: the pruner yields by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pacer {
    batch: usize,
}

impl Pacer {
    /// Rows per table in the first batch of a pass.
    pub(crate) const START: usize = 500;
    pub(crate) const MIN: usize = 50;
    pub(crate) const MAX: usize = 5_000;
    /// How long a batch should take.
    pub(crate) const TARGET: Duration = Duration::from_millis(20);
    /// The largest share of the time the pruner's batches may take, as 1 in this many.
    pub(crate) const SHARE: u32 = 10;
    /// The shortest pause, so a store that answers instantly is still not asked in a loop.
    pub(crate) const MIN_PAUSE: Duration = Duration::from_millis(5);

    pub(crate) fn new() -> Self {
        Pacer { batch: Self::START }
    }

    pub(crate) fn batch(&self) -> usize {
        self.batch
    }

    /// After a full batch that took `took`: sizes the next one and returns the pause before it.
    pub(crate) fn after(&mut self, took: Duration) -> Duration {
        if took > Self::TARGET {
            self.batch = (self.batch / 2).max(Self::MIN);
        } else if took < Self::TARGET / 2 {
            self.batch = self.batch.saturating_mul(2).min(Self::MAX);
        }
        took.saturating_mul(Self::SHARE - 1).max(Self::MIN_PAUSE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_batches_grow_up_to_the_cap() {
        let mut p = Pacer::new();
        for _ in 0..20 {
            p.after(Duration::from_millis(1));
        }
        assert_eq!(p.batch(), Pacer::MAX);
    }

    #[test]
    fn slow_batches_shrink_down_to_the_floor() {
        let mut p = Pacer::new();
        for _ in 0..20 {
            p.after(Duration::from_secs(2));
        }
        assert_eq!(p.batch(), Pacer::MIN);
    }

    #[test]
    fn a_batch_near_the_target_keeps_its_size() {
        let mut p = Pacer::new();
        p.after(Pacer::TARGET * 3 / 4);
        assert_eq!(p.batch(), Pacer::START);
    }

    #[test]
    fn the_pause_keeps_the_pruner_to_its_share_of_the_time() {
        let mut p = Pacer::new();
        for ms in [1u64, 7, 20, 40, 300, 5_000] {
            let took = Duration::from_millis(ms);
            let pause = p.after(took);
            // took / (took + pause) <= 1 / SHARE
            assert!(
                took * Pacer::SHARE <= took + pause,
                "{ms} ms: pause {pause:?}"
            );
            assert!(pause >= Pacer::MIN_PAUSE);
        }
    }
}
