//! [`SqlStore`]: one store for PostgreSQL ([`PostgresStore`]) and MySQL / MariaDB
//! ([`MySqlStore`]). One row per session, lease rows with server-side expiry, runtime
//! queries only (no compile-time database), embedded migrations.
//!
//! The store logic is written once, over sqlx's `Any` driver; a [`SqlDialect`] supplies only
//! what differs between the servers: the text of each statement (placeholders, upsert
//! syntax, clock functions, JSON column type), the migration files and the lock that
//! serialises concurrent migrations. Every statement of both dialects takes its arguments in
//! the same order, so one binding serves both.

use std::marker::PhantomData;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use chrono::DateTime;
use hame_core::AgentState;
use sqlx::Row;
use sqlx::any::{AnyArguments, AnyPoolOptions};
use sqlx::pool::Pool;
use sqlx::query::Query;

use crate::error::{Error, MAX_SCHEMA, Result};
use crate::key::StateKey;
use crate::shared_lease::{self, Claim, LeaseRecord, LeaseTable};
use crate::store::Save;
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

/// The SQL server a [`SqlStore`] talks to: [`Postgres`] or [`MySql`]. Sealed.
pub trait SqlDialect: sealed::Sealed + Send + Sync + 'static {}

/// PostgreSQL 12+ (`postgres://`, `postgresql://`); `state` is `JSONB`.
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, Copy)]
pub struct Postgres;

/// MySQL 8 or MariaDB 10.6+ (`mysql://`, `mariadb://`); `state` is `LONGTEXT utf8mb4`.
#[cfg(feature = "mysql")]
#[derive(Debug, Clone, Copy)]
pub struct MySql;

#[cfg(feature = "postgres")]
impl SqlDialect for Postgres {}
#[cfg(feature = "mysql")]
impl SqlDialect for MySql {}

/// A shared store on PostgreSQL.
///
/// Tables (see `migrations/postgres/`): `hame_state_sessions(agent, user_key, session,
/// version, state JSONB, updated_at)` keyed by `(agent, user_key, session)`,
/// `hame_state_leases(agent, user_key, session, token, expires_at)` and
/// `hame_state_migrations(version, description, applied_at)`. `user_key` is `''` for the
/// anonymous tenant. Saves are single-statement compare-and-set (`UPDATE … WHERE version =
/// $n`, or `INSERT … ON CONFLICT DO NOTHING` to create). Lease expiry uses the server clock
/// (`clock_timestamp()`), so replicas' clocks do not matter.
#[cfg(feature = "postgres")]
pub type PostgresStore = SqlStore<Postgres>;

/// A shared store on MySQL 8 or MariaDB 10.6+.
///
/// Tables (see `migrations/mysql/`): `hame_state_sessions(agent, user_key, session, version,
/// state LONGTEXT, updated_at)` keyed by `(agent, user_key, session)` with byte-wise
/// (`ascii_bin`) id columns, `hame_state_leases(…, token, expires_at)` and
/// `hame_state_migrations`. Saves are single-statement compare-and-set; update times and
/// lease expiry use the server's `UTC_TIMESTAMP(6)`. A state larger than the server's
/// `max_allowed_packet` (16 MiB by default on MariaDB, 64 MiB on MySQL 8) is refused.
#[cfg(feature = "mysql")]
pub type MySqlStore = SqlStore<MySql>;

/// A shared store on a SQL server; use it as [`PostgresStore`] or [`MySqlStore`].
pub struct SqlStore<D: SqlDialect> {
    pool: Pool<sqlx::Any>,
    /// The URL, password redacted.
    target: Arc<str>,
    dialect: PhantomData<D>,
}

impl<D: SqlDialect> Clone for SqlStore<D> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            target: self.target.clone(),
            dialect: PhantomData,
        }
    }
}

impl<D: SqlDialect> std::fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStore")
            .field("backend", &D::DIALECT.name)
            .field("target", &self.target)
            .field("pool", &self.pool)
            .finish()
    }
}

mod sealed {
    /// One embedded migration: version, description, SQL.
    pub type Migration = (i64, &'static str, &'static str);

    /// The few bits in which two SQL servers differ.
    #[derive(Debug)]
    pub struct Dialect {
        /// `postgres` or `mysql`: the backend named in errors.
        pub name: &'static str,
        /// Accepted URL schemes; the first is what the `Any` driver is given.
        pub schemes: &'static [&'static str],
        pub migrations: &'static [Migration],
        /// `$1, $2, …` placeholders (PostgreSQL) instead of `?` (MySQL).
        pub numbered: bool,
        /// The text of each `{fragment}` of the statement templates.
        pub fragments: &'static [(&'static str, &'static str)],
        /// Takes the cross-process migration lock on one connection; returns 1 when held.
        pub lock: &'static str,
        /// Releases it.
        pub unlock: &'static str,
        /// The server's id of the connection (tests).
        pub session_id: &'static str,
        /// Ends another connection, given its id (tests).
        pub kill_session: &'static str,
    }

    pub trait Sealed {
        const DIALECT: &'static Dialect;
        /// The statements, rendered once for this dialect.
        fn statements() -> &'static super::Statements;
    }
}

use sealed::Dialect;

/// The embedded migrations of one dialect: `migrations/<db>/<version>_<name>.sql`. Every
/// dialect has the same list.
macro_rules! migrations {
    ($db:literal) => {
        &[
            (
                1,
                "sessions and leases",
                include_str!(concat!(
                    "../migrations/",
                    $db,
                    "/0001_sessions_and_leases.sql"
                )),
            ),
            (
                2,
                "lease fencing tokens and holders",
                include_str!(concat!("../migrations/", $db, "/0002_lease_fencing.sql")),
            ),
            (
                3,
                "schema version column",
                include_str!(concat!("../migrations/", $db, "/0003_schema_version.sql")),
            ),
            (
                4,
                "run queue",
                include_str!(concat!("../migrations/", $db, "/0004_runs.sql")),
            ),
            (
                5,
                "run verification",
                include_str!(concat!("../migrations/", $db, "/0005_run_verification.sql")),
            ),
            (
                6,
                "shared session events",
                include_str!(concat!("../migrations/", $db, "/0006_events.sql")),
            ),
        ]
    };
}

#[cfg(feature = "postgres")]
impl sealed::Sealed for Postgres {
    const DIALECT: &'static Dialect = &Dialect {
        name: "postgres",
        schemes: &["postgres", "postgresql"],
        migrations: migrations!("postgres"),
        numbered: true,
        fragments: &[
            ("{now}", "clock_timestamp()"),
            ("{timestamp}", "TIMESTAMPTZ"),
            ("{json}", "?::jsonb"),
            ("{state}", "state::text"),
            (
                "{now_plus_micros}",
                "clock_timestamp() + ?::bigint * interval '1 microsecond'",
            ),
            (
                "{updated_micros}",
                "(EXTRACT(EPOCH FROM updated_at) * 1000000)::bigint",
            ),
            (
                "{if_absent}",
                "ON CONFLICT (agent, user_key, session) DO NOTHING",
            ),
            (
                "{or_take_expired}",
                "ON CONFLICT (agent, user_key, session) DO UPDATE
                   SET token = EXCLUDED.token, fence = hame_state_leases.fence + 1,
                       holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
                   WHERE hame_state_leases.expires_at <= clock_timestamp()",
            ),
            ("{for_share}", "FOR SHARE"),
        ],
        // A session-level advisory lock; PostgreSQL drops it if the connection dies.
        lock: "SELECT 1::bigint FROM pg_advisory_lock(7291046183)",
        unlock: "SELECT 1::bigint FROM pg_advisory_unlock(7291046183)",
        session_id: "SELECT pg_backend_pid()::bigint",
        kill_session: "SELECT 1::bigint FROM pg_terminate_backend($1::int)",
    };

    fn statements() -> &'static Statements {
        static S: LazyLock<Statements> = LazyLock::new(|| Statements::render(Postgres::DIALECT));
        &S
    }
}

#[cfg(feature = "mysql")]
impl sealed::Sealed for MySql {
    const DIALECT: &'static Dialect = &Dialect {
        name: "mysql",
        schemes: &["mysql", "mariadb"],
        migrations: migrations!("mysql"),
        numbered: false,
        fragments: &[
            ("{now}", "UTC_TIMESTAMP(6)"),
            ("{timestamp}", "DATETIME(6)"),
            ("{json}", "?"),
            ("{state}", "state"),
            (
                "{now_plus_micros}",
                "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND",
            ),
            (
                "{updated_micros}",
                "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', updated_at)",
            ),
            // A duplicate key is an error, which `write` reads as a conflict.
            ("{if_absent}", ""),
            // Every assignment tests the old `expires_at` (it is assigned last), so either
            // all columns change (the old lease lapsed) or none does.
            (
                "{or_take_expired}",
                "ON DUPLICATE KEY UPDATE
                   fence = IF(expires_at <= UTC_TIMESTAMP(6), fence + 1, fence),
                   token = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(token), token),
                   holder = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(holder), holder),
                   expires_at = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(expires_at), expires_at)",
            ),
            ("{for_share}", "LOCK IN SHARE MODE"),
        ],
        // DDL commits implicitly in MySQL, so a named lock (held by the connection)
        // serialises concurrent connects instead of a transaction.
        lock: "SELECT GET_LOCK('hame_state_migrate', 60)",
        unlock: "SELECT RELEASE_LOCK('hame_state_migrate')",
        session_id: "SELECT CAST(CONNECTION_ID() AS SIGNED)",
        kill_session: "KILL ?",
    };

    fn statements() -> &'static Statements {
        static S: LazyLock<Statements> = LazyLock::new(|| Statements::render(MySql::DIALECT));
        &S
    }
}

/// The statement templates: `?` placeholders, `{key}` for the key columns, `{…}` for the
/// dialect's fragments. Each statement binds its arguments in the order of its `?`s.
mod template {
    pub const KEY: (&str, &str) = ("{key}", "agent = ? AND user_key = ? AND session = ?");
    pub const CREATE_MIGRATIONS: &str = "CREATE TABLE IF NOT EXISTS hame_state_migrations (
        version BIGINT PRIMARY KEY, description VARCHAR(200) NOT NULL,
        applied_at {timestamp} NOT NULL DEFAULT CURRENT_TIMESTAMP(6))";
    pub const MIGRATION_DONE: &str = "SELECT version FROM hame_state_migrations WHERE version = ?";
    pub const RECORD_MIGRATION: &str =
        "INSERT INTO hame_state_migrations (version, description) VALUES (?, ?)";
    /// (key) -> version, state text
    pub const LOAD: &str = "SELECT version, {state} FROM hame_state_sessions WHERE {key}";
    /// (key) -> version, schema version
    pub const VERSION: &str = "SELECT version, schema_version FROM hame_state_sessions WHERE {key}";
    /// (state, its schema version, key): version 1; no row affected (or a duplicate key)
    /// when present.
    pub const CREATE: &str = "INSERT INTO hame_state_sessions
        (state, schema_version, agent, user_key, session, version, updated_at)
        VALUES ({json}, ?, ?, ?, ?, 1, {now}) {if_absent}";
    /// (state, its schema version, key, lease token, fence): [`CREATE`] if the lease row
    /// holds this lease, which it keeps locked until the write commits.
    pub const CREATE_FENCED: &str = "INSERT INTO hame_state_sessions
        (state, schema_version, agent, user_key, session, version, updated_at)
        SELECT {json}, ?, agent, user_key, session, 1, {now} FROM hame_state_leases
        WHERE {key} AND token = ? AND fence = ? {for_share} {if_absent}";
    /// (state, its schema version, key, expected version, newest readable schema version):
    /// never overwrites a document of a newer hame.
    pub const UPDATE: &str = "UPDATE hame_state_sessions
        SET version = version + 1, state = {json}, schema_version = ?, updated_at = {now}
        WHERE {key} AND version = ? AND schema_version <= ?";
    /// Appended to [`UPDATE`] for a fenced write: (lease token, fence). The lease row stays
    /// locked until the write commits, so a takeover waits for it.
    pub const AND_FENCED: &str = "AND EXISTS (SELECT 1 FROM hame_state_leases l
        WHERE l.agent = hame_state_sessions.agent AND l.user_key = hame_state_sessions.user_key
          AND l.session = hame_state_sessions.session AND l.token = ? AND l.fence = ?
        {for_share})";
    /// (key)
    pub const DELETE: &str = "DELETE FROM hame_state_sessions WHERE {key}";
    /// (agent, user_key) -> session, updated_at in µs since the epoch
    pub const LIST: &str = "SELECT session, {updated_micros} FROM hame_state_sessions
        WHERE agent = ? AND user_key = ? ORDER BY updated_at DESC, session";
    /// (key, token, holder, ttl µs): takes the lease row if absent, released or lapsed.
    pub const ACQUIRE: &str = "INSERT INTO hame_state_leases
        (agent, user_key, session, token, fence, holder, expires_at)
        VALUES (?, ?, ?, ?, 1, ?, {now_plus_micros}) {or_take_expired}";
    /// (key) -> token, fence, holder
    pub const LEASE: &str = "SELECT token, fence, holder FROM hame_state_leases WHERE {key}";
    /// (token, holder, ttl µs, key, old token, old fence): takes over a live lease whose
    /// holder has exited.
    pub const TAKE_OVER: &str = "UPDATE hame_state_leases
        SET token = ?, fence = fence + 1, holder = ?, expires_at = {now_plus_micros}
        WHERE {key} AND token = ? AND fence = ?";
    /// (ttl µs, key, token): extends a live lease of this token.
    pub const RENEW: &str = "UPDATE hame_state_leases SET expires_at = {now_plus_micros}
        WHERE {key} AND token = ? AND expires_at > {now}";
    /// (key, token): blanks and expires the row; its fence stays.
    pub const RELEASE: &str = "UPDATE hame_state_leases SET token = '', expires_at = {now}
        WHERE {key} AND token = ?";
}

/// The statements of one dialect, rendered from [`template`].
#[derive(Debug)]
pub struct Statements {
    create_migrations: String,
    migration_done: String,
    record_migration: String,
    load: String,
    version: String,
    create: String,
    create_fenced: String,
    update: String,
    update_fenced: String,
    delete: String,
    list: String,
    acquire: String,
    lease: String,
    take_over: String,
    renew: String,
    release: String,
}

impl Statements {
    fn render(d: &Dialect) -> Self {
        let r = |t: &str| render(d, t);
        Self {
            create_migrations: r(template::CREATE_MIGRATIONS),
            migration_done: r(template::MIGRATION_DONE),
            record_migration: r(template::RECORD_MIGRATION),
            load: r(template::LOAD),
            version: r(template::VERSION),
            create: r(template::CREATE),
            create_fenced: r(template::CREATE_FENCED),
            update: r(template::UPDATE),
            update_fenced: r(&format!("{} {}", template::UPDATE, template::AND_FENCED)),
            delete: r(template::DELETE),
            list: r(template::LIST),
            acquire: r(template::ACQUIRE),
            lease: r(template::LEASE),
            take_over: r(template::TAKE_OVER),
            renew: r(template::RENEW),
            release: r(template::RELEASE),
        }
    }
}

/// Fills in a template's fragments, then numbers its placeholders if the dialect wants it.
fn render(d: &Dialect, template: &str) -> String {
    let mut sql = template.replace(template::KEY.0, template::KEY.1);
    for (name, text) in d.fragments {
        sql = sql.replace(name, text);
    }
    debug_assert!(!sql.contains('{'), "unrendered fragment in {sql}");
    if !d.numbered {
        return sql;
    }
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

type AnyQuery = Query<'static, sqlx::Any, AnyArguments>;

fn query(sql: &'static str) -> AnyQuery {
    sqlx::query(sql)
}

/// The `user_key` column: `''` for the anonymous tenant (never a valid user id).
pub(crate) fn user_key(user: Option<&str>) -> String {
    user.unwrap_or("").to_owned()
}

/// A lease's TTL or a run's lapse in microseconds, for the SQL interval arithmetic (at
/// least 1 ms).
pub(crate) fn ttl_micros(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX).max(1000)
}

/// Appends the three key columns to a query.
fn bind_key(q: AnyQuery, key: &StateKey) -> AnyQuery {
    q.bind(key.agent().to_owned())
        .bind(user_key(key.user()))
        .bind(key.session().to_owned())
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

fn version_of(v: i64) -> u64 {
    v.max(0).cast_unsigned()
}

impl<D: SqlDialect> SqlStore<D> {
    /// Connects to `url` and applies the migrations (unless `options.migrate` is off).
    ///
    /// [`PostgresStore`] takes `postgres://` and `postgresql://`, [`MySqlStore`] `mysql://`
    /// and `mariadb://`; another scheme is [`Error::Config`]. A failure names the cause but
    /// never the URL's password.
    pub async fn connect(url: &str, options: SqlOptions) -> Result<Self> {
        let d = D::DIALECT;
        let target = crate::redact_url(url).into();
        let url = match url.split_once("://") {
            Some((scheme, rest)) if d.schemes.contains(&scheme.to_ascii_lowercase().as_str()) => {
                format!("{}://{rest}", d.schemes[0])
            }
            _ => {
                return Err(Error::Config(format!(
                    "a {} store URL starts with {}",
                    d.name,
                    d.schemes.join("://, ") + "://"
                )));
            }
        };
        sqlx::any::install_default_drivers();
        let fail = |e: sqlx::Error| Error::backend_at(d.name, &e, &url);
        // One plain connection first, bounded by the acquire timeout, so that a wrong
        // password or a closed port is reported as such, at once (the pool would retry
        // until its timeout and report only "pool timed out").
        let unreachable = |e: sqlx::Error| {
            Error::backend(
                d.name,
                crate::redact::scrub(
                    &format!(
                        "cannot connect to {} at {}: {}",
                        d.name,
                        hame_sql::host_of(&url),
                        hame_sql::connect_cause(&e, options.acquire_timeout)
                    ),
                    &url,
                ),
            )
        };
        let probe = tokio::time::timeout(
            options.acquire_timeout,
            <sqlx::AnyConnection as sqlx::Connection>::connect(&url),
        )
        .await
        .map_err(|_| unreachable(sqlx::Error::PoolTimedOut))?
        .map_err(unreachable)?;
        let _ = sqlx::Connection::close(probe).await;
        let pool = AnyPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect(&url)
            .await
            .map_err(fail)?;
        // A SQL skill repository on this database reads through this pool (ADR 0034).
        hame_sql::share(&url, &pool);
        let store = Self {
            pool,
            target,
            dialect: PhantomData,
        };
        if options.migrate {
            store.migrate().await?;
        }
        Ok(store)
    }

    /// Applies the embedded migrations not yet recorded, under the dialect's lock.
    async fn migrate(&self) -> Result<()> {
        let (d, sql) = (D::DIALECT, D::statements());
        let mut conn = self.pool.acquire().await.map_err(backend::<D>)?;
        let locked: Option<i64> = query(d.lock)
            .fetch_one(&mut *conn)
            .await
            .and_then(|r| r.try_get(0))
            .map_err(backend::<D>)?;
        if locked != Some(1) {
            return Err(Error::backend(
                d.name,
                "timed out waiting for the hame-state migration lock",
            ));
        }
        let result = async {
            sqlx::raw_sql(sql.create_migrations.as_str())
                .execute(&mut *conn)
                .await?;
            for &(version, description, migration) in d.migrations {
                let done = query(&sql.migration_done)
                    .bind(version)
                    .fetch_optional(&mut *conn)
                    .await?;
                if done.is_some() {
                    continue;
                }
                tracing::info!(version, description, "applying hame-state migration");
                // One transaction per migration: atomic on PostgreSQL; MySQL commits DDL
                // implicitly, so its migrations are written to be re-runnable.
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                sqlx::raw_sql(migration).execute(&mut *tx).await?;
                query(&sql.record_migration)
                    .bind(version)
                    .bind(description)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
            Ok::<(), sqlx::Error>(())
        }
        .await;
        let unlocked = query(d.unlock).execute(&mut *conn).await;
        if unlocked.is_err() {
            // Never hand a connection that may still hold the lock back to the pool.
            conn.close_on_drop();
        }
        result.map_err(backend::<D>)?;
        unlocked.map_err(backend::<D>)?;
        Ok(())
    }

    #[cfg(test)]
    pub(crate) async fn session_id(&self) -> Result<i64> {
        query(D::DIALECT.session_id)
            .fetch_one(&self.pool)
            .await
            .and_then(|r| r.try_get(0))
            .map_err(backend::<D>)
    }

    #[cfg(test)]
    pub(crate) async fn kill_session(&self, id: i64) -> Result<()> {
        query(D::DIALECT.kill_session)
            .bind(id)
            .execute(&self.pool)
            .await
            .map_err(backend::<D>)?;
        Ok(())
    }

    /// The stored version and schema version of a key.
    async fn current(&self, key: &StateKey) -> Result<Option<(u64, u64)>> {
        let row = bind_key(query(&D::statements().version), key)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend::<D>)?;
        row.map(|r| Ok((version_of(r.try_get(0)?), version_of(r.try_get(1)?))))
            .transpose()
            .map_err(backend::<D>)
    }

    async fn lease_record(&self, key: &StateKey) -> Result<Option<LeaseRecord>> {
        let row = bind_key(query(&D::statements().lease), key)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend::<D>)?;
        row.map(|r| {
            Ok(LeaseRecord {
                token: r.try_get(0)?,
                fence: version_of(r.try_get(1)?),
                holder: r.try_get(2)?,
            })
        })
        .transpose()
        .map_err(backend::<D>)
    }

    /// The compare-and-set write of `save` and, with a lease, of `save_fenced`.
    async fn write(
        &self,
        key: &StateKey,
        (json, schema): (String, u64),
        expected: Option<u64>,
        lease: Option<&Lease>,
    ) -> Result<u64> {
        let sql = D::statements();
        let statement = match (expected, lease) {
            (None, None) => &sql.create,
            (None, Some(_)) => &sql.create_fenced,
            (Some(_), None) => &sql.update,
            (Some(_), Some(_)) => &sql.update_fenced,
        };
        let schema = i64::try_from(schema).unwrap_or(i64::MAX);
        let mut q = bind_key(query(statement).bind(json).bind(schema), key);
        if let Some(v) = expected {
            // A version beyond i64 is never stored: it matches no row.
            q = q
                .bind(i64::try_from(v).unwrap_or(-1))
                .bind(MAX_SCHEMA.cast_signed());
        }
        if let Some(lease) = lease {
            let fence = i64::try_from(lease.fence()).unwrap_or(-1);
            q = q.bind(lease.token().to_owned()).bind(fence);
        }
        let done = match q.execute(&self.pool).await {
            Ok(r) => r.rows_affected() == 1,
            Err(e) if is_unique_violation(&e) => false,
            Err(e) => return Err(backend::<D>(e)),
        };
        if done {
            return Ok(expected.map_or(1, |v| v + 1));
        }
        if let Some(lease) = lease {
            let record = self.lease_record(key).await?;
            let held = record.is_some_and(|r| r.token == lease.token() && r.fence == lease.fence());
            if !held {
                lease.mark_lost();
                return Err(Error::lease_lost(key));
            }
        }
        let current = self.current(key).await?;
        if let Some((version, schema)) = current
            && Some(version) == expected
            && schema > MAX_SCHEMA
        {
            return Err(Error::too_new(key, schema));
        }
        Err(Error::Conflict {
            key: key.to_string(),
            expected,
            found: current.map(|(version, _)| version),
        })
    }
}

#[async_trait]
impl<D: SqlDialect> LeaseTable for SqlStore<D> {
    async fn take_free(&self, claim: &Claim<'_>) -> Result<Option<LeaseRecord>> {
        let key = claim.key;
        bind_key(query(&D::statements().acquire), key)
            .bind(claim.token.to_owned())
            .bind(claim.holder.to_owned())
            .bind(ttl_micros(claim.ttl))
            .execute(&self.pool)
            .await
            .map_err(backend::<D>)?;
        self.lease_record(key).await
    }

    async fn take_over(&self, claim: &Claim<'_>, old: &LeaseRecord) -> Result<bool> {
        let q = query(&D::statements().take_over)
            .bind(claim.token.to_owned())
            .bind(claim.holder.to_owned())
            .bind(ttl_micros(claim.ttl));
        let n = bind_key(q, claim.key)
            .bind(old.token.clone())
            .bind(i64::try_from(old.fence).unwrap_or(-1))
            .execute(&self.pool)
            .await
            .map_err(backend::<D>)?
            .rows_affected();
        Ok(n == 1)
    }
}

fn backend<D: SqlDialect>(e: sqlx::Error) -> Error {
    Error::backend(D::DIALECT.name, e)
}

#[cfg(any(test, feature = "conformance"))]
#[async_trait]
impl<D: SqlDialect> crate::conformance::RawAccess for SqlStore<D> {
    async fn put_raw(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
        self.delete(key).await?;
        let schema = state
            .get("schema_version")
            .and_then(serde_json::Value::as_u64);
        self.write(key, (state.to_string(), schema.unwrap_or(0)), None, None)
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl<D: SqlDialect> StateStore for SqlStore<D> {
    async fn load(&self, key: &StateKey) -> Result<Option<Stored>> {
        let row = bind_key(query(&D::statements().load), key)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend::<D>)?;
        let Some(row) = row else { return Ok(None) };
        let version: i64 = row.try_get(0).map_err(backend::<D>)?;
        let json: String = row.try_get(1).map_err(backend::<D>)?;
        let state = AgentState::from_slice(json.as_bytes()).map_err(|source| Error::Format {
            key: key.to_string(),
            source,
        })?;
        Ok(Some(Stored {
            state,
            version: version_of(version),
        }))
    }

    async fn put(&self, key: &StateKey, save: Save<'_>) -> Result<u64> {
        self.write(
            key,
            Error::encode(key, save.state)?,
            save.expected,
            save.lease,
        )
        .await
    }

    async fn delete(&self, key: &StateKey) -> Result<bool> {
        let n = bind_key(query(&D::statements().delete), key)
            .execute(&self.pool)
            .await
            .map_err(backend::<D>)?
            .rows_affected();
        Ok(n > 0)
    }

    async fn list_sessions(&self, agent: &str, user: Option<&str>) -> Result<Vec<SessionSummary>> {
        crate::validate_scope(agent, user)?;
        let rows = query(&D::statements().list)
            .bind(agent.to_owned())
            .bind(user_key(user))
            .fetch_all(&self.pool)
            .await
            .map_err(backend::<D>)?;
        rows.iter()
            .map(|r| {
                let micros: i64 = r.try_get(1).map_err(backend::<D>)?;
                Ok(SessionSummary {
                    session: r.try_get(0).map_err(backend::<D>)?,
                    updated_at: DateTime::from_timestamp_micros(micros).unwrap_or_default(),
                })
            })
            .collect()
    }

    async fn try_acquire(&self, key: &StateKey, ttl: Duration) -> Result<Option<Lease>> {
        let Some(grant) = shared_lease::try_take(self, key, ttl).await? else {
            return Ok(None);
        };
        let handle = SqlLease::<D> {
            pool: self.pool.clone(),
            key: key.clone(),
            token: grant.token.clone(),
            dialect: PhantomData,
        };
        Ok(Some(Lease::new(key.clone(), grant, Arc::new(handle))))
    }

    fn is_shared(&self) -> bool {
        true
    }
}

struct SqlLease<D: SqlDialect> {
    pool: Pool<sqlx::Any>,
    key: StateKey,
    token: String,
    dialect: PhantomData<D>,
}

impl<D: SqlDialect> std::fmt::Debug for SqlLease<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlLease")
            .field("backend", &D::DIALECT.name)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<D: SqlDialect> LeaseHandle for SqlLease<D> {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let q = query(&D::statements().renew).bind(ttl_micros(ttl));
        let n = bind_key(q, &self.key)
            .bind(self.token.clone())
            .execute(&self.pool)
            .await
            .map_err(backend::<D>)?
            .rows_affected();
        Error::lease_held(n == 1, &self.key)
    }

    async fn release(&self) -> Result<()> {
        bind_key(query(&D::statements().release), &self.key)
            .bind(self.token.clone())
            .execute(&self.pool)
            .await
            .map_err(backend::<D>)?;
        Ok(())
    }
}
