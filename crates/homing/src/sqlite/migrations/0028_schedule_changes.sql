-- Version 28: a count of changes to what the periodic pass reads of the schedules (their names,
-- specs, cursors and paused flags), kept by triggers so that no write path can forget it. Each
-- process's pass reads this one row four times a second and reads the schedules' heads again
-- only when it moved (Store::schedule_changes): with 20,000 schedules the heads took about
-- 40 ms of every pass. `last_tick`/`last_job`, written by every firing after its cursor, are not
-- among the columns, so a firing that moved a cursor counts exactly one.
CREATE TABLE IF NOT EXISTS schedule_changes (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    n INTEGER NOT NULL
);
INSERT OR IGNORE INTO schedule_changes (one, n) VALUES (1, 0);

DROP TRIGGER IF EXISTS schedules_changed_insert;
CREATE TRIGGER schedules_changed_insert AFTER INSERT ON schedules
BEGIN
    UPDATE schedule_changes SET n = n + 1;
END;
DROP TRIGGER IF EXISTS schedules_changed_update;
CREATE TRIGGER schedules_changed_update AFTER UPDATE OF name, spec, cursor, paused ON schedules
BEGIN
    UPDATE schedule_changes SET n = n + 1;
END;
DROP TRIGGER IF EXISTS schedules_changed_delete;
CREATE TRIGGER schedules_changed_delete AFTER DELETE ON schedules
BEGIN
    UPDATE schedule_changes SET n = n + 1;
END;
