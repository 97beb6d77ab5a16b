-- Version 18: bulk actions (docs/bulk.md). A bulk action always names a state and often a task
-- or a queue, and walks its matches newest first by id in keyset-paged steps. With only
-- (state, id) and (task, id) to choose from, a step of `state=failed&task=t` reads every failed
-- job of other tasks between two matches; these indexes lead with both equalities and end in
-- the id, so each step reads only its own rows. (state, queue, id) replaces (state, queue):
-- every query that used the old one can use the new one.
CREATE INDEX IF NOT EXISTS homing_jobs_state_task_id ON homing_jobs (state, task, id);
CREATE INDEX IF NOT EXISTS homing_jobs_state_queue_id ON homing_jobs (state, queue, id);
DROP INDEX IF EXISTS homing_jobs_state_queue;
