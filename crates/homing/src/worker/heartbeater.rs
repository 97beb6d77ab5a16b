//! Responsible for keeping this worker alive in the broker's eyes, for noticing when it was
//! presumed dead anyway (then the session ends and the worker rejoins under a new name), and for
//! relaying operators' cancel requests to running handlers.

use std::sync::Arc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Session, StopReason};
use crate::time::now;

/// The store's record of the worker is refreshed every this many heartbeats.
const SEEN_EVERY: u32 = 5;

pub(crate) async fn run(s: Arc<Session>, stop: CancellationToken) {
    let interval = s.config.heartbeat_interval;
    let ttl = s.config.heartbeat_ttl();
    let mut last_ok = Instant::now();
    let mut beats = 0u32;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.cancelled() => return,
        }
        match s.broker.heartbeat(&s.id, ttl).await {
            Ok(true) => last_ok = Instant::now(),
            Ok(false) => {
                lost(&s, "its heartbeat had expired");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat failed");
                if last_ok.elapsed() >= ttl {
                    lost(&s, "no heartbeat got through for a whole TTL");
                    return;
                }
            }
        }
        beats += 1;
        if beats.is_multiple_of(SEEN_EVERY) {
            if let Err(e) = s.store.worker_seen(&s.id, now()).await {
                tracing::debug!(error = %e, "could not record the worker as seen");
            }
        }
        let ids = s.running_ids();
        if !ids.is_empty() {
            match s.store.cancel_requested(&ids).await {
                Ok(cancel) => {
                    let running = s.running.lock().unwrap_or_else(|p| p.into_inner());
                    for id in cancel {
                        if let Some(r) = running.get(&id) {
                            tracing::info!(job = %id, "cancel requested: stopping the handler");
                            r.stop(StopReason::Cancelled);
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "could not poll cancel requests"),
            }
        }
    }
}

/// Ends the session as presumed dead: its handlers stop, committing nothing, and the worker
/// rejoins under a new name. Once per session, whoever notices first.
pub(super) fn lost(s: &Session, why: &str) {
    if s.lost.is_cancelled() {
        return;
    }
    tracing::warn!(worker = %s.id, "presumed dead: {why}");
    s.stop_all(StopReason::Lost);
    s.lost.cancel();
}
