-- Version 8: cluster-wide limits (docs/limits.md). The same change as the SQLite store's
-- 0008_queue_limits.sql.
--
-- homing_queues.concurrency / rate_count, rate_period_us / key_arg: a queue's limits; NULL = none.
--   A start of a limited queue locks its row FOR UPDATE, so two starts never both take the last
--   slot; a release (terminal commit, rescue) locks it too before unparking.
-- parked: held back by a start (paused queue or limit without room); the reconciler does not
--   publish it; a released slot, the periodic pass, a resume or a limit change unparks it.
-- limit_key: the key a job was started or parked under (NULL for a queue-wide limit).
-- homing_limit_starts: one row per start of a rate-limited queue, counted over the window.

ALTER TABLE homing_queues ADD COLUMN concurrency BIGINT;
ALTER TABLE homing_queues ADD COLUMN rate_count BIGINT;
ALTER TABLE homing_queues ADD COLUMN rate_period_us BIGINT;
ALTER TABLE homing_queues ADD COLUMN key_arg TEXT;
ALTER TABLE homing_jobs ADD COLUMN parked BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE homing_jobs ADD COLUMN limit_key TEXT;
CREATE INDEX homing_jobs_limit_running ON homing_jobs (queue, limit_key) WHERE state = 'running';
CREATE INDEX homing_jobs_parked ON homing_jobs (queue, limit_key, priority DESC, id)
    WHERE state = 'queued' AND parked;
CREATE TABLE homing_limit_starts (
    queue TEXT NOT NULL,
    key   TEXT NOT NULL,
    at    BIGINT NOT NULL
);
CREATE INDEX homing_limit_starts_window ON homing_limit_starts (queue, key, at);
