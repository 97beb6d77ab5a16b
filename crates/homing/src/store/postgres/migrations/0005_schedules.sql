-- Version 5: periodic schedules (docs/schedules.md), one row per schedule. `spec` (when ticks
-- fall, JSON text) is its own column so that setting a schedule again with the same spec keeps
-- its cursor; `definition` is the whole definition (task, args, queue, options, spec, missed-tick
-- policy) as JSON text, read back by the same decoder as the SQLite store's. Every tick at or
-- before `cursor` is decided; the periodic loop moves it with a compare-and-set in the same
-- transaction as the ticks' jobs. The same change as the SQLite store's 0005_schedules.sql.

CREATE TABLE homing_schedules (
    name       TEXT PRIMARY KEY,
    spec       TEXT NOT NULL,
    definition TEXT NOT NULL,
    paused     BOOLEAN NOT NULL DEFAULT FALSE,
    cursor     BIGINT NOT NULL,
    last_tick  BIGINT,
    last_job   TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
