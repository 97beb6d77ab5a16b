-- Version 13: job search (docs/operate.md). Searches page newest first by id (keyset paging),
-- so each equality filter gets an index ending in the id: a page of one state, queue or task
-- walks its index backwards from the cursor instead of sorting the matches.
CREATE INDEX IF NOT EXISTS homing_jobs_state_id ON homing_jobs (state, id);
CREATE INDEX IF NOT EXISTS homing_jobs_queue_id ON homing_jobs (queue, id);
CREATE INDEX IF NOT EXISTS homing_jobs_task_id ON homing_jobs (task, id);

-- The element of a job's args at `path`, as the JSON text stored (`json`, not `jsonb`, keeps
-- the text as written and accepts an escaped NUL), or NULL where there is none or the args
-- cannot be read: one damaged row must not fail every search.
CREATE OR REPLACE FUNCTION homing_json_at(doc TEXT, path TEXT[]) RETURNS TEXT
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN (doc::json #> path)::text;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;
