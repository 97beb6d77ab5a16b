//! Versioned schema migrations for the PostgreSQL store. Several servers and workers usually start
//! at once against one database, so migrations run inside one transaction that first takes a
//! transaction-scoped advisory lock: the first process applies what is missing, the others wait
//! for it and then find nothing left to do. PostgreSQL's DDL is transactional, so a process killed
//! halfway leaves the schema as it was.
//!
//! Planning, recording and reporting are shared with the SQLite store ([`crate::schema`]); this
//! module runs them the PostgreSQL way.

use sqlx::{Executor, PgConnection, PgPool};

pub use crate::schema::Migration;
use crate::schema::{pending, warn_if_newer};

/// Every migration, in the order it must be applied.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_init",
        sql: include_str!("migrations/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "0002_events",
        sql: include_str!("migrations/0002_events.sql"),
    },
    Migration {
        version: 3,
        name: "0003_queues",
        sql: include_str!("migrations/0003_queues.sql"),
    },
    Migration {
        version: 4,
        name: "0004_remote",
        sql: include_str!("migrations/0004_remote.sql"),
    },
    Migration {
        version: 5,
        name: "0005_schedules",
        sql: include_str!("migrations/0005_schedules.sql"),
    },
    Migration {
        version: 6,
        name: "0006_limits",
        sql: include_str!("migrations/0006_limits.sql"),
    },
    Migration {
        version: 7,
        name: "0007_workflows",
        sql: include_str!("migrations/0007_workflows.sql"),
    },
    Migration {
        version: 8,
        name: "0008_queue_limits",
        sql: include_str!("migrations/0008_queue_limits.sql"),
    },
    Migration {
        version: 9,
        name: "0009_audit",
        sql: include_str!("migrations/0009_audit.sql"),
    },
    Migration {
        version: 10,
        name: "0010_enqueue_checks",
        sql: include_str!("migrations/0010_enqueue_checks.sql"),
    },
    Migration {
        version: 11,
        name: "0011_rate_windows",
        sql: include_str!("migrations/0011_rate_windows.sql"),
    },
    Migration {
        version: 12,
        name: "0012_stats",
        sql: include_str!("migrations/0012_stats.sql"),
    },
    Migration {
        version: 13,
        name: "0013_search",
        sql: include_str!("migrations/0013_search.sql"),
    },
    Migration {
        version: 14,
        name: "0014_traceparent",
        sql: include_str!("migrations/0014_traceparent.sql"),
    },
    Migration {
        version: 15,
        name: "0015_job_history",
        sql: include_str!("migrations/0015_job_history.sql"),
    },
    Migration {
        version: 16,
        name: "0016_worker_reclaims",
        sql: include_str!("migrations/0016_worker_reclaims.sql"),
    },
    Migration {
        version: 17,
        name: "0017_queue_counts",
        sql: include_str!("migrations/0017_queue_counts.sql"),
    },
    Migration {
        version: 18,
        name: "0018_bulk",
        sql: include_str!("migrations/0018_bulk.sql"),
    },
    Migration {
        version: 19,
        name: "0019_prune",
        sql: include_str!("migrations/0019_prune.sql"),
    },
    Migration {
        version: 20,
        name: "0020_finished_counts",
        sql: include_str!("migrations/0020_finished_counts.sql"),
    },
    // 21 is SQLite's alone (partial indexes); the numbers stay shared.
    Migration {
        version: 22,
        name: "0022_stats_live",
        sql: include_str!("migrations/0022_stats_live.sql"),
    },
    // 23 is SQLite's alone (its broker's counts).
    Migration {
        version: 24,
        name: "0024_presumed_lost",
        sql: include_str!("migrations/0024_presumed_lost.sql"),
    },
    Migration {
        version: 25,
        name: "0025_presumed_runs",
        sql: include_str!("migrations/0025_presumed_runs.sql"),
    },
    Migration {
        version: 26,
        name: "0026_schedule_names_bytewise",
        sql: include_str!("migrations/0026_schedule_names_bytewise.sql"),
    },
    Migration {
        version: 27,
        name: "0027_schedule_changes",
        sql: include_str!("migrations/0027_schedule_changes.sql"),
    },
];

/// The advisory lock that serialises migrations: "homing" in ASCII. Advisory locks are
/// per database, so two homing databases on one server do not wait for each other.
const LOCK_KEY: i64 = 0x686f_6d69_6e67;

/// Applies every migration the database lacks; returns the names of those it applied and the
/// schema version the database is at afterwards.
pub(crate) async fn apply(pool: &PgPool) -> sqlx::Result<(Vec<&'static str>, i32)> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(LOCK_KEY)
        .execute(&mut *tx)
        .await?;
    // Only after the lock: a large migration may take longer than the usual statement limit.
    sqlx::query("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await?;
    let applied = apply_locked(&mut tx).await?;
    tx.commit().await?;
    Ok(applied)
}

async fn apply_locked(conn: &mut PgConnection) -> sqlx::Result<(Vec<&'static str>, i32)> {
    // Checked rather than `CREATE TABLE IF NOT EXISTS`, which logs a notice on every start.
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('homing_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        sqlx::query(
            "CREATE TABLE homing_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, \
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .execute(&mut *conn)
        .await?;
    }
    let done: Vec<i32> = sqlx::query_scalar("SELECT version FROM homing_migrations")
        .fetch_all(&mut *conn)
        .await?;
    warn_if_newer("postgres", MIGRATIONS, &done);
    let mut version = done.iter().copied().max().unwrap_or(0);
    let mut applied = Vec::new();
    // A plain loop: an iterator adaptor's closure held across `.await` makes the future !Send.
    for m in pending(MIGRATIONS, &done) {
        // A `&str` runs as a simple query, which may hold several statements. (`raw_sql`
        // would too, but its generic `async fn` makes the caller's future not `Send`.)
        conn.execute(m.sql).await?;
        sqlx::query("INSERT INTO homing_migrations (version, name) VALUES ($1, $2)")
            .bind(m.version)
            .bind(m.name)
            .execute(&mut *conn)
            .await?;
        tracing::info!(migration = m.name, "applied PostgreSQL migration");
        applied.push(m.name);
        version = version.max(m.version);
    }
    Ok((applied, version))
}
