-- homing's job store on PostgreSQL, version 1.
--
-- Tables carry a `homing_` prefix so the store can share a database with the application.
-- Timestamps are BIGINT microseconds since the Unix epoch, exactly as the SQLite store keeps them,
-- so due dates and fencing compare the same way on both. JSON is kept as TEXT, not JSONB: JSONB
-- refuses the escaped NUL character (\u0000) that serde_json accepts, and a job's input must come
-- back exactly as it went in.

CREATE TABLE homing_jobs (
    id               UUID PRIMARY KEY,
    task             TEXT NOT NULL,
    queue            TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN
                         ('scheduled', 'queued', 'running', 'succeeded', 'failed', 'dead', 'cancelled')),
    args             TEXT NOT NULL,
    result           TEXT,
    error            TEXT,
    attempts         BIGINT NOT NULL DEFAULT 0,
    crashes          BIGINT NOT NULL DEFAULT 0,
    epoch            BIGINT NOT NULL DEFAULT 0,
    max_retries      BIGINT,
    max_crashes      BIGINT NOT NULL,
    retry_policy     TEXT,
    time_limit_ms    BIGINT,
    idempotency_key  TEXT UNIQUE,
    progress         TEXT,
    worker           TEXT,
    created_at       BIGINT NOT NULL,
    scheduled_at     BIGINT,
    started_at       BIGINT,
    finished_at      BIGINT,
    updated_at       BIGINT NOT NULL,
    -- The outbox flag: false while the job's message may not be in the broker yet.
    dispatched       BOOLEAN NOT NULL DEFAULT false,
    cancel_requested BOOLEAN NOT NULL DEFAULT false,
    on_success       TEXT,
    on_failure       TEXT
);

CREATE INDEX homing_jobs_state_queue ON homing_jobs (state, queue);
CREATE INDEX homing_jobs_queue_id ON homing_jobs (queue, id);
-- The scheduler's claim, the reconciler's outbox and the rescuer's scan each read one of these.
CREATE INDEX homing_jobs_due ON homing_jobs (scheduled_at) WHERE state = 'scheduled';
CREATE INDEX homing_jobs_outbox ON homing_jobs (updated_at) WHERE state = 'queued' AND NOT dispatched;
CREATE INDEX homing_jobs_running ON homing_jobs (started_at) WHERE state = 'running';
CREATE INDEX homing_jobs_running_worker ON homing_jobs (worker) WHERE state = 'running';

CREATE TABLE homing_workers (
    id         TEXT PRIMARY KEY,
    info       TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    last_seen  BIGINT NOT NULL,
    status     TEXT NOT NULL
);
CREATE INDEX homing_workers_last_seen ON homing_workers (last_seen);

CREATE TABLE homing_tasks (name TEXT PRIMARY KEY);
