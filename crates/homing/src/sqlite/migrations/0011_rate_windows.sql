-- Rate limits counted in fixed windows (docs/limits.md, "Rate windows"). The same change as the
-- PostgreSQL store's 0011_rate_windows.sql.
--
-- limit_windows: one counter per rate-limited (queue, key): the start of the window it counts
--   (a multiple of the rate's period since the Unix epoch, in µs) and the starts granted in it.
--   A start reads and bumps it in its own transaction; a new window starts the count again.
--   It replaces limit_starts (a row per start, counted over a sliding window at every start).
--
-- The log's rows become counters: for each (queue, key), the starts logged in the window of its
-- latest start, so an upgrade admits no more in the current window than the rate allows.
CREATE TABLE IF NOT EXISTS limit_windows (
    queue TEXT NOT NULL,
    key TEXT NOT NULL,
    window_start INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (queue, key)
) WITHOUT ROWID;
INSERT INTO limit_windows (queue, key, window_start, count)
SELECT s.queue, s.key, l.w, COUNT(*)
FROM limit_starts s
JOIN (SELECT s2.queue, s2.key, (MAX(s2.at) / q.rate_period_us) * q.rate_period_us AS w
      FROM limit_starts s2 JOIN queues q ON q.name = s2.queue
      WHERE q.rate_count IS NOT NULL AND q.rate_period_us > 0
      GROUP BY s2.queue, s2.key) l ON l.queue = s.queue AND l.key = s.key
WHERE s.at >= l.w
GROUP BY s.queue, s.key, l.w;
DROP TABLE IF EXISTS limit_starts;
