-- hame-state schema 5 (MySQL 8 / MariaDB 10.6+): the completion gate's verdict of a run
-- (issue #33, docs/evidence.md): JSON {status, evidence, extra_steps}; status 'unverified'
-- is new.
ALTER TABLE hame_runs ADD COLUMN verification LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;
