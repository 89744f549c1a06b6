-- hame-state schema 1 (PostgreSQL). Applied by PostgresStore::connect under an advisory lock.
CREATE TABLE IF NOT EXISTS hame_state_sessions (
    agent      TEXT        NOT NULL,
    user_key   TEXT        NOT NULL, -- '' for the anonymous tenant (never a valid user id)
    session    TEXT        NOT NULL,
    version    BIGINT      NOT NULL CHECK (version >= 1),
    state      JSONB       NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (agent, user_key, session)
);
CREATE INDEX IF NOT EXISTS hame_state_sessions_recent
    ON hame_state_sessions (agent, user_key, updated_at DESC);
CREATE TABLE IF NOT EXISTS hame_state_leases (
    agent      TEXT        NOT NULL,
    user_key   TEXT        NOT NULL,
    session    TEXT        NOT NULL,
    token      TEXT        NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (agent, user_key, session)
);
