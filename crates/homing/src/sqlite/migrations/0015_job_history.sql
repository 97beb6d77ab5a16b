-- Version 15: each job's timeline (docs/timeline.md). One row per transition, written in the
-- transition's own transaction; ordered by id within a job. Bounded per job by the store (the
-- first entry and the latest 100) and deleted with its job by the trigger below, whatever path
-- deletes the job (the pruner, a bulk delete).
CREATE TABLE job_history (
    id INTEGER PRIMARY KEY,
    job_id TEXT NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    epoch INTEGER,
    worker TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    crashes INTEGER NOT NULL DEFAULT 0,
    message TEXT,
    data TEXT
);
CREATE INDEX job_history_job ON job_history (job_id, id);
CREATE TRIGGER job_history_gone AFTER DELETE ON jobs BEGIN
    DELETE FROM job_history WHERE job_id = OLD.id;
END;
