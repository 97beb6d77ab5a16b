-- Version 26: schedules by the bytes of their names, the order the embedded file keeps and the
-- one the paged list (`name COLLATE "C" > $1 ORDER BY name COLLATE "C" LIMIT n`) and the
-- periodic loop's heads read in. The primary key's index is in the database's collation, which
-- serves that order only when the collation is C: in any other, each page of the list sorted
-- every schedule after its start.
CREATE INDEX homing_schedules_name_bytewise ON homing_schedules (name COLLATE "C");
