//! [`MySqlEventLog`]: tables `hame_event_seqs` and `hame_events` (migration 6 of
//! hame-state). One event is one transaction: the counter's upsert (its new value through
//! `LAST_INSERT_ID(expr)`), the event's insert and the trim of older ones.

use async_trait::async_trait;
use sqlx::Row;
use sqlx::mysql::MySqlPool;

use super::{EventLog, EventOptions, SWEEP_EVERY, SqlEventLog, StoredEvent, check_key, keep_of};
use crate::error::{Error, Result};
use crate::sql::SqlOptions;

const NEXT_ID: &str = "INSERT INTO hame_event_seqs (`key`, last, updated_at)
    VALUES (?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6))
    ON DUPLICATE KEY UPDATE last = LAST_INSERT_ID(last + 1), updated_at = UTC_TIMESTAMP(6)";

fn backend(e: sqlx::Error) -> Error {
    Error::backend("mysql", e)
}

/// The sessions' events in MySQL / MariaDB.
pub type MySqlEventLog = SqlEventLog<MySqlPool>;

impl MySqlEventLog {
    /// Connects to `url` (`mysql://` or `mariadb://`) and applies hame-state's migrations
    /// (the events' tables are migration 6).
    pub async fn connect(url: &str, options: EventOptions) -> Result<Self> {
        let (pool, url) = crate::runs::mysql_pool(url, &SqlOptions::default()).await?;
        Ok(Self {
            pool,
            ttl: options.idle_ttl,
            target: crate::redact_url(&url),
        })
    }

    /// One publishing transaction: the counter, the event, the trim.
    async fn publish_once(&self, key: &str, body: &str, keep: usize) -> Result<u64> {
        let mut tx = self.pool.begin().await.map_err(backend)?;
        sqlx::query(NEXT_ID)
            .bind(key.as_bytes())
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        // The counter's new value, on this connection.
        let id: u64 = sqlx::query("SELECT LAST_INSERT_ID()")
            .fetch_one(&mut *tx)
            .await
            .and_then(|r| r.try_get(0))
            .map_err(backend)?;
        sqlx::query("INSERT INTO hame_events (`key`, id, body) VALUES (?, ?, ?)")
            .bind(key.as_bytes())
            .bind(id)
            .bind(body)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        let keep = keep_of(keep);
        if id > keep {
            sqlx::query("DELETE FROM hame_events WHERE `key` = ? AND id <= ?")
                .bind(key.as_bytes())
                .bind(id - keep)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
        }
        tx.commit().await.map_err(backend)?;
        Ok(id)
    }

    /// Forgets the sessions idle for longer than the time to live.
    async fn sweep(&self) {
        let micros = u64::try_from(self.ttl.as_micros()).unwrap_or(u64::MAX);
        let result = async {
            sqlx::query(
                "DELETE e FROM hame_events e JOIN hame_event_seqs s ON e.`key` = s.`key`
                 WHERE s.updated_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND",
            )
            .bind(micros)
            .execute(&self.pool)
            .await?;
            sqlx::query(
                "DELETE FROM hame_event_seqs WHERE updated_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND",
            )
            .bind(micros)
            .execute(&self.pool)
            .await
        }
        .await;
        if let Err(e) = result {
            tracing::debug!(error = %e, "events: sweeping idle sessions failed; the next sweep tries again");
        }
    }
}

#[async_trait]
impl EventLog for MySqlEventLog {
    async fn publish(&self, key: &str, body: &str, keep: usize) -> Result<u64> {
        check_key(key)?;
        // Publishers of one session wait on its counter's row; a sweep beside them can
        // still make InnoDB roll one back as a deadlock victim: it is tried again.
        let id = crate::runs::retry_deadlocks(|| self.publish_once(key, body, keep)).await?;
        if id == 1 || id.is_multiple_of(SWEEP_EVERY) {
            self.sweep().await;
        }
        Ok(id)
    }

    async fn replay(&self, key: &str, after: u64) -> Result<Vec<StoredEvent>> {
        check_key(key)?;
        let replay = "SELECT id, body FROM hame_events WHERE `key` = ? AND id > ? ORDER BY id";
        let rows: Vec<(u64, String)> = sqlx::query_as(replay)
            .bind(key.as_bytes())
            .bind(after)
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
        Ok(rows
            .into_iter()
            .map(|(id, body)| StoredEvent::new(id, body))
            .collect())
    }
}
