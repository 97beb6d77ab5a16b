-- Priorities, pause and unique jobs (docs/limits.md). The same change as the PostgreSQL store's
-- 0006_limits.sql, plus the embedded broker's message priority.
--
-- jobs.priority: higher starts first within a queue; kept across reclaims and requeues.
-- jobs.unique_key: for a job enqueued with `unique_for`, a hash of (task, queue, args); the insert
--   looks up equal jobs by it and then compares task, queue and args exactly.
-- queues.paused: no start is made from a paused queue; its jobs stay queued, undispatched.
-- messages.priority: the embedded broker reserves the highest priority first, FIFO within one.
ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN unique_key TEXT;
CREATE INDEX IF NOT EXISTS jobs_unique ON jobs(unique_key) WHERE unique_key IS NOT NULL;
ALTER TABLE queues ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
DROP INDEX IF EXISTS messages_ready;
CREATE INDEX IF NOT EXISTS messages_ready ON messages(queue, priority DESC, id) WHERE consumer IS NULL;
