-- Version 25: the runs a worker had when it was first presumed dead (`presumed_dead_at` set,
-- Store::presume_lost, in the same transaction). Only these count a crash when reclaimed; any
-- other run of the worker began after it was presumed dead. Kept while the worker's row is;
-- the pruner deletes the rows of purged workers.
CREATE TABLE homing_worker_presumed_runs (
    worker text NOT NULL,
    job uuid NOT NULL,
    epoch bigint NOT NULL,
    PRIMARY KEY (worker, job, epoch)
);
