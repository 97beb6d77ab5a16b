//! Responsible for due dates: scheduled jobs (countdowns, retry delays, snoozes) are rows in the
//! store, never timers in memory, so a delay survives every crash (docs/design.md section 1,
//! guarantee 7). Each due job is claimed by exactly one scheduler and published.

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::client::publish;
use crate::error::Result;
use crate::store::Store;
use crate::time::now;

const BATCH: usize = 1000;

pub(crate) async fn run(
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut pace = super::Pace::new("scheduler", interval);
    let mut wait = interval;
    while super::tick(wait, &stop).await {
        let outcome = dispatch_due(&*broker, &*store).await;
        wait = pace.after(&outcome);
        if let Err(e) = outcome {
            tracing::warn!(error = %e, retry_in = ?wait, "scheduler pass failed; will try again");
        }
    }
}

/// Claims and publishes every job due now; returns how many.
pub async fn dispatch_due(broker: &dyn Broker, store: &dyn Store) -> Result<usize> {
    let mut total = 0;
    loop {
        let due = store.claim_due(now(), BATCH).await?;
        if due.is_empty() {
            return Ok(total);
        }
        total += due.len();
        // A crash or failure here leaves them queued and undispatched: the reconciler's work.
        publish(broker, store, &due).await?;
        if due.len() < BATCH {
            return Ok(total);
        }
    }
}
