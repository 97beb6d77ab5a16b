-- Version 27: the periodic pass reads every unpaused schedule's name, spec and cursor four times
-- a second (Store::schedule_heads). In the table those columns sit around `definition`, which
-- holds the args (up to 1 MiB), so reading `cursor` walks the definition's overflow pages: 100
-- schedules with 1 MiB args kept an idle process at a quarter of a core. This index holds the
-- heads alone, so the pass reads it and never the table.
CREATE INDEX IF NOT EXISTS schedules_heads ON schedules (paused, name, spec, cursor);
