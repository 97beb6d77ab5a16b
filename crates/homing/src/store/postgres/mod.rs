//! The store on PostgreSQL: the same contract as the SQLite store, for a system that spans
//! several machines (docs/design.md section 5). Servers and workers on different hosts share one
//! database, so every place where processes compete takes row locks instead of relying on one
//! writer:
//! - `start`, `complete`, `mark_lost`, `mark_dead`, `retry` and `cancel` lock the rows they decide
//!   on (`FOR UPDATE`); a second caller waits and then decides on the committed result, so a job
//!   starts once and a lost delivery is counted once.
//! - `claim_due`, `undispatched` and `fan_out` claim with `FOR UPDATE SKIP LOCKED`, so
//!   schedulers, reconcilers and event dispatchers running side by side take disjoint rows instead
//!   of queueing behind each other.
//! - Statements that lock several rows lock them in id order, so two batches never deadlock.
//!
//! Every method is one transaction. Timestamps are BIGINT microseconds, as in SQLite, so that
//! comparisons are exact. Connection trouble (refused, lost, pool exhausted past its timeout,
//! server shutting down, statement timeout) becomes [`Error::Unavailable`], which callers retry.

mod migrations;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
// `AssertSqlSafe`: the SQL built with `format!` here joins constant column lists and `$n`
// placeholders only; every value is bound.
use sqlx::{AssertSqlSafe, PgConnection, Row};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use super::stats_sql;
use super::*;
use crate::error::Error;
use crate::events::CALLBACK_TARGET;
use crate::history::{self, Cause};
use crate::job::{JobOptions, DEFAULT_MAX_CRASHES};
use crate::reclaim::{Reclaim, ReclaimOutcome};
use crate::redact::redact_url;
use crate::stats::Dialect;
use crate::transition::{self, Change};

pub use migrations::{Migration, MIGRATIONS};

const BACKEND: &str = "postgres";

/// Delta rows of the queue counts past which a read of them folds them (docs/counts.md): a
/// sum over this many small rows still takes about a millisecond.
const FOLD_AFTER: i64 = 4096;

/// Commits one worker may have in flight (of the pool's ten connections by default). Each waits
/// for its own WAL flush and PostgreSQL can flush commits that wait together in one go, but on
/// this project's test machine four in flight measured slower (smaller batches, more flushes:
/// BENCHMARKS.md, "The fast path at the defaults"), so it stays at one until that is understood.
const COMMITS_IN_FLIGHT: usize = 1;

/// How long the unparking pass waits for a limited queue's row (`Store::unpark_ready`).
const UNPARK_LOCK_WAIT: Duration = Duration::from_secs(1);

/// Pool and timeout settings.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// Connections this process keeps at most.
    pub max_connections: u32,
    /// How long a call waits for a connection (including connecting) before it is `Unavailable`.
    pub acquire_timeout: Duration,
    /// The server cancels a statement that runs longer (including waiting for a row lock).
    pub statement_timeout: Duration,
    /// How long a presumption ([`Store::presume_lost`]) waits for a start of its worker still in
    /// flight before it is deferred to the caller's next pass. A start holds the wait for
    /// milliseconds; one that holds it longer is stuck (its process paused mid-transaction).
    pub fence_wait: Duration,
    /// The server ends a session whose transaction stays idle longer: a client paused
    /// mid-transaction (SIGSTOP, a VM stalled) holds its row locks until then, and every start
    /// waiting on them (a limited queue's row, a job's) waits with it. homing's transactions never
    /// wait on anything between statements but their own process, so a healthy client stays
    /// far below it; one ended by it gets a connection error, which the caller retries.
    pub idle_in_transaction_timeout: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
            fence_wait: Duration::from_secs(1),
            idle_in_transaction_timeout: Duration::from_secs(10),
        }
    }
}

/// The PostgreSQL store.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    options: PgOptions,
    /// The URL without its password, for messages.
    target: String,
    /// Distinct queue names enqueue accepts (`store::queues`).
    max_queues: u64,
    known_queues: crate::store::queues::KnownQueues,
    /// The LISTEN connection of [`Store::wait_enqueued`], made on first use.
    listener: Arc<tokio::sync::Mutex<Option<sqlx::postgres::PgListener>>>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("target", &self.target)
            .finish()
    }
}

impl PgStore {
    /// Connects to `url` with default settings and brings the schema up to date.
    pub async fn connect(url: &str) -> Result<Self> {
        let store = Self::open(url, PgOptions::default()).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Prepares a pool for `url` without connecting or migrating: connections are made on first
    /// use. Must be called inside a tokio runtime.
    pub async fn open(url: &str, options: PgOptions) -> Result<Self> {
        let target = redact_url(url);
        // The parser's messages never echo the password, but say which URL failed without it.
        let mut connect = PgConnectOptions::from_str(url)
            .map_err(|e| Error::Invalid(format!("invalid PostgreSQL URL '{target}': {e}")))?;
        if !url.contains("application_name=") {
            connect = connect.application_name("homing");
        }
        // 0 turns the statement timeout off, as in PostgreSQL; the idle timeout stays on.
        let statement_ms = pg_millis(options.statement_timeout, 0);
        let idle_ms = pg_millis(options.idle_in_transaction_timeout, 1);
        connect = connect.options([
            ("statement_timeout", statement_ms.as_str()),
            ("idle_in_transaction_session_timeout", idle_ms.as_str()),
        ]);
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .min_connections(0)
            .acquire_timeout(options.acquire_timeout)
            .idle_timeout(Some(Duration::from_secs(300)))
            // Checking a pooled connection before use costs one round trip and is what lets the
            // store recover by itself after the server restarts.
            .test_before_acquire(true)
            .after_connect(|conn, _| Box::pin(watch_client(conn)))
            .connect_lazy_with(connect);
        Ok(Self {
            pool,
            options,
            target,
            max_queues: crate::store::queues::DEFAULT_MAX_QUEUES,
            known_queues: Default::default(),
            listener: Arc::default(),
        })
    }

    /// Sets how many distinct queue names enqueue accepts (`store::queues`).
    pub fn with_max_queues(mut self, max: u64) -> Self {
        self.max_queues = max;
        self
    }

    /// Applies missing migrations (see [`MIGRATIONS`]); returns the names of those applied.
    pub async fn migrate(&self) -> Result<Vec<&'static str>> {
        Ok(self.migrate_to_version().await?.0)
    }

    /// [`PgStore::migrate`], also returning the schema version the database is at afterwards.
    pub async fn migrate_to_version(&self) -> Result<(Vec<&'static str>, i32)> {
        self.call(migrations::apply(&self.pool)).await
    }

    /// The connection pool, for tests and tools that need raw SQL.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Runs one store call with a deadline, so a server that stops answering (a network cut
    /// without a reset) makes the call `Unavailable` instead of hanging it. The statement
    /// timeout normally fires first; this is the backstop.
    /// A job's state alone, read leniently: what deciding needs when the rest of its row may
    /// not decode.
    async fn state_of(&self, id: JobId) -> Result<Option<JobState>> {
        let state: Option<String> = self
            .call(async {
                sqlx::query_scalar("SELECT state FROM homing_jobs WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await
            })
            .await?;
        Ok(state.map(|st| read_state(Some(&st), &mut Vec::new())))
    }

    /// Replaces the queue counts' deltas with one row per (queue, state) (docs/counts.md).
    /// Safe at any time and from any number of processes at once: the sums never change.
    async fn fold_queue_counts(&self) -> Result<()> {
        self.call(async {
            sqlx::query("SELECT homing_fold_queue_counts()")
                .execute(&self.pool)
                .await
                .map(|_| ())
        })
        .await
    }

    async fn call<T>(&self, fut: impl Future<Output = sqlx::Result<T>>) -> Result<T> {
        let limit =
            self.options.acquire_timeout + self.options.statement_timeout + Duration::from_secs(5);
        match tokio::time::timeout(limit, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.map_err(e)),
            Err(_) => Err(Error::unavailable(
                BACKEND,
                format!("{} did not answer within {limit:?}", self.target),
            )),
        }
    }

    fn map_err(&self, e: sqlx::Error) -> Error {
        if matches!(e, sqlx::Error::PoolTimedOut) {
            // sqlx's own text does not say that the server refused or never answered.
            return Error::unavailable(
                BACKEND,
                format!(
                    "{}: no connection within {:?} (is the server running and reachable?)",
                    self.target, self.options.acquire_timeout
                ),
            );
        }
        match map_err(e) {
            Error::Unavailable {
                backend,
                message,
                source,
            } => Error::Unavailable {
                backend,
                message: format!("{}: {message}", self.target),
                source,
            },
            other => other,
        }
    }
}

/// A duration as a PostgreSQL timeout setting in milliseconds: at least `min`, at most what the
/// setting takes (a 32-bit count), so no setting of ours makes every connection or statement fail.
fn pg_millis(d: Duration, min: u128) -> String {
    d.as_millis().clamp(min, i32::MAX as u128).to_string()
}

/// Bounds every lock wait of the rest of `conn`'s transaction (`SET LOCAL lock_timeout`): a
/// wait past it fails with [`lock_not_available`], and the setting ends with the transaction.
async fn set_lock_timeout(conn: &mut PgConnection, wait: Duration) -> sqlx::Result<()> {
    sqlx::query("SELECT set_config('lock_timeout', $1, true)")
        .bind(pg_millis(wait, 1))
        .execute(conn)
        .await
        .map(|_| ())
}

/// Whether `e` is a lock wait that outlasted [`set_lock_timeout`].
fn lock_not_available(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
}

/// SQLSTATEs after which trying again may succeed; the failed transaction committed nothing.
fn transient_sqlstate(code: &str) -> bool {
    code.starts_with("08") // connection exception
        || code.starts_with("53") // insufficient resources: too many connections, disk full
        || code.starts_with("57P") // admin or crash shutdown, cannot connect now
        || matches!(
            code,
            "40001" // serialization failure
                | "40P01" // deadlock detected
                | "55P03" // lock not available
                | "57014" // statement timeout
                | "25P03" // idle-in-transaction timeout
                | "25006" // read-only transaction: a standby, or a primary just demoted (failover)
                | "58030" // I/O error on the server
        )
}

pub(crate) fn map_err(e: sqlx::Error) -> Error {
    if let sqlx::Error::Decode(inner) = &e {
        if let Some(t) = inner.downcast_ref::<crate::store::queues::TooManyQueues>() {
            return Error::Invalid(t.to_string());
        }
    }
    match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Error::unavailable_from(BACKEND, e),
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            if transient_sqlstate(&code) {
                Error::unavailable_from(BACKEND, e)
            } else if matches!(code.as_ref(), "22021" | "22P05") {
                // Text with a NUL byte (PostgreSQL refuses it; SQLite does not): the caller's
                // input, not the store, is at fault.
                Error::Invalid(format!("text cannot contain a NUL character ({db})"))
            } else {
                Error::backend_from(BACKEND, e)
            }
        }
        sqlx::Error::Configuration(_) => Error::Invalid(e.to_string()),
        _ => Error::backend_from(BACKEND, e),
    }
}

const COLUMNS: &[&str] = &[
    "id",
    "task",
    "queue",
    "state",
    "args",
    "result",
    "error",
    "attempts",
    "crashes",
    "epoch",
    "max_retries",
    "max_crashes",
    "retry_policy",
    "time_limit_ms",
    "idempotency_key",
    "progress",
    "worker",
    "created_at",
    "scheduled_at",
    "started_at",
    "finished_at",
    "cancel_requested",
    "on_success",
    "on_failure",
    "callback_url",
    "workflow",
    "parents",
    "priority",
    "traceparent",
];

/// A job row's stored text in bytes, as [`PageFill`] weighs it: every text column at its length
/// and the numbers at 8 bytes each, about as the embedded store counts them (which counts a
/// null number as nothing).
const STORED_BYTES: &str =
    "octet_length(task)::bigint + octet_length(queue) + octet_length(state) \
    + octet_length(args) + coalesce(octet_length(result), 0) + coalesce(octet_length(error), 0) \
    + coalesce(octet_length(retry_policy), 0) + coalesce(octet_length(idempotency_key), 0) \
    + coalesce(octet_length(progress), 0) + coalesce(octet_length(worker), 0) \
    + coalesce(octet_length(on_success), 0) + coalesce(octet_length(on_failure), 0) \
    + coalesce(octet_length(callback_url), 0) + coalesce(octet_length(workflow), 0) \
    + coalesce(octet_length(parents), 0) + coalesce(octet_length(traceparent), 0) + 36 + 8 * 12";

/// Has the server check, every second of a statement, that this connection's client is still
/// there (PostgreSQL 14 and later; older servers have no such check and are left as they are).
/// Without it a statement whose client went away runs to its end or its statement_timeout,
/// since the server only notices when it next writes: a search with no match writes nothing
/// until it is done ([`CloseIfAbandoned`]).
///
/// A server that refuses the setting (Windows, PostgreSQL 14 without `POLLRDHUP`, a
/// look-alike) is used without it, said once: a refusal must not fail the connection.
async fn watch_client(conn: &mut PgConnection) -> sqlx::Result<()> {
    use sqlx::Executor;
    static REFUSED: std::sync::Once = std::sync::Once::new();
    if conn.server_version_num().is_some_and(|v| v >= 140_000) {
        match conn
            .execute("SET client_connection_check_interval = 1000")
            .await
        {
            Ok(_) => {}
            Err(sqlx::Error::Database(e)) => REFUSED.call_once(|| {
                tracing::warn!(error = %e, "the PostgreSQL server refuses client_connection_check_interval: a statement whose client went away runs to its end or its statement_timeout");
            }),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A pooled connection that is closed, not returned to the pool, unless [`Self::done`] is
/// called: dropped mid-statement (its caller stopped waiting: a client that left, a call's
/// deadline), it would otherwise go back to the pool only once that statement had ended, held
/// for nobody meanwhile. Closed, the server stops the statement at its next client check
/// ([`watch_client`]).
struct CloseIfAbandoned {
    conn: sqlx::pool::PoolConnection<sqlx::Postgres>,
    done: bool,
}

impl CloseIfAbandoned {
    fn new(conn: sqlx::pool::PoolConnection<sqlx::Postgres>) -> Self {
        Self { conn, done: false }
    }

    fn done(mut self) {
        self.done = true;
    }
}

impl std::ops::Deref for CloseIfAbandoned {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for CloseIfAbandoned {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

impl Drop for CloseIfAbandoned {
    fn drop(&mut self) {
        if !self.done {
            self.conn.close_on_drop();
        }
    }
}

/// The job columns in `row_to_job`'s order without args, results and the rest of
/// [`crate::workflow::STEPS_LEAVE_OUT`]: what decisions on states and links read, where many
/// jobs are read at once.
fn light_columns() -> String {
    COLUMNS
        .iter()
        .map(|c| crate::workflow::step_column(c))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The job columns in `row_to_job`'s order, qualified with `alias` when it is not empty.
fn columns(alias: &str) -> String {
    COLUMNS
        .iter()
        .map(|c| {
            if alias.is_empty() {
                (*c).to_string()
            } else {
                format!("{alias}.{c}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::Decode(format!("corrupt {what}: {e}").into())
}

/// A job's JSON column, decoded leniently (see [`read_json`]).
fn lenient_col<T: serde::de::DeserializeOwned>(
    row: &PgRow,
    idx: usize,
    what: &str,
    unreadable: &mut Vec<String>,
) -> sqlx::Result<Option<T>> {
    let s: Option<String> = row.try_get(idx)?;
    Ok(read_json(s.as_deref(), what, unreadable))
}

/// A counter column, decoded leniently (see [`read_u32`]); unreadable shows as 0.
fn count_col(
    row: &PgRow,
    idx: usize,
    what: &str,
    unreadable: &mut Vec<String>,
) -> sqlx::Result<u32> {
    let n: Option<i64> = row.try_get(idx)?;
    Ok(read_u32(n, what, unreadable).unwrap_or(0))
}

fn parse_state(s: &str) -> sqlx::Result<JobState> {
    s.parse().map_err(|e| corrupt("state", e))
}

/// A job row, decoded so that no stored value fails it: JSON columns, counters, the epoch and
/// the state that cannot be decoded are shown as null/zero/`queued` and named in
/// [`Job::unreadable`] (see [`crate::transition::unreadable_reason`]).
fn row_to_job(row: &PgRow) -> sqlx::Result<Job> {
    let state: Option<String> = row.try_get(3)?;
    let mut bad = Vec::new();
    let state = read_state(state.as_deref(), &mut bad);
    let attempts = count_col(row, 7, "attempts", &mut bad)?;
    let crashes = count_col(row, 8, "crashes", &mut bad)?;
    let epoch = match u64::try_from(row.try_get::<i64, _>(9)?) {
        Ok(n) => n,
        Err(e) => {
            bad.push(format!("epoch cannot be read: {e}"));
            0
        }
    };
    let max_retries = read_u32(row.try_get::<Option<i64>, _>(10)?, "max_retries", &mut bad);
    let max_crashes = count_col(row, 11, "max_crashes", &mut bad)?;
    let args = lenient_col(row, 4, "args", &mut bad)?.unwrap_or(serde_json::Value::Null);
    let result = lenient_col(row, 5, "result", &mut bad)?;
    let retry_policy = lenient_col(row, 12, "retry_policy", &mut bad)?;
    let progress = lenient_col(row, 15, "progress", &mut bad)?;
    let on_success = lenient_col(row, 22, "on_success", &mut bad)?;
    let on_failure = lenient_col(row, 23, "on_failure", &mut bad)?;
    let workflow = lenient_col(row, 25, "workflow", &mut bad)?;
    let parents = lenient_col(row, 26, "parents", &mut bad)?;
    let mut job = Job {
        id: row.try_get(0)?,
        task: row.try_get(1)?,
        queue: row.try_get(2)?,
        state,
        args,
        result,
        error: row.try_get(6)?,
        attempts,
        crashes,
        epoch,
        max_retries,
        max_crashes,
        retry_policy,
        time_limit: row
            .try_get::<Option<i64>, _>(13)?
            .map(|ms| Duration::from_millis(ms.max(0) as u64)),
        idempotency_key: row.try_get(14)?,
        progress,
        worker: row.try_get(16)?,
        created_at: row.try_get(17)?,
        scheduled_at: row.try_get(18)?,
        started_at: row.try_get(19)?,
        finished_at: row.try_get(20)?,
        cancel_requested: row.try_get(21)?,
        on_success,
        on_failure,
        callback_url: row.try_get(24)?,
        schedule: None,
        scheduled_tick: None,
        priority: i32::try_from(row.try_get::<i64, _>(27)?).unwrap_or(0),
        unreadable: bad,
        workflow,
        parents,
        traceparent: row.try_get(28)?,
    };
    (job.schedule, job.scheduled_tick) = crate::schedule::tick_of(job.idempotency_key.as_deref());
    Ok(job)
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// Error texts come from handlers and may hold a NUL byte, which PostgreSQL text refuses; losing
/// a completion over it would be worse than replacing the byte.
fn clean(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(s)
    }
}

/// The distinct ids of a batch in ascending order: the order every multi-row lock is taken in.
fn lock_order(ids: &[JobId]) -> Vec<JobId> {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

async fn get_job(conn: &mut PgConnection, id: JobId, lock: bool) -> sqlx::Result<Option<Job>> {
    let sql = format!(
        "SELECT {} FROM homing_jobs WHERE id = $1{}",
        columns(""),
        if lock { " FOR UPDATE" } else { "" }
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(id)
        .fetch_optional(conn)
        .await?
        .as_ref()
        .map(row_to_job)
        .transpose()
}

/// Locks the rows of `ids` (in id order) and returns them by id, read as `columns` (whole
/// with [`columns`], or [`light_columns`]). `plans` keeps the statement of a [`begin_keyed`]
/// transaction apart from everyone else's ([`Plans`]).
async fn lock_jobs(
    conn: &mut PgConnection,
    ids: &[JobId],
    plans: Plans,
    columns: &str,
) -> sqlx::Result<HashMap<JobId, Job>> {
    let sql = format!(
        "{}SELECT {columns} FROM homing_jobs WHERE id = ANY($1) ORDER BY id FOR UPDATE",
        plans.tag(),
    );
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(lock_order(ids))
        .fetch_all(conn)
        .await?;
    rows.iter()
        .map(|r| row_to_job(r).map(|j| (j.id, j)))
        .collect()
}

/// Timeline entries (docs/timeline.md) as the arrays `UNNEST` takes, so that one statement
/// writes a batch's entries whatever their number: alone ([`write_history`]) or inside the
/// statement that makes the change they record ([`insert_jobs`]), one round trip fewer.
struct TimelineRows {
    ids: Vec<JobId>,
    at: Vec<i64>,
    kind: Vec<&'static str>,
    state: Vec<&'static str>,
    epoch: Vec<Option<i64>>,
    worker: Vec<Option<String>>,
    attempts: Vec<i32>,
    crashes: Vec<i32>,
    message: Vec<Option<String>>,
    data: Vec<Option<String>>,
}

impl TimelineRows {
    fn new(entries: &[(JobId, history::Entry)]) -> Self {
        let n = entries.len();
        let mut rows = Self {
            ids: Vec::with_capacity(n),
            at: Vec::with_capacity(n),
            kind: Vec::with_capacity(n),
            state: Vec::with_capacity(n),
            epoch: Vec::with_capacity(n),
            worker: Vec::with_capacity(n),
            attempts: Vec::with_capacity(n),
            crashes: Vec::with_capacity(n),
            message: Vec::with_capacity(n),
            data: Vec::with_capacity(n),
        };
        for (id, e) in entries {
            rows.ids.push(*id);
            rows.at.push(e.at);
            rows.kind.push(e.kind.as_str());
            rows.state.push(e.state.as_str());
            rows.epoch
                .push(e.epoch.map(|n| n.min(i64::MAX as u64) as i64));
            rows.worker
                .push(e.worker.as_deref().map(clean).map(Cow::into_owned));
            rows.attempts
                .push(i32::try_from(e.attempts).unwrap_or(i32::MAX));
            rows.crashes
                .push(i32::try_from(e.crashes).unwrap_or(i32::MAX));
            rows.message
                .push(e.message.as_deref().map(clean).map(Cow::into_owned));
            rows.data.push(e.data.as_ref().map(to_json));
        }
        rows
    }

    /// Binds the ten arrays as the statement's next ten parameters, in the order of
    /// [`write_history`]'s `UNNEST`.
    fn bind<'q>(
        self,
        q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        q.bind(self.ids)
            .bind(self.at)
            .bind(self.kind)
            .bind(self.state)
            .bind(self.epoch)
            .bind(self.worker)
            .bind(self.attempts)
            .bind(self.crashes)
            .bind(self.message)
            .bind(self.data)
    }
}

/// Writes timeline entries in one statement, whatever their number: a batch's start or
/// completion adds one round trip, not one per job.
async fn write_history(
    conn: &mut PgConnection,
    entries: &[(JobId, history::Entry)],
) -> sqlx::Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    TimelineRows::new(entries)
        .bind(sqlx::query(
            "INSERT INTO homing_job_history (job_id, at, kind, state, epoch, worker, attempts, \
             crashes, message, data) \
             SELECT * FROM UNNEST($1::uuid[], $2::int8[], $3::text[], $4::text[], $5::int8[], \
                                  $6::text[], $7::int4[], $8::int4[], $9::text[], $10::text[])",
        ))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Keeps each of these jobs' timelines to its first entry and the latest
/// [`history::KEEP_LATEST`], in one statement: per job, everything after the first entry up to
/// and including the (KEEP_LATEST + 1)-th newest goes. Each job costs two probes of the
/// `(job_id, id)` index, and a job with fewer entries has no bound and loses nothing. (A window
/// over the jobs' entries did the same, but planned before the table had statistics it read
/// the whole table: 3.4 ms a call, two thirds of the database's time in a Redis + PostgreSQL
/// bench at concurrency 8.)
async fn trim_history(conn: &mut PgConnection, ids: &[JobId]) -> sqlx::Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(AssertSqlSafe(trim_sql("UNNEST($1::uuid[])", "$2")))
        .bind(ids)
        .bind(history::KEEP_LATEST as i64)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The trim's `DELETE` for the jobs whose ids `ids` yields (an expression of one uuid column,
/// named `job_id`), keeping the first entry and as many newest as `offset` says (the parameter
/// that holds it): everything after the first up to the (offset + 1)-th newest goes.
fn trim_sql(ids: &str, offset: &str) -> String {
    format!(
        "DELETE FROM homing_job_history h USING (\
           SELECT u.job_id, \
             (SELECT min(f.id) FROM homing_job_history f WHERE f.job_id = u.job_id) AS first, \
             (SELECT n.id FROM homing_job_history n WHERE n.job_id = u.job_id \
              ORDER BY n.id DESC OFFSET {offset} LIMIT 1) AS bound \
           FROM {ids} AS u(job_id)) b \
         WHERE h.job_id = b.job_id AND h.id > b.first AND h.id <= b.bound"
    )
}

/// A job row's counters as a timeline entry stores them, for the statements that build entries
/// in SQL: the row's counters are BIGINT, an entry's are INTEGER, and a count outside that
/// range (above 2^31 with a huge retry budget, or below zero by hand) would fail the whole
/// batch's statement. Clamped as `TimelineRows` clamps on the Rust side; negatives read as 0.
macro_rules! entry_counters {
    () => {
        "LEAST(GREATEST(attempts, 0), 2147483647), LEAST(GREATEST(crashes, 0), 2147483647)"
    };
}

fn row_to_entry(r: &PgRow) -> sqlx::Result<history::Entry> {
    let kind: String = r.try_get(1)?;
    let state: String = r.try_get(2)?;
    let counter = |i: usize| -> sqlx::Result<u32> {
        Ok(r.try_get::<Option<i32>, _>(i)?
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0))
    };
    Ok(history::Entry {
        at: r.try_get(0)?,
        kind: history::Kind::parse(&kind),
        state: read_state(Some(&state), &mut Vec::new()),
        epoch: r
            .try_get::<Option<i64>, _>(3)?
            .and_then(|n| u64::try_from(n).ok()),
        worker: r.try_get(4)?,
        attempts: counter(5)?,
        crashes: counter(6)?,
        message: r.try_get(7)?,
        data: r
            .try_get::<Option<String>, _>(8)?
            .map(|t| serde_json::from_str(&t).unwrap_or(serde_json::Value::String(t))),
    })
}

/// Inserts a batch in one statement. Jobs whose idempotency key (or id: a batch retried after
/// its commit's answer was lost) already exists are returned as that existing job; a key used
/// twice in one batch resolves to its first job, as if they had been inserted one by one.
pub(super) async fn insert_jobs(
    conn: &mut PgConnection,
    jobs: &[NewJob],
) -> sqlx::Result<Vec<Inserted>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let mut first_with_key: HashMap<&str, usize> = HashMap::new();
    let mut same_as: Vec<Option<usize>> = vec![None; jobs.len()];
    let mut send = Vec::with_capacity(jobs.len());
    let args_text: Vec<String> = jobs.iter().map(|j| to_json(&j.args)).collect();
    let unique = unique_existing(conn, jobs, &args_text).await?;
    let mut first_unique: HashMap<(&str, &str, &str), usize> = HashMap::new();
    let mut existing_unique: Vec<Option<Inserted>> = vec![None; jobs.len()];
    for (i, j) in jobs.iter().enumerate() {
        if let Some(key) = j.options.idempotency_key.as_deref() {
            if let Some(&first) = first_with_key.get(key) {
                same_as[i] = Some(first);
                continue;
            }
            first_with_key.insert(key, i);
        }
        if j.options.unique_for.is_some() {
            if let Some(found) = &unique[i] {
                existing_unique[i] = Some(found.clone());
                continue;
            }
            let triple = (j.task.as_str(), j.queue.as_str(), args_text[i].as_str());
            if let Some(&first) = first_unique.get(&triple) {
                same_as[i] = Some(first);
                continue;
            }
            first_unique.insert(triple, i);
        }
        send.push(i);
    }
    let states: Vec<JobState> = jobs
        .iter()
        .map(|j| {
            if j.run_at.is_some_and(|t| t > j.created_at) {
                JobState::Scheduled
            } else {
                JobState::Queued
            }
        })
        .collect();

    let n = send.len();
    let mut ids = Vec::with_capacity(n);
    let mut tasks = Vec::with_capacity(n);
    let mut queues = Vec::with_capacity(n);
    let mut st = Vec::with_capacity(n);
    let mut args = Vec::with_capacity(n);
    let mut max_retries: Vec<Option<i64>> = Vec::with_capacity(n);
    let mut max_crashes: Vec<i64> = Vec::with_capacity(n);
    let mut policies: Vec<Option<String>> = Vec::with_capacity(n);
    let mut limits: Vec<Option<i64>> = Vec::with_capacity(n);
    let mut keys: Vec<Option<String>> = Vec::with_capacity(n);
    let mut created: Vec<i64> = Vec::with_capacity(n);
    let mut scheduled: Vec<Option<i64>> = Vec::with_capacity(n);
    let mut on_success: Vec<Option<String>> = Vec::with_capacity(n);
    let mut on_failure: Vec<Option<String>> = Vec::with_capacity(n);
    let mut callback_urls: Vec<Option<String>> = Vec::with_capacity(n);
    let mut priorities: Vec<i64> = Vec::with_capacity(n);
    let mut unique_keys: Vec<Option<String>> = Vec::with_capacity(n);
    let mut traceparents: Vec<Option<String>> = Vec::with_capacity(n);
    for &i in &send {
        let j = &jobs[i];
        let o: &JobOptions = &j.options;
        ids.push(j.id);
        tasks.push(j.task.clone());
        queues.push(j.queue.clone());
        st.push(states[i].as_str());
        args.push(args_text[i].clone());
        priorities.push(i64::from(o.priority.unwrap_or(0)));
        unique_keys.push(
            o.unique_for
                .map(|_| crate::unique::key(&j.task, &j.queue, &args_text[i])),
        );
        max_retries.push(o.max_retries.map(i64::from));
        max_crashes.push(i64::from(o.max_crashes.unwrap_or(DEFAULT_MAX_CRASHES)));
        policies.push(o.retry_policy.as_ref().map(to_json));
        limits.push(
            o.time_limit
                .map(|d| d.as_millis().min(i64::MAX as u128) as i64),
        );
        keys.push(o.idempotency_key.clone());
        created.push(j.created_at);
        scheduled.push(if states[i] == JobState::Scheduled {
            j.run_at
        } else {
            None
        });
        on_success.push(o.on_success.as_ref().map(to_json));
        on_failure.push(o.on_failure.as_ref().map(to_json));
        callback_urls.push(o.callback_url.clone());
        traceparents.push(o.traceparent.clone());
    }
    // Each job's first timeline entry is written by the insert's own statement, for the rows it
    // inserted only (a conflict inserts nothing): one round trip for both tables, so an enqueue
    // that needs no other statement can run as one implicit transaction (Store::insert).
    let log: Vec<(JobId, history::Entry)> = send
        .iter()
        .map(|&i| {
            let at = jobs[i].run_at.filter(|t| *t > jobs[i].created_at);
            (
                jobs[i].id,
                history::enqueued(states[i], at, jobs[i].created_at),
            )
        })
        .collect();
    let query = sqlx::query(
        "WITH ins AS (\
         INSERT INTO homing_jobs (id, task, queue, state, args, max_retries, max_crashes, \
         retry_policy, time_limit_ms, idempotency_key, created_at, scheduled_at, updated_at, \
         on_success, on_failure, callback_url, priority, unique_key, traceparent) \
         SELECT u.id, u.task, u.queue, u.state, u.args, u.max_retries, u.max_crashes, \
                u.retry_policy, u.time_limit_ms, u.idempotency_key, u.created_at, u.scheduled_at, \
                u.created_at, u.on_success, u.on_failure, u.callback_url, u.priority, u.unique_key, \
                u.traceparent \
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[], \
                     $7::int8[], $8::text[], $9::int8[], $10::text[], $11::int8[], $12::int8[], \
                     $13::text[], $14::text[], $15::text[], $16::int8[], $17::text[], $18::text[]) \
              AS u(id, task, queue, state, args, max_retries, max_crashes, retry_policy, \
                   time_limit_ms, idempotency_key, created_at, scheduled_at, on_success, on_failure, \
                   callback_url, priority, unique_key, traceparent) \
         ON CONFLICT DO NOTHING RETURNING id), \
         timeline AS (\
         INSERT INTO homing_job_history (job_id, at, kind, state, epoch, worker, attempts, \
         crashes, message, data) \
         SELECT e.* FROM UNNEST($19::uuid[], $20::int8[], $21::text[], $22::text[], $23::int8[], \
                                $24::text[], $25::int4[], $26::int4[], $27::text[], $28::text[]) \
              AS e(job_id, at, kind, state, epoch, worker, attempts, crashes, message, data) \
         WHERE e.job_id IN (SELECT id FROM ins)) \
         SELECT id FROM ins",
    )
    .bind(&ids)
    .bind(&tasks)
    .bind(&queues)
    .bind(&st)
    .bind(&args)
    .bind(&max_retries)
    .bind(&max_crashes)
    .bind(&policies)
    .bind(&limits)
    .bind(&keys)
    .bind(&created)
    .bind(&scheduled)
    .bind(&on_success)
    .bind(&on_failure)
    .bind(&callback_urls)
    .bind(&priorities)
    .bind(&unique_keys)
    .bind(&traceparents);
    let inserted: HashSet<JobId> = TimelineRows::new(&log)
        .bind(query)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<sqlx::Result<_>>()?;

    let mut out: Vec<Option<Inserted>> = vec![None; jobs.len()];
    let mut lost = Vec::new();
    for &i in &send {
        if inserted.contains(&jobs[i].id) {
            out[i] = Some(Inserted {
                id: jobs[i].id,
                queue: jobs[i].queue.clone(),
                state: states[i],
                existed: false,
            });
        } else {
            lost.push(i);
        }
    }
    if !lost.is_empty() {
        let lost_ids: Vec<JobId> = lost.iter().map(|&i| jobs[i].id).collect();
        let lost_keys: Vec<String> = lost
            .iter()
            .filter_map(|&i| jobs[i].options.idempotency_key.clone())
            .collect();
        let rows = sqlx::query(
            "SELECT id, queue, state, idempotency_key FROM homing_jobs \
             WHERE id = ANY($1) OR idempotency_key = ANY($2)",
        )
        .bind(&lost_ids)
        .bind(&lost_keys)
        .fetch_all(&mut *conn)
        .await?;
        let mut by_id = HashMap::new();
        let mut by_key = HashMap::new();
        for r in &rows {
            let id: JobId = r.try_get(0)?;
            let state: String = r.try_get(2)?;
            let existing = Inserted {
                id,
                queue: r.try_get(1)?,
                state: parse_state(&state)?,
                existed: true,
            };
            if let Some(key) = r.try_get::<Option<String>, _>(3)? {
                by_key.insert(key, existing.clone());
            }
            by_id.insert(id, existing);
        }
        for i in lost {
            let j = &jobs[i];
            let existing = by_id.get(&j.id).or_else(|| {
                j.options
                    .idempotency_key
                    .as_ref()
                    .and_then(|k| by_key.get(k))
            });
            out[i] = Some(existing.cloned().ok_or_else(|| {
                corrupt("insert", format!("job {} conflicted with no row", j.id))
            })?);
        }
    }
    for (i, found) in existing_unique.into_iter().enumerate() {
        if found.is_some() {
            out[i] = found;
        }
    }
    for i in 0..jobs.len() {
        if let Some(first) = same_as[i] {
            let mut existing = out[first].clone().expect("first job resolved above");
            existing.existed = true;
            out[i] = Some(existing);
        }
    }
    Ok(out
        .into_iter()
        .map(|o| o.expect("every job resolved"))
        .collect())
}

/// For each job enqueued with `unique_for`, the stored job that is the same (crate::unique), if
/// any. It takes the advisory lock of each such job's triple first, in one order for every
/// caller, and holds them to the end of the transaction: a concurrent enqueue of an equal job
/// waits, then sees this one's.
async fn unique_existing(
    conn: &mut PgConnection,
    jobs: &[NewJob],
    args_text: &[String],
) -> sqlx::Result<Vec<Option<Inserted>>> {
    let mut out = vec![None; jobs.len()];
    let mut locks: Vec<i64> = jobs
        .iter()
        .zip(args_text)
        .filter(|(j, _)| j.options.unique_for.is_some())
        .map(|(j, a)| crate::unique::lock_key(&j.task, &j.queue, a))
        .collect();
    if locks.is_empty() {
        return Ok(out);
    }
    locks.sort_unstable();
    locks.dedup();
    for key in locks {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(key)
            .execute(&mut *conn)
            .await?;
    }
    for (i, j) in jobs.iter().enumerate() {
        let Some(window) = j.options.unique_for else {
            continue;
        };
        let row = sqlx::query(
            "SELECT id, queue, state FROM homing_jobs WHERE unique_key = $1 AND task = $2 \
             AND queue = $3 AND args = $4 AND (state IN ('scheduled', 'queued', 'running') \
             OR finished_at >= $5) ORDER BY created_at DESC LIMIT 1",
        )
        .bind(crate::unique::key(&j.task, &j.queue, &args_text[i]))
        .bind(&j.task)
        .bind(&j.queue)
        .bind(&args_text[i])
        .bind(crate::unique::finished_since(j.created_at, window))
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(r) = row {
            let state: String = r.try_get(2)?;
            out[i] = Some(Inserted {
                id: r.try_get(0)?,
                queue: r.try_get(1)?,
                state: parse_state(&state)?,
                existed: true,
            });
        }
    }
    Ok(out)
}

/// Writes the event of a terminal transition just made to job `id`, inside that transition's
/// transaction (docs/design.md section 1, guarantee 9: follow-up work commits with its cause). The job
/// is read back so the event carries it exactly as committed, as the SQLite store's does.
async fn terminal_event(conn: &mut PgConnection, id: JobId, now: Micros) -> sqlx::Result<()> {
    if let Some(ev) = get_job(conn, id, false)
        .await?
        .as_ref()
        .and_then(NewEvent::for_terminal)
    {
        insert_event(conn, &ev, now).await?;
    }
    Ok(())
}

async fn insert_event(conn: &mut PgConnection, ev: &NewEvent, now: Micros) -> sqlx::Result<i64> {
    sqlx::query_scalar(
        "INSERT INTO homing_events (kind, job_id, worker, data, created_at) \
         VALUES ($1, $2, $3, $4, $5) RETURNING id",
    )
    .bind(&ev.kind)
    .bind(ev.job_id)
    .bind(ev.worker.as_deref().map(clean))
    .bind(to_json(&ev.data))
    .bind(now)
    .fetch_one(conn)
    .await
}

const EVENT_COLUMNS: &str = "id, kind, job_id, worker, data, created_at, dispatched_at";

/// An event as stored. Data that cannot be decoded is shown as `{"unreadable": "<why>"}` and
/// its reason returned beside it, so the dispatcher can set the event aside.
fn row_to_event(r: &PgRow) -> sqlx::Result<(Event, Option<String>)> {
    let text: String = r.try_get(4)?;
    let (data, bad) = match read_event_data(&text) {
        Ok(v) => (v, None),
        Err(why) => (serde_json::json!({ "unreadable": why }), Some(why)),
    };
    Ok((
        Event {
            id: r.try_get(0)?,
            kind: r.try_get(1)?,
            job_id: r.try_get(2)?,
            worker: r.try_get(3)?,
            data,
            created_at: r.try_get(5)?,
            dispatched_at: r.try_get(6)?,
        },
        bad,
    ))
}

/// Fans out pending events in one transaction: the oldest `limit`, or only event `only`.
async fn fan_out_tx(
    pool: &PgPool,
    subscribers: &[Subscriber],
    limit: usize,
    only: Option<i64>,
    now: Micros,
) -> sqlx::Result<FanOut> {
    let mut tx = pool.begin().await?;
    // SKIP LOCKED: events another dispatcher is fanning out are left to it, so two dispatchers
    // take disjoint batches instead of queueing behind each other. An event it has committed
    // meanwhile fails the re-checked `dispatched_at IS NULL` when its lock is taken.
    let rows = match only {
        None => {
            let sql = format!(
                "SELECT {EVENT_COLUMNS} FROM homing_events WHERE dispatched_at IS NULL \
                 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(limit.min(i64::MAX as usize) as i64)
                .fetch_all(&mut *tx)
                .await?
        }
        Some(id) => {
            let sql = format!(
                "SELECT {EVENT_COLUMNS} FROM homing_events WHERE dispatched_at IS NULL \
                 AND id = $1 FOR UPDATE SKIP LOCKED"
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(id)
                .fetch_all(&mut *tx)
                .await?
        }
    };
    let mut events = Vec::with_capacity(rows.len());
    let mut handled = Vec::with_capacity(rows.len());
    for r in &rows {
        let (ev, bad) = row_to_event(r)?;
        handled.push(ev.id);
        match bad {
            Some(why) => {
                tracing::error!(event_id = ev.id, kind = %ev.kind, reason = %why, "an event cannot be read; it is set aside undelivered");
            }
            None => events.push(ev),
        }
    }
    if handled.is_empty() {
        tx.commit().await?;
        return Ok(FanOut::default());
    }
    let job_ids: Vec<JobId> = events.iter().filter_map(|e| e.job_id).collect();
    let with_callback: HashSet<JobId> = if job_ids.is_empty() {
        HashSet::new()
    } else {
        sqlx::query_scalar(
            "SELECT id FROM homing_jobs WHERE id = ANY($1) AND callback_url IS NOT NULL",
        )
        .bind(lock_order(&job_ids))
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .collect()
    };
    let mut deliveries = Vec::new();
    for ev in &events {
        for s in subscribers.iter().filter(|s| s.matches(&ev.kind)) {
            deliveries.push(ev.delivery_job(&s.name, now));
        }
        if ev.job_id.is_some_and(|j| with_callback.contains(&j)) {
            deliveries.push(ev.delivery_job(CALLBACK_TARGET, now));
        }
    }
    // The keys (`<event id>:<target>`) make a repeated fan-out of an event (a batch whose commit
    // was not heard, then retried) return the existing deliveries instead of duplicating them.
    let dispatch = insert_jobs(&mut tx, &deliveries)
        .await?
        .into_iter()
        .filter(Inserted::needs_dispatch)
        .map(|i| ToPublish {
            id: i.id,
            queue: i.queue,
            priority: 0,
        })
        .collect();
    sqlx::query("UPDATE homing_events SET dispatched_at = $2 WHERE id = ANY($1)")
        .bind(&handled)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(FanOut {
        events: handled.len(),
        dispatch,
    })
}

/// Writes a decided [`Change`] to job `id` in one statement, only where `guard` (SQL over the
/// row, may be empty) holds; returns whether it did. Error texts are [`clean`]ed.
async fn write_change(
    conn: &mut PgConnection,
    id: JobId,
    guard: &str,
    change: &Change,
    now: Micros,
) -> sqlx::Result<bool> {
    let mut sql = format!(
        "UPDATE homing_jobs SET state = '{}', updated_at = $2",
        change.state.as_str()
    );
    let mut n = 2;
    let mut next = || {
        n += 1;
        n
    };
    if change.count_attempt {
        sql += ", attempts = attempts + 1";
    }
    if change.count_crash {
        sql += ", crashes = crashes + 1";
    }
    let error = match &change.error {
        None => None,
        Some(None) => {
            sql += ", error = NULL";
            None
        }
        Some(Some(e)) => {
            sql += &format!(", error = ${}", next());
            Some(clean(e))
        }
    };
    let result = change.result.as_ref().map(|r| {
        sql += &format!(", result = ${}", next());
        to_json(r)
    });
    if let Some(_at) = change.scheduled_at {
        sql += &format!(", scheduled_at = ${}", next());
    }
    if change.finished {
        sql += ", finished_at = $2";
    }
    if change.release_worker {
        sql += ", worker = NULL";
    }
    if change.republish {
        sql += ", dispatched = false";
    }
    sql += " WHERE id = $1";
    sql += guard;
    let mut q = sqlx::query(AssertSqlSafe(sql)).bind(id).bind(now);
    if let Some(e) = &error {
        q = q.bind(e.as_ref());
    }
    if let Some(r) = &result {
        q = q.bind(r);
    }
    if let Some(at) = change.scheduled_at {
        q = q.bind(at);
    }
    Ok(q.execute(&mut *conn).await?.rows_affected() == 1)
}

/// A decided change to a locked job with its event, follow-up and timeline entry, in the
/// caller's transaction. The follow-up is left undispatched: the reconciler publishes it.
async fn transit(
    conn: &mut PgConnection,
    before: &Job,
    change: &Change,
    cause: Cause<'_>,
    now: Micros,
) -> sqlx::Result<()> {
    write_change(conn, before.id, "", change, now).await?;
    let e = history::changed(
        &change.apply(before, now),
        change,
        cause,
        ran_under(before),
        now,
    );
    write_history(conn, &[(before.id, e)]).await?;
    let fx = transition::effects(before, change, now);
    if fx.event {
        terminal_event(conn, before.id, now).await?;
    }
    if let Some(f) = fx.follow_up {
        insert_jobs(conn, &[f]).await?;
    }
    if let (true, Some(link)) = (change.state.is_terminal(), &before.workflow) {
        // Left undispatched like the follow-up: the listener (woken at commit) publishes them,
        // the reconciler at the latest.
        if !settle_tx(conn, link.id, now).await?.is_empty() {
            notify_queued(conn).await?;
        }
    }
    Ok(())
}

/// The worker whose run a change to `before` ends, if it is running ([`history::changed`]).
fn ran_under(before: &Job) -> Option<&str> {
    (before.state == JobState::Running)
        .then_some(before.worker.as_deref())
        .flatten()
}

/// Locks the workflows the jobs `ids` belong to, in id order. Every transaction that may end a
/// workflow step takes these locks before its job rows (workflow, then jobs, each in id order),
/// so two of them never deadlock, and two steps of one workflow ending at once are settled one
/// after the other: the second sees the first's commit.
async fn lock_workflows_of(conn: &mut PgConnection, ids: &[JobId]) -> sqlx::Result<()> {
    let wfs: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT DISTINCT workflow_id FROM homing_jobs WHERE id = ANY($1) \
         AND workflow_id IS NOT NULL ORDER BY workflow_id",
    )
    .bind(lock_order(ids))
    .fetch_all(&mut *conn)
    .await?;
    lock_workflows(conn, &wfs).await
}

/// Locks workflow rows `wfs` (given in id order), the first locks of every transaction that
/// changes their steps.
async fn lock_workflows(conn: &mut PgConnection, wfs: &[uuid::Uuid]) -> sqlx::Result<()> {
    if !wfs.is_empty() {
        sqlx::query("SELECT id FROM homing_workflows WHERE id = ANY($1) ORDER BY id FOR UPDATE")
            .bind(wfs)
            .fetch_all(&mut *conn)
            .await?;
    }
    Ok(())
}

/// What a transaction that starts, ends or reclaims jobs locks before the jobs themselves, in the
/// order every such transaction takes it (their workflows, then their limited queues' settings;
/// see `lock_limited`), returning the limited queues' limits. Most batches have neither: one
/// statement finds that out, where a workflow probe and the limited queues' lock were two round
/// trips each time. When the batch has workflows, their locks may wait, so the limits are read
/// (and locked) after that wait, as before. Otherwise the limits are read one round trip
/// earlier than the locking read did, with no wait between: nothing orders a start against a
/// `set_limits` in flight in either form (a queue row whose limits are not yet committed fails
/// the locking read's filter and is not locked), so a limit committed in that round trip is
/// one more such race, not a new kind.
///
/// A start gives its worker's fence key ([`FenceKey`]): the statement then also takes the
/// fence's shared lock, the first lock of the transaction as before, one round trip fewer than
/// a statement of its own. The statement's own reads were made before its wait for that lock,
/// but they read only what a presumption does not change (a job's workflow and queue, the
/// queues' limits); what the fence orders (the presumption, the jobs' states) is read by later
/// statements.
async fn lock_ahead_of_jobs(
    conn: &mut PgConnection,
    ids: &[JobId],
    fence: Fenced,
) -> sqlx::Result<HashMap<String, crate::limit::QueueLimits>> {
    macro_rules! probe {
        ($lock:literal) => {
            concat!(
                "SELECT ARRAY(SELECT DISTINCT workflow_id FROM homing_jobs WHERE id = ANY($1) \
                              AND workflow_id IS NOT NULL ORDER BY workflow_id), \
                        EXISTS (SELECT 1 FROM homing_queues \
                                WHERE name IN (SELECT queue FROM homing_jobs WHERE id = ANY($1)) \
                                AND (concurrency IS NOT NULL OR rate_count IS NOT NULL))",
                $lock
            )
        };
    }
    // No FROM: one row, so the lock is taken exactly once.
    let row = match fence {
        Fenced::No(plans) => {
            sqlx::query(AssertSqlSafe(format!("{}{}", plans.tag(), probe!(""))))
                .bind(ids)
                .fetch_one(&mut *conn)
                .await?
        }
        Fenced::Start(FenceKey { class, key }) => {
            sqlx::query(probe!(", pg_advisory_xact_lock_shared($2, $3)"))
                .bind(ids)
                .bind(class)
                .bind(key)
                .fetch_one(&mut *conn)
                .await?
        }
    };
    let workflows: Vec<uuid::Uuid> = row.try_get(0)?;
    let limited: bool = row.try_get(1)?;
    if workflows.is_empty() && !limited {
        return Ok(HashMap::new());
    }
    lock_workflows(conn, &workflows).await?;
    super::limits::postgres::lock_limited(conn, ids).await
}

/// A workflow's steps, as jobs without their args, results and the rest of
/// [`crate::workflow::STEPS_LEAVE_OUT`].
async fn workflow_jobs(conn: &mut PgConnection, wf: uuid::Uuid) -> sqlx::Result<Vec<Job>> {
    let sql = format!(
        "SELECT {} FROM homing_jobs WHERE workflow_id = $1 ORDER BY id",
        light_columns()
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(wf)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(row_to_job)
        .collect()
}

/// Applies [`crate::workflow::settle`] to workflow `wf` (whose step just reached a terminal
/// state) in the caller's transaction, under the workflow's row lock: made-runnable steps are
/// returned (left undispatched: the caller publishes them, or NOTIFYs the listeners),
/// cancelled ones get their callback event.
async fn settle_tx(
    conn: &mut PgConnection,
    wf: uuid::Uuid,
    now: Micros,
) -> sqlx::Result<Vec<ToPublish>> {
    use crate::workflow::Settle;
    // Read committed: this statement waits for a concurrent settler of the same workflow, and
    // the read below (a new snapshot) sees what it committed.
    sqlx::query("SELECT id FROM homing_workflows WHERE id = $1 FOR UPDATE")
        .bind(wf)
        .fetch_optional(&mut *conn)
        .await?;
    let steps = workflow_jobs(conn, wf).await?;
    let mut decided = crate::workflow::settle(&steps);
    if decided.iter().any(|d| matches!(d, Settle::Ready { .. })) {
        decided = crate::workflow::settle_within(&steps, &result_sizes(conn, wf).await?);
    }
    let results = results_of(conn, crate::workflow::parents_to_read(&decided)).await?;
    let mut publish = Vec::new();
    for d in &decided {
        match d {
            Settle::Ready { id, parents } => {
                let parents = to_json(&crate::workflow::with_results(parents, &results));
                let queue: Option<(String, i64)> = sqlx::query_as(
                    "UPDATE homing_jobs SET state = 'queued', dispatched = false, parents = $2, \
                     updated_at = $3 WHERE id = $1 AND state = 'waiting' RETURNING queue, priority",
                )
                .bind(id)
                .bind(parents)
                .bind(now)
                .fetch_optional(&mut *conn)
                .await?;
                if let Some((queue, priority)) = queue {
                    let e = history::queued(history::Kind::Ready, 0, 0, now);
                    write_history(conn, &[(*id, e)]).await?;
                    let priority = i32::try_from(priority).unwrap_or(0);
                    publish.push(ToPublish {
                        id: *id,
                        queue,
                        priority,
                    });
                }
            }
            Settle::Cancel { id, .. } => {
                let change = Change {
                    error: Some(Some(crate::workflow::cancel_reason(&steps, *id, &decided))),
                    ..Change::cancelled()
                };
                if write_change(conn, *id, " AND state = 'waiting'", &change, now).await? {
                    if let Some(before) = steps.iter().find(|j| j.id == *id) {
                        let after = change.apply(before, now);
                        let e = history::changed(&after, &change, Cause::Other, None, now);
                        write_history(conn, &[(*id, e)]).await?;
                    }
                    terminal_event(conn, *id, now).await?;
                }
            }
        }
    }
    Ok(publish)
}

/// Transactional enqueue (docs/workflows.md): inserts jobs through the application's own
/// connection, inside whatever transaction it has open, so they exist if and only if it
/// commits. Queue names are admitted against `max_queues` as [`Store::insert`] does. The jobs
/// are left undispatched; the NOTIFY (sent at commit only) wakes homing's listeners, which
/// publish them at once, and the reconciler's sweep publishes them otherwise.
pub async fn insert_in(
    conn: &mut PgConnection,
    jobs: Vec<NewJob>,
    max_queues: u64,
) -> Result<Vec<Inserted>> {
    async {
        crate::store::queues::admit_pg(&mut *conn, &jobs, max_queues, crate::time::now()).await?;
        let out = insert_jobs(&mut *conn, &jobs).await?;
        notify_queued(&mut *conn).await?;
        Ok(out)
    }
    .await
    .map_err(map_err)
}

/// The channel homing's listeners wait on; whoever makes a job queued and undispatched in a
/// transaction NOTIFYs it (the SQL function `homing_enqueue` too).
pub const JOBS_CHANNEL: &str = "homing_jobs";

/// Wakes listeners (`homing_jobs` channel): a job became queued in this transaction and will be
/// undispatched once it commits. Delivered only at commit, and only if it commits.
async fn notify_queued(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_notify('homing_jobs', '')")
        .execute(&mut *conn)
        .await?;
    Ok(())
}

fn read_workflow_row(
    r: Option<(String, i64, Option<i64>)>,
    id: uuid::Uuid,
    jobs: &[Job],
) -> Option<Workflow> {
    r.map(|(name, created_at, cancelled_at)| {
        Workflow::from_parts(id, name, created_at, cancelled_at, jobs)
    })
}

async fn read_workflow(conn: &mut PgConnection, id: uuid::Uuid) -> sqlx::Result<Option<Workflow>> {
    let row: Option<(String, i64, Option<i64>)> =
        sqlx::query_as("SELECT name, created_at, cancelled_at FROM homing_workflows WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
    if row.is_none() {
        return Ok(None);
    }
    let jobs = workflow_jobs(conn, id).await?;
    Ok(read_workflow_row(row, id, &jobs))
}

/// The last resort for a job whose transition could not be written: `dead` with the reason and
/// its `job.dead` event, by a statement that writes no follow-up (a follow-up may be what could
/// not be written) and reads back only id, task, queue, worker and callback_url, decoding
/// nothing else, so that it works on any row ([`buried_job`]). Returns whether it applied.
async fn bury(
    pool: &PgPool,
    id: JobId,
    guard: BuryIf<'_>,
    reason: &str,
    now: Micros,
) -> sqlx::Result<bool> {
    let mut tx = pool.begin().await?;
    let sql_guard = match guard {
        BuryIf::NotStarted => " WHERE id = $1 AND state IN ('queued', 'scheduled', 'waiting')",
        // A fenced write is a completion: remember its epoch (`Store::last_completion`).
        BuryIf::Fence(_) => {
            ", completed_epoch = epoch WHERE id = $1 AND state = 'running' AND epoch = $4"
        }
        BuryIf::Owner(_) => " WHERE id = $1 AND state = 'running' AND worker = $4",
    };
    let sql = format!(
        "UPDATE homing_jobs SET state = 'dead', error = $3, finished_at = $2, updated_at = $2\
         {sql_guard} RETURNING id, task, queue, worker, callback_url"
    );
    let reason = clean(reason);
    let mut q = sqlx::query_as::<_, (JobId, String, String, Option<String>, Option<String>)>(
        AssertSqlSafe(sql),
    )
    .bind(id)
    .bind(now)
    .bind(reason.as_ref());
    match guard {
        BuryIf::NotStarted => {}
        BuryIf::Fence(epoch) => q = q.bind(epoch as i64),
        BuryIf::Owner(worker) => q = q.bind(worker),
    }
    let Some((id, task, queue, worker, callback_url)) = q.fetch_optional(&mut *tx).await? else {
        tx.commit().await?;
        return Ok(false);
    };
    write_history(
        &mut tx,
        &[(id, history::buried(&reason, worker.clone(), now))],
    )
    .await?;
    let job = buried_job(id, task, queue, worker, callback_url, &reason, now);
    if let Some(ev) = NewEvent::for_terminal(&job) {
        insert_event(&mut tx, &ev, now).await?;
    }
    if let BuryIf::Owner(worker) = guard {
        // The rescuer's last resort is a reclaim too: the worker view lists it.
        sqlx::query(
            "INSERT INTO homing_worker_reclaims (worker, job, epoch, outcome, at) \
             SELECT $1, id, epoch, $3, $4 FROM homing_jobs WHERE id = $2 ON CONFLICT DO NOTHING",
        )
        .bind(worker)
        .bind(id)
        .bind(ReclaimOutcome::Dead.as_str())
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    let wf: Option<uuid::Uuid> =
        sqlx::query_scalar("SELECT workflow_id FROM homing_jobs WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .flatten();
    if let Some(wf) = wf {
        if !settle_tx(&mut tx, wf, now).await?.is_empty() {
            notify_queued(&mut tx).await?;
        }
    }
    tx.commit().await?;
    Ok(true)
}

/// Which rows [`bury`] may touch besides the id.
#[derive(Clone, Copy)]
enum BuryIf<'a> {
    /// A start: only while the job has not started.
    NotStarted,
    /// A completion: only while this run (epoch) owns the job.
    Fence(u64),
    /// A lost worker's job: only while it runs under that worker.
    Owner(&'a str),
}

/// Begins a transaction for the worker's hot path (a batch's start, its completion), whose
/// statements find rows by their ids (the limits' by an index of their queue), with plans to
/// match until [`unkey`]: each prepared statement is planned once per connection
/// (`plan_cache_mode = force_generic_plan`), as index lookups joined by nested loops
/// (`enable_seqscan`, `enable_hashjoin` and `enable_mergejoin` off), for the rest of the
/// transaction only (`SET LOCAL`), in `BEGIN`'s own round trip. Left to itself PostgreSQL
/// planned most of these statements anew on every call at the defaults' batches of 1 to 8 jobs
/// (a generic plan of `id = ANY($1)` assumes ten ids, so a custom plan always looked cheaper),
/// and planning cost more than running them: the start's update was planned in 270 µs and ran
/// in 180. A generic plan chosen by cost alone would be worse: made while the table is small,
/// it scans the whole table (or the whole primary key into a hash join), and is kept as the
/// table grows until the next ANALYZE. With the plan shapes fixed, the one generic plan is
/// right at every size: a lookup per id. Other transactions keep the defaults; the statements
/// they share with these are told apart ([`Plans`]).
async fn begin_keyed(pool: &PgPool) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    pool.begin_with(
        "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off; \
         SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off",
    )
    .await
}

/// Gives a [`begin_keyed`] transaction the planner's defaults back before it leaves the ids'
/// path: before it inserts jobs (a completion's follow-ups; a start's death, which takes the
/// general path of [`transit`] and may insert one) or settles workflows. The insert matches its
/// timeline entries to the rows it inserted, a join of two lists that wants a hash, and a plan
/// is kept with its statement, whoever made it: one made without hash joins would serve a
/// producer's later batch of 10,000 jobs on the same connection as a nested loop. A workflow's
/// statements find steps by workflow and state: a generic plan made on an empty table chose an
/// index of `(state, queue, id)` for `id = $1 AND state = 'waiting'` and, with the table grown,
/// walked every waiting job. One round trip, on these paths only.
async fn unkey(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::raw_sql(
        "SET LOCAL plan_cache_mode = DEFAULT; SET LOCAL enable_seqscan = DEFAULT; \
         SET LOCAL enable_hashjoin = DEFAULT; SET LOCAL enable_mergejoin = DEFAULT",
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The key of the advisory lock that orders a worker's starts against its presumption. A start
/// takes it shared, in the first statement after its `BEGIN` ([`lock_ahead_of_jobs`]); a
/// presumption ([`Store::presume_lost`]) holds it alone ([`begin_presuming`]). A presumption
/// waits for the starts already past the lock and records their runs; a start that comes after
/// it reads the presumption in a later statement, so in a later snapshot, and is refused.
/// Without it a start could read "not presumed" while a presumption committed beside it that
/// recorded none of its runs. An advisory lock writes nothing (a `FOR SHARE` on the worker row
/// would write the row on every start). It is taken in a statement after `BEGIN` rather than
/// in `BEGIN`'s own query: should the wait fail (a statement timeout), the transaction is open
/// by then and is rolled back, where a failed `BEGIN; SELECT ...` would leave its connection in
/// an aborted transaction. The key is the worker id's FNV-1a hash under a class of its own; a
/// collision only makes two workers' starts and presumptions wait for each other.
#[derive(Clone, Copy)]
struct FenceKey {
    class: i32,
    key: i32,
}

impl FenceKey {
    fn of(worker: &str) -> Self {
        /// "hsf\0": the class of the start fence's keys, apart from homing's one-key locks.
        const CLASS: i32 = 0x6873_6600;
        let key = worker.bytes().fold(0x811c_9dc5_u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        }) as i32;
        FenceKey { class: CLASS, key }
    }
}

/// Whether [`lock_ahead_of_jobs`] takes a start's fence lock (only a start's form has one) and,
/// if not, for which transaction.
#[derive(Clone, Copy)]
enum Fenced {
    Start(FenceKey),
    No(Plans),
}

/// Whose plans a statement shares. PostgreSQL keeps one plan per prepared statement on a
/// connection, whoever made it and under whatever settings, and a forced generic plan takes the
/// one there is. A statement that both a [`begin_keyed`] transaction and another sends could
/// therefore run, keyed, on a plan the other made by PostgreSQL's own rule (after five calls,
/// while the table was small: a sequential scan). The hot ones are told apart by a comment at
/// the head of the keyed text, so that each text has one kind of caller.
#[derive(Clone, Copy)]
enum Plans {
    Keyed,
    Own,
}

impl Plans {
    fn tag(self) -> &'static str {
        match self {
            Plans::Keyed => "/* keyed */ ",
            Plans::Own => "",
        }
    }
}

/// Begins a presumption's transaction holding its worker's fence ([`FenceKey`]) alone. It waits
/// a bounded time (`lock_timeout`, for the rest of its transaction): a start paused
/// mid-transaction holds the lock until its connection is ended, and a presumption queued
/// behind it would in turn hold up every later start under the same key.
async fn begin_presuming(
    pool: &PgPool,
    worker: &str,
    wait: Duration,
) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let FenceKey { class, key } = FenceKey::of(worker);
    let mut tx = pool.begin().await?;
    set_lock_timeout(&mut tx, wait).await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
        .bind(class)
        .bind(key)
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

async fn start_tx(
    pool: &PgPool,
    ids: &[JobId],
    worker: &str,
    now: Micros,
) -> sqlx::Result<Vec<StartOutcome>> {
    let mut tx = begin_keyed(pool).await?;
    let limited = lock_ahead_of_jobs(&mut tx, ids, Fenced::Start(FenceKey::of(worker))).await?;
    let mut jobs = lock_jobs(&mut tx, ids, Plans::Keyed, &columns("")).await?;
    // What the store counted per (queue, key), once per batch (the queue's row lock keeps it
    // true until the commit), plus what this batch has granted, not yet written.
    let mut usage_here: HashMap<(String, Option<String>), crate::limit::Usage> = HashMap::new();
    let mut grants: Vec<(JobId, String, Option<String>, Option<crate::limit::Rate>)> = Vec::new();
    // Read after the jobs are locked, in this transaction: a pause committed before it is seen.
    let queues: Vec<String> = jobs
        .values()
        .map(|j| j.queue.clone())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    // With the worker's presumption (Store::presume_lost) in the same round trip; the fence
    // taken first makes this read exact (FenceKey).
    let (paused, presumed): (Vec<String>, bool) = sqlx::query_as(
        "SELECT ARRAY(SELECT name FROM homing_queues WHERE paused AND name = ANY($1)), \
         EXISTS (SELECT 1 FROM homing_workers WHERE id = $2 AND presumed_dead_at IS NOT NULL)",
    )
    .bind(&queues)
    .bind(worker)
    .fetch_one(&mut *tx)
    .await?;
    if presumed {
        tx.rollback().await?;
        return Ok(vec![StartOutcome::Presumed; ids.len()]);
    }
    let paused: HashSet<String> = paused.into_iter().collect();
    enum Decision {
        Done(StartOutcome),
        Run(JobId),
    }
    let mut decisions = Vec::with_capacity(ids.len());
    let mut to_run = Vec::new();
    // A death may insert a follow-up and settle its workflow: see unkey.
    let mut keyed = true;
    for id in ids {
        let Some(job) = jobs.get_mut(id) else {
            decisions.push(Decision::Done(StartOutcome::Missing));
            continue;
        };
        let limits = limited.get(&job.queue);
        let key = limits.and_then(|l| l.key_of(&job.args));
        let mut full = false;
        if let Some(l) = limits {
            let k = (job.queue.clone(), key.clone());
            let u = match usage_here.get(&k) {
                Some(u) => *u,
                None => {
                    let u =
                        super::limits::postgres::usage(&mut tx, &job.queue, l, key.as_deref(), now)
                            .await?;
                    usage_here.insert(k, u);
                    u
                }
            };
            full = !crate::limit::admits(l, u);
        }
        let gate = transition::QueueGate {
            paused: paused.contains(&job.queue),
            full,
        };
        match transition::start_gated(job, now, gate) {
            transition::Start::Skip(state) => {
                decisions.push(Decision::Done(StartOutcome::Skip(state)))
            }
            transition::Start::Park => {
                let change = transition::park();
                transit(&mut tx, job, &change, Cause::Start, now).await?;
                super::limits::postgres::parked(&mut tx, job.id, key.as_deref()).await?;
                *job = change.apply(job, now);
                decisions.push(Decision::Done(StartOutcome::Parked));
            }
            transition::Start::Defer(at) => decisions.push(Decision::Done(StartOutcome::Defer(at))),
            transition::Start::Dead(reason) => {
                let change = Change::dead(reason);
                if keyed {
                    unkey(&mut tx).await?;
                    keyed = false;
                }
                transit(&mut tx, job, &change, Cause::Start, now).await?;
                *job = change.apply(job, now);
                decisions.push(Decision::Done(StartOutcome::Dead));
            }
            transition::Start::Run => {
                // Marked here so that the same id twice in one batch starts once, as one by one
                // would.
                job.state = JobState::Running;
                if let Some(l) = limits {
                    if let Some(u) = usage_here.get_mut(&(job.queue.clone(), key.clone())) {
                        u.running = u.running.saturating_add(1);
                        u.recent_starts = u.recent_starts.saturating_add(1);
                    }
                    grants.push((*id, job.queue.clone(), key.clone(), l.rate));
                }
                to_run.push(*id);
                decisions.push(Decision::Run(*id));
            }
        }
    }
    let mut started: HashMap<JobId, Job> = HashMap::new();
    if !to_run.is_empty() {
        // Each run's `started` entry (history::started: the row as the start leaves it) is
        // written by the update's own statement, from the rows it returns, and the timelines
        // are trimmed there too (trim_history's rule): two round trips fewer. Only a start
        // begins a run, so only a start can grow a timeline by more than a run's entries:
        // trimming here, once per batch, keeps every timeline near its bound. The trim reads
        // the statement's snapshot, which does not hold the entry it adds: it keeps one
        // fewer of the older entries, so the first and the latest KEEP_LATEST remain.
        let sql = format!(
            "WITH started AS (\
             UPDATE homing_jobs SET state = 'running', epoch = epoch + 1, worker = $2, \
             started_at = $3, dispatched = true, updated_at = $3 WHERE id = ANY($1) RETURNING {}), \
             timeline AS (\
             INSERT INTO homing_job_history (job_id, at, kind, state, epoch, worker, attempts, \
             crashes) \
             SELECT id, $3, $4, state, epoch, worker, {} FROM started), \
             trimmed AS ({}) \
             SELECT * FROM started",
            columns(""),
            entry_counters!(),
            trim_sql("(SELECT id FROM started)", "$5"),
        );
        for r in sqlx::query(AssertSqlSafe(sql))
            .bind(&to_run)
            .bind(worker)
            .bind(now)
            .bind(history::Kind::Started.as_str())
            .bind(history::KEEP_LATEST as i64 - 1)
            .fetch_all(&mut *tx)
            .await?
        {
            let j = row_to_job(&r)?;
            started.insert(j.id, j);
        }
        super::limits::postgres::granted(&mut tx, &grants, now).await?;
    }
    tx.commit().await?;
    decisions
        .into_iter()
        .map(|d| match d {
            Decision::Done(o) => Ok(o),
            Decision::Run(id) => started
                .get(&id)
                .cloned()
                .map(|j| StartOutcome::Run(Box::new(j)))
                .ok_or_else(|| corrupt("start", format!("job {id} was locked but not updated"))),
        })
        .collect()
}

async fn complete_tx(
    pool: &PgPool,
    done: &[Completion],
    now: Micros,
) -> sqlx::Result<Vec<Committed>> {
    let mut tx = begin_keyed(pool).await?;
    let ids: Vec<JobId> = done.iter().map(|c| c.id).collect();
    let limited = lock_ahead_of_jobs(&mut tx, &ids, Fenced::No(Plans::Keyed)).await?;
    let mut jobs = lock_jobs(&mut tx, &ids, Plans::Keyed, &columns("")).await?;
    // Runs of limited queues this batch ends, with their completion's index: each frees a slot.
    let mut released: Vec<(usize, JobId, String)> = Vec::new();
    // The workflows whose step this batch ends, each with the first such completion, which
    // carries the steps made runnable.
    let mut workflows: Vec<(uuid::Uuid, usize)> = Vec::new();
    let mut out = Vec::with_capacity(done.len());
    // Successes are the bulk of every batch: they are written together in one statement.
    let mut ok_ids = Vec::new();
    let mut ok_results = Vec::new();
    let mut follow_ups: Vec<(usize, NewJob)> = Vec::new();
    // Written after every update of the batch (successes are written last, together), in the
    // order of the completions, as one by one would.
    let mut with_event: Vec<JobId> = Vec::new();
    // Every applied completion records its epoch (`Store::last_completion`).
    let mut applied: Vec<JobId> = Vec::new();
    // Their timeline entries, written together in one statement.
    let mut log: Vec<(JobId, history::Entry)> = Vec::new();
    for c in done {
        let Some(job) = jobs.get_mut(&c.id) else {
            out.push(Committed::Stale);
            continue;
        };
        if !transition::fence_holds(job, c.epoch) {
            out.push(Committed::Stale);
            continue;
        }
        let change = transition::complete(&c.outcome);
        match &c.outcome {
            Outcome::Succeeded(v) => {
                ok_ids.push(job.id);
                ok_results.push(to_json(v));
            }
            _ => {
                write_change(&mut tx, job.id, "", &change, now).await?;
            }
        }
        let mut dispatch = Vec::new();
        if change.republish {
            dispatch.push(ToPublish {
                id: job.id,
                queue: job.queue.clone(),
                priority: job.priority,
            });
        }
        let fx = transition::effects(job, &change, now);
        if fx.event {
            with_event.push(job.id);
        }
        if let Some(f) = fx.follow_up {
            follow_ups.push((out.len(), f));
        }
        applied.push(job.id);
        let e = history::changed(
            &change.apply(job, now),
            &change,
            Cause::Completion,
            ran_under(job),
            now,
        );
        log.push((job.id, e));
        if limited.contains_key(&job.queue) {
            released.push((out.len(), job.id, job.queue.clone()));
        }
        if let (true, Some(link)) = (change.state.is_terminal(), &job.workflow) {
            if !workflows.iter().any(|(w, _)| *w == link.id) {
                workflows.push((link.id, out.len()));
            }
        }
        // A second completion of the same run in this batch must find it no longer running.
        *job = change.apply(job, now);
        out.push(Committed::Applied {
            state: change.state,
            dispatch,
        });
    }
    // The batch's timeline entries ride in the successes' statement when there is one (they
    // depend on nothing it writes): one round trip fewer for most batches.
    if ok_ids.is_empty() {
        write_history(&mut tx, &log).await?;
    } else {
        let update = sqlx::query(
            "WITH succeeded AS (\
             UPDATE homing_jobs j SET state = 'succeeded', result = u.result, error = NULL, \
             finished_at = $3, updated_at = $3, completed_epoch = j.epoch \
             FROM UNNEST($1::uuid[], $2::text[]) AS u(id, result) WHERE j.id = u.id) \
             INSERT INTO homing_job_history (job_id, at, kind, state, epoch, worker, attempts, \
             crashes, message, data) \
             SELECT * FROM UNNEST($4::uuid[], $5::int8[], $6::text[], $7::text[], $8::int8[], \
                                  $9::text[], $10::int4[], $11::int4[], $12::text[], $13::text[])",
        )
        .bind(&ok_ids)
        .bind(&ok_results)
        .bind(now);
        TimelineRows::new(&log)
            .bind(update)
            .execute(&mut *tx)
            .await?;
    }
    // Successes recorded their epoch in their own statement: a second update of the same rows
    // would write each a second row version and fire the count trigger again.
    let ok: std::collections::HashSet<&JobId> = ok_ids.iter().collect();
    let rest: Vec<JobId> = applied
        .iter()
        .filter(|id| !ok.contains(id))
        .copied()
        .collect();
    if !rest.is_empty() {
        sqlx::query("UPDATE homing_jobs SET completed_epoch = epoch WHERE id = ANY($1)")
            .bind(&rest)
            .execute(&mut *tx)
            .await?;
    }
    for id in with_event {
        terminal_event(&mut tx, id, now).await?;
    }
    // Follow-ups and workflows leave the ids' path: see unkey.
    if !follow_ups.is_empty() || !workflows.is_empty() {
        unkey(&mut tx).await?;
    }
    if !follow_ups.is_empty() {
        let new: Vec<NewJob> = follow_ups.iter().map(|(_, j)| j.clone()).collect();
        let inserted = insert_jobs(&mut tx, &new).await?;
        for ((idx, job), ins) in follow_ups.iter().zip(inserted) {
            if let (true, Committed::Applied { dispatch, .. }) =
                (ins.needs_dispatch(), &mut out[*idx])
            {
                dispatch.push(ToPublish {
                    id: ins.id,
                    queue: ins.queue,
                    priority: job.options.priority.unwrap_or(0),
                });
            }
        }
    }
    workflows.sort();
    for (wf, idx) in workflows {
        let ready = settle_tx(&mut tx, wf, now).await?;
        if let Committed::Applied { dispatch, .. } = &mut out[idx] {
            dispatch.extend(ready);
        }
    }
    for (idx, id, queue) in released {
        let Some(l) = limited.get(&queue) else {
            continue;
        };
        let next =
            super::limits::postgres::unpark_after_release(&mut tx, id, &queue, l, now).await?;
        if let (Some(next), Committed::Applied { dispatch, .. }) = (next, &mut out[idx]) {
            dispatch.push(next);
        }
    }
    tx.commit().await?;
    Ok(out)
}

async fn mark_lost_tx(
    pool: &PgPool,
    id: JobId,
    worker: &str,
    presumed: bool,
    now: Micros,
) -> sqlx::Result<(Lost, Option<ToPublish>)> {
    let mut tx = pool.begin().await?;
    let limited = lock_ahead_of_jobs(&mut tx, &[id], Fenced::No(Plans::Own)).await?;
    // The row lock is what makes concurrent rescuers count one crash: the second one waits here
    // and then sees the job no longer running under `worker`.
    let Some(job) = get_job(&mut tx, id, true).await? else {
        return Ok((Lost::Missing, None));
    };
    // What ran when the worker was first presumed dead (Store::presume_lost): a run that was
    // not among it began afterwards.
    let after = presumed
        && sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM homing_workers WHERE id = $1 \
             AND presumed_dead_at IS NOT NULL) AND NOT EXISTS (SELECT 1 FROM \
             homing_worker_presumed_runs WHERE worker = $1 AND job = $2 AND epoch = $3)",
        )
        .bind(worker)
        .bind(id)
        .bind(job.epoch.min(i64::MAX as u64) as i64)
        .fetch_one(&mut *tx)
        .await?;
    let lost = match transition::lost(&job, worker, after) {
        transition::Lost::NotOwned(state) => return Ok((Lost::NotOwned(state), None)),
        transition::Lost::Reclaimed(change) => {
            transit(&mut tx, &job, &change, Cause::Lost { worker }, now).await?;
            // Its slot is free: the next parked job goes to the caller to publish.
            let unparked = match limited.get(&job.queue) {
                Some(l) => {
                    super::limits::postgres::unpark_after_release(&mut tx, id, &job.queue, l, now)
                        .await?
                }
                None => None,
            };
            sqlx::query(
                "INSERT INTO homing_worker_reclaims (worker, job, epoch, outcome, at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            )
            .bind(worker)
            .bind(id)
            .bind(job.epoch.min(i64::MAX as u64) as i64)
            .bind(ReclaimOutcome::after(change.state).as_str())
            .bind(now)
            .execute(&mut *tx)
            .await?;
            let lost = match change.state {
                JobState::Dead => Lost::Dead,
                JobState::Cancelled => Lost::Cancelled,
                _ => Lost::Requeued,
            };
            (lost, unparked)
        }
    };
    tx.commit().await?;
    Ok(lost)
}

type WorkerRow = (String, i64, String, Option<i64>, Option<i64>);

/// Workers' rows with their running jobs and reclaims, read in the caller's snapshot.
async fn worker_records(
    tx: &mut PgConnection,
    rows: Vec<WorkerRow>,
) -> sqlx::Result<Vec<WorkerRecord>> {
    let mut out = Vec::with_capacity(rows.len());
    for (info, last_seen, status, ended_at, presumed_dead_at) in rows {
        let info: WorkerInfo = serde_json::from_str(&info).map_err(|e| corrupt("worker", e))?;
        out.push(WorkerRecord {
            status: WorkerStatus::read(&status, &info.id),
            info,
            last_seen,
            running: Vec::new(),
            ended_at,
            presumed_dead_at,
            reclaimed: Vec::new(),
        });
    }
    let ids: Vec<String> = out.iter().map(|w| w.info.id.clone()).collect();
    let running: Vec<(JobId, String)> = sqlx::query_as(
        "SELECT id, worker FROM homing_jobs WHERE state = 'running' \
         AND worker = ANY($1) ORDER BY started_at, id",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    // Each worker's newest reclaims, at most RECLAIMS_LISTED each.
    let reclaims: Vec<(String, JobId, i64, String, i64)> = sqlx::query_as(
        "SELECT worker, job, epoch, outcome, at FROM (SELECT r.*, row_number() OVER \
         (PARTITION BY worker ORDER BY at DESC, job) AS n FROM homing_worker_reclaims r \
         WHERE worker = ANY($1)) t WHERE n <= $2 ORDER BY worker, at DESC, job",
    )
    .bind(&ids)
    .bind(crate::reclaim::RECLAIMS_LISTED as i64)
    .fetch_all(&mut *tx)
    .await?;
    let mut by_worker: HashMap<String, Vec<JobId>> = HashMap::new();
    for (id, w) in running {
        by_worker.entry(w).or_default().push(id);
    }
    let mut reclaimed: HashMap<String, Vec<Reclaim>> = HashMap::new();
    for (w, job, epoch, outcome, at) in reclaims {
        // A damaged row is left out of the view rather than failing every worker's listing.
        let Some(outcome) = ReclaimOutcome::read(&outcome) else {
            tracing::warn!(worker = %w, %job, "a reclaim row cannot be read; left out");
            continue;
        };
        reclaimed.entry(w).or_default().push(Reclaim {
            job,
            epoch: epoch.max(0) as u64,
            outcome,
            at,
        });
    }
    for w in &mut out {
        w.running = by_worker.remove(&w.info.id).unwrap_or_default();
        w.reclaimed = reclaimed.remove(&w.info.id).unwrap_or_default();
    }
    Ok(out)
}

fn dispatch_rows(rows: Vec<PgRow>) -> sqlx::Result<Vec<ToPublish>> {
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

/// The stored size in bytes of each result of workflow `wf`'s steps (octet_length takes a
/// stored value's size without fetching it).
async fn result_sizes(
    conn: &mut PgConnection,
    wf: uuid::Uuid,
) -> sqlx::Result<HashMap<JobId, u64>> {
    let sizes: Vec<(JobId, i64)> = sqlx::query_as(
        "SELECT id, octet_length(result)::bigint FROM homing_jobs \
         WHERE workflow_id = $1 AND result IS NOT NULL",
    )
    .bind(wf)
    .fetch_all(&mut *conn)
    .await?;
    Ok(sizes
        .into_iter()
        .map(|(id, n)| (id, n.max(0) as u64))
        .collect())
}

/// The results of `ids`, those that have one and can be read.
async fn results_of(
    conn: &mut PgConnection,
    ids: Vec<JobId>,
) -> sqlx::Result<HashMap<JobId, serde_json::Value>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<(JobId, Option<String>)> =
        sqlx::query_as("SELECT id, result FROM homing_jobs WHERE id = ANY($1)")
            .bind(ids)
            .fetch_all(&mut *conn)
            .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, text)| Some((id, read_json(text.as_deref(), "result", &mut Vec::new())?)))
        .collect())
}

/// The parents column an operator's retry of `job` writes ([`crate::workflow::rerun`]): `None`
/// keeps the row's; `Err` refuses the retry with the reason.
async fn rerun_parents(
    conn: &mut PgConnection,
    job: &Job,
    retrying: &[JobId],
) -> sqlx::Result<std::result::Result<Option<String>, String>> {
    use crate::workflow::Rerun;
    let Some(wf) = crate::workflow::rerun_reads(job) else {
        return Ok(Ok(None));
    };
    let steps = workflow_jobs(conn, wf).await?;
    let sizes = result_sizes(conn, wf).await?;
    Ok(
        match crate::workflow::rerun(job, &steps, &sizes, retrying) {
            Rerun::AsItIs => Ok(None),
            Rerun::Refuse(message) => Err(message),
            Rerun::WithParents(parents) => {
                let results = results_of(conn, parents.values().map(|p| p.id).collect()).await?;
                Ok(Some(to_json(&crate::workflow::with_results(
                    &parents, &results,
                ))))
            }
        },
    )
}

/// An operator's retry of one job inside the caller's transaction, decided by
/// [`transition::operator_retry`]. The outer `Result` is the database's; the inner one the
/// decision's (not found, or refused: nothing written).
async fn retry_in(
    conn: &mut PgConnection,
    id: JobId,
    now: Micros,
    retrying: &[JobId],
) -> sqlx::Result<Result<Job>> {
    let Some(job) = get_job(conn, id, true).await? else {
        return Ok(Err(Error::NotFound(id)));
    };
    if let Err(message) = transition::operator_retry(&job) {
        return Ok(Err(Error::Conflict {
            id,
            state: job.state,
            message: message.into(),
        }));
    }
    let parents = match rerun_parents(conn, &job, retrying).await? {
        Ok(parents) => parents,
        Err(message) => {
            return Ok(Err(Error::Conflict {
                id,
                state: job.state,
                message,
            }))
        }
    };
    sqlx::query(
        "UPDATE homing_jobs SET state = 'queued', dispatched = false, attempts = 0, \
         crashes = 0, cancel_requested = false, worker = NULL, finished_at = NULL, \
         scheduled_at = NULL, parents = coalesce($3, parents), updated_at = $2 WHERE id = $1",
    )
    .bind(id)
    .bind(now)
    .bind(parents)
    .execute(&mut *conn)
    .await?;
    let job = get_job(conn, id, false)
        .await?
        .ok_or_else(|| corrupt("retry", "row vanished"))?;
    write_history(conn, &[(id, history::retried(&job, now))]).await?;
    trim_history(conn, &[id]).await?;
    Ok(Ok(job))
}

/// An operator's cancel of one job inside the caller's transaction (its workflow, if any,
/// already locked), decided by [`transition::cancel`].
async fn cancel_in(conn: &mut PgConnection, id: JobId, now: Micros) -> sqlx::Result<Result<Job>> {
    let Some(job) = get_job(conn, id, true).await? else {
        return Ok(Err(Error::NotFound(id)));
    };
    match transition::cancel(&job) {
        transition::Cancel::Now => {
            transit(conn, &job, &Change::cancelled(), Cause::Other, now).await?;
        }
        transition::Cancel::Request => {
            sqlx::query(
                "UPDATE homing_jobs SET cancel_requested = true, updated_at = $2 WHERE id = $1",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *conn)
            .await?;
            write_history(conn, &[(id, history::cancel_requested(&job, now))]).await?;
        }
        transition::Cancel::Refuse(message) => {
            return Ok(Err(Error::Conflict {
                id,
                state: job.state,
                message: message.into(),
            }))
        }
    }
    let after = get_job(conn, id, false)
        .await?
        .ok_or_else(|| corrupt("cancel", "row vanished"))?;
    Ok(Ok(after))
}

#[async_trait]
impl Store for PgStore {
    /// A commit waits for its WAL flush: several on separate connections flush together.
    fn commits_in_flight(&self) -> usize {
        COMMITS_IN_FLIGHT
    }

    fn kind(&self) -> &'static str {
        BACKEND
    }

    async fn insert(&self, jobs: Vec<NewJob>) -> Result<Vec<Inserted>> {
        let to_admit = self.known_queues.to_admit(&jobs);
        // A batch of known queues without unique jobs or idempotency keys is written by one
        // statement (insert_jobs), which PostgreSQL runs as its own transaction: no BEGIN and
        // COMMIT round trips on the path of every enqueue. A new queue's admission and the
        // unique jobs' locks need a transaction around several statements, and so does a batch
        // with keys: one that meets a stored key reads the stored job after the insert, and if
        // that read failed after a commit of its own, the batch would be answered with an error
        // though its new jobs were stored, and enqueued twice by a producer that retries with
        // fresh ids. (A re-sent id makes the same read, but its producer is retrying already,
        // with the same ids, which find the stored jobs.)
        let one_statement = to_admit.is_none()
            && jobs
                .iter()
                .all(|j| j.options.unique_for.is_none() && j.options.idempotency_key.is_none());
        let out = self
            .call(async {
                if one_statement {
                    let mut conn = self.pool.acquire().await?;
                    return insert_jobs(&mut conn, &jobs).await;
                }
                let mut tx = self.pool.begin().await?;
                if to_admit.is_some() {
                    crate::store::queues::admit_pg(
                        &mut tx,
                        &jobs,
                        self.max_queues,
                        crate::time::now(),
                    )
                    .await?;
                }
                let out = insert_jobs(&mut tx, &jobs).await?;
                tx.commit().await?;
                Ok(out)
            })
            .await?;
        if let Some(names) = to_admit {
            self.known_queues.remember(names);
        }
        Ok(out)
    }

    async fn mark_dispatched(&self, ids: &[JobId]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.call(async {
            // Joined with the ids rather than `id = ANY($1) AND state = 'queued'`, for which the
            // planner may combine the primary key with the state index and, in a large backlog,
            // read every queued job's index entry on each call.
            sqlx::query(
                "WITH l AS (SELECT j.id FROM UNNEST($1::uuid[]) AS u(id) \
                            JOIN homing_jobs j ON j.id = u.id WHERE j.state = 'queued' \
                            ORDER BY j.id FOR UPDATE OF j) \
                 UPDATE homing_jobs j SET dispatched = true FROM l \
                 WHERE j.id = l.id AND j.state = 'queued'",
            )
            .bind(lock_order(ids))
            .execute(&self.pool)
            .await?;
            Ok(())
        })
        .await
    }

    /// As in SQLite, plus a lease: the rows returned get `updated_at` = the wall clock, so a
    /// second reconciler sweeping at the same time (with about the same `before`) skips them
    /// instead of publishing them twice. If the caller dies before publishing, they come back
    /// once `before` passes the lease, i.e. after the reconciler's dispatch grace.
    async fn undispatched(&self, before: Micros, limit: usize) -> Result<Vec<ToPublish>> {
        let lease = crate::time::now();
        self.call(async {
            let rows = sqlx::query(
                "WITH due AS (SELECT id, updated_at FROM homing_jobs \
                              WHERE state = 'queued' AND NOT dispatched AND NOT parked \
                              AND updated_at < $1 \
                              AND NOT EXISTS (SELECT 1 FROM homing_queues q \
                                              WHERE q.name = homing_jobs.queue AND q.paused) \
                              ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 UPDATE homing_jobs j SET updated_at = GREATEST(j.updated_at, $3) FROM due \
                 WHERE j.id = due.id RETURNING j.id, j.queue, due.updated_at, j.priority",
            )
            .bind(before)
            .bind(limit.min(i64::MAX as usize) as i64)
            .bind(lease)
            .fetch_all(&self.pool)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                let was: i64 = r.try_get(2)?;
                out.push((
                    was,
                    ToPublish {
                        id: r.try_get(0)?,
                        queue: r.try_get(1)?,
                        priority: i32::try_from(r.try_get::<i64, _>(3)?).unwrap_or(0),
                    },
                ));
            }
            out.sort_by_key(|(was, d)| (*was, d.id));
            Ok(out.into_iter().map(|(_, d)| d).collect())
        })
        .await
    }

    async fn redispatch_all(&self) -> Result<u64> {
        self.call(async {
            let r = sqlx::query(
                "WITH l AS (SELECT id FROM homing_jobs WHERE state = 'queued' ORDER BY id \
                            FOR UPDATE) \
                 UPDATE homing_jobs j SET dispatched = false, updated_at = 0 FROM l \
                 WHERE j.id = l.id AND j.state = 'queued'",
            )
            .execute(&self.pool)
            .await?;
            Ok(r.rows_affected())
        })
        .await
    }

    async fn start(&self, ids: &[JobId], worker: &str, now: Micros) -> Result<Vec<StartOutcome>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        isolating(
            ids.to_vec(),
            |ids| async move { self.call(start_tx(&self.pool, &ids, worker, now)).await },
            |id| async move {
                let mut v = self.call(start_tx(&self.pool, &[id], worker, now)).await?;
                Ok(v.remove(0))
            },
            |id, e| async move {
                let reason = transition::unstartable_reason(&e);
                tracing::error!(job = %id, error = %e, "a job cannot be started; making it dead");
                if self
                    .call(bury(&self.pool, id, BuryIf::NotStarted, &reason, now))
                    .await?
                {
                    return Ok(StartOutcome::Dead);
                }
                Ok(match self.state_of(id).await? {
                    Some(state) => StartOutcome::Skip(state),
                    None => StartOutcome::Missing,
                })
            },
            |e| StartOutcome::Unstartable(e.to_string()),
        )
        .await
    }

    async fn complete(&self, done: &[Completion], now: Micros) -> Result<Vec<Committed>> {
        if done.is_empty() {
            return Ok(Vec::new());
        }
        isolating(
            done.to_vec(),
            |done| async move { self.call(complete_tx(&self.pool, &done, now)).await },
            |c| async move {
                let mut v = self
                    .call(complete_tx(&self.pool, std::slice::from_ref(&c), now))
                    .await?;
                Ok(v.remove(0))
            },
            |c, e| async move {
                let reason = transition::uncommittable_reason(&e);
                tracing::error!(job = %c.id, error = %e, "an outcome cannot be stored; making the job dead");
                Ok(
                    if self
                        .call(bury(&self.pool, c.id, BuryIf::Fence(c.epoch), &reason, now))
                        .await?
                    {
                        Committed::Applied {
                            state: JobState::Dead,
                            dispatch: Vec::new(),
                        }
                    } else {
                        Committed::Stale
                    },
                )
            },
            |e| Committed::Unstored(e.to_string()),
        )
        .await
    }

    async fn mark_lost_unparking(
        &self,
        id: JobId,
        worker: &str,
        presumed: bool,
        now: Micros,
    ) -> Result<(Lost, Option<ToPublish>)> {
        match self
            .call(mark_lost_tx(&self.pool, id, worker, presumed, now))
            .await
        {
            Err(e) if !e.is_transient() => {
                // The last resort, as for a start: a job whose new state cannot be written
                // (its follow-up refused, say) is made dead, or every sweep stops at it again.
                let reason = transition::unreclaimable_reason(worker, &e);
                tracing::error!(job = %id, %worker, error = %e, "a lost worker's job cannot be reclaimed; making it dead");
                if self
                    .call(bury(&self.pool, id, BuryIf::Owner(worker), &reason, now))
                    .await?
                {
                    return Ok((Lost::Dead, None));
                }
                let lost = match self.state_of(id).await? {
                    Some(state) => Lost::NotOwned(state),
                    None => Lost::Missing,
                };
                Ok((lost, None))
            }
            other => other,
        }
    }

    async fn claim_due(&self, now: Micros, limit: usize) -> Result<Vec<ToPublish>> {
        self.call(async {
            // SKIP LOCKED: a row another scheduler is claiming is left to it. A row it has
            // already claimed and committed fails the re-checked `state = 'scheduled'`.
            let rows = sqlx::query(concat!(
                "WITH due AS (SELECT id FROM homing_jobs \
                              WHERE state = 'scheduled' AND scheduled_at <= $1 \
                              ORDER BY scheduled_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
                 claimed AS (UPDATE homing_jobs j SET state = 'queued', dispatched = false, \
                   updated_at = $1 FROM due WHERE j.id = due.id AND j.state = 'scheduled' \
                   RETURNING j.id, j.queue, j.priority, j.attempts, j.crashes), \
                 logged AS (INSERT INTO homing_job_history (job_id, at, kind, state, attempts, \
                   crashes) SELECT id, $1, $3, 'queued', ",
                entry_counters!(),
                " FROM claimed) SELECT id, queue, priority FROM claimed"
            ))
            .bind(now)
            .bind(limit.min(i64::MAX as usize) as i64)
            .bind(history::Kind::Due.as_str())
            .fetch_all(&self.pool)
            .await?;
            dispatch_rows(rows)
        })
        .await
    }

    async fn set_paused(&self, queue: &str, paused: bool, now: Micros) -> Result<Vec<ToPublish>> {
        self.call(async {
            let mut tx = self.pool.begin().await?;
            crate::store::queues::admit_names_pg(
                &mut tx,
                vec![queue.to_string()],
                self.max_queues,
                now,
            )
            .await?;
            sqlx::query("UPDATE homing_queues SET paused = $2 WHERE name = $1")
                .bind(queue)
                .bind(paused)
                .execute(&mut *tx)
                .await?;
            let out = if paused {
                Vec::new()
            } else {
                // Every queued job of the queue is published again, not only the parked ones: a
                // producer's late `mark_dispatched` can overwrite a park's `dispatched = false`
                // (the worker parked the job before its producer marked it), leaving a queued
                // job with no message. A second message for a job is harmless (the start's
                // idempotency guard skips it). Not locked: a start parking one of these at the
                // same moment only makes it undispatched again, and the reconciler publishes it.
                sqlx::query(
                    "UPDATE homing_jobs SET dispatched = false, parked = false WHERE queue = $1 \
                     AND state = 'queued' AND (dispatched OR parked)",
                )
                .bind(queue)
                .execute(&mut *tx)
                .await?;
                let rows = sqlx::query(
                    "SELECT id, queue, priority FROM homing_jobs WHERE queue = $1 AND state = 'queued' \
                     AND NOT dispatched ORDER BY id LIMIT $2",
                )
                .bind(queue)
                .bind(crate::store::RESUME_PUBLISH_LIMIT as i64)
                .fetch_all(&mut *tx)
                .await?;
                dispatch_rows(rows)?
            };
            tx.commit().await?;
            Ok(out)
        })
        .await
    }

    async fn queue_settings(&self) -> Result<Vec<QueueSettings>> {
        self.call(async {
            let mut c = self.pool.acquire().await?;
            super::limits::postgres::settings(&mut c).await
        })
        .await
    }

    async fn set_limits(
        &self,
        queue: &str,
        limits: &crate::limit::QueueLimits,
        now: Micros,
    ) -> Result<Vec<ToPublish>> {
        limits.check().map_err(Error::Invalid)?;
        self.call(async {
            let mut tx = self.pool.begin().await?;
            crate::store::queues::admit_names_pg(
                &mut tx,
                vec![queue.to_string()],
                self.max_queues,
                now,
            )
            .await?;
            let out = super::limits::postgres::set(&mut tx, queue, limits, now).await?;
            tx.commit().await?;
            Ok(out)
        })
        .await
    }

    async fn unpark_ready(&self, now: Micros, limit: usize) -> Result<Vec<ToPublish>> {
        self.call(async {
            let mut tx = self.pool.begin().await?;
            let (mut out, queues) =
                super::limits::postgres::unpark_unheld(&mut tx, now, limit).await?;
            tx.commit().await?;
            for q in queues {
                let left = limit.saturating_sub(out.len());
                if left == 0 {
                    break;
                }
                let mut tx = self.pool.begin().await?;
                // A start holds the queue's row for milliseconds; one stuck mid-transaction (its
                // process paused) holds it until its session is ended. This pass, which also
                // fires the periodic schedules, leaves such a queue for the next one rather than
                // wait, so one stuck queue holds up neither the other queues nor the schedules.
                set_lock_timeout(&mut tx, UNPARK_LOCK_WAIT).await?;
                match super::limits::postgres::unpark_queue(&mut tx, &q, now, left).await {
                    Ok(unparked) => {
                        tx.commit().await?;
                        out.extend(unparked);
                    }
                    Err(e) if lock_not_available(&e) => {
                        tx.rollback().await?;
                        tracing::warn!(queue = %q, "a limited queue's row is held by a transaction that does not end (a process paused mid-start?); unparking its jobs at the next pass");
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        })
        .await
    }

    async fn running(&self, limit: usize) -> Result<Vec<(JobId, String, Micros)>> {
        self.call(async {
            let rows = sqlx::query(
                "SELECT id, worker, started_at FROM homing_jobs WHERE state = 'running' \
                 ORDER BY started_at LIMIT $1",
            )
            .bind(limit.min(i64::MAX as usize) as i64)
            .fetch_all(&self.pool)
            .await?;
            rows.iter()
                .map(|r| {
                    Ok((
                        r.try_get(0)?,
                        r.try_get::<Option<String>, _>(1)?.unwrap_or_default(),
                        r.try_get::<Option<i64>, _>(2)?.unwrap_or(0),
                    ))
                })
                .collect()
        })
        .await
    }

    async fn running_under(&self, worker: &str, limit: usize) -> Result<Vec<RunningUnder>> {
        self.call(async {
            let rows: Vec<(JobId, Option<i64>, Option<i64>)> = sqlx::query_as(
                "SELECT id, epoch, started_at FROM homing_jobs WHERE state = 'running' \
                 AND worker = $1 ORDER BY started_at LIMIT $2",
            )
            .bind(worker)
            .bind(limit.min(i64::MAX as usize) as i64)
            .fetch_all(&self.pool)
            .await?;
            Ok(rows
                .into_iter()
                .map(|(id, epoch, started_at)| RunningUnder {
                    id,
                    epoch: epoch.unwrap_or(0).max(0) as u64,
                    started_at: started_at.unwrap_or(0),
                })
                .collect())
        })
        .await
    }

    async fn last_completion(&self, id: JobId) -> Result<Option<CompletionState>> {
        let row: Option<(Option<String>, Option<i64>, Option<i64>)> = self
            .call(async {
                sqlx::query_as(
                    "SELECT state, epoch, completed_epoch FROM homing_jobs WHERE id = $1",
                )
                .bind(id)
                .fetch_optional(&self.pool)
                .await
            })
            .await?;
        Ok(row.map(|(state, epoch, done)| CompletionState {
            state: read_state(state.as_deref(), &mut Vec::new()),
            epoch: epoch.unwrap_or(0).max(0) as u64,
            completed_epoch: done.map(|e| e.max(0) as u64),
        }))
    }

    async fn worker_info(&self, id: &str) -> Result<Option<WorkerInfo>> {
        let info: Option<String> = self
            .call(async {
                sqlx::query_scalar("SELECT info FROM homing_workers WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await
            })
            .await?;
        info.map(|t| {
            serde_json::from_str(&t).map_err(|e| Error::Backend {
                backend: BACKEND,
                message: format!("worker {id}'s stored info cannot be read: {e}"),
                source: None,
            })
        })
        .transpose()
    }

    async fn set_progress(
        &self,
        id: JobId,
        epoch: u64,
        progress: serde_json::Value,
    ) -> Result<bool> {
        let now = crate::time::now();
        self.call(async {
            let mut tx = self.pool.begin().await?;
            let value = to_json(&progress);
            let r = sqlx::query(
                "UPDATE homing_jobs SET progress = $3 WHERE id = $1 AND epoch = $2 \
                 AND state = 'running'",
            )
            .bind(id)
            .bind(epoch as i64)
            .bind(&value)
            .execute(&mut *tx)
            .await?;
            if r.rows_affected() != 1 {
                return Ok(false);
            }
            // A new entry while the run has fewer than PROGRESS_PER_RUN; else the run's last
            // progress entry takes the new value (docs/timeline.md).
            let updated = sqlx::query(
                "UPDATE homing_job_history SET data = $3, at = $4 WHERE id = (SELECT max(id) \
                 FROM homing_job_history WHERE job_id = $1 AND epoch = $2 AND kind = 'progress' \
                 HAVING count(*) >= $5)",
            )
            .bind(id)
            .bind(epoch as i64)
            .bind(&value)
            .bind(now)
            .bind(history::PROGRESS_PER_RUN as i64)
            .execute(&mut *tx)
            .await?;
            if updated.rows_affected() == 0 {
                sqlx::query(concat!(
                    "INSERT INTO homing_job_history (job_id, at, kind, state, epoch, worker, \
                     attempts, crashes, data) SELECT id, $2, 'progress', 'running', epoch, \
                     worker, ",
                    entry_counters!(),
                    ", $3 FROM homing_jobs WHERE id = $1"
                ))
                .bind(id)
                .bind(now)
                .bind(&value)
                .execute(&mut *tx)
                .await?;
                trim_history(&mut tx, &[id]).await?;
            }
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    async fn history(&self, id: JobId) -> Result<history::History> {
        self.call(async {
            let rows = sqlx::query(
                "SELECT at, kind, state, epoch, worker, attempts, crashes, message, data \
                 FROM homing_job_history WHERE job_id = $1 ORDER BY id",
            )
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
            let entries = rows.iter().map(row_to_entry).collect::<sqlx::Result<_>>()?;
            Ok(history::History::from_entries(entries))
        })
        .await
    }

    async fn mark_dead(&self, id: JobId, reason: &str, now: Micros) -> Result<bool> {
        self.call(async {
            let mut tx = self.pool.begin().await?;
            lock_workflows_of(&mut tx, &[id]).await?;
            let Some(job) = get_job(&mut tx, id, true).await? else {
                return Ok(false);
            };
            if job.state.is_terminal() {
                return Ok(false);
            }
            transit(
                &mut tx,
                &job,
                &Change::dead(reason.to_string()),
                Cause::Other,
                now,
            )
            .await?;
            tx.commit().await?;
            Ok(true)
        })
        .await
    }

    async fn get(&self, id: JobId) -> Result<Option<Job>> {
        self.call(async {
            let mut conn = self.pool.acquire().await?;
            get_job(&mut conn, id, false).await
        })
        .await
    }

    async fn get_by_key(&self, key: &str) -> Result<Option<Job>> {
        self.call(async {
            let sql = format!(
                "SELECT {} FROM homing_jobs WHERE idempotency_key = $1",
                columns("")
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(key)
                .fetch_optional(&self.pool)
                .await?
                .as_ref()
                .map(row_to_job)
                .transpose()
        })
        .await
    }

    async fn search(
        &self,
        search: &crate::search::JobSearch,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<JobPage> {
        let cursor = match cursor {
            Some(c) => Some(
                c.parse::<JobId>()
                    .map_err(|_| Error::Invalid(format!("invalid cursor '{c}'")))?,
            ),
            None => None,
        };
        let limit = limit.clamp(1, 1000);
        self.call(async {
            // Parameters are numbered in the order they are bound below.
            // The matching ids and their stored sizes first (octet_length reads a value's size
            // without fetching it when it is stored apart), then the rows the page holds, both
            // in one snapshot so the sizes are the rows'.
            let mut sql = format!("SELECT id, {STORED_BYTES} FROM homing_jobs WHERE true");
            let mut n = 0;
            let mut next = || {
                n += 1;
                n
            };
            let texts: Vec<String> = [
                ("state", search.state.map(|s| s.as_str().to_string())),
                ("queue", search.queue.clone()),
                ("task", search.task.clone()),
            ]
            .into_iter()
            .filter_map(|(col, v)| v.inspect(|_| sql += &format!(" AND {col} = ${}", next())))
            .collect();
            if search.id_range.is_some() {
                sql += &format!(" AND id >= ${} AND id <= ${}", next(), next());
            }
            if search.created_from.is_some() {
                sql += &format!(" AND created_at >= ${}", next());
            }
            if search.created_to.is_some() {
                sql += &format!(" AND created_at < ${}", next());
            }
            let path = search.postgres_path();
            if path.is_some() && search.args_value.is_some() {
                // `json`, not `jsonb`: its `#>` returns the element's text as stored (serde_json's
                // compact form) and accepts an escaped NUL; homing_json_at (migration 0013) turns
                // a damaged row into no match instead of an error for the whole search.
                sql += &format!(" AND homing_json_at(args, ${}) = ${}", next(), next());
            }
            if search.args_contains.is_some() {
                sql += &format!(" AND strpos(args, ${}) > 0", next());
            }
            if cursor.is_some() {
                sql += &format!(" AND id < ${}", next());
            }
            sql += &format!(" ORDER BY id DESC LIMIT {}", limit + 1);
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for t in &texts {
                q = q.bind(t);
            }
            if let Some((lo, hi)) = search.id_range {
                q = q.bind(lo).bind(hi);
            }
            if let Some(f) = search.created_from {
                q = q.bind(f);
            }
            if let Some(t) = search.created_to {
                q = q.bind(t);
            }
            if let (Some(p), Some(v)) = (&path, &search.args_value) {
                q = q.bind(p).bind(v);
            }
            if let Some(sub) = &search.args_contains {
                q = q.bind(sub);
            }
            if let Some(c) = cursor {
                q = q.bind(c);
            }
            // The args predicates read every row of the filter: a search can run long, and its
            // client may leave before it ends.
            let mut conn = CloseIfAbandoned::new(self.pool.acquire().await?);
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(&mut *tx)
                .await?;
            let sized: Vec<(JobId, i64)> = q
                .try_map(|r: PgRow| Ok((r.try_get(0)?, r.try_get(1)?)))
                .fetch_all(&mut *tx)
                .await?;
            let mut fill = PageFill::new(limit);
            let ids: Vec<JobId> = sized
                .iter()
                .take_while(|(_, bytes)| fill.take(usize::try_from(*bytes).unwrap_or(usize::MAX)))
                .map(|(id, _)| *id)
                .collect();
            let more = ids.len() < sized.len();
            let sql = format!(
                "SELECT {} FROM homing_jobs WHERE id = ANY($1) ORDER BY id DESC",
                columns("")
            );
            let jobs = sqlx::query(AssertSqlSafe(sql))
                .bind(ids)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(row_to_job)
                .collect::<sqlx::Result<Vec<Job>>>()?;
            tx.commit().await?;
            conn.done();
            Ok(JobPage::new(jobs, more))
        })
        .await
    }

    async fn retry(&self, id: JobId, now: Micros) -> Result<Job> {
        self.call(async {
            let mut tx = self.pool.begin().await?;
            // Its workflow first, as every writer of a workflow's steps: the parents a step
            // that never ran is given are read under it.
            lock_workflows_of(&mut tx, &[id]).await?;
            let out = retry_in(&mut tx, id, now, &[id]).await?;
            if out.is_ok() {
                tx.commit().await?;
            }
            Ok(out)
        })
        .await?
    }

    async fn cancel(&self, id: JobId, now: Micros) -> Result<Job> {
        self.call(async {
            let mut tx = self.pool.begin().await?;
            lock_workflows_of(&mut tx, &[id]).await?;
            let out = cancel_in(&mut tx, id, now).await?;
            if out.is_ok() {
                tx.commit().await?;
            }
            Ok(out)
        })
        .await?
    }

    async fn retry_many(&self, ids: &[JobId], now: Micros) -> Result<Vec<ToPublish>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // Set-wise, as `retry_in` per row: the step's rows locked in id order in one
        // statement, each decided by `operator_retry`, the admitted ones reset in one
        // statement. Two round trips per step instead of three per job. Read light: a step of
        // 500 jobs of 1 MiB args would otherwise hold half a gigabyte to decide on states.
        self.call(async {
            let mut tx = self.pool.begin().await?;
            lock_workflows_of(&mut tx, ids).await?;
            let locked = lock_jobs(&mut tx, ids, Plans::Own, &light_columns()).await?;
            let admitted: Vec<&Job> = lock_order(ids)
                .iter()
                .filter_map(|id| locked.get(id))
                .filter(|j| transition::operator_retry(j).is_ok())
                .collect();
            // A workflow step with parents may need them given (workflow::rerun): one by one,
            // as a single retry, in the same transaction (its row is locked already).
            let (steps, plain): (Vec<&Job>, Vec<&Job>) = admitted
                .into_iter()
                .partition(|j| j.workflow.as_ref().is_some_and(|l| !l.after.is_empty()));
            let mut done: Vec<ToPublish> = Vec::new();
            for j in steps {
                if let Ok(job) = retry_in(&mut tx, j.id, now, ids).await? {
                    done.push(job.into());
                }
            }
            let take: Vec<JobId> = plain.iter().map(|j| j.id).collect();
            if take.is_empty() {
                tx.commit().await?;
                done.sort_by_key(|p| p.id);
                return Ok(done);
            }
            let sql = format!(
                "UPDATE homing_jobs SET state = 'queued', dispatched = false, attempts = 0, \
                 crashes = 0, cancel_requested = false, worker = NULL, finished_at = NULL, \
                 scheduled_at = NULL, updated_at = $2 WHERE id = ANY($1) RETURNING {}",
                light_columns()
            );
            let out = sqlx::query(AssertSqlSafe(sql))
                .bind(&take)
                .bind(now)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(row_to_job)
                .collect::<sqlx::Result<Vec<Job>>>()?;
            let entries: Vec<_> = out
                .iter()
                .map(|j| (j.id, history::retried(j, now)))
                .collect();
            write_history(&mut tx, &entries).await?;
            trim_history(&mut tx, &take).await?;
            tx.commit().await?;
            let mut out: Vec<ToPublish> = out.into_iter().map(ToPublish::from).collect();
            out.extend(done);
            out.sort_by_key(|p| p.id);
            Ok(out)
        })
        .await
    }

    async fn cancel_many(&self, ids: &[JobId], now: Micros) -> Result<Vec<ToPublish>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.call(async {
            let mut tx = self.pool.begin().await?;
            lock_workflows_of(&mut tx, ids).await?;
            let mut out = Vec::with_capacity(ids.len());
            // One job's args and result held at a time, not the step's.
            for id in lock_order(ids) {
                if let Ok(job) = cancel_in(&mut tx, id, now).await? {
                    out.push(job.into());
                }
            }
            tx.commit().await?;
            Ok(out)
        })
        .await
    }

    async fn cancel_requested(&self, ids: &[JobId]) -> Result<Vec<JobId>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let found: HashSet<JobId> = self
            .call(async {
                sqlx::query_scalar(
                    "SELECT id FROM homing_jobs WHERE id = ANY($1) AND cancel_requested \
                     AND state = 'running'",
                )
                .bind(lock_order(ids))
                .fetch_all(&self.pool)
                .await
            })
            .await?
            .into_iter()
            .collect();
        // In the caller's order, as one lookup per id would give.
        let mut seen = HashSet::new();
        Ok(ids
            .iter()
            .filter(|id| found.contains(id) && seen.insert(**id))
            .copied()
            .collect())
    }

    async fn create_workflow(&self, wf: NewWorkflow) -> Result<Vec<Inserted>> {
        self.call(async {
            let mut tx = self.pool.begin().await?;
            let jobs: Vec<NewJob> = wf.steps.iter().map(|(j, _)| j.clone()).collect();
            crate::store::queues::admit_pg(&mut tx, &jobs, self.max_queues, crate::time::now())
                .await?;
            sqlx::query("INSERT INTO homing_workflows (id, name, created_at) VALUES ($1, $2, $3)")
                .bind(wf.id)
                .bind(&wf.name)
                .bind(wf.created_at)
                .execute(&mut *tx)
                .await?;
            let mut out = insert_jobs(&mut tx, &jobs).await?;
            let ids: Vec<JobId> = wf.steps.iter().map(|(j, _)| j.id).collect();
            let links: Vec<String> = wf.steps.iter().map(|(_, l)| to_json(l)).collect();
            let waiting: Vec<bool> = wf.steps.iter().map(|(_, l)| !l.after.is_empty()).collect();
            sqlx::query(
                "UPDATE homing_jobs j SET workflow_id = $4, workflow = u.link, \
                 state = CASE WHEN u.waiting THEN 'waiting' ELSE j.state END \
                 FROM UNNEST($1::uuid[], $2::text[], $3::bool[]) AS u(id, link, waiting) \
                 WHERE j.id = u.id",
            )
            .bind(&ids)
            .bind(&links)
            .bind(&waiting)
            .bind(wf.id)
            .execute(&mut *tx)
            .await?;
            for (ins, w) in out.iter_mut().zip(&waiting) {
                if *w {
                    ins.state = JobState::Waiting;
                }
            }
            // Their enqueue entries were written as `queued` by `insert_jobs`.
            sqlx::query(
                "UPDATE homing_job_history h SET state = 'waiting' \
                 FROM UNNEST($1::uuid[], $2::bool[]) AS u(id, waiting) \
                 WHERE h.job_id = u.id AND u.waiting",
            )
            .bind(&ids)
            .bind(&waiting)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(out)
        })
        .await
    }

    async fn workflow(&self, id: crate::workflow::WorkflowId) -> Result<Option<Workflow>> {
        self.call(async {
            let mut conn = self.pool.acquire().await?;
            read_workflow(&mut conn, id).await
        })
        .await
    }

    async fn workflows(&self, cursor: Option<&str>, limit: usize) -> Result<WorkflowPage> {
        let cursor = match cursor {
            Some(c) => Some(
                c.parse::<crate::workflow::WorkflowId>()
                    .map_err(|_| Error::Invalid(format!("invalid cursor '{c}'")))?,
            ),
            None => None,
        };
        let limit = limit.clamp(1, 200);
        self.call(async {
            let mut conn = self.pool.acquire().await?;
            let ids: Vec<uuid::Uuid> = sqlx::query_scalar(
                "SELECT id FROM homing_workflows WHERE $1::uuid IS NULL OR id < $1 \
                 ORDER BY id DESC LIMIT $2",
            )
            .bind(cursor)
            .bind(limit as i64 + 1)
            .fetch_all(&mut *conn)
            .await?;
            let more = ids.len() > limit;
            let mut workflows = Vec::new();
            for id in ids.into_iter().take(limit) {
                if let Some(w) = read_workflow(&mut conn, id).await? {
                    workflows.push(w);
                }
            }
            Ok(WorkflowPage::new(workflows, more))
        })
        .await
    }

    async fn cancel_workflow(
        &self,
        id: crate::workflow::WorkflowId,
        now: Micros,
    ) -> Result<Option<Workflow>> {
        self.call(async {
            let mut tx = self.pool.begin().await?;
            let found: Option<uuid::Uuid> = sqlx::query_scalar(
                "UPDATE homing_workflows SET cancelled_at = COALESCE(cancelled_at, $2) \
                 WHERE id = $1 RETURNING id",
            )
            .bind(id)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
            if found.is_none() {
                return Ok(None);
            }
            let ids: Vec<JobId> =
                sqlx::query_scalar("SELECT id FROM homing_jobs WHERE workflow_id = $1")
                    .bind(id)
                    .fetch_all(&mut *tx)
                    .await?;
            let jobs = lock_jobs(&mut tx, &ids, Plans::Own, &columns("")).await?;
            // Waiting steps first, without settling: no finaliser may be made runnable by its
            // parents' cancellation.
            for j in lock_order(&ids).iter().filter_map(|i| jobs.get(i)) {
                let change = Change::cancelled();
                if j.state == JobState::Waiting
                    && write_change(&mut tx, j.id, "", &change, now).await?
                {
                    let after = change.apply(j, now);
                    let e = history::changed(&after, &change, Cause::Other, None, now);
                    write_history(&mut tx, &[(j.id, e)]).await?;
                    terminal_event(&mut tx, j.id, now).await?;
                }
            }
            for j in lock_order(&ids).iter().filter_map(|i| jobs.get(i)) {
                if j.state == JobState::Waiting {
                    continue;
                }
                match transition::cancel(j) {
                    transition::Cancel::Now => {
                        transit(&mut tx, j, &Change::cancelled(), Cause::Other, now).await?
                    }
                    transition::Cancel::Request => {
                        sqlx::query(
                            "UPDATE homing_jobs SET cancel_requested = true, updated_at = $2 \
                             WHERE id = $1",
                        )
                        .bind(j.id)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                    }
                    transition::Cancel::Refuse(_) => {}
                }
            }
            let w = read_workflow(&mut tx, id).await?;
            tx.commit().await?;
            Ok(w)
        })
        .await
    }

    async fn wait_enqueued(&self) -> Result<bool> {
        let mut guard = self.listener.lock().await;
        if guard.is_none() {
            let mut l = sqlx::postgres::PgListener::connect_with(&self.pool)
                .await
                .map_err(|e| self.map_err(e))?;
            l.listen(JOBS_CHANNEL).await.map_err(|e| self.map_err(e))?;
            *guard = Some(l);
            // Whatever was signalled while nobody listened (before this process started, or
            // while the connection was down) is lost: the caller looks once now.
            return Ok(true);
        }
        let l = guard.as_mut().expect("connected above");
        match l.recv().await {
            Ok(_) => Ok(true),
            Err(e) => {
                *guard = None;
                Err(self.map_err(e))
            }
        }
    }

    async fn queue_stats(&self) -> Result<Vec<QueueStats>> {
        let rows: Vec<(String, String, i64, i64)> = self
            .call(async {
                // The kept counts are deltas (docs/counts.md): summed here, and the number of
                // rows summed says whether to fold them. COLLATE "C": byte order, as SQLite
                // sorts, whatever the database's locale.
                sqlx::query_as(
                    "SELECT queue, state, sum(n)::bigint, count(*) FROM homing_queue_counts \
                     GROUP BY queue, state HAVING sum(n) <> 0 ORDER BY queue COLLATE \"C\"",
                )
                .fetch_all(&self.pool)
                .await
            })
            .await?;
        let deltas: i64 = rows.iter().map(|r| r.3).sum();
        if deltas > FOLD_AFTER {
            // After the read, which is exact either way: only the next one gets cheaper.
            self.fold_queue_counts().await?;
        }
        Ok(group_counts(rows.into_iter().map(|(q, s, n, _)| (q, s, n))))
    }

    async fn queue_stats_recounted(&self) -> Result<Vec<QueueStats>> {
        let rows: Vec<(String, String, i64)> = self
            .call(async {
                // COLLATE "C": byte order, as SQLite sorts, whatever the database's locale.
                sqlx::query_as(
                    "SELECT queue, state, count(*) FROM homing_jobs GROUP BY queue, state \
                     ORDER BY queue COLLATE \"C\"",
                )
                .fetch_all(&self.pool)
                .await
            })
            .await?;
        Ok(group_counts(rows))
    }

    async fn register_worker(&self, info: &WorkerInfo, now: Micros) -> Result<()> {
        // Sorted, so two workers registering overlapping task lists lock them in one order.
        let mut tasks = info.tasks.clone();
        tasks.sort();
        tasks.dedup();
        self.call(async {
            let mut tx = self.pool.begin().await?;
            sqlx::query(
                "INSERT INTO homing_workers (id, info, started_at, last_seen, status) \
                 VALUES ($1, $2, $3, $4, 'live') \
                 ON CONFLICT (id) DO UPDATE SET info = EXCLUDED.info, \
                 started_at = EXCLUDED.started_at, last_seen = EXCLUDED.last_seen, \
                 status = 'live', ended_at = NULL, presumed_dead_at = NULL",
            )
            .bind(&info.id)
            .bind(to_json(info))
            .bind(info.started_at)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO homing_tasks (name) SELECT t FROM UNNEST($1::text[]) AS t \
                 ORDER BY t COLLATE \"C\" ON CONFLICT DO NOTHING",
            )
            .bind(&tasks)
            .execute(&mut *tx)
            .await?;
            tx.commit().await
        })
        .await
    }

    async fn worker_seen(&self, id: &str, now: Micros) -> Result<()> {
        self.call(async {
            sqlx::query("UPDATE homing_workers SET last_seen = $2, status = 'live' WHERE id = $1")
                .bind(id)
                .bind(now)
                .execute(&self.pool)
                .await
                .map(|_| ())
        })
        .await
    }

    /// The fence ([`FenceKey`], [`begin_presuming`]) waits for the worker's starts in flight,
    /// and the statement after it reads in a snapshot that holds their runs, so every run begun
    /// before the presumption is recorded. It also makes concurrent first calls agree: the
    /// second waits for the first's commit, finds the time set and records nothing. A wait for
    /// a lock that outlasts `fence_wait` (kept under half the statement timeout, so that it,
    /// not the statement timeout, ends the wait) fails with "lock not available" and the
    /// transaction, which has written nothing, is rolled back; the worker is then deferred
    /// unless it was presumed already (a start that came after the presumption, to be refused,
    /// can hold the fence too).
    async fn presume_lost(&self, worker: &str, now: Micros) -> Result<Presumption> {
        let statement = self.options.statement_timeout;
        let wait = if statement.is_zero() {
            self.options.fence_wait
        } else {
            self.options.fence_wait.min(statement / 2)
        };
        let written = async {
            let mut tx = begin_presuming(&self.pool, worker, wait).await?;
            sqlx::query(
                "WITH first AS (UPDATE homing_workers SET presumed_dead_at = GREATEST($2, \
                 (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) \
                 WHERE id = $1 AND presumed_dead_at IS NULL RETURNING id) \
                 INSERT INTO homing_worker_presumed_runs (worker, job, epoch) \
                 SELECT $1, j.id, j.epoch FROM homing_jobs j, first \
                 WHERE j.state = 'running' AND j.worker = $1 ON CONFLICT DO NOTHING",
            )
            .bind(worker)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            tx.commit().await
        };
        self.call(async {
            match written.await {
                Ok(()) => Ok(Presumption::Made),
                Err(e) if lock_not_available(&e) => {
                    let already: bool = sqlx::query_scalar(
                        "SELECT EXISTS (SELECT 1 FROM homing_workers \
                         WHERE id = $1 AND presumed_dead_at IS NOT NULL)",
                    )
                    .bind(worker)
                    .fetch_one(&self.pool)
                    .await?;
                    Ok(if already {
                        Presumption::Made
                    } else {
                        Presumption::Deferred
                    })
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// The row lock the UPDATE takes makes concurrent callers decide one after the other: the
    /// second re-checks `status = 'live'` against the first one's committed row and changes
    /// nothing, so exactly one of them reports the change.
    async fn worker_gone(
        &self,
        id: &str,
        status: WorkerStatus,
        event: Option<NewEvent>,
        now: Micros,
    ) -> Result<bool> {
        if status == WorkerStatus::Live {
            return Err(Error::Invalid("a worker's end is stopped or lost".into()));
        }
        self.call(async {
            let mut tx = self.pool.begin().await?;
            let r = sqlx::query(
                "UPDATE homing_workers SET status = $2, last_seen = GREATEST(last_seen, $3), \
                 ended_at = $3 WHERE id = $1 AND status = 'live'",
            )
            .bind(id)
            .bind(status.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await?;
            let changed = r.rows_affected() == 1;
            if let (true, Some(ev)) = (changed, &event) {
                insert_event(&mut tx, ev, now).await?;
            }
            tx.commit().await?;
            Ok(changed)
        })
        .await
    }

    async fn workers(&self, since: Micros) -> Result<Vec<WorkerRecord>> {
        self.call(async {
            let mut tx = self.pool.begin().await?;
            // One snapshot for every read, so a worker, its running jobs and reclaims agree.
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(&mut *tx)
                .await?;
            let rows: Vec<WorkerRow> = sqlx::query_as(
                "SELECT info, last_seen, status, ended_at, presumed_dead_at FROM homing_workers \
                 WHERE last_seen >= $1 ORDER BY started_at DESC",
            )
            .bind(since)
            .fetch_all(&mut *tx)
            .await?;
            let out = worker_records(&mut tx, rows).await?;
            tx.commit().await?;
            Ok(out)
        })
        .await
    }

    async fn worker(&self, id: &str) -> Result<Option<WorkerRecord>> {
        self.call(async {
            let mut tx = self.pool.begin().await?;
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(&mut *tx)
                .await?;
            let rows: Vec<WorkerRow> = sqlx::query_as(
                "SELECT info, last_seen, status, ended_at, presumed_dead_at FROM homing_workers \
                 WHERE id = $1",
            )
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
            let out = worker_records(&mut tx, rows).await?;
            tx.commit().await?;
            Ok(out.into_iter().next())
        })
        .await
    }

    async fn known_tasks(&self) -> Result<Vec<String>> {
        self.call(async {
            sqlx::query_scalar("SELECT name FROM homing_tasks ORDER BY name COLLATE \"C\"")
                .fetch_all(&self.pool)
                .await
        })
        .await
    }

    async fn finished_between(&self, from: Micros, to: Micros) -> Result<Vec<FinishedCounts>> {
        let rows: Vec<(String, String, i64)> = self
            .call(async {
                // COLLATE "C": byte order, as SQLite sorts, whatever the database's locale.
                sqlx::query_as(
                    "SELECT queue, state, count(*) FROM homing_jobs \
                     WHERE finished_at >= $1 AND finished_at < $2 AND finished_at IS NOT NULL \
                     GROUP BY queue, state ORDER BY queue COLLATE \"C\"",
                )
                .bind(from)
                .bind(to)
                .fetch_all(&self.pool)
                .await
            })
            .await?;
        Ok(group_counts(rows).into_iter().map(Into::into).collect())
    }

    async fn stats_cursor(&self) -> Result<Option<crate::stats::Cursor>> {
        let row: Option<(i64, i64)> = self
            .call(async {
                sqlx::query_as(AssertSqlSafe(stats_sql::read_cursor(Dialect::Postgres)))
                    .fetch_optional(&self.pool)
                    .await
            })
            .await?;
        Ok(row.map(|(closed, live)| crate::stats::Cursor { closed, live }))
    }

    async fn roll_up(&self, from: Micros, to: Micros, closed: Micros) -> Result<()> {
        let (hfrom, hto) = crate::stats::hours_of(from, to);
        self.call(async {
            let mut tx = self.pool.begin().await?;
            // One rollup at a time: two that interleave their replace-by-delete-and-insert
            // would collide on the same keys ("stats" in ASCII).
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(0x0073_7461_7473_i64)
                .execute(&mut *tx)
                .await?;
            for sql in stats_sql::roll_up(Dialect::Postgres).statements() {
                sqlx::query(AssertSqlSafe(sql))
                    .bind(from)
                    .bind(to)
                    .bind(hfrom)
                    .bind(hto)
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(AssertSqlSafe(stats_sql::advance_cursor(Dialect::Postgres)))
                .bind(closed)
                .bind(to)
                .execute(&mut *tx)
                .await?;
            tx.commit().await
        })
        .await
    }

    async fn sample_depth(&self, at: Micros) -> Result<()> {
        // Periodic and off the job path: the place that keeps the deltas few even when nobody
        // reads the queue list.
        self.fold_queue_counts().await?;
        self.call(async {
            let mut tx = self.pool.begin().await?;
            let sql = stats_sql::sample_depth(Dialect::Postgres);
            for (span, step) in [(60_i32, crate::stats::MINUTE), (3600, crate::stats::HOUR)] {
                sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(crate::stats::floor(at, step))
                    .bind(span)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        })
        .await
    }

    async fn stats_rows(
        &self,
        span_secs: i64,
        from: Micros,
        to: Micros,
    ) -> Result<crate::stats::Rows> {
        use crate::stats::{CountRow, DepthRow, LatencyRow, Rows};
        let span = span_secs.clamp(0, i32::MAX as i64) as i32;
        let [counts, latency, depth] = stats_sql::reads(Dialect::Postgres);
        let u = |n: i64| n.max(0) as u64;
        let counts: Vec<(i64, String, i64, i64, i64, i64, i64)> = self
            .call(
                sqlx::query_as(AssertSqlSafe(counts))
                    .bind(span)
                    .bind(from)
                    .bind(to)
                    .fetch_all(&self.pool),
            )
            .await?;
        let latency: Vec<(i64, String, String, i32, i64)> = self
            .call(
                sqlx::query_as(AssertSqlSafe(latency))
                    .bind(span)
                    .bind(from)
                    .bind(to)
                    .fetch_all(&self.pool),
            )
            .await?;
        let depth: Vec<(i64, String, i64)> = self
            .call(
                sqlx::query_as(AssertSqlSafe(depth))
                    .bind(span)
                    .bind(from)
                    .bind(to)
                    .fetch_all(&self.pool),
            )
            .await?;
        Ok(Rows {
            counts: counts
                .into_iter()
                .map(|(at, queue, s, f, d, c, r)| CountRow {
                    at,
                    queue,
                    succeeded: u(s),
                    failed: u(f),
                    dead: u(d),
                    cancelled: u(c),
                    retried: u(r),
                })
                .collect(),
            latency: latency
                .into_iter()
                .map(|(at, queue, kind, bucket, n)| LatencyRow {
                    at,
                    queue,
                    kind,
                    bucket: bucket.into(),
                    n: u(n),
                })
                .collect(),
            depth: depth
                .into_iter()
                .map(|(at, queue, d)| DepthRow {
                    at,
                    queue,
                    depth: u(d),
                })
                .collect(),
        })
    }

    async fn purge(&self, before: Micros, limit: usize) -> Result<Purged> {
        let limit = limit.min(i64::MAX as usize) as i64;
        self.call(async {
            let mut tx = self.pool.begin().await?;
            // Workflows first, each under its row lock (the lock every transaction that may
            // end or revive a step takes first): one whose every step finished before the cut
            // (or whose steps are already gone) is history; one with a step live, or finished
            // after the cut, is kept with all its steps (a waiting step's settling reads them).
            let workflows = sqlx::query(
                "DELETE FROM homing_workflows WHERE id IN (SELECT w.id FROM homing_workflows w \
                 WHERE w.created_at < $1 AND NOT EXISTS (SELECT 1 FROM homing_jobs j \
                 WHERE j.workflow_id = w.id AND (j.state NOT IN \
                 ('succeeded', 'failed', 'dead', 'cancelled') OR j.finished_at >= $1)) \
                 ORDER BY w.created_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
            )
            .bind(before)
            .bind(limit)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            let jobs = sqlx::query(
                "DELETE FROM homing_jobs WHERE id IN (SELECT id FROM homing_jobs j \
                 WHERE finished_at < $1 AND state IN ('succeeded', 'failed', 'dead', 'cancelled') \
                 AND (workflow_id IS NULL OR NOT EXISTS (SELECT 1 FROM homing_workflows w \
                 WHERE w.id = j.workflow_id)) \
                 ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
            )
            .bind(before)
            .bind(limit)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            let events = sqlx::query(
                "DELETE FROM homing_events WHERE id IN (SELECT id FROM homing_events \
                 WHERE dispatched_at IS NOT NULL AND created_at < $1 ORDER BY id LIMIT $2 \
                 FOR UPDATE SKIP LOCKED)",
            )
            .bind(before)
            .bind(limit)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            let mut workers =
                sqlx::query("DELETE FROM homing_workers WHERE status <> 'live' AND last_seen < $1")
                    .bind(before)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            // A departed worker's reclaims go with its row (or, for a consumer that never had
            // one, once they are old).
            workers += sqlx::query(
                "DELETE FROM homing_worker_reclaims r WHERE r.ctid IN (SELECT ctid FROM \
                 homing_worker_reclaims x WHERE x.at < $1 AND NOT EXISTS (SELECT 1 FROM \
                 homing_workers w WHERE w.id = x.worker) LIMIT $2 FOR UPDATE SKIP LOCKED)",
            )
            .bind(before)
            .bind(limit)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            workers += sqlx::query(
                "DELETE FROM homing_worker_presumed_runs r WHERE r.ctid IN (SELECT ctid FROM \
                 homing_worker_presumed_runs x WHERE NOT EXISTS (SELECT 1 FROM \
                 homing_workers w WHERE w.id = x.worker) LIMIT $1 FOR UPDATE SKIP LOCKED)",
            )
            .bind(limit)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            let audit = sqlx::query(
                "DELETE FROM homing_audit WHERE id IN (SELECT id FROM homing_audit \
                 WHERE at < $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)",
            )
            .bind(before)
            .bind(limit)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            let mut stats = 0;
            for sql in stats_sql::purge(Dialect::Postgres) {
                stats += sqlx::query(AssertSqlSafe(sql))
                    .bind(before)
                    .bind(limit)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            }
            tx.commit().await?;
            Ok(Purged {
                jobs,
                events,
                workers,
                audit,
                workflows,
                stats,
            })
        })
        .await
    }

    async fn count(&self, filter: &JobFilter) -> Result<u64> {
        self.call(async {
            // Without a task the kept counts answer (docs/counts.md); a task is not one of
            // their keys, so that filter counts the jobs' task index.
            let mut sql = String::from(if filter.task.is_none() {
                "SELECT coalesce(sum(n), 0)::bigint FROM homing_queue_counts WHERE true"
            } else {
                "SELECT count(*) FROM homing_jobs WHERE true"
            });
            let mut texts: Vec<String> = Vec::new();
            for (col, v) in [
                ("state", filter.state.map(|s| s.as_str().to_string())),
                ("queue", filter.queue.clone()),
                ("task", filter.task.clone()),
            ] {
                if let Some(v) = v {
                    texts.push(v);
                    sql += &format!(" AND {col} = ${}", texts.len());
                }
            }
            let mut q = sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql));
            for t in &texts {
                q = q.bind(t);
            }
            let n = q.fetch_one(&self.pool).await?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }

    async fn delete_finished(&self, ids: &[JobId]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        self.call(async {
            Ok(sqlx::query(
                "DELETE FROM homing_jobs WHERE id = ANY($1) AND workflow_id IS NULL \
                 AND state IN ('succeeded', 'failed', 'dead', 'cancelled')",
            )
            .bind(lock_order(ids))
            .execute(&self.pool)
            .await?
            .rows_affected())
        })
        .await
    }

    async fn record_audit(&self, entry: audit::NewAudit, now: Micros) -> Result<i64> {
        let e = entry.bounded();
        self.call(async {
            sqlx::query_scalar(
                "INSERT INTO homing_audit (at, actor, role, action, target, status, count) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
            )
            .bind(now)
            .bind(&e.actor)
            .bind(&e.role)
            .bind(&e.action)
            .bind(&e.target)
            .bind(i32::from(e.status))
            .bind(e.count.map(|c| i64::try_from(c).unwrap_or(i64::MAX)))
            .fetch_one(&self.pool)
            .await
        })
        .await
    }

    async fn audit(&self, cursor: Option<&str>, limit: usize) -> Result<audit::AuditPage> {
        let cursor = audit::parse_cursor(cursor)?.unwrap_or(i64::MAX);
        let limit = limit.clamp(1, 1000);
        let rows = self
            .call(async {
                sqlx::query(
                    "SELECT id, at, actor, role, action, target, status, count FROM homing_audit \
                     WHERE id < $1 ORDER BY id DESC LIMIT $2",
                )
                .bind(cursor)
                .bind((limit + 1) as i64)
                .fetch_all(&self.pool)
                .await
            })
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let status: i32 = r.try_get("status").map_err(|e| self.map_err(e))?;
            let count: Option<i64> = r.try_get("count").map_err(|e| self.map_err(e))?;
            out.push(audit::AuditEntry {
                id: r.try_get("id").map_err(|e| self.map_err(e))?,
                at: r.try_get("at").map_err(|e| self.map_err(e))?,
                entry: audit::NewAudit {
                    actor: r.try_get("actor").map_err(|e| self.map_err(e))?,
                    role: r.try_get("role").map_err(|e| self.map_err(e))?,
                    action: r.try_get("action").map_err(|e| self.map_err(e))?,
                    target: r.try_get("target").map_err(|e| self.map_err(e))?,
                    status: u16::try_from(status).unwrap_or(0),
                    count: count.map(|c| u64::try_from(c).unwrap_or(0)),
                },
            });
        }
        Ok(audit::AuditPage::cut(out, limit))
    }

    async fn record_event(&self, event: NewEvent, now: Micros) -> Result<i64> {
        self.call(async {
            let mut conn = self.pool.acquire().await?;
            insert_event(&mut conn, &event, now).await
        })
        .await
    }

    async fn fan_out(
        &self,
        subscribers: &[Subscriber],
        limit: usize,
        now: Micros,
    ) -> Result<FanOut> {
        let e = match self
            .call(fan_out_tx(&self.pool, subscribers, limit, None, now))
            .await
        {
            Err(e) if !e.is_transient() => e,
            other => return other,
        };
        // One event's deliveries could not be stored: fan the batch out one event at a time
        // and set aside the one that still fails, so the alerts behind it go out.
        tracing::warn!(error = %e, "fanning out a batch of events failed; trying them one by one");
        let pending: Vec<i64> = self
            .call(async {
                sqlx::query_scalar(
                    "SELECT id FROM homing_events WHERE dispatched_at IS NULL ORDER BY id LIMIT $1",
                )
                .bind(limit.min(i64::MAX as usize) as i64)
                .fetch_all(&self.pool)
                .await
            })
            .await?;
        let mut out = FanOut::default();
        for id in pending {
            match self
                .call(fan_out_tx(&self.pool, subscribers, 1, Some(id), now))
                .await
            {
                Ok(part) => {
                    out.events += part.events;
                    out.dispatch.extend(part.dispatch);
                }
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => {
                    tracing::error!(event_id = id, error = %e, "an event's deliveries cannot be stored; it is set aside undelivered");
                    self.call(async {
                        sqlx::query("UPDATE homing_events SET dispatched_at = $2 WHERE id = $1")
                            .bind(id)
                            .bind(now)
                            .execute(&self.pool)
                            .await
                    })
                    .await?;
                    out.events += 1;
                }
            }
        }
        Ok(out)
    }

    /// Ids come from a sequence, so unlike SQLite's single writer they are not in commit order: an
    /// event with a lower id may commit after a higher one was read. A reader paging by id (not
    /// the dispatcher, which takes every pending row) can therefore miss a late commit.
    async fn events(&self, after: i64, limit: usize) -> Result<Vec<Event>> {
        self.call(async {
            let sql = format!(
                "SELECT {EVENT_COLUMNS} FROM homing_events WHERE id > $1 ORDER BY id LIMIT $2"
            );
            sqlx::query(AssertSqlSafe(sql))
                .bind(after)
                .bind(limit.min(i64::MAX as usize) as i64)
                .fetch_all(&self.pool)
                .await?
                .iter()
                .map(|r| row_to_event(r).map(|(ev, _)| ev))
                .collect()
        })
        .await
    }

    async fn put_schedule(
        &self,
        def: &crate::schedule::ScheduleDef,
        now: Micros,
    ) -> Result<crate::schedule::Schedule> {
        let put = self
            .call(async {
                let mut c = self.pool.acquire().await?;
                super::schedules::postgres::put(&mut c, def, now).await
            })
            .await?;
        put.ok_or_else(|| {
            Error::Invalid(format!(
                "schedule '{}' was set but cannot be read back",
                def.name
            ))
        })
    }

    async fn schedules_page(&self, after: Option<&str>, limit: usize) -> Result<SchedulePage> {
        let limit = limit.max(1);
        self.call(async {
            let mut c = self.pool.acquire().await?;
            super::schedules::postgres::page(&mut c, after, limit).await
        })
        .await
    }

    async fn schedule_heads(&self) -> Result<Vec<crate::schedule::ScheduleHead>> {
        self.call(async {
            let mut c = self.pool.acquire().await?;
            super::schedules::postgres::heads(&mut c).await
        })
        .await
    }

    async fn schedule_changes(&self) -> Result<Option<u64>> {
        self.call(async {
            let mut c = self.pool.acquire().await?;
            super::schedules::postgres::changes(&mut c).await
        })
        .await
        .map(Some)
    }

    async fn schedule(&self, name: &str) -> Result<Option<crate::schedule::Schedule>> {
        self.call(async {
            let mut c = self.pool.acquire().await?;
            super::schedules::postgres::get(&mut c, name).await
        })
        .await
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool> {
        self.call(async {
            let mut c = self.pool.acquire().await?;
            super::schedules::postgres::delete(&mut c, name).await
        })
        .await
    }

    async fn pause_schedule(
        &self,
        name: &str,
        paused: bool,
        now: Micros,
    ) -> Result<Option<crate::schedule::Schedule>> {
        self.call(async {
            let mut c = self.pool.acquire().await?;
            super::schedules::postgres::set_paused(&mut c, name, paused, now).await
        })
        .await
    }

    async fn fire_schedule(
        &self,
        firing: &crate::schedule::Firing,
        now: Micros,
    ) -> Result<Option<Vec<Inserted>>> {
        self.call(async {
            let mut tx = self.pool.begin().await?;
            let out =
                super::schedules::postgres::fire(&mut tx, firing, self.max_queues, now).await?;
            if out.is_some() {
                tx.commit().await?;
            }
            Ok(out)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failover leaves connections on a demoted primary (read-only transactions, 25006) and
    /// I/O errors (58030) pass: both are retried, never taken for a job's bad data.
    #[test]
    fn failover_and_io_errors_are_transient() {
        for code in ["25006", "58030", "40001", "08006", "57P01"] {
            assert!(transient_sqlstate(code), "{code}");
        }
        for code in ["23505", "22P02", "42P01", "25001"] {
            assert!(!transient_sqlstate(code), "{code}");
        }
    }
}
