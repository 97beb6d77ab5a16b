-- Version 10: the PostgreSQL store's `homing_enqueue` checks the args' depth and takes a
-- priority (its 0010_enqueue_checks.sql). SQLite has no such function; this version only
-- keeps both stores' numbering in step.
SELECT 1;
