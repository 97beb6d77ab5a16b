//! Responsible for reserving messages: never more than the free reservations (prefetch), so a
//! crash puts at risk only what this worker holds (docs/design.md section 1, guarantee 8).

use std::sync::Arc;
use std::time::Duration;

use super::{executor, Session};

/// How long one reservation call may wait for a message before the loop looks around again.
const RESERVE_WAIT: Duration = Duration::from_millis(500);

pub(crate) async fn run(s: Arc<Session>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if s.stopping.is_cancelled() || s.lost.is_cancelled() {
            return;
        }
        let first = tokio::select! {
            p = s.reservations.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = s.stopping.cancelled() => return,
            _ = s.lost.cancelled() => return,
        };
        let mut permits = vec![first];
        while let Ok(p) = s.reservations.clone().try_acquire_owned() {
            permits.push(p);
        }
        // Not cancelled mid-call: a reservation that completes after its caller went away would
        // leave messages owned by a worker that no longer waits for them.
        let reserved = s
            .broker
            .reserve(&s.id, &s.config.queues, permits.len(), RESERVE_WAIT)
            .await;
        match reserved {
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "cannot reserve messages");
                drop(permits);
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = s.stopping.cancelled() => return,
                    _ = s.lost.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Ok(deliveries) => {
                backoff = Duration::from_millis(50);
                permits.truncate(deliveries.len());
                if deliveries.is_empty() {
                    continue;
                }
                if s.stopping.is_cancelled() {
                    // Reserved just as shutdown began: hand them straight back.
                    if let Err(e) = s.broker.requeue(&s.id, &deliveries).await {
                        tracing::warn!(error = %e, "could not hand back messages; the rescuer will");
                    }
                    return;
                }
                executor::start_batch(&s, deliveries, permits).await;
            }
        }
    }
}
