//! [`PostgresStore`] and [`MySqlStore`]: one row per session, lease rows with server-side
//! expiry, runtime queries only (no compile-time database), embedded migrations.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hame_core::AgentState;
use sqlx::Row;

use crate::error::{Error, Result};
use crate::key::StateKey;
use crate::store::{Lease, LeaseHandle, SessionSummary, StateStore, Stored};

/// Options of [`PostgresStore::connect`] and [`MySqlStore::connect`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqlOptions {
    /// Largest number of pooled connections (default 8).
    pub max_connections: u32,
    /// How long to wait for a pooled connection (default 10 s).
    pub acquire_timeout: Duration,
    /// Apply the embedded migrations on connect (default true). Turn off when a DBA applies
    /// `migrations/<db>/*.sql` by hand; the store then checks nothing.
    pub migrate: bool,
}

impl Default for SqlOptions {
    fn default() -> Self {
        Self {
            max_connections: 8,
            acquire_timeout: Duration::from_secs(10),
            migrate: true,
        }
    }
}

/// One embedded migration: version, description, SQL.
type Migration = (i64, &'static str, &'static str);

#[cfg(feature = "postgres")]
const PG_MIGRATIONS: &[Migration] = &[(
    1,
    "sessions and leases",
    include_str!("../migrations/postgres/0001_sessions_and_leases.sql"),
)];

#[cfg(feature = "mysql")]
const MYSQL_MIGRATIONS: &[Migration] = &[(
    1,
    "sessions and leases",
    include_str!("../migrations/mysql/0001_sessions_and_leases.sql"),
)];

/// The `user_key` column: `''` for the anonymous tenant (never a valid user id).
fn user_key(user: Option<&str>) -> &str {
    user.unwrap_or("")
}

fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1)
}

fn decode(key: &StateKey, json: &str) -> Result<AgentState> {
    AgentState::from_slice(json.as_bytes()).map_err(|source| Error::Format {
        key: key.to_string(),
        source,
    })
}

// ---------------------------------------------------------------- PostgreSQL

#[cfg(feature = "postgres")]
pub use pg::PostgresStore;

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use sqlx::postgres::{PgPool, PgPoolOptions};

    fn backend(e: sqlx::Error) -> Error {
        Error::backend("postgres", e)
    }

    /// A shared store on PostgreSQL.
    ///
    /// Tables (see `migrations/postgres/`): `hame_state_sessions(agent, user_key, session,
    /// version, state JSONB, updated_at)` keyed by `(agent, user_key, session)`,
    /// `hame_state_leases(agent, user_key, session, token, expires_at)` and
    /// `hame_state_migrations(version, description, applied_at)`. `user_key` is `''` for
    /// the anonymous tenant. Saves are single-statement compare-and-set (`UPDATE … WHERE
    /// version = $n`, or `INSERT … ON CONFLICT DO NOTHING` to create). Lease expiry uses
    /// the server clock (`clock_timestamp()`), so replicas' clocks do not matter.
    #[derive(Debug, Clone)]
    pub struct PostgresStore {
        pool: PgPool,
    }

    impl PostgresStore {
        /// Connects to `url` (`postgres://` or `postgresql://`) and applies the migrations.
        pub async fn connect(url: &str, options: SqlOptions) -> Result<Self> {
            let pool = PgPoolOptions::new()
                .max_connections(options.max_connections)
                .acquire_timeout(options.acquire_timeout)
                .connect(url)
                .await
                .map_err(backend)?;
            let store = Self { pool };
            if options.migrate {
                store.migrate().await?;
            }
            Ok(store)
        }

        async fn migrate(&self) -> Result<()> {
            let mut tx = self.pool.begin().await.map_err(backend)?;
            // Serialises concurrent connects of several replicas; released at commit.
            sqlx::query("SELECT pg_advisory_xact_lock(7291046183)")
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            sqlx::raw_sql(
                "CREATE TABLE IF NOT EXISTS hame_state_migrations (
                    version BIGINT PRIMARY KEY,
                    description TEXT NOT NULL,
                    applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            )
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
            for &(version, description, sql) in PG_MIGRATIONS {
                let done = sqlx::query("SELECT 1 FROM hame_state_migrations WHERE version = $1")
                    .bind(version)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(backend)?;
                if done.is_some() {
                    continue;
                }
                tracing::info!(version, description, "applying hame-state migration");
                sqlx::raw_sql(sql)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                sqlx::query(
                    "INSERT INTO hame_state_migrations (version, description) VALUES ($1, $2)",
                )
                .bind(version)
                .bind(description)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            }
            tx.commit().await.map_err(backend)
        }

        async fn current_version(&self, key: &StateKey) -> Result<Option<u64>> {
            let row = sqlx::query(
                "SELECT version FROM hame_state_sessions
                 WHERE agent = $1 AND user_key = $2 AND session = $3",
            )
            .bind(key.agent())
            .bind(user_key(key.user()))
            .bind(key.session())
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
            row.map(|r| r.try_get::<i64, _>(0).map(|v| v.max(0).cast_unsigned()))
                .transpose()
                .map_err(backend)
        }

        async fn write(&self, key: &StateKey, json: &str, expected: Option<u64>) -> Result<u64> {
            let done = match expected {
                None => {
                    sqlx::query(
                        "INSERT INTO hame_state_sessions
                           (agent, user_key, session, version, state, updated_at)
                         VALUES ($1, $2, $3, 1, $4::jsonb, now())
                         ON CONFLICT (agent, user_key, session) DO NOTHING",
                    )
                    .bind(key.agent())
                    .bind(user_key(key.user()))
                    .bind(key.session())
                    .bind(json)
                    .execute(&self.pool)
                    .await
                    .map_err(backend)?
                    .rows_affected()
                        == 1
                }
                Some(v) => {
                    let v = i64::try_from(v).map_err(|_| Error::Conflict {
                        key: key.to_string(),
                        expected,
                        found: None,
                    })?;
                    sqlx::query(
                        "UPDATE hame_state_sessions
                         SET version = version + 1, state = $5::jsonb, updated_at = now()
                         WHERE agent = $1 AND user_key = $2 AND session = $3 AND version = $4",
                    )
                    .bind(key.agent())
                    .bind(user_key(key.user()))
                    .bind(key.session())
                    .bind(v)
                    .bind(json)
                    .execute(&self.pool)
                    .await
                    .map_err(backend)?
                    .rows_affected()
                        == 1
                }
            };
            if done {
                Ok(expected.map_or(1, |v| v + 1))
            } else {
                Err(Error::Conflict {
                    key: key.to_string(),
                    expected,
                    found: self.current_version(key).await?,
                })
            }
        }

        #[cfg(any(test, feature = "conformance"))]
        async fn put_raw_doc(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
            self.delete(key).await?;
            self.write(key, &state.to_string(), None).await.map(|_| ())
        }
    }

    #[cfg(any(test, feature = "conformance"))]
    #[async_trait]
    impl crate::conformance::RawAccess for PostgresStore {
        async fn put_raw(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
            self.put_raw_doc(key, state).await
        }
    }

    #[async_trait]
    impl StateStore for PostgresStore {
        async fn load(&self, key: &StateKey) -> Result<Option<Stored>> {
            let row = sqlx::query(
                "SELECT version, state::text FROM hame_state_sessions
                 WHERE agent = $1 AND user_key = $2 AND session = $3",
            )
            .bind(key.agent())
            .bind(user_key(key.user()))
            .bind(key.session())
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
            let Some(row) = row else { return Ok(None) };
            let version: i64 = row.try_get(0).map_err(backend)?;
            let json: String = row.try_get(1).map_err(backend)?;
            Ok(Some(Stored {
                state: decode(key, &json)?,
                version: version.max(0).cast_unsigned(),
            }))
        }

        async fn save(
            &self,
            key: &StateKey,
            state: &AgentState,
            expected: Option<u64>,
        ) -> Result<u64> {
            let json = serde_json::to_string(state).map_err(Error::Serialize)?;
            self.write(key, &json, expected).await
        }

        async fn delete(&self, key: &StateKey) -> Result<bool> {
            let n = sqlx::query(
                "DELETE FROM hame_state_sessions
                 WHERE agent = $1 AND user_key = $2 AND session = $3",
            )
            .bind(key.agent())
            .bind(user_key(key.user()))
            .bind(key.session())
            .execute(&self.pool)
            .await
            .map_err(backend)?
            .rows_affected();
            Ok(n > 0)
        }

        async fn list_sessions(
            &self,
            agent: &str,
            user: Option<&str>,
        ) -> Result<Vec<SessionSummary>> {
            crate::validate_scope(agent, user)?;
            let rows = sqlx::query(
                "SELECT session, updated_at FROM hame_state_sessions
                 WHERE agent = $1 AND user_key = $2
                 ORDER BY updated_at DESC, session",
            )
            .bind(agent)
            .bind(user_key(user))
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
            rows.iter()
                .map(|r| {
                    Ok(SessionSummary {
                        session: r.try_get(0).map_err(backend)?,
                        updated_at: r.try_get(1).map_err(backend)?,
                    })
                })
                .collect()
        }

        async fn try_acquire(&self, key: &StateKey, ttl: Duration) -> Result<Option<Lease>> {
            let token = uuid::Uuid::new_v4().to_string();
            let got = sqlx::query(
                "INSERT INTO hame_state_leases (agent, user_key, session, token, expires_at)
                 VALUES ($1, $2, $3, $4, clock_timestamp() + $5::bigint * interval '1 millisecond')
                 ON CONFLICT (agent, user_key, session) DO UPDATE
                   SET token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
                   WHERE hame_state_leases.expires_at <= clock_timestamp()
                 RETURNING token",
            )
            .bind(key.agent())
            .bind(user_key(key.user()))
            .bind(key.session())
            .bind(&token)
            .bind(ttl_ms(ttl))
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
            if got.is_none() {
                return Ok(None);
            }
            let handle = PgLease {
                pool: self.pool.clone(),
                key: key.clone(),
                token: token.clone(),
            };
            Ok(Some(Lease::new(key.clone(), token, ttl, Arc::new(handle))))
        }

        fn is_shared(&self) -> bool {
            true
        }
    }

    #[derive(Debug)]
    struct PgLease {
        pool: PgPool,
        key: StateKey,
        token: String,
    }

    #[async_trait]
    impl LeaseHandle for PgLease {
        async fn renew(&self, ttl: Duration) -> Result<()> {
            let n = sqlx::query(
                "UPDATE hame_state_leases
                 SET expires_at = clock_timestamp() + $5::bigint * interval '1 millisecond'
                 WHERE agent = $1 AND user_key = $2 AND session = $3 AND token = $4
                   AND expires_at > clock_timestamp()",
            )
            .bind(self.key.agent())
            .bind(user_key(self.key.user()))
            .bind(self.key.session())
            .bind(&self.token)
            .bind(ttl_ms(ttl))
            .execute(&self.pool)
            .await
            .map_err(backend)?
            .rows_affected();
            if n == 1 {
                Ok(())
            } else {
                Err(Error::LeaseLost {
                    key: self.key.to_string(),
                })
            }
        }

        async fn release(&self) -> Result<()> {
            sqlx::query(
                "DELETE FROM hame_state_leases
                 WHERE agent = $1 AND user_key = $2 AND session = $3 AND token = $4",
            )
            .bind(self.key.agent())
            .bind(user_key(self.key.user()))
            .bind(self.key.session())
            .bind(&self.token)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
            Ok(())
        }
    }
}

// ---------------------------------------------------------------- MySQL / MariaDB

#[cfg(feature = "mysql")]
pub use my::MySqlStore;

#[cfg(feature = "mysql")]
mod my {
    use super::*;
    use chrono::{NaiveDateTime, Utc};
    use sqlx::mysql::{MySqlPool, MySqlPoolOptions};

    fn backend(e: sqlx::Error) -> Error {
        Error::backend("mysql", e)
    }

    fn is_unique_violation(e: &sqlx::Error) -> bool {
        matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
    }

    /// A shared store on MySQL 8 or MariaDB 10.6+.
    ///
    /// Tables (see `migrations/mysql/`): `hame_state_sessions(agent, user_key, session,
    /// version, state LONGTEXT, updated_at)` keyed by `(agent, user_key, session)` with
    /// byte-wise (`ascii_bin`) id columns, `hame_state_leases(…, token, expires_at)` and
    /// `hame_state_migrations`. Saves are single-statement compare-and-set; lease expiry
    /// uses the server's `UTC_TIMESTAMP(6)`. A state larger than the server's
    /// `max_allowed_packet` (16 MiB by default on MariaDB, 64 MiB on MySQL 8) is refused.
    #[derive(Debug, Clone)]
    pub struct MySqlStore {
        pool: MySqlPool,
    }

    impl MySqlStore {
        /// Connects to `url` (`mysql://`; [`crate::open`] also maps `mariadb://`) and
        /// applies the migrations.
        pub async fn connect(url: &str, options: SqlOptions) -> Result<Self> {
            let pool = MySqlPoolOptions::new()
                .max_connections(options.max_connections)
                .acquire_timeout(options.acquire_timeout)
                .connect(url)
                .await
                .map_err(backend)?;
            let store = Self { pool };
            if options.migrate {
                store.migrate().await?;
            }
            Ok(store)
        }

        async fn migrate(&self) -> Result<()> {
            // DDL commits implicitly in MySQL, so a named lock (held by this connection)
            // serialises concurrent connects instead of a transaction.
            let mut conn = self.pool.acquire().await.map_err(backend)?;
            let locked: Option<i64> = sqlx::query("SELECT GET_LOCK('hame_state_migrate', 60)")
                .fetch_one(&mut *conn)
                .await
                .and_then(|r| r.try_get(0))
                .map_err(backend)?;
            if locked != Some(1) {
                return Err(Error::backend(
                    "mysql",
                    "timed out waiting for the hame_state_migrate lock",
                ));
            }
            let result = async {
                sqlx::raw_sql(
                    "CREATE TABLE IF NOT EXISTS hame_state_migrations (
                        version BIGINT PRIMARY KEY,
                        description VARCHAR(200) NOT NULL,
                        applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
                )
                .execute(&mut *conn)
                .await?;
                for &(version, description, sql) in MYSQL_MIGRATIONS {
                    let done = sqlx::query("SELECT 1 FROM hame_state_migrations WHERE version = ?")
                        .bind(version)
                        .fetch_optional(&mut *conn)
                        .await?;
                    if done.is_some() {
                        continue;
                    }
                    tracing::info!(version, description, "applying hame-state migration");
                    sqlx::raw_sql(sql).execute(&mut *conn).await?;
                    sqlx::query(
                        "INSERT INTO hame_state_migrations (version, description) VALUES (?, ?)",
                    )
                    .bind(version)
                    .bind(description)
                    .execute(&mut *conn)
                    .await?;
                }
                Ok::<(), sqlx::Error>(())
            }
            .await;
            let released = sqlx::query("DO RELEASE_LOCK('hame_state_migrate')")
                .execute(&mut *conn)
                .await;
            result.map_err(backend)?;
            released.map_err(backend)?;
            Ok(())
        }

        async fn current_version(&self, key: &StateKey) -> Result<Option<u64>> {
            let row = sqlx::query(
                "SELECT version FROM hame_state_sessions
                 WHERE agent = ? AND user_key = ? AND session = ?",
            )
            .bind(key.agent())
            .bind(user_key(key.user()))
            .bind(key.session())
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
            row.map(|r| r.try_get::<u64, _>(0))
                .transpose()
                .map_err(backend)
        }

        async fn write(&self, key: &StateKey, json: &str, expected: Option<u64>) -> Result<u64> {
            let now = Utc::now().naive_utc();
            let done = match expected {
                None => {
                    let r = sqlx::query(
                        "INSERT INTO hame_state_sessions
                           (agent, user_key, session, version, state, updated_at)
                         VALUES (?, ?, ?, 1, ?, ?)",
                    )
                    .bind(key.agent())
                    .bind(user_key(key.user()))
                    .bind(key.session())
                    .bind(json)
                    .bind(now)
                    .execute(&self.pool)
                    .await;
                    match r {
                        Ok(_) => true,
                        Err(e) if is_unique_violation(&e) => false,
                        Err(e) => return Err(backend(e)),
                    }
                }
                Some(v) => {
                    sqlx::query(
                        "UPDATE hame_state_sessions
                         SET version = version + 1, state = ?, updated_at = ?
                         WHERE agent = ? AND user_key = ? AND session = ? AND version = ?",
                    )
                    .bind(json)
                    .bind(now)
                    .bind(key.agent())
                    .bind(user_key(key.user()))
                    .bind(key.session())
                    .bind(v)
                    .execute(&self.pool)
                    .await
                    .map_err(backend)?
                    .rows_affected()
                        == 1
                }
            };
            if done {
                Ok(expected.map_or(1, |v| v + 1))
            } else {
                Err(Error::Conflict {
                    key: key.to_string(),
                    expected,
                    found: self.current_version(key).await?,
                })
            }
        }

        #[cfg(any(test, feature = "conformance"))]
        async fn put_raw_doc(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
            self.delete(key).await?;
            self.write(key, &state.to_string(), None).await.map(|_| ())
        }
    }

    #[cfg(any(test, feature = "conformance"))]
    #[async_trait]
    impl crate::conformance::RawAccess for MySqlStore {
        async fn put_raw(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
            self.put_raw_doc(key, state).await
        }
    }

    #[async_trait]
    impl StateStore for MySqlStore {
        async fn load(&self, key: &StateKey) -> Result<Option<Stored>> {
            let row = sqlx::query(
                "SELECT version, state FROM hame_state_sessions
                 WHERE agent = ? AND user_key = ? AND session = ?",
            )
            .bind(key.agent())
            .bind(user_key(key.user()))
            .bind(key.session())
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
            let Some(row) = row else { return Ok(None) };
            let version: u64 = row.try_get(0).map_err(backend)?;
            let json: String = row.try_get(1).map_err(backend)?;
            Ok(Some(Stored {
                state: decode(key, &json)?,
                version,
            }))
        }

        async fn save(
            &self,
            key: &StateKey,
            state: &AgentState,
            expected: Option<u64>,
        ) -> Result<u64> {
            let json = serde_json::to_string(state).map_err(Error::Serialize)?;
            self.write(key, &json, expected).await
        }

        async fn delete(&self, key: &StateKey) -> Result<bool> {
            let n = sqlx::query(
                "DELETE FROM hame_state_sessions WHERE agent = ? AND user_key = ? AND session = ?",
            )
            .bind(key.agent())
            .bind(user_key(key.user()))
            .bind(key.session())
            .execute(&self.pool)
            .await
            .map_err(backend)?
            .rows_affected();
            Ok(n > 0)
        }

        async fn list_sessions(
            &self,
            agent: &str,
            user: Option<&str>,
        ) -> Result<Vec<SessionSummary>> {
            crate::validate_scope(agent, user)?;
            let rows = sqlx::query(
                "SELECT session, updated_at FROM hame_state_sessions
                 WHERE agent = ? AND user_key = ?
                 ORDER BY updated_at DESC, session",
            )
            .bind(agent)
            .bind(user_key(user))
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
            rows.iter()
                .map(|r| {
                    let at: NaiveDateTime = r.try_get(1).map_err(backend)?;
                    Ok(SessionSummary {
                        session: r.try_get(0).map_err(backend)?,
                        updated_at: at.and_utc(),
                    })
                })
                .collect()
        }

        async fn try_acquire(&self, key: &StateKey, ttl: Duration) -> Result<Option<Lease>> {
            let token = uuid::Uuid::new_v4().to_string();
            let micros = ttl_ms(ttl).saturating_mul(1000);
            // Both assignments test the old `expires_at` (it is assigned last), so either
            // both columns change (the old lease expired) or neither does.
            sqlx::query(
                "INSERT INTO hame_state_leases (agent, user_key, session, token, expires_at)
                 VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
                 ON DUPLICATE KEY UPDATE
                   token = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(token), token),
                   expires_at = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(expires_at), expires_at)",
            )
            .bind(key.agent())
            .bind(user_key(key.user()))
            .bind(key.session())
            .bind(&token)
            .bind(micros)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
            let holder: Option<String> = sqlx::query(
                "SELECT token FROM hame_state_leases
                 WHERE agent = ? AND user_key = ? AND session = ?",
            )
            .bind(key.agent())
            .bind(user_key(key.user()))
            .bind(key.session())
            .fetch_optional(&self.pool)
            .await
            .and_then(|r| r.map(|r| r.try_get(0)).transpose())
            .map_err(backend)?;
            if holder.as_deref() != Some(token.as_str()) {
                return Ok(None);
            }
            let handle = MyLease {
                pool: self.pool.clone(),
                key: key.clone(),
                token: token.clone(),
            };
            Ok(Some(Lease::new(key.clone(), token, ttl, Arc::new(handle))))
        }

        fn is_shared(&self) -> bool {
            true
        }
    }

    #[derive(Debug)]
    struct MyLease {
        pool: MySqlPool,
        key: StateKey,
        token: String,
    }

    #[async_trait]
    impl LeaseHandle for MyLease {
        async fn renew(&self, ttl: Duration) -> Result<()> {
            let n = sqlx::query(
                "UPDATE hame_state_leases
                 SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
                 WHERE agent = ? AND user_key = ? AND session = ? AND token = ?
                   AND expires_at > UTC_TIMESTAMP(6)",
            )
            .bind(ttl_ms(ttl).saturating_mul(1000))
            .bind(self.key.agent())
            .bind(user_key(self.key.user()))
            .bind(self.key.session())
            .bind(&self.token)
            .execute(&self.pool)
            .await
            .map_err(backend)?
            .rows_affected();
            if n == 1 {
                Ok(())
            } else {
                Err(Error::LeaseLost {
                    key: self.key.to_string(),
                })
            }
        }

        async fn release(&self) -> Result<()> {
            sqlx::query(
                "DELETE FROM hame_state_leases
                 WHERE agent = ? AND user_key = ? AND session = ? AND token = ?",
            )
            .bind(self.key.agent())
            .bind(user_key(self.key.user()))
            .bind(self.key.session())
            .bind(&self.token)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
            Ok(())
        }
    }
}
