//! Puts back stray messages: messages this worker holds in the broker without knowing it. (Not
//! the reconciler's orphans, which are jobs left running under a worker that is gone.)
//!
//! A reservation that ran on the server but whose answer never reached the worker (a Redis
//! connection that broke after the script ran, for the fetcher's reservation or a round's
//! combined acknowledgement and reservation) leaves its messages reserved under this worker's
//! name. The rescuer puts a worker's messages back only once the worker is gone, so for a
//! long-lived worker those jobs would wait for ever, queued, with nobody running them.
//!
//! Every sweep lists the messages reserved under this worker's name in its queues. One that was
//! already there at the previous sweep and whose job has no handler here and no outcome on its
//! way (`Session::running`, `Session::committing`) is put back. Every other message this worker
//! holds is in a round that lasts milliseconds, so it is gone by the next sweep. Putting a
//! message back is always safe because the store decides who runs a job: the new delivery
//! starts the job if it is still queued, is skipped and acknowledged if the job ran or runs
//! elsewhere, and runs it here if a start committed under this worker without its answer
//! (`executor::started_by_lost_answer`). The cost of a wrong guess is one more delivery; the one
//! known case is a message held through the pause before an unstartable job is handed back,
//! which a sweep can hand back early, so such a job is tried at most once more per sweep.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Session;

/// A sweep runs every this many heartbeat intervals (20 s at the default 2 s).
const SWEEP_EVERY_HEARTBEATS: u32 = 10;

/// Messages looked at per sweep; more wait for the next one.
const SWEEP_LIMIT: usize = 1000;

pub(crate) async fn run(s: Arc<Session>, stop: CancellationToken) {
    let every = sweep_interval(s.config.heartbeat_interval);
    let mut seen: HashSet<String> = HashSet::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
            _ = s.lost.cancelled() => return,
        }
        match sweep(&s, &seen).await {
            Ok(now_seen) => seen = now_seen,
            // Seen again from scratch: a sighting older than the failed sweep proves nothing
            // about how long a message has been held.
            Err(e) => {
                tracing::debug!(error = %e, "could not list this worker's reserved messages");
                seen.clear();
            }
        }
    }
}

/// Puts back what was reserved at the last sweep too and is held by nobody here; returns the
/// tags seen this time.
async fn sweep(s: &Session, before: &HashSet<String>) -> crate::error::Result<HashSet<String>> {
    let pending = s
        .broker
        .pending_in(&s.id, &s.config.queues, SWEEP_LIMIT)
        .await?;
    let held = |d: &crate::broker::Delivery| match d.job {
        Ok(id) => {
            s.running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&id)
                || s.committing
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&id)
        }
        // A message that names no job is dead-lettered as soon as it is delivered; one still
        // reserved here was never seen by this worker.
        Err(_) => false,
    };
    let strays: Vec<_> = pending
        .iter()
        .filter(|d| before.contains(&d.tag) && !held(d))
        .cloned()
        .collect();
    if !strays.is_empty() && !s.lost.is_cancelled() {
        let n = s.broker.requeue(&s.id, &strays).await?;
        if n > 0 {
            tracing::warn!(
                event = "worker.strays_put_back",
                count = n,
                worker = %s.id,
                "put back messages reserved under this worker's name that it did not know it held (a reservation whose answer was lost)"
            );
        }
    }
    Ok(pending
        .into_iter()
        .filter(|d| !strays.iter().any(|o| o.tag == d.tag))
        .map(|d| d.tag)
        .collect())
}

/// How often a worker with heartbeat interval `heartbeat` sweeps.
pub(crate) fn sweep_interval(heartbeat: Duration) -> Duration {
    heartbeat * SWEEP_EVERY_HEARTBEATS
}
