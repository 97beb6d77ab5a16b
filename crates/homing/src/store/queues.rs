//! The bound on distinct queue names. Every queue name costs something in every per-queue view:
//! a row in `/v1/queues` and the dashboard, seven gauges in `/metrics`, broker keys; a producer
//! that makes up a name per job (a user id, a timestamp) would make each of them grow without
//! bound. So each store keeps a `queues` table of the names it has accepted, enqueue registers a
//! job's queue in the same transaction as the job, and a NEW name is refused once the table holds
//! the store's limit ([`DEFAULT_MAX_QUEUES`], `--max-queues`). Names already there keep working
//! whatever the limit, so lowering it never breaks a running system.
//!
//! The count and the insert are made under the store's write serialisation (SQLite's write lock;
//! a transaction-scoped advisory lock on PostgreSQL, taken only when a batch brings a new name),
//! so processes enqueueing at once cannot overshoot the limit together. Only producers' enqueues
//! are bounded: follow-up jobs and webhook deliveries go to queues chosen by code, not input.
//!
//! Names are never removed from the table, so each store also remembers in memory the names it
//! has seen committed there ([`KnownQueues`]): a batch whose names are all known skips the
//! lookup, and the usual enqueue costs no statement for its queue. (A database restored from an
//! older backup under running processes may lack names they remember: those processes keep
//! enqueueing to such a queue without registering it again until they restart.)

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use crate::job::NewJob;

/// How many distinct queue names a store accepts unless configured otherwise.
pub const DEFAULT_MAX_QUEUES: u64 = 1000;

/// Enqueueing would create a queue over the store's limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooManyQueues {
    pub queue: String,
    pub max: u64,
}

impl std::fmt::Display for TooManyQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "too many queues: the store already has its limit of {} queue names and '{}' would be a new one; use an existing queue, or raise the limit (--max-queues / HOMING_MAX_QUEUES)",
            self.max, self.queue
        )
    }
}

impl std::error::Error for TooManyQueues {}

/// The batch's queue names, each once, in a stable order.
fn names(jobs: &[NewJob]) -> Vec<String> {
    jobs.iter()
        .map(|j| j.queue.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The queue names a store has seen in its table (after the insert that admitted or found them
/// committed), shared by the store's clones. It holds at most what the table holds, and a name
/// in it stays valid because the table never loses one.
#[derive(Debug, Clone, Default)]
pub(crate) struct KnownQueues(Arc<Mutex<HashSet<String>>>);

impl KnownQueues {
    /// The batch's names when one of them is not known yet (the insert must admit them), or
    /// `None` when every one is.
    pub(crate) fn to_admit(&self, jobs: &[NewJob]) -> Option<Vec<String>> {
        let known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        jobs.iter()
            .any(|j| !known.contains(&j.queue))
            .then(|| names(jobs))
    }

    /// Remembers names after the transaction that admitted them committed.
    pub(crate) fn remember(&self, names: Vec<String>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(names);
    }
}

/// Registers the batch's queues inside the insert's write transaction, or refuses the batch.
#[cfg(feature = "sqlite")]
pub(crate) fn admit_sqlite(
    tx: &rusqlite::Transaction<'_>,
    jobs: &[NewJob],
    max: u64,
    now: crate::time::Micros,
) -> rusqlite::Result<()> {
    admit_names_sqlite(tx, names(jobs), max, now)
}

/// Registers queue names inside the caller's write transaction, or refuses them all.
#[cfg(feature = "sqlite")]
pub(crate) fn admit_names_sqlite(
    tx: &rusqlite::Transaction<'_>,
    names: Vec<String>,
    max: u64,
    now: crate::time::Micros,
) -> rusqlite::Result<()> {
    use rusqlite::OptionalExtension as _;
    let mut new = Vec::new();
    for name in names {
        let known = tx
            .prepare_cached("SELECT 1 FROM queues WHERE name = ?1")?
            .query_row([&name], |_| Ok(()))
            .optional()?
            .is_some();
        if !known {
            new.push(name);
        }
    }
    let Some(first) = new.first() else {
        return Ok(());
    };
    // The transaction holds SQLite's write lock: nobody can add a name between count and insert.
    let count: i64 = tx.query_row("SELECT COUNT(*) FROM queues", [], |r| r.get(0))?;
    if count.max(0) as u64 + new.len() as u64 > max {
        return Err(rusqlite::Error::ToSqlConversionFailure(Box::new(
            TooManyQueues {
                queue: first.clone(),
                max,
            },
        )));
    }
    let mut insert =
        tx.prepare_cached("INSERT OR IGNORE INTO queues (name, created_at) VALUES (?1, ?2)")?;
    for name in &new {
        insert.execute(rusqlite::params![name, now])?;
    }
    Ok(())
}

/// The batch's names that `homing_queues` does not hold yet.
#[cfg(feature = "postgres")]
async fn unknown(conn: &mut sqlx::PgConnection, names: Vec<String>) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar::<_, String>(
        "SELECT n FROM unnest($1::text[]) AS n \
         WHERE NOT EXISTS (SELECT 1 FROM homing_queues q WHERE q.name = n) ORDER BY n",
    )
    .bind(names)
    .fetch_all(conn)
    .await
}

/// "queues" in ASCII: the advisory lock under which new names are counted and added.
#[cfg(feature = "postgres")]
const ADMIT_LOCK_KEY: i64 = 0x7175_6575_6573;

/// Registers the batch's queues inside the insert's transaction, or refuses the batch.
#[cfg(feature = "postgres")]
pub(crate) async fn admit_pg(
    conn: &mut sqlx::PgConnection,
    jobs: &[NewJob],
    max: u64,
    now: crate::time::Micros,
) -> sqlx::Result<()> {
    admit_names_pg(conn, names(jobs), max, now).await
}

/// Registers queue names inside the caller's transaction, or refuses them all.
#[cfg(feature = "postgres")]
pub(crate) async fn admit_names_pg(
    conn: &mut sqlx::PgConnection,
    names: Vec<String>,
    max: u64,
    now: crate::time::Micros,
) -> sqlx::Result<()> {
    // The usual case, every name known, takes no lock.
    if unknown(&mut *conn, names.clone()).await?.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(ADMIT_LOCK_KEY)
        .execute(&mut *conn)
        .await?;
    // Under the lock each statement sees every admission committed before it: read again.
    let new = unknown(&mut *conn, names).await?;
    let Some(first) = new.first().cloned() else {
        return Ok(());
    };
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM homing_queues")
        .fetch_one(&mut *conn)
        .await?;
    if count.max(0) as u64 + new.len() as u64 > max {
        return Err(sqlx::Error::Decode(Box::new(TooManyQueues {
            queue: first,
            max,
        })));
    }
    sqlx::query(
        "INSERT INTO homing_queues (name, created_at) SELECT unnest($1::text[]), $2 \
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(new)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
