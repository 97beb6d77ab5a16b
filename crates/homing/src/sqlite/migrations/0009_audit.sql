-- The audit log (docs/access.md): one row per operator action through the HTTP API — who
-- (the token's name and role, never the token), what (the route, the path and query it was
-- called with, the answer's status, and for bulk actions how many jobs it touched), and when.
-- Pruned with the history (`purge`), by `at`. The same change as the PostgreSQL store's
-- 0009_audit.sql.
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at INTEGER NOT NULL,
    actor TEXT NOT NULL,
    role TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    status INTEGER NOT NULL,
    count INTEGER
);
CREATE INDEX IF NOT EXISTS audit_at ON audit(at);
