-- hame-state schema 4 (PostgreSQL): the run queue (docs/runs.md).
CREATE TABLE IF NOT EXISTS hame_runs (
    seq              BIGSERIAL   PRIMARY KEY,          -- submission order
    id               TEXT        NOT NULL UNIQUE,      -- run-<32 hex>
    agent            TEXT        NOT NULL,
    user_key         TEXT        NOT NULL,             -- '' for the anonymous tenant
    session          TEXT        NOT NULL,
    idempotency_key  TEXT,
    status           TEXT        NOT NULL,
    input            TEXT        NOT NULL,             -- JSON RunInput
    reply            TEXT,
    usage            TEXT,                             -- JSON
    error            TEXT,                             -- JSON {code, message}
    approvals        TEXT,                             -- JSON
    attempts         BIGINT      NOT NULL DEFAULT 0,   -- the fence of the current claim
    token            TEXT        NOT NULL DEFAULT '',
    worker           TEXT,
    cancel_requested BOOLEAN     NOT NULL DEFAULT FALSE,
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    expires_at       TIMESTAMPTZ,
    UNIQUE (agent, user_key, idempotency_key)
);
CREATE INDEX IF NOT EXISTS hame_runs_session ON hame_runs (agent, user_key, session, seq);
CREATE INDEX IF NOT EXISTS hame_runs_active ON hame_runs (seq) WHERE status IN ('queued', 'running');
