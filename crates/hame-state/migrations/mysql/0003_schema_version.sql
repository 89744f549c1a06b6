-- hame-state schema 3 (MySQL 8 / MariaDB 10.6+): the schema version of each stored state, so
-- that a save refuses, in the same statement, to overwrite a document written by a newer hame.
ALTER TABLE hame_state_sessions ADD COLUMN schema_version BIGINT NOT NULL DEFAULT 0;
UPDATE hame_state_sessions
SET schema_version = CAST(JSON_EXTRACT(state, '$.schema_version') AS SIGNED)
WHERE JSON_VALID(state)
  AND JSON_TYPE(JSON_EXTRACT(state, '$.schema_version')) IN ('INTEGER', 'UNSIGNED INTEGER');
