-- Version 12: the charts' rollups (docs/charts.md). One row per (span, start, queue): `span` is
-- 60 (a minute) or 3600 (an hour) seconds, `at` the period's start in microseconds. Counts and
-- latency histograms are recomputed from the jobs of a period and replaced as a whole, so a
-- repeated or concurrent rollup writes the same rows; depth is a sample, kept as the period's
-- maximum. `stats_cursor` holds the end of the closed minutes rolled up so far. Pruned with
-- the history, by `at`. The same change as the PostgreSQL store's 0012_stats.sql.
CREATE TABLE IF NOT EXISTS stats_counts (
    span INTEGER NOT NULL,
    at INTEGER NOT NULL,
    queue TEXT NOT NULL,
    succeeded INTEGER NOT NULL,
    failed INTEGER NOT NULL,
    dead INTEGER NOT NULL,
    cancelled INTEGER NOT NULL,
    retried INTEGER NOT NULL,
    PRIMARY KEY (span, at, queue)
);
CREATE TABLE IF NOT EXISTS stats_latency (
    span INTEGER NOT NULL,
    at INTEGER NOT NULL,
    queue TEXT NOT NULL,
    kind TEXT NOT NULL,
    bucket INTEGER NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (span, at, queue, kind, bucket)
);
CREATE TABLE IF NOT EXISTS stats_depth (
    span INTEGER NOT NULL,
    at INTEGER NOT NULL,
    queue TEXT NOT NULL,
    depth INTEGER NOT NULL,
    PRIMARY KEY (span, at, queue)
);
CREATE TABLE IF NOT EXISTS stats_cursor (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    rolled_to INTEGER NOT NULL
);
-- The pruner deletes by `at` alone, whatever the span.
CREATE INDEX IF NOT EXISTS stats_counts_at ON stats_counts (at);
CREATE INDEX IF NOT EXISTS stats_latency_at ON stats_latency (at);
CREATE INDEX IF NOT EXISTS stats_depth_at ON stats_depth (at);
