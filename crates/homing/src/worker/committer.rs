//! Responsible for committing outcomes and only then acknowledging (late ack, DESIGN.md
//! section 4, steps 4–5). Completions that arrive together are committed in one store
//! transaction and acknowledged in one broker call: batching is what makes full state tracking
//! cheap.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

use super::Session;
use crate::broker::Delivery;
use crate::client::publish;
use crate::job::JobState;
use crate::store::{Committed, Completion, Outcome, ToPublish};
use crate::time::now;

/// Most completions committed in one transaction.
const MAX_BATCH: usize = 512;

/// One delivery to finish: commit its completion (if any), then acknowledge its message.
pub(crate) struct Item {
    pub delivery: Delivery,
    pub completion: Option<Completion>,
    pub task: String,
    /// Held, never read: dropped only after the ack, so reserved-but-unacknowledged messages
    /// never exceed prefetch.
    #[allow(dead_code)]
    pub reservation: Option<OwnedSemaphorePermit>,
}

pub(crate) async fn run(s: Arc<Session>, mut rx: mpsc::Receiver<Item>, done: CancellationToken) {
    loop {
        let first = tokio::select! {
            biased;
            x = rx.recv() => match x { Some(x) => x, None => return },
            _ = done.cancelled() => match rx.try_recv() { Ok(x) => x, Err(_) => return },
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(x) => batch.push(x),
                Err(_) => break,
            }
        }
        commit(&s, batch, &done).await;
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

async fn commit(s: &Session, batch: Vec<Item>, done: &CancellationToken) {
    let completions: Vec<Completion> = batch.iter().filter_map(|i| i.completion.clone()).collect();
    let mut to_dispatch: Vec<ToPublish> = Vec::new();
    if !completions.is_empty() {
        let Some(results) = retrying(s, done, "committing outcomes", || {
            s.store.complete(&completions, now())
        })
        .await
        else {
            return;
        };
        let items = batch.iter().filter(|i| i.completion.is_some());
        for ((item, c), r) in items.zip(&completions).zip(results) {
            match r {
                Committed::Applied { state, dispatch } => {
                    log_outcome(item, c, state);
                    count_outcome(item, c);
                    to_dispatch.extend(dispatch);
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
    let deliveries: Vec<Delivery> = batch.iter().map(|i| i.delivery.clone()).collect();
    retrying(s, done, "acknowledging messages", || {
        s.broker.ack(&deliveries)
    })
    .await;
    drop(batch);
}

fn count_outcome(item: &Item, c: &Completion) {
    use crate::metrics::*;
    let name = match c.outcome {
        Outcome::Succeeded(_) => JOBS_SUCCEEDED,
        Outcome::Failed { .. } => JOBS_FAILED,
        Outcome::Retry { .. } => JOBS_RETRIED,
        Outcome::Dead { .. } => JOBS_DEAD,
        _ => return,
    };
    count(name, &item.delivery.queue, &item.task);
}

fn log_outcome(item: &Item, c: &Completion, state: JobState) {
    match (&c.outcome, state) {
        (Outcome::Failed { error }, _) => {
            tracing::warn!(event = "job.failed", job = %c.id, task = %item.task, %error, "job failed");
        }
        (Outcome::Dead { reason }, _) => {
            tracing::error!(event = "job.dead", job = %c.id, task = %item.task, %reason, "job is dead");
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
