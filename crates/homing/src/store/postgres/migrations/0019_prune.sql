-- The pruner (docs/pruner.md) finds workflows older than the retention by their creation time;
-- without this index each batch read every workflow. Finished jobs it finds through
-- homing_jobs_finished (0002). The same change as the SQLite store's 0019_prune.sql.
CREATE INDEX IF NOT EXISTS homing_workflows_created ON homing_workflows (created_at);
