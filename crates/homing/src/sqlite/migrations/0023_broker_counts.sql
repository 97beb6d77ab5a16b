-- Version 23: the embedded broker's ready and dead-lettered messages per queue, kept by triggers
-- as the store's job counts are (version 17). Counting the ready messages read one index entry
-- per waiting message, 62 ms at a backlog of a million, on every call of the queue list; now it
-- reads a row per queue. The triggers run inside the statement that adds, reserves, releases or
-- removes a message, so every path keeps the counts in the same transaction. Reserved messages
-- are not kept: there are at most as many as the workers' slots (and those of workers not yet
-- presumed dead), so counting them is cheap, and leaving them out keeps the acknowledgement of
-- a finished job (a reserved message deleted) free of any count write.
CREATE TABLE IF NOT EXISTS broker_counts (
    queue TEXT NOT NULL,
    kind TEXT NOT NULL, -- 'ready' or 'dead'
    n INTEGER NOT NULL,
    PRIMARY KEY (queue, kind)
) WITHOUT ROWID;

INSERT INTO broker_counts (queue, kind, n)
    SELECT queue, 'ready', count(*) FROM messages WHERE consumer IS NULL GROUP BY queue
    ON CONFLICT (queue, kind) DO UPDATE SET n = excluded.n;
INSERT INTO broker_counts (queue, kind, n)
    SELECT queue, 'dead', count(*) FROM dead_letters WHERE true GROUP BY queue
    ON CONFLICT (queue, kind) DO UPDATE SET n = excluded.n;

CREATE TRIGGER IF NOT EXISTS messages_ready_insert AFTER INSERT ON messages
    WHEN NEW.consumer IS NULL
BEGIN
    INSERT INTO broker_counts (queue, kind, n) VALUES (NEW.queue, 'ready', 1)
        ON CONFLICT (queue, kind) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER IF NOT EXISTS messages_ready_delete AFTER DELETE ON messages
    WHEN OLD.consumer IS NULL
BEGIN
    UPDATE broker_counts SET n = n - 1 WHERE queue = OLD.queue AND kind = 'ready';
END;

-- Reserved, or moved away from a queue while ready.
CREATE TRIGGER IF NOT EXISTS messages_ready_leave AFTER UPDATE OF consumer, queue ON messages
    WHEN OLD.consumer IS NULL AND (NEW.consumer IS NOT NULL OR OLD.queue IS NOT NEW.queue)
BEGIN
    UPDATE broker_counts SET n = n - 1 WHERE queue = OLD.queue AND kind = 'ready';
END;

-- Released (requeued), or moved into a queue while ready.
CREATE TRIGGER IF NOT EXISTS messages_ready_enter AFTER UPDATE OF consumer, queue ON messages
    WHEN NEW.consumer IS NULL AND (OLD.consumer IS NOT NULL OR OLD.queue IS NOT NEW.queue)
BEGIN
    INSERT INTO broker_counts (queue, kind, n) VALUES (NEW.queue, 'ready', 1)
        ON CONFLICT (queue, kind) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER IF NOT EXISTS dead_letters_count_insert AFTER INSERT ON dead_letters
BEGIN
    INSERT INTO broker_counts (queue, kind, n) VALUES (NEW.queue, 'dead', 1)
        ON CONFLICT (queue, kind) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER IF NOT EXISTS dead_letters_count_delete AFTER DELETE ON dead_letters
BEGIN
    UPDATE broker_counts SET n = n - 1 WHERE queue = OLD.queue AND kind = 'dead';
END;
