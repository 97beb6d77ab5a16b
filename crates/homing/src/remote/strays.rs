//! Stray messages of remote sessions: messages reserved under a session's name whose job the
//! session never started, left by a server that died between a `reserve`'s reservation and its
//! start, or by a reservation whose answer from Redis was lost. The rescuer puts a session's
//! messages back only once it is gone, so while the session lives those jobs would stay queued.
//!
//! A session holds a message while the message's job runs under it: the gateway starts what it
//! reserves in the same call, and a completion acknowledges right after its commit; only those
//! two moments (reserved, not yet started; committed, not yet acknowledged) show a held message
//! whose job does not run under the session. The sweep, every [`SWEEP_EVERY_HEARTBEATS`] of the
//! session's heartbeats, reads the jobs running under the session, then lists the messages
//! reserved under its name, and puts back each one whose job does not run under it and that the
//! previous sweep saw too (`broker::strays`), so a message in one of those moments is never
//! touched.
//!
//! The gateway keeps nothing else in memory: [`Sightings`] is a hint, per server. A server that
//! restarts waits one more sweep; a session whose heartbeats are spread over N servers is swept
//! by each of them about N times less often.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::broker::strays::Key;
use crate::broker::{Broker, Delivery};
use crate::job::JobId;
use crate::store::Store;

/// A session's sweep runs every this many of its heartbeat intervals (20 s at 2 s).
pub const SWEEP_EVERY_HEARTBEATS: u32 = 10;

/// A session's sightings are dropped once its last sweep on this server is this many sweep
/// periods old: it ended, expired, or beats elsewhere.
const FORGET_AFTER_SWEEPS: u32 = 50;

/// What one server's sweeps saw, per session: kept in the API server's state and shared by
/// every call, since the gateway itself is made per call.
#[derive(Default)]
pub struct Sightings {
    sessions: Mutex<HashMap<String, Sighting>>,
}

struct Sighting {
    swept_at: Instant,
    every: Duration,
    unheld: HashSet<Key>,
}

impl Sightings {
    /// When a sweep of `session` is due, marks it begun and answers what the previous one saw.
    fn begin(&self, session: &str, every: Duration) -> Option<HashSet<Key>> {
        let mut g = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if g.get(session).is_some_and(|s| s.swept_at.elapsed() < every) {
            return None;
        }
        // Only when a sweep is due, so most heartbeats do not walk every session.
        g.retain(|_, s| s.swept_at.elapsed() < s.every.saturating_mul(FORGET_AFTER_SWEEPS));
        match g.get_mut(session) {
            Some(s) => {
                s.swept_at = Instant::now();
                s.every = every;
                Some(std::mem::take(&mut s.unheld))
            }
            None => {
                g.insert(
                    session.to_string(),
                    Sighting {
                        swept_at: Instant::now(),
                        every,
                        unheld: HashSet::new(),
                    },
                );
                Some(HashSet::new())
            }
        }
    }

    fn remember(&self, session: &str, unheld: HashSet<Key>) {
        let mut g = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = g.get_mut(session) {
            s.unheld = unheld;
        }
    }

    /// Forgets an ended session.
    pub(crate) fn forget(&self, session: &str) {
        let mut g = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        g.remove(session);
    }
}

/// The deliveries of `pending` whose job does not run under the session (`running`); one that
/// names no readable job is held by no one either.
fn unheld(pending: Vec<Delivery>, running: &HashSet<JobId>) -> Vec<Delivery> {
    pending
        .into_iter()
        .filter(|d| d.job.as_ref().map_or(true, |id| !running.contains(id)))
        .collect()
}

/// Sweeps `session` when due. The jobs running under it are read first, then the messages: a
/// job that starts in between is seen as unheld at this sweep only.
pub(crate) async fn sweep(
    sightings: &Sightings,
    broker: &dyn Broker,
    store: &dyn Store,
    session: &str,
    queues: &[String],
    heartbeat_interval: Duration,
) -> crate::error::Result<()> {
    let every = heartbeat_interval.saturating_mul(SWEEP_EVERY_HEARTBEATS);
    let Some(before) = sightings.begin(session, every) else {
        return Ok(());
    };
    let listed = async {
        let running = store.running_under(session, super::MAX_HELD).await?;
        // A listing cut at its limit cannot tell which messages are held.
        if running.len() >= super::MAX_HELD {
            return Ok(None);
        }
        let running: HashSet<JobId> = running.iter().map(|r| r.id).collect();
        let pending = broker.pending_in(session, queues, super::MAX_HELD).await?;
        crate::error::Result::Ok(Some(unheld(pending, &running)))
    };
    let unheld = match listed.await {
        Ok(Some(u)) => u,
        // Nothing was looked at: what the previous sweep saw stands for the next one.
        other => {
            sightings.remember(session, before);
            return other.map(|_| ());
        }
    };
    let still = crate::broker::strays::put_back(broker, session, unheld, &before).await;
    sightings.remember(session, still);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::strays::key;

    fn d(tag: &str, job: Result<JobId, String>) -> Delivery {
        Delivery {
            tag: tag.into(),
            queue: "q".into(),
            job,
        }
    }

    #[test]
    fn a_message_whose_job_runs_under_the_session_is_held() {
        let running_id = uuid::Uuid::now_v7();
        let queued_id = uuid::Uuid::now_v7();
        let out = unheld(
            vec![
                d("1-0", Ok(running_id)),
                d("2-0", Ok(queued_id)),
                d("3-0", Err("garbage".into())),
            ],
            &[running_id].into(),
        );
        let tags: Vec<&str> = out.iter().map(|d| d.tag.as_str()).collect();
        assert_eq!(tags, ["2-0", "3-0"]);
    }

    #[test]
    fn a_sweep_is_due_at_once_and_then_once_per_period() {
        let s = Sightings::default();
        let every = Duration::from_millis(200);
        assert_eq!(s.begin("a", every), Some(HashSet::new()));
        let seen: HashSet<Key> = [key(&d("1-0", Err(String::new())))].into();
        s.remember("a", seen.clone());
        assert_eq!(s.begin("a", every), None, "not due yet");
        std::thread::sleep(every);
        assert_eq!(
            s.begin("a", every),
            Some(seen),
            "the previous sweep's sightings"
        );
        s.forget("a");
        assert_eq!(
            s.begin("a", every),
            Some(HashSet::new()),
            "an ended session starts over"
        );
    }
}
