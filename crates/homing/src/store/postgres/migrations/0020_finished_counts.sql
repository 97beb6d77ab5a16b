-- "Finished in the last hour / minute" (GET /v1/queues, the dashboard's overview) counts jobs by
-- queue and state over a finish-time range; with queue and state in the index it can answer
-- from the index (an index-only scan where the pages are all-visible) instead of a heap fetch
-- per job. The pruner and the rollups use its first column as before. The same change as the
-- SQLite store's 0020_finished_counts.sql.
DROP INDEX IF EXISTS homing_jobs_finished;
CREATE INDEX homing_jobs_finished ON homing_jobs (finished_at, queue, state) WHERE finished_at IS NOT NULL;
