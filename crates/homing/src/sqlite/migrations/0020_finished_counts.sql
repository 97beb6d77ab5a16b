-- "Finished in the last hour / minute" (GET /v1/queues, the dashboard's overview) counts jobs by
-- queue and state over a finish-time range. With jobs_finished holding only the finish time,
-- each job of the range cost a table lookup for its queue and state: seconds at a busy hour of a
-- million jobs. Widened to (finished_at, queue, state), the count reads the index alone; the
-- pruner and the rollups walk it by its first column as before. Same name, so the pruner's
-- INDEXED BY still names it. The same change as the PostgreSQL store's 0020_finished_counts.sql.
DROP INDEX IF EXISTS jobs_finished;
CREATE INDEX jobs_finished ON jobs(finished_at, queue, state) WHERE finished_at IS NOT NULL;
