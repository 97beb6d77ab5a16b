//! The broker: moves messages that name jobs from producers to workers, and knows which workers
//! are alive. It holds no job state: if it loses its data, the store's records let homing
//! publish every unfinished job again (docs/design.md section 1, guarantee 9).
//!
//! A message is reserved by one consumer (a worker process) at a time and stays owned by it until
//! acknowledged (late ack) or put back by the rescuer. Each method says what a crash in the middle
//! leaves behind; [`crate::conformance::broker`] checks every implementation against it.

#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub(crate) mod strays;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::time::Duration;

use crate::error::Result;
use crate::job::JobId;
use crate::store::ToPublish;

/// What [`Broker::wait_ready`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Nothing within the wait.
    Nothing,
    /// A message looked ready.
    Ready,
    /// A publish woke the wait, and nothing was looked at since: maybe a message of another
    /// queue.
    Woken,
}

/// One reserved message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The broker's handle for the message (a row id, a stream entry id).
    pub tag: String,
    pub queue: String,
    /// The job the message names, or why it could not be decoded (garbage in the broker).
    pub job: std::result::Result<JobId, String>,
}

/// A message that could not be delivered, kept for an operator to look at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub queue: String,
    pub payload: String,
    pub reason: String,
    #[serde(with = "crate::time::as_rfc3339")]
    pub at: crate::time::Micros,
}

/// What the broker holds for one queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueDepth {
    pub queue: String,
    /// Messages waiting for a worker.
    pub ready: u64,
    /// Messages reserved by a worker and not yet acknowledged.
    pub reserved: u64,
    pub dead_letters: u64,
}

#[async_trait]
pub trait Broker: Send + Sync + 'static {
    /// A short name for logs and errors (`sqlite`, `redis`).
    fn kind(&self) -> &'static str;

    /// The embedded SQLite file this broker keeps its messages in, if any (see
    /// [`crate::store::Store::embedded_db`]).
    #[cfg(feature = "sqlite")]
    fn embedded_db(&self) -> Option<&std::sync::Arc<crate::sqlite::Db>> {
        None
    }

    /// Appends one message per job to its queue.
    ///
    /// Crash contract: a crash may publish a prefix of the batch; the store still lists the
    /// rest as undispatched, so the reconciler publishes them.
    async fn publish(&self, jobs: &[ToPublish]) -> Result<()>;

    /// Reserves up to `max` ready messages from `queues` for `consumer`, oldest first, waiting up
    /// to `wait` for at least one. Reserved messages stay owned by `consumer` until acknowledged
    /// or requeued.
    ///
    /// Crash contract: a message is either still ready or reserved by exactly one consumer.
    async fn reserve(
        &self,
        consumer: &str,
        queues: &[String],
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>>;

    /// Waits up to `wait` until a message of `queues` looks ready to reserve, or a publish wakes
    /// the wait, without reserving anything (a hint: another consumer may take the message
    /// first). The worker on the embedded file uses it to reserve and start in one write, and
    /// after a wake looks for itself in the same trip to the file as that write. A broker that
    /// blocks in [`Broker::reserve`] instead has nothing to wait for here and says
    /// [`Readiness::Ready`] at once.
    async fn wait_ready(&self, _queues: &[String], _wait: Duration) -> Result<Readiness> {
        Ok(Readiness::Ready)
    }

    /// Removes messages for good (late ack: only after the store committed the job's new state).
    ///
    /// Crash contract: idempotent; acknowledging twice is harmless.
    async fn ack(&self, deliveries: &[Delivery]) -> Result<()>;

    /// Acknowledges `acks` (as [`Broker::ack`]) and only then reserves up to `max` ready messages
    /// of `queues` for `consumer` without waiting (as [`Broker::reserve`] with no wait): a
    /// worker's round hands its acknowledged messages' reservations to their successors in one
    /// call, one round trip where the broker can do both at once. Because the reservation
    /// follows the acknowledgement, a consumer that asks for no more than it acknowledges never
    /// holds more messages than it did before the call.
    ///
    /// Crash contract: as an ack followed by a reservation. On an error the caller cannot tell
    /// whether the ack happened (acknowledging again is harmless); a reservation whose answer was
    /// lost leaves its messages owned by `consumer`, as a lost answer to `reserve` does.
    async fn ack_and_reserve(
        &self,
        acks: &[Delivery],
        consumer: &str,
        queues: &[String],
        max: usize,
    ) -> Result<Vec<Delivery>> {
        ack_then_reserve(self, acks, consumer, queues, max).await
    }

    /// Puts messages reserved by `consumer` back to ready, and returns how many were still owned
    /// by `consumer` (only those are put back, so concurrent rescuers requeue each message once).
    ///
    /// Crash contract: each message moves on its own; a crash may put back a prefix of the
    /// batch, and the rest stays reserved by `consumer`, where the rescuer finds it again. A
    /// requeued message gets a new tag, so an ack with the old one cannot remove it.
    async fn requeue(&self, consumer: &str, deliveries: &[Delivery]) -> Result<usize>;

    /// Moves one message out of its queue into the dead-letter list with a reason.
    ///
    /// Crash contract: atomic; a crash leaves the message either reserved (the rescuer finds it
    /// and it is dead-lettered again) or dead-lettered, never both or neither.
    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<()>;

    /// Messages reserved by `consumer`, at most `limit`.
    async fn pending(&self, consumer: &str, limit: usize) -> Result<Vec<Delivery>>;

    /// Messages reserved by `consumer` in `queues`, at most `limit`: what a live worker looks at
    /// to find messages it holds without knowing it (`worker::strays`). A broker that reads
    /// every queue at once for [`Broker::pending`] keeps this default.
    async fn pending_in(
        &self,
        consumer: &str,
        queues: &[String],
        limit: usize,
    ) -> Result<Vec<Delivery>> {
        let mut all = self.pending(consumer, limit).await?;
        all.retain(|d| queues.contains(&d.queue));
        Ok(all)
    }

    /// Starts (or refreshes) a worker's liveness with time-to-live `ttl`.
    ///
    /// Crash contract: one write; a worker that crashes after it simply lets the TTL expire.
    async fn register(&self, worker: &str, ttl: Duration) -> Result<()>;

    /// Refreshes a live worker's heartbeat. Returns `false` when the heartbeat had already
    /// expired or been removed: the worker was presumed dead and must rejoin under a new name.
    /// A backend whose readers may see the old expiry after the refresh is told (the embedded
    /// file: `sqlite::refresh_margin`) refuses a refresh that close to expiry, so that no
    /// reader presumes dead a worker told it lives.
    ///
    /// Crash contract: one atomic refresh-if-present, so an expired heartbeat is never revived.
    async fn heartbeat(&self, worker: &str, ttl: Duration) -> Result<bool>;

    /// Removes a worker's heartbeat (graceful shutdown).
    ///
    /// Crash contract: idempotent; a crash before it leaves the heartbeat to expire.
    async fn unregister(&self, worker: &str) -> Result<()>;

    async fn is_alive(&self, worker: &str) -> Result<bool>;

    /// How long until the worker's heartbeat expires unless refreshed; `None` when it has no
    /// live heartbeat. This is what liveness is decided by, so it is what views show.
    async fn heartbeat_expires_in(&self, worker: &str) -> Result<Option<Duration>>;

    /// Consumers that own reserved messages (or are known to the broker) but whose heartbeat
    /// has expired: the rescuer's work list.
    async fn lost_consumers(&self) -> Result<Vec<String>>;

    /// Forgets a consumer, only if it owns no message. Returns whether it was removed.
    ///
    /// Crash contract: a consumer that still owns a message is never removed; a crash midway
    /// leaves the consumer known, and the next call removes it.
    async fn remove_consumer(&self, consumer: &str) -> Result<bool>;

    /// Checks the marker that proves the broker kept its data. Returns `true` when it was there;
    /// `false` when it was missing (first start, or the broker lost its data) — it is set again.
    ///
    /// Crash contract: one atomic check-and-set, so of concurrent callers after a loss at least
    /// one sees `false`. The marker is set again by the call itself: a caller that crashes
    /// after a `false` answer and before its store's `redispatch_all` loses that signal, and
    /// queued jobs whose messages were lost wait for an operator's re-dispatch.
    async fn check_marker(&self) -> Result<bool>;

    /// Per queue, the ready, reserved and dead-lettered messages (queues without any left out),
    /// by queue name.
    async fn depths(&self) -> Result<Vec<QueueDepth>>;

    /// [`Broker::depths`] counted afresh from the messages, for checks after chaos and in the
    /// conformance suite: a broker that keeps its depths on the side (the embedded one, by
    /// triggers) counts its messages here; one that reads them from its messages anyway answers
    /// as [`Broker::depths`] does.
    async fn depths_recounted(&self) -> Result<Vec<QueueDepth>> {
        self.depths().await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>>;

    /// Retention: deletes the dead letters recorded before `before` and returns how many. They
    /// are a record for operators (the store keeps the jobs); nothing live is touched.
    ///
    /// Crash contract: a crash may leave some of them; calling again is harmless.
    async fn purge_dead_letters(&self, before: crate::time::Micros) -> Result<u64>;
}

/// [`Broker::ack_and_reserve`] as two calls, an acknowledgement and then a reservation that does
/// not wait: for a broker (or a case) that cannot do both in one.
pub(crate) async fn ack_then_reserve<B: Broker + ?Sized>(
    broker: &B,
    acks: &[Delivery],
    consumer: &str,
    queues: &[String],
    max: usize,
) -> Result<Vec<Delivery>> {
    broker.ack(acks).await?;
    if max == 0 {
        return Ok(Vec::new());
    }
    broker.reserve(consumer, queues, max, Duration::ZERO).await
}
