//! The embedded SQLite database shared by the SQLite store and the SQLite broker: one file, WAL
//! mode, many processes. Why one module: both backends must open the file the same way (pragmas,
//! busy timeout, schema) or a worker and a server on the same file would disagree.
//!
//! rusqlite is synchronous, so every call runs on tokio's blocking pool. Writes take SQLite's
//! write lock up front (`BEGIN IMMEDIATE`) so that two processes never deadlock upgrading a read
//! lock, and wait out each other with a busy timeout instead of failing.

use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};

const BACKEND: &str = "sqlite";

/// How long a write waits for another process's transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

const SCHEMA_VERSION: i64 = 3;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    args TEXT NOT NULL,
    result TEXT,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    crashes INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL DEFAULT 0,
    max_retries INTEGER,
    max_crashes INTEGER NOT NULL,
    retry_policy TEXT,
    time_limit_ms INTEGER,
    idempotency_key TEXT UNIQUE,
    progress TEXT,
    worker TEXT,
    created_at INTEGER NOT NULL,
    scheduled_at INTEGER,
    started_at INTEGER,
    finished_at INTEGER,
    updated_at INTEGER NOT NULL,
    dispatched INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    on_success TEXT,
    on_failure TEXT
);
CREATE INDEX IF NOT EXISTS jobs_state_queue ON jobs(state, queue);
CREATE INDEX IF NOT EXISTS jobs_due ON jobs(scheduled_at) WHERE state = 'scheduled';
CREATE INDEX IF NOT EXISTS jobs_outbox ON jobs(updated_at) WHERE state = 'queued' AND dispatched = 0;
CREATE INDEX IF NOT EXISTS jobs_running ON jobs(worker) WHERE state = 'running';

CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY,
    info TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    last_seen INTEGER NOT NULL,
    status TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (name TEXT PRIMARY KEY);

CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    payload TEXT NOT NULL,
    consumer TEXT,
    reserved_at INTEGER,
    generation INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS messages_ready ON messages(queue, id) WHERE consumer IS NULL;
CREATE INDEX IF NOT EXISTS messages_owned ON messages(consumer) WHERE consumer IS NOT NULL;
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    payload TEXT NOT NULL,
    reason TEXT NOT NULL,
    at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS heartbeats (
    worker TEXT PRIMARY KEY,
    expires_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"#;

/// Version 2: the events outbox (alerts and webhooks), per-job callback URLs, and an index for
/// "finished in the last hour".
const SCHEMA_V2: &str = r#"
ALTER TABLE jobs ADD COLUMN callback_url TEXT;
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs(finished_at) WHERE finished_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    job_id TEXT,
    worker TEXT,
    data TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    dispatched_at INTEGER
);
CREATE INDEX IF NOT EXISTS events_pending ON events(id) WHERE dispatched_at IS NULL;
"#;

/// Version 3: one row per queue name the store has accepted (see `store::queues`): a new name is
/// refused once the limit is reached. Existing queues are registered, so they keep working. The
/// same schema change as the PostgreSQL store's migration `0003_queues.sql`.
const QUEUES_DDL: &str = r#"
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
);
INSERT OR IGNORE INTO queues (name, created_at) SELECT queue, MIN(created_at) FROM jobs GROUP BY queue;
"#;

/// An open database file.
pub struct Db {
    path: PathBuf,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    /// Wakes reservations in this process as soon as a message is published here.
    pub(crate) published: tokio::sync::Notify,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("path", &self.path).finish()
    }
}

/// Waits out another process's write lock in short naps, up to `BUSY_TIMEOUT` in all.
/// SQLite's own timeout handler sleeps 1, 2, 5, 10 … 100 ms between tries, while homing holds
/// the lock for well under a millisecond: with several processes on one file they spent more
/// time asleep than writing.
fn wait_for_lock(tries: i32) -> bool {
    const SHORT: Duration = Duration::from_micros(250);
    const SHORT_TRIES: u32 = 400; // the first 100 ms
    const LONG: Duration = Duration::from_millis(5);
    let tries = tries.max(0) as u32;
    let waited = if tries < SHORT_TRIES {
        SHORT * tries
    } else {
        SHORT * SHORT_TRIES + LONG * (tries - SHORT_TRIES)
    };
    if waited >= BUSY_TIMEOUT {
        return false;
    }
    std::thread::sleep(if tries < SHORT_TRIES { SHORT } else { LONG });
    true
}

fn open_conn(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_handler(Some(wait_for_lock))?;
    // WAL lets readers run beside the one writer; NORMAL syncs at checkpoints, which keeps every
    // committed transaction through a process crash (kill -9), the failure homing is built for.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    Ok(conn)
}

fn map_err(e: rusqlite::Error) -> Error {
    if let rusqlite::Error::ToSqlConversionFailure(inner) = &e {
        if let Some(t) = inner.downcast_ref::<crate::store::queues::TooManyQueues>() {
            return Error::Invalid(t.to_string());
        }
    }
    match &e {
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseBusy
                    | rusqlite::ErrorCode::DatabaseLocked
                    | rusqlite::ErrorCode::CannotOpen
                    | rusqlite::ErrorCode::SystemIoFailure
                    | rusqlite::ErrorCode::DiskFull
            ) =>
        {
            Error::unavailable(BACKEND, e)
        }
        _ => Error::backend(BACKEND, e),
    }
}

impl Db {
    /// Opens (creating if needed) the database at `path` and brings its schema up to date.
    pub fn open(path: impl AsRef<Path>) -> Result<Arc<Db>> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Error::unavailable(BACKEND, format!("cannot create {}: {e}", dir.display()))
                })?;
            }
        }
        let writer = open_conn(&path).map_err(|e| {
            Error::unavailable(BACKEND, format!("cannot open {}: {e}", path.display()))
        })?;
        check_integrity(&writer, &path)?;
        migrate(&writer).map_err(map_err)?;
        Ok(Arc::new(Db {
            path,
            writer: Mutex::new(writer),
            readers: Mutex::new(Vec::new()),
            published: tokio::sync::Notify::new(),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` in one write transaction (all or nothing).
    pub async fn write<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
    {
        let db = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = db.writer.lock().unwrap_or_else(|p| p.into_inner());
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(map_err)?;
            let out = f(&tx).map_err(map_err)?;
            tx.commit().map_err(map_err)?;
            Ok(out)
        })
        .await
        .map_err(|e| Error::backend(BACKEND, format!("database task failed: {e}")))?
    }

    /// Runs `f` on a read connection (a consistent snapshot for the duration of `f` when it
    /// opens a transaction itself; single statements are always consistent).
    pub async fn read<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let db = self.clone();
        tokio::task::spawn_blocking(move || {
            let conn = db.readers.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let conn = match conn {
                Some(c) => c,
                None => open_conn(&db.path).map_err(map_err)?,
            };
            let out = f(&conn).map_err(map_err);
            let mut pool = db.readers.lock().unwrap_or_else(|p| p.into_inner());
            if pool.len() < 8 {
                pool.push(conn);
            }
            out
        })
        .await
        .map_err(|e| Error::backend(BACKEND, format!("database task failed: {e}")))?
    }
}

/// How many of `PRAGMA quick_check`'s findings an error names: the first few say what is wrong,
/// the rest of a badly damaged file would only bury them.
const INTEGRITY_PROBLEMS_SHOWN: u32 = 5;

/// Refuses a damaged file at open. Without this, a file whose pages were overwritten opens
/// fine, the API answers and `/healthz` says 200, while every worker and enqueue that touches a
/// bad page fails — an outage that looks healthy. `quick_check` reads every page once (seconds
/// for a large file, once per process start) and skips only the costly index-content checks.
fn check_integrity(conn: &Connection, path: &Path) -> Result<()> {
    let damaged = |detail: String| {
        Error::backend(
            BACKEND,
            format!(
                "{} is damaged (PRAGMA quick_check): {detail}; restore it from a backup or move it aside",
                path.display()
            ),
        )
    };
    let sql = format!("PRAGMA quick_check({INTEGRITY_PROBLEMS_SHOWN})");
    let found: rusqlite::Result<Vec<String>> = conn
        .prepare(&sql)
        .and_then(|mut stmt| stmt.query_map([], |r| r.get::<_, String>(0))?.collect());
    match found {
        Ok(rows) if rows.len() == 1 && rows[0] == "ok" => Ok(()),
        Ok(rows) => Err(damaged(rows.join("; "))),
        Err(rusqlite::Error::SqliteFailure(f, msg))
            if matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase
            ) =>
        {
            Err(damaged(msg.unwrap_or_else(|| f.to_string())))
        }
        Err(e) => Err(map_err(e)),
    }
}

fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version >= SCHEMA_VERSION {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    // Re-read under the write lock: another process may have migrated meanwhile.
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let mut res = Ok(());
    if version < 1 {
        res = conn.execute_batch(SCHEMA);
    }
    if version < 2 {
        res = res.and_then(|_| conn.execute_batch(SCHEMA_V2));
    }
    if version < 3 {
        res = res.and_then(|_| conn.execute_batch(QUEUES_DDL));
    }
    let res = res.and_then(|_| conn.pragma_update(None, "user_version", SCHEMA_VERSION));
    match res {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Extracts the file path from `sqlite://PATH` (or `sqlite:PATH`).
pub fn path_from_url(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let rest = rest.split('?').next().unwrap_or(rest);
    if rest.is_empty() {
        return None;
    }
    Some(PathBuf::from(rest))
}
