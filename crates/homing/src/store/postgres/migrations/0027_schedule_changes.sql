-- Version 27: a count of changes to what the periodic pass reads of the schedules (their names,
-- specs, cursors and paused flags), kept by a trigger so that no write path can forget it. Each
-- process's pass reads the count four times a second and reads the schedules' heads again only
-- when it moved (Store::schedule_changes): with 20,000 schedules the heads took tens of
-- milliseconds of every pass.
--
-- Deltas, as the queue counts are (migration 17): each counted statement inserts a row of 1, a
-- reader sums the rows, and a fold (`homing_fold_schedule_changes`) replaces them with their sum
-- now and then. One row updated by every writer would be locked by each until its commit, so
-- one firing stalled mid-transaction in one process would hold up every schedule write in every
-- other; inserts never wait. The sum a reader sees includes every change committed before its
-- read. Statement-level: a statement counts once however many rows it changed (an upsert
-- counts twice, as PostgreSQL runs both its INSERT and UPDATE statement triggers; a DELETE of a
-- missing row once): more only makes a reader read the heads once too often. `last_tick` and
-- `last_job`, written by every firing after its cursor, are not among the columns, so a firing
-- that moved a cursor counts exactly one.
CREATE TABLE homing_schedule_changes (
    n BIGINT NOT NULL
);

CREATE FUNCTION homing_schedules_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO homing_schedule_changes (n) VALUES (1);
    RETURN NULL;
END
$$;

CREATE TRIGGER homing_schedules_changed
    AFTER INSERT OR UPDATE OF name, spec, cursor, paused OR DELETE OR TRUNCATE ON homing_schedules
    FOR EACH STATEMENT EXECUTE FUNCTION homing_schedules_changed();

-- Replaces the deltas visible now with their sum, in one statement, so a concurrent reader sums
-- the same before or after. Deltas inserted meanwhile are not deleted and still count; two folds
-- at once each fold only the rows they deleted.
CREATE FUNCTION homing_fold_schedule_changes() RETURNS void LANGUAGE sql AS $$
    WITH gone AS (DELETE FROM homing_schedule_changes RETURNING n)
    INSERT INTO homing_schedule_changes (n) SELECT sum(n) FROM gone HAVING count(*) > 0;
$$;
