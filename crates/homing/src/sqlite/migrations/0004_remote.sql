-- The remote worker protocol (docs/remote-workers.md). `completed_epoch` is the epoch of the last
-- completion committed for a job, so that any server can tell a retried completion whose answer
-- was lost (`already_applied`) from a zombie's write (`stale`), even after every server
-- restarted.
-- The same change as the PostgreSQL store's 0004_remote.sql.
ALTER TABLE jobs ADD COLUMN completed_epoch INTEGER;
