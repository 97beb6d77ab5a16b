//! The broker on the embedded SQLite file: a `messages` table in which a message is either ready
//! (`consumer IS NULL`) or reserved by one consumer, and a `heartbeats` table of expiry times.
//! SQLite cannot block on a read, so reservation polls briefly, and is woken at once by a publish
//! made in the same process, or rung by one made in another (`crate::sqlite::doorbell`).
//!
//! Messages carry their job's priority: a reservation takes the highest first, then the oldest.
//!
//! A delivery's tag is `<row id>.<generation>`. Requeueing a message keeps its row, so it keeps
//! its place at the head of the queue (a reclaimed job runs again before the backlog, which is
//! what makes recovery fast), but bumps the generation: a zombie that acknowledges its old tag
//! can never remove the message from its new owner.

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::sqlite::Db;
use crate::time::{micros, now};

/// How often an idle reservation looks for new messages when this process has no doorbell (it
/// could not bind one): then polling is how it finds another process's publishes.
const POLL: Duration = Duration::from_millis(5);

/// How often an idle reservation looks when the doorbell listens: every publish and requeue
/// rings it, so this only bounds what a lost ring costs (a publisher killed between its commit
/// and its ring, a process that was frozen). Polling at `POLL` kept an idle worker's CPU busy
/// 200 times a second for nothing.
const POLL_WITH_DOORBELL: Duration = Duration::from_millis(100);

/// How much life a heartbeat must have left to be refreshed. A reader whose snapshot predates
/// a refresh's commit sees the old expiry (the reconciler's and the remote sessions' liveness
/// checks; the rescuer claims in a write, after which a refresh fails): a refresh made at the
/// edge of expiry could succeed while such a reader, its clock past the old expiry, took the
/// worker for dead. Refusing refreshes that close to expiry makes the worker learn it as well
/// (it rejoins under a new name). A worker beats with two thirds of its TTL left, so only a
/// beat asked for late by well over an interval is refused. Redis needs none: its refresh and
/// its readers are serialised on the server.
pub fn refresh_margin(ttl: Duration) -> Duration {
    (ttl / 8).min(Duration::from_millis(250))
}

#[derive(Debug, Clone)]
pub struct SqliteBroker {
    db: Arc<Db>,
    /// Set by [`SqliteBroker::with_poll`]; otherwise chosen by whether the doorbell listens.
    poll: Option<Duration>,
}

impl SqliteBroker {
    pub fn new(db: Arc<Db>) -> Self {
        Self { db, poll: None }
    }

    /// Sets how often an idle reservation polls the file (the fallback for a missed ring),
    /// whether or not the doorbell listens.
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = Some(poll.max(Duration::from_millis(1)));
        self
    }

    /// Whether any of `queues` has a ready message: a read, which takes no lock.
    async fn any_ready(&self, queues: &[String]) -> Result<bool> {
        let qs = queues.to_vec();
        self.db.read(move |c| any_ready_in(c, &qs)).await
    }

    async fn try_reserve(
        &self,
        consumer: &str,
        queues: &[String],
        max: usize,
    ) -> Result<Vec<Delivery>> {
        let (consumer, queues) = (consumer.to_string(), queues.to_vec());
        let got = write_if_ready(&self.db, queues.clone(), move |tx| {
            reserve_in(tx, &consumer, &queues, max)
        })
        .await?;
        Ok(got.unwrap_or_default())
    }

    /// Tries `attempt` until it finds something or `wait` has passed, sleeping in between until
    /// a publish of this process or a doorbell ring wakes it, or the poll comes round. With
    /// `woken`, a wake answers it at once instead of another attempt (the caller looks itself).
    async fn until<T, F, Fut>(
        &self,
        wait: Duration,
        mut woken: Option<T>,
        mut attempt: F,
    ) -> Result<Option<T>>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>>>,
    {
        let deadline = tokio::time::Instant::now() + wait;
        // Rings from other processes wake `published` too, once this process listens.
        let listening = self.db.doorbell.listen();
        let poll = self
            .poll
            .unwrap_or(if listening { POLL_WITH_DOORBELL } else { POLL });
        loop {
            // Registered before the attempt looks, so a publish in between still wakes it.
            let notified = self.db.published.notified();
            if let Some(found) = attempt().await? {
                return Ok(Some(found));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            let nap = poll.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            tokio::select! {
                _ = notified => {
                    if woken.is_some() {
                        return Ok(woken.take());
                    }
                }
                _ = tokio::time::sleep(nap) => {}
            }
        }
    }
}

/// Runs `f` in a write transaction only if a message of `queues` looks ready (`Ok(None)` when
/// none did): the look is a read, so an idle worker does not take the write lock every time it
/// looks, and it is made in the same trip to the blocking pool as the write.
pub(crate) async fn write_if_ready<T, F>(
    db: &Arc<Db>,
    queues: Vec<String>,
    f: F,
) -> Result<Option<T>>
where
    T: Send + 'static,
    F: FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
{
    db.write_if(move |c| any_ready_in(c, &queues), f).await
}

/// Whether any message of `queues` is ready to reserve.
fn any_ready_in(c: &rusqlite::Connection, queues: &[String]) -> rusqlite::Result<bool> {
    let mut st =
        c.prepare_cached("SELECT 1 FROM messages WHERE queue = ?1 AND consumer IS NULL LIMIT 1")?;
    for q in queues {
        if st.exists([q])? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Reserves up to `max` ready messages of `queues` for `consumer` in the caller's write
/// transaction: the highest priority first, then the oldest. The worker's combined round on the
/// embedded file (`store::sqlite::complete_and_take`) calls it in the transaction that
/// acknowledges the messages whose reservations it reuses.
pub(crate) fn reserve_in(
    tx: &rusqlite::Transaction<'_>,
    consumer: &str,
    queues: &[String],
    max: usize,
) -> rusqlite::Result<Vec<Delivery>> {
    let t = now();
    let mut st = tx.prepare_cached(
        "UPDATE messages SET consumer = ?1, reserved_at = ?2 WHERE id IN \
         (SELECT id FROM messages WHERE queue = ?3 AND consumer IS NULL \
          ORDER BY priority DESC, id LIMIT ?4) \
         RETURNING id, generation, queue, payload, priority",
    )?;
    let mut out = Vec::new();
    for q in queues {
        if out.len() >= max {
            break;
        }
        let rows = st.query_map(params![consumer, t, q, (max - out.len()) as i64], |r| {
            Ok((
                r.get::<_, i64>(4)?,
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
            ))
        })?;
        for r in rows {
            out.push(r?);
        }
    }
    // RETURNING does not keep the subquery's order: put it back.
    out.sort_by_key(|(priority, id, ..)| (std::cmp::Reverse(*priority), *id));
    Ok(out
        .into_iter()
        .map(|(_, id, gen, queue, payload)| delivery(id, gen, queue, &payload))
        .collect())
}

fn delivery(id: i64, generation: i64, queue: String, payload: &str) -> Delivery {
    let job = payload
        .trim()
        .parse::<JobId>()
        .map_err(|e| format!("undecodable message {payload:?}: {e}"));
    Delivery {
        tag: format!("{id}.{generation}"),
        queue,
        job,
    }
}

fn parse_tag(tag: &str) -> Option<(i64, i64)> {
    let (id, gen) = tag.split_once('.')?;
    Some((id.parse().ok()?, gen.parse().ok()?))
}

/// Appends one message per job, in the caller's transaction. Commit it with
/// [`Db::write_waking`], saying that it published, so that waiting reservations are woken.
pub(crate) fn publish_in(tx: &rusqlite::Connection, jobs: &[ToPublish]) -> rusqlite::Result<()> {
    let mut st =
        tx.prepare_cached("INSERT INTO messages (queue, payload, priority) VALUES (?1, ?2, ?3)")?;
    for j in jobs {
        st.execute(params![j.queue, j.id.to_string(), j.priority])?;
    }
    Ok(())
}

/// Whether `worker`'s heartbeat is alive at `t`: not expired, less the time nobody could write
/// (see `lost_consumers`). In the caller's connection, so a write can decide by it under its lock.
pub(crate) fn alive_in(
    c: &rusqlite::Connection,
    worker: &str,
    t: crate::time::Micros,
) -> rusqlite::Result<bool> {
    let cutoff = t - crate::sqlite::recent_stall(c, t)?;
    c.prepare_cached("SELECT 1 FROM heartbeats WHERE worker = ?1 AND expires_at > ?2")?
        .exists(params![worker, cutoff])
}

pub(crate) fn tags(deliveries: &[Delivery]) -> Vec<(i64, i64)> {
    deliveries
        .iter()
        .filter_map(|d| parse_tag(&d.tag))
        .collect()
}

/// Folds `(queue, kind, n)` rows in queue order (`kind` one of `ready`, `reserved`, `dead`) into
/// one depth per queue. A kept count below zero (a drift, which chaos looks for with
/// [`counts_below_zero`]) shows as 0 rather than as an absurd depth.
fn depths_from(c: &rusqlite::Connection, sql: &str) -> rusqlite::Result<Vec<QueueDepth>> {
    let mut st = c.prepare_cached(sql)?;
    let mut rows = st.query([])?;
    let mut out: Vec<QueueDepth> = Vec::new();
    while let Some(r) = rows.next()? {
        let queue: String = r.get(0)?;
        if out.last().is_none_or(|d| d.queue != queue) {
            out.push(QueueDepth {
                queue,
                ..Default::default()
            });
        }
        let d = out.last_mut().expect("pushed above");
        let n = r.get::<_, i64>(2)?.max(0) as u64;
        match r.get_ref(1)?.as_str().unwrap_or_default() {
            "ready" => d.ready = n,
            "reserved" => d.reserved = n,
            _ => d.dead_letters = n,
        }
    }
    Ok(out)
}

/// The kept broker counts (migration 23) that fell below zero, as `(queue, kind, n)`: none
/// unless some write escaped the triggers. [`Broker::depths`] shows them as 0, so a check that
/// compares it with [`Broker::depths_recounted`] misses one on a queue that still has messages
/// of another kind; `homing chaos` reads these as well.
pub async fn counts_below_zero(db: &Arc<Db>) -> Result<Vec<(String, String, i64)>> {
    db.read(|c| {
        c.prepare("SELECT queue, kind, n FROM broker_counts WHERE n < 0")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect()
    })
    .await
}

#[async_trait]
impl Broker for SqliteBroker {
    fn embedded_db(&self) -> Option<&Arc<Db>> {
        Some(&self.db)
    }

    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn publish(&self, jobs: &[ToPublish]) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let jobs = jobs.to_vec();
        self.db
            .write_waking(move |tx| publish_in(tx, &jobs), |_| true)
            .await
    }

    async fn reserve(
        &self,
        consumer: &str,
        queues: &[String],
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>> {
        if max == 0 || queues.is_empty() {
            tokio::time::sleep(wait).await;
            return Ok(Vec::new());
        }
        let got = self
            .until(wait, None, || async {
                let got = self.try_reserve(consumer, queues, max).await?;
                Ok((!got.is_empty()).then_some(got))
            })
            .await?;
        Ok(got.unwrap_or_default())
    }

    async fn wait_ready(&self, queues: &[String], wait: Duration) -> Result<Readiness> {
        if queues.is_empty() {
            tokio::time::sleep(wait).await;
            return Ok(Readiness::Nothing);
        }
        // A wake answers at once: the worker's take looks again in its own trip to the file
        // (`store::sqlite::take_if_ready`), so a look here would be one hand-off too many.
        let seen = self
            .until(wait, Some(Readiness::Woken), || async {
                Ok(self.any_ready(queues).await?.then_some(Readiness::Ready))
            })
            .await?;
        Ok(seen.unwrap_or(Readiness::Nothing))
    }

    async fn ack(&self, deliveries: &[Delivery]) -> Result<()> {
        let ids = tags(deliveries);
        if ids.is_empty() {
            return Ok(());
        }
        self.db
            .write(move |tx| {
                let mut st =
                    tx.prepare_cached("DELETE FROM messages WHERE id = ?1 AND generation = ?2")?;
                for (id, gen) in &ids {
                    st.execute([id, gen])?;
                }
                Ok(())
            })
            .await
    }

    async fn requeue(&self, consumer: &str, deliveries: &[Delivery]) -> Result<usize> {
        let ids = tags(deliveries);
        let consumer = consumer.to_string();
        self.db
            .write_waking(
                move |tx| {
                    let mut st = tx.prepare_cached(
                        "UPDATE messages SET consumer = NULL, reserved_at = NULL, generation = generation + 1 \
                         WHERE id = ?1 AND generation = ?2 AND consumer = ?3",
                    )?;
                    let mut n = 0;
                    for (id, gen) in &ids {
                        n += st.execute(params![id, gen, consumer])?;
                    }
                    Ok(n)
                },
                |n| *n > 0,
            )
            .await
    }

    async fn dead_letter(&self, d: &Delivery, reason: &str) -> Result<()> {
        let ((tag, gen), queue, reason) = (
            parse_tag(&d.tag).unwrap_or((-1, -1)),
            d.queue.clone(),
            reason.to_string(),
        );
        self.db
            .write(move |tx| {
                let payload: Option<String> = tx
                    .query_row(
                        "DELETE FROM messages WHERE id = ?1 AND generation = ?2 RETURNING payload",
                        [tag, gen],
                        |r| r.get(0),
                    )
                    .ok();
                if let Some(payload) = payload {
                    tx.execute(
                        "INSERT INTO dead_letters (queue, payload, reason, at) VALUES (?1, ?2, ?3, ?4)",
                        params![queue, payload, reason, now()],
                    )?;
                }
                Ok(())
            })
            .await
    }

    async fn pending(&self, consumer: &str, limit: usize) -> Result<Vec<Delivery>> {
        let consumer = consumer.to_string();
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id, generation, queue, payload FROM messages WHERE consumer = ?1 ORDER BY id LIMIT ?2",
                )?;
                let rows = st.query_map(params![consumer, limit as i64], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?))
                })?;
                rows.map(|r| r.map(|(id, g, q, p)| delivery(id, g, q, &p))).collect()
            })
            .await
    }

    async fn register(&self, worker: &str, ttl: Duration) -> Result<()> {
        let worker = worker.to_string();
        self.db
            .write(move |tx| {
                tx.execute(
                    "INSERT OR REPLACE INTO heartbeats (worker, expires_at) VALUES (?1, ?2)",
                    params![worker, now() + micros(ttl)],
                )
                .map(|_| ())
            })
            .await
    }

    async fn heartbeat(&self, worker: &str, ttl: Duration) -> Result<bool> {
        let worker = worker.to_string();
        // Whether the heartbeat was alive is judged when the worker asked, not when the write
        // lock was had: a refresh asked for in time that waited out another holder of the lock
        // still lands, unless a rescuer claimed the worker first (`lost_consumers`).
        let asked = now();
        self.db
            .write(move |tx| {
                tx.execute(
                    "UPDATE heartbeats SET expires_at = ?2 WHERE worker = ?1 AND expires_at > ?3",
                    params![
                        worker,
                        now() + micros(ttl),
                        asked + micros(refresh_margin(ttl))
                    ],
                )
                .map(|n| n == 1)
            })
            .await
    }

    async fn unregister(&self, worker: &str) -> Result<()> {
        let worker = worker.to_string();
        self.db
            .write(move |tx| {
                tx.execute("DELETE FROM heartbeats WHERE worker = ?1", [worker])
                    .map(|_| ())
            })
            .await
    }

    async fn is_alive(&self, worker: &str) -> Result<bool> {
        let worker = worker.to_string();
        self.db.read(move |c| alive_in(c, &worker, now())).await
    }

    async fn heartbeat_expires_in(&self, worker: &str) -> Result<Option<Duration>> {
        let worker = worker.to_string();
        self.db
            .read(move |c| {
                let expires: Option<i64> = c
                    .prepare_cached("SELECT expires_at FROM heartbeats WHERE worker = ?1")?
                    .query_row([worker], |r| r.get(0))
                    .optional()?;
                // Read after the row: a heartbeat stamped after a clock read taken first would
                // show more time left than its TTL (seen in the dashboard test: 0.600026 s of a
                // 0.6 s TTL).
                let t = now();
                Ok(expires
                    .and_then(|e| u64::try_from(e.saturating_sub(t)).ok())
                    .filter(|left| *left > 0)
                    .map(Duration::from_micros))
            })
            .await
    }

    /// Looked for on a read connection, and only when some are found, claimed in a write: each
    /// expired heartbeat is marked claimed (`expires_at = -1`), so that a refresh of it waiting
    /// behind this write fails and its worker learns it was presumed dead, and the list is read
    /// again in the same transaction. A heartbeat expires by the clock less the longest recent
    /// wait for the file's write lock ([`crate::sqlite::recent_stall`]): while nobody could
    /// write, no worker could refresh either (an `sqlite3` shell holding a transaction open, a
    /// backup tool, a long bulk step), and counting that time had every running job reclaimed
    /// and run again once the lock was free.
    async fn lost_consumers(&self) -> Result<Vec<String>> {
        fn lost(c: &rusqlite::Connection) -> rusqlite::Result<Vec<String>> {
            let t = now();
            let cutoff = t - crate::sqlite::recent_stall(c, t)?;
            let mut st = c.prepare_cached(
                "SELECT DISTINCT consumer FROM messages WHERE consumer IS NOT NULL AND consumer NOT IN \
                 (SELECT worker FROM heartbeats WHERE expires_at > ?1) \
                 UNION SELECT worker FROM heartbeats WHERE expires_at <= ?1",
            )?;
            let rows = st.query_map([cutoff], |r| r.get::<_, String>(0))?;
            rows.collect()
        }
        if self.db.read(lost).await?.is_empty() {
            return Ok(Vec::new());
        }
        self.db
            .write(move |tx| {
                // This write waited for the file's lock itself: the others that waited longer
                // (the workers' refreshes among them) have not written their waits down yet.
                // Next sweep, once they have.
                let waited = crate::sqlite::lock_waited();
                if waited >= crate::sqlite::STALL_NOTED {
                    tracing::debug!(?waited, "the rescuer's claim waited for the write lock; claiming next sweep");
                    return Ok(Vec::new());
                }
                let t = now();
                let cutoff = t - crate::sqlite::recent_stall(tx, t)?;
                tx.execute(
                    "UPDATE heartbeats SET expires_at = -1 WHERE expires_at <= ?1 AND expires_at >= 0",
                    [cutoff],
                )?;
                lost(tx)
            })
            .await
    }

    async fn remove_consumer(&self, consumer: &str) -> Result<bool> {
        let consumer = consumer.to_string();
        self.db
            .write(move |tx| {
                let owns = tx
                    .prepare_cached("SELECT 1 FROM messages WHERE consumer = ?1 LIMIT 1")?
                    .exists([&consumer])?;
                if owns {
                    return Ok(false);
                }
                // Only an expired heartbeat is removed: a live worker is never forgotten.
                tx.execute(
                    "DELETE FROM heartbeats WHERE worker = ?1 AND expires_at <= ?2",
                    params![consumer, now()],
                )?;
                Ok(true)
            })
            .await
    }

    async fn check_marker(&self) -> Result<bool> {
        self.db
            .write(|tx| {
                let n = tx.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('broker_marker', ?1)",
                    [now().to_string()],
                )?;
                Ok(n == 0)
            })
            .await
    }

    async fn depths(&self) -> Result<Vec<QueueDepth>> {
        // Ready and dead-lettered messages kept by triggers (migration 23): a row per queue
        // whatever the backlog, where counting the ready messages' index took 62 ms at a
        // million. Reserved ones from their index: no more than the slots.
        self.db
            .read(|c| {
                depths_from(
                    c,
                    "SELECT queue, kind, n FROM broker_counts WHERE n <> 0 \
                     UNION ALL SELECT queue, 'reserved', count(*) FROM messages \
                     INDEXED BY messages_owned WHERE consumer IS NOT NULL GROUP BY queue \
                     ORDER BY 1",
                )
            })
            .await
    }

    async fn depths_recounted(&self) -> Result<Vec<QueueDepth>> {
        self.db
            .read(|c| {
                depths_from(
                    c,
                    "SELECT queue, 'ready', count(*) FROM messages WHERE consumer IS NULL \
                     GROUP BY queue \
                     UNION ALL SELECT queue, 'reserved', count(*) FROM messages \
                     WHERE consumer IS NOT NULL GROUP BY queue \
                     UNION ALL SELECT queue, 'dead', count(*) FROM dead_letters GROUP BY queue \
                     ORDER BY 1",
                )
            })
            .await
    }

    async fn purge_dead_letters(&self, before: crate::time::Micros) -> Result<u64> {
        self.db
            .write(move |tx| {
                tx.execute("DELETE FROM dead_letters WHERE at < ?1", [before])
                    .map(|n| n as u64)
            })
            .await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>> {
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT queue, payload, reason, at FROM dead_letters ORDER BY id DESC LIMIT ?1",
                )?;
                let rows = st.query_map([limit as i64], |r| {
                    Ok(DeadLetter {
                        queue: r.get(0)?,
                        payload: r.get(1)?,
                        reason: r.get(2)?,
                        at: r.get(3)?,
                    })
                })?;
                rows.collect()
            })
            .await
    }
}
