-- Version 26: a worker's round no longer makes SQLite keep a statement journal for its job
-- updates and acknowledgements (docs/counts.md, "No statement journal"). A statement that may
-- abort after writing (one whose own constraint checks, or whose triggers' statements, may
-- abort) and may write several rows makes SQLite copy aside every page it is about to change
-- that the transaction changed already, to be able to undo that statement alone: about 5 % of
-- an embedded worker's CPU at the defaults (BENCHMARKS.md). homing never undoes a statement
-- alone; any error rolls the whole transaction back. The counts' upserts (versions 17 and 23)
-- were coded as statements that may abort, and a trigger's statements are coded into every
-- statement that can fire it.
--
-- So the counting statements a round fires are plain updates that say OR FAIL (they cannot
-- abort: `n` is never NULL), and the rows they update are made ahead: when a queue's first
-- count row is made (by an upsert, which stays where a queue may be new: a job added or moved
-- in, a message added or moved in, a dead letter), a trigger on the count table makes its
-- others at 0. A queue then has all its rows or none, and a queue with jobs or messages has
-- them all. The rows of the queues that have some already are made here. Count rows must never
-- be deleted by hand (an update of a missing row counts nothing), and the seed assumes
-- recursive triggers off (SQLite's default, which homing keeps).

INSERT INTO queue_counts (queue, state, n)
    SELECT q.queue, s.state, 0
    FROM (SELECT DISTINCT queue FROM queue_counts) AS q,
         (SELECT 'scheduled' AS state UNION ALL SELECT 'waiting' UNION ALL SELECT 'queued'
          UNION ALL SELECT 'running' UNION ALL SELECT 'succeeded' UNION ALL SELECT 'failed'
          UNION ALL SELECT 'dead' UNION ALL SELECT 'cancelled') AS s
    WHERE true
    ON CONFLICT (queue, state) DO NOTHING;

-- A queue whose messages are all reserved may have no broker row yet (version 23 counted only
-- queues with ready messages or dead letters); its reserved messages, few, are found through
-- their index.
INSERT INTO broker_counts (queue, kind, n)
    SELECT q.queue, k.kind, 0
    FROM (SELECT queue FROM broker_counts
          UNION SELECT queue FROM messages INDEXED BY messages_owned WHERE consumer IS NOT NULL) AS q,
         (SELECT 'ready' AS kind UNION ALL SELECT 'dead') AS k
    WHERE true
    ON CONFLICT (queue, kind) DO NOTHING;

-- A queue's first row brings the others (only those missing: nothing is ever overwritten).
DROP TRIGGER IF EXISTS queue_counts_seed;
CREATE TRIGGER queue_counts_seed AFTER INSERT ON queue_counts
BEGIN
    INSERT OR IGNORE INTO queue_counts (queue, state, n)
        SELECT NEW.queue, s.state, 0
        FROM (SELECT 'scheduled' AS state UNION ALL SELECT 'waiting' UNION ALL SELECT 'queued'
              UNION ALL SELECT 'running' UNION ALL SELECT 'succeeded' UNION ALL SELECT 'failed'
              UNION ALL SELECT 'dead' UNION ALL SELECT 'cancelled') AS s
        WHERE NOT EXISTS (SELECT 1 FROM queue_counts c WHERE c.queue = NEW.queue AND c.state = s.state);
END;

DROP TRIGGER IF EXISTS broker_counts_seed;
CREATE TRIGGER broker_counts_seed AFTER INSERT ON broker_counts
BEGIN
    INSERT OR IGNORE INTO broker_counts (queue, kind, n)
        SELECT NEW.queue, k.kind, 0 FROM (SELECT 'ready' AS kind UNION ALL SELECT 'dead') AS k
        WHERE NOT EXISTS (SELECT 1 FROM broker_counts c WHERE c.queue = NEW.queue AND c.kind = k.kind);
END;

DROP TRIGGER IF EXISTS jobs_count_delete;
CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs
BEGIN
    UPDATE OR FAIL queue_counts SET n = n - 1 WHERE queue = OLD.queue AND state = OLD.state;
END;

-- A state change within a queue (every start and outcome): both rows exist.
DROP TRIGGER IF EXISTS jobs_count_update;
CREATE TRIGGER jobs_count_update AFTER UPDATE OF state ON jobs
    WHEN OLD.state IS NOT NEW.state AND OLD.queue IS NEW.queue
BEGIN
    UPDATE OR FAIL queue_counts SET n = n - 1 WHERE queue = OLD.queue AND state = OLD.state;
    UPDATE OR FAIL queue_counts SET n = n + 1 WHERE queue = NEW.queue AND state = NEW.state;
END;

-- A job moved to another queue (homing never does; a hand-written UPDATE may): the new queue
-- may have no rows yet. Only statements that set `queue` carry this trigger.
DROP TRIGGER IF EXISTS jobs_count_move;
CREATE TRIGGER jobs_count_move AFTER UPDATE OF queue ON jobs
    WHEN OLD.queue IS NOT NEW.queue
BEGIN
    UPDATE OR FAIL queue_counts SET n = n - 1 WHERE queue = OLD.queue AND state = OLD.state;
    INSERT INTO queue_counts (queue, state, n) VALUES (NEW.queue, NEW.state, 1)
        ON CONFLICT (queue, state) DO UPDATE SET n = n + 1;
END;

DROP TRIGGER IF EXISTS messages_ready_delete;
CREATE TRIGGER messages_ready_delete AFTER DELETE ON messages
    WHEN OLD.consumer IS NULL
BEGIN
    UPDATE OR FAIL broker_counts SET n = n - 1 WHERE queue = OLD.queue AND kind = 'ready';
END;

-- Reserved, or moved away from a queue while ready.
DROP TRIGGER IF EXISTS messages_ready_leave;
CREATE TRIGGER messages_ready_leave AFTER UPDATE OF consumer, queue ON messages
    WHEN OLD.consumer IS NULL AND (NEW.consumer IS NOT NULL OR OLD.queue IS NOT NEW.queue)
BEGIN
    UPDATE OR FAIL broker_counts SET n = n - 1 WHERE queue = OLD.queue AND kind = 'ready';
END;

-- Every message added, ready or not, makes its queue's rows (an upsert that adds 0 for a
-- reserved one), so a message released later finds them.
DROP TRIGGER IF EXISTS messages_ready_insert;
CREATE TRIGGER messages_ready_insert AFTER INSERT ON messages
BEGIN
    INSERT INTO broker_counts (queue, kind, n) VALUES (NEW.queue, 'ready', NEW.consumer IS NULL)
        ON CONFLICT (queue, kind) DO UPDATE SET n = n + excluded.n;
END;

-- Released (requeued) within its queue: the queue's rows exist, made when the message was
-- added or moved in.
DROP TRIGGER IF EXISTS messages_ready_enter;
CREATE TRIGGER messages_ready_enter AFTER UPDATE OF consumer ON messages
    WHEN NEW.consumer IS NULL AND OLD.consumer IS NOT NULL AND OLD.queue IS NEW.queue
BEGIN
    UPDATE OR FAIL broker_counts SET n = n + 1 WHERE queue = NEW.queue AND kind = 'ready';
END;

-- Moved into another queue (homing never does), ready or not: the queue may have no rows yet.
DROP TRIGGER IF EXISTS messages_ready_move;
CREATE TRIGGER messages_ready_move AFTER UPDATE OF queue ON messages
    WHEN OLD.queue IS NOT NEW.queue
BEGIN
    INSERT INTO broker_counts (queue, kind, n) VALUES (NEW.queue, 'ready', NEW.consumer IS NULL)
        ON CONFLICT (queue, kind) DO UPDATE SET n = n + excluded.n;
END;

DROP TRIGGER IF EXISTS dead_letters_count_delete;
CREATE TRIGGER dead_letters_count_delete AFTER DELETE ON dead_letters
BEGIN
    UPDATE OR FAIL broker_counts SET n = n - 1 WHERE queue = OLD.queue AND kind = 'dead';
END;
