-- Version 27: a count of changes to what the periodic pass reads of the schedules (their names,
-- specs, cursors and paused flags), kept by a trigger so that no write path can forget it. Each
-- process's pass reads this one row four times a second and reads the schedules' heads again
-- only when it moved (Store::schedule_changes): with 20,000 schedules the heads took tens of
-- milliseconds of every pass.
--
-- One row, so a writer holds its lock until it commits and schedule writes take turns; they are
-- few (a firing, a set, a pause, a delete), unlike the jobs' writes, whose counts are deltas
-- (migration 17). A count a reader sees therefore includes every change committed before it.
-- The trigger runs BEFORE each statement, so a writer takes this lock before any schedule's row
-- lock, in every transaction in the same order: no deadlock between two writers. It counts each
-- statement once, even one that changed no row (a firing that lost its compare-and-set): a
-- reader only ever reads the heads once too often. `last_tick`/`last_job`, written by every
-- firing after its cursor, are not among the columns, so a firing that moved a cursor counts
-- exactly one.
CREATE TABLE homing_schedule_changes (
    one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    n BIGINT NOT NULL
);
INSERT INTO homing_schedule_changes (one, n) VALUES (TRUE, 0);

CREATE FUNCTION homing_schedules_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE homing_schedule_changes SET n = n + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER homing_schedules_changed
    BEFORE INSERT OR UPDATE OF name, spec, cursor, paused OR DELETE OR TRUNCATE ON homing_schedules
    FOR EACH STATEMENT EXECUTE FUNCTION homing_schedules_changed();
