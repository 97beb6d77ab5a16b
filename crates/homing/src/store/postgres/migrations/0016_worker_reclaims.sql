-- Version 16: the worker view (docs/workers.md). `ended_at` is when a worker was declared lost or
-- stopped (NULL while live, and for rows ended before this version); `homing_worker_reclaims`
-- lists the jobs the rescuer reclaimed from a lost worker, written in the reclaim's own
-- transaction and pruned with the worker's row. One row per (worker, job, epoch): a repeated
-- reclaim of the same run writes nothing new.
ALTER TABLE homing_workers ADD COLUMN ended_at bigint;
CREATE TABLE homing_worker_reclaims (
    worker text NOT NULL,
    job uuid NOT NULL,
    epoch bigint NOT NULL,
    outcome text NOT NULL,
    at bigint NOT NULL,
    PRIMARY KEY (worker, job, epoch)
);
CREATE INDEX homing_worker_reclaims_at ON homing_worker_reclaims (at);
