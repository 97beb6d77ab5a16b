//! Publishes jobs that other parties enqueued straight into the store, as soon as their
//! transaction commits: the SQL function `homing_enqueue`, [`crate::Client::enqueue_in`] and
//! workflow steps made runnable outside a worker's commit all leave jobs undispatched and
//! signal it (PostgreSQL NOTIFY, delivered at commit only). Without this loop those jobs would
//! wait for the reconciler's sweep (its grace plus its interval, seconds); the sweep remains
//! the fallback for every signal lost (a listener down at commit time, a dropped connection).

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::client::publish;
use crate::store::Store;

const BATCH: usize = 1000;

pub(crate) async fn run(broker: Arc<dyn Broker>, store: Arc<dyn Store>, stop: CancellationToken) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let woke = tokio::select! {
            _ = stop.cancelled() => return,
            r = store.wait_enqueued() => r,
        };
        match woke {
            Ok(false) => return,
            Ok(true) => {
                backoff = Duration::from_millis(200);
                // Every undispatched job, not only the signalled one: one pass drains what
                // several commits signalled. A message published twice (a producer publishing
                // its own job meanwhile) is skipped by the idempotency guard.
                let before = crate::time::now().saturating_add(1);
                match store.undispatched(before, BATCH).await {
                    Ok(due) => {
                        if let Err(e) = publish(&*broker, &*store, &due).await {
                            tracing::warn!(error = %e, "the listener could not publish; the reconciler will");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the listener could not read the outbox; the reconciler will")
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "the enqueue listener lost its connection; the reconciler publishes meanwhile");
                if !super::tick(backoff, &stop).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}
