-- Version 12: the charts' rollups (docs/charts.md). One row per (span, start, queue): `span` is
-- 60 (a minute) or 3600 (an hour) seconds, `at` the period's start in microseconds. Counts and
-- latency histograms are recomputed from the jobs of a period and replaced as a whole, so a
-- repeated or concurrent rollup writes the same rows; depth is a sample, kept as the period's
-- maximum. `homing_stats_cursor` holds the end of the closed minutes rolled up so far. Pruned with
-- the history, by `at`. The same change as the SQLite store's 0012_stats.sql.
CREATE TABLE homing_stats_counts (
    span INTEGER NOT NULL,
    at BIGINT NOT NULL,
    queue TEXT NOT NULL,
    succeeded BIGINT NOT NULL,
    failed BIGINT NOT NULL,
    dead BIGINT NOT NULL,
    cancelled BIGINT NOT NULL,
    retried BIGINT NOT NULL,
    PRIMARY KEY (span, at, queue)
);
CREATE TABLE homing_stats_latency (
    span INTEGER NOT NULL,
    at BIGINT NOT NULL,
    queue TEXT NOT NULL,
    kind TEXT NOT NULL,
    bucket INTEGER NOT NULL,
    n BIGINT NOT NULL,
    PRIMARY KEY (span, at, queue, kind, bucket)
);
CREATE TABLE homing_stats_depth (
    span INTEGER NOT NULL,
    at BIGINT NOT NULL,
    queue TEXT NOT NULL,
    depth BIGINT NOT NULL,
    PRIMARY KEY (span, at, queue)
);
CREATE TABLE homing_stats_cursor (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    rolled_to BIGINT NOT NULL
);
-- The pruner deletes by `at` alone, whatever the span.
CREATE INDEX homing_stats_counts_at ON homing_stats_counts (at);
CREATE INDEX homing_stats_latency_at ON homing_stats_latency (at);
CREATE INDEX homing_stats_depth_at ON homing_stats_depth (at);
