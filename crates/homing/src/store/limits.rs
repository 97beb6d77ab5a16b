//! The stores' half of cluster-wide limits (docs/limits.md): reading a queue's limits, counting
//! what they limit inside the caller's transaction, and unparking held jobs when a slot frees.
//! What is admitted is decided by [`crate::limit`] and [`crate::transition::start_gated`]; the
//! functions here only count and write.
//!
//! A queue-wide limit stores its jobs' `limit_key` as NULL and its rate starts under the key
//! `""` (a key is a JSON text, never empty).

use crate::limit::{QueueLimits, Rate, Usage};
use crate::time::Micros;

/// Limits from their stored columns; a value no build would write (out of range) is read as no
/// limit rather than failing every start of the queue.
pub(crate) fn from_columns(
    concurrency: Option<i64>,
    rate_count: Option<i64>,
    rate_period_us: Option<i64>,
    key_arg: Option<String>,
) -> QueueLimits {
    let count = |v: Option<i64>| v.and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0);
    let rate = match (count(rate_count), rate_period_us) {
        (Some(count), Some(us)) if us > 0 => Some(Rate {
            count,
            period: std::time::Duration::from_micros(us as u64),
        }),
        _ => None,
    };
    let mut l = QueueLimits {
        concurrency: count(concurrency),
        rate,
        key_arg,
    };
    if !l.is_limited() {
        l.key_arg = None;
    }
    l
}

/// The stored columns of limits: concurrency, rate count, rate period (µs), key argument.
pub(crate) fn to_columns(
    l: &QueueLimits,
) -> (Option<i64>, Option<i64>, Option<i64>, Option<String>) {
    (
        l.concurrency.map(i64::from),
        l.rate.map(|r| i64::from(r.count)),
        l.rate.map(|r| r.period_micros()),
        l.key_arg.clone(),
    )
}

/// The rate-start key column's value for a job's limit key.
pub(crate) fn start_key(key: Option<&str>) -> &str {
    key.unwrap_or("")
}

#[cfg(feature = "sqlite")]
pub(crate) mod sqlite {
    use rusqlite::{params, OptionalExtension, Transaction};

    use super::*;
    use crate::store::ToPublish;

    /// What a start reads of a job's queue: paused, and its limits if it has any.
    pub(crate) fn queue_of(
        tx: &rusqlite::Connection,
        queue: &str,
    ) -> rusqlite::Result<(bool, QueueLimits)> {
        Ok(tx
            .prepare_cached(
                "SELECT paused, concurrency, rate_count, rate_period_us, key_arg FROM queues \
                 WHERE name = ?1",
            )?
            .query_row([queue], |r| {
                Ok((
                    r.get::<_, i64>(0)? != 0,
                    from_columns(r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?),
                ))
            })
            .optional()?
            .unwrap_or_default())
    }

    /// Counts what `limits` limit for `key` in `queue` now, in the caller's transaction (which
    /// holds the file's write lock, so nothing starts between this count and the grant).
    pub(crate) fn usage(
        tx: &rusqlite::Connection,
        queue: &str,
        limits: &QueueLimits,
        key: Option<&str>,
        now: Micros,
    ) -> rusqlite::Result<Usage> {
        let running: i64 = match (limits.concurrency, key) {
            (None, _) => 0,
            (Some(_), None) => tx
                .prepare_cached(
                    // The index of running jobs by queue: left to itself, SQLite walks the
                    // queue's every job (migration 0021 took running jobs out of the state
                    // indexes).
                    "SELECT COUNT(*) FROM jobs INDEXED BY jobs_limit_running \
                     WHERE queue = ?1 AND state = 'running'",
                )?
                .query_row([queue], |r| r.get(0))?,
            (Some(_), Some(k)) => tx
                .prepare_cached(
                    "SELECT COUNT(*) FROM jobs WHERE queue = ?1 AND limit_key = ?2 \
                     AND state = 'running'",
                )?
                .query_row([queue, k], |r| r.get(0))?,
        };
        let recent = match &limits.rate {
            None => 0,
            Some(rate) => crate::limit::counted(
                rate,
                tx.prepare_cached(
                    "SELECT window_start, count FROM limit_windows WHERE queue = ?1 AND key = ?2",
                )?
                .query_row(params![queue, start_key(key)], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?,
                now,
            ),
        };
        Ok(Usage {
            running: running.max(0) as u64,
            recent_starts: recent,
        })
    }

    /// Records a granted start: the job's key (what the running count reads) and, for a rate,
    /// one more start in its window's counter.
    pub(crate) fn granted(
        tx: &rusqlite::Connection,
        id: &str,
        queue: &str,
        limits: &QueueLimits,
        key: Option<&str>,
        now: Micros,
    ) -> rusqlite::Result<()> {
        tx.prepare_cached("UPDATE jobs SET limit_key = ?2, parked = 0 WHERE id = ?1")?
            .execute(params![id, key])?;
        if let Some(rate) = &limits.rate {
            tx.prepare_cached(
                "INSERT INTO limit_windows (queue, key, window_start, count) \
                 VALUES (?1, ?2, ?3, 1) ON CONFLICT (queue, key) DO UPDATE SET \
                 count = CASE WHEN window_start >= excluded.window_start \
                   THEN count + 1 ELSE 1 END, \
                 window_start = MAX(window_start, excluded.window_start)",
            )?
            .execute(params![
                queue,
                start_key(key),
                crate::limit::window_of(rate, now)
            ])?;
        }
        Ok(())
    }

    /// Marks a job the start just parked, so the reconciler leaves it alone until it is unparked.
    pub(crate) fn parked(
        tx: &rusqlite::Connection,
        id: &str,
        key: Option<&str>,
    ) -> rusqlite::Result<()> {
        tx.prepare_cached("UPDATE jobs SET parked = 1, limit_key = ?2 WHERE id = ?1")?
            .execute(params![id, key])?;
        Ok(())
    }

    /// In the transaction that took job `released` out of `running`: if its queue has a
    /// concurrency limit (and is not paused), unparks the first parked job of the same queue
    /// and key, to publish with the commit's other follow-ups. Costs one indexed lookup for a
    /// job of an unlimited queue.
    pub(crate) fn unpark_after_release(
        tx: &Transaction<'_>,
        released: &str,
        now: Micros,
    ) -> rusqlite::Result<Option<ToPublish>> {
        // Every completion comes here, and nearly always nothing is parked: a probe of the
        // (then empty) parked index costs a microsecond, the UPDATE below with its join about
        // twenty. Only a parked job can be unparked, so skipping it changes nothing.
        let any_parked = tx
            .prepare_cached("SELECT 1 FROM jobs INDEXED BY jobs_parked WHERE state = 'queued' AND parked = 1 LIMIT 1")?
            .exists([])?;
        if !any_parked {
            return Ok(None);
        }
        tx.prepare_cached(
            "UPDATE jobs SET parked = 0, dispatched = 0, updated_at = ?2 WHERE id = (\
               SELECT p.id FROM jobs r JOIN queues q ON q.name = r.queue \
               JOIN jobs p ON p.queue = r.queue AND p.state = 'queued' AND p.parked = 1 \
               WHERE r.id = ?1 AND q.concurrency IS NOT NULL AND q.paused = 0 \
               AND (q.key_arg IS NULL OR p.limit_key IS r.limit_key) \
               ORDER BY p.priority DESC, p.id LIMIT 1) \
             RETURNING id, queue, priority",
        )?
        .query_row(params![released, now], crate::store::sqlite::publish_row)
        .optional()
    }

    /// [`crate::store::Store::set_limits`] in the caller's transaction (the name is admitted).
    pub(crate) fn set(
        tx: &Transaction<'_>,
        queue: &str,
        limits: &QueueLimits,
        now: Micros,
    ) -> rusqlite::Result<Vec<ToPublish>> {
        let (c, rc, rp, k) = to_columns(limits);
        tx.execute(
            "UPDATE queues SET concurrency = ?2, rate_count = ?3, rate_period_us = ?4, \
             key_arg = ?5 WHERE name = ?1",
            params![queue, c, rc, rp, k],
        )?;
        let paused = queue_of(tx, queue)?.0;
        if paused {
            // A resume republishes every queued job of the queue.
            return Ok(Vec::new());
        }
        let mut st = tx.prepare_cached(
            "UPDATE jobs SET parked = 0, dispatched = 0, updated_at = ?2 \
             WHERE queue = ?1 AND state = 'queued' AND parked = 1 RETURNING id, queue, priority",
        )?;
        let rows = st.query_map(params![queue, now], crate::store::sqlite::publish_row)?;
        let mut out: Vec<ToPublish> = rows.collect::<rusqlite::Result<_>>()?;
        out.truncate(crate::store::RESUME_PUBLISH_LIMIT);
        Ok(out)
    }

    /// [`crate::store::Store::unpark_ready`] in the caller's transaction.
    pub(crate) fn unpark_ready(
        tx: &Transaction<'_>,
        now: Micros,
        limit: usize,
    ) -> rusqlite::Result<Vec<ToPublish>> {
        // A counter whose window has ended counts nothing (`crate::limit::counted`): forgetting
        // it changes no decision, and keeps the table at one row per active key.
        tx.prepare_cached(
            "DELETE FROM limit_windows WHERE window_start <= ?1 - COALESCE((\
               SELECT q.rate_period_us FROM queues q WHERE q.name = limit_windows.queue \
               AND q.rate_count IS NOT NULL), 0)",
        )?
        .execute([now])?;
        let mut out = Vec::new();
        // Parked jobs of queues neither paused nor limited any more (nothing holds them).
        out.extend(
            tx.prepare_cached(
                "UPDATE jobs SET parked = 0, dispatched = 0, updated_at = ?1 WHERE id IN (\
                   SELECT j.id FROM jobs j JOIN queues q ON q.name = j.queue \
                   WHERE j.state = 'queued' AND j.parked = 1 AND q.paused = 0 \
                   AND q.concurrency IS NULL AND q.rate_count IS NULL LIMIT ?2) \
                 RETURNING id, queue, priority",
            )?
            .query_map(
                params![now, limit as i64],
                crate::store::sqlite::publish_row,
            )?
            .collect::<rusqlite::Result<Vec<_>>>()?,
        );
        let queues: Vec<(String, QueueLimits)> = tx
            .prepare_cached(
                "SELECT name, concurrency, rate_count, rate_period_us, key_arg FROM queues \
                 WHERE paused = 0 AND (concurrency IS NOT NULL OR rate_count IS NOT NULL) \
                 ORDER BY name",
            )?
            .query_map([], |r| {
                Ok((
                    r.get(0)?,
                    from_columns(r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?),
                ))
            })?
            .collect::<rusqlite::Result<_>>()?;
        for (queue, limits) in queues {
            let keys: Vec<Option<String>> = if limits.key_arg.is_some() {
                tx.prepare_cached(
                    "SELECT DISTINCT limit_key FROM jobs WHERE queue = ?1 AND state = 'queued' \
                     AND parked = 1 LIMIT 1000",
                )?
                .query_map([&queue], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?
            } else {
                vec![None]
            };
            for key in keys {
                let budget = limit.saturating_sub(out.len());
                if budget == 0 {
                    return Ok(out);
                }
                let room =
                    crate::limit::room(&limits, usage(tx, &queue, &limits, key.as_deref(), now)?);
                let take = room.min(budget as u64) as i64;
                if take == 0 {
                    continue;
                }
                let sql = if limits.key_arg.is_some() {
                    "UPDATE jobs SET parked = 0, dispatched = 0, updated_at = ?3 WHERE id IN (\
                       SELECT id FROM jobs WHERE queue = ?1 AND limit_key IS ?2 \
                       AND state = 'queued' AND parked = 1 ORDER BY priority DESC, id LIMIT ?4) \
                     RETURNING id, queue, priority"
                } else {
                    "UPDATE jobs SET parked = 0, dispatched = 0, updated_at = ?3 WHERE id IN (\
                       SELECT id FROM jobs WHERE queue = ?1 AND ?2 IS NULL \
                       AND state = 'queued' AND parked = 1 ORDER BY priority DESC, id LIMIT ?4) \
                     RETURNING id, queue, priority"
                };
                out.extend(
                    tx.prepare_cached(sql)?
                        .query_map(
                            params![queue, key, now, take],
                            crate::store::sqlite::publish_row,
                        )?
                        .collect::<rusqlite::Result<Vec<_>>>()?,
                );
            }
        }
        Ok(out)
    }

    /// Every queue with settings: paused or limited.
    pub(crate) fn settings(
        c: &rusqlite::Connection,
    ) -> rusqlite::Result<Vec<crate::store::QueueSettings>> {
        c.prepare_cached(
            "SELECT name, paused, concurrency, rate_count, rate_period_us, key_arg FROM queues \
             WHERE paused <> 0 OR concurrency IS NOT NULL OR rate_count IS NOT NULL ORDER BY name",
        )?
        .query_map([], |r| {
            Ok(crate::store::QueueSettings {
                queue: r.get(0)?,
                paused: r.get::<_, i64>(1)? != 0,
                limits: from_columns(r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?),
            })
        })?
        .collect()
    }
}

#[cfg(feature = "postgres")]
pub(crate) mod postgres {
    use sqlx::postgres::PgRow;
    use sqlx::{PgConnection, Row};
    use std::collections::HashMap;

    use super::*;
    use crate::job::JobId;
    use crate::store::ToPublish;

    fn limits_row(r: &PgRow, from: usize) -> sqlx::Result<QueueLimits> {
        Ok(from_columns(
            r.try_get(from)?,
            r.try_get(from + 1)?,
            r.try_get(from + 2)?,
            r.try_get(from + 3)?,
        ))
    }

    fn publish_rows(rows: Vec<PgRow>) -> sqlx::Result<Vec<ToPublish>> {
        rows.iter()
            .map(|r| {
                Ok(ToPublish {
                    id: r.try_get(0)?,
                    queue: r.try_get(1)?,
                    priority: i32::try_from(r.try_get::<i64, _>(2)?).unwrap_or(0),
                })
            })
            .collect()
    }

    /// Locks the settings rows of the limited queues among the jobs `ids`, in name order, and
    /// returns their limits. Every transaction that starts or releases a limited queue's job
    /// takes this lock first (after the workflows, before the jobs), so counts and grants of one
    /// queue are serialised and no two transactions lock in opposite orders. A job of an
    /// unlimited queue costs one lookup and no lock.
    pub(crate) async fn lock_limited(
        conn: &mut PgConnection,
        ids: &[JobId],
    ) -> sqlx::Result<HashMap<String, QueueLimits>> {
        let rows = sqlx::query(
            "SELECT name, concurrency, rate_count, rate_period_us, key_arg FROM homing_queues \
             WHERE name IN (SELECT queue FROM homing_jobs WHERE id = ANY($1)) \
             AND (concurrency IS NOT NULL OR rate_count IS NOT NULL) ORDER BY name FOR UPDATE",
        )
        .bind(ids)
        .fetch_all(&mut *conn)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, limits_row(r, 1)?)))
            .collect::<sqlx::Result<HashMap<_, _>>>()
            .map(|m| m.into_iter().filter(|(_, l)| l.is_limited()).collect())
    }

    /// Counts what `limits` limit for `key` in `queue`, as committed plus what this transaction
    /// has granted so far (`granted`, not yet written).
    pub(crate) async fn usage(
        conn: &mut PgConnection,
        queue: &str,
        limits: &QueueLimits,
        key: Option<&str>,
        now: Micros,
    ) -> sqlx::Result<Usage> {
        let running: i64 = if limits.concurrency.is_none() {
            0
        } else {
            // Two texts, not `($2 IS NULL OR limit_key = $2)`: a start plans its statements
            // once, not knowing the key (`begin_keyed` in the PostgreSQL store), and that form
            // would then read every running job of the queue to count those of one key.
            match key {
                None => sqlx::query_scalar(
                    "SELECT COUNT(*) FROM homing_jobs WHERE queue = $1 AND state = 'running'",
                )
                .bind(queue),
                Some(key) => sqlx::query_scalar(
                    "SELECT COUNT(*) FROM homing_jobs WHERE queue = $1 AND state = 'running' \
                     AND limit_key = $2",
                )
                .bind(queue)
                .bind(key),
            }
            .fetch_one(&mut *conn)
            .await?
        };
        let recent = match &limits.rate {
            None => 0,
            Some(rate) => {
                let stored: Option<(i64, i64)> = sqlx::query_as(
                    "SELECT window_start, count FROM homing_limit_windows \
                     WHERE queue = $1 AND key = $2",
                )
                .bind(queue)
                .bind(start_key(key))
                .fetch_optional(&mut *conn)
                .await?;
                crate::limit::counted(rate, stored, now)
            }
        };
        Ok(Usage {
            running: running.max(0) as u64,
            recent_starts: recent,
        })
    }

    /// Records a batch's granted starts: each job's key (one statement for the batch), and for
    /// each rate-limited (queue, key) its number of starts added to its window's counter (one
    /// statement per key: `count += k` for k starts).
    pub(crate) async fn granted(
        conn: &mut PgConnection,
        grants: &[(JobId, String, Option<String>, Option<Rate>)],
        now: Micros,
    ) -> sqlx::Result<()> {
        if grants.is_empty() {
            return Ok(());
        }
        let ids: Vec<JobId> = grants.iter().map(|g| g.0).collect();
        let keys: Vec<Option<String>> = grants.iter().map(|g| g.2.clone()).collect();
        sqlx::query(
            "UPDATE homing_jobs j SET limit_key = g.key, parked = false \
             FROM UNNEST($1::uuid[], $2::text[]) AS g(id, key) WHERE j.id = g.id",
        )
        .bind(&ids)
        .bind(&keys)
        .execute(&mut *conn)
        .await?;
        /// A rate-limited (queue, key) of the batch: its window now, and the starts granted.
        struct Starts<'a> {
            queue: &'a str,
            key: &'a str,
            window: Micros,
            n: i64,
        }
        let mut starts: Vec<Starts<'_>> = Vec::new();
        for (_, queue, key, rate) in grants {
            let Some(rate) = rate else { continue };
            let key = start_key(key.as_deref());
            match starts.iter_mut().find(|s| s.queue == queue && s.key == key) {
                Some(s) => s.n += 1,
                None => starts.push(Starts {
                    queue,
                    key,
                    window: crate::limit::window_of(rate, now),
                    n: 1,
                }),
            }
        }
        for Starts {
            queue,
            key,
            window,
            n,
        } in starts
        {
            sqlx::query(
                "INSERT INTO homing_limit_windows AS w (queue, key, window_start, count) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (queue, key) DO UPDATE SET \
                 count = CASE WHEN w.window_start >= EXCLUDED.window_start \
                   THEN w.count + EXCLUDED.count ELSE EXCLUDED.count END, \
                 window_start = GREATEST(w.window_start, EXCLUDED.window_start)",
            )
            .bind(queue)
            .bind(key)
            .bind(window)
            .bind(n)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }

    /// Marks a job the start just parked.
    pub(crate) async fn parked(
        conn: &mut PgConnection,
        id: JobId,
        key: Option<&str>,
    ) -> sqlx::Result<()> {
        sqlx::query("UPDATE homing_jobs SET parked = true, limit_key = $2 WHERE id = $1")
            .bind(id)
            .bind(key)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// In the transaction that took `released` (of a queue whose row it locked) out of
    /// `running`: unparks the first parked job of the same queue and key, unless the queue is
    /// paused. `stamp` is the unparked job's `updated_at` (0 lets the reconciler publish it at
    /// once when the caller has no way to).
    pub(crate) async fn unpark_after_release(
        conn: &mut PgConnection,
        released: JobId,
        queue: &str,
        limits: &QueueLimits,
        stamp: Micros,
    ) -> sqlx::Result<Option<ToPublish>> {
        if limits.concurrency.is_none() {
            return Ok(None);
        }
        let rows = sqlx::query(
            "UPDATE homing_jobs SET parked = false, dispatched = false, updated_at = $4 \
             WHERE id = (SELECT p.id FROM homing_jobs p WHERE p.queue = $1 \
               AND p.state = 'queued' AND p.parked \
               AND (NOT $3 OR p.limit_key IS NOT DISTINCT FROM \
                    (SELECT r.limit_key FROM homing_jobs r WHERE r.id = $2)) \
               AND NOT EXISTS (SELECT 1 FROM homing_queues q WHERE q.name = $1 AND q.paused) \
               ORDER BY p.priority DESC, p.id LIMIT 1 FOR UPDATE) \
             RETURNING id, queue, priority",
        )
        .bind(queue)
        .bind(released)
        .bind(limits.key_arg.is_some())
        .bind(stamp)
        .fetch_all(&mut *conn)
        .await?;
        Ok(publish_rows(rows)?.into_iter().next())
    }

    /// [`crate::store::Store::set_limits`] in the caller's transaction (the name is admitted).
    pub(crate) async fn set(
        conn: &mut PgConnection,
        queue: &str,
        limits: &QueueLimits,
        now: Micros,
    ) -> sqlx::Result<Vec<ToPublish>> {
        let (c, rc, rp, k) = to_columns(limits);
        let paused: bool = sqlx::query_scalar(
            "UPDATE homing_queues SET concurrency = $2, rate_count = $3, rate_period_us = $4, \
             key_arg = $5 WHERE name = $1 RETURNING paused",
        )
        .bind(queue)
        .bind(c)
        .bind(rc)
        .bind(rp)
        .bind(k)
        .fetch_one(&mut *conn)
        .await?;
        if paused {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(
            "UPDATE homing_jobs SET parked = false, dispatched = false, updated_at = $2 \
             WHERE queue = $1 AND state = 'queued' AND parked RETURNING id, queue, priority",
        )
        .bind(queue)
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
        let mut out = publish_rows(rows)?;
        out.truncate(crate::store::RESUME_PUBLISH_LIMIT);
        Ok(out)
    }

    /// The limited, running queues' names (for [`unpark_queue`]); also unparks, up to `limit`,
    /// parked jobs of queues nothing holds any more, and forgets ended rate windows.
    pub(crate) async fn unpark_unheld(
        conn: &mut PgConnection,
        now: Micros,
        limit: usize,
    ) -> sqlx::Result<(Vec<ToPublish>, Vec<String>)> {
        // A counter whose window has ended counts nothing: forgetting it changes no decision.
        sqlx::query(
            "DELETE FROM homing_limit_windows w WHERE w.window_start <= $1 - COALESCE((\
               SELECT q.rate_period_us FROM homing_queues q WHERE q.name = w.queue \
               AND q.rate_count IS NOT NULL), 0)",
        )
        .bind(now)
        .execute(&mut *conn)
        .await?;
        let rows = sqlx::query(
            "UPDATE homing_jobs SET parked = false, dispatched = false, updated_at = $1 \
             WHERE id IN (SELECT j.id FROM homing_jobs j JOIN homing_queues q ON q.name = j.queue \
               WHERE j.state = 'queued' AND j.parked AND NOT q.paused \
               AND q.concurrency IS NULL AND q.rate_count IS NULL LIMIT $2 FOR UPDATE OF j) \
             RETURNING id, queue, priority",
        )
        .bind(now)
        .bind(limit as i64)
        .fetch_all(&mut *conn)
        .await?;
        let queues = sqlx::query_scalar(
            "SELECT name FROM homing_queues WHERE NOT paused \
             AND (concurrency IS NOT NULL OR rate_count IS NOT NULL) ORDER BY name",
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok((publish_rows(rows)?, queues))
    }

    /// Unparks as many of `queue`'s parked jobs as its limits have room for, up to `budget`,
    /// in the caller's transaction, under the queue's row lock.
    pub(crate) async fn unpark_queue(
        conn: &mut PgConnection,
        queue: &str,
        now: Micros,
        budget: usize,
    ) -> sqlx::Result<Vec<ToPublish>> {
        let Some(row) = sqlx::query(
            "SELECT concurrency, rate_count, rate_period_us, key_arg FROM homing_queues \
             WHERE name = $1 AND NOT paused FOR UPDATE",
        )
        .bind(queue)
        .fetch_optional(&mut *conn)
        .await?
        else {
            return Ok(Vec::new());
        };
        let limits = limits_row(&row, 0)?;
        if !limits.is_limited() {
            return Ok(Vec::new());
        }
        let keys: Vec<Option<String>> = if limits.key_arg.is_some() {
            sqlx::query_scalar(
                "SELECT DISTINCT limit_key FROM homing_jobs WHERE queue = $1 \
                 AND state = 'queued' AND parked LIMIT 1000",
            )
            .bind(queue)
            .fetch_all(&mut *conn)
            .await?
        } else {
            vec![None]
        };
        let mut out = Vec::new();
        for key in keys {
            let left = budget.saturating_sub(out.len());
            if left == 0 {
                break;
            }
            let u = usage(&mut *conn, queue, &limits, key.as_deref(), now).await?;
            let take = crate::limit::room(&limits, u).min(left as u64) as i64;
            if take == 0 {
                continue;
            }
            let rows = sqlx::query(
                "UPDATE homing_jobs SET parked = false, dispatched = false, updated_at = $3 \
                 WHERE id IN (SELECT id FROM homing_jobs WHERE queue = $1 \
                   AND (NOT $5 OR limit_key IS NOT DISTINCT FROM $2) \
                   AND state = 'queued' AND parked ORDER BY priority DESC, id LIMIT $4 \
                   FOR UPDATE) \
                 RETURNING id, queue, priority",
            )
            .bind(queue)
            .bind(key.as_deref())
            .bind(now)
            .bind(take)
            .bind(limits.key_arg.is_some())
            .fetch_all(&mut *conn)
            .await?;
            out.extend(publish_rows(rows)?);
        }
        Ok(out)
    }

    /// Every queue with settings: paused or limited.
    pub(crate) async fn settings(
        conn: &mut PgConnection,
    ) -> sqlx::Result<Vec<crate::store::QueueSettings>> {
        let rows = sqlx::query(
            "SELECT name, paused, concurrency, rate_count, rate_period_us, key_arg \
             FROM homing_queues WHERE paused OR concurrency IS NOT NULL \
             OR rate_count IS NOT NULL ORDER BY name",
        )
        .fetch_all(&mut *conn)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(crate::store::QueueSettings {
                    queue: r.try_get(0)?,
                    paused: r.try_get(1)?,
                    limits: limits_row(r, 2)?,
                })
            })
            .collect()
    }
}
