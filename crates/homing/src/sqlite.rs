//! The embedded SQLite database shared by the SQLite store and the SQLite broker: one file, WAL
//! mode, many processes. Why one module: both backends must open the file the same way (pragmas,
//! busy timeout, schema) or a worker and a server on the same file would disagree.
//!
//! rusqlite is synchronous, so every call runs on tokio's blocking pool. Writes take SQLite's
//! write lock up front (`BEGIN IMMEDIATE`) so that two processes never deadlock upgrading a read
//! lock, and wait out each other with a busy timeout instead of failing.

mod doorbell;
mod moved;

use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::schema::{pending, warn_if_newer, Migration};

const BACKEND: &str = "sqlite";

/// How long a write waits for another process's transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Every migration of the embedded database, in order (see [`crate::schema`]). The broker's
/// tables live here too: one file, one schema.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_init",
        sql: include_str!("sqlite/migrations/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "0002_events",
        sql: include_str!("sqlite/migrations/0002_events.sql"),
    },
    Migration {
        version: 3,
        name: "0003_queues",
        sql: include_str!("sqlite/migrations/0003_queues.sql"),
    },
    Migration {
        version: 4,
        name: "0004_remote",
        sql: include_str!("sqlite/migrations/0004_remote.sql"),
    },
    Migration {
        version: 5,
        name: "0005_schedules",
        sql: include_str!("sqlite/migrations/0005_schedules.sql"),
    },
    Migration {
        version: 6,
        name: "0006_limits",
        sql: include_str!("sqlite/migrations/0006_limits.sql"),
    },
    Migration {
        version: 7,
        name: "0007_workflows",
        sql: include_str!("sqlite/migrations/0007_workflows.sql"),
    },
    Migration {
        version: 8,
        name: "0008_queue_limits",
        sql: include_str!("sqlite/migrations/0008_queue_limits.sql"),
    },
    Migration {
        version: 9,
        name: "0009_audit",
        sql: include_str!("sqlite/migrations/0009_audit.sql"),
    },
    Migration {
        version: 10,
        name: "0010_enqueue_checks",
        sql: include_str!("sqlite/migrations/0010_enqueue_checks.sql"),
    },
    Migration {
        version: 11,
        name: "0011_rate_windows",
        sql: include_str!("sqlite/migrations/0011_rate_windows.sql"),
    },
    Migration {
        version: 12,
        name: "0012_stats",
        sql: include_str!("sqlite/migrations/0012_stats.sql"),
    },
    Migration {
        version: 13,
        name: "0013_search",
        sql: include_str!("sqlite/migrations/0013_search.sql"),
    },
    Migration {
        version: 14,
        name: "0014_traceparent",
        sql: include_str!("sqlite/migrations/0014_traceparent.sql"),
    },
    Migration {
        version: 15,
        name: "0015_job_history",
        sql: include_str!("sqlite/migrations/0015_job_history.sql"),
    },
    Migration {
        version: 16,
        name: "0016_worker_reclaims",
        sql: include_str!("sqlite/migrations/0016_worker_reclaims.sql"),
    },
    Migration {
        version: 17,
        name: "0017_queue_counts",
        sql: include_str!("sqlite/migrations/0017_queue_counts.sql"),
    },
    Migration {
        version: 18,
        name: "0018_bulk",
        sql: include_str!("sqlite/migrations/0018_bulk.sql"),
    },
    Migration {
        version: 19,
        name: "0019_prune",
        sql: include_str!("sqlite/migrations/0019_prune.sql"),
    },
    Migration {
        version: 20,
        name: "0020_finished_counts",
        sql: include_str!("sqlite/migrations/0020_finished_counts.sql"),
    },
    Migration {
        version: 21,
        name: "0021_hot_states",
        sql: include_str!("sqlite/migrations/0021_hot_states.sql"),
    },
    Migration {
        version: 22,
        name: "0022_stats_live",
        sql: include_str!("sqlite/migrations/0022_stats_live.sql"),
    },
    Migration {
        version: 23,
        name: "0023_broker_counts",
        sql: include_str!("sqlite/migrations/0023_broker_counts.sql"),
    },
    Migration {
        version: 24,
        name: "0024_presumed_lost",
        sql: include_str!("sqlite/migrations/0024_presumed_lost.sql"),
    },
    Migration {
        version: 25,
        name: "0025_presumed_runs",
        sql: include_str!("sqlite/migrations/0025_presumed_runs.sql"),
    },
    Migration {
        version: 26,
        name: "0026_counts_without_upserts",
        sql: include_str!("sqlite/migrations/0026_counts_without_upserts.sql"),
    },
    Migration {
        version: 27,
        name: "0027_schedule_heads",
        sql: include_str!("sqlite/migrations/0027_schedule_heads.sql"),
    },
    Migration {
        version: 28,
        name: "0028_schedule_changes",
        sql: include_str!("sqlite/migrations/0028_schedule_changes.sql"),
    },
];

/// An open database file.
pub struct Db {
    /// What opening it applied (see [`migrate`]), and the schema version then.
    migrated: (Vec<&'static str>, i32),
    path: PathBuf,
    /// The write-ahead log beside the file, watched by [`keep_wal_short`].
    wal: PathBuf,
    /// The log's length in frames after this process's last commit (see [`Db::after_commit`]).
    wal_frames: AtomicI32,
    /// Set while a checkpoint of this process runs; at most one does.
    checkpointing: AtomicBool,
    /// The connection checkpoints run on, off the committing path.
    checkpointer: Mutex<Option<Connection>>,
    /// The checkpoint and backstop thresholds in this file's frames.
    frames: WalFrames,
    /// The log length (frames) before which the backstop is not tried again
    /// ([`BACKSTOP_BYTES`]), and how many of its tries in a row failed.
    backstop_at: AtomicI32,
    backstop_misses: AtomicU32,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    /// Wakes reservations in this process as soon as a message is published here, or another
    /// process rings the doorbell.
    pub(crate) published: Arc<tokio::sync::Notify>,
    /// Wakes reservations in other processes on the same file (a hint: they poll anyway).
    pub(crate) doorbell: doorbell::Doorbell,
    /// Whether calls made on a current-thread runtime run on its thread when they need not wait
    /// for another connection ([`Db::run_calls_here`]).
    here: AtomicBool,
    /// The file opened, to notice when its path names another ([`moved`]).
    opened: Option<moved::Opened>,
    /// Write transactions this process committed: how the tests see how many writes a path
    /// takes (each is a trip through the file's one write lock).
    commits: AtomicU64,
}

/// The name `/healthz` reports a file removed from under this process by.
const FILE_CHECK: &str = "database file";

thread_local! {
    /// Set while an attempt on the runtime's own thread begins its transaction: the lock is
    /// then waited for only through [`wait_for_lock`]'s first millisecond of naps (a round
    /// holds it a few hundred µs), then given up for the pool to wait with.
    static SHORT_WAIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("path", &self.path).finish()
    }
}

/// Waits out another process's write lock in short naps, up to `BUSY_TIMEOUT` in all.
/// SQLite's own timeout handler sleeps 1, 2, 5, 10 … 100 ms between tries, while homing holds
/// the lock for well under a millisecond: with several processes on one file they spent more
/// time asleep than writing. SQLite offers no wake-up when the lock is released, so the first
/// millisecond is tried in 50 µs naps (a worker's round holds it a few hundred µs), the rest of
/// the first 100 ms in 250 µs naps, then every 5 ms.
fn wait_for_lock(tries: i32) -> bool {
    const FIRST: Duration = Duration::from_micros(50);
    const FIRST_TRIES: u32 = 20; // the first millisecond
    if tries.max(0) as u32 >= FIRST_TRIES && SHORT_WAIT.with(|w| w.get()) {
        return false;
    }
    const SHORT: Duration = Duration::from_micros(250);
    const SHORT_TRIES: u32 = 416; // then up to the first 100 ms
    const LONG: Duration = Duration::from_millis(5);
    let tries = tries.max(0) as u32;
    let (waited, nap) = if tries < FIRST_TRIES {
        (FIRST * tries, FIRST)
    } else if tries < SHORT_TRIES {
        (FIRST * FIRST_TRIES + SHORT * (tries - FIRST_TRIES), SHORT)
    } else {
        (
            FIRST * FIRST_TRIES
                + SHORT * (SHORT_TRIES - FIRST_TRIES)
                + LONG * (tries - SHORT_TRIES),
            LONG,
        )
    };
    if waited >= BUSY_TIMEOUT {
        return false;
    }
    std::thread::sleep(nap);
    true
}

/// Past this size the write-ahead log is checkpointed and restarted (and, at its restart,
/// truncated back to it: `journal_size_limit`).
const WAL_RESTART_BYTES: u64 = 32 << 20;
/// The page size of the files homing creates. Each round of a worker writes every page it
/// changes whole into the write-ahead log (and a checkpoint copies it again), and a round of a
/// few jobs changes a page or two in each of some twenty B-trees, a few entries on each: at
/// 2 KiB those pages are half the bytes of SQLite's default 4 KiB ones, and a round of 8 no-op
/// jobs wrote about 76 KB of log instead of 120 KB (BENCHMARKS.md, "Smaller pages"). SQLite
/// takes a page size only while the file is empty, so a file made by an older build keeps its
/// own; everything below that depends on it asks the file ([`WalFrames`]).
const PAGE_SIZE: i64 = 2048;
/// A checkpoint runs each time the log has grown by about this much (about 4 MB): SQLite's own
/// automatic threshold (1,000 frames) at its default page size, so files of 4 KiB pages behave as
/// before.
const CHECKPOINT_BYTES: u64 = 1000 * (4096 + 24);
/// A log this long (4 MiB past [`WAL_RESTART_BYTES`]) means the checkpoints on their own thread
/// are not keeping up: a RESTART checkpoint on another thread rarely finds every reader done
/// while commits go on, and on a busy machine or a slow disk the log grew to 45–80 MB in the
/// tests below. Past it, the committing thread runs the RESTART itself while it still holds
/// this process's write connection, so no commit of this process grows the log meanwhile; the
/// price is that one commit's caller waits for the checkpoint (up to about 100 ms for readers,
/// holding the file's write lock meanwhile). A reader that holds an old snapshot longer (in
/// another process) defeats any checkpoint, so a failed try is repeated only
/// [`BACKSTOP_GAP_BYTES`] of log later, and each further failure in a row doubles that gap (up
/// to 64 times).
const BACKSTOP_BYTES: u64 = WAL_RESTART_BYTES + (4 << 20);
/// About 1 MiB of log between a try of the backstop and the next.
const BACKSTOP_GAP_BYTES: u64 = 250 * (4096 + 24);

/// The log lengths above in frames, which is what SQLite's WAL hook reports: a frame is one page
/// and its 24-byte header, so the counts depend on the file's page size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WalFrames {
    checkpoint: i32,
    backstop: i32,
    backstop_gap: i32,
}

impl WalFrames {
    fn for_page_size(page_size: u64) -> WalFrames {
        let frames =
            |bytes: u64| (bytes / (page_size.max(512) + 24)).clamp(1, i32::MAX as u64) as i32;
        WalFrames {
            checkpoint: frames(CHECKPOINT_BYTES),
            backstop: frames(BACKSTOP_BYTES),
            backstop_gap: frames(BACKSTOP_GAP_BYTES),
        }
    }
}

thread_local! {
    /// The log's length in frames after the last commit on this thread, from [`note_wal_frames`].
    static WAL_FRAMES: Cell<i32> = const { Cell::new(-1) };
}

/// SQLite's WAL hook, set on every connection in place of its automatic checkpoint, which would
/// run inside the commit that crosses the threshold: copying a thousand pages and two `fsync`s
/// made that commit's caller wait milliseconds before it could ring the doorbell or start its
/// next round (about one idle enqueue in a hundred started 3 ms late). The hook only notes the
/// log's length; [`Db::write`] hands the checkpoint to another thread.
fn note_wal_frames(_: &rusqlite::hooks::Wal, frames: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.with(|f| f.set(frames));
    Ok(())
}

fn wal_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}

/// Runs `PRAGMA wal_checkpoint(<mode>)` and reads its answer: whether it was kept from
/// finishing (1 if so), the log's length in frames, and how many of them it copied back.
fn checkpoint(conn: &Connection, mode: &'static str) -> rusqlite::Result<(i64, i64, i64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })
}

/// Keeps the write-ahead log from growing without end under steady load (run by
/// [`Db::checkpoint`], every [`CHECKPOINT_BYTES`] of log). A PASSIVE checkpoint copies frames back to the
/// file, but the log starts over from its beginning only in a write transaction that began
/// after a checkpoint had copied every frame, with no reader still using one; with several
/// processes writing and reading without pause that moment never came (nor does it for a
/// checkpoint on its own thread while commits go on): a 40,000-job run grew the log to 1.1 GB,
/// and every commit wrote fresh file blocks (the kernel zeroes each) instead of pages already
/// cached.
/// A RESTART checkpoint copies everything, then waits for the readers of old frames so the
/// next commit starts the log over. It waits at most about 10 ms (readers here are short; a
/// long search would otherwise hold up every writer): if it gives up, the frames it copied stay
/// copied, and the next look tries again.
///
/// Below that size a PASSIVE checkpoint copies what it can and waits for nothing, as SQLite's
/// automatic one did; so the RESTART finds little left to copy.
///
/// Whether the checkpoint copied the whole log (then [`start_log_over`] follows).
fn keep_wal_short(conn: &Connection, wal: &Path) -> bool {
    let long = std::fs::metadata(wal).is_ok_and(|m| m.len() > WAL_RESTART_BYTES);
    if !long {
        return match checkpoint(conn, "PASSIVE") {
            Ok((busy, frames, copied)) => busy == 0 && frames > 0 && copied == frames,
            Err(e) => {
                tracing::debug!(error = %e, "write-ahead log checkpoint deferred");
                false
            }
        };
    }
    restart_wal(conn, brief)
}

/// Starts the log over from the checkpoint thread, after a checkpoint that copied all of it.
/// The first writer after such a checkpoint writes a new log header at the log's start, and
/// SQLite syncs that header before the commit's frames (an out-of-order write after a restart
/// could otherwise damage the file; only `synchronous=OFF` skips it): on an idle file that
/// writer was the next enqueue, whose commit then took 0.8-1.0 ms instead of about 50 µs (4 to 11
/// enqueues in 1,000; BENCHMARKS.md, "Where the embedded idle tail comes from"). A
/// one-page write here (the schema's `user_version`, rewritten with its own value) makes this
/// thread that writer. It gives up at once if another connection is writing (that writer
/// restarts the log itself, as before); if a reader still holds the old log's frames, SQLite
/// appends the page instead and the log starts over later, as before. A commit arriving during
/// this write waits for it, sync included (its busy handler), so the move makes the cost rarer
/// on the enqueue path, not impossible.
fn start_log_over(conn: &Connection) {
    let _ = conn.busy_handler(None);
    let written = (|| -> rusqlite::Result<()> {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        conn.pragma_update(None, "user_version", version)?;
        conn.execute_batch("COMMIT")
    })();
    if let Err(e) = written {
        let _ = conn.execute_batch("ROLLBACK");
        tracing::trace!(error = %e, "the write-ahead log is left to the next writer to start over");
    }
    let _ = conn.busy_handler(Some(wait_for_lock));
}

/// The off-thread checkpoint's patience: about 10 ms.
fn brief(tries: i32) -> bool {
    if tries >= 200 {
        return false;
    }
    std::thread::sleep(Duration::from_micros(50));
    true
}

/// The backstop's patience ([`BACKSTOP_BYTES`]): the first 100 ms of [`wait_for_lock`]'s
/// schedule. Only a log already far too long gets here, so holding this process's writes that
/// long is the point: they are what grows it.
fn backstop(tries: i32) -> bool {
    tries < 416 && wait_for_lock(tries)
}

/// A RESTART checkpoint, waiting on other connections as `patience` allows; whether it
/// finished (every frame copied and no reader left on one, so the next commit starts over).
fn restart_wal(conn: &Connection, patience: fn(i32) -> bool) -> bool {
    let _ = conn.busy_handler(Some(patience));
    let outcome = checkpoint(conn, "RESTART");
    let _ = conn.busy_handler(Some(wait_for_lock));
    match outcome {
        Ok((busy, frames, copied)) => {
            tracing::debug!(
                busy,
                frames,
                copied,
                "write-ahead log checkpointed to restart"
            );
            busy == 0
        }
        Err(e) => {
            tracing::debug!(error = %e, "write-ahead log checkpoint deferred");
            false
        }
    }
}

/// Opens a connection set up as every connection here is. Processes that open a new file at
/// the same moment (`homing up` and its workers started together) can find it locked while
/// one of them turns on WAL, and SQLite reports that at once rather than through the busy
/// handler (about one open in a thousand when six threads opened one new file): such an open
/// is tried again on [`wait_for_lock`]'s schedule, up to `BUSY_TIMEOUT` in all. Only a refusal
/// that came at once is that race: an open that already waited its busy handler out (a file
/// another process holds in exclusive locking mode) fails as it did.
fn open_conn(path: &Path) -> rusqlite::Result<Connection> {
    let first = std::time::Instant::now();
    let mut tries = 0;
    loop {
        let attempt = std::time::Instant::now();
        match open_conn_once(path) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy
                    && attempt.elapsed() < Duration::from_millis(100)
                    && first.elapsed() < BUSY_TIMEOUT
                    && wait_for_lock(tries) =>
            {
                tries += 1
            }
            opened => return opened,
        }
    }
}

fn open_conn_once(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_handler(Some(wait_for_lock))?;
    // Before anything creates the file's first page; on a file that has one it changes nothing.
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    // WAL lets readers run beside the one writer; NORMAL syncs at checkpoints, which keeps every
    // committed transaction through a process crash (kill -9), the failure homing is built for.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Checkpoints run beside the commits, not in them (`note_wal_frames`).
    conn.wal_hook(Some(note_wal_frames));
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    // A statement that fires a trigger (every job write: the count triggers) and is not the
    // first of its transaction keeps a statement journal, so that a failure can undo it alone;
    // a RETURNING collects its rows in a temporary table. In memory, not in temporary files:
    // about a fifth of a job's write time on the schema with 100,000 jobs. The price is that a
    // large sort or index build (a migration's CREATE INDEX at a million jobs) holds its
    // temporary data in memory, tens of MiB, for the statement's length.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // When the log starts over, it is cut back to this size (see `keep_wal_short`).
    conn.pragma_update(None, "journal_size_limit", WAL_RESTART_BYTES as i64)?;
    // One plan per statement, whatever is bound to it. Since SQLite 3.47 a cached statement
    // whose plan looked at a bound value (a `LIMIT ?`, a `LIKE ?`, a partial index matched
    // through a parameter) is compiled again each time that value changes: the reservation's
    // `LIMIT ?` (the free slots) recompiled about once every four jobs, 9 % of a worker's
    // instructions. homing's queries name their partial indexes' conditions literally, so no
    // plan needs the values.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    // A worker's round runs a few dozen distinct statements (broker, start, complete, timeline,
    // limits, workflow effects); rusqlite's default cache of 16 evicted some every round, and
    // each eviction is a compile on the next use.
    conn.set_prepared_statement_cache_capacity(128);
    Ok(conn)
}

/// A wait for the file's write lock at least this long is written down ([`note_stall`]).
/// A worker's round holds the lock a few hundred microseconds; a heartbeat interval is at
/// least 10 ms.
pub(crate) const STALL_NOTED: Duration = Duration::from_millis(50);

/// How long a written-down wait is taken into account after it ended ([`recent_stall`]).
const STALL_REMEMBERED: Duration = Duration::from_secs(10);

/// Writes down, in the transaction that waited for it, how long the file's write lock could
/// not be had (`waited`, also kept for [`lock_waited`]), so that every process on the file
/// can tell: while no process could write, no worker could refresh its heartbeat either, and
/// the heartbeats that expired meanwhile must not be taken for crashes (see the SQLite
/// broker's `lost_consumers`). A longer wait that ended more recently than
/// [`STALL_REMEMBERED`] is kept. Failing to write it changes nothing else.
fn note_stall(tx: &rusqlite::Transaction<'_>, waited: Duration) {
    LOCK_WAITED.with(|w| w.set(waited));
    if waited < STALL_NOTED {
        return;
    }
    // Timed on the monotonic clock: a wall clock stepped during the wait would write down the
    // step. No wait is longer than the busy timeout.
    let waited = crate::time::micros(waited.min(BUSY_TIMEOUT));
    let at = crate::time::now();
    let kept = recent_stall(tx, at).unwrap_or(0);
    if kept > waited {
        return;
    }
    if let Err(e) = tx.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('write_stall', ?1)",
        [format!("{at},{waited}")],
    ) {
        tracing::debug!(error = %e, "could not note a wait for the write lock");
    }
}

/// The longest wait for the file's write lock that any process on the file wrote down and that
/// ended within [`STALL_REMEMBERED`] of `at`, in microseconds; 0 if none.
pub(crate) fn recent_stall(conn: &Connection, at: crate::time::Micros) -> rusqlite::Result<i64> {
    use rusqlite::OptionalExtension;
    let noted: Option<String> = conn
        .prepare_cached("SELECT value FROM meta WHERE key = 'write_stall'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    let Some((ended, waited)) = noted.as_deref().and_then(|v| v.split_once(',')) else {
        return Ok(0);
    };
    let (Ok(ended), Ok(waited)) = (ended.parse::<i64>(), waited.parse::<i64>()) else {
        return Ok(0);
    };
    // A wait said to end in the future (a wall clock stepped back since) is not believed, nor
    // one longer than the busy timeout allows.
    let age = at.saturating_sub(ended);
    let remembered = (0..=crate::time::micros(STALL_REMEMBERED)).contains(&age);
    let waited = waited.clamp(0, crate::time::micros(BUSY_TIMEOUT));
    Ok(if remembered { waited } else { 0 })
}

thread_local! {
    /// How long the transaction now running on this thread waited for the file's write lock.
    static LOCK_WAITED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// Inside a write's body: how long its transaction waited for the file's write lock (not for
/// this process's own writer, nor for a thread to run on).
pub(crate) fn lock_waited() -> Duration {
    LOCK_WAITED.with(Cell::get)
}

/// SQLite failures after which trying again may succeed: the database is busy or locked, out of
/// memory or disk, cannot be opened or read right now, or is being recovered by another
/// connection (`SQLITE_PROTOCOL`, `SQLITE_READONLY_RECOVERY`, `SQLITE_READONLY_CANTINIT`). The
/// failed statement committed nothing.
fn transient(f: &rusqlite::ffi::Error) -> bool {
    use rusqlite::ffi;
    matches!(
        f.code,
        rusqlite::ErrorCode::DatabaseBusy
            | rusqlite::ErrorCode::DatabaseLocked
            | rusqlite::ErrorCode::CannotOpen
            | rusqlite::ErrorCode::SystemIoFailure
            | rusqlite::ErrorCode::DiskFull
            | rusqlite::ErrorCode::OutOfMemory
            | rusqlite::ErrorCode::FileLockingProtocolFailed
    ) || matches!(
        f.extended_code,
        ffi::SQLITE_READONLY_RECOVERY | ffi::SQLITE_READONLY_CANTINIT
    )
}

fn map_err(e: rusqlite::Error) -> Error {
    if let rusqlite::Error::ToSqlConversionFailure(inner) = &e {
        if let Some(t) = inner.downcast_ref::<crate::store::queues::TooManyQueues>() {
            return Error::Invalid(t.to_string());
        }
    }
    match &e {
        rusqlite::Error::SqliteFailure(f, _) if transient(f) => Error::unavailable_from(BACKEND, e),
        // Met by a process that did not check the file at open (a one-shot command), or whose
        // file was damaged after it did.
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase
            ) =>
        {
            Error::backend_from(BACKEND, e).context(
                "the database file is damaged: restore it from a backup or move it aside \
                 (`homing migrate` checks every page)",
            )
        }
        _ => Error::backend_from(BACKEND, e),
    }
}

impl Db {
    /// Opens (creating if needed) the database at `path`, refuses it if damaged
    /// ([`check_integrity`]) and brings its schema up to date.
    pub fn open(path: impl AsRef<Path>) -> Result<Arc<Db>> {
        Self::open_with(path, true)
    }

    /// [`Db::open`], with the integrity check only when `check_pages`. The check reads every
    /// page of the file (about a second at a million jobs): a process that serves for hours
    /// pays it once to refuse a damaged file before it looks healthy, a one-shot command need
    /// not, as a statement that meets a damaged page fails with SQLite's own error anyway.
    pub fn open_with(path: impl AsRef<Path>, check_pages: bool) -> Result<Arc<Db>> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Error::unavailable_from(BACKEND, e)
                        .context(format!("cannot create {}", dir.display()))
                })?;
            }
        }
        let writer = open_conn(&path).map_err(|e| {
            Error::unavailable_from(BACKEND, e).context(format!("cannot open {}", path.display()))
        })?;
        let opened = moved::Opened::at(&path);
        if check_pages {
            check_integrity(&writer, &path)?;
        }
        let migrated = migrate(&writer).map_err(map_err)?;
        let page_size: u64 = writer
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .map_err(map_err)?;
        let published = Arc::new(tokio::sync::Notify::new());
        Ok(Arc::new(Db {
            migrated,
            writer: Mutex::new(writer),
            readers: Mutex::new(Vec::new()),
            doorbell: doorbell::Doorbell::new(&path, published.clone()),
            published,
            wal: wal_path(&path),
            wal_frames: AtomicI32::new(0),
            checkpointing: AtomicBool::new(false),
            checkpointer: Mutex::new(None),
            frames: WalFrames::for_page_size(page_size),
            backstop_at: AtomicI32::new(0),
            backstop_misses: AtomicU32::new(0),
            path,
            here: AtomicBool::new(false),
            commits: AtomicU64::new(0),
            opened,
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many write transactions this process has committed on the file.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Runs `f` in one write transaction (all or nothing).
    pub async fn write<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
    {
        self.write_waking(f, |_| false).await
    }

    /// As [`Db::write`], and when `wakes` says of `f`'s answer that the transaction made
    /// messages ready, wakes the reservations waiting on this file from the thread that
    /// committed it, as soon as it has: this process's in memory at once, other processes' by
    /// the doorbell once the write connection is free. A waiting worker then starts to look
    /// while the caller is still on its way back to the runtime (one thread hand-off sooner than
    /// waking them from the caller; docs/fastpath.md, item 8).
    pub(crate) async fn write_waking<T, F>(
        self: &Arc<Self>,
        f: F,
        wakes: fn(&T) -> bool,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
    {
        self.refuse_if_moved()?;
        let f = if self.calls_here() {
            match on_this_thread(|| self.write_here(f, wakes)) {
                Ok(Ok(done)) => return given_back(done).await,
                Ok(Err(f)) => f,
                Err(panicked) => return given_back(Err(panicked)).await,
            }
        } else {
            f
        };
        let db = self.clone();
        on_blocking_pool(crate::requests::Work::Write, move || db.write_now(f, wakes)).await
    }

    /// Lets calls made on a current-thread runtime run on its thread instead of a blocking
    /// pool's: reads, and writes whose lock can be had within the first millisecond of
    /// [`wait_for_lock`]'s naps (2-3 ms with the timer's slack). A write whose lock another
    /// connection holds longer goes to the pool and waits there, so another process's long
    /// write does not hold the runtime's other tasks (a heartbeat, the jobs) up for its length.
    /// Each call lets those tasks run after it, as the pool's hand-off did. `homing worker` turns it on when its runtime is one thread
    /// (docs/fastpath.md, item 15): the two thread hand-offs of each call cost more than most
    /// of its statements. Elsewhere (the server, a program's own runtime) calls stay off the
    /// runtime's threads.
    pub fn run_calls_here(&self, on: bool) {
        self.here.store(on, Ordering::Relaxed);
    }

    fn calls_here(&self) -> bool {
        self.here.load(Ordering::Relaxed)
            && tokio::runtime::Handle::try_current()
                .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
    }

    /// [`Db::write_now`] on the calling thread if the write lock can be had at once in this
    /// process and within [`wait_for_lock`]'s first millisecond in the file; `Err(f)` untouched
    /// otherwise, for the pool to wait with.
    fn write_here<T, F>(
        self: &Arc<Self>,
        f: F,
        wakes: fn(&T) -> bool,
    ) -> std::result::Result<Result<T>, F>
    where
        F: FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T>,
    {
        match self.writer.try_lock() {
            Ok(conn) => self.write_with(conn, true, f, wakes),
            // A body that panicked on this thread left the lock poisoned; the connection's
            // transaction was rolled back as the panic unwound, as on the pool.
            Err(std::sync::TryLockError::Poisoned(p)) => {
                self.write_with(p.into_inner(), true, f, wakes)
            }
            Err(std::sync::TryLockError::WouldBlock) => Err(f),
        }
    }

    /// Looks first (`look`, on a read connection) and runs `f` in a write transaction only if
    /// the look says yes (`Ok(None)` when it did not), both in one trip to the blocking pool: a
    /// read and then a write as two calls cost two hand-offs to a pool thread and back. Where
    /// calls run here ([`Db::run_calls_here`]), both run on the caller's thread unless the
    /// write would wait.
    pub(crate) async fn write_if<T, L, F>(self: &Arc<Self>, look: L, f: F) -> Result<Option<T>>
    where
        T: Send + 'static,
        L: FnOnce(&Connection) -> rusqlite::Result<bool> + Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T> + Send + 'static,
    {
        self.refuse_if_moved()?;
        if self.calls_here() {
            let looked = on_this_thread(|| self.read_now(look, None)).and_then(|r| r);
            if !looked.map_err(|e| e.context("looking before the write"))? {
                return given_back(Ok(None)).await;
            }
            return self.write_waking(f, |_| false).await.map(Some);
        }
        let db = self.clone();
        on_blocking_pool(crate::requests::Work::Write, move || {
            if !db
                .read_now(look, None)
                .map_err(|e| e.context("looking before the write"))?
            {
                return Ok(None);
            }
            db.write_now(f, |_| false).map(Some)
        })
        .await
    }

    /// Refuses a call once the path no longer names the file this process has open
    /// ([`moved`]); the refusal that first finds it so also starts saving what the file holds.
    /// Reads are refused too: a read that opened a new connection would open (and create) the
    /// file now at the path and answer from it.
    fn refuse_if_moved(self: &Arc<Self>) -> Result<()> {
        self.refuse_if_moved_now(false)
    }

    /// [`Db::refuse_if_moved`], looking at the path whatever the last look's age when
    /// `at_once`.
    fn refuse_if_moved_now(self: &Arc<Self>, at_once: bool) -> Result<()> {
        let Some(opened) = &self.opened else {
            return Ok(());
        };
        let moved::Look::Moved { reason, first } = opened.look(&self.path, at_once) else {
            return Ok(());
        };
        crate::health::global().failure(FILE_CHECK);
        if first {
            tracing::error!(
                "{reason}. This process no longer reads or writes it, since a process started \
                 later could not find what is written there; the copy is made in {} s, once \
                 the other processes on the file have stopped writing to it too",
                moved::SETTLE.as_secs()
            );
            let db = self.clone();
            let saving = std::thread::Builder::new()
                .name("homing-save".into())
                .spawn(move || db.save_moved());
            if let Err(e) = saving {
                tracing::error!(error = %e, "could not start saving the removed database file");
            }
        }
        Err(Error::unavailable(BACKEND, reason))
    }

    /// Copies what the removed file holds beside its path, from the writer connection (the one
    /// way left to it), once the other processes on it have stopped writing ([`moved::SETTLE`]).
    /// Each process writes a copy of its own and links it to the one name; the first link
    /// stands, and the others are dropped.
    fn save_moved(&self) {
        let Some(opened) = &self.opened else {
            return;
        };
        std::thread::sleep(moved::SETTLE);
        let saved = opened.saved_as(&self.path);
        let mut part = saved.clone().into_os_string();
        // Unique to this copy: processes in different containers on one volume share pids.
        part.push(format!(
            ".{}-{:016x}.part",
            std::process::id(),
            fastrand::u64(..)
        ));
        let part = PathBuf::from(part);
        let Some(part_name) = part.to_str() else {
            tracing::error!(path = %part.display(), "cannot save the removed database file: its path is not UTF-8");
            return;
        };
        let conn = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let copied = conn.execute("VACUUM INTO ?1", [part_name]);
        drop(conn);
        if let Err(e) = copied {
            tracing::error!(error = %e, path = %part.display(), "could not save what the removed database file holds: it is gone once every process that has it open stops");
            let _ = std::fs::remove_file(&part);
            return;
        }
        // A link lands only if no other process's copy has; a file system without hard links
        // gets the copy renamed into place instead.
        let linked = match std::fs::hard_link(&part, &saved) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                std::fs::rename(&part, &saved)
            }
            other => other,
        };
        let _ = std::fs::remove_file(&part);
        let (db, saved) = (self.path.display(), saved.display());
        match linked {
            Ok(()) => tracing::error!(
                "saved what {db} held as {saved}: stop homing's processes, remove {db} and its \
                 -wal and -shm files if there are any, move {saved} to {db}, and start them again"
            ),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                tracing::warn!("what {db} held was saved as {saved} by another process")
            }
            Err(e) => tracing::error!(error = %e, "could not save what {db} held as {saved}"),
        }
    }

    /// The body of every write, on a blocking thread.
    fn write_now<T, F>(self: &Arc<Self>, f: F, wakes: fn(&T) -> bool) -> Result<T>
    where
        F: FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T>,
    {
        let conn = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        match self.write_with(conn, false, f, wakes) {
            Ok(done) => done,
            // Only a write that may not wait gives its body back.
            Err(_) => Err(Error::unavailable(BACKEND, "the write lock was not taken")),
        }
    }

    /// One write transaction on the writer connection: begin, `f`, commit, and what follows a
    /// commit (the backstop, the wakes, the checkpoint). With `briefly` another connection's
    /// lock is waited for only through [`wait_for_lock`]'s first millisecond, and if it is
    /// still held, `f` comes back untouched.
    fn write_with<T, F>(
        self: &Arc<Self>,
        mut conn: std::sync::MutexGuard<'_, Connection>,
        briefly: bool,
        f: F,
        wakes: fn(&T) -> bool,
    ) -> std::result::Result<Result<T>, F>
    where
        F: FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T>,
    {
        SHORT_WAIT.with(|w| w.set(briefly));
        let asked = std::time::Instant::now();
        let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => {
                SHORT_WAIT.with(|w| w.set(false));
                note_stall(&tx, asked.elapsed());
                tx
            }
            Err(e) => {
                SHORT_WAIT.with(|w| w.set(false));
                // Busy (another process writes), or a failure the pool's try meets again.
                return if briefly { Err(f) } else { Ok(Err(map_err(e))) };
            }
        };
        // Looked at again under the lock: a write let in before the file's removal was noticed
        // could otherwise commit after the copy was taken ([`Db::save_moved`]).
        if let Some(reason) = self.opened.as_ref().and_then(moved::Opened::reason) {
            return Ok(Err(Error::unavailable(BACKEND, reason)));
        }
        let out = match f(&tx) {
            Ok(out) => out,
            Err(e) => return Ok(Err(map_err(e))),
        };
        WAL_FRAMES.with(|f| f.set(-1));
        if let Err(e) = tx.commit() {
            return Ok(Err(map_err(e)));
        }
        self.commits.fetch_add(1, Ordering::Relaxed);
        let frames = WAL_FRAMES.with(|f| f.get());
        // Before the wake: a woken worker's take would only wait for this connection.
        self.restart_if_behind(&conn, frames);
        let wake = wakes(&out);
        if wake {
            self.published.notify_waiters();
        }
        drop(conn);
        if wake {
            self.doorbell.ring();
        }
        self.after_commit(frames);
        Ok(Ok(out))
    }

    /// Starts a checkpoint on another thread each time the log has grown past another
    /// [`CHECKPOINT_BYTES`] (`frames` is its length after the commit, -1 if unknown), unless one
    /// of this process is still running. Other processes' commits grow the log too; each process
    /// counts what it sees after its own.
    fn after_commit(self: &Arc<Self>, frames: i32) {
        if frames < 0 {
            return;
        }
        let before = self.wal_frames.swap(frames, Ordering::Relaxed);
        // A shorter log started over since: count from its start.
        let before = if frames < before { 0 } else { before };
        let every = self.frames.checkpoint;
        if frames / every <= before / every {
            return;
        }
        if self.checkpointing.swap(true, Ordering::AcqRel) {
            return;
        }
        let db = self.clone();
        let run = move || {
            db.checkpoint();
            db.checkpointing.store(false, Ordering::Release);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(run)),
            Err(_) => run(),
        }
    }

    /// The backstop ([`BACKSTOP_BYTES`]): after a commit that left the log `frames` long, on
    /// the writer connection the caller still holds, so no commit of this process grows the
    /// log meanwhile.
    fn restart_if_behind(&self, conn: &Connection, frames: i32) {
        if frames >= 0 && frames < self.wal_frames.load(Ordering::Relaxed) {
            // The log started over: a new one owes the backstop nothing.
            self.backstop_misses.store(0, Ordering::Relaxed);
            self.backstop_at.store(0, Ordering::Relaxed);
        }
        if frames < self.frames.backstop || frames < self.backstop_at.load(Ordering::Relaxed) {
            return;
        }
        // The checkpoints on their own thread fell behind (a busy CPU, a slow disk). This
        // process's own checkpoint is waited out first: it would otherwise hold SQLite's
        // checkpoint lock past the RESTART's patience.
        let own = self.checkpointer.lock().unwrap_or_else(|p| p.into_inner());
        let restarted = restart_wal(conn, backstop);
        drop(own);
        // A try that failed waited on a reader (or on another process) while holding the write
        // lock, which stalls every writer of the file: after each failure in a row the next try
        // waits twice as long, up to 64 times the gap.
        let misses = if restarted {
            self.backstop_misses.store(0, Ordering::Relaxed);
            0
        } else {
            self.backstop_misses.fetch_add(1, Ordering::Relaxed) + 1
        };
        let gap = self.frames.backstop_gap << misses.min(6);
        self.backstop_at
            .store(frames.saturating_add(gap), Ordering::Relaxed);
    }

    /// One checkpoint on the checkpointing connection (opened on first use).
    fn checkpoint(self: &Arc<Self>) {
        let mut slot = self.checkpointer.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            // A connection opened now would open the file now at the path.
            if self.refuse_if_moved_now(true).is_err() {
                return;
            }
            match open_conn(&self.path) {
                Ok(c) => *slot = Some(c),
                Err(e) => {
                    tracing::debug!(error = %e, "write-ahead log checkpoint deferred");
                    return;
                }
            }
        }
        if let Some(conn) = slot.as_ref() {
            if keep_wal_short(conn, &self.wal) {
                start_log_over(conn);
            }
        }
    }

    /// Runs `f` on a read connection (a consistent snapshot for the duration of `f` when it
    /// opens a transaction itself; single statements are always consistent).
    pub async fn read<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.refuse_if_moved()?;
        if self.calls_here() {
            // A read seldom waits for another connection: the log keeps its snapshot.
            let read = on_this_thread(|| self.read_now(f, None)).and_then(|r| r);
            return given_back(read).await;
        }
        let db = self.clone();
        let given_up = GiveUpOnDrop::default();
        let flag = given_up.0.clone();
        on_blocking_pool(crate::requests::Work::Read, move || {
            db.read_now(f, Some(flag))
        })
        .await
    }

    /// The body of every read, on a blocking thread or the caller's ([`Db::run_calls_here`]):
    /// a pooled read connection, or a new one. When `given_up` turns true (its caller stopped
    /// waiting: a client went away, a request timed out) the statement stops at its next
    /// progress check instead of running to its end for nobody; a search over a million jobs
    /// takes half a second of a thread and of a request permit.
    fn read_now<T, F>(self: &Arc<Self>, f: F, given_up: Option<Arc<AtomicBool>>) -> Result<T>
    where
        F: FnOnce(&Connection) -> rusqlite::Result<T>,
    {
        let conn = self.readers.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match conn {
            Some(c) => c,
            None => {
                self.refuse_if_moved_now(true)?;
                open_conn(&self.path).map_err(map_err)?
            }
        };
        // The handler belongs to this read alone: installed here and removed before the
        // connection goes back to the pool (a connection that keeps it is not pooled), so a
        // late give-up cannot stop another read. Without it the read only runs to its end.
        let watched = given_up.is_some_and(|flag| {
            conn.progress_handler(
                GIVE_UP_CHECK_OPS,
                Some(move || flag.load(Ordering::Relaxed)),
            )
            .is_ok()
        });
        let out = f(&conn).map_err(map_err);
        if watched && conn.progress_handler(0, None::<fn() -> bool>).is_err() {
            return out;
        }
        let mut pool = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < 8 {
            pool.push(conn);
        }
        out
    }
}

/// How many SQLite virtual-machine steps a watched read runs between looks at its give-up
/// flag: a few microseconds, and a load of one atomic each time.
const GIVE_UP_CHECK_OPS: std::ffi::c_int = 1000;

/// Set when the future of a read is dropped before the read answered (see [`Db::read`]); once
/// the read has answered, the flag is no longer looked at.
#[derive(Default)]
struct GiveUpOnDrop(Arc<AtomicBool>);

impl Drop for GiveUpOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs a call on the caller's thread ([`Db::run_calls_here`]); a panic in it becomes the error
/// a panic on the pool gives, as it does there, instead of unwinding through the runtime.
fn on_this_thread<R>(body: impl FnOnce() -> R) -> Result<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).map_err(|_| {
        Error::backend(BACKEND, "database task panicked").context("database task failed")
    })
}

/// A call made on the runtime's thread lets the runtime's other tasks run before its caller
/// goes on, as the pool's hand-off did: a loop of calls (a batch after batch of maintenance, a
/// backlog of events) would otherwise hold the thread, and a heartbeat, for the whole loop.
async fn given_back<T>(out: Result<T>) -> Result<T> {
    tokio::task::yield_now().await;
    out
}

/// Runs `f` on the runtime's blocking pool: every SQLite call blocks its thread. A request's
/// call first waits for a permit of the requests' share ([`crate::requests`]), held until `f`
/// returns (not until the caller, which may give up, is done).
async fn on_blocking_pool<T: Send + 'static>(
    work: crate::requests::Work,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let permit = crate::requests::permit(work).await;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        f()
    })
    .await
    .map_err(|e| Error::backend_from(BACKEND, e).context("database task failed"))?
}

/// How many of `PRAGMA quick_check`'s findings an error names: the first few say what is wrong,
/// the rest of a badly damaged file would only bury them.
const INTEGRITY_PROBLEMS_SHOWN: u32 = 5;

/// Refuses a damaged file at open. Without this, a file whose pages were overwritten opens
/// fine, the API answers and `/healthz` says 200, while every worker and enqueue that touches a
/// bad page fails — an outage that looks healthy. `quick_check` reads every page once (about a
/// second at a million jobs, once per process start) and skips only the costly index-content
/// checks; [`Db::open_with`] lets a one-shot command skip it.
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

/// Applies the migrations the file lacks, under SQLite's write lock so that processes opening
/// the file at once apply each exactly once; returns the names of those applied and the schema
/// version afterwards.
///
/// Files made before migrations were recorded carry their version only in `user_version`
/// (1 or 2): the migrations up to it are recorded as applied, then the rest run. `user_version`
/// is kept equal to the schema version so those older builds still find the file current.
fn migrate(conn: &Connection) -> rusqlite::Result<(Vec<&'static str>, i32)> {
    // Without the write lock first: a current file (nearly every open) need not wait for a
    // busy writer.
    if let Some(done) = recorded_versions(conn)? {
        if pending(MIGRATIONS, &done).is_empty() {
            warn_if_newer(BACKEND, MIGRATIONS, &done);
            return Ok((Vec::new(), done.iter().copied().max().unwrap_or(0)));
        }
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let res = migrate_locked(conn);
    match res {
        Ok(out) => conn.execute_batch("COMMIT").map(|_| out),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// The versions recorded in `homing_migrations`; `None` when the table does not exist yet.
fn recorded_versions(conn: &Connection) -> rusqlite::Result<Option<Vec<i32>>> {
    let exists: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' \
         AND name = 'homing_migrations')",
        [],
        |r| r.get(0),
    )?;
    if !exists {
        return Ok(None);
    }
    let done = conn
        .prepare("SELECT version FROM homing_migrations")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Some(done))
}

fn migrate_locked(conn: &Connection) -> rusqlite::Result<(Vec<&'static str>, i32)> {
    let t = crate::time::now();
    // Re-read under the lock: another process may have migrated meanwhile.
    if recorded_versions(conn)?.is_none() {
        conn.execute_batch(
            "CREATE TABLE homing_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, \
             applied_at INTEGER NOT NULL)",
        )?;
        let legacy: i32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        for m in MIGRATIONS.iter().filter(|m| m.version <= legacy) {
            conn.execute(
                "INSERT INTO homing_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
                rusqlite::params![m.version, m.name, t],
            )?;
        }
    }
    let done = recorded_versions(conn)?.unwrap_or_default();
    warn_if_newer(BACKEND, MIGRATIONS, &done);
    let mut version = done.iter().copied().max().unwrap_or(0);
    let mut applied = Vec::new();
    for m in pending(MIGRATIONS, &done) {
        conn.execute_batch(m.sql)?;
        conn.execute(
            "INSERT INTO homing_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
            rusqlite::params![m.version, m.name, t],
        )?;
        tracing::info!(migration = m.name, "applied SQLite migration");
        applied.push(m.name);
        version = version.max(m.version);
    }
    if !applied.is_empty() {
        conn.pragma_update(None, "user_version", version)?;
    }
    Ok((applied, version))
}

/// Brings the file at `path` up to date (creating it if needed), for `homing migrate`: what
/// every [`Db::open`] does, with the report of what it applied.
pub fn migrate_file(path: &Path) -> Result<(Vec<&'static str>, i32)> {
    Ok(Db::open(path)?.migrated.clone())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A read whose caller stops waiting (a client gone, a request timed out) stops its
    /// statement instead of running it to its end for nobody, and the connection it used
    /// answers the next read in full. Without the give-up the count below runs for
    /// tens of seconds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_whose_caller_gave_up_stops_its_statement() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path().join("h.db")).unwrap();
        let count = |to: i64| {
            format!(
                "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < {to}) \
                 SELECT count(*) FROM n"
            )
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let long = count(150_000_000);
        let slow = db.read(move |c| {
            let r = c.query_row(&long, [], |r| r.get::<_, i64>(0));
            let interrupted = matches!(&r, Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::OperationInterrupted);
            let _ = tx.send(interrupted);
            r
        });
        assert!(
            tokio::time::timeout(Duration::from_millis(300), slow)
                .await
                .is_err(),
            "a count to 150 million does not answer in 300 ms"
        );
        let stopped = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(
            stopped,
            Ok(true),
            "the statement stopped, interrupted, once its caller gave up"
        );
        let short = count(300_000);
        let n = db
            .read(move |c| c.query_row(&short, [], |r| r.get::<_, i64>(0)))
            .await
            .expect("the next read on the pooled connection");
        assert_eq!(n, 300_000);
    }

    /// Calls made on the runtime's thread let its other tasks run after each (a loop of them,
    /// such as maintenance's batches, does not hold the heartbeat for the whole loop), and a
    /// body that panics there gives the pool's error, not an unwinding runtime, and leaves the
    /// next call running here. Without the yield the other task ran 0 times in 50 writes.
    #[test]
    fn calls_made_here_give_the_thread_back_and_survive_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let me = std::thread::current().id();
        rt.block_on(async {
            let db = Db::open(dir.path().join("h.db")).unwrap();
            db.run_calls_here(true);
            db.write(|tx| tx.execute_batch("CREATE TABLE t (x INTEGER)"))
                .await
                .unwrap();
            let other = crate::conformance::OtherTask::start().await;
            let before = other.runs();
            for _ in 0..50 {
                let on = db
                    .write(|tx| {
                        tx.execute("INSERT INTO t VALUES (1)", [])?;
                        Ok(std::thread::current().id())
                    })
                    .await
                    .unwrap();
                assert_eq!(on, me);
            }
            let during = other.runs() - before;
            drop(other);
            assert!(
                during >= 25,
                "the other task ran {during} times in 50 writes"
            );

            let e = db
                .write(|tx| -> rusqlite::Result<()> {
                    tx.execute("INSERT INTO t VALUES (2)", [])?;
                    panic!("a bug in a statement's body")
                })
                .await
                .unwrap_err();
            assert!(e.to_string().contains("database task failed"), "{e}");
            let on = db.write(|_| Ok(std::thread::current().id())).await.unwrap();
            assert_eq!(
                on, me,
                "the next write runs here, the lock's poison notwithstanding"
            );
            let rows: (i64, i64) = db
                .read(|c| {
                    c.query_row("SELECT count(*), coalesce(sum(x), 0) FROM t", [], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                })
                .await
                .unwrap();
            assert_eq!(rows, (50, 50), "the panicked write was rolled back");
        });
    }

    /// Where calls run here (a one-thread worker's file), a write runs on the caller's thread
    /// while the lock is free, and goes to a pool thread, still committing, while another
    /// connection holds the lock longer than about a millisecond, so the runtime's other tasks
    /// (a heartbeat) go on meanwhile; reads and looks run here too. Without `run_calls_here`
    /// every call runs on the pool. Fails if the attempt here waited the lock out itself.
    #[test]
    fn calls_run_here_unless_they_would_wait() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let me = std::thread::current().id();
        async fn insert(db: &Arc<Db>) -> std::thread::ThreadId {
            db.write(|tx| {
                tx.execute("INSERT INTO t VALUES (1)", [])?;
                Ok(std::thread::current().id())
            })
            .await
            .unwrap()
        }
        rt.block_on(async {
            let db = Db::open(&path).unwrap();
            db.write(|tx| tx.execute_batch("CREATE TABLE t (x INTEGER)"))
                .await
                .unwrap();
            assert_ne!(insert(&db).await, me, "off: on the pool");
            db.run_calls_here(true);
            assert_eq!(insert(&db).await, me);
            let read_on = db.read(|_| Ok(std::thread::current().id())).await;
            assert_eq!(read_on.unwrap(), me);
            let took_on = db
                .write_if(|_| Ok(true), |_| Ok(std::thread::current().id()))
                .await;
            assert_eq!(took_on.unwrap(), Some(me));

            // Another connection (another process, as far as SQLite can tell) holds the lock.
            let other = open_conn(&path).unwrap();
            other.execute_batch("BEGIN IMMEDIATE").unwrap();
            let release = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                other.execute_batch("COMMIT").unwrap();
            });
            let ticks = Arc::new(AtomicU32::new(0));
            let ticker = {
                let ticks = ticks.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        ticks.fetch_add(1, Ordering::Relaxed);
                    }
                })
            };
            let waited_on = insert(&db).await;
            let ticked = ticks.load(Ordering::Relaxed);
            ticker.abort();
            release.join().unwrap();
            assert_ne!(
                waited_on, me,
                "a write that must wait waits on a pool thread"
            );
            assert!(
                ticked >= 5,
                "the runtime's other tasks ran {ticked} times while the write waited 300 ms"
            );
            // The attempt left the connection as it was: the next write runs here again.
            assert_eq!(insert(&db).await, me);
            let rows: i64 = db
                .read(|c| c.query_row("SELECT count(*) FROM t", [], |r| r.get(0)))
                .await
                .unwrap();
            assert_eq!(rows, 4);
        });
    }

    /// Failures that pass (out of memory, another connection recovering the WAL) are
    /// transient, so the isolation fallback retries instead of burying an innocent job.
    #[test]
    fn passing_failures_are_transient() {
        use rusqlite::ffi;
        let fail = |code| map_err(rusqlite::Error::SqliteFailure(ffi::Error::new(code), None));
        for code in [
            ffi::SQLITE_BUSY,
            ffi::SQLITE_NOMEM,
            ffi::SQLITE_PROTOCOL,
            ffi::SQLITE_READONLY_RECOVERY,
            ffi::SQLITE_READONLY_CANTINIT,
        ] {
            assert!(fail(code).is_transient(), "{code}");
        }
        for code in [
            ffi::SQLITE_CONSTRAINT,
            ffi::SQLITE_READONLY,
            ffi::SQLITE_MISMATCH,
        ] {
            assert!(!fail(code).is_transient(), "{code}");
        }
    }

    /// A cached statement is compiled once, whatever is bound to it: with SQLite's default,
    /// each new `LIMIT ?` value (the reservation's free slots) compiled the statement again.
    #[test]
    fn bound_values_never_recompile_a_statement() {
        use rusqlite::StatementStatus;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        Db::open(&path).unwrap();
        let conn = open_conn(&path).unwrap();
        let mut st = conn
            .prepare(
                "UPDATE messages SET consumer = ?1 WHERE id IN (SELECT id FROM messages \
                 WHERE queue = ?2 AND consumer IS NULL ORDER BY id LIMIT ?3)",
            )
            .unwrap();
        for limit in 1..=5i64 {
            st.execute(rusqlite::params!["w", "q", limit]).unwrap();
        }
        assert_eq!(st.get_status(StatementStatus::RePrepare), 0);
    }

    /// A file upgraded from version 22 with messages and dead letters in it starts its broker
    /// counts from them (versions 23 and 26), also for a queue whose only messages are
    /// reserved, and the triggers carry on from there.
    #[test]
    fn broker_counts_start_from_the_messages_a_file_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.db");
        Db::open(&path).unwrap();
        let conn = open_conn(&path).unwrap();
        // Back to version 22 as it was: no counts, no triggers, and messages written meanwhile.
        conn.execute_batch(
            "DROP TRIGGER messages_ready_insert; DROP TRIGGER messages_ready_delete; \
             DROP TRIGGER messages_ready_leave; DROP TRIGGER messages_ready_enter; \
             DROP TRIGGER messages_ready_move; \
             DROP TRIGGER dead_letters_count_insert; DROP TRIGGER dead_letters_count_delete; \
             DROP TABLE broker_counts; \
             DELETE FROM homing_migrations WHERE version IN (23, 26); \
             INSERT INTO messages (queue, payload) VALUES ('a', 'x'), ('a', 'y'), ('b', 'z'); \
             INSERT INTO messages (queue, payload, consumer) VALUES ('a', 'w', 'c1'); \
             INSERT INTO messages (queue, payload, consumer) VALUES ('d', 'r', 'c1'); \
             INSERT INTO dead_letters (queue, payload, reason, at) VALUES ('b', 'v', 'r', 1);",
        )
        .unwrap();
        drop(conn);
        let (applied, _) = migrate_file(&path).unwrap();
        assert_eq!(
            applied,
            vec!["0023_broker_counts", "0026_counts_without_upserts"]
        );
        let conn = open_conn(&path).unwrap();
        // Reserved, released, reserved again, passed to another consumer, a ready one removed,
        // a reserved one acknowledged, one added, and the reserved-only queue's one released.
        for sql in [
            "UPDATE messages SET consumer = 'c2' WHERE payload = 'x'",
            "UPDATE messages SET consumer = NULL WHERE payload = 'w'",
            "UPDATE messages SET consumer = 'c3' WHERE payload = 'w'",
            "UPDATE messages SET consumer = 'c4' WHERE payload = 'w'",
            "DELETE FROM messages WHERE payload = 'z'",
            "DELETE FROM messages WHERE payload = 'x'",
            "INSERT INTO messages (queue, payload) VALUES ('c', 'u')",
            "UPDATE messages SET consumer = NULL WHERE payload = 'r'",
        ] {
            conn.execute(sql, []).unwrap();
        }
        let counts: Vec<(String, String, i64)> = conn
            .prepare("SELECT queue, kind, n FROM broker_counts ORDER BY queue, kind")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let row = |q: &str, k: &str, n: i64| (q.to_string(), k.to_string(), n);
        assert_eq!(
            counts,
            vec![
                row("a", "dead", 0),
                row("a", "ready", 1),
                row("b", "dead", 1),
                row("b", "ready", 0),
                row("c", "dead", 0),
                row("c", "ready", 1),
                row("d", "dead", 0),
                row("d", "ready", 1),
            ]
        );
    }

    #[test]
    fn files_opened_at_once_apply_each_migration_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let runs: Vec<_> = (0..6)
            .map(|_| {
                let path = path.clone();
                std::thread::spawn(move || migrate_file(&path).unwrap())
            })
            .collect();
        let results: Vec<_> = runs.into_iter().map(|r| r.join().unwrap()).collect();
        let latest = crate::schema::latest(MIGRATIONS);
        assert!(results.iter().all(|(_, v)| *v == latest), "{results:?}");
        let appliers: Vec<_> = results.iter().filter(|(a, _)| !a.is_empty()).collect();
        assert_eq!(appliers.len(), 1, "{results:?}");
        let names: Vec<&str> = MIGRATIONS.iter().map(|m| m.name).collect();
        assert_eq!(appliers[0].0, names);
        // A file current under the recorded table is also current for older builds.
        let conn = open_conn(&path).unwrap();
        let uv: i32 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(uv, latest);
        assert_eq!(migrate_file(&path).unwrap(), (Vec::new(), latest));
    }

    /// Under steady writes with a read transaction always open somewhere, the write-ahead log
    /// still starts over: it stays near `WAL_RESTART_BYTES` instead of growing with every
    /// commit (without `keep_wal_short` this run left a log of about 70 MB, on 4 KiB pages).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_log_starts_over_under_overlapping_readers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let db = Db::open(&path).unwrap();
        db.write(|tx| tx.execute_batch("CREATE TABLE blobs (x BLOB)"))
            .await
            .unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Two readers, each holding a snapshot 5 ms, staggered: one is always open.
        let readers: Vec<_> = (0..2u64)
            .map(|i| {
                let (path, stop) = (path.clone(), stop.clone());
                std::thread::spawn(move || {
                    let c = open_conn(&path).unwrap();
                    std::thread::sleep(Duration::from_micros(2_500 * i));
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        c.execute_batch("BEGIN").unwrap();
                        let _: i64 = c
                            .query_row("SELECT count(*) FROM blobs", [], |r| r.get(0))
                            .unwrap();
                        std::thread::sleep(Duration::from_millis(5));
                        c.execute_batch("COMMIT").unwrap();
                    }
                })
            })
            .collect();
        let wal = wal_path(&path);
        let mut longest = 0;
        for _ in 0..1_000 {
            db.write(|tx| {
                tx.execute("INSERT INTO blobs VALUES (zeroblob(65536))", [])?;
                tx.execute(
                    "DELETE FROM blobs WHERE rowid < (SELECT max(rowid) - 4 FROM blobs)",
                    [],
                )
            })
            .await
            .unwrap();
            longest = longest.max(std::fs::metadata(&wal).unwrap().len());
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
        assert!(
            longest < WAL_RESTART_BYTES + (8 << 20),
            "the log grew to {longest} bytes"
        );
    }

    /// A file removed from under the process: writes to it are refused within a second, with
    /// the reason, and every write it committed is in the copy saved beside the path. Without
    /// the check the writes go on into the removed file and nothing is saved.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_stop_and_the_file_is_saved_once_it_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let db = Db::open(&path).unwrap();
        db.write(|tx| tx.execute_batch("CREATE TABLE kept (n INTEGER)"))
            .await
            .unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.clone().into_os_string();
            p.push(suffix);
            std::fs::remove_file(p).unwrap();
        }
        let mut committed = Vec::new();
        let refused = loop {
            let n = committed.len() as i64;
            match db
                .write(move |tx| tx.execute("INSERT INTO kept VALUES (?1)", [n]))
                .await
            {
                Ok(_) => committed.push(n),
                Err(e) => break e,
            }
            assert!(
                committed.len() < 2_000,
                "writes went on into the removed file"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        assert!(refused.is_transient(), "{refused}");
        let saved = dir.path().join(format!(
            "h.db.removed-{}",
            db.opened.as_ref().unwrap().ino()
        ));
        assert!(
            refused.to_string().contains("was removed or replaced"),
            "{refused}"
        );
        assert!(
            refused.to_string().contains(&saved.display().to_string()),
            "{refused}"
        );
        // Refused from now on, reads too (a new connection would open the path).
        assert!(db
            .write(|tx| tx.execute("DELETE FROM kept", []))
            .await
            .is_err());
        let read = db
            .read(|c| c.query_row("SELECT count(*) FROM kept", [], |r| r.get::<_, i64>(0)))
            .await;
        assert!(read.is_err_and(|e| e.to_string().contains("was removed")));

        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !saved.exists() {
            assert!(std::time::Instant::now() < deadline, "no copy at {saved:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let copy = Connection::open(&saved).unwrap();
        let rows: Vec<i64> = copy
            .prepare("SELECT n FROM kept ORDER BY n")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(rows, committed, "the copy holds every committed write");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().ends_with(".part"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    /// A file homing creates has small pages; a file an older build created keeps its own page
    /// size, opens, migrates and takes writes as before.
    #[tokio::test]
    async fn new_files_get_small_pages_and_old_files_keep_theirs() {
        let dir = tempfile::tempdir().unwrap();
        let page_size = |path: &Path| -> i64 {
            Connection::open(path)
                .unwrap()
                .pragma_query_value(None, "page_size", |r| r.get(0))
                .unwrap()
        };
        let new = dir.path().join("new.db");
        let db = Db::open(&new).unwrap();
        assert_eq!(page_size(&new), PAGE_SIZE);
        assert_eq!(db.frames, WalFrames::for_page_size(PAGE_SIZE as u64));
        drop(db);

        let old = dir.path().join("old.db");
        let c = Connection::open(&old).unwrap();
        c.pragma_update(None, "page_size", 4096).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        c.execute_batch("CREATE TABLE before_homing (x); INSERT INTO before_homing VALUES (0)")
            .unwrap();
        // Held open, so its rows are still only in the log when homing opens the file.
        let log_len = std::fs::metadata(wal_path(&old)).unwrap().len();
        assert!(log_len > 0);
        let db = Db::open(&old).unwrap();
        assert_eq!(db.frames, WalFrames::for_page_size(4096));
        db.write(|tx| tx.execute("INSERT INTO before_homing VALUES (1)", []))
            .await
            .unwrap();
        let rows: i64 = db
            .read(|c| c.query_row("SELECT count(*) FROM before_homing", [], |r| r.get(0)))
            .await
            .unwrap();
        assert_eq!(rows, 2);
        drop(db);
        drop(c);
        assert_eq!(page_size(&old), 4096);
        // Reopened by this build, it is still the old size.
        let _ = Db::open(&old).unwrap();
        assert_eq!(page_size(&old), 4096);
    }

    /// A checkpoint that copied the whole log starts it over on the checkpoint thread, so the
    /// next commit appends to a new log instead of writing (and syncing) its header.
    #[tokio::test]
    async fn a_checkpoint_that_copies_the_whole_log_starts_it_over_itself() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let db = Db::open(&path).unwrap();
        db.write(|tx| tx.execute_batch("CREATE TABLE scratch (x)"))
            .await
            .unwrap();
        for i in 0..20 {
            db.write(move |tx| tx.execute("INSERT INTO scratch VALUES (?1)", [i]))
                .await
                .unwrap();
        }
        // The log header's checkpoint sequence number (bytes 12..16) goes up at every restart.
        let restarts = || {
            let head = std::fs::read(wal_path(&path)).unwrap();
            u32::from_be_bytes(head[12..16].try_into().unwrap())
        };
        let before = restarts();
        db.checkpoint();
        let after = restarts();
        assert_ne!(
            before, after,
            "the checkpoint left the log for the next writer to restart"
        );
        db.write(|tx| tx.execute("INSERT INTO scratch VALUES (20)", []))
            .await
            .unwrap();
        assert_eq!(
            restarts(),
            after,
            "the next commit started the log over again"
        );
        let (rows, version): (i64, i64) = db
            .read(|c| {
                Ok((
                    c.query_row("SELECT count(*) FROM scratch", [], |r| r.get(0))?,
                    c.query_row("PRAGMA user_version", [], |r| r.get(0))?,
                ))
            })
            .await
            .unwrap();
        assert_eq!(rows, 21);
        assert_eq!(version, i64::from(db.migrated.1));
    }

    /// The log's thresholds are lengths in bytes; the hook counts frames. A file of 4 KiB pages
    /// keeps the counts it always had, and a file of smaller pages gets more frames for the
    /// same bytes, not an earlier backstop.
    #[test]
    fn the_logs_thresholds_are_the_same_bytes_whatever_the_page_size() {
        assert_eq!(
            WalFrames::for_page_size(4096),
            WalFrames {
                checkpoint: 1000,
                backstop: ((WAL_RESTART_BYTES + (4 << 20)) / 4120) as i32,
                backstop_gap: 250,
            }
        );
        for page in [512u64, 1024, 2048, 4096, 8192, 65536] {
            let f = WalFrames::for_page_size(page);
            let bytes = |frames: i32| frames as u64 * (page + 24);
            for (frames, target) in [
                (f.checkpoint, CHECKPOINT_BYTES),
                (f.backstop, BACKSTOP_BYTES),
                (f.backstop_gap, BACKSTOP_GAP_BYTES),
            ] {
                assert!(bytes(frames) <= target, "{page}: {f:?}");
                assert!(bytes(frames + 1) > target, "{page}: {f:?}");
            }
            assert!(bytes(f.backstop) > WAL_RESTART_BYTES, "{page}: {f:?}");
        }
    }

    /// On a file of small pages the backstop comes at its length in bytes, not at the frame count
    /// of 4 KiB pages (which would be about 18 MiB of 2 KiB frames, below the 32 MiB where the
    /// ordinary restart begins, and would hold every writer up to 100 ms each time). A reader
    /// holding one snapshot keeps the log from starting over, so it only grows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_backstop_waits_for_its_bytes_on_a_file_of_small_pages() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let db = Db::open(&path).unwrap();
        assert_eq!(db.frames, WalFrames::for_page_size(2048));
        db.write(|tx| tx.execute_batch("CREATE TABLE blobs (x BLOB)"))
            .await
            .unwrap();
        let reader = open_conn(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM blobs", [], |r| r.get(0))
            .unwrap();
        let wal = wal_path(&path);
        let log = || std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        let grow = |until: u64| {
            let db = db.clone();
            async move {
                while std::fs::metadata(wal_path(&db.path))
                    .map(|m| m.len())
                    .unwrap_or(0)
                    < until
                {
                    db.write(|tx| tx.execute("INSERT INTO blobs VALUES (zeroblob(65536))", []))
                        .await
                        .unwrap();
                }
            }
        };
        grow(WAL_RESTART_BYTES - (2 << 20)).await;
        assert_eq!(
            (
                db.backstop_misses.load(Ordering::Relaxed),
                db.backstop_at.load(Ordering::Relaxed)
            ),
            (0, 0),
            "the backstop was tried before {} bytes of log",
            log()
        );
        grow(BACKSTOP_BYTES + (1 << 20)).await;
        assert!(
            db.backstop_misses.load(Ordering::Relaxed) >= 1,
            "the backstop was not tried by {} bytes of log",
            log()
        );
        reader.execute_batch("COMMIT").unwrap();
    }

    /// Checkpoints run beside the commits, not in them, and still keep the log bounded under
    /// writes without a pause. SQLite starts a log over only in a write transaction that began
    /// after a checkpoint copied every frame, a moment a checkpoint on another thread seldom
    /// catches while commits go on, so the PASSIVE ones keep the main file up to date and the
    /// RESTART past 32 MiB starts the log over: the log must stay within 40 MiB. With no
    /// checkpoint started after the commits (the hook in place of SQLite's own), every frame
    /// of the 6,000 commits stays in the log (173 MB on 4 KiB pages).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn checkpoints_off_the_commit_keep_the_log_short() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let db = Db::open(&path).unwrap();
        db.write(|tx| tx.execute_batch("CREATE TABLE pages (x BLOB)"))
            .await
            .unwrap();
        let wal = wal_path(&path);
        let mut longest = 0;
        let mut restarts = 0;
        let mut last = 0;
        for _ in 0..6_000 {
            db.write(|tx| {
                tx.execute("INSERT INTO pages VALUES (zeroblob(12000))", [])?;
                tx.execute(
                    "DELETE FROM pages WHERE rowid < (SELECT max(rowid) FROM pages)",
                    [],
                )
            })
            .await
            .unwrap();
            longest = longest.max(std::fs::metadata(&wal).unwrap().len());
            let frames = db.wal_frames.load(Ordering::Relaxed);
            if frames < last {
                restarts += 1;
            }
            last = frames;
        }
        assert!(
            longest <= 40 << 20,
            "the log grew to {longest} bytes ({restarts} restarts)"
        );
        assert!(restarts >= 2, "the log started over {restarts} times");
    }

    /// A bulk step's page (docs/bulk.md) is a backward range scan of the index leading with
    /// both of its equalities, not a walk of one of them filtering the other row by row.
    #[test]
    fn a_bulk_step_walks_the_index_of_its_filter() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        migrate_file(&path).unwrap();
        let conn = open_conn(&path).unwrap();
        for (col, index) in [
            ("task", "jobs_state_task_id"),
            ("queue", "jobs_state_queue_id"),
        ] {
            let sql = format!(
                "EXPLAIN QUERY PLAN SELECT id FROM jobs WHERE state = 'failed' AND {col} = 'x' \
                 AND id < 'z' ORDER BY id DESC LIMIT 501"
            );
            let plan: Vec<String> = conn
                .prepare(&sql)
                .unwrap()
                .query_map([], |r| r.get::<_, String>(3))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            let plan = plan.join(" | ");
            assert!(plan.contains(index), "{col}: {plan}");
            assert!(!plan.contains("TEMP B-TREE"), "{col} sorts: {plan}");
        }
    }
}
