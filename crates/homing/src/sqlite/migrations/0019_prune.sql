-- The pruner (docs/pruner.md) finds workflows older than the retention by their creation time;
-- without this index each batch read every workflow. Finished jobs it finds through
-- jobs_finished (0002), which holds only jobs with a finish time. The same change as the
-- PostgreSQL store's 0019_prune.sql.
CREATE INDEX IF NOT EXISTS workflows_created ON workflows(created_at);
