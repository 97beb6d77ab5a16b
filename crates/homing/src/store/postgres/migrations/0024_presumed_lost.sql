-- Version 24: `presumed_dead_at` is when a rescuer first found the worker without a
-- heartbeat (NULL until then), written once. Not the API's `lost_at`, which is when the worker
-- was declared lost. (Version 25 records, with it, the runs that then count a crash.)
ALTER TABLE homing_workers ADD COLUMN presumed_dead_at bigint;
