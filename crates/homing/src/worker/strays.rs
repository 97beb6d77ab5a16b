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
//! The session notes every delivery a reservation hands it ([`Received`]), before it does
//! anything else with it, and forgets one when it hands it back or dead-letters it. Every sweep
//! lists the messages reserved under this worker's name in its queues and puts back each one the
//! session does not hold and that was already there at the previous sweep (a reservation's
//! answer is noted microseconds after it arrives, so a second sighting is never a message on its
//! way in). A message the worker holds is never touched, however long it waits: for a free slot
//! behind long jobs (a prefetch above the concurrency), behind a store that is down, or in a
//! pause before it is handed back. One it tried to hand back or dead-letter, but whose call
//! failed, is a stray like any other. The rule for putting back is shared with the remote
//! gateway's sessions (`broker::strays`).
//!
//! An in-process broker (the embedded SQLite file) answers every call it made, so no sweep runs
//! there.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::Session;
use crate::broker::strays::{key, Key};
use crate::broker::Delivery;

/// A sweep runs every this many heartbeat intervals (20 s at the default 2 s).
const SWEEP_EVERY_HEARTBEATS: u32 = 10;

/// Strays looked at per sweep beyond what the worker may hold (its prefetch); more wait for the
/// next one.
const SWEEP_EXTRA: usize = 1000;

/// Failed sweeps in a row after which each further failure is a warning, not a debug line.
const QUIET_FAILURES: u32 = 3;

/// The deliveries the broker has handed this session and it still holds, each with the number
/// of the sweep during which it arrived. A delivery is forgotten when the worker hands it back
/// or dead-letters it (whether or not that call succeeds: if it fails, the message is a stray
/// the sweep puts back), and once a sweep that began after it arrived no longer finds it
/// reserved (acknowledged by then), so the set stays about as large as what the worker holds.
/// Kept only where a sweep runs, which prunes it: with an in-process broker it stays empty.
#[derive(Default)]
pub(crate) struct Received {
    kept: bool,
    held: Mutex<(u64, HashMap<Key, u64>)>,
}

impl Received {
    /// What a session on `broker` keeps.
    pub(crate) fn for_broker(broker: &dyn crate::broker::Broker) -> Self {
        Self {
            kept: !in_process(broker),
            held: Mutex::default(),
        }
    }

    /// Called with every delivery a reservation hands the session, before anything else.
    pub(crate) fn note(&self, deliveries: &[Delivery]) {
        if !self.kept {
            return;
        }
        let mut g = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let sweep = g.0;
        for d in deliveries {
            g.1.insert(key(d), sweep);
        }
    }

    /// Called with every delivery the worker lets go of other than by an acknowledgement.
    pub(crate) fn forget(&self, deliveries: &[Delivery]) {
        let mut g = self.held.lock().unwrap_or_else(|p| p.into_inner());
        for d in deliveries {
            g.1.remove(&key(d));
        }
    }

    /// Starts a sweep: tags noted from now on carry its number.
    fn begin(&self) -> u64 {
        let mut g = self.held.lock().unwrap_or_else(|p| p.into_inner());
        g.0 += 1;
        g.0
    }

    /// Forgets the tags noted before sweep `sweep` began that it did not find reserved.
    fn forget_gone(&self, reserved: &HashSet<Key>, sweep: u64) {
        let mut g = self.held.lock().unwrap_or_else(|p| p.into_inner());
        g.1.retain(|k, noted| *noted >= sweep || reserved.contains(k));
    }

    /// The deliveries of `listed` this session never received (or has let go of).
    fn unknown(&self, listed: Vec<Delivery>) -> Vec<Delivery> {
        let g = self.held.lock().unwrap_or_else(|p| p.into_inner());
        listed
            .into_iter()
            .filter(|d| !g.1.contains_key(&key(d)))
            .collect()
    }
}

/// Whether the broker lives in this process, and so answers every call it makes.
fn in_process(broker: &dyn crate::broker::Broker) -> bool {
    #[cfg(feature = "sqlite")]
    {
        broker.embedded_db().is_some()
    }
    #[cfg(not(feature = "sqlite"))]
    {
        let _ = broker;
        false
    }
}

pub(crate) async fn run(s: Arc<Session>, stop: CancellationToken) {
    if !s.received.kept {
        return;
    }
    let every = s.config.heartbeat_interval * SWEEP_EVERY_HEARTBEATS;
    let mut seen: HashSet<Key> = HashSet::new();
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
async fn sweep(s: &Session, before: &HashSet<Key>) -> crate::error::Result<HashSet<Key>> {
    let sweep = s.received.begin();
    let limit = s.config.prefetch().saturating_add(SWEEP_EXTRA);
    let pending = s.broker.pending_in(&s.id, &s.config.queues, limit).await?;
    // A listing cut at the limit does not show everything reserved here, so nothing is
    // forgotten from it.
    if pending.len() < limit {
        let reserved: HashSet<Key> = pending.iter().map(key).collect();
        s.received.forget_gone(&reserved, sweep);
    }
    let unheld = s.received.unknown(pending);
    // A session presumed dead puts nothing back: the rescuer owns its messages now.
    if s.lost.is_cancelled() {
        return Ok(HashSet::new());
    }
    Ok(crate::broker::strays::put_back(&*s.broker, &s.id, unheld, before).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept() -> Received {
        Received {
            kept: true,
            held: Mutex::default(),
        }
    }

    fn d(queue: &str, tag: &str) -> Delivery {
        Delivery {
            tag: tag.into(),
            queue: queue.into(),
            job: Err("not needed".into()),
        }
    }

    fn queues(v: Vec<Delivery>) -> Vec<String> {
        v.into_iter().map(|d| d.queue).collect()
    }

    #[test]
    fn a_tag_is_known_only_in_its_queue() {
        let r = kept();
        r.note(&[d("a", "1700000000000-0.1")]);
        let unknown = r.unknown(vec![
            d("a", "1700000000000-0.1"),
            d("b", "1700000000000-0.1"),
        ]);
        assert_eq!(queues(unknown), ["b"]);
    }

    #[test]
    fn a_delivery_let_go_of_is_no_longer_held() {
        let r = kept();
        r.note(&[d("a", "1-0.1"), d("a", "2-0.1")]);
        r.forget(&[d("a", "1-0.1")]);
        let unknown = r.unknown(vec![d("a", "1-0.1"), d("a", "2-0.1")]);
        assert_eq!(unknown.len(), 1);
        assert_eq!(unknown[0].tag, "1-0.1");
    }

    #[test]
    fn a_sweep_forgets_only_what_arrived_before_it_and_is_gone() {
        let r = kept();
        r.note(&[d("a", "gone-0.1"), d("a", "kept-0.1")]);
        let sweep = r.begin();
        // Arrives while the sweep lists: not in its listing, and must not be forgotten.
        r.note(&[d("a", "late-0.1")]);
        let listed: HashSet<Key> = [("a".to_string(), "kept-0.1".to_string())].into();
        r.forget_gone(&listed, sweep);
        let unknown = r.unknown(vec![
            d("a", "gone-0.1"),
            d("a", "kept-0.1"),
            d("a", "late-0.1"),
        ]);
        assert_eq!(unknown.len(), 1);
        assert_eq!(unknown[0].tag, "gone-0.1");
    }
}

#[cfg(test)]
mod unkept {
    use super::*;

    /// With an in-process broker no sweep prunes the set, so nothing may go into it.
    #[test]
    fn a_session_without_a_sweep_keeps_nothing() {
        let r = Received::default();
        let d = Delivery {
            tag: "1-0.1".into(),
            queue: "a".into(),
            job: Err("not needed".into()),
        };
        r.note(std::slice::from_ref(&d));
        assert!(r.held.lock().unwrap().1.is_empty());
    }
}
