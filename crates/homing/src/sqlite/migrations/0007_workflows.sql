-- Workflows (docs/workflows.md): a workflow row, and on each step's job the workflow it belongs
-- to (`workflow_id`, indexed: every step's end reads its workflow's steps), its link (step name,
-- parents' job ids, run_on; JSON) and, once it is runnable, its parents as it sees them (JSON).
-- A step waiting on its parents is in the state `waiting` (SQLite's state column is free text).
-- The same change as the PostgreSQL store's 0007_workflows.sql.
CREATE TABLE IF NOT EXISTS workflows (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    cancelled_at INTEGER
);
ALTER TABLE jobs ADD COLUMN workflow_id TEXT;
ALTER TABLE jobs ADD COLUMN workflow TEXT;
ALTER TABLE jobs ADD COLUMN parents TEXT;
CREATE INDEX IF NOT EXISTS jobs_workflow ON jobs(workflow_id) WHERE workflow_id IS NOT NULL;
