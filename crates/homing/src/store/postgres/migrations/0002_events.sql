-- Version 2: the events outbox (alerts and webhooks), per-job callback URLs, and an index for the
-- dashboard's "finished in the last hour". The same schema change as the SQLite store's version 2.
--
-- Adding a nullable column without a default only changes the catalog, so it is instant on a
-- large table. The new index is built inside the migration's transaction (CREATE INDEX
-- CONCURRENTLY cannot run in one), which holds writes to homing_jobs while it builds: on a very
-- large table, apply this migration at a quiet moment.

ALTER TABLE homing_jobs ADD COLUMN callback_url TEXT;

CREATE INDEX homing_jobs_finished ON homing_jobs (finished_at) WHERE finished_at IS NOT NULL;

-- One row per thing operators are told about, written in the same transaction as the transition
-- it reports. `dispatched_at` stays NULL until the dispatcher has fanned it out into delivery jobs.
CREATE TABLE homing_events (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind          TEXT NOT NULL,
    job_id        UUID,
    worker        TEXT,
    data          TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    dispatched_at BIGINT
);

-- The dispatcher's scan: pending events, oldest first.
CREATE INDEX homing_events_pending ON homing_events (id) WHERE dispatched_at IS NULL;
