-- hame-state schema 2 (MySQL 8 / MariaDB 10.6+): fencing tokens and holders of leases.
-- `fence` grows by one with every acquisition of a key; lease rows are kept after release
-- (token '' and an expiry in the past) so it never starts over. `holder` is the JSON record
-- of the holding process (host, boot id, PID namespace, pid, start time).
-- One ALTER statement: it applies whole or not at all.
ALTER TABLE hame_state_leases
    ADD COLUMN fence  BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN holder VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '';
