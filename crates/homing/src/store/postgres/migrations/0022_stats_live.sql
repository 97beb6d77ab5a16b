-- Version 22: the rollup records how far its last pass counted (`live_to`, the pass's own time,
-- mid-minute), besides the closed minutes (`rolled_to`). The queue list's last-hour and
-- per-second figures take everything before `live_to` from the minute rollups and count only
-- the finishes after it from the jobs: a pass interval's worth, not the 5–80 s that trailed the
-- closed minutes (docs/counts.md). NULL until the first pass after the upgrade.
ALTER TABLE homing_stats_cursor ADD COLUMN live_to BIGINT;
