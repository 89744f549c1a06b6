-- hame-state schema 6 (MySQL 8 / MariaDB 10.6+): the sessions' events shared between
-- `hame serve` replicas (docs/replicas.md): the last id of each session and its last events.
-- Keys are compared byte-wise (VARBINARY).
CREATE TABLE IF NOT EXISTS hame_event_seqs (
    `key`      VARBINARY(768) NOT NULL PRIMARY KEY,
    last       BIGINT UNSIGNED NOT NULL,
    updated_at DATETIME(6) NOT NULL, -- UTC
    KEY hame_event_seqs_idle (updated_at)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS hame_events (
    `key` VARBINARY(768) NOT NULL,
    id    BIGINT UNSIGNED NOT NULL,
    body  LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    PRIMARY KEY (`key`, id)
) ENGINE = InnoDB;
