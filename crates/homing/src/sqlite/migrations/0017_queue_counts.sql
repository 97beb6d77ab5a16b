-- Version 17: each queue's job count per state, kept by triggers (docs/counts.md), so the
-- queue list, the metrics, the depth samples and bulk previews read a few rows instead of
-- counting the jobs table. The triggers run inside the statement that changes a job, so every
-- path (enqueue, start, complete, retry, cancel, bulk, prune, reclaim, a hand-written UPDATE)
-- keeps the counts in the same transaction, and none can forget to.
CREATE TABLE IF NOT EXISTS queue_counts (
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (queue, state)
) WITHOUT ROWID;

INSERT INTO queue_counts (queue, state, n)
    SELECT queue, state, count(*) FROM jobs WHERE true GROUP BY queue, state
    ON CONFLICT (queue, state) DO UPDATE SET n = excluded.n;

CREATE TRIGGER IF NOT EXISTS jobs_count_insert AFTER INSERT ON jobs
BEGIN
    INSERT INTO queue_counts (queue, state, n) VALUES (NEW.queue, NEW.state, 1)
        ON CONFLICT (queue, state) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER IF NOT EXISTS jobs_count_delete AFTER DELETE ON jobs
BEGIN
    UPDATE queue_counts SET n = n - 1 WHERE queue = OLD.queue AND state = OLD.state;
END;

CREATE TRIGGER IF NOT EXISTS jobs_count_update AFTER UPDATE OF state, queue ON jobs
    WHEN OLD.state IS NOT NEW.state OR OLD.queue IS NOT NEW.queue
BEGIN
    UPDATE queue_counts SET n = n - 1 WHERE queue = OLD.queue AND state = OLD.state;
    INSERT INTO queue_counts (queue, state, n) VALUES (NEW.queue, NEW.state, 1)
        ON CONFLICT (queue, state) DO UPDATE SET n = n + 1;
END;
