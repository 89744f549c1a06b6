-- hame-state schema 6 (PostgreSQL): the sessions' events shared between `hame serve`
-- replicas (docs/replicas.md): the last id of each session and its last events.
CREATE TABLE IF NOT EXISTS hame_event_seqs (
    key        TEXT        PRIMARY KEY,   -- <agent>/<user>/<session>, as the gateway names it
    last       BIGINT      NOT NULL,      -- the newest event's id (1, 2, ...)
    updated_at TIMESTAMPTZ NOT NULL       -- the newest event's time: idle keys are swept
);
CREATE INDEX IF NOT EXISTS hame_event_seqs_idle ON hame_event_seqs (updated_at);
CREATE TABLE IF NOT EXISTS hame_events (
    key  TEXT   NOT NULL,
    id   BIGINT NOT NULL,
    body TEXT   NOT NULL,
    PRIMARY KEY (key, id)
);
