-- hame-state schema 5 (PostgreSQL): the completion gate's verdict of a run (issue #33,
-- docs/evidence.md): JSON {status, evidence, extra_steps}; status 'unverified' is new.
ALTER TABLE hame_runs ADD COLUMN IF NOT EXISTS verification TEXT;
