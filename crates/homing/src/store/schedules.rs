//! Periodic schedules in the store (docs/schedules.md): the SQL of both stores for the
//! `schedules` table (`homing_schedules` on PostgreSQL), kept together so the two stay alike.
//! Decisions are [`crate::schedule`]'s; these functions only apply them:
//!
//! - setting a schedule keeps its cursor when its spec is unchanged (a config file reconciled at
//!   every start does not move it), and starts it at the current second otherwise;
//! - resuming starts it at the current second (ticks that fell while it was paused are not owed);
//! - firing is one transaction: a compare-and-set of the cursor, then the ticks' jobs (each with
//!   its tick's idempotency key), then `last_tick`/`last_job`. A scheduler that lost the race
//!   changes nothing and learns so (`None`).

use crate::job::JobId;
use crate::schedule::{Schedule, ScheduleDef, ScheduleHead};
use crate::store::{PageFill, SchedulePage};
use crate::time::Micros;

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// One stored row, before decoding.
struct Row {
    name: String,
    definition: String,
    paused: bool,
    cursor: Micros,
    last_tick: Option<Micros>,
    last_job: Option<String>,
    created_at: Micros,
    updated_at: Micros,
}

impl Row {
    /// The schedule, or `None` (logged) when its definition cannot be read: one bad row never
    /// hides the others nor stops the loop.
    fn decode(self) -> Option<Schedule> {
        let def: ScheduleDef = match serde_json::from_str(&self.definition) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(schedule = %self.name, error = %e, "a schedule's stored definition cannot be read; it is skipped");
                return None;
            }
        };
        Some(Schedule {
            def,
            paused: self.paused,
            cursor: self.cursor,
            last_tick: self.last_tick,
            last_job: self.last_job.and_then(|j| j.parse::<JobId>().ok()),
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// A head from its stored columns, or `None` (logged) when its spec cannot be read.
fn head(name: String, spec: &str, cursor: Micros) -> Option<ScheduleHead> {
    match serde_json::from_str(spec) {
        Ok(spec) => Some(ScheduleHead { name, spec, cursor }),
        Err(e) => {
            tracing::error!(schedule = %name, error = %e, "a schedule's stored spec cannot be read; it is skipped");
            None
        }
    }
}

#[cfg(feature = "sqlite")]
pub(crate) mod sqlite {
    use super::*;
    use crate::schedule::Firing;
    use crate::store::Inserted;
    use rusqlite::{params, OptionalExtension as _};

    const COLUMNS: &str =
        "name, definition, paused, cursor, last_tick, last_job, created_at, updated_at";

    fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
        Ok(Row {
            name: r.get(0)?,
            definition: r.get(1)?,
            paused: r.get::<_, i64>(2)? != 0,
            cursor: r.get(3)?,
            last_tick: r.get(4)?,
            last_job: r.get(5)?,
            created_at: r.get(6)?,
            updated_at: r.get(7)?,
        })
    }

    pub(crate) fn get(c: &rusqlite::Connection, name: &str) -> rusqlite::Result<Option<Schedule>> {
        Ok(c.query_row(
            &format!("SELECT {COLUMNS} FROM schedules WHERE name = ?1"),
            [name],
            row,
        )
        .optional()?
        .and_then(Row::decode))
    }

    /// See [`crate::store::Store::schedules_page`]. Each row's definition is weighed before it
    /// is read out of the statement, so a page past its bytes decodes nothing more.
    pub(crate) fn page(
        c: &rusqlite::Connection,
        after: Option<&str>,
        limit: usize,
    ) -> rusqlite::Result<SchedulePage> {
        let mut st = c.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM schedules WHERE name > ?1 ORDER BY name LIMIT ?2"
        ))?;
        let mut rows = st.query(params![
            after.unwrap_or(""),
            i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1
        ])?;
        let mut fill = PageFill::new(limit);
        let mut page = SchedulePage::default();
        let mut last: Option<String> = None;
        while let Some(r) = rows.next()? {
            let bytes = match r.get_ref(1)? {
                rusqlite::types::ValueRef::Text(b) => b.len(),
                _ => 0,
            };
            if fill.counted_out() || !fill.take(bytes) {
                page.next = last;
                break;
            }
            let r = row(r)?;
            last = Some(r.name.clone());
            page.schedules.extend(r.decode());
        }
        Ok(page)
    }

    /// The heads of unpaused schedules, by name; see [`crate::store::Store::schedule_heads`].
    const HEADS: &str = "SELECT name, spec, cursor FROM schedules WHERE paused = 0 ORDER BY name";

    pub(crate) fn heads(c: &rusqlite::Connection) -> rusqlite::Result<Vec<ScheduleHead>> {
        let mut st = c.prepare_cached(HEADS)?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get::<_, String>(1)?, r.get(2)?)))?;
        let mut out = Vec::new();
        for r in rows {
            let (name, spec, cursor) = r?;
            out.extend(head(name, &spec, cursor));
        }
        Ok(out)
    }

    /// See [`crate::store::Store::schedule_changes`] (migration 28).
    pub(crate) fn changes(c: &rusqlite::Connection) -> rusqlite::Result<u64> {
        let n: i64 = c
            .prepare_cached("SELECT n FROM schedule_changes")?
            .query_row([], |r| r.get(0))?;
        Ok(n.unsigned_abs())
    }

    /// The change count (migration 28) moves with an update that sets any column the pass
    /// reads, however it is written (here by hand), and not with the others.
    #[test]
    fn changes_count_each_head_column_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let _migrated = crate::sqlite::Db::open(&path).unwrap();
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute(
            "INSERT INTO schedules (name, spec, definition, paused, cursor, created_at, \
             updated_at) VALUES ('hand', '{}', '{}', 0, 0, 0, 0)",
            [],
        )
        .unwrap();
        for (set, counted) in [
            ("UPDATE schedules SET name = name", 1),
            ("UPDATE schedules SET spec = spec", 1),
            ("UPDATE schedules SET cursor = cursor", 1),
            ("UPDATE schedules SET paused = paused", 1),
            (
                "UPDATE schedules SET last_tick = 1, last_job = 'x', definition = definition, \
                 updated_at = 2",
                0,
            ),
            ("DELETE FROM schedules", 1),
        ] {
            let before = changes(&c).unwrap();
            c.execute(set, []).unwrap();
            assert_eq!(changes(&c).unwrap() - before, counted, "{set}");
        }
    }

    /// The pass's read never touches the table, whose rows carry the args (migration 27):
    /// SQLite answers it from the covering index alone.
    #[test]
    fn heads_are_read_from_their_index_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let _migrated = crate::sqlite::Db::open(&path).unwrap();
        let c = rusqlite::Connection::open(&path).unwrap();
        let plan: Vec<String> = c
            .prepare(&format!("EXPLAIN QUERY PLAN {HEADS}"))
            .unwrap()
            .query_map([], |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(
            plan,
            ["SEARCH schedules USING COVERING INDEX schedules_heads (paused=?)"]
        );
    }

    pub(crate) fn put(
        tx: &rusqlite::Transaction<'_>,
        def: &ScheduleDef,
        now: Micros,
    ) -> rusqlite::Result<Option<Schedule>> {
        tx.execute(
            "INSERT INTO schedules (name, spec, definition, paused, cursor, created_at, updated_at) \
             VALUES (?1, ?2, ?3, 0, ?4, ?5, ?5) \
             ON CONFLICT (name) DO UPDATE SET definition = excluded.definition, \
               cursor = CASE WHEN schedules.spec = excluded.spec THEN schedules.cursor \
                             ELSE excluded.cursor END, \
               spec = excluded.spec, updated_at = excluded.updated_at",
            params![
                def.name,
                to_json(&def.spec),
                to_json(def),
                crate::schedule::whole_second(now),
                now
            ],
        )?;
        get(tx, &def.name)
    }

    pub(crate) fn delete(tx: &rusqlite::Transaction<'_>, name: &str) -> rusqlite::Result<bool> {
        Ok(tx.execute("DELETE FROM schedules WHERE name = ?1", [name])? > 0)
    }

    pub(crate) fn set_paused(
        tx: &rusqlite::Transaction<'_>,
        name: &str,
        paused: bool,
        now: Micros,
    ) -> rusqlite::Result<Option<Schedule>> {
        // Resuming a paused schedule restarts its cursor now: the paused time is not owed.
        tx.execute(
            "UPDATE schedules SET \
               cursor = CASE WHEN paused = 1 AND ?2 = 0 THEN ?3 ELSE cursor END, \
               paused = ?2, updated_at = ?4 WHERE name = ?1",
            params![name, paused as i64, crate::schedule::whole_second(now), now],
        )?;
        get(tx, name)
    }

    pub(crate) fn fire(
        tx: &rusqlite::Transaction<'_>,
        firing: &Firing,
        max_queues: u64,
        now: Micros,
    ) -> rusqlite::Result<Option<Vec<Inserted>>> {
        let moved = tx.execute(
            "UPDATE schedules SET cursor = ?3, updated_at = ?4 \
             WHERE name = ?1 AND cursor = ?2 AND paused = 0",
            params![firing.name, firing.expected_cursor, firing.new_cursor, now],
        )?;
        if moved == 0 {
            return Ok(None);
        }
        let jobs: Vec<crate::job::NewJob> = firing.jobs.iter().map(|(_, j)| j.clone()).collect();
        crate::store::queues::admit_sqlite(tx, &jobs, max_queues, now)?;
        let mut out = Vec::with_capacity(jobs.len());
        for j in &jobs {
            out.push(crate::store::sqlite::insert_one(tx, j)?);
        }
        if let (Some((tick, _)), Some(ins)) = (firing.jobs.last(), out.last()) {
            tx.execute(
                "UPDATE schedules SET last_tick = ?2, last_job = ?3 WHERE name = ?1",
                params![firing.name, tick, ins.id.to_string()],
            )?;
        }
        Ok(Some(out))
    }
}

#[cfg(feature = "postgres")]
pub(crate) mod postgres {
    use super::*;
    use crate::schedule::Firing;
    use crate::store::Inserted;
    use sqlx::{PgConnection, Row as _};

    const COLUMNS: &str =
        "name, definition, paused, cursor, last_tick, last_job, created_at, updated_at";

    fn row(r: &sqlx::postgres::PgRow) -> sqlx::Result<Row> {
        Ok(Row {
            name: r.try_get(0)?,
            definition: r.try_get(1)?,
            paused: r.try_get(2)?,
            cursor: r.try_get(3)?,
            last_tick: r.try_get(4)?,
            last_job: r.try_get(5)?,
            created_at: r.try_get(6)?,
            updated_at: r.try_get(7)?,
        })
    }

    pub(crate) async fn get(c: &mut PgConnection, name: &str) -> sqlx::Result<Option<Schedule>> {
        let r = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM homing_schedules WHERE name = $1"
        )))
        .bind(name)
        .fetch_optional(c)
        .await?;
        Ok(match r {
            Some(r) => row(&r)?.decode(),
            None => None,
        })
    }

    /// See [`crate::store::Store::schedules_page`]: the names and sizes first, then only the
    /// rows that fit, in one snapshot, so a page past its bytes never crosses the wire.
    pub(crate) async fn page(
        c: &mut PgConnection,
        after: Option<&str>,
        limit: usize,
    ) -> sqlx::Result<SchedulePage> {
        let mut tx = sqlx::Connection::begin(c).await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        // By bytes, as the embedded file orders them, whatever the database's collation.
        let sized: Vec<(String, i64)> = sqlx::query_as(
            "SELECT name, octet_length(definition)::bigint FROM homing_schedules \
             WHERE name COLLATE \"C\" > $1 ORDER BY name COLLATE \"C\" LIMIT $2",
        )
        .bind(after.unwrap_or(""))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1)
        .fetch_all(&mut *tx)
        .await?;
        let mut fill = PageFill::new(limit);
        let names: Vec<String> = sized
            .iter()
            .take_while(|(_, bytes)| {
                !fill.counted_out() && fill.take(usize::try_from(*bytes).unwrap_or(usize::MAX))
            })
            .map(|(name, _)| name.clone())
            .collect();
        let next = (names.len() < sized.len())
            .then(|| names.last().cloned())
            .flatten();
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM homing_schedules WHERE name = ANY($1) \
             ORDER BY name COLLATE \"C\""
        )))
        .bind(&names)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let mut schedules = Vec::new();
        for r in &rows {
            schedules.extend(row(r)?.decode());
        }
        Ok(SchedulePage { schedules, next })
    }

    pub(crate) async fn heads(c: &mut PgConnection) -> sqlx::Result<Vec<ScheduleHead>> {
        // By bytes, as the embedded file orders them, whatever the database's collation.
        let rows = sqlx::query(
            "SELECT name, spec, cursor FROM homing_schedules WHERE NOT paused \
             ORDER BY name COLLATE \"C\"",
        )
        .fetch_all(c)
        .await?;
        let mut out = Vec::new();
        for r in &rows {
            out.extend(head(
                r.try_get(0)?,
                &r.try_get::<String, _>(1)?,
                r.try_get(2)?,
            ));
        }
        Ok(out)
    }

    /// Deltas the count may gather before a read folds them into one row.
    const CHANGES_KEPT: i64 = 64;

    /// See [`crate::store::Store::schedule_changes`]: the sum of the deltas (migration 27),
    /// folded into one row by the read that finds more than [`CHANGES_KEPT`] of them (a fold
    /// keeps the sum; folds at once from several processes each fold only what they deleted).
    pub(crate) async fn changes(c: &mut PgConnection) -> sqlx::Result<u64> {
        let (n, rows): (i64, i64) = sqlx::query_as(
            "SELECT coalesce(sum(n), 0)::bigint, count(*) FROM homing_schedule_changes",
        )
        .fetch_one(&mut *c)
        .await?;
        if rows > CHANGES_KEPT {
            sqlx::query("SELECT homing_fold_schedule_changes()")
                .execute(&mut *c)
                .await?;
        }
        Ok(n.unsigned_abs())
    }

    pub(crate) async fn put(
        c: &mut PgConnection,
        def: &ScheduleDef,
        now: Micros,
    ) -> sqlx::Result<Option<Schedule>> {
        sqlx::query(
            "INSERT INTO homing_schedules (name, spec, definition, paused, cursor, created_at, updated_at) \
             VALUES ($1, $2, $3, FALSE, $4, $5, $5) \
             ON CONFLICT (name) DO UPDATE SET definition = excluded.definition, \
               cursor = CASE WHEN homing_schedules.spec = excluded.spec \
                             THEN homing_schedules.cursor ELSE excluded.cursor END, \
               spec = excluded.spec, updated_at = excluded.updated_at",
        )
        .bind(&def.name)
        .bind(to_json(&def.spec))
        .bind(to_json(def))
        .bind(crate::schedule::whole_second(now))
        .bind(now)
        .execute(&mut *c)
        .await?;
        get(c, &def.name).await
    }

    pub(crate) async fn delete(c: &mut PgConnection, name: &str) -> sqlx::Result<bool> {
        let r = sqlx::query("DELETE FROM homing_schedules WHERE name = $1")
            .bind(name)
            .execute(c)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    pub(crate) async fn set_paused(
        c: &mut PgConnection,
        name: &str,
        paused: bool,
        now: Micros,
    ) -> sqlx::Result<Option<Schedule>> {
        sqlx::query(
            "UPDATE homing_schedules SET \
               cursor = CASE WHEN paused AND NOT $2 THEN $3 ELSE cursor END, \
               paused = $2, updated_at = $4 WHERE name = $1",
        )
        .bind(name)
        .bind(paused)
        .bind(crate::schedule::whole_second(now))
        .bind(now)
        .execute(&mut *c)
        .await?;
        get(c, name).await
    }

    pub(crate) async fn fire(
        c: &mut PgConnection,
        firing: &Firing,
        max_queues: u64,
        now: Micros,
    ) -> sqlx::Result<Option<Vec<Inserted>>> {
        // The row lock taken here serialises competing schedulers: the loser waits, then sees
        // the cursor moved and updates nothing.
        let moved = sqlx::query(
            "UPDATE homing_schedules SET cursor = $3, updated_at = $4 \
             WHERE name = $1 AND cursor = $2 AND NOT paused",
        )
        .bind(&firing.name)
        .bind(firing.expected_cursor)
        .bind(firing.new_cursor)
        .bind(now)
        .execute(&mut *c)
        .await?;
        if moved.rows_affected() == 0 {
            return Ok(None);
        }
        let jobs: Vec<crate::job::NewJob> = firing.jobs.iter().map(|(_, j)| j.clone()).collect();
        crate::store::queues::admit_pg(&mut *c, &jobs, max_queues, now).await?;
        let out = crate::store::postgres::insert_jobs(&mut *c, &jobs).await?;
        if let (Some((tick, _)), Some(ins)) = (firing.jobs.last(), out.last()) {
            sqlx::query(
                "UPDATE homing_schedules SET last_tick = $2, last_job = $3 WHERE name = $1",
            )
            .bind(&firing.name)
            .bind(tick)
            .bind(ins.id.to_string())
            .execute(&mut *c)
            .await?;
        }
        Ok(Some(out))
    }
}
