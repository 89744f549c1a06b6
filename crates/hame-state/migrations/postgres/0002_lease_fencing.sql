-- hame-state schema 2 (PostgreSQL): fencing tokens and holders of leases.
-- `fence` grows by one with every acquisition of a key; lease rows are kept after release
-- (token '' and an expiry in the past) so it never starts over. `holder` is the JSON record
-- of the holding process (host, boot id, PID namespace, pid, start time).
ALTER TABLE hame_state_leases
    ADD COLUMN IF NOT EXISTS fence  BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS holder TEXT   NOT NULL DEFAULT '';
