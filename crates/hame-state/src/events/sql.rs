//! [`PgEventLog`]: tables `hame_event_seqs` (the last id of each session) and `hame_events`
//! (its last events), migration 6 of hame-state. One event is one statement: the counter's
//! upsert, the event's insert and the trim of older ones.

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::PgPool;

use super::{EventLog, EventOptions, SWEEP_EVERY, SqlEventLog, StoredEvent, check_key, keep_of};
use crate::error::{Error, Result};
use crate::sql::SqlOptions;

const PUBLISH: &str = "WITH s AS (
    INSERT INTO hame_event_seqs (key, last, updated_at) VALUES ($1, 1, clock_timestamp())
    ON CONFLICT (key) DO UPDATE SET last = hame_event_seqs.last + 1, updated_at = clock_timestamp()
    RETURNING last
), e AS (
    INSERT INTO hame_events (key, id, body) SELECT $1, last, $2 FROM s
), t AS (
    DELETE FROM hame_events WHERE key = $1 AND id <= (SELECT last FROM s) - $3
)
SELECT last FROM s";

const SWEEP: &str = "WITH idle AS (
    DELETE FROM hame_event_seqs
    WHERE updated_at < clock_timestamp() - $1 * interval '1 microsecond'
    RETURNING key
)
DELETE FROM hame_events WHERE key IN (SELECT key FROM idle)";

const REPLAY: &str = "SELECT id, body FROM hame_events WHERE key = $1 AND id > $2 ORDER BY id";

fn backend(e: sqlx::Error) -> Error {
    Error::backend("postgres", e)
}

/// The sessions' events in PostgreSQL.
pub type PgEventLog = SqlEventLog<PgPool>;

impl PgEventLog {
    /// Connects to `url` (`postgres://` or `postgresql://`) and applies hame-state's
    /// migrations (the events' tables are migration 6).
    pub async fn connect(url: &str, options: EventOptions) -> Result<Self> {
        let pool = crate::runs::pg_pool(url, &SqlOptions::default()).await?;
        Ok(Self {
            pool,
            ttl: options.idle_ttl,
            target: crate::redact_url(url),
        })
    }

    /// Forgets the sessions idle for longer than the time to live.
    async fn sweep(&self) {
        let micros = i64::try_from(self.ttl.as_micros()).unwrap_or(i64::MAX);
        if let Err(e) = sqlx::query(SWEEP).bind(micros).execute(&self.pool).await {
            tracing::debug!(error = %e, "events: sweeping idle sessions failed; the next sweep tries again");
        }
    }
}

#[async_trait]
impl EventLog for PgEventLog {
    async fn publish(&self, key: &str, body: &str, keep: usize) -> Result<u64> {
        check_key(key)?;
        let keep = i64::try_from(keep_of(keep)).unwrap_or(i64::MAX);
        let row = sqlx::query(PUBLISH)
            .bind(key)
            .bind(body)
            .bind(keep)
            .fetch_one(&self.pool)
            .await
            .map_err(backend)?;
        let id = row
            .try_get::<i64, _>(0)
            .map_err(backend)?
            .max(0)
            .cast_unsigned();
        if id == 1 || id.is_multiple_of(SWEEP_EVERY) {
            self.sweep().await;
        }
        Ok(id)
    }

    async fn replay(&self, key: &str, after: u64) -> Result<Vec<StoredEvent>> {
        check_key(key)?;
        let rows: Vec<(i64, String)> = sqlx::query_as(REPLAY)
            .bind(key)
            .bind(i64::try_from(after).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
        Ok(rows
            .into_iter()
            .map(|(id, body)| StoredEvent::new(id.max(0).cast_unsigned(), body))
            .collect())
    }
}
