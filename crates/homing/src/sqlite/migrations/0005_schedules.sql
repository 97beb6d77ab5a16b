-- Periodic schedules (docs/schedules.md): one row per schedule. `spec` (when ticks fall, JSON)
-- is its own column so that setting a schedule again with the same spec keeps its cursor;
-- `definition` holds the whole definition (task, args, queue, options, spec, missed-tick
-- policy) as JSON. Every tick at or before `cursor` is decided; the periodic loop moves it with
-- a compare-and-set in the same transaction as the ticks' jobs. The same change as the
-- PostgreSQL store's 0005_schedules.sql.
CREATE TABLE IF NOT EXISTS schedules (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    definition TEXT NOT NULL,
    paused INTEGER NOT NULL DEFAULT 0,
    cursor INTEGER NOT NULL,
    last_tick INTEGER,
    last_job TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
