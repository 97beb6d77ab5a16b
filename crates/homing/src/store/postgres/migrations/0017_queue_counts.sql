-- Version 17: each queue's job count per state, kept by triggers (docs/counts.md), so the
-- queue list, the metrics, the depth samples and bulk previews read a few rows instead of
-- counting the jobs table. The triggers run inside the statement that changes jobs, so every
-- path keeps the counts in the same transaction, and none can forget to.
--
-- The table holds signed deltas, not one row per (queue, state): a row every worker updated
-- would be locked by each completing transaction until its commit, serialising them all (and
-- inviting deadlocks between transactions that touch two states in different orders). Triggers
-- only ever insert, which never waits; a reader sums the rows, and a fold
-- (`homing_fold_queue_counts`) replaces them with one row per (queue, state) now and then.
-- No index: inserts stay as cheap as possible, and every read sums the whole, small, table.
CREATE TABLE homing_queue_counts (
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    n BIGINT NOT NULL
);

-- Writers that started before this migration must finish before the backfill counts, and none
-- may write between the count and the triggers: this lock is held until the migration commits.
LOCK TABLE homing_jobs IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO homing_queue_counts (queue, state, n)
    SELECT queue, state, count(*) FROM homing_jobs GROUP BY queue, state;

-- Statement-level with transition tables: one aggregated insert per statement, however many
-- jobs it changed. An UPDATE adds the new rows and takes away the old ones per (queue, state);
-- pairing them is unnecessary, and statements that change neither column add nothing.
CREATE FUNCTION homing_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO homing_queue_counts (queue, state, n)
        SELECT queue, state, count(*) FROM homing_new_rows GROUP BY queue, state;
    RETURN NULL;
END
$$;

CREATE FUNCTION homing_count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO homing_queue_counts (queue, state, n)
        SELECT queue, state, -count(*) FROM homing_old_rows GROUP BY queue, state;
    RETURN NULL;
END
$$;

CREATE FUNCTION homing_count_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO homing_queue_counts (queue, state, n)
        SELECT queue, state, sum(d) FROM (
            SELECT queue, state, 1 AS d FROM homing_new_rows
            UNION ALL
            SELECT queue, state, -1 AS d FROM homing_old_rows
        ) AS changes
        GROUP BY queue, state HAVING sum(d) <> 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER homing_jobs_count_insert AFTER INSERT ON homing_jobs
    REFERENCING NEW TABLE AS homing_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION homing_count_inserted();
CREATE TRIGGER homing_jobs_count_delete AFTER DELETE ON homing_jobs
    REFERENCING OLD TABLE AS homing_old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION homing_count_deleted();
CREATE TRIGGER homing_jobs_count_update AFTER UPDATE ON homing_jobs
    REFERENCING OLD TABLE AS homing_old_rows NEW TABLE AS homing_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION homing_count_updated();
-- TRUNCATE fires none of the above; homing never truncates its jobs, and one by hand empties
-- them, so the counts empty with them.
CREATE FUNCTION homing_count_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM homing_queue_counts;
    RETURN NULL;
END
$$;
CREATE TRIGGER homing_jobs_count_truncate AFTER TRUNCATE ON homing_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION homing_count_truncated();

-- Replaces the deltas visible now with their sums, in one statement, so a concurrent reader
-- sees the rows before or after and sums the same. Deltas inserted meanwhile are not deleted
-- and still count; two folds at once each fold only the rows they deleted.
CREATE FUNCTION homing_fold_queue_counts() RETURNS void LANGUAGE sql AS $$
    WITH gone AS (DELETE FROM homing_queue_counts RETURNING queue, state, n)
    INSERT INTO homing_queue_counts (queue, state, n)
        SELECT queue, state, sum(n) FROM gone GROUP BY queue, state HAVING sum(n) <> 0;
$$;
