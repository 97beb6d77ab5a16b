-- Version 14: the W3C trace context a job's runs continue (docs/traces.md). Nullable: a job
-- enqueued without one, or before this version, starts no trace of its own until it runs.
ALTER TABLE homing_jobs ADD COLUMN traceparent text;
