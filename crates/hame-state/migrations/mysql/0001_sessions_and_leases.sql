-- hame-state schema 1 (MySQL 8 / MariaDB 10.6+). Applied by MySqlStore::connect under GET_LOCK.
-- Ids are ASCII (see StateKey) and compared byte-wise (ascii_bin), so `Alice` and `alice` differ.
CREATE TABLE IF NOT EXISTS hame_state_sessions (
    agent      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_key   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, -- '' = anonymous
    session    VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    version    BIGINT UNSIGNED NOT NULL,
    state      LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    updated_at DATETIME(6) NOT NULL, -- UTC
    PRIMARY KEY (agent, user_key, session),
    KEY hame_state_sessions_recent (agent, user_key, updated_at)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS hame_state_leases (
    agent      VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_key   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    session    VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    token      VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    expires_at DATETIME(6) NOT NULL, -- UTC_TIMESTAMP(6) of the server
    PRIMARY KEY (agent, user_key, session)
) ENGINE = InnoDB;
