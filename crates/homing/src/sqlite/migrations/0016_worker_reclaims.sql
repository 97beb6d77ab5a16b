-- Version 16: the worker view (docs/workers.md). `ended_at` is when a worker was declared lost or
-- stopped (NULL while live, and for rows ended before this version); `worker_reclaims` lists
-- the jobs the rescuer reclaimed from a lost worker, written in the reclaim's own transaction
-- and pruned with the worker's row. One row per (worker, job, epoch): a repeated reclaim of the
-- same run writes nothing new.
ALTER TABLE workers ADD COLUMN ended_at INTEGER;
CREATE TABLE IF NOT EXISTS worker_reclaims (
    worker TEXT NOT NULL,
    job TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    at INTEGER NOT NULL,
    PRIMARY KEY (worker, job, epoch)
);
CREATE INDEX IF NOT EXISTS worker_reclaims_at ON worker_reclaims(at);
