-- hame-state schema 3 (PostgreSQL): the schema version of each stored state, so that a save
-- refuses, in the same statement, to overwrite a document written by a newer hame.
ALTER TABLE hame_state_sessions ADD COLUMN IF NOT EXISTS schema_version BIGINT NOT NULL DEFAULT 0;
UPDATE hame_state_sessions
SET schema_version = (state->>'schema_version')::numeric::bigint
WHERE jsonb_typeof(state->'schema_version') = 'number'
  AND (state->>'schema_version')::numeric BETWEEN 0 AND 9223372036854775807;
