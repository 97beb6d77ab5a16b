-- Version 13: job search (docs/operate.md). Searches page newest first by id (keyset paging),
-- so each equality filter gets an index ending in the id: a page of one state, queue or task
-- walks its index backwards from the cursor instead of sorting the matches.
CREATE INDEX IF NOT EXISTS jobs_state_id ON jobs(state, id);
CREATE INDEX IF NOT EXISTS jobs_queue_id ON jobs(queue, id);
CREATE INDEX IF NOT EXISTS jobs_task_id ON jobs(task, id);
