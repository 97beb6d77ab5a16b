-- Cluster-wide limits (docs/limits.md). The same change as the PostgreSQL store's
-- 0008_queue_limits.sql.
--
-- queues.concurrency / rate_count, rate_period_us / key_arg: a queue's limits; NULL = none.
-- jobs.parked: held back by a start (paused queue or limit without room); the reconciler does not
--   publish it; a released slot, the periodic pass, a resume or a limit change unparks it.
-- jobs.limit_key: the key a job was started or parked under (NULL for a queue-wide limit).
-- limit_starts: one row per start of a rate-limited queue, counted over the rate's window and
--   pruned once older than it.
ALTER TABLE queues ADD COLUMN concurrency INTEGER;
ALTER TABLE queues ADD COLUMN rate_count INTEGER;
ALTER TABLE queues ADD COLUMN rate_period_us INTEGER;
ALTER TABLE queues ADD COLUMN key_arg TEXT;
ALTER TABLE jobs ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN limit_key TEXT;
CREATE INDEX IF NOT EXISTS jobs_limit_running ON jobs(queue, limit_key) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS jobs_parked ON jobs(queue, limit_key, priority DESC, id)
    WHERE state = 'queued' AND parked = 1;
CREATE TABLE IF NOT EXISTS limit_starts (
    queue TEXT NOT NULL,
    key TEXT NOT NULL,
    at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS limit_starts_window ON limit_starts(queue, key, at);
