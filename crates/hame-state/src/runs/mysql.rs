//! [`MySqlRunQueue`]: the run queue on MySQL 8 / MariaDB 10.6+. A claim is one transaction:
//! `SELECT … FOR UPDATE SKIP LOCKED`, then the `UPDATE` of the row it locked. Idle workers
//! poll every [`MYSQL_POLL`] (MySQL has no `LISTEN`).

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::Row;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions, MySqlRow};

use super::{
    Beat, CancelOutcome, Claim, ClaimOptions, Decided, Decision, EndColumns, NewRow, NewRun, Run,
    RunEnd, RunError, RunFilter, RunQueue, Submitted, claim_lost, claim_query, error_json,
    new_token, validate_run_id,
};
use crate::error::{Error, Result};
use crate::key::StateKey;
use crate::sql::{MySqlStore, SqlOptions, ttl_micros};

/// How often an idle worker of a MySQL queue looks for work (250 ms).
pub const MYSQL_POLL: Duration = Duration::from_millis(250);

macro_rules! cols {
    () => {
        "seq, id, agent, user_key, session, idempotency_key, status, input, reply, `usage`, \
         verification, error, approvals, attempts, token, worker, cancel_requested, created_at, updated_at, \
         expires_at"
    };
}

/// What every claim writes (binds: the first three `?`, [`claim_query`]): running, one more
/// attempt, the claim's token and worker, an expiry one lapse from now. A statement goes on
/// with its own `SET`s and its `WHERE`.
macro_rules! take {
    () => {
        "UPDATE hame_runs SET status = 'running', attempts = attempts + 1, token = ?,
             worker = ?, updated_at = UTC_TIMESTAMP(6),
             expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"
    };
}

/// The run queue on MySQL / MariaDB: table `hame_runs` (migration 4 of hame-state, applied
/// on connect). See `docs/replicas.md`.
pub struct MySqlRunQueue {
    pool: MySqlPool,
    target: String,
}

impl std::fmt::Debug for MySqlRunQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlRunQueue")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

fn backend(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::backend("mysql", e)
}

/// Claims tried again after InnoDB chose them as a deadlock victim.
const DEADLOCK_RETRIES: u32 = 5;

/// Whether `e` is InnoDB's deadlock (SQLSTATE 40001): the transaction was rolled back.
fn is_deadlock(e: &Error) -> bool {
    match e {
        Error::Backend { source, .. } => source
            .downcast_ref::<sqlx::Error>()
            .and_then(|e| e.as_database_error())
            .and_then(|d| d.code())
            .is_some_and(|c| c == "40001"),
        _ => false,
    }
}

/// Runs the transaction `once` makes, again (a few times, after a short pause) when InnoDB
/// chose it as a deadlock victim (1213, SQLSTATE 40001): it was rolled back whole.
pub(crate) async fn retry_deadlocks<T, F, Fut>(mut once: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut tries = 0;
    loop {
        match once().await {
            Err(e) if tries < DEADLOCK_RETRIES && is_deadlock(&e) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(5 * u64::from(tries))).await;
            }
            other => return other,
        }
    }
}

fn utc(t: NaiveDateTime) -> DateTime<Utc> {
    t.and_utc()
}

fn to_run(row: &MySqlRow) -> Result<Run> {
    super::run_of(
        row,
        "mysql",
        |r, c| r.try_get::<u64, _>(c).map_err(backend),
        |r, c| {
            let t: Option<NaiveDateTime> = r.try_get(c).map_err(backend)?;
            Ok(t.map(utc))
        },
    )
}

/// A pool on `url` (`mysql://` or `mariadb://`) after hame-state's migrations (unless
/// `options.migrate` is off), with its URL as `mysql://`; its sessions' times are UTC.
pub(crate) async fn pool(url: &str, options: &SqlOptions) -> Result<(MySqlPool, String)> {
    drop(MySqlStore::connect(url, options.clone()).await?);
    let url = match url.split_once("://") {
        Some((_, rest)) => format!("mysql://{rest}"),
        None => url.to_owned(),
    };
    let pool = MySqlPoolOptions::new()
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .after_connect(|conn, _| {
            Box::pin(async move {
                // Times are UTC on the server side too (`UTC_TIMESTAMP(6)`).
                sqlx::query("SET time_zone = '+00:00'")
                    .execute(conn)
                    .await
                    .map(|_| ())
            })
        })
        .connect(&url)
        .await
        .map_err(backend)?;
    Ok((pool, url))
}

impl MySqlRunQueue {
    /// One claim transaction ([`RunQueue::claim`] tries it again after a deadlock).
    async fn claim_once(&self, options: &ClaimOptions) -> Result<Option<Claim>> {
        let token = new_token();
        let mut tx = self.pool.begin().await.map_err(backend)?;
        // The same rule as `runs::pick`.
        let seq: Option<u64> = sqlx::query_scalar(
            "SELECT r.seq FROM hame_runs r
             WHERE r.agent = ? AND (r.status = 'queued'
                   OR (r.status = 'running' AND r.expires_at <= UTC_TIMESTAMP(6)))
               AND NOT EXISTS (
                   SELECT 1 FROM hame_runs o
                   WHERE o.agent = r.agent AND o.user_key = r.user_key
                     AND o.session = r.session AND o.seq <> r.seq
                     AND ((o.status = 'running' AND o.expires_at > UTC_TIMESTAMP(6))
                          OR (o.status IN ('queued', 'running', 'waiting_approval')
                              AND o.seq < r.seq)))
             ORDER BY r.seq LIMIT 1
             FOR UPDATE SKIP LOCKED",
        )
        .bind(&options.agent)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        let Some(seq) = seq else {
            tx.rollback().await.map_err(backend)?;
            return Ok(None);
        };
        claim_query(concat!(take!(), " WHERE seq = ?"), &token, options)
            .bind(seq)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        let row = sqlx::query(concat!("SELECT ", cols!(), " FROM hame_runs WHERE seq = ?"))
            .bind(seq)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(Some(Claim::of(to_run(&row)?, token, options)))
    }

    /// Connects to `url` (`mysql://` or `mariadb://`) and applies hame-state's migrations
    /// (unless `options.migrate` is off).
    pub async fn connect(url: &str, options: SqlOptions) -> Result<Self> {
        let (pool, url) = pool(url, &options).await?;
        Ok(Self {
            pool,
            target: crate::redact_url(&url),
        })
    }

    async fn by_id(&self, id: &str) -> Result<Option<Run>> {
        let row = sqlx::query(concat!("SELECT ", cols!(), " FROM hame_runs WHERE id = ?"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        row.as_ref().map(to_run).transpose()
    }

    /// The run `id` this queue just stored, as stored (MySQL has no `RETURNING`).
    async fn submitted(&self, id: &str) -> Result<Run> {
        self.by_id(id)
            .await?
            .ok_or_else(|| backend("a submitted run vanished"))
    }
}

fn is_duplicate(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// Inserts a new queued run (a duplicate-key error: its idempotency key names an existing
/// one).
async fn insert<'e>(
    db: impl sqlx::MySqlExecutor<'e>,
    row: &NewRow,
) -> std::result::Result<sqlx::mysql::MySqlQueryResult, sqlx::Error> {
    row.insert(
        "INSERT INTO hame_runs (id, agent, user_key, session, idempotency_key, status, input,
            created_at, updated_at)
         VALUES (?, ?, ?, ?, ?, 'queued', ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))",
    )
    .execute(db)
    .await
}

/// What [`MySqlRunQueue::submit_claimed_locked`] did.
enum Locked {
    /// The idempotency key was used before: nothing stored.
    Duplicate,
    /// Stored; claimed unless the session was busy.
    Stored {
        /// The session had a queued or running run.
        busy: bool,
    },
}

/// How long a submit-and-claim waits for its session's lock (another submit of the same
/// session holds it for one short transaction).
const SUBMIT_LOCK_WAIT: Duration = Duration::from_secs(10);

impl MySqlRunQueue {
    /// The transaction of [`RunQueue::submit_claimed`], under the session's named lock:
    /// stores the run and claims it if no other run of the session is queued or running.
    async fn submit_claimed_locked(
        &self,
        conn: &mut sqlx::MySqlConnection,
        row: &NewRow,
        token: &str,
        options: &ClaimOptions,
    ) -> Result<Locked> {
        let NewRow { run, user, .. } = row;
        let mut tx = sqlx::Connection::begin(conn).await.map_err(backend)?;
        // Uncommitted, the new row is invisible to (and locked against) every other claim.
        match insert(&mut *tx, row).await {
            Ok(_) => {}
            Err(e) if is_duplicate(&e) => {
                tx.rollback().await.map_err(backend)?;
                return Ok(Locked::Duplicate);
            }
            Err(e) => return Err(backend(e)),
        }
        let busy: Option<u64> = sqlx::query_scalar(
            "SELECT seq FROM hame_runs
             WHERE agent = ? AND user_key = ? AND session = ? AND id <> ?
               AND status IN ('queued', 'running', 'waiting_approval') LIMIT 1",
        )
        .bind(&run.agent)
        .bind(user)
        .bind(&run.session)
        .bind(&run.id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        if busy.is_none() {
            claim_query(concat!(take!(), " WHERE id = ?"), token, options)
                .bind(&run.id)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
        }
        tx.commit().await.map_err(backend)?;
        Ok(Locked::Stored {
            busy: busy.is_some(),
        })
    }
}

#[async_trait]
impl RunQueue for MySqlRunQueue {
    async fn submit(&self, new: NewRun) -> Result<Submitted> {
        let new = NewRow::of(&new)?;
        match insert(&self.pool, &new).await {
            Ok(_) => Ok(Submitted::stored(self.submitted(&new.run.id).await?)),
            Err(e) if is_duplicate(&e) => {
                let row = new
                    .earlier(concat!(
                        "SELECT ",
                        cols!(),
                        " FROM hame_runs WHERE agent = ? AND user_key = ? AND idempotency_key = ?"
                    ))
                    .fetch_one(&self.pool)
                    .await
                    .map_err(backend)?;
                Ok(Submitted::earlier(to_run(&row)?))
            }
            Err(e) => Err(backend(e)),
        }
    }

    async fn submit_claimed(
        &self,
        new: NewRun,
        options: &ClaimOptions,
    ) -> Result<(Submitted, Option<Claim>)> {
        let row = NewRow::of(&new)?;
        let token = new_token();
        // Submit-and-claims of one session take turns: MySQL has no transaction-scoped
        // advisory lock, so a named lock (`GET_LOCK`) held by this connection across the
        // transaction; the server drops it if the connection dies. Without it two
        // transactions would each miss the other's uncommitted run and both claim.
        let mut conn = self.pool.acquire().await.map_err(backend)?;
        let lock = row.session_lock();
        let got: Option<i64> =
            sqlx::query_scalar("SELECT GET_LOCK(CONCAT('hame_runs:', LEFT(SHA2(?, 256), 48)), ?)")
                .bind(&lock)
                .bind(SUBMIT_LOCK_WAIT.as_secs())
                .fetch_one(&mut *conn)
                .await
                .map_err(backend)?;
        if got != Some(1) {
            return Err(backend(format!(
                "the session's submit lock was not free within {} s",
                SUBMIT_LOCK_WAIT.as_secs()
            )));
        }
        let locked = self
            .submit_claimed_locked(&mut conn, &row, &token, options)
            .await;
        let released =
            sqlx::query("SELECT RELEASE_LOCK(CONCAT('hame_runs:', LEFT(SHA2(?, 256), 48)))")
                .bind(&lock)
                .execute(&mut *conn)
                .await;
        if let Err(e) = released {
            // The connection goes away with the lock rather than back to the pool.
            tracing::warn!(error = %e, "releasing the session's submit lock failed; closing its connection");
            conn.detach();
        } else {
            // Back to the pool before the reads below, which take a connection of their own.
            drop(conn);
        }
        let busy = match locked? {
            Locked::Duplicate => return Ok((self.submit(new).await?, None)),
            Locked::Stored { busy } => busy,
        };
        let run = self.submitted(&row.run.id).await?;
        let claim = (!busy).then(|| Claim::of(run.clone(), token, options));
        Ok((Submitted::stored(run), claim))
    }

    async fn get(&self, id: &str) -> Result<Option<Run>> {
        if validate_run_id(id).is_err() {
            return Ok(None);
        }
        self.by_id(id).await
    }

    async fn list(&self, filter: RunFilter<'_>) -> Result<Vec<Run>> {
        let RunFilter {
            agent,
            user,
            session,
            limit,
        } = filter;
        let rows = sqlx::query(concat!(
            "SELECT ",
            cols!(),
            " FROM hame_runs WHERE agent = ? AND user_key = ? AND (? IS NULL OR session = ?)
              ORDER BY seq DESC LIMIT ?"
        ))
        .bind(agent)
        .bind(user.unwrap_or(""))
        .bind(session)
        .bind(session)
        .bind(u64::try_from(limit).unwrap_or(u64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        rows.iter().map(to_run).collect()
    }

    async fn claim(&self, options: &ClaimOptions) -> Result<Option<Claim>> {
        // Racing claims can make InnoDB pick one as a deadlock victim even with SKIP LOCKED.
        retry_deadlocks(|| self.claim_once(options)).await
    }

    async fn heartbeat(&self, claim: &Claim) -> Result<Beat> {
        sqlx::query(
            "UPDATE hame_runs SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
             WHERE id = ? AND token = ? AND status = 'running'",
        )
        .bind(ttl_micros(claim.lapse))
        .bind(&claim.run.id)
        .bind(&claim.token)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        // MySQL counts changed rows: an unchanged expiry (same microsecond) is 0, so read.
        let row = sqlx::query(
            "SELECT cancel_requested FROM hame_runs
             WHERE id = ? AND token = ? AND status = 'running'",
        )
        .bind(&claim.run.id)
        .bind(&claim.token)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        match row {
            Some(row) => Ok(Beat {
                cancel_requested: row.try_get(0).map_err(backend)?,
            }),
            None => Err(claim_lost(&claim.run.id)),
        }
    }

    async fn finish(&self, claim: &Claim, end: &RunEnd) -> Result<Run> {
        let finish = sqlx::query(
            "UPDATE hame_runs SET status = ?, reply = ?, `usage` = ?, error = ?, approvals = ?,
                 verification = ?, token = '', expires_at = NULL, updated_at = UTC_TIMESTAMP(6)
             WHERE id = ? AND token = ? AND status = 'running'",
        );
        let n = EndColumns::of(&claim.run, end)?
            .bind(finish)
            .bind(&claim.run.id)
            .bind(&claim.token)
            .execute(&self.pool)
            .await
            .map_err(backend)?
            .rows_affected();
        if n != 1 {
            return Err(claim_lost(&claim.run.id));
        }
        self.by_id(&claim.run.id)
            .await?
            .ok_or_else(|| claim_lost(&claim.run.id))
    }

    async fn cancel(&self, id: &str) -> Result<CancelOutcome> {
        if validate_run_id(id).is_err() {
            return Ok(CancelOutcome::NotFound);
        }
        let error = error_json(&RunError::cancelled())?;
        let mut tx = self.pool.begin().await.map_err(backend)?;
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM hame_runs WHERE id = ? FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
        match status.as_deref() {
            Some("queued" | "waiting_approval") => {
                sqlx::query(
                    "UPDATE hame_runs SET status = 'cancelled', error = ?,
                         updated_at = UTC_TIMESTAMP(6) WHERE id = ?",
                )
                .bind(error)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            }
            Some("running") => {
                sqlx::query(
                    "UPDATE hame_runs SET cancel_requested = TRUE,
                         updated_at = UTC_TIMESTAMP(6) WHERE id = ?",
                )
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            }
            _ => {}
        }
        tx.commit().await.map_err(backend)?;
        let Some(run) = self.by_id(id).await? else {
            return Ok(CancelOutcome::NotFound);
        };
        Ok(match status.as_deref() {
            Some("queued" | "waiting_approval") => CancelOutcome::Cancelled(run),
            Some("running") => CancelOutcome::Requested(run),
            _ => CancelOutcome::Finished(run),
        })
    }

    async fn decide(
        &self,
        key: &StateKey,
        decision: &Decision,
        options: &ClaimOptions,
    ) -> Result<Decided> {
        let token = new_token();
        let tx = self.pool.begin().await.map_err(backend)?;
        // The run at the head of the session (the earliest one holding it), locked.
        let head = concat!(
            "SELECT ",
            cols!(),
            " FROM hame_runs WHERE agent = ? AND user_key = ? AND session = ?
               AND status IN ('queued', 'running', 'waiting_approval')
             ORDER BY seq LIMIT 1 FOR UPDATE"
        );
        let (mut tx, run, approvals) =
            match super::decide_head(tx, head, key, decision, to_run, "mysql").await? {
                Ok(resume) => resume,
                Err(answer) => return Ok(*answer),
            };
        claim_query(
            concat!(
                take!(),
                ", approvals = ?, cancel_requested = FALSE WHERE id = ?"
            ),
            &token,
            options,
        )
        .bind(approvals.to_string())
        .bind(&run.id)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        let run = self
            .by_id(&run.id)
            .await?
            .ok_or_else(|| backend("a decided run vanished"))?;
        Ok(Decided::Claimed(Claim::of(run, token, options)))
    }

    async fn purge_finished(
        &self,
        agent: &str,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<usize> {
        static PURGE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!(
                "DELETE FROM hame_runs WHERE status IN ({}) AND updated_at < ? AND agent = ?
                 ORDER BY updated_at, seq LIMIT ?",
                super::purgeable_sql()
            )
        });
        let done = sqlx::query(PURGE.as_str())
            .bind(before.naive_utc())
            .bind(agent)
            .bind(u64::try_from(limit).unwrap_or(u64::MAX))
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    async fn wait_for_work(&self, max: Duration) -> Result<()> {
        tokio::time::sleep(max.min(MYSQL_POLL)).await;
        Ok(())
    }

    fn is_shared(&self) -> bool {
        true
    }
}
