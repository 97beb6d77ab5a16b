//! The charts' rollup statements (docs/charts.md), written once for both stores: the SQL is
//! the same but for table names, the boolean-to-integer cast and the upsert's `MAX`, so each
//! statement is built here from a [`Dialect`] and each store only runs them in its own
//! transaction. Why statements and not Rust loops over jobs: a minute of a busy queue is
//! thousands of rows, and grouping them where they are costs one index range scan.

use crate::stats::{bucket_sql, Dialect, HOUR, MINUTE};

/// The table names of one store.
fn t(d: Dialect, name: &str) -> String {
    match d {
        Dialect::Sqlite => name.to_string(),
        Dialect::Postgres => format!("homing_{name}"),
    }
}

fn flag(cond: &str) -> String {
    format!("CASE WHEN {cond} THEN 1 ELSE 0 END")
}

/// The statements that replace the rollups of minutes `[?1, ?2)` and of hours `[?3, ?4)` (the
/// hours those minutes touch), in three parts that must run in order. Placeholders are `?n` for
/// SQLite and `$n` for PostgreSQL; every statement takes the same four parameters.
pub(crate) struct RollUp {
    /// Deletes the minutes' rows.
    pub clear: Vec<String>,
    /// Per minute table, `INSERT INTO table (columns)` and the query that counts its rows from
    /// the jobs. PostgreSQL runs them as one `INSERT … SELECT` (it groups by hashing). SQLite
    /// computes the same rows in one streamed read of the jobs in a read snapshot
    /// (`sqlite.rs::count_minutes`, held to these queries by a test), so that the single
    /// writer is not held while a busy minute's jobs are scanned and nothing is sorted, and
    /// inserts the few rows it gives.
    // Without PostgreSQL only SQLite's test reads it.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub minutes: Vec<(String, String)>,
    /// Recomputes the hours from the minutes (which then include the ones just written).
    pub hours: Vec<String>,
}

impl RollUp {
    /// Every statement in order, each minute table filled by `INSERT … SELECT`.
    #[cfg(feature = "postgres")]
    pub fn statements(&self) -> Vec<String> {
        let minutes = self.minutes.iter().map(|(i, q)| format!("{i} {q}"));
        let clear = self.clear.iter().cloned();
        clear
            .chain(minutes)
            .chain(self.hours.iter().cloned())
            .collect()
    }
}

pub(crate) fn roll_up(d: Dialect) -> RollUp {
    let p = |n: u8| match d {
        Dialect::Sqlite => format!("?{n}"),
        Dialect::Postgres => format!("${n}"),
    };
    let (from, to, hfrom, hto) = (p(1), p(2), p(3), p(4));
    let jobs = t(d, "jobs");
    let counts = t(d, "stats_counts");
    let latency = t(d, "stats_latency");
    // Every statement binds all four parameters (PostgreSQL wants each one used and typed).
    let all4 = format!("{from} <= {to} AND {hfrom} <= {hto}");
    let minute = format!("(finished_at / {MINUTE}) * {MINUTE}");
    let window =
        format!("finished_at >= {from} AND finished_at < {to} AND finished_at IS NOT NULL");
    // A handler error is retried unless it was the last one of a failed job.
    let retried =
        "SUM(CASE WHEN state = 'failed' AND attempts > 0 THEN attempts - 1 ELSE attempts END)";
    let clear = vec![
        format!("DELETE FROM {counts} WHERE span = 60 AND at >= {from} AND at < {to} AND {all4}"),
        format!("DELETE FROM {latency} WHERE span = 60 AND at >= {from} AND at < {to} AND {all4}"),
    ];
    let counts_cols = format!(
        "INSERT INTO {counts} (span, at, queue, succeeded, failed, dead, cancelled, retried)"
    );
    let mut minutes = vec![(
        counts_cols,
        format!(
            "SELECT 60, {minute}, queue, SUM({}), SUM({}), SUM({}), SUM({}), {retried} \
             FROM {jobs} WHERE {window} AND {all4} \
             AND state IN ('succeeded', 'failed', 'dead', 'cancelled') GROUP BY 2, 3",
            flag("state = 'succeeded'"),
            flag("state = 'failed'"),
            flag("state = 'dead'"),
            flag("state = 'cancelled'"),
        ),
    )];
    // Enqueue→start of the last attempt (from its due time when it had one) and its run time,
    // for jobs that ran to an end (a dead job's start may be a crashed run's).
    for (kind, duration) in [
        (
            crate::stats::WAIT,
            "started_at - COALESCE(scheduled_at, created_at)",
        ),
        (crate::stats::RUN, "finished_at - started_at"),
    ] {
        minutes.push((
            format!("INSERT INTO {latency} (span, at, queue, kind, bucket, n)"),
            format!(
                "SELECT 60, {minute}, queue, '{kind}', {}, COUNT(*) FROM {jobs} \
                 WHERE {window} AND {all4} AND started_at IS NOT NULL \
                 AND state IN ('succeeded', 'failed') GROUP BY 2, 3, 5",
                bucket_sql(duration, d)
            ),
        ));
    }
    let hour = format!("(at / {HOUR}) * {HOUR}");
    let hours = format!("at >= {hfrom} AND at < {hto} AND {all4}");
    let hours = vec![
        format!("DELETE FROM {counts} WHERE span = 3600 AND {hours}"),
        format!("DELETE FROM {latency} WHERE span = 3600 AND {hours}"),
        format!(
            "INSERT INTO {counts} (span, at, queue, succeeded, failed, dead, cancelled, retried) \
             SELECT 3600, {hour}, queue, SUM(succeeded), SUM(failed), SUM(dead), SUM(cancelled), \
             SUM(retried) FROM {counts} WHERE span = 60 AND {hours} GROUP BY 2, 3"
        ),
        format!(
            "INSERT INTO {latency} (span, at, queue, kind, bucket, n) \
             SELECT 3600, {hour}, queue, kind, bucket, SUM(n) FROM {latency} \
             WHERE span = 60 AND {hours} GROUP BY 2, 3, 4, 5"
        ),
    ];
    RollUp {
        clear,
        minutes,
        hours,
    }
}

/// The statement that records one depth sample: parameters are the minute, the hour, and
/// the span of the row it writes (run once per span).
pub(crate) fn sample_depth(d: Dialect) -> String {
    let (at, span, max) = match d {
        Dialect::Sqlite => ("?1", "?2", "MAX"),
        Dialect::Postgres => ("$1", "$2", "GREATEST"),
    };
    let depth = t(d, "stats_depth");
    // From the kept counts (docs/counts.md), not a count of the jobs: a sample costs a few
    // rows however deep the queues are. PostgreSQL keeps them as deltas, hence the sum.
    format!(
        "INSERT INTO {depth} (span, at, queue, depth) \
         SELECT {span}, {at}, queue, SUM(n) FROM {} WHERE state = 'queued' GROUP BY queue \
         HAVING SUM(n) > 0 \
         ON CONFLICT (span, at, queue) DO UPDATE SET depth = {max}({depth}.depth, excluded.depth)",
        t(d, "queue_counts")
    )
}

/// Moves the cursor's `rolled_to` forward to the first parameter (never back) and sets its
/// `live_to` to the second: the end of the minutes just recomputed, which is what the rows now
/// hold whichever pass wrote them last.
pub(crate) fn advance_cursor(d: Dialect) -> String {
    let (closed, live, max) = match d {
        Dialect::Sqlite => ("?1", "?2", "MAX"),
        Dialect::Postgres => ("$1", "$2", "GREATEST"),
    };
    let c = t(d, "stats_cursor");
    format!(
        "INSERT INTO {c} (id, rolled_to, live_to) VALUES (1, {closed}, {live}) \
         ON CONFLICT (id) DO UPDATE SET rolled_to = {max}({c}.rolled_to, excluded.rolled_to), \
         live_to = excluded.live_to"
    )
}

/// The cursor: `rolled_to`, and `live_to` (`rolled_to` when no pass has recorded one).
pub(crate) fn read_cursor(d: Dialect) -> String {
    format!(
        "SELECT rolled_to, COALESCE(live_to, rolled_to) FROM {} WHERE id = 1",
        t(d, "stats_cursor")
    )
}

/// The three reads of [`crate::store::Store::stats_rows`]: counts, latency, depth, each taking
/// the span and `[from, to)`.
pub(crate) fn reads(d: Dialect) -> [String; 3] {
    let (s, f, e) = match d {
        Dialect::Sqlite => ("?1", "?2", "?3"),
        Dialect::Postgres => ("$1", "$2", "$3"),
    };
    let w = format!("WHERE span = {s} AND at >= {f} AND at < {e}");
    [
        format!(
            "SELECT at, queue, succeeded, failed, dead, cancelled, retried FROM {} {w}",
            t(d, "stats_counts")
        ),
        format!(
            "SELECT at, queue, kind, bucket, n FROM {} {w}",
            t(d, "stats_latency")
        ),
        format!("SELECT at, queue, depth FROM {} {w}", t(d, "stats_depth")),
    ]
}

/// The pruner's deletions: rows of each rollup table whose period started before the
/// parameter, at most the second parameter of each.
pub(crate) fn purge(d: Dialect) -> Vec<String> {
    let (before, limit) = match d {
        Dialect::Sqlite => ("?1", "?2"),
        Dialect::Postgres => ("$1", "$2"),
    };
    let key = match d {
        Dialect::Sqlite => "rowid",
        Dialect::Postgres => "ctid",
    };
    ["stats_counts", "stats_latency", "stats_depth"]
        .iter()
        .map(|name| {
            let tb = t(d, name);
            format!(
                "DELETE FROM {tb} WHERE {key} IN (SELECT {key} FROM {tb} WHERE at < {before} \
                 LIMIT {limit})"
            )
        })
        .collect()
}
