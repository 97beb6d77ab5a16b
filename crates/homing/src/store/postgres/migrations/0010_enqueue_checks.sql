-- Version 10: `homing_enqueue` checks what the door checks (docs/workflows.md).
--
-- The function of version 7 refused bad names, sizes and ranges but not the args' nesting
-- depth: a value deeper than validate::MAX_DEPTH (64) was accepted and only made `dead` at its
-- start. It is now refused in the caller's transaction with SQLSTATE 22023, like every other
-- bad argument. The function also takes `priority` (-1000 to 1000, default 0; version 6's
-- column), so its signature changes: the old one is dropped and the new one created in this
-- migration's transaction, and calls written for version 7 (positional or named) still work.
-- The SQLite store's 0010 is empty: it has no SQL functions.

DROP FUNCTION IF EXISTS homing_enqueue(TEXT, JSONB, TEXT, DOUBLE PRECISION, TEXT);

CREATE FUNCTION homing_enqueue(
    task            TEXT,
    args            JSONB DEFAULT '{}'::jsonb,
    queue           TEXT DEFAULT 'default',
    countdown       DOUBLE PRECISION DEFAULT NULL,
    idempotency_key TEXT DEFAULT NULL,
    priority        INTEGER DEFAULT 0
) RETURNS UUID LANGUAGE plpgsql AS $fn$
-- The arguments are named like columns (that is what callers write); unqualified names are
-- columns, and the arguments are always written homing_enqueue.<name>.
#variable_conflict use_column
DECLARE
    v_now      BIGINT := floor(extract(epoch FROM clock_timestamp()) * 1000000)::BIGINT;
    v_args     TEXT;
    v_id       UUID;
    v_bytes    BYTEA;
    v_state    TEXT := 'queued';
    v_at       BIGINT;
    v_existing UUID;
BEGIN
    IF homing_enqueue.task IS NULL OR homing_enqueue.task !~ '^[A-Za-z0-9_.:-]{1,128}$' THEN
        RAISE EXCEPTION 'homing_enqueue: invalid task name %: use 1-128 characters of letters, digits, ''.'', ''_'', ''-'', '':''',
            coalesce(quote_literal(left(homing_enqueue.task, 130)), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF homing_enqueue.task IN ('builtin.webhook', 'celery.result', 'celery.malformed') THEN
        RAISE EXCEPTION 'homing_enqueue: task ''%'' is internal to homing: only homing itself enqueues it',
            homing_enqueue.task USING ERRCODE = '22023';
    END IF;
    IF homing_enqueue.queue IS NULL OR homing_enqueue.queue !~ '^[A-Za-z0-9_.:-]{1,128}$' THEN
        RAISE EXCEPTION 'homing_enqueue: invalid queue name %: use 1-128 characters of letters, digits, ''.'', ''_'', ''-'', '':''',
            coalesce(quote_literal(left(homing_enqueue.queue, 130)), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF left(homing_enqueue.queue, 7) = 'homing.' THEN
        RAISE EXCEPTION 'homing_enqueue: queue ''%'' is internal to homing (queues named homing.… are reserved)',
            homing_enqueue.queue USING ERRCODE = '22023';
    END IF;
    -- The door's depth rule (validate::MAX_DEPTH = 64; arrays and objects count a level each):
    -- a container at nesting level 64 is the 65th level. Refused here rather than at the start.
    IF jsonb_path_exists(coalesce(homing_enqueue.args, '{}'::jsonb),
            'strict $.**{64} ? (@.type() == "array" || @.type() == "object")') THEN
        RAISE EXCEPTION 'homing_enqueue: args is nested deeper than 64 levels'
            USING ERRCODE = '22023';
    END IF;
    IF homing_enqueue.priority IS NULL OR homing_enqueue.priority NOT BETWEEN -1000 AND 1000 THEN
        RAISE EXCEPTION 'homing_enqueue: priority must be from -1000 to 1000, not %',
            coalesce(homing_enqueue.priority::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    v_args := coalesce(homing_enqueue.args, '{}'::jsonb)::text;
    IF octet_length(v_args) > 1048576 THEN
        RAISE EXCEPTION 'homing_enqueue: args is % bytes serialised; at most 1048576', octet_length(v_args)
            USING ERRCODE = '22023';
    END IF;
    IF homing_enqueue.countdown IS NOT NULL AND NOT (homing_enqueue.countdown >= 0
            AND homing_enqueue.countdown <= 366 * 86400) THEN
        RAISE EXCEPTION 'homing_enqueue: countdown must be 0 to 31622400 seconds (366 days), got %',
            homing_enqueue.countdown USING ERRCODE = '22023';
    END IF;
    IF homing_enqueue.idempotency_key IS NOT NULL THEN
        IF octet_length(homing_enqueue.idempotency_key) NOT BETWEEN 1 AND 512
                OR homing_enqueue.idempotency_key ~ '[[:cntrl:]]' THEN
            RAISE EXCEPTION 'homing_enqueue: idempotency_key must be 1-512 bytes without control characters'
                USING ERRCODE = '22023';
        END IF;
        SELECT j.id INTO v_existing FROM homing_jobs j
            WHERE j.idempotency_key = homing_enqueue.idempotency_key;
        IF FOUND THEN
            RETURN v_existing;
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM homing_queues WHERE name = homing_enqueue.queue) THEN
        PERFORM pg_advisory_xact_lock(x'717565756573'::BIGINT);
        IF (SELECT count(*) FROM homing_queues) >= 1000
                AND NOT EXISTS (SELECT 1 FROM homing_queues WHERE name = homing_enqueue.queue) THEN
            RAISE EXCEPTION 'homing_enqueue: queue ''%'' would exceed the bound of 1000 distinct queue names',
                homing_enqueue.queue USING ERRCODE = '22023';
        END IF;
        INSERT INTO homing_queues (name, created_at) VALUES (homing_enqueue.queue, v_now)
            ON CONFLICT (name) DO NOTHING;
    END IF;
    -- A UUID v7 like homing's own ids (time-ordered): the 48-bit millisecond time, then random
    -- bits with the version (7) and variant set.
    v_bytes := overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send(v_now / 1000) FROM 3) FROM 1 FOR 6);
    v_bytes := set_byte(v_bytes, 6, (get_byte(v_bytes, 6) & 15) | 112);
    v_id := encode(v_bytes, 'hex')::UUID;
    IF coalesce(homing_enqueue.countdown, 0) > 0 THEN
        v_state := 'scheduled';
        v_at := v_now + floor(homing_enqueue.countdown * 1000000)::BIGINT;
    END IF;
    INSERT INTO homing_jobs (id, task, queue, state, args, max_crashes, idempotency_key,
                             created_at, scheduled_at, updated_at, priority)
    VALUES (v_id, homing_enqueue.task, homing_enqueue.queue, v_state, v_args, 3,
            homing_enqueue.idempotency_key, v_now, v_at, v_now, homing_enqueue.priority)
    ON CONFLICT (idempotency_key) DO NOTHING;
    IF NOT FOUND THEN
        -- The same key committed by a concurrent transaction meanwhile.
        SELECT j.id INTO v_existing FROM homing_jobs j
            WHERE j.idempotency_key = homing_enqueue.idempotency_key;
        RETURN v_existing;
    END IF;
    PERFORM pg_notify('homing_jobs', '');
    RETURN v_id;
END
$fn$;
