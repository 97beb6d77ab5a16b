-- Version 9: the audit log (docs/access.md): one row per operator action through the HTTP API —
-- who (the token's name and role, never the token), what (the route, the path and query it was
-- called with, the answer's status, and for bulk actions how many jobs it touched), and when.
-- Pruned with the history (`purge`), by `at`. The same change as the SQLite store's
-- 0009_audit.sql.

CREATE TABLE homing_audit (
    id BIGSERIAL PRIMARY KEY,
    at BIGINT NOT NULL,
    actor TEXT NOT NULL,
    role TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    status INTEGER NOT NULL,
    count BIGINT
);
CREATE INDEX homing_audit_at ON homing_audit (at);
