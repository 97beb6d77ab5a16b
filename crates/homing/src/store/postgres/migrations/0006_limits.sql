-- Version 6: priorities, pause and unique jobs (docs/limits.md). The same change as the SQLite
-- store's 0006_limits.sql.
--
-- priority: higher starts first within a queue; kept across reclaims and requeues.
-- unique_key: for a job enqueued with `unique_for`, a hash of (task, queue, args); the insert
--   looks up equal jobs by it (under an advisory lock on the hash) and compares them exactly.
-- homing_queues.paused: no start is made from a paused queue; its jobs stay queued, undispatched.

ALTER TABLE homing_jobs ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;
ALTER TABLE homing_jobs ADD COLUMN unique_key TEXT;
CREATE INDEX homing_jobs_unique ON homing_jobs (unique_key) WHERE unique_key IS NOT NULL;
ALTER TABLE homing_queues ADD COLUMN paused BOOLEAN NOT NULL DEFAULT false;
