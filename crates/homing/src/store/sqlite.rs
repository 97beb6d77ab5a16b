//! The store on the embedded SQLite file: the default, for one machine. Every method is one
//! `BEGIN IMMEDIATE` transaction, so a process killed mid-call leaves either the old state or
//! the new one, never a mix.

use async_trait::async_trait;
use rusqlite::{params, OptionalExtension, Row, Transaction};
use std::sync::Arc;

use super::stats_sql;
use super::*;
use crate::error::Error;
use crate::events::CALLBACK_TARGET;
use crate::history::{self, Cause};
use crate::job::{JobOptions, DEFAULT_MAX_CRASHES};
use crate::reclaim::{Reclaim, ReclaimOutcome};
use crate::sqlite::Db;
use crate::stats::Dialect;
use crate::transition::{self, Change};

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    db: Arc<Db>,
    /// Distinct queue names enqueue accepts (`store::queues`).
    max_queues: u64,
    known_queues: super::queues::KnownQueues,
}

impl SqliteStore {
    pub fn new(db: Arc<Db>) -> Self {
        Self {
            db,
            max_queues: super::queues::DEFAULT_MAX_QUEUES,
            known_queues: Default::default(),
        }
    }

    /// Sets how many distinct queue names enqueue accepts (`store::queues`).
    pub fn with_max_queues(mut self, max: u64) -> Self {
        self.max_queues = max;
        self
    }

    pub fn db(&self) -> &Arc<Db> {
        &self.db
    }

    /// Runs a `(queue, state, count)` query sorted by queue and folds it per queue.
    async fn grouped_counts(&self, sql: &'static str) -> Result<Vec<QueueStats>> {
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(sql)?;
                let rows = st.query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })?;
                let rows = rows.collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(group_counts(rows))
            })
            .await
    }
}

const COLUMNS: &str = "id, task, queue, state, args, result, error, attempts, crashes, epoch, \
    max_retries, max_crashes, retry_policy, time_limit_ms, idempotency_key, progress, worker, \
    created_at, scheduled_at, started_at, finished_at, cancel_requested, on_success, on_failure, \
    callback_url, workflow, parents, priority, traceparent";

fn corrupt(what: &str, e: impl std::fmt::Display) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(format!("corrupt {what}: {e}").into())
}

/// A JSON column, decoded leniently (see [`read_json`]).
fn json_col<T: serde::de::DeserializeOwned>(
    row: &Row<'_>,
    idx: usize,
    what: &str,
    unreadable: &mut Vec<String>,
) -> rusqlite::Result<Option<T>> {
    let s: Option<String> = row.get(idx)?;
    Ok(read_json(s.as_deref(), what, unreadable))
}

/// An integer column read without failing the row: `None` for null, and for a value of another
/// type (SQLite stores any type in any column), which is noted in `unreadable`.
fn int_col(
    row: &Row<'_>,
    idx: usize,
    what: &str,
    unreadable: &mut Vec<String>,
) -> rusqlite::Result<Option<i64>> {
    use rusqlite::types::ValueRef;
    Ok(match row.get_ref(idx)? {
        ValueRef::Integer(n) => Some(n),
        ValueRef::Null => None,
        other => {
            unreadable.push(format!(
                "{what} cannot be read: it is {}",
                other.data_type()
            ));
            None
        }
    })
}

/// A text column borrowed from the row (an error if it holds anything but text).
fn text_ref<'r>(row: &'r Row<'_>, idx: usize) -> rusqlite::Result<&'r str> {
    row.get_ref(idx)?.as_str().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// The minute rollups of the jobs that finished in `[from, to)`, as the counting queries of
/// `stats_sql::roll_up` compute them (a test holds the two to the same rows), in one read of
/// the range in `finished_at` order: those queries would read it three times, looking up each
/// job's row every time, and sort it for each `GROUP BY`.
fn count_minutes(
    c: &rusqlite::Connection,
    from: Micros,
    to: Micros,
) -> rusqlite::Result<(Vec<crate::stats::CountRow>, Vec<crate::stats::LatencyRow>)> {
    let mut st = c.prepare_cached(
        "SELECT finished_at, queue, state, attempts, started_at, \
         COALESCE(scheduled_at, created_at) FROM jobs INDEXED BY jobs_finished \
         WHERE finished_at >= ?1 AND finished_at < ?2 AND finished_at IS NOT NULL",
    )?;
    let mut rows = st.query([from, to])?;
    let mut tally = crate::stats::MinuteTally::default();
    while let Some(r) = rows.next()? {
        tally.add(
            r.get(0)?,
            text_ref(r, 1)?,
            text_ref(r, 2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
        );
    }
    Ok(tally.rows())
}

/// A text column read without failing the row: any stored value shown as text (`None` for null).
fn text_lossy(row: &Row<'_>, idx: usize) -> rusqlite::Result<Option<String>> {
    use rusqlite::types::ValueRef;
    Ok(match row.get_ref(idx)? {
        ValueRef::Null => None,
        ValueRef::Integer(n) => Some(n.to_string()),
        ValueRef::Real(x) => Some(x.to_string()),
        ValueRef::Text(t) | ValueRef::Blob(t) => Some(String::from_utf8_lossy(t).into_owned()),
    })
}

/// What a row holds as stored (text and blobs at their length, numbers at 8 bytes, nulls at
/// none), measured before it is decoded.
fn stored_bytes(row: &Row<'_>) -> rusqlite::Result<usize> {
    use rusqlite::types::ValueRef;
    let mut n = 0usize;
    for i in 0..row.as_ref().column_count() {
        n += match row.get_ref(i)? {
            ValueRef::Text(b) | ValueRef::Blob(b) => b.len(),
            ValueRef::Integer(_) | ValueRef::Real(_) => 8,
            ValueRef::Null => 0,
        };
    }
    Ok(n)
}

/// A job row, decoded so that no stored value but the id fails it: JSON columns, counters,
/// the epoch and the state that cannot be decoded are shown as null/zero/`queued` and named in
/// [`Job::unreadable`] (see [`crate::transition::unreadable_reason`]).
fn row_to_job(row: &Row<'_>) -> rusqlite::Result<Job> {
    let id: String = row.get(0)?;
    let mut bad = Vec::new();
    let state = read_state(text_lossy(row, 3)?.as_deref(), &mut bad);
    let args = json_col(row, 4, "args", &mut bad)?.unwrap_or(serde_json::Value::Null);
    let result = json_col(row, 5, "result", &mut bad)?;
    let attempts = int_col(row, 7, "attempts", &mut bad)?;
    let attempts = read_u32(attempts, "attempts", &mut bad).unwrap_or(0);
    let crashes = int_col(row, 8, "crashes", &mut bad)?;
    let crashes = read_u32(crashes, "crashes", &mut bad).unwrap_or(0);
    let epoch = int_col(row, 9, "epoch", &mut bad)?;
    let epoch = match epoch.map(u64::try_from) {
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            bad.push(format!("epoch cannot be read: {e}"));
            0
        }
        None => 0,
    };
    let max_retries = int_col(row, 10, "max_retries", &mut bad)?;
    let max_retries = read_u32(max_retries, "max_retries", &mut bad);
    let max_crashes = int_col(row, 11, "max_crashes", &mut bad)?;
    let max_crashes = read_u32(max_crashes, "max_crashes", &mut bad).unwrap_or(0);
    let retry_policy = json_col(row, 12, "retry_policy", &mut bad)?;
    let progress = json_col(row, 15, "progress", &mut bad)?;
    let on_success = json_col(row, 22, "on_success", &mut bad)?;
    let on_failure = json_col(row, 23, "on_failure", &mut bad)?;
    let workflow = json_col(row, 25, "workflow", &mut bad)?;
    let parents = json_col(row, 26, "parents", &mut bad)?;
    let mut job = Job {
        id: id.parse().map_err(|e| corrupt("job id", e))?,
        task: text_lossy(row, 1)?.unwrap_or_default(),
        queue: text_lossy(row, 2)?.unwrap_or_default(),
        state,
        args,
        result,
        error: text_lossy(row, 6)?,
        attempts,
        crashes,
        epoch,
        max_retries,
        max_crashes,
        retry_policy,
        time_limit: int_col(row, 13, "time_limit_ms", &mut bad)?
            .map(|ms| std::time::Duration::from_millis(ms.max(0) as u64)),
        idempotency_key: row.get(14)?,
        progress,
        worker: text_lossy(row, 16)?,
        created_at: row.get(17)?,
        scheduled_at: row.get(18)?,
        started_at: row.get(19)?,
        finished_at: row.get(20)?,
        cancel_requested: int_col(row, 21, "cancel_requested", &mut bad)?.unwrap_or(0) != 0,
        on_success,
        on_failure,
        callback_url: row.get(24)?,
        schedule: None,
        scheduled_tick: None,
        priority: int_col(row, 27, "priority", &mut bad)?
            .and_then(|p| i32::try_from(p).ok())
            .unwrap_or(0),
        unreadable: bad,
        workflow,
        parents,
        traceparent: text_lossy(row, 28)?,
    };
    (job.schedule, job.scheduled_tick) = crate::schedule::tick_of(job.idempotency_key.as_deref());
    Ok(job)
}

fn get_job(tx: &rusqlite::Connection, id: &str) -> rusqlite::Result<Option<Job>> {
    // Cached: compiling this 25-column SELECT costs more than running it.
    tx.prepare_cached(&format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"))?
        .query_row([id], row_to_job)
        .optional()
}

/// Runs one statement without a result (a savepoint command) through the statement cache;
/// `execute_batch` would compile it again on every call.
fn exec_cached(tx: &rusqlite::Connection, sql: &str) -> rusqlite::Result<()> {
    tx.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// Timeline entries of one transaction, by job id, written together by [`write_history`].
type Timeline = Vec<(String, history::Entry)>;

/// Writes timeline entries (docs/timeline.md) with one cached statement run once per entry: a
/// multi-row INSERT would have a new shape for every batch size, each compiled afresh and
/// pushing the round's other statements out of the cache.
fn write_history(
    tx: &rusqlite::Connection,
    entries: &[(String, history::Entry)],
) -> rusqlite::Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut st = tx.prepare_cached(
        "INSERT INTO job_history (job_id, at, kind, state, epoch, worker, attempts, crashes, \
         message, data) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?;
    for (id, e) in entries {
        st.execute(params![
            id,
            e.at,
            e.kind.as_str(),
            e.state.as_str(),
            e.epoch.map(|n| n.min(i64::MAX as u64) as i64),
            e.worker,
            e.attempts,
            e.crashes,
            e.message,
            e.data.as_ref().map(to_json),
        ])?;
    }
    Ok(())
}

/// Keeps each of these jobs' timelines to its first entry and the latest
/// [`history::KEEP_LATEST`]: per job, everything after the first entry up to and including the
/// (KEEP_LATEST + 1)-th newest goes. A job with fewer entries has no such entry, the bound is
/// NULL and nothing is deleted; each run is two probes of the `(job_id, id)` index.
fn trim_history(tx: &rusqlite::Connection, ids: &[String]) -> rusqlite::Result<()> {
    let mut st = tx.prepare_cached(
        "DELETE FROM job_history WHERE job_id = ?1 \
         AND id > (SELECT min(id) FROM job_history WHERE job_id = ?1) \
         AND id <= (SELECT id FROM job_history WHERE job_id = ?1 ORDER BY id DESC \
                    LIMIT 1 OFFSET ?2)",
    )?;
    for id in ids {
        st.execute(params![id, history::KEEP_LATEST as i64])?;
    }
    Ok(())
}

/// A progress report's timeline entry: a new entry while the run has fewer than
/// [`history::PROGRESS_PER_RUN`], else the run's last progress entry takes the new value.
fn progress_entry(
    tx: &rusqlite::Connection,
    sid: &str,
    epoch: u64,
    value: &str,
    now: Micros,
) -> rusqlite::Result<()> {
    let epoch = epoch.min(i64::MAX as u64) as i64;
    let (count, last): (i64, Option<i64>) = tx
        .prepare_cached(
            "SELECT count(*), max(id) FROM job_history \
             WHERE job_id = ?1 AND epoch = ?2 AND kind = 'progress'",
        )?
        .query_row(params![sid, epoch], |r| Ok((r.get(0)?, r.get(1)?)))?;
    match last {
        Some(last) if count >= history::PROGRESS_PER_RUN as i64 => {
            tx.prepare_cached("UPDATE job_history SET data = ?2, at = ?3 WHERE id = ?1")?
                .execute(params![last, value, now])?;
        }
        _ => {
            tx.prepare_cached(
                "INSERT INTO job_history (job_id, at, kind, state, epoch, worker, attempts, \
                 crashes, data) SELECT id, ?2, 'progress', 'running', epoch, worker, attempts, \
                 crashes, ?3 FROM jobs WHERE id = ?1",
            )?
            .execute(params![sid, now, value])?;
            trim_history(tx, &[sid.to_string()])?;
        }
    }
    Ok(())
}

fn row_to_entry(r: &Row<'_>) -> rusqlite::Result<history::Entry> {
    let mut bad = Vec::new();
    Ok(history::Entry {
        at: r.get::<_, Option<i64>>(0)?.unwrap_or(0),
        kind: history::Kind::parse(&text_lossy(r, 1)?.unwrap_or_default()),
        state: read_state(text_lossy(r, 2)?.as_deref(), &mut bad),
        epoch: int_col(r, 3, "epoch", &mut bad)?.and_then(|n| u64::try_from(n).ok()),
        worker: text_lossy(r, 4)?,
        attempts: read_u32(int_col(r, 5, "attempts", &mut bad)?, "attempts", &mut bad).unwrap_or(0),
        crashes: read_u32(int_col(r, 6, "crashes", &mut bad)?, "crashes", &mut bad).unwrap_or(0),
        message: text_lossy(r, 7)?,
        data: text_lossy(r, 8)?
            .map(|t| serde_json::from_str(&t).unwrap_or(serde_json::Value::String(t))),
    })
}

pub(super) fn insert_one(tx: &Transaction<'_>, job: &NewJob) -> rusqlite::Result<Inserted> {
    if let Some(key) = &job.options.idempotency_key {
        let existing = tx
            .prepare_cached("SELECT id, queue, state FROM jobs WHERE idempotency_key = ?1")?
            .query_row([key], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .optional()?;
        if let Some((id, queue, state)) = existing {
            return Ok(Inserted {
                id: id.parse().map_err(|e| corrupt("job id", e))?,
                queue,
                state: read_state(Some(&state), &mut Vec::new()),
                existed: true,
            });
        }
    }
    let o: &JobOptions = &job.options;
    let args = to_json(&job.args);
    let unique_key = match o.unique_for {
        None => None,
        Some(window) => {
            // Under the write lock: no other enqueue can insert an equal job meanwhile.
            let key = crate::unique::key(&job.task, &job.queue, &args);
            let existing = tx
                .prepare_cached(
                    "SELECT id, queue, state FROM jobs WHERE unique_key = ?1 AND task = ?2 \
                     AND queue = ?3 AND args = ?4 AND (state IN ('scheduled', 'queued', 'running') \
                     OR finished_at >= ?5) ORDER BY created_at DESC LIMIT 1",
                )?
                .query_row(
                    params![
                        key,
                        job.task,
                        job.queue,
                        args,
                        crate::unique::finished_since(job.created_at, window)
                    ],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, String>(2)?,
                        ))
                    },
                )
                .optional()?;
            if let Some((id, queue, state)) = existing {
                return Ok(Inserted {
                    id: id.parse().map_err(|e| corrupt("job id", e))?,
                    queue,
                    state: read_state(Some(&state), &mut Vec::new()),
                    existed: true,
                });
            }
            Some(key)
        }
    };
    let scheduled = job.run_at.filter(|t| *t > job.created_at);
    let state = if scheduled.is_some() {
        JobState::Scheduled
    } else {
        JobState::Queued
    };
    tx.prepare_cached(
        "INSERT INTO jobs (id, task, queue, state, args, max_retries, max_crashes, retry_policy, \
         time_limit_ms, idempotency_key, created_at, scheduled_at, updated_at, on_success, on_failure, \
         callback_url, priority, unique_key, traceparent) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?11, ?13, ?14, ?15, ?16, ?17, ?18)",
    )?
    .execute(params![
        job.id.to_string(),
        job.task,
        job.queue,
        state.as_str(),
        args,
        o.max_retries,
        o.max_crashes.unwrap_or(DEFAULT_MAX_CRASHES),
        o.retry_policy.as_ref().map(to_json),
        o.time_limit.map(|d| d.as_millis() as i64),
        o.idempotency_key,
        job.created_at,
        scheduled,
        o.on_success.as_ref().map(to_json),
        o.on_failure.as_ref().map(to_json),
        o.callback_url,
        o.priority.unwrap_or(0),
        unique_key,
        o.traceparent,
    ])?;
    write_history(
        tx,
        &[(
            job.id.to_string(),
            history::enqueued(state, scheduled, job.created_at),
        )],
    )?;
    Ok(Inserted {
        id: job.id,
        queue: job.queue.clone(),
        state,
        existed: false,
    })
}

/// Which rows a [`write_change`] may touch besides the id.
enum Guard {
    /// Whatever its state (the caller read and decided on the row in this transaction).
    Any,
    /// Only while run `epoch` owns it: a newer run or a terminal transition got there first
    /// otherwise.
    Fence(u64),
    /// Only while it has not started (`queued` or `scheduled`).
    NotStarted,
    /// Only while it is running under this worker.
    Owner(String),
}

/// Writes a decided [`Change`] to job `id` in one statement and returns the row as committed,
/// or `None` when the guard does not hold. The statement's text depends only on which columns
/// change, so the few shapes there are stay in the prepared-statement cache.
fn write_change(
    tx: &Transaction<'_>,
    id: &str,
    guard: Guard,
    change: &Change,
    now: Micros,
) -> rusqlite::Result<Option<Job>> {
    let mut vals: Vec<Box<dyn rusqlite::ToSql>> = vec![Box::new(id.to_string()), Box::new(now)];
    // OR FAIL: with the count triggers (migration 26) nothing in this statement can abort,
    // so SQLite keeps no statement journal for it (docs/counts.md, "No statement journal").
    let mut sql = format!(
        "UPDATE OR FAIL jobs SET state = '{}', updated_at = ?2",
        change.state.as_str()
    );
    let mut bind = |sql: &mut String, col: &str, v: Box<dyn rusqlite::ToSql>| {
        vals.push(v);
        *sql += &format!(", {col} = ?{}", vals.len());
    };
    if change.count_attempt {
        sql += ", attempts = attempts + 1";
    }
    if change.count_crash {
        sql += ", crashes = crashes + 1";
    }
    match &change.error {
        None => {}
        Some(None) => sql += ", error = NULL",
        Some(Some(e)) => bind(&mut sql, "error", Box::new(e.clone())),
    }
    if let Some(r) = &change.result {
        bind(&mut sql, "result", Box::new(to_json(r)));
    }
    if let Some(at) = change.scheduled_at {
        bind(&mut sql, "scheduled_at", Box::new(at));
    }
    if change.finished {
        sql += ", finished_at = ?2";
    }
    if change.release_worker {
        sql += ", worker = NULL";
    }
    if change.republish {
        sql += ", dispatched = 0";
    }
    sql += " WHERE id = ?1";
    match guard {
        Guard::Any => {}
        Guard::Fence(epoch) => {
            // A fenced write is a completion: remember its epoch (`Store::last_completion`).
            sql = sql.replacen(
                " WHERE id = ?1",
                ", completed_epoch = epoch WHERE id = ?1",
                1,
            );
            vals.push(Box::new(epoch as i64));
            sql += &format!(" AND state = 'running' AND epoch = ?{}", vals.len());
        }
        Guard::NotStarted => sql += " AND state IN ('queued', 'scheduled', 'waiting')",
        Guard::Owner(worker) => {
            vals.push(Box::new(worker));
            sql += &format!(" AND state = 'running' AND worker = ?{}", vals.len());
        }
    }
    sql += &format!(" RETURNING {COLUMNS}");
    let refs: Vec<&dyn rusqlite::ToSql> = vals.iter().map(|v| v.as_ref()).collect();
    tx.prepare_cached(&sql)?
        .query_row(refs.as_slice(), row_to_job)
        .optional()
}

/// Writes what a transition brings with it, from the job as committed (`after`): its event and
/// its follow-up, and returns the jobs to publish (the job itself when it went back to
/// `queued`, and a new follow-up).
fn write_effects(
    tx: &Transaction<'_>,
    after: &Job,
    change: &Change,
    now: Micros,
) -> rusqlite::Result<Vec<ToPublish>> {
    let mut publish = Vec::new();
    if change.republish {
        publish.push(ToPublish {
            id: after.id,
            queue: after.queue.clone(),
            priority: after.priority,
        });
    }
    let fx = transition::effects_after(after, now);
    if fx.event {
        if let Some(ev) = NewEvent::for_terminal(after) {
            insert_event(tx, &ev, now)?;
        }
    }
    if let Some(f) = fx.follow_up {
        let ins = insert_one(tx, &f)?;
        if ins.needs_dispatch() {
            publish.push(ToPublish {
                id: ins.id,
                queue: ins.queue,
                priority: f.options.priority.unwrap_or(0),
            });
        }
    }
    if let (true, Some(link)) = (after.state.is_terminal(), &after.workflow) {
        publish.extend(settle_in(tx, &link.id.to_string(), now)?);
    }
    Ok(publish)
}

/// A workflow's steps, as jobs without their args, results and the rest of
/// [`crate::workflow::STEPS_LEAVE_OUT`].
fn workflow_jobs(tx: &rusqlite::Connection, workflow: &str) -> rusqlite::Result<Vec<Job>> {
    let columns: Vec<&str> = COLUMNS
        .split(',')
        .map(|c| crate::workflow::step_column(c.trim()))
        .collect();
    tx.prepare_cached(&format!(
        "SELECT {} FROM jobs WHERE workflow_id = ?1 ORDER BY id",
        columns.join(", ")
    ))?
    .query_map([workflow], row_to_job)?
    .collect()
}

/// The results of `ids`, those that have one and can be read.
fn results_of(
    tx: &rusqlite::Connection,
    ids: &[JobId],
) -> rusqlite::Result<std::collections::HashMap<JobId, serde_json::Value>> {
    let mut st = tx.prepare_cached("SELECT result FROM jobs WHERE id = ?1")?;
    let mut out = std::collections::HashMap::new();
    for id in ids {
        let text: Option<Option<String>> =
            st.query_row([id.to_string()], |r| r.get(0)).optional()?;
        if let Some(v) = read_json(text.flatten().as_deref(), "result", &mut Vec::new()) {
            out.insert(*id, v);
        }
    }
    Ok(out)
}

/// The stored size in bytes of each result of a workflow's steps (`octet_length` takes a text's
/// size from its record header, without reading the text).
fn result_sizes(
    tx: &rusqlite::Connection,
    workflow: &str,
) -> rusqlite::Result<std::collections::HashMap<JobId, u64>> {
    tx.prepare_cached(
        "SELECT id, octet_length(result) FROM jobs WHERE workflow_id = ?1 AND result IS NOT NULL",
    )?
    .query_map([workflow], |r| {
        Ok((parse_id(r.get(0)?)?, r.get::<_, i64>(1)?.max(0) as u64))
    })?
    .collect()
}

/// Applies [`crate::workflow::settle`] to a workflow whose step just reached a terminal state,
/// in that transition's transaction (SQLite's one writer makes the read and the writes atomic):
/// steps made runnable are returned to publish, cancelled ones get their callback event.
fn settle_in(
    tx: &Transaction<'_>,
    workflow: &str,
    now: Micros,
) -> rusqlite::Result<Vec<ToPublish>> {
    use crate::workflow::Settle;
    let steps = workflow_jobs(tx, workflow)?;
    let mut decided = crate::workflow::settle(&steps);
    if decided.iter().any(|d| matches!(d, Settle::Ready { .. })) {
        decided = crate::workflow::settle_within(&steps, &result_sizes(tx, workflow)?);
    }
    let results = results_of(tx, &crate::workflow::parents_to_read(&decided))?;
    let mut publish = Vec::new();
    for d in &decided {
        match d {
            Settle::Ready { id, parents } => {
                let parents = to_json(&crate::workflow::with_results(parents, &results));
                let queue: Option<(String, i64)> = tx
                    .prepare_cached(
                        "UPDATE jobs SET state = 'queued', dispatched = 0, parents = ?2, \
                         updated_at = ?3 WHERE id = ?1 AND state = 'waiting' RETURNING queue, priority",
                    )?
                    .query_row(params![id.to_string(), parents, now], |r| {
                        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
                    })
                    .optional()?;
                if let Some((queue, priority)) = queue {
                    write_history(
                        tx,
                        &[(
                            id.to_string(),
                            history::queued(history::Kind::Ready, 0, 0, now),
                        )],
                    )?;
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
                if let Some(after) = write_change(tx, &id.to_string(), Guard::Any, &change, now)? {
                    let e = history::changed(&after, &change, Cause::Other, None, now);
                    write_history(tx, &[(id.to_string(), e)])?;
                    if transition::effects_after(&after, now).event {
                        if let Some(ev) = NewEvent::for_terminal(&after) {
                            insert_event(tx, &ev, now)?;
                        }
                    }
                }
            }
        }
    }
    Ok(publish)
}

/// Settles the workflow of job `id`, if it has one (after a last-resort [`bury`], which reads
/// nothing it could decide on).
fn settle_job_workflow(tx: &Transaction<'_>, id: &str, now: Micros) -> rusqlite::Result<()> {
    let wf: Option<Option<String>> = tx
        .prepare_cached("SELECT workflow_id FROM jobs WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?;
    if let Some(Some(wf)) = wf {
        settle_in(tx, &wf, now)?;
    }
    Ok(())
}

/// The stored row of a workflow: name, created_at, cancelled_at.
fn workflow_row(
    c: &rusqlite::Connection,
    id: &str,
) -> rusqlite::Result<Option<(String, Micros, Option<Micros>)>> {
    c.prepare_cached("SELECT name, created_at, cancelled_at FROM workflows WHERE id = ?1")?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()
}

fn read_workflow(
    c: &rusqlite::Connection,
    id: crate::workflow::WorkflowId,
) -> rusqlite::Result<Option<crate::workflow::Workflow>> {
    let sid = id.to_string();
    let Some((name, created_at, cancelled_at)) = workflow_row(c, &sid)? else {
        return Ok(None);
    };
    let jobs = workflow_jobs(c, &sid)?;
    Ok(Some(crate::workflow::Workflow::from_parts(
        id,
        name,
        created_at,
        cancelled_at,
        &jobs,
    )))
}

/// A decided change with its event, follow-up and timeline entry, in the caller's transaction.
/// `ran_under` names the worker whose run the change ends, if it ends one
/// ([`history::changed`]).
fn transit(
    tx: &Transaction<'_>,
    id: &str,
    guard: Guard,
    change: &Change,
    (cause, ran_under): (Cause<'_>, Option<&str>),
    now: Micros,
) -> rusqlite::Result<Option<(Job, Vec<ToPublish>)>> {
    let Some(after) = write_change(tx, id, guard, change, now)? else {
        return Ok(None);
    };
    let e = history::changed(&after, change, cause, ran_under, now);
    write_history(tx, &[(id.to_string(), e)])?;
    let publish = write_effects(tx, &after, change, now)?;
    Ok(Some((after, publish)))
}

/// One round of a worker on the embedded file, in one write transaction: commit the batch's
/// outcomes, delete its messages (the late ack), then reserve up to `take` ready messages for
/// `worker` and start their jobs (the idempotency guard), as `reserve` and `start` would one
/// after the other. The reservations are the acknowledged messages' own: the messages this
/// worker holds never exceed what it held before the round (docs/fastpath.md, "The at-risk
/// bound"). Undecodable messages are reserved but not started (`None`): the caller dead-letters
/// them. All or nothing; an error leaves the caller to take the ordinary path.
pub(crate) async fn complete_and_take(
    db: &Arc<Db>,
    done: &[Completion],
    acks: &[crate::broker::Delivery],
    take: Take,
    now: Micros,
) -> Result<(Vec<Committed>, Vec<Taken>)> {
    let done = done.to_vec();
    let acks = crate::broker::sqlite::tags(acks);
    db.write(move |tx| {
        let out = complete_and_ack_in(tx, &done, &acks, now)?;
        let taken = take_in(tx, &take, now)?;
        Ok((out, taken))
    })
    .await
}

/// A remote worker session's round on the embedded file ([`crate::remote`]): as
/// [`complete_and_take`], but the take is made only while `take.worker`'s heartbeat is alive,
/// read under the same write lock (`None`: it was not, and nothing was reserved or started).
/// The completions stand either way: the fence decides them, not the session.
pub(crate) async fn complete_and_take_alive(
    db: &Arc<Db>,
    done: &[Completion],
    acks: &[crate::broker::Delivery],
    take: Take,
    now: Micros,
) -> Result<(Vec<Committed>, Option<Vec<Taken>>)> {
    let done = done.to_vec();
    let acks = crate::broker::sqlite::tags(acks);
    db.write(move |tx| {
        let out = complete_and_ack_in(tx, &done, &acks, now)?;
        let alive = crate::broker::sqlite::alive_in(tx, &take.worker, crate::time::now())?;
        let taken = if alive {
            Some(take_in(tx, &take, now)?)
        } else {
            None
        };
        Ok((out, taken))
    })
    .await
}

/// Commits `done` and deletes the messages `acks` names (the late ack), in the caller's write
/// transaction.
fn complete_and_ack_in(
    tx: &Transaction<'_>,
    done: &[Completion],
    acks: &[(i64, i64)],
    now: Micros,
) -> rusqlite::Result<Vec<Committed>> {
    let mut log = Timeline::new();
    let out = done
        .iter()
        .map(|c| complete_one(tx, c, now, &mut log))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    write_history(tx, &log)?;
    let mut st = tx.prepare_cached("DELETE FROM messages WHERE id = ?1 AND generation = ?2")?;
    for (id, gen) in acks {
        st.execute([id, gen])?;
    }
    Ok(out)
}

/// An idle worker's take on the embedded file: looks for a ready message of `take.queues` and,
/// if there is one, reserves and starts up to `take.max` in one write (the round of
/// [`complete_and_take`] with nothing to complete), the look and the write in one trip to the
/// blocking pool. `Ok(None)`: nothing looked ready, and nothing was written.
pub(crate) async fn take_if_ready(
    db: &Arc<Db>,
    take: Take,
    now: Micros,
) -> Result<Option<Vec<Taken>>> {
    crate::broker::sqlite::write_if_ready(db, take.queues.clone(), move |tx| {
        take_in(tx, &take, now)
    })
    .await
}

/// Reserves and starts what `take` asks for, in the caller's write transaction.
fn take_in(tx: &Transaction<'_>, take: &Take, now: Micros) -> rusqlite::Result<Vec<Taken>> {
    let mut taken: Vec<Taken> = Vec::new();
    if take.max == 0 {
        return Ok(taken);
    }
    let reserved = crate::broker::sqlite::reserve_in(tx, &take.worker, &take.queues, take.max)?;
    let ids: Vec<String> = reserved
        .iter()
        .filter_map(|d| d.job.as_ref().ok().map(|id| id.to_string()))
        .collect();
    // The start's time is read under the write lock, not taken from the caller: a message
    // reserved here may have been published by a transaction that committed while this one
    // waited for the lock (a workflow step made ready by its last parent), and its start must
    // not be stamped before what made it ready.
    let started_at = crate::time::now().max(now);
    let mut started = start_in(tx, &ids, &take.worker, started_at)?.into_iter();
    for d in reserved {
        let outcome = if d.job.is_ok() { started.next() } else { None };
        taken.push((d, outcome));
    }
    Ok(taken)
}

/// What a worker's round takes after its commit ([`complete_and_take`]): up to `max` messages of
/// `queues`, reserved and started under `worker`.
#[derive(Debug, Clone)]
pub(crate) struct Take {
    pub worker: String,
    pub queues: Vec<String>,
    pub max: usize,
}

/// A message reserved by [`complete_and_take`] and how its start went (`None`: undecodable).
pub(crate) type Taken = (crate::broker::Delivery, Option<StartOutcome>);

/// Commits one completion; its timeline entry goes to `log`, which the caller writes once for
/// the whole batch.
fn complete_one(
    tx: &Transaction<'_>,
    c: &Completion,
    now: Micros,
    log: &mut Timeline,
) -> rusqlite::Result<Committed> {
    let change = transition::complete(&c.outcome);
    let sid = c.id.to_string();
    // A change that releases the worker leaves the row without it; the entry still names it.
    let held_by: Option<String> = if change.release_worker {
        tx.prepare_cached("SELECT worker FROM jobs WHERE id = ?1")?
            .query_row([&sid], |r| text_lossy(r, 0))
            .optional()?
            .flatten()
    } else {
        None
    };
    let written = match write_change(tx, &sid, Guard::Fence(c.epoch), &change, now)? {
        Some(after) => {
            let worker = held_by.or_else(|| after.worker.clone());
            let e = history::changed(&after, &change, Cause::Completion, worker.as_deref(), now);
            log.push((sid.clone(), e));
            Some(write_effects(tx, &after, &change, now)?)
        }
        None => None,
    };
    match written {
        Some(mut publish) => {
            // The run left `running`: its slot is free, in this transaction.
            publish.extend(super::limits::sqlite::unpark_after_release(tx, &sid, now)?);
            Ok(Committed::Applied {
                state: change.state,
                dispatch: publish,
            })
        }
        None => Ok(Committed::Stale),
    }
}

/// The last resort for a job whose transition could not be written: `dead` with the reason and
/// its `job.dead` event, by a statement that writes no follow-up (a follow-up may be what could
/// not be written) and reads back only id, task, queue, worker and callback_url, decoding
/// nothing else, so that it works on any row ([`buried_job`]). `None` when the guard fails.
fn bury(
    tx: &Transaction<'_>,
    id: &str,
    guard: Guard,
    reason: &str,
    now: Micros,
) -> rusqlite::Result<Option<Job>> {
    let mut vals: Vec<Box<dyn rusqlite::ToSql>> = vec![
        Box::new(id.to_string()),
        Box::new(now),
        Box::new(reason.to_string()),
    ];
    let guard = match guard {
        Guard::Any => " WHERE id = ?1",
        Guard::Fence(epoch) => {
            vals.push(Box::new(epoch as i64));
            ", completed_epoch = epoch WHERE id = ?1 AND state = 'running' AND epoch = ?4"
        }
        Guard::NotStarted => " WHERE id = ?1 AND state IN ('queued', 'scheduled', 'waiting')",
        Guard::Owner(worker) => {
            vals.push(Box::new(worker));
            " WHERE id = ?1 AND state = 'running' AND worker = ?4"
        }
    };
    let refs: Vec<&dyn rusqlite::ToSql> = vals.iter().map(|v| v.as_ref()).collect();
    let after = tx
        .prepare_cached(&format!(
            "UPDATE jobs SET state = 'dead', error = ?3, finished_at = ?2, updated_at = ?2\
             {guard} RETURNING id, task, queue, worker, callback_url"
        ))?
        .query_row(refs.as_slice(), |r| {
            Ok((
                r.get::<_, String>(0)?,
                text_lossy(r, 1)?.unwrap_or_default(),
                text_lossy(r, 2)?.unwrap_or_default(),
                text_lossy(r, 3)?,
                text_lossy(r, 4)?,
            ))
        })
        .optional()?;
    let Some((sid, task, queue, worker, callback_url)) = after else {
        return Ok(None);
    };
    write_history(
        tx,
        &[(sid.clone(), history::buried(reason, worker.clone(), now))],
    )?;
    let job = buried_job(
        parse_id(sid)?,
        task,
        queue,
        worker,
        callback_url,
        reason,
        now,
    );
    if let Some(ev) = NewEvent::for_terminal(&job) {
        insert_event(tx, &ev, now)?;
    }
    settle_job_workflow(tx, id, now)?;
    Ok(Some(job))
}

/// Starts a batch in the caller's transaction, deciding each job by [`transition::start`].
///
/// The common case costs one statement per job: the fast path's WHERE clause is the rule's `Run`
/// condition for a readable row (`crashes < max_crashes` and queued, or scheduled and due),
/// which `fast_path_matches_the_start_rule` below checks against the rule for every state. The
/// fast path starts a row before it can read it, so the batch runs under one savepoint: if a row
/// it started turns out unreadable, the batch is undone and started again job by job, each
/// under a savepoint of its own, so that row is made dead unstarted (epoch, worker and
/// `started_at` as they were), exactly as the rule applied to the read row would. Rows the fast
/// path does not match are read and decided one by one.
fn start_in(
    tx: &Transaction<'_>,
    ids: &[String],
    worker: &str,
    now: Micros,
) -> rusqlite::Result<Vec<StartOutcome>> {
    // Under the write lock, so a presumption is either before this start (refused) or after it
    // (the runs it begins are among those the presumption records, and count a crash).
    let presumed: bool = tx
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM workers WHERE id = ?1 AND presumed_dead_at IS NOT NULL)",
        )?
        .query_row([worker], |r| r.get(0))?;
    if presumed {
        return Ok(vec![StartOutcome::Presumed; ids.len()]);
    }
    exec_cached(tx, "SAVEPOINT batch_start")?;
    let first = start_each(tx, ids, worker, now, false);
    if !matches!(first, Ok(Some(_))) {
        let undone = exec_cached(tx, "ROLLBACK TO batch_start");
        // After an error the statement's own is the one to report: one that ended the whole
        // transaction (a full disk, say; no statement journal undoes the statement alone) took
        // the savepoint with it, and the caller rolls back whatever is left.
        if first.is_ok() {
            undone?;
        }
    }
    let first = first?;
    exec_cached(tx, "RELEASE batch_start")?;
    match first {
        Some(out) => Ok(out),
        None => start_each(tx, ids, worker, now, true)
            .map(|out| out.expect("job by job, every row is decided")),
    }
}

/// [`start_in`]'s pass over the batch. Without `careful`, it gives up (`None`) at the first row
/// the fast path started whose data is unreadable; with it, each fast start runs under its own
/// savepoint, undone for such a row before it is made dead.
fn start_each(
    tx: &Transaction<'_>,
    ids: &[String],
    worker: &str,
    now: Micros,
    careful: bool,
) -> rusqlite::Result<Option<Vec<StartOutcome>>> {
    let mut out = Vec::with_capacity(ids.len());
    // The starts' timeline entries, written together once the batch is decided.
    let mut log = Timeline::new();
    // OR FAIL, as in `write_change`: no statement journal.
    let mut fast = tx.prepare_cached(&format!(
        "UPDATE OR FAIL jobs SET state = 'running', epoch = epoch + 1, worker = ?2, \
         started_at = ?3, dispatched = 1, parked = 0, updated_at = ?3 WHERE id = ?1 \
         AND {START_RUNS} AND {OPEN_QUEUE} RETURNING {COLUMNS}"
    ))?;
    for id in ids {
        if careful {
            tx.execute_batch("SAVEPOINT fast_start")?;
        }
        let started = fast
            .query_row(params![id, worker, now], row_to_job)
            .optional();
        let started = match started {
            Ok(s) => s,
            Err(e) => {
                if careful {
                    tx.execute_batch("ROLLBACK TO fast_start; RELEASE fast_start")?;
                }
                return Err(e);
            }
        };
        if let Some(job) = started {
            match transition::unreadable_reason(&job) {
                None => {
                    if careful {
                        tx.execute_batch("RELEASE fast_start")?;
                    }
                    log.push((id.clone(), history::started(&job, now)));
                    out.push(StartOutcome::Run(Box::new(job)));
                }
                Some(_) if !careful => return Ok(None),
                Some(reason) => {
                    tx.execute_batch("ROLLBACK TO fast_start; RELEASE fast_start")?;
                    transit(
                        tx,
                        id,
                        Guard::Any,
                        &Change::dead(reason),
                        (Cause::Start, None),
                        now,
                    )?;
                    out.push(StartOutcome::Dead);
                }
            }
            continue;
        }
        if careful {
            tx.execute_batch("RELEASE fast_start")?;
        }
        let Some(job) = get_job(tx, id)? else {
            out.push(StartOutcome::Missing);
            continue;
        };
        let (paused, limits) = super::limits::sqlite::queue_of(tx, &job.queue)?;
        let key = limits.key_of(&job.args);
        let full = limits.is_limited()
            && !crate::limit::admits(
                &limits,
                super::limits::sqlite::usage(tx, &job.queue, &limits, key.as_deref(), now)?,
            );
        let gate = transition::QueueGate { paused, full };
        out.push(match transition::start_gated(&job, now, gate) {
            transition::Start::Skip(state) => StartOutcome::Skip(state),
            transition::Start::Park => {
                transit(
                    tx,
                    id,
                    Guard::NotStarted,
                    &transition::park(),
                    (Cause::Start, None),
                    now,
                )?;
                super::limits::sqlite::parked(tx, id, key.as_deref())?;
                StartOutcome::Parked
            }
            transition::Start::Defer(at) => StartOutcome::Defer(at),
            transition::Start::Dead(reason) => {
                transit(
                    tx,
                    id,
                    Guard::Any,
                    &Change::dead(reason),
                    (Cause::Start, None),
                    now,
                )?;
                StartOutcome::Dead
            }
            transition::Start::Run => {
                if limits.is_limited() {
                    super::limits::sqlite::granted(
                        tx,
                        id,
                        &job.queue,
                        &limits,
                        key.as_deref(),
                        now,
                    )?;
                }
                let job = tx
                    .prepare_cached(&format!(
                        "UPDATE OR FAIL jobs SET state = 'running', epoch = epoch + 1, worker = ?2, \
                         started_at = ?3, dispatched = 1, parked = 0, updated_at = ?3 \
                         WHERE id = ?1 RETURNING {COLUMNS}"
                    ))?
                    .query_row(params![id, worker, now], row_to_job)?;
                log.push((id.clone(), history::started(&job, now)));
                StartOutcome::Run(Box::new(job))
            }
        });
    }
    write_history(tx, &log)?;
    // Only a start begins a run, so only a start can grow a timeline by more than a run's
    // entries: trimming here, once per batch, keeps every timeline near its bound.
    let started: Vec<String> = log.into_iter().map(|(id, _)| id).collect();
    trim_history(tx, &started)?;
    Ok(Some(out))
}

/// A start's condition on the job's queue: not paused ([`transition::start_gated`]).
const NOT_PAUSED: &str =
    "NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = jobs.queue AND q.paused = 1)";

/// The fast path's condition on the job's queue: neither paused nor limited (a limited queue's
/// start counts first, on the path that reads the row).
const OPEN_QUEUE: &str = "NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = jobs.queue \
     AND (q.paused = 1 OR q.concurrency IS NOT NULL OR q.rate_count IS NOT NULL))";

/// [`transition::start`]'s `Run` for a readable row, as SQL (`?3` is now).
const START_RUNS: &str = "crashes < max_crashes AND (state = 'queued' OR (state = 'scheduled' \
     AND COALESCE(scheduled_at, 0) <= ?3))";

/// A job's state alone: what deciding needs when the rest of the row may not decode.
/// The statement and parameters of [`Store::search`]: apart so the plan tests read the text the
/// store runs.
fn search_sql(
    c: &rusqlite::Connection,
    search: &crate::search::JobSearch,
    cursor: Option<&str>,
    limit: usize,
) -> rusqlite::Result<(String, Vec<rusqlite::types::Value>)> {
    use rusqlite::types::Value as V;
    let mut sql = format!(
        "SELECT {COLUMNS} FROM jobs{} WHERE 1 = 1{}",
        state_index(c, search.state, search.queue.is_some())?,
        state_term(search.state)
    );
    let mut args: Vec<V> = Vec::new();
    let mut add = |sql: &mut String, cond: &str, v: V| {
        args.push(v);
        *sql += &cond.replace('#', &format!("?{}", args.len()));
    };
    if let Some(q) = &search.queue {
        add(&mut sql, " AND queue = #", V::Text(q.clone()));
    }
    if let Some(t) = &search.task {
        add(&mut sql, " AND task = #", V::Text(t.clone()));
    }
    if let Some((lo, hi)) = search.id_range {
        add(&mut sql, " AND id >= #", V::Text(lo.to_string()));
        add(&mut sql, " AND id <= #", V::Text(hi.to_string()));
    }
    if let Some(f) = search.created_from {
        add(&mut sql, " AND created_at >= #", V::Integer(f));
    }
    if let Some(t) = search.created_to {
        add(&mut sql, " AND created_at < #", V::Integer(t));
    }
    if let (Some(p), Some(v)) = (search.sqlite_path(), &search.args_value) {
        // A row whose args are not JSON (damaged) matches nothing rather than
        // failing the whole search.
        add(
            &mut sql,
            " AND CASE WHEN json_valid(args) THEN args -> # END",
            V::Text(p),
        );
        add(&mut sql, " = #", V::Text(v.clone()));
    }
    if let Some(sub) = &search.args_contains {
        add(&mut sql, " AND instr(args, #) > 0", V::Text(sub.clone()));
    }
    if let Some(cur) = &cursor {
        add(&mut sql, " AND id < #", V::Text(cur.to_string()));
    }
    sql += &format!(" ORDER BY id DESC LIMIT {}", limit + 1);
    Ok((sql, args))
}

/// A filter on a state, with the state written into the statement: the search indexes are
/// partial (migration 0021, docs/operate.md), and SQLite uses a partial index only for a
/// condition it can read when it plans, which a bound parameter is not (QPSG, see `sqlite.rs`).
/// The text comes from the closed set of [`JobState`] names, never from the caller.
fn state_term(state: Option<JobState>) -> String {
    state.map_or_else(String::new, |s| format!(" AND state = '{}'", s.as_str()))
}

/// Above this many queued jobs a search of the queued state across queues walks the table
/// newest first, where queued jobs are dense; below it, it sorts the queued jobs' own index.
const FEW_QUEUED: i64 = 50_000;

/// The index a search or count on a live state must walk, as an `INDEXED BY` clause, or "" to
/// let SQLite choose. Queued and running jobs are not in the state indexes (they would move
/// entries at every start and end); left to itself, SQLite would walk the pk or a queue's or
/// task's index over every finished job to find them. Running jobs are few (at most the
/// workers' slots), so their index is read whole and sorted. Queued jobs of one queue are a
/// range of `jobs_queued`; across queues that index is read whole only while it is small.
fn state_index(
    c: &rusqlite::Connection,
    state: Option<JobState>,
    by_queue: bool,
) -> rusqlite::Result<&'static str> {
    Ok(match state {
        Some(JobState::Running) => " INDEXED BY jobs_running",
        Some(JobState::Queued) if by_queue => " INDEXED BY jobs_queued",
        Some(JobState::Queued) => {
            let queued: i64 = c
                .prepare_cached(
                    "SELECT coalesce(sum(n), 0) FROM queue_counts WHERE state = 'queued'",
                )?
                .query_row([], |r| r.get(0))?;
            if queued <= FEW_QUEUED {
                " INDEXED BY jobs_queued"
            } else {
                ""
            }
        }
        _ => "",
    })
}

fn get_state(tx: &rusqlite::Connection, id: &str) -> rusqlite::Result<Option<JobState>> {
    tx.prepare_cached("SELECT state FROM jobs WHERE id = ?1")?
        .query_row([id], |r| text_lossy(r, 0))
        .optional()
        .map(|s| s.map(|s| read_state(s.as_deref(), &mut Vec::new())))
}

/// The store's answer for the state a lost worker's job reached.
fn lost_as(state: JobState) -> Lost {
    match state {
        JobState::Dead => Lost::Dead,
        JobState::Cancelled => Lost::Cancelled,
        _ => Lost::Requeued,
    }
}

/// The row of a job reclaimed from lost worker `worker`, in the reclaim's transaction.
fn record_reclaim(
    tx: &Transaction<'_>,
    worker: &str,
    job: &str,
    epoch: u64,
    outcome: ReclaimOutcome,
    now: Micros,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT OR IGNORE INTO worker_reclaims (worker, job, epoch, outcome, at) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![worker, job, epoch as i64, outcome.as_str(), now])?;
    Ok(())
}

fn get_epoch(tx: &rusqlite::Connection, id: &str) -> rusqlite::Result<Option<u64>> {
    tx.prepare_cached("SELECT epoch FROM jobs WHERE id = ?1")?
        .query_row([id], |r| r.get::<_, i64>(0))
        .optional()
        .map(|e| e.map(|e| e.max(0) as u64))
}

/// Whether the run `epoch` of job `id` began after `worker` was presumed dead: the worker is
/// recorded as presumed dead and the run is not among those it had then
/// ([`Store::presume_lost`]).
fn begun_after_presumed_dead(
    tx: &rusqlite::Connection,
    worker: &str,
    id: &str,
    epoch: u64,
) -> rusqlite::Result<bool> {
    tx.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM workers WHERE id = ?1 AND presumed_dead_at IS NOT NULL) \
         AND NOT EXISTS (SELECT 1 FROM worker_presumed_runs \
         WHERE worker = ?1 AND job = ?2 AND epoch = ?3)",
    )?
    .query_row(
        params![worker, id, epoch.min(i64::MAX as u64) as i64],
        |r| r.get(0),
    )
}

type WorkerRow = (String, i64, String, Option<i64>, Option<i64>);

fn worker_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<WorkerRow> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

/// A worker's row with its running jobs and its reclaims.
fn worker_record(c: &rusqlite::Connection, row: WorkerRow) -> rusqlite::Result<WorkerRecord> {
    let (info, last_seen, status, ended_at, presumed_dead_at) = row;
    let info: WorkerInfo = serde_json::from_str(&info).map_err(|e| corrupt("worker", e))?;
    let status = WorkerStatus::read(&status, &info.id);
    let running = c
        .prepare_cached("SELECT id FROM jobs WHERE state = 'running' AND worker = ?1")?
        .query_map([&info.id], |r| r.get::<_, String>(0))?
        .map(|r| r.and_then(parse_id))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut reclaimed = Vec::new();
    let mut st = c.prepare_cached(
        "SELECT job, epoch, outcome, at FROM worker_reclaims WHERE worker = ?1 \
         ORDER BY at DESC, job LIMIT ?2",
    )?;
    let rows = st.query_map(
        params![info.id, crate::reclaim::RECLAIMS_LISTED as i64],
        |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
            ))
        },
    )?;
    for r in rows {
        let (job, epoch, outcome, at) = r?;
        // A damaged row is left out of the view rather than failing every worker's listing.
        let (Ok(job), Some(outcome)) = (job.parse(), ReclaimOutcome::read(&outcome)) else {
            tracing::warn!(worker = %info.id, %job, "a reclaim row cannot be read; left out");
            continue;
        };
        reclaimed.push(Reclaim {
            job,
            epoch: epoch.max(0) as u64,
            outcome,
            at,
        });
    }
    Ok(WorkerRecord {
        info,
        last_seen,
        status,
        running,
        ended_at,
        presumed_dead_at,
        reclaimed,
    })
}

fn insert_event(tx: &Transaction<'_>, ev: &NewEvent, now: Micros) -> rusqlite::Result<i64> {
    tx.prepare_cached(
        "INSERT INTO events (kind, job_id, worker, data, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        ev.kind,
        ev.job_id.map(|i| i.to_string()),
        ev.worker,
        to_json(&ev.data),
        now
    ])?;
    Ok(tx.last_insert_rowid())
}

/// An event as stored. Data that cannot be decoded is shown as `{"unreadable": "<why>"}` and
/// its reason returned beside it, so the dispatcher can set the event aside.
fn row_to_event(r: &Row<'_>) -> rusqlite::Result<(Event, Option<String>)> {
    let job_id: Option<String> = r.get(2)?;
    let text: String = r.get(4)?;
    let (data, bad) = match read_event_data(&text) {
        Ok(v) => (v, None),
        Err(why) => (serde_json::json!({ "unreadable": why }), Some(why)),
    };
    Ok((
        Event {
            id: r.get(0)?,
            kind: r.get(1)?,
            job_id: job_id.map(parse_id).transpose()?,
            worker: r.get(3)?,
            data,
            created_at: r.get(5)?,
            dispatched_at: r.get(6)?,
        },
        bad,
    ))
}

/// Fans out the pending events in the caller's transaction: the oldest `limit`, or only event
/// `only`.
fn fan_out_in(
    tx: &Transaction<'_>,
    subscribers: &[Subscriber],
    limit: usize,
    only: Option<i64>,
    now: Micros,
) -> rusqlite::Result<FanOut> {
    let events = match only {
        None => tx
            .prepare_cached(&format!(
                "SELECT {EVENT_COLUMNS} FROM events WHERE dispatched_at IS NULL \
                 ORDER BY id LIMIT ?1"
            ))?
            .query_map([limit as i64], row_to_event)?
            .collect::<rusqlite::Result<Vec<_>>>()?,
        Some(id) => tx
            .prepare_cached(&format!(
                "SELECT {EVENT_COLUMNS} FROM events WHERE dispatched_at IS NULL AND id = ?1"
            ))?
            .query_map([id], row_to_event)?
            .collect::<rusqlite::Result<Vec<_>>>()?,
    };
    let mut out = FanOut {
        events: events.len(),
        dispatch: Vec::new(),
    };
    let mut has_callback =
        tx.prepare_cached("SELECT callback_url IS NOT NULL FROM jobs WHERE id = ?1")?;
    let mut done = tx.prepare_cached("UPDATE events SET dispatched_at = ?2 WHERE id = ?1")?;
    for (ev, bad) in &events {
        if let Some(why) = bad {
            tracing::error!(event_id = ev.id, kind = %ev.kind, reason = %why, "an event cannot be read; it is set aside undelivered");
            done.execute(params![ev.id, now])?;
            continue;
        }
        let mut targets: Vec<&str> = subscribers
            .iter()
            .filter(|s| s.matches(&ev.kind))
            .map(|s| s.name.as_str())
            .collect();
        if let Some(job) = ev.job_id {
            let cb = has_callback
                .query_row([job.to_string()], |r| r.get::<_, bool>(0))
                .optional()?
                .unwrap_or(false);
            if cb {
                targets.push(CALLBACK_TARGET);
            }
        }
        for t in targets {
            let ins = insert_one(tx, &ev.delivery_job(t, now))?;
            if ins.needs_dispatch() {
                out.dispatch.push(ToPublish {
                    id: ins.id,
                    queue: ins.queue,
                    priority: 0,
                });
            }
        }
        done.execute(params![ev.id, now])?;
    }
    Ok(out)
}

const EVENT_COLUMNS: &str = "id, kind, job_id, worker, data, created_at, dispatched_at";

/// A job to publish from a row of `id, queue, priority`.
pub(crate) fn publish_row(r: &Row<'_>) -> rusqlite::Result<ToPublish> {
    Ok(ToPublish {
        id: parse_id(r.get(0)?)?,
        queue: r.get(1)?,
        priority: r.get(2)?,
    })
}

fn parse_id(s: String) -> rusqlite::Result<JobId> {
    s.parse().map_err(|e| corrupt("job id", e))
}

/// An operator's retry of one job inside `tx`, decided by [`transition::operator_retry`]. The
/// outer `Result` is the database's; the inner one the decision's (not found, or refused).
fn retry_in(
    tx: &rusqlite::Transaction<'_>,
    id: JobId,
    now: Micros,
    retrying: &[JobId],
) -> rusqlite::Result<Result<Job>> {
    let sid = id.to_string();
    let Some(job) = get_job(tx, &sid)? else {
        return Ok(Err(Error::NotFound(id)));
    };
    if let Err(message) = transition::operator_retry(&job) {
        return Ok(Err(Error::Conflict {
            id,
            state: job.state,
            message: message.into(),
        }));
    }
    let parents = match rerun_parents(tx, &job, retrying)? {
        Ok(parents) => parents,
        Err(message) => {
            return Ok(Err(Error::Conflict {
                id,
                state: job.state,
                message,
            }))
        }
    };
    let job = tx
        .prepare_cached(&format!(
            "UPDATE jobs SET state = 'queued', dispatched = 0, attempts = 0, \
             crashes = 0, cancel_requested = 0, worker = NULL, finished_at = NULL, \
             scheduled_at = NULL, parents = coalesce(?3, parents), updated_at = ?2 \
             WHERE id = ?1 RETURNING {COLUMNS}"
        ))?
        .query_row(params![sid, now, parents], row_to_job)?;
    write_history(tx, &[(sid.clone(), history::retried(&job, now))])?;
    trim_history(tx, std::slice::from_ref(&sid))?;
    Ok(Ok(job))
}

/// The parents column an operator's retry of `job` writes ([`crate::workflow::rerun`]): `None`
/// keeps the row's; `Err` refuses the retry with the reason.
fn rerun_parents(
    tx: &rusqlite::Transaction<'_>,
    job: &Job,
    retrying: &[JobId],
) -> rusqlite::Result<std::result::Result<Option<String>, String>> {
    use crate::workflow::Rerun;
    let Some(wf) = crate::workflow::rerun_reads(job) else {
        return Ok(Ok(None));
    };
    let wf = wf.to_string();
    let steps = workflow_jobs(tx, &wf)?;
    Ok(
        match crate::workflow::rerun(job, &steps, &result_sizes(tx, &wf)?, retrying) {
            Rerun::AsItIs => Ok(None),
            Rerun::Refuse(message) => Err(message),
            Rerun::WithParents(parents) => {
                let ids: Vec<JobId> = parents.values().map(|p| p.id).collect();
                let results = results_of(tx, &ids)?;
                Ok(Some(to_json(&crate::workflow::with_results(
                    &parents, &results,
                ))))
            }
        },
    )
}

/// An operator's cancel of one job inside `tx`, decided by [`transition::cancel`].
fn cancel_in(
    tx: &rusqlite::Transaction<'_>,
    id: JobId,
    now: Micros,
) -> rusqlite::Result<Result<Job>> {
    let sid = id.to_string();
    let Some(job) = get_job(tx, &sid)? else {
        return Ok(Err(Error::NotFound(id)));
    };
    match transition::cancel(&job) {
        transition::Cancel::Now => {
            let not_run = (Cause::Other, None);
            let (after, _) = transit(tx, &sid, Guard::Any, &Change::cancelled(), not_run, now)?
                .ok_or_else(|| corrupt("cancel", "row vanished"))?;
            Ok(Ok(after))
        }
        transition::Cancel::Request => {
            let after = tx
                .prepare_cached(&format!(
                    "UPDATE jobs SET cancel_requested = 1, updated_at = ?2 WHERE id = ?1 \
                     RETURNING {COLUMNS}"
                ))?
                .query_row(params![sid, now], row_to_job)?;
            write_history(tx, &[(sid.clone(), history::cancel_requested(&after, now))])?;
            Ok(Ok(after))
        }
        transition::Cancel::Refuse(message) => Ok(Err(Error::Conflict {
            id,
            state: job.state,
            message: message.into(),
        })),
    }
}

/// One bulk step's single actions in one transaction: the jobs changed, kept as the broker
/// needs them (one job's args and result held at a time, not the step's); a job the decision
/// refuses (or that is gone) is left as it is, as the single action would leave it.
fn many(
    tx: &rusqlite::Transaction<'_>,
    ids: &[JobId],
    one: impl Fn(&rusqlite::Transaction<'_>, JobId) -> rusqlite::Result<Result<Job>>,
) -> rusqlite::Result<Vec<ToPublish>> {
    let mut out = Vec::with_capacity(ids.len());
    for &id in ids {
        if let Ok(job) = one(tx, id)? {
            out.push(job.into());
        }
    }
    Ok(out)
}

/// The pruner's deletions of workflows and jobs from before `?1`, at most `?2` of each. Each
/// walks an index from its oldest end and stops after `?2` rows; `INDEXED BY` because, without
/// statistics, SQLite preferred `jobs_state_id` for the state test, read every finished job and
/// sorted them: seconds per batch under the write lock at a million jobs (docs/pruner.md).
///
/// A workflow whose every step finished before the cut (or whose steps are already gone) is
/// history; one with a step still live, or finished after the cut, is kept with all its steps
/// (a waiting step's settling reads them). A job of a workflow still stored is kept with it.
pub(crate) const PURGE_WORKFLOWS: &str = "DELETE FROM workflows WHERE id IN (SELECT w.id \
    FROM workflows w INDEXED BY workflows_created WHERE w.created_at < ?1 AND NOT EXISTS \
    (SELECT 1 FROM jobs j WHERE j.workflow_id = w.id AND (j.state NOT IN \
    ('succeeded', 'failed', 'dead', 'cancelled') OR j.finished_at >= ?1)) \
    ORDER BY w.created_at LIMIT ?2)";
pub(crate) const PURGE_JOBS: &str = "DELETE FROM jobs WHERE rowid IN (SELECT rowid FROM jobs j \
    INDEXED BY jobs_finished WHERE finished_at < ?1 \
    AND state IN ('succeeded', 'failed', 'dead', 'cancelled') \
    AND (workflow_id IS NULL OR NOT EXISTS (SELECT 1 FROM workflows w \
    WHERE w.id = j.workflow_id)) ORDER BY finished_at LIMIT ?2)";

#[async_trait]
impl Store for SqliteStore {
    fn embedded_db(&self) -> Option<&Arc<Db>> {
        Some(&self.db)
    }

    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn insert(&self, jobs: Vec<NewJob>) -> Result<Vec<Inserted>> {
        let max_queues = self.max_queues;
        let to_admit = self.known_queues.to_admit(&jobs);
        let admit = to_admit.is_some();
        let out = self
            .db
            .write(move |tx| {
                if admit {
                    super::queues::admit_sqlite(tx, &jobs, max_queues, crate::time::now())?;
                }
                jobs.iter().map(|j| insert_one(tx, j)).collect()
            })
            .await?;
        if let Some(names) = to_admit {
            self.known_queues.remember(names);
        }
        Ok(out)
    }

    async fn insert_and_publish(
        &self,
        jobs: Vec<NewJob>,
        priorities: Vec<i32>,
    ) -> Result<Vec<Inserted>> {
        let max_queues = self.max_queues;
        let to_admit = self.known_queues.to_admit(&jobs);
        let admit = to_admit.is_some();
        // Waits for messages are woken by the committing thread (`Db::write_waking`).
        let (out, _) = self
            .db
            .write_waking(
                move |tx| {
                    if admit {
                        super::queues::admit_sqlite(tx, &jobs, max_queues, crate::time::now())?;
                    }
                    let out = jobs
                        .iter()
                        .map(|j| insert_one(tx, j))
                        .collect::<rusqlite::Result<Vec<Inserted>>>()?;
                    let to_send = crate::store::to_dispatch(&out, &priorities);
                    crate::broker::sqlite::publish_in(tx, &to_send)?;
                    let mut st = tx.prepare_cached(
                        "UPDATE jobs SET dispatched = 1 WHERE id = ?1 AND state = 'queued'",
                    )?;
                    for j in &to_send {
                        st.execute([j.id.to_string()])?;
                    }
                    Ok((out, !to_send.is_empty()))
                },
                |(_, published)| *published,
            )
            .await?;
        if let Some(names) = to_admit {
            self.known_queues.remember(names);
        }
        Ok(out)
    }

    async fn mark_dispatched(&self, ids: &[JobId]) -> Result<()> {
        let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        self.db
            .write(move |tx| {
                let mut st = tx.prepare_cached(
                    "UPDATE jobs SET dispatched = 1 WHERE id = ?1 AND state = 'queued'",
                )?;
                for id in &ids {
                    st.execute([id])?;
                }
                Ok(())
            })
            .await
    }

    async fn undispatched(&self, before: Micros, limit: usize) -> Result<Vec<ToPublish>> {
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT id, queue, priority FROM jobs WHERE state = 'queued' AND dispatched = 0 \
                     AND parked = 0 AND updated_at < ?1 AND {NOT_PAUSED} ORDER BY updated_at LIMIT ?2"
                ))?;
                let rows = st.query_map(params![before, limit as i64], publish_row)?;
                rows.collect()
            })
            .await
    }

    async fn redispatch_all(&self) -> Result<u64> {
        self.db
            .write(|tx| {
                tx.execute(
                    "UPDATE jobs SET dispatched = 0, updated_at = 0 WHERE state = 'queued'",
                    [],
                )
                .map(|n| n as u64)
            })
            .await
    }

    async fn start(&self, ids: &[JobId], worker: &str, now: Micros) -> Result<Vec<StartOutcome>> {
        let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        let worker = worker.to_string();
        let db = &self.db;
        isolating(
            ids,
            |ids| {
                let worker = worker.clone();
                db.write(move |tx| start_in(tx, &ids, &worker, now))
            },
            |id| {
                let worker = worker.clone();
                async move {
                    let mut v = db
                        .write(move |tx| start_in(tx, &[id], &worker, now))
                        .await?;
                    Ok(v.remove(0))
                }
            },
            |id, e| async move {
                let reason = transition::unstartable_reason(&e);
                tracing::error!(job = %id, error = %e, "a job cannot be started; making it dead");
                db.write(move |tx| {
                    if bury(tx, &id, Guard::NotStarted, &reason, now)?.is_some() {
                        return Ok(StartOutcome::Dead);
                    }
                    Ok(match get_state(tx, &id)? {
                        Some(state) => StartOutcome::Skip(state),
                        None => StartOutcome::Missing,
                    })
                })
                .await
            },
            |e| StartOutcome::Unstartable(e.to_string()),
        )
        .await
    }

    async fn complete(&self, done: &[Completion], now: Micros) -> Result<Vec<Committed>> {
        let db = &self.db;
        isolating(
            done.to_vec(),
            |done| db.write(move |tx| complete_and_ack_in(tx, &done, &[], now)),
            |c| {
                db.write(move |tx| {
                    let mut log = Timeline::new();
                    let out = complete_one(tx, &c, now, &mut log)?;
                    write_history(tx, &log)?;
                    Ok(out)
                })
            },
            |c, e| async move {
                let reason = transition::uncommittable_reason(&e);
                tracing::error!(job = %c.id, error = %e, "an outcome cannot be stored; making the job dead");
                db.write(move |tx| {
                    Ok(match bury(tx, &c.id.to_string(), Guard::Fence(c.epoch), &reason, now)? {
                        Some(_) => Committed::Applied {
                            state: JobState::Dead,
                            dispatch: Vec::new(),
                        },
                        None => Committed::Stale,
                    })
                })
                .await
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
        let w = worker.to_string();
        let decided = self
            .db
            .write(move |tx| {
                let sid = id.to_string();
                let Some(job) = get_job(tx, &sid)? else {
                    return Ok((Lost::Missing, None));
                };
                let after = presumed && begun_after_presumed_dead(tx, &w, &sid, job.epoch)?;
                match transition::lost(&job, &w, after) {
                    transition::Lost::NotOwned(state) => Ok((Lost::NotOwned(state), None)),
                    transition::Lost::Reclaimed(change) => {
                        let cause = Cause::Lost { worker: &w };
                        transit(tx, &sid, Guard::Any, &change, (cause, Some(&w)), now)?;
                        // Its slot is free: the next parked job goes to the caller to publish.
                        let unparked = super::limits::sqlite::unpark_after_release(tx, &sid, now)?;
                        let outcome = ReclaimOutcome::after(change.state);
                        record_reclaim(tx, &w, &sid, job.epoch, outcome, now)?;
                        Ok((lost_as(change.state), unparked))
                    }
                }
            })
            .await;
        match decided {
            Err(e) if !e.is_transient() => {
                // The last resort, as for a start: a job whose new state cannot be written
                // (its follow-up refused, say) is made dead, or every sweep stops at it again.
                let reason = transition::unreclaimable_reason(worker, &e);
                tracing::error!(job = %id, %worker, error = %e, "a lost worker's job cannot be reclaimed; making it dead");
                let worker = worker.to_string();
                self.db
                    .write(move |tx| {
                        let sid = id.to_string();
                        let epoch = get_epoch(tx, &sid)?;
                        if bury(tx, &sid, Guard::Owner(worker.clone()), &reason, now)?.is_some() {
                            if let Some(epoch) = epoch {
                                record_reclaim(
                                    tx,
                                    &worker,
                                    &sid,
                                    epoch,
                                    ReclaimOutcome::Dead,
                                    now,
                                )?;
                            }
                            return Ok((Lost::Dead, None));
                        }
                        Ok((
                            match get_state(tx, &sid)? {
                                Some(state) => Lost::NotOwned(state),
                                None => Lost::Missing,
                            },
                            None,
                        ))
                    })
                    .await
            }
            other => other,
        }
    }

    async fn claim_due(&self, now: Micros, limit: usize) -> Result<Vec<ToPublish>> {
        self.db
            .write(move |tx| {
                let mut st = tx.prepare_cached(
                    "UPDATE jobs SET state = 'queued', dispatched = 0, updated_at = ?1 WHERE id IN \
                     (SELECT id FROM jobs WHERE state = 'scheduled' AND scheduled_at <= ?1 \
                      ORDER BY scheduled_at LIMIT ?2) RETURNING id, queue, priority, attempts, crashes",
                )?;
                let mut log = Timeline::new();
                let rows = st
                    .query_map(params![now, limit as i64], |r| {
                        let counter = |i| -> rusqlite::Result<u32> {
                            Ok(r.get::<_, Option<i64>>(i)
                                .ok()
                                .flatten()
                                .and_then(|n| u32::try_from(n).ok())
                                .unwrap_or(0))
                        };
                        Ok((publish_row(r)?, counter(3)?, counter(4)?))
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                let out = rows
                    .into_iter()
                    .map(|(p, attempts, crashes)| {
                        let e = history::queued(history::Kind::Due, attempts, crashes, now);
                        log.push((p.id.to_string(), e));
                        p
                    })
                    .collect();
                drop(st);
                write_history(tx, &log)?;
                Ok(out)
            })
            .await
    }

    async fn set_paused(&self, queue: &str, paused: bool, now: Micros) -> Result<Vec<ToPublish>> {
        let queue = queue.to_string();
        let max_queues = self.max_queues;
        self.db
            .write(move |tx| {
                super::queues::admit_names_sqlite(tx, vec![queue.clone()], max_queues, now)?;
                tx.execute(
                    "UPDATE queues SET paused = ?2 WHERE name = ?1",
                    params![queue, paused],
                )?;
                if paused {
                    return Ok(Vec::new());
                }
                // Every queued job of the queue is published again, not only the parked ones: a
                // producer's late `mark_dispatched` can overwrite a park's `dispatched = 0`
                // (the worker parked the job before its producer marked it), leaving a queued
                // job with no message. A second message for a job is harmless (the start's
                // idempotency guard skips it).
                tx.execute(
                    "UPDATE jobs SET dispatched = 0, parked = 0 WHERE queue = ?1 \
                     AND state = 'queued' AND (dispatched <> 0 OR parked <> 0)",
                    params![queue],
                )?;
                let mut st = tx.prepare_cached(
                    "SELECT id, queue, priority FROM jobs WHERE queue = ?1 AND state = 'queued' \
                     AND dispatched = 0 ORDER BY id LIMIT ?2",
                )?;
                let rows = st.query_map(
                    params![queue, super::RESUME_PUBLISH_LIMIT as i64],
                    publish_row,
                )?;
                rows.collect()
            })
            .await
    }

    async fn queue_settings(&self) -> Result<Vec<QueueSettings>> {
        self.db.read(super::limits::sqlite::settings).await
    }

    async fn set_limits(
        &self,
        queue: &str,
        limits: &crate::limit::QueueLimits,
        now: Micros,
    ) -> Result<Vec<ToPublish>> {
        limits.check().map_err(Error::Invalid)?;
        let queue = queue.to_string();
        let limits = limits.clone();
        let max_queues = self.max_queues;
        self.db
            .write(move |tx| {
                super::queues::admit_names_sqlite(tx, vec![queue.clone()], max_queues, now)?;
                super::limits::sqlite::set(tx, &queue, &limits, now)
            })
            .await
    }

    async fn unpark_ready(&self, now: Micros, limit: usize) -> Result<Vec<ToPublish>> {
        self.db
            .write(move |tx| super::limits::sqlite::unpark_ready(tx, now, limit))
            .await
    }

    async fn running(&self, limit: usize) -> Result<Vec<(JobId, String, Micros)>> {
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id, worker, started_at FROM jobs WHERE state = 'running' \
                     ORDER BY started_at LIMIT ?1",
                )?;
                let rows = st.query_map([limit as i64], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, Option<String>>(1)?,
                        r.get::<_, Option<i64>>(2)?,
                    ))
                })?;
                rows.map(|r| {
                    let (id, w, s) = r?;
                    Ok((parse_id(id)?, w.unwrap_or_default(), s.unwrap_or(0)))
                })
                .collect()
            })
            .await
    }

    async fn running_under(&self, worker: &str, limit: usize) -> Result<Vec<RunningUnder>> {
        let worker = worker.to_string();
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id, epoch, started_at FROM jobs WHERE state = 'running' AND worker = ?1 \
                     ORDER BY started_at LIMIT ?2",
                )?;
                let rows = st.query_map(params![worker, limit.min(i64::MAX as usize) as i64], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, Option<i64>>(1)?,
                        r.get::<_, Option<i64>>(2)?,
                    ))
                })?;
                rows.map(|r| {
                    let (id, epoch, started_at) = r?;
                    Ok(RunningUnder {
                        id: parse_id(id)?,
                        epoch: epoch.unwrap_or(0).max(0) as u64,
                        started_at: started_at.unwrap_or(0),
                    })
                })
                .collect()
            })
            .await
    }

    async fn last_completion(&self, id: JobId) -> Result<Option<CompletionState>> {
        self.db
            .read(move |c| {
                c.prepare_cached("SELECT state, epoch, completed_epoch FROM jobs WHERE id = ?1")?
                    .query_row([id.to_string()], |r| {
                        let mut unreadable = Vec::new();
                        let state = read_state(text_lossy(r, 0)?.as_deref(), &mut unreadable);
                        let epoch = r.get::<_, Option<i64>>(1).ok().flatten().unwrap_or(0);
                        let done = r.get::<_, Option<i64>>(2).ok().flatten();
                        Ok(CompletionState {
                            state,
                            epoch: epoch.max(0) as u64,
                            completed_epoch: done.map(|e| e.max(0) as u64),
                        })
                    })
                    .optional()
            })
            .await
    }

    async fn worker_info(&self, id: &str) -> Result<Option<WorkerInfo>> {
        let id = id.to_string();
        self.db
            .read(move |c| {
                let text = c
                    .prepare_cached("SELECT info FROM workers WHERE id = ?1")?
                    .query_row([id], |r| r.get::<_, String>(0))
                    .optional()?;
                text.map(|t| serde_json::from_str(&t).map_err(|e| corrupt("worker", e)))
                    .transpose()
            })
            .await
    }

    async fn set_progress(
        &self,
        id: JobId,
        epoch: u64,
        progress: serde_json::Value,
    ) -> Result<bool> {
        let now = crate::time::now();
        self.db
            .write(move |tx| {
                let sid = id.to_string();
                let value = to_json(&progress);
                let n = tx.execute(
                    "UPDATE jobs SET progress = ?3 WHERE id = ?1 AND epoch = ?2 AND state = 'running'",
                    params![sid, epoch as i64, value],
                )?;
                if n != 1 {
                    return Ok(false);
                }
                progress_entry(tx, &sid, epoch, &value, now)?;
                Ok(true)
            })
            .await
    }

    async fn mark_dead(&self, id: JobId, reason: &str, now: Micros) -> Result<bool> {
        let reason = reason.to_string();
        self.db
            .write(move |tx| {
                let sid = id.to_string();
                match get_state(tx, &sid)? {
                    Some(state) if !state.is_terminal() => {
                        // A running job's run ends here: its entry names the worker.
                        let held_by: Option<String> = if state == JobState::Running {
                            tx.prepare_cached("SELECT worker FROM jobs WHERE id = ?1")?
                                .query_row([&sid], |r| text_lossy(r, 0))?
                        } else {
                            None
                        };
                        let run = (Cause::Other, held_by.as_deref());
                        transit(tx, &sid, Guard::Any, &Change::dead(reason), run, now)?;
                        Ok(true)
                    }
                    _ => Ok(false),
                }
            })
            .await
    }

    async fn get(&self, id: JobId) -> Result<Option<Job>> {
        self.db.read(move |c| get_job(c, &id.to_string())).await
    }

    async fn history(&self, id: JobId) -> Result<history::History> {
        self.db
            .read(move |c| {
                let entries = c
                    .prepare_cached(
                        "SELECT at, kind, state, epoch, worker, attempts, crashes, message, data \
                         FROM job_history WHERE job_id = ?1 ORDER BY id",
                    )?
                    .query_map([id.to_string()], row_to_entry)?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(history::History::from_entries(entries))
            })
            .await
    }

    async fn get_by_key(&self, key: &str) -> Result<Option<Job>> {
        let key = key.to_string();
        self.db
            .read(move |c| {
                c.query_row(
                    &format!("SELECT {COLUMNS} FROM jobs WHERE idempotency_key = ?1"),
                    [key],
                    row_to_job,
                )
                .optional()
            })
            .await
    }

    async fn search(
        &self,
        search: &crate::search::JobSearch,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<JobPage> {
        if let Some(c) = cursor {
            if c.parse::<JobId>().is_err() {
                return Err(Error::Invalid(format!("invalid cursor '{c}'")));
            }
        }
        let search = search.clone();
        let cursor = cursor.map(str::to_string);
        let limit = limit.clamp(1, 1000);
        self.db
            .read(move |c| {
                let (sql, args) = search_sql(c, &search, cursor.as_deref(), limit)?;
                let mut st = c.prepare(&sql)?;
                let mut rows = st.query(rusqlite::params_from_iter(args.iter()))?;
                let mut fill = PageFill::new(limit);
                let mut jobs = Vec::new();
                while let Some(row) = rows.next()? {
                    // The row past the count limit only says that more follow: not measured.
                    if fill.counted_out() || !fill.take(stored_bytes(row)?) {
                        return Ok(JobPage::new(jobs, true));
                    }
                    jobs.push(row_to_job(row)?);
                }
                Ok(JobPage::new(jobs, false))
            })
            .await
    }

    async fn retry(&self, id: JobId, now: Micros) -> Result<Job> {
        self.db
            .write(move |tx| retry_in(tx, id, now, &[id]))
            .await?
    }

    async fn cancel(&self, id: JobId, now: Micros) -> Result<Job> {
        self.db.write(move |tx| cancel_in(tx, id, now)).await?
    }

    async fn retry_many(&self, ids: &[JobId], now: Micros) -> Result<Vec<ToPublish>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = ids.to_vec();
        self.db
            .write(move |tx| many(tx, &ids, |tx, id| retry_in(tx, id, now, &ids)))
            .await
    }

    async fn cancel_many(&self, ids: &[JobId], now: Micros) -> Result<Vec<ToPublish>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = ids.to_vec();
        self.db
            .write(move |tx| many(tx, &ids, |tx, id| cancel_in(tx, id, now)))
            .await
    }

    async fn cancel_requested(&self, ids: &[JobId]) -> Result<Vec<JobId>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT 1 FROM jobs WHERE id = ?1 AND cancel_requested = 1 AND state = 'running'",
                )?;
                let mut out = Vec::new();
                for id in ids {
                    if st.exists([&id])? {
                        out.push(parse_id(id)?);
                    }
                }
                Ok(out)
            })
            .await
    }

    async fn create_workflow(&self, wf: NewWorkflow) -> Result<Vec<Inserted>> {
        let max_queues = self.max_queues;
        self.db
            .write(move |tx| {
                let jobs: Vec<NewJob> = wf.steps.iter().map(|(j, _)| j.clone()).collect();
                super::queues::admit_sqlite(tx, &jobs, max_queues, crate::time::now())?;
                tx.execute(
                    "INSERT INTO workflows (id, name, created_at) VALUES (?1, ?2, ?3)",
                    params![wf.id.to_string(), wf.name, wf.created_at],
                )?;
                let mut out = Vec::with_capacity(wf.steps.len());
                for (job, link) in &wf.steps {
                    let mut ins = insert_one(tx, job)?;
                    let waiting = !link.after.is_empty();
                    tx.prepare_cached(
                        "UPDATE jobs SET workflow_id = ?2, workflow = ?3, \
                         state = CASE WHEN ?4 THEN 'waiting' ELSE state END WHERE id = ?1",
                    )?
                    .execute(params![
                        job.id.to_string(),
                        wf.id.to_string(),
                        to_json(link),
                        waiting
                    ])?;
                    if waiting {
                        ins.state = JobState::Waiting;
                        // Its enqueue entry was written as `queued` by `insert_one`.
                        tx.prepare_cached(
                            "UPDATE job_history SET state = 'waiting' WHERE job_id = ?1",
                        )?
                        .execute([job.id.to_string()])?;
                    }
                    out.push(ins);
                }
                Ok(out)
            })
            .await
    }

    async fn workflow(&self, id: crate::workflow::WorkflowId) -> Result<Option<Workflow>> {
        self.db.read(move |c| read_workflow(c, id)).await
    }

    async fn workflows(&self, cursor: Option<&str>, limit: usize) -> Result<WorkflowPage> {
        let cursor = match cursor {
            Some(c) => Some(
                c.parse::<crate::workflow::WorkflowId>()
                    .map_err(|_| Error::Invalid(format!("invalid cursor '{c}'")))?
                    .to_string(),
            ),
            None => None,
        };
        let limit = limit.clamp(1, 200);
        self.db
            .read(move |c| {
                let ids: Vec<String> = c
                    .prepare_cached(
                        "SELECT id FROM workflows WHERE ?1 IS NULL OR id < ?1 \
                         ORDER BY id DESC LIMIT ?2",
                    )?
                    .query_map(params![cursor, limit as i64 + 1], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?;
                let more = ids.len() > limit;
                let mut workflows = Vec::new();
                for id in ids.into_iter().take(limit) {
                    let id = parse_id(id)?;
                    if let Some(w) = read_workflow(c, id)? {
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
        self.db
            .write(move |tx| {
                let sid = id.to_string();
                if workflow_row(tx, &sid)?.is_none() {
                    return Ok(None);
                }
                tx.execute(
                    "UPDATE workflows SET cancelled_at = COALESCE(cancelled_at, ?2) WHERE id = ?1",
                    params![sid, now],
                )?;
                // Waiting steps first, without settling: no finaliser may be made runnable by
                // its parents' cancellation.
                let steps = workflow_jobs(tx, &sid)?;
                for j in steps.iter().filter(|j| j.state == JobState::Waiting) {
                    let change = Change::cancelled();
                    if let Some(after) =
                        write_change(tx, &j.id.to_string(), Guard::Any, &change, now)?
                    {
                        let e = history::changed(&after, &change, Cause::Other, None, now);
                        write_history(tx, &[(j.id.to_string(), e)])?;
                        if let Some(ev) = NewEvent::for_terminal(&after)
                            .filter(|_| transition::effects_after(&after, now).event)
                        {
                            insert_event(tx, &ev, now)?;
                        }
                    }
                }
                for j in steps.iter().filter(|j| j.state != JobState::Waiting) {
                    let jid = j.id.to_string();
                    match transition::cancel(j) {
                        transition::Cancel::Now => {
                            let not_run = (Cause::Other, None);
                            transit(tx, &jid, Guard::Any, &Change::cancelled(), not_run, now)?;
                        }
                        transition::Cancel::Request => {
                            tx.execute(
                                "UPDATE jobs SET cancel_requested = 1, updated_at = ?2 WHERE id = ?1",
                                params![jid, now],
                            )?;
                            let e = history::cancel_requested(j, now);
                            write_history(tx, &[(jid.clone(), e)])?;
                        }
                        transition::Cancel::Refuse(_) => {}
                    }
                }
                read_workflow(tx, id)
            })
            .await
    }

    async fn queue_stats(&self) -> Result<Vec<QueueStats>> {
        self.grouped_counts("SELECT queue, state, n FROM queue_counts WHERE n <> 0 ORDER BY queue")
            .await
    }

    async fn queue_stats_recounted(&self) -> Result<Vec<QueueStats>> {
        self.grouped_counts(
            "SELECT queue, state, count(*) FROM jobs GROUP BY queue, state ORDER BY queue",
        )
        .await
    }

    async fn register_worker(&self, info: &WorkerInfo, now: Micros) -> Result<()> {
        let info = info.clone();
        self.db
            .write(move |tx| {
                tx.execute(
                    "INSERT OR REPLACE INTO workers (id, info, started_at, last_seen, status) \
                     VALUES (?1, ?2, ?3, ?4, 'live')",
                    params![info.id, to_json(&info), info.started_at, now],
                )?;
                let mut st = tx.prepare_cached("INSERT OR IGNORE INTO tasks (name) VALUES (?1)")?;
                for t in &info.tasks {
                    st.execute([t])?;
                }
                Ok(())
            })
            .await
    }

    async fn worker_seen(&self, id: &str, now: Micros) -> Result<()> {
        let id = id.to_string();
        self.db
            .write(move |tx| {
                tx.execute(
                    "UPDATE workers SET last_seen = ?2, status = 'live' WHERE id = ?1",
                    params![id, now],
                )
                .map(|_| ())
            })
            .await
    }

    /// Never deferred: a start holds the database's one write lock, which this write waits
    /// for like any other.
    async fn presume_lost(&self, worker: &str, now: Micros) -> Result<Presumption> {
        let id = worker.to_string();
        self.db
            .write(move |tx| {
                // Read in the write: a start queued behind this one cannot be stamped earlier.
                let at = crate::time::now().max(now);
                let first = tx.execute(
                    "UPDATE workers SET presumed_dead_at = ?2 \
                     WHERE id = ?1 AND presumed_dead_at IS NULL",
                    params![id, at],
                )? == 1;
                if first {
                    tx.execute(
                        "INSERT OR IGNORE INTO worker_presumed_runs (worker, job, epoch) \
                         SELECT ?1, id, epoch FROM jobs WHERE state = 'running' AND worker = ?1",
                        [&id],
                    )?;
                }
                Ok(Presumption::Made)
            })
            .await
    }

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
        let id = id.to_string();
        self.db
            .write(move |tx| {
                let changed = tx.execute(
                    "UPDATE workers SET status = ?2, last_seen = max(last_seen, ?3), \
                     ended_at = ?3 WHERE id = ?1 AND status = 'live'",
                    params![id, status.as_str(), now],
                )? == 1;
                if let (true, Some(ev)) = (changed, &event) {
                    insert_event(tx, ev, now)?;
                }
                Ok(changed)
            })
            .await
    }

    async fn workers(&self, since: Micros) -> Result<Vec<WorkerRecord>> {
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT info, last_seen, status, ended_at, presumed_dead_at FROM workers \
                     WHERE last_seen >= ?1 \
                     ORDER BY started_at DESC",
                )?;
                let rows = st
                    .query_map([since], worker_row)?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                rows.into_iter().map(|r| worker_record(c, r)).collect()
            })
            .await
    }

    async fn worker(&self, id: &str) -> Result<Option<WorkerRecord>> {
        let id = id.to_string();
        self.db
            .read(move |c| {
                let row = c
                    .prepare_cached(
                        "SELECT info, last_seen, status, ended_at, presumed_dead_at FROM workers \
                         WHERE id = ?1",
                    )?
                    .query_row([&id], worker_row)
                    .optional()?;
                row.map(|r| worker_record(c, r)).transpose()
            })
            .await
    }

    async fn known_tasks(&self) -> Result<Vec<String>> {
        self.db
            .read(|c| {
                let mut st = c.prepare_cached("SELECT name FROM tasks ORDER BY name")?;
                let rows = st.query_map([], |r| r.get::<_, String>(0))?;
                rows.collect()
            })
            .await
    }

    async fn finished_between(&self, from: Micros, to: Micros) -> Result<Vec<FinishedCounts>> {
        self.db
            .read(move |c| {
                // Streamed in index order and added up here: a `GROUP BY queue, state` sorts
                // every entry of the range first, about four times the cost of reading them
                // (BENCHMARKS.md), and in memory (temp_store).
                let mut st = c.prepare_cached(
                    "SELECT queue, state FROM jobs INDEXED BY jobs_finished \
                     WHERE finished_at >= ?1 AND finished_at < ?2 AND finished_at IS NOT NULL",
                )?;
                let mut rows = st.query([from, to])?;
                let mut by_queue = std::collections::BTreeMap::<String, FinishedCounts>::new();
                while let Some(r) = rows.next()? {
                    let (queue, state) = (text_ref(r, 0)?, text_ref(r, 1)?);
                    if !matches!(state, "succeeded" | "failed" | "dead" | "cancelled") {
                        continue;
                    }
                    let c = match by_queue.get_mut(queue) {
                        Some(c) => c,
                        None => by_queue.entry(queue.to_string()).or_insert(FinishedCounts {
                            queue: queue.to_string(),
                            ..Default::default()
                        }),
                    };
                    match state {
                        "succeeded" => c.succeeded += 1,
                        "failed" => c.failed += 1,
                        "dead" => c.dead += 1,
                        _ => c.cancelled += 1,
                    }
                }
                Ok(by_queue.into_values().collect())
            })
            .await
    }

    async fn stats_cursor(&self) -> Result<Option<crate::stats::Cursor>> {
        self.db
            .read(|c| {
                c.query_row(&stats_sql::read_cursor(Dialect::Sqlite), [], |r| {
                    Ok(crate::stats::Cursor {
                        closed: r.get(0)?,
                        live: r.get(1)?,
                    })
                })
                .optional()
            })
            .await
    }

    async fn roll_up(&self, from: Micros, to: Micros, closed: Micros) -> Result<()> {
        let (hfrom, hto) = crate::stats::hours_of(from, to);
        let plan = stats_sql::roll_up(Dialect::Sqlite);
        // The counting reads every job that finished in the minutes (hundreds of thousands in a
        // busy drain), so it runs on a read connection (one query, one snapshot), and the writer
        // is held only to replace the rows. A finish committed between the two is missed as one
        // committed after the pass would be: the next passes recompute the last closed minutes
        // (rollup.rs).
        let (counts, latency) = self.db.read(move |c| count_minutes(c, from, to)).await?;
        self.db
            .write(move |tx| {
                let args = params![from, to, hfrom, hto];
                for sql in &plan.clear {
                    tx.prepare_cached(sql)?.execute(args)?;
                }
                let mut insert = tx.prepare_cached(
                    "INSERT INTO stats_counts \
                     (span, at, queue, succeeded, failed, dead, cancelled, retried) \
                     VALUES (60, ?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?;
                for r in &counts {
                    insert.execute(params![
                        r.at,
                        r.queue,
                        r.succeeded as i64,
                        r.failed as i64,
                        r.dead as i64,
                        r.cancelled as i64,
                        r.retried as i64
                    ])?;
                }
                let mut insert = tx.prepare_cached(
                    "INSERT INTO stats_latency (span, at, queue, kind, bucket, n) \
                     VALUES (60, ?1, ?2, ?3, ?4, ?5)",
                )?;
                for r in &latency {
                    insert.execute(params![r.at, r.queue, r.kind, r.bucket, r.n as i64])?;
                }
                for sql in &plan.hours {
                    tx.prepare_cached(sql)?.execute(args)?;
                }
                tx.prepare_cached(&stats_sql::advance_cursor(Dialect::Sqlite))?
                    .execute([closed, to])?;
                Ok(())
            })
            .await
    }

    async fn sample_depth(&self, at: Micros) -> Result<()> {
        self.db
            .write(move |tx| {
                let sql = stats_sql::sample_depth(Dialect::Sqlite);
                for (span, step) in [(60, crate::stats::MINUTE), (3600, crate::stats::HOUR)] {
                    tx.prepare_cached(&sql)?
                        .execute(params![crate::stats::floor(at, step), span])?;
                }
                Ok(())
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
        self.db
            .read(move |c| {
                let [counts, latency, depth] = stats_sql::reads(Dialect::Sqlite);
                let u = |r: &Row<'_>, i: usize| r.get::<_, i64>(i).map(|n| n.max(0) as u64);
                let args = params![span_secs, from, to];
                let counts = c
                    .prepare_cached(&counts)?
                    .query_map(args, |r| {
                        Ok(CountRow {
                            at: r.get(0)?,
                            queue: r.get(1)?,
                            succeeded: u(r, 2)?,
                            failed: u(r, 3)?,
                            dead: u(r, 4)?,
                            cancelled: u(r, 5)?,
                            retried: u(r, 6)?,
                        })
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                let latency = c
                    .prepare_cached(&latency)?
                    .query_map(args, |r| {
                        Ok(LatencyRow {
                            at: r.get(0)?,
                            queue: r.get(1)?,
                            kind: r.get(2)?,
                            bucket: r.get(3)?,
                            n: u(r, 4)?,
                        })
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                let depth = c
                    .prepare_cached(&depth)?
                    .query_map(args, |r| {
                        Ok(DepthRow {
                            at: r.get(0)?,
                            queue: r.get(1)?,
                            depth: u(r, 2)?,
                        })
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(Rows {
                    counts,
                    latency,
                    depth,
                })
            })
            .await
    }

    async fn purge(&self, before: Micros, limit: usize) -> Result<Purged> {
        let limit = limit.min(i64::MAX as usize) as i64;
        self.db
            .write(move |tx| {
                // Workflows first: one whose every step finished before the cut (or whose steps
                // are already gone) is history; one with a step still live, or finished after
                // the cut, is kept with all its steps (a waiting step's settling reads them).
                let workflows = tx.execute(PURGE_WORKFLOWS, params![before, limit])? as u64;
                let jobs = tx.execute(PURGE_JOBS, params![before, limit])? as u64;
                let events = tx.execute(
                    "DELETE FROM events WHERE id IN (SELECT id FROM events \
                     WHERE dispatched_at IS NOT NULL AND created_at < ?1 ORDER BY id LIMIT ?2)",
                    params![before, limit],
                )? as u64;
                let mut workers = tx.execute(
                    "DELETE FROM workers WHERE status <> 'live' AND last_seen < ?1",
                    params![before],
                )? as u64;
                // A departed worker's reclaims go with its row (or, for a consumer that never
                // had one, once they are old).
                workers += tx.execute(
                    "DELETE FROM worker_reclaims WHERE rowid IN (SELECT r.rowid FROM \
                     worker_reclaims r WHERE r.at < ?1 AND NOT EXISTS (SELECT 1 FROM workers w \
                     WHERE w.id = r.worker) LIMIT ?2)",
                    params![before, limit],
                )? as u64;
                workers += tx.execute(
                    "DELETE FROM worker_presumed_runs WHERE (worker, job, epoch) IN \
                     (SELECT worker, job, epoch FROM worker_presumed_runs p WHERE NOT EXISTS \
                     (SELECT 1 FROM workers w WHERE w.id = p.worker) LIMIT ?1)",
                    params![limit],
                )? as u64;
                let audit = tx.execute(
                    "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < ?1 \
                     ORDER BY id LIMIT ?2)",
                    params![before, limit],
                )? as u64;
                let mut stats = 0;
                for sql in stats_sql::purge(Dialect::Sqlite) {
                    stats += tx.execute(&sql, params![before, limit])? as u64;
                }
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
        let filter = filter.clone();
        self.db
            .read(move |c| {
                // Without a task the kept counts answer (docs/counts.md); a task is not one
                // of their keys, so that filter counts the jobs' task index.
                let mut sql = if filter.task.is_none() {
                    String::from("SELECT coalesce(sum(n), 0) FROM queue_counts WHERE 1 = 1")
                } else {
                    format!(
                        "SELECT count(*) FROM jobs{} WHERE 1 = 1",
                        state_index(c, filter.state, filter.queue.is_some())?
                    )
                };
                sql += &state_term(filter.state);
                let mut args: Vec<String> = Vec::new();
                for (col, v) in [
                    ("queue", filter.queue.clone()),
                    ("task", filter.task.clone()),
                ] {
                    if let Some(v) = v {
                        args.push(v);
                        sql += &format!(" AND {col} = ?{}", args.len());
                    }
                }
                let n: i64 =
                    c.query_row(&sql, rusqlite::params_from_iter(args.iter()), |r| r.get(0))?;
                Ok(u64::try_from(n).unwrap_or(0))
            })
            .await
    }

    async fn delete_finished(&self, ids: &[JobId]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        self.db
            .write(move |tx| {
                let mut st = tx.prepare_cached(
                    "DELETE FROM jobs WHERE id = ?1 AND workflow_id IS NULL \
                     AND state IN ('succeeded', 'failed', 'dead', 'cancelled')",
                )?;
                let mut n = 0u64;
                for id in &ids {
                    n += st.execute([id])? as u64;
                }
                Ok(n)
            })
            .await
    }

    async fn record_audit(&self, entry: audit::NewAudit, now: Micros) -> Result<i64> {
        let e = entry.bounded();
        self.db
            .write(move |tx| {
                tx.execute(
                    "INSERT INTO audit (at, actor, role, action, target, status, count) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![
                        now,
                        e.actor,
                        e.role,
                        e.action,
                        e.target,
                        e.status,
                        e.count.map(|c| i64::try_from(c).unwrap_or(i64::MAX))
                    ],
                )?;
                Ok(tx.last_insert_rowid())
            })
            .await
    }

    async fn audit(&self, cursor: Option<&str>, limit: usize) -> Result<audit::AuditPage> {
        let cursor = audit::parse_cursor(cursor)?.unwrap_or(i64::MAX);
        let limit = limit.clamp(1, 1000);
        self.db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id, at, actor, role, action, target, status, count FROM audit \
                     WHERE id < ?1 ORDER BY id DESC LIMIT ?2",
                )?;
                let rows = st
                    .query_map(params![cursor, (limit + 1) as i64], |r| {
                        Ok(audit::AuditEntry {
                            id: r.get(0)?,
                            at: r.get(1)?,
                            entry: audit::NewAudit {
                                actor: r.get(2)?,
                                role: r.get(3)?,
                                action: r.get(4)?,
                                target: r.get(5)?,
                                status: r.get(6)?,
                                count: r
                                    .get::<_, Option<i64>>(7)?
                                    .map(|c| u64::try_from(c).unwrap_or(0)),
                            },
                        })
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                Ok(audit::AuditPage::cut(rows, limit))
            })
            .await
    }

    async fn record_event(&self, event: NewEvent, now: Micros) -> Result<i64> {
        self.db.write(move |tx| insert_event(tx, &event, now)).await
    }

    async fn fan_out(
        &self,
        subscribers: &[Subscriber],
        limit: usize,
        now: Micros,
    ) -> Result<FanOut> {
        let subs = subscribers.to_vec();
        let first = self
            .db
            .write(move |tx| fan_out_in(tx, &subs, limit, None, now))
            .await;
        let e = match first {
            Err(e) if !e.is_transient() => e,
            other => return other,
        };
        // One event's deliveries could not be stored: fan the batch out one event at a time
        // and set aside the one that still fails, so the alerts behind it go out.
        tracing::warn!(error = %e, "fanning out a batch of events failed; trying them one by one");
        let pending: Vec<i64> = self
            .db
            .read(move |c| {
                c.prepare_cached(
                    "SELECT id FROM events WHERE dispatched_at IS NULL ORDER BY id LIMIT ?1",
                )?
                .query_map([limit as i64], |r| r.get(0))?
                .collect()
            })
            .await?;
        let mut out = FanOut::default();
        for id in pending {
            let subs = subscribers.to_vec();
            match self
                .db
                .write(move |tx| fan_out_in(tx, &subs, 1, Some(id), now))
                .await
            {
                Ok(part) => {
                    out.events += part.events;
                    out.dispatch.extend(part.dispatch);
                }
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => {
                    tracing::error!(event_id = id, error = %e, "an event's deliveries cannot be stored; it is set aside undelivered");
                    self.db
                        .write(move |tx| {
                            tx.execute(
                                "UPDATE events SET dispatched_at = ?2 WHERE id = ?1",
                                params![id, now],
                            )
                        })
                        .await?;
                    out.events += 1;
                }
            }
        }
        Ok(out)
    }

    async fn events(&self, after: i64, limit: usize) -> Result<Vec<Event>> {
        self.db
            .read(move |c| {
                c.prepare_cached(&format!(
                    "SELECT {EVENT_COLUMNS} FROM events WHERE id > ?1 ORDER BY id LIMIT ?2"
                ))?
                .query_map(params![after, limit as i64], row_to_event)?
                .map(|r| r.map(|(ev, _)| ev))
                .collect()
            })
            .await
    }

    async fn put_schedule(
        &self,
        def: &crate::schedule::ScheduleDef,
        now: Micros,
    ) -> Result<crate::schedule::Schedule> {
        let def = def.clone();
        let name = def.name.clone();
        self.db
            .write(move |tx| super::schedules::sqlite::put(tx, &def, now))
            .await?
            .ok_or_else(|| {
                crate::error::Error::Invalid(format!(
                    "schedule '{name}' was set but cannot be read back"
                ))
            })
    }

    async fn schedules_page(&self, after: Option<&str>, limit: usize) -> Result<SchedulePage> {
        let after = after.map(str::to_string);
        let limit = limit.max(1);
        self.db
            .read(move |c| super::schedules::sqlite::page(c, after.as_deref(), limit))
            .await
    }

    async fn schedule_heads(&self) -> Result<Vec<crate::schedule::ScheduleHead>> {
        self.db.read(super::schedules::sqlite::heads).await
    }

    async fn schedule_changes(&self) -> Result<Option<u64>> {
        self.db
            .read(super::schedules::sqlite::changes)
            .await
            .map(Some)
    }

    async fn schedule(&self, name: &str) -> Result<Option<crate::schedule::Schedule>> {
        let name = name.to_string();
        self.db
            .read(move |c| super::schedules::sqlite::get(c, &name))
            .await
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.db
            .write(move |tx| super::schedules::sqlite::delete(tx, &name))
            .await
    }

    async fn pause_schedule(
        &self,
        name: &str,
        paused: bool,
        now: Micros,
    ) -> Result<Option<crate::schedule::Schedule>> {
        let name = name.to_string();
        self.db
            .write(move |tx| super::schedules::sqlite::set_paused(tx, &name, paused, now))
            .await
    }

    async fn fire_schedule(
        &self,
        firing: &crate::schedule::Firing,
        now: Micros,
    ) -> Result<Option<Vec<Inserted>>> {
        let firing = firing.clone();
        let max_queues = self.max_queues;
        self.db
            .write(move |tx| super::schedules::sqlite::fire(tx, &firing, max_queues, now))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rollup's streamed count gives exactly the rows of the counting queries PostgreSQL
    /// runs (stats_sql), over jobs of every state, with and without a start or a due time,
    /// retried or not, in several queues and minutes, some outside the range.
    #[test]
    fn streamed_minute_counts_match_the_rollup_queries() {
        use crate::stats::{CountRow, LatencyRow, MINUTE};
        let c = rusqlite::Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE jobs (id INTEGER PRIMARY KEY, queue TEXT, state TEXT, \
             attempts INTEGER, created_at INTEGER, scheduled_at INTEGER, started_at INTEGER, \
             finished_at INTEGER); \
             CREATE INDEX jobs_finished ON jobs(finished_at, queue, state) \
             WHERE finished_at IS NOT NULL;",
        )
        .unwrap();
        let t0: Micros = 1_800_000_000 * 1_000_000 / MINUTE * MINUTE;
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n) as i64
        };
        let states = [
            "succeeded",
            "failed",
            "dead",
            "cancelled",
            "queued",
            "running",
        ];
        for id in 0..3000 {
            let created = t0 - MINUTE + next(3 * MINUTE as u64);
            // Waits and runs from microseconds to an hour, so every bucket is reached.
            let started = created + 10_i64.pow(next(10) as u32);
            let finished = started + 10_i64.pow(next(10) as u32);
            c.execute(
                "INSERT INTO jobs VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    id,
                    ["a", "b", "c"][next(3) as usize],
                    states[next(6) as usize],
                    next(4),
                    created,
                    (next(2) == 0).then_some(created + next(1_000_000)),
                    (next(5) != 0).then_some(started),
                    (next(9) != 0).then_some(finished),
                ],
            )
            .unwrap();
        }
        let (from, to) = (t0, t0 + 2 * MINUTE + 7);
        let (mut counts, mut latency) = count_minutes(&c, from, to).unwrap();
        let plan = stats_sql::roll_up(Dialect::Sqlite);
        let run = |i: usize| -> Vec<Vec<i64>> {
            let mut st = c.prepare(&plan.minutes[i].1).unwrap();
            st.query_map(params![from, to, 0, 1], |r| {
                (0..r.as_ref().column_count())
                    .map(|j| match r.get_ref(j)? {
                        rusqlite::types::ValueRef::Text(t) => Ok(match t {
                            b"a" | b"wait" => -1,
                            b"b" | b"run" => -2,
                            _ => -3,
                        }),
                        v => v.as_i64().map_err(Into::into),
                    })
                    .collect()
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
        };
        let code = |q: &str| match q {
            "a" | "wait" => -1,
            "b" | "run" => -2,
            _ => -3,
        };
        let mut want_counts = run(0);
        let mut want_latency: Vec<Vec<i64>> = run(1).into_iter().chain(run(2)).collect();
        counts.sort_by_key(|r: &CountRow| (r.at, r.queue.clone()));
        latency.sort_by_key(|r: &LatencyRow| (r.at, r.queue.clone(), r.kind.clone(), r.bucket));
        let got_counts: Vec<Vec<i64>> = counts
            .iter()
            .map(|r| {
                let n = [r.succeeded, r.failed, r.dead, r.cancelled, r.retried];
                [60, r.at, code(&r.queue)]
                    .into_iter()
                    .chain(n.map(|v| v as i64))
                    .collect()
            })
            .collect();
        let got_latency: Vec<Vec<i64>> = latency
            .iter()
            .map(|r| {
                vec![
                    60,
                    r.at,
                    code(&r.queue),
                    code(&r.kind),
                    r.bucket,
                    r.n as i64,
                ]
            })
            .collect();
        want_counts.sort();
        want_latency.sort();
        let (mut got_counts, mut got_latency) = (got_counts, got_latency);
        got_counts.sort();
        got_latency.sort();
        assert!(got_counts.len() >= 6, "three queues in two minutes");
        assert!(got_latency.len() > 100, "{}", got_latency.len());
        assert_eq!(got_counts, want_counts);
        assert_eq!(got_latency, want_latency);
    }

    /// The fast path's WHERE clause must start exactly the readable rows the start rule runs.
    #[test]
    fn fast_path_matches_the_start_rule() {
        let c = rusqlite::Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE jobs (state TEXT, crashes INTEGER, max_crashes INTEGER, \
             scheduled_at INTEGER)",
        )
        .unwrap();
        let now: Micros = 1_000;
        let mut checked = 0;
        for state in JobState::ALL {
            for crashes in [0u32, 2, 3, 4] {
                for at in [None, Some(now - 1), Some(now), Some(now + 1)] {
                    c.execute("DELETE FROM jobs", []).unwrap();
                    c.execute(
                        "INSERT INTO jobs VALUES (?1, ?2, 3, ?3)",
                        params![state.as_str(), crashes, at],
                    )
                    .unwrap();
                    let sql = format!(
                        "SELECT count(*) FROM jobs WHERE ?1 = ?1 AND ?2 = ?2 AND {START_RUNS}"
                    );
                    let n: i64 = c
                        .query_row(&sql, params!["id", "worker", now], |r| r.get(0))
                        .unwrap();
                    let mut job = crate::transition::sample_job(state);
                    job.crashes = crashes;
                    job.max_crashes = 3;
                    job.scheduled_at = at;
                    let runs = transition::start(&job, now) == transition::Start::Run;
                    assert_eq!(n == 1, runs, "{state} crashes={crashes} at={at:?}");
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, JobState::ALL.len() * 4 * 4);
    }

    /// Every search by state (alone, with a queue, a task, or both, with a cursor) reads an
    /// index that holds its state, never the whole table or an index of every job of a queue
    /// or task (migration 0021 took queued and running jobs out of the state indexes); and a
    /// resting state's page is read in id order, with no sort.
    #[test]
    fn a_search_by_state_reads_only_its_state() {
        let dir = tempfile::tempdir().unwrap();
        drop(Db::open(dir.path().join("h.db")).unwrap());
        let c = rusqlite::Connection::open(dir.path().join("h.db")).unwrap();
        let cursor = crate::job::new_job_id().to_string();
        for state in JobState::ALL {
            for (queue, task) in [
                (None, None),
                (Some("q"), None),
                (None, Some("t")),
                (Some("q"), Some("t")),
            ] {
                let search = crate::search::JobSearch {
                    state: Some(state),
                    queue: queue.map(str::to_string),
                    task: task.map(str::to_string),
                    ..Default::default()
                };
                let (sql, args) = search_sql(&c, &search, Some(&cursor), 50).unwrap();
                let plan: Vec<String> = c
                    .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                    .unwrap()
                    .query_map(rusqlite::params_from_iter(args.iter()), |r| {
                        r.get::<_, String>(3)
                    })
                    .unwrap()
                    .collect::<rusqlite::Result<_>>()
                    .unwrap();
                let plan = plan.join(" | ");
                let want = match state {
                    JobState::Running => "jobs_running",
                    JobState::Queued => "jobs_queued",
                    _ if queue.is_some() => "jobs_state_queue_id",
                    _ if task.is_some() => "jobs_state_task_id",
                    _ => "jobs_state_id",
                };
                let case = format!("{state} queue={queue:?} task={task:?}: {plan}");
                assert!(plan.contains(&format!("INDEX {want}")), "{case}");
                if !matches!(state, JobState::Running | JobState::Queued)
                    || queue.is_some() && state == JobState::Queued
                {
                    assert!(!plan.contains("TEMP B-TREE"), "sorts: {case}");
                }
            }
        }
    }

    /// The pruner's batches read an index from its oldest end and stop after the batch: no
    /// statement reads every finished job or sorts them (docs/pruner.md). Before, the jobs'
    /// batch searched `jobs_state_id` for the states and sorted all the matches.
    #[test]
    fn purge_batches_walk_an_index_without_sorting() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path().join("h.db")).unwrap();
        drop(db);
        let c = rusqlite::Connection::open(dir.path().join("h.db")).unwrap();
        for (sql, index) in [
            (PURGE_JOBS, "jobs_finished"),
            (PURGE_WORKFLOWS, "workflows_created"),
        ] {
            let plan: Vec<String> = c
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .unwrap()
                .query_map(params![1_000i64, 500i64], |r| r.get::<_, String>(3))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            let plan = plan.join("\n");
            assert!(plan.contains(&format!("USING INDEX {index}")), "{plan}");
            assert!(!plan.contains("TEMP B-TREE"), "{plan}");
            assert!(!plan.contains("SCAN"), "{plan}");
        }
    }
}

/// What SQLite alone can hold: a value of another type in any column, and a state outside the
/// closed set (PostgreSQL's column types and CHECK refuse both). The cases PostgreSQL shares
/// are in the poison conformance suite.
#[cfg(test)]
mod poison_tests {
    use super::*;
    use crate::job::{new_job_id, JobOptions};

    fn job(queue: &str) -> NewJob {
        NewJob {
            id: new_job_id(),
            task: "t".into(),
            queue: queue.into(),
            args: serde_json::json!({"n": 1}),
            options: JobOptions::default(),
            created_at: crate::time::now(),
            run_at: None,
        }
    }

    async fn planted(sql: &'static str) -> (SqliteStore, JobId, JobId) {
        let dir = tempfile::tempdir().unwrap().keep();
        let db = Db::open(dir.join("h.db")).unwrap();
        let s = SqliteStore::new(db.clone());
        let (good, bad) = (job("q"), job("q"));
        s.insert(vec![bad.clone(), good.clone()]).await.unwrap();
        let bid = bad.id.to_string();
        db.write(move |tx| tx.execute(sql, [bid])).await.unwrap();
        (s, good.id, bad.id)
    }

    /// A queue this store has admitted costs no lookup again: with the queue table gone, jobs
    /// still go to the known queue, while a new name, which must be counted, cannot.
    #[tokio::test]
    async fn a_known_queue_is_not_looked_up_again() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path().join("h.db")).unwrap();
        let s = SqliteStore::new(db.clone());
        s.insert(vec![job("q")]).await.expect("first insert");
        db.write(|tx| tx.execute_batch("ALTER TABLE queues RENAME TO queues_gone"))
            .await
            .unwrap();
        s.insert(vec![job("q"), job("q")])
            .await
            .expect("a known queue needs no lookup");
        assert!(s.insert(vec![job("q"), job("r")]).await.is_err());
        // Another store (another process) has not seen the name: it looks it up.
        assert!(SqliteStore::new(db).insert(vec![job("q")]).await.is_err());
    }

    /// Reads show the job with the column named; a start makes it dead and runs its neighbour.
    async fn dies_at_start(sql: &'static str, column: &str) {
        let (s, good, bad) = planted(sql).await;
        let j = s.get(bad).await.expect("get").expect("found");
        assert!(
            j.unreadable
                .iter()
                .any(|n| n.starts_with(&format!("{column} "))),
            "{:?}",
            j.unreadable
        );
        let page = s.list(&JobFilter::default(), None, 10).await.expect("list");
        assert_eq!(page.jobs.len(), 2);
        let out = s
            .start(&[bad, good], "w", crate::time::now())
            .await
            .unwrap();
        assert_eq!(out[0], StartOutcome::Dead, "{out:?}");
        assert!(
            matches!(&out[1], StartOutcome::Run(j) if j.id == good),
            "{out:?}"
        );
        let j = s.get(bad).await.unwrap().unwrap();
        assert_eq!(j.state, JobState::Dead);
        let error = j.error.unwrap_or_default();
        assert!(
            error.starts_with(&format!("stored {column} cannot be read")),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_counter_of_another_type_reads_and_dies_at_start() {
        dies_at_start("UPDATE jobs SET crashes = 'many' WHERE id = ?1", "crashes").await;
    }

    #[tokio::test]
    async fn a_budget_of_another_type_reads_and_dies_at_start() {
        // Not in the fast path's WHERE clause: the start is made, then undone.
        dies_at_start(
            "UPDATE jobs SET max_retries = 'x' WHERE id = ?1",
            "max_retries",
        )
        .await;
    }

    #[tokio::test]
    async fn an_unknown_state_reads_and_dies_at_start() {
        dies_at_start("UPDATE jobs SET state = 'paused' WHERE id = ?1", "state").await;
    }
}

#[cfg(test)]
mod round_tests {
    use super::*;
    use crate::broker::{sqlite::SqliteBroker, Broker};
    use crate::job::{new_job_id, JobOptions};

    fn job(queue: &str) -> NewJob {
        NewJob {
            id: new_job_id(),
            task: "t".into(),
            queue: queue.into(),
            args: serde_json::json!(null),
            options: JobOptions::default(),
            created_at: crate::time::now(),
            run_at: None,
        }
    }

    /// One transaction finishes a batch, deletes its messages and takes (reserves and starts)
    /// the next ones, never more than it was asked for; an undecodable message is reserved but
    /// not started, for the worker to dead-letter.
    #[tokio::test]
    async fn a_round_commits_acks_and_takes_the_next_batch_in_one_write() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path().join("h.db")).unwrap();
        let (store, broker) = (SqliteStore::new(db.clone()), SqliteBroker::new(db.clone()));
        let jobs: Vec<NewJob> = (0..4).map(|_| job("q")).collect();
        store.insert(jobs.clone()).await.unwrap();
        let publish: Vec<ToPublish> = jobs
            .iter()
            .map(|j| ToPublish {
                id: j.id,
                queue: "q".into(),
                priority: 0,
            })
            .collect();
        broker.publish(&publish).await.unwrap();
        db.write(|tx| {
            tx.execute(
                "INSERT INTO messages (queue, payload, priority) VALUES ('q', 'not a job id', 0)",
                [],
            )
        })
        .await
        .unwrap();
        let queues = vec!["q".to_string()];
        let first = broker
            .reserve("w", &queues, 2, std::time::Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(first.len(), 2);
        let ids: Vec<JobId> = first.iter().map(|d| *d.job.as_ref().unwrap()).collect();
        let started = store.start(&ids, "w", crate::time::now()).await.unwrap();
        let done: Vec<Completion> = started
            .iter()
            .map(|o| match o {
                StartOutcome::Run(j) => Completion {
                    id: j.id,
                    epoch: j.epoch,
                    outcome: Outcome::Succeeded(serde_json::json!(1)),
                },
                other => panic!("not started: {other:?}"),
            })
            .collect();
        let take = Take {
            worker: "w".into(),
            queues: queues.clone(),
            max: 2,
        };
        let (committed, taken) = complete_and_take(&db, &done, &first, take, crate::time::now())
            .await
            .unwrap();
        assert!(committed.iter().all(|c| matches!(
            c,
            Committed::Applied {
                state: JobState::Succeeded,
                ..
            }
        )));
        assert_eq!(
            taken.len(),
            2,
            "took as many as it was asked for: {taken:?}"
        );
        assert!(
            matches!(&taken[0].1, Some(StartOutcome::Run(j)) if j.id == jobs[2].id && j.worker.as_deref() == Some("w")),
            "{taken:?}"
        );
        assert!(matches!(&taken[1].1, Some(StartOutcome::Run(j)) if j.id == jobs[3].id));
        let depth = broker.depths().await.unwrap();
        assert_eq!(
            (depth[0].ready, depth[0].reserved),
            (1, 2),
            "the acknowledged messages are gone, the taken ones reserved, the rest ready"
        );
        // The next round reaches the undecodable message: reserved, not started.
        let done: Vec<Completion> = taken
            .iter()
            .map(|(_, o)| match o {
                Some(StartOutcome::Run(j)) => Completion {
                    id: j.id,
                    epoch: j.epoch,
                    outcome: Outcome::Succeeded(serde_json::json!(1)),
                },
                other => panic!("not started: {other:?}"),
            })
            .collect();
        let acks: Vec<_> = taken.iter().map(|(d, _)| d.clone()).collect();
        let take = Take {
            worker: "w".into(),
            queues,
            max: 2,
        };
        let (_, taken) = complete_and_take(&db, &done, &acks, take, crate::time::now())
            .await
            .unwrap();
        assert_eq!(taken.len(), 1);
        assert!(taken[0].0.job.is_err() && taken[0].1.is_none(), "{taken:?}");
        for j in &jobs {
            let j = store.get(j.id).await.unwrap().unwrap();
            assert_eq!(j.state, JobState::Succeeded);
        }
    }

    /// An idle worker's take after a wake looks before it writes: with nothing ready it answers
    /// `None` without asking for the write lock (held meanwhile by another connection, which a
    /// write would wait up to 30 s for and then fail), and with a message ready it reserves and
    /// starts it in one write.
    #[tokio::test]
    async fn a_take_after_a_wake_looks_before_it_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let db = Db::open(&path).unwrap();
        let (store, broker) = (SqliteStore::new(db.clone()), SqliteBroker::new(db.clone()));
        let take = |q: &str| Take {
            worker: "w".into(),
            queues: vec![q.into()],
            max: 2,
        };
        let j = job("q");
        store.insert(vec![j.clone()]).await.unwrap();
        broker
            .publish(&[ToPublish {
                id: j.id,
                queue: "q".into(),
                priority: 0,
            }])
            .await
            .unwrap();

        let other = rusqlite::Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let began = std::time::Instant::now();
        let got = take_if_ready(&db, take("empty"), crate::time::now())
            .await
            .expect("a take with nothing ready must not touch the write lock");
        assert!(got.is_none(), "{got:?}");
        assert!(
            began.elapsed() < std::time::Duration::from_secs(10),
            "it waited for the write lock: it wrote without looking"
        );
        other.execute_batch("COMMIT").unwrap();

        let taken = take_if_ready(&db, take("q"), crate::time::now())
            .await
            .unwrap()
            .expect("a message was ready");
        assert_eq!(taken.len(), 1, "{taken:?}");
        assert!(
            matches!(&taken[0].1, Some(StartOutcome::Run(r)) if r.id == j.id && r.worker.as_deref() == Some("w")),
            "{taken:?}"
        );
        let depth = broker.depths().await.unwrap();
        assert_eq!((depth[0].ready, depth[0].reserved), (0, 1));
        assert!(take_if_ready(&db, take("q"), crate::time::now())
            .await
            .unwrap()
            .is_none());
    }
}
