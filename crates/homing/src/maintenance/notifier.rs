//! The notifier drains the events outbox: turns each pending event into one `builtin.webhook` job per
//! matching subscription (and one for the job's callback URL), in one store transaction, then
//! publishes those jobs. Safe to run in many processes at once: the store hands each event to one
//! caller and the deliveries' idempotency keys (`<event id>:<target>`) make a repeat harmless.
//!
//! Every process that runs it must have the same subscriptions: an event is fanned out once, to
//! the subscriptions of whichever notifier takes it. `homing server` and `homing up` always run
//! it (callbacks need no subscription); a `homing worker` runs it only when it has webhooks
//! configured.

use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::client::publish;
use crate::error::Result;
use crate::events::Subscriber;
use crate::store::Store;
use crate::time::now;

const BATCH: usize = 200;

/// Starts the notifier loop; it stops when `stop` is cancelled.
pub fn spawn(
    broker: Arc<dyn Broker>,
    store: Arc<dyn Store>,
    subscribers: Vec<Subscriber>,
    interval: Duration,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut pace = super::Pace::new("notifier", interval);
        loop {
            let outcome = pass(&*broker, &*store, &subscribers).await;
            let wait = pace.after(&outcome);
            if let Err(e) = outcome {
                tracing::warn!(error = %e, retry_in = ?wait, "event notifier pass failed; will try again");
            }
            if !super::tick(wait, &stop).await {
                return;
            }
        }
    })
}

/// Fans out every pending event; returns how many deliveries it created.
pub async fn pass(
    broker: &dyn Broker,
    store: &dyn Store,
    subscribers: &[Subscriber],
) -> Result<usize> {
    let mut created = 0;
    loop {
        let out = store.fan_out(subscribers, BATCH, now()).await?;
        created += out.dispatch.len();
        if !out.dispatch.is_empty() {
            tracing::debug!(
                events = out.events,
                deliveries = out.dispatch.len(),
                "events fanned out"
            );
            // A failed publish leaves the deliveries undispatched: the reconciler's work.
            if let Err(e) = publish(broker, store, &out.dispatch).await {
                tracing::warn!(error = %e, "publishing webhook deliveries failed; the reconciler will");
            }
        }
        if out.events < BATCH {
            return Ok(created);
        }
    }
}
