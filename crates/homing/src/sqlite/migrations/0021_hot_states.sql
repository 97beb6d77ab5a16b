-- Version 21: the search and bulk indexes leave out the two states every job passes through.
-- `(state, id)`, `(state, task, id)` and `(state, queue, id)` held every job, so a job's enqueue
-- inserted three entries and its start and its end each moved three: measured with the whole
-- schema, about 55 % of the time SQLite spends writing a job (BENCHMARKS.md). They now hold only
-- the states a job rests in (scheduled, waiting and the four ends), and one index,
-- `(queue, id)` of the queued jobs, serves the queued state: an enqueue adds one entry and a
-- start removes it; a running job is in `jobs_running` already.
--
-- The condition is written as alternatives on purpose: SQLite uses a partial index only when the
-- query's WHERE names one of the index's terms, so `state = 'failed'` (named literally, as the
-- store's queries do) matches `… OR state = 'failed' OR …`, where it would not match
-- `state NOT IN ('queued', 'running')`.
DROP INDEX IF EXISTS jobs_state_id;
DROP INDEX IF EXISTS jobs_state_task_id;
DROP INDEX IF EXISTS jobs_state_queue_id;
CREATE INDEX jobs_state_id ON jobs(state, id) WHERE state = 'scheduled' OR state = 'waiting'
    OR state = 'succeeded' OR state = 'failed' OR state = 'dead' OR state = 'cancelled';
CREATE INDEX jobs_state_task_id ON jobs(state, task, id) WHERE state = 'scheduled'
    OR state = 'waiting' OR state = 'succeeded' OR state = 'failed' OR state = 'dead'
    OR state = 'cancelled';
CREATE INDEX jobs_state_queue_id ON jobs(state, queue, id) WHERE state = 'scheduled'
    OR state = 'waiting' OR state = 'succeeded' OR state = 'failed' OR state = 'dead'
    OR state = 'cancelled';
CREATE INDEX jobs_queued ON jobs(queue, id) WHERE state = 'queued';
