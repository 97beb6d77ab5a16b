-- Version 11: rate limits counted in fixed windows (docs/limits.md, "Rate windows"). The same
-- change as the SQLite store's 0011_rate_windows.sql.
--
-- homing_limit_windows: one counter per rate-limited (queue, key): the start of the window it
--   counts (a multiple of the rate's period since the Unix epoch, in µs) and the starts granted
--   in it. A start batch bumps it under the queue's row lock, in its own transaction
--   (count += the batch's starts of that key). It replaces homing_limit_starts (a row per start).
--
-- The log's rows become counters: for each (queue, key), the starts logged in the window of its
-- latest start, so an upgrade admits no more in the current window than the rate allows.

CREATE TABLE homing_limit_windows (
    queue        TEXT NOT NULL,
    key          TEXT NOT NULL,
    window_start BIGINT NOT NULL,
    count        BIGINT NOT NULL,
    PRIMARY KEY (queue, key)
);
INSERT INTO homing_limit_windows (queue, key, window_start, count)
SELECT s.queue, s.key, l.w, COUNT(*)
FROM homing_limit_starts s
JOIN (SELECT s2.queue, s2.key, (MAX(s2.at) / q.rate_period_us) * q.rate_period_us AS w
      FROM homing_limit_starts s2 JOIN homing_queues q ON q.name = s2.queue
      WHERE q.rate_count IS NOT NULL AND q.rate_period_us > 0
      GROUP BY s2.queue, s2.key, q.rate_period_us) l ON l.queue = s.queue AND l.key = s.key
WHERE s.at >= l.w
GROUP BY s.queue, s.key, l.w;
DROP TABLE homing_limit_starts;
