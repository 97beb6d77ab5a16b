-- Version 3: one row per queue name the store has accepted. Enqueue registers a job's queue here
-- in its own transaction and refuses a NEW name once the store holds its limit of names (default
-- 1,000, `--max-queues`): every per-queue view, gauge and broker key grows with the number of
-- names, and a producer that makes up a name per job would otherwise make each of them grow
-- without bound. Per-queue settings (pause, limits) will hang on this table. The same schema
-- change as the SQLite store's `QUEUES_DDL`.
--
-- Existing queues are registered here, so they keep working whatever their number.

CREATE TABLE homing_queues (
    name       TEXT PRIMARY KEY,
    created_at BIGINT NOT NULL
);

INSERT INTO homing_queues (name, created_at)
SELECT queue, MIN(created_at) FROM homing_jobs GROUP BY queue;
