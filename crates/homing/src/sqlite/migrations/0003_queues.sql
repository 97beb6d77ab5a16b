-- One row per queue name the store has accepted (see store::queues): a new name is refused once
-- the limit is reached. Existing queues are registered, so they keep working. The same change as
-- the PostgreSQL store's 0003_queues.sql.
CREATE TABLE IF NOT EXISTS queues (
    name TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL
);
INSERT OR IGNORE INTO queues (name, created_at) SELECT queue, MIN(created_at) FROM jobs GROUP BY queue;
