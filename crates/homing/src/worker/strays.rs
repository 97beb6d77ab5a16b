//! Puts back stray messages: messages reserved under this worker's name that the broker never
//! handed to it. (Not the reconciler's orphans, which are jobs left running under a worker that
//! is gone.)
//!
//! A reservation that ran on the server but whose answer never reached the worker (a Redis
//! connection that broke after the script ran, for the fetcher's reservation or a round's
//! combined acknowledgement and reservation) leaves its messages reserved under this worker's
//! name. The rescuer puts a worker's messages back only once the worker is gone, so for a
//! long-lived worker those jobs would wait for ever, queued, with nobody running them.
//!
//! The session notes the tag of every delivery a reservation hands it ([`Received`]), before it
//! does anything else with it. Every sweep lists the messages reserved under this worker's name
//! in its queues and puts back each one whose tag the session never received and that was
//! already there at the previous sweep (a reservation's answer is noted microseconds after it
//! arrives, so a second sighting is never a message on its way in). A message the worker did
//! receive is never touched, however long it waits: for a free slot behind long jobs (a prefetch
//! above the concurrency), behind a store that is down, or in a pause before it is handed back.
//! Putting back a stray is one more delivery of its job, which the start answers like any
//! duplicate (docs/design.md), so even a wrong guess could not run a job twice.
//!
//! An in-process broker (the embedded SQLite file) answers every call it made, so no sweep runs
//! there.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Session;
use crate::broker::Delivery;

/// A sweep runs every this many heartbeat intervals (20 s at the default 2 s).
const SWEEP_EVERY_HEARTBEATS: u32 = 10;

/// Messages looked at per sweep; more wait for the next one.
const SWEEP_LIMIT: usize = 1000;

/// Failed sweeps in a row after which each further failure is a warning, not a debug line.
const QUIET_FAILURES: u32 = 3;

/// The delivery tags the broker has handed this session, each with the number of the sweep
/// during which it arrived. A tag is forgotten once a sweep that began after it arrived no
/// longer finds it reserved (acknowledged, handed back or dead-lettered by then), so the set
/// stays about as large as what the worker holds.
#[derive(Default)]
pub(crate) struct Received(Mutex<(u64, HashMap<String, u64>)>);

impl Received {
    /// Called with every delivery a reservation hands the session, before anything else.
    pub(crate) fn note(&self, deliveries: &[Delivery]) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let sweep = g.0;
        for d in deliveries {
            g.1.insert(d.tag.clone(), sweep);
        }
    }

    /// Starts a sweep: tags noted from now on carry its number.
    fn begin(&self) -> u64 {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.0 += 1;
        g.0
    }

    /// Forgets the tags noted before sweep `sweep` began that it did not find reserved.
    fn forget_gone(&self, reserved: &HashSet<&str>, sweep: u64) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.1.retain(|tag, noted| *noted >= sweep || reserved.contains(tag.as_str()));
    }

    fn knows(&self, tag: &str) -> bool {
        let g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.1.contains_key(tag)
    }
}

pub(crate) async fn run(s: Arc<Session>, stop: CancellationToken) {
    if s.broker.embedded_db().is_some() {
        return;
    }
    let every = sweep_interval(s.config.heartbeat_interval);
    let mut seen: HashSet<String> = HashSet::new();
    let mut failures = 0u32;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
            _ = s.lost.cancelled() => return,
        }
        match sweep(&s, &seen).await {
            Ok(now_seen) => {
                seen = now_seen;
                failures = 0;
            }
            Err(e) => {
                failures += 1;
                if failures > QUIET_FAILURES {
                    tracing::warn!(error = %e, failures, "cannot look for stray messages reserved under this worker's name");
                } else {
                    tracing::debug!(error = %e, "cannot look for stray messages reserved under this worker's name");
                }
            }
        }
    }
}

/// Puts back the strays seen at the previous sweep too; returns the strays seen this time that
/// are still reserved here (put back next time if they still are).
async fn sweep(s: &Session, before: &HashSet<String>) -> crate::error::Result<HashSet<String>> {
    let sweep = s.received.begin();
    let pending = s
        .broker
        .pending_in(&s.id, &s.config.queues, SWEEP_LIMIT)
        .await?;
    // A listing cut at the limit does not show everything reserved here, so nothing is
    // forgotten from it.
    if pending.len() < SWEEP_LIMIT {
        let reserved: HashSet<&str> = pending.iter().map(|d| d.tag.as_str()).collect();
        s.received.forget_gone(&reserved, sweep);
    }
    let (again, first): (Vec<Delivery>, Vec<Delivery>) = pending
        .into_iter()
        .filter(|d| !s.received.knows(&d.tag))
        .partition(|d| before.contains(&d.tag));
    let mut still: HashSet<String> = first.into_iter().map(|d| d.tag).collect();
    if !again.is_empty() && !s.lost.is_cancelled() {
        match s.broker.requeue(&s.id, &again).await {
            Ok(n) if n > 0 => tracing::warn!(
                event = "worker.strays_put_back",
                count = n,
                worker = %s.id,
                "put back messages reserved under this worker's name that it never received (a reservation whose answer was lost)"
            ),
            Ok(_) => {}
            // Seen again next time, and put back then.
            Err(e) => {
                tracing::warn!(error = %e, "could not put back stray messages; trying again at the next sweep");
                still.extend(again.into_iter().map(|d| d.tag));
            }
        }
    }
    Ok(still)
}

/// How often a worker with heartbeat interval `heartbeat` sweeps.
pub(crate) fn sweep_interval(heartbeat: Duration) -> Duration {
    heartbeat * SWEEP_EVERY_HEARTBEATS
}
