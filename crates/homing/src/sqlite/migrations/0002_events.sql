-- The events outbox (alerts and webhooks), per-job callback URLs, and an index for
-- "finished in the last hour".
ALTER TABLE jobs ADD COLUMN callback_url TEXT;
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs(finished_at) WHERE finished_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    job_id TEXT,
    worker TEXT,
    data TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    dispatched_at INTEGER
);
CREATE INDEX IF NOT EXISTS events_pending ON events(id) WHERE dispatched_at IS NULL;
