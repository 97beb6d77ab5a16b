-- The jobs, workers and the embedded broker's messages and heartbeats.
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    args TEXT NOT NULL,
    result TEXT,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    crashes INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL DEFAULT 0,
    max_retries INTEGER,
    max_crashes INTEGER NOT NULL,
    retry_policy TEXT,
    time_limit_ms INTEGER,
    idempotency_key TEXT UNIQUE,
    progress TEXT,
    worker TEXT,
    created_at INTEGER NOT NULL,
    scheduled_at INTEGER,
    started_at INTEGER,
    finished_at INTEGER,
    updated_at INTEGER NOT NULL,
    dispatched INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    on_success TEXT,
    on_failure TEXT
);
CREATE INDEX IF NOT EXISTS jobs_state_queue ON jobs(state, queue);
CREATE INDEX IF NOT EXISTS jobs_due ON jobs(scheduled_at) WHERE state = 'scheduled';
CREATE INDEX IF NOT EXISTS jobs_outbox ON jobs(updated_at) WHERE state = 'queued' AND dispatched = 0;
CREATE INDEX IF NOT EXISTS jobs_running ON jobs(worker) WHERE state = 'running';

CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY,
    info TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    last_seen INTEGER NOT NULL,
    status TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (name TEXT PRIMARY KEY);

CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    payload TEXT NOT NULL,
    consumer TEXT,
    reserved_at INTEGER,
    generation INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS messages_ready ON messages(queue, id) WHERE consumer IS NULL;
CREATE INDEX IF NOT EXISTS messages_owned ON messages(consumer) WHERE consumer IS NOT NULL;
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    payload TEXT NOT NULL,
    reason TEXT NOT NULL,
    at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS heartbeats (
    worker TEXT PRIMARY KEY,
    expires_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
