-- Version 15: each job's timeline (docs/timeline.md). One row per transition, written in the
-- transition's own transaction; ordered by id within a job. Bounded per job by the store (the
-- first entry and the latest 100) and deleted with its job by the trigger below, whatever path
-- deletes the job (the pruner, a bulk delete).
CREATE TABLE homing_job_history (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    at bigint NOT NULL,
    kind text NOT NULL,
    state text NOT NULL,
    epoch bigint,
    worker text,
    attempts integer NOT NULL DEFAULT 0,
    crashes integer NOT NULL DEFAULT 0,
    message text,
    data text
);
CREATE INDEX homing_job_history_job ON homing_job_history (job_id, id);
CREATE FUNCTION homing_job_history_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM homing_job_history WHERE job_id = OLD.id;
    RETURN OLD;
END;
$$;
CREATE TRIGGER homing_job_history_gone AFTER DELETE ON homing_jobs
    FOR EACH ROW EXECUTE FUNCTION homing_job_history_gone();
