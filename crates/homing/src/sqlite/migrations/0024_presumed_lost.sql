-- Version 24: `presumed_dead_at` is when a rescuer first found the worker without a
-- heartbeat (NULL until then). Written once and read by every rescuer: a run the worker began
-- after it is reclaimed without counting a crash (docs/design.md, "A worker presumed dead that
-- has not noticed"). Not the API's `lost_at`, which is when the worker was declared lost.
ALTER TABLE workers ADD COLUMN presumed_dead_at INTEGER;
