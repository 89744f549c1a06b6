-- hame-state schema 4 (MySQL 8 / MariaDB 10.6+): the run queue (docs/runs.md). The queue
-- itself is not served on MySQL yet; the table is created so that it can be.
CREATE TABLE IF NOT EXISTS hame_runs (
    seq              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id               VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    agent            VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_key         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    session          VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    idempotency_key  VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NULL,
    status           VARCHAR(20)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    input            LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    reply            LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    `usage`          TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    error            TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    approvals        LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    attempts         BIGINT UNSIGNED NOT NULL DEFAULT 0,
    token            VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    worker           VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    created_at       DATETIME(6) NOT NULL,
    updated_at       DATETIME(6) NOT NULL,
    expires_at       DATETIME(6) NULL,
    UNIQUE KEY hame_runs_id (id),
    UNIQUE KEY hame_runs_idempotency (agent, user_key, idempotency_key),
    KEY hame_runs_session (agent, user_key, session, seq),
    KEY hame_runs_status (status, seq)
) ENGINE = InnoDB;
