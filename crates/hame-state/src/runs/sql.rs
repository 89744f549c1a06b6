//! [`PgRunQueue`]: the run queue on PostgreSQL. Claims are one statement, `SELECT … FOR
//! UPDATE SKIP LOCKED` inside an `UPDATE … RETURNING`; `NOTIFY hame_runs` wakes idle
//! workers after a submit or a finish (the next run of a session may now be free).

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions, PgRow};

use super::{
    Beat, CancelOutcome, Claim, ClaimOptions, Decided, Decision, EndColumns, NewRow, NewRun, Run,
    RunEnd, RunError, RunFilter, RunQueue, RunStatus, Submitted, claim_lost, claim_query,
    error_json, new_token, validate_run_id,
};
use crate::error::{Error, Result};
use crate::key::StateKey;
use crate::sql::{PostgresStore, SqlOptions, ttl_micros};

/// How often an idle worker looks for work when no `NOTIFY` arrives (1 s): claims that
/// lapsed are found this way, and so is work if the listening connection is down.
pub const SQL_POLL: Duration = Duration::from_secs(1);

const CHANNEL: &str = "hame_runs";
/// The channel of cancel wake-ups; the payload is the run id.
const CANCEL_CHANNEL: &str = "hame_runs_cancel";

/// What every claim writes (binds `$1` to `$3`: [`claim_query`]): running, one more
/// attempt, the claim's token and worker, an expiry one lapse from now. A statement goes on
/// with its own `SET`s or its `FROM` / `WHERE`.
const TAKE: &str = "UPDATE hame_runs SET status = 'running', attempts = attempts + 1, token = $1,
                 worker = $2, updated_at = clock_timestamp(),
                 expires_at = clock_timestamp() + $3 * interval '1 microsecond'";

const COLS: &str = "seq, id, agent, user_key, session, idempotency_key, status, input, reply, \
    usage, verification, error, approvals, attempts, token, worker, cancel_requested, created_at, updated_at, \
    expires_at";

/// The statements, rendered once (`COLS` filled in).
struct Statements {
    by_id: String,
    submit: String,
    /// `submit`, and the wake-up of idle workers when it inserted (sent at its commit): one
    /// round trip.
    submit_notify: String,
    by_key: String,
    list: String,
    claim: String,
    claim_new: String,
    finish: String,
    cancel: String,
    head: String,
    decide: String,
    purge: String,
}

static SQL: LazyLock<Statements> = LazyLock::new(|| {
    let submit = format!(
        "INSERT INTO hame_runs (id, agent, user_key, session, idempotency_key, status, input,
                created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, 'queued', $6, clock_timestamp(), clock_timestamp())
             ON CONFLICT (agent, user_key, idempotency_key) DO NOTHING
             RETURNING {COLS}"
    );
    Statements {
    by_id: format!("SELECT {COLS} FROM hame_runs WHERE id = $1"),
    submit_notify: with_notify(&submit),
    submit,
    by_key: format!(
        "SELECT {COLS} FROM hame_runs
             WHERE agent = $1 AND user_key = $2 AND idempotency_key = $3"
    ),
    list: format!(
        "SELECT {COLS} FROM hame_runs
             WHERE agent = $1 AND user_key = $2 AND ($3::text IS NULL OR session = $3)
             ORDER BY seq DESC LIMIT $4"
    ),
    claim: format!(
        "WITH next AS (
                SELECT r.seq FROM hame_runs r
                WHERE r.agent = $4 AND (r.status = 'queued'
                       OR (r.status = 'running' AND r.expires_at <= clock_timestamp()))
                  AND NOT EXISTS (
                      SELECT 1 FROM hame_runs o
                      WHERE o.agent = r.agent AND o.user_key = r.user_key
                        AND o.session = r.session AND o.seq <> r.seq
                        AND ((o.status = 'running' AND o.expires_at > clock_timestamp())
                             OR (o.status IN ('queued', 'running', 'waiting_approval')
                                 AND o.seq < r.seq)))
                ORDER BY r.seq LIMIT 1
                FOR UPDATE OF r SKIP LOCKED)
             {TAKE}
             FROM next WHERE hame_runs.seq = next.seq
             RETURNING {}",
        COLS.split(", ")
            .map(|c| format!("hame_runs.{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    ),
    // The run just inserted, when no other run of its session holds it.
    claim_new: format!(
        "{TAKE}
             WHERE id = $4 AND status = 'queued' AND NOT EXISTS (
                 SELECT 1 FROM hame_runs o
                 WHERE o.agent = hame_runs.agent AND o.user_key = hame_runs.user_key
                   AND o.session = hame_runs.session AND o.id <> hame_runs.id
                   AND o.status IN ('queued', 'running', 'waiting_approval'))
             RETURNING {COLS}"
    ),
    // The session's next run may be free now: idle workers are woken at the commit.
    finish: with_notify(&format!(
        "UPDATE hame_runs SET status = $3, reply = $4, usage = $5, error = $6,
                 approvals = $7, verification = $8, token = '', expires_at = NULL, updated_at = clock_timestamp()
             WHERE id = $1 AND token = $2 AND status = 'running'
             RETURNING {COLS}"
    )),
    cancel: format!(
        "UPDATE hame_runs SET
                 cancel_requested = (status = 'running'),
                 error = CASE WHEN status = 'running' THEN error ELSE $2 END,
                 status = CASE WHEN status = 'running' THEN status ELSE 'cancelled' END,
                 updated_at = clock_timestamp()
             WHERE id = $1 AND status IN ('queued', 'running', 'waiting_approval')
             RETURNING {COLS}"
    ),
    // The run at the head of a session (the earliest one holding it), locked.
    head: format!(
        "SELECT {COLS} FROM hame_runs
             WHERE agent = $1 AND user_key = $2 AND session = $3
               AND status IN ('queued', 'running', 'waiting_approval')
             ORDER BY seq LIMIT 1 FOR UPDATE"
    ),
    decide: format!(
        "{TAKE}, approvals = $5, cancel_requested = FALSE
             WHERE id = $4 AND status = 'waiting_approval'
             RETURNING {COLS}"
    ),
    purge: format!(
        "DELETE FROM hame_runs WHERE seq IN (
             SELECT seq FROM hame_runs
             WHERE status IN ({}) AND updated_at < $1 AND agent = $3
             ORDER BY updated_at, seq LIMIT $2)",
        super::purgeable_sql()
    ),
}
});

/// The run queue on PostgreSQL: table `hame_runs` (migration 4 of hame-state, applied on
/// connect). See `docs/runs.md`.
pub struct PgRunQueue {
    pool: PgPool,
    url: String,
    listener: tokio::sync::Mutex<Option<PgListener>>,
    cancels: super::CancelWatch,
}

impl std::fmt::Debug for PgRunQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgRunQueue")
            .field("target", &crate::redact_url(&self.url))
            .finish_non_exhaustive()
    }
}

fn backend(e: sqlx::Error) -> Error {
    Error::backend("postgres", e)
}

fn to_run(row: &PgRow) -> Result<Run> {
    super::run_of(
        row,
        "postgres",
        |r, c| {
            Ok(r.try_get::<i64, _>(c)
                .map_err(backend)?
                .max(0)
                .cast_unsigned())
        },
        |r, c| r.try_get(c).map_err(backend),
    )
}

/// A pool on `url` after hame-state's migrations: the state store's connect checks the URL,
/// reports an unreachable server in one line and applies them (unless `options.migrate` is
/// off).
pub(crate) async fn pool(url: &str, options: &SqlOptions) -> Result<PgPool> {
    drop(PostgresStore::connect(url, options.clone()).await?);
    PgPoolOptions::new()
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .connect(url)
        .await
        .map_err(backend)
}

impl PgRunQueue {
    /// Connects to `url` (`postgres://` or `postgresql://`) and applies hame-state's
    /// migrations (unless `options.migrate` is off).
    pub async fn connect(url: &str, options: SqlOptions) -> Result<Self> {
        let pool = pool(url, &options).await?;
        Ok(Self {
            pool,
            url: url.to_owned(),
            listener: tokio::sync::Mutex::new(None),
            cancels: super::CancelWatch::new(),
        })
    }

    async fn notify(&self) {
        if let Err(e) = sqlx::query("SELECT pg_notify($1, '')")
            .bind(CHANNEL)
            .execute(&self.pool)
            .await
        {
            tracing::debug!(error = %e, "run queue: NOTIFY failed; idle workers poll");
        }
    }

    async fn by_id(&self, id: &str) -> Result<Option<Run>> {
        let row = sqlx::query(SQL.by_id.as_str())
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        row.as_ref().map(to_run).transpose()
    }
}

/// `statement` (an `… RETURNING` of runs) with a `NOTIFY` on the workers' channel when it
/// returned a run, in the same statement: sent at its commit, no round trip of its own.
fn with_notify(statement: &str) -> String {
    format!("WITH r AS ({statement}) SELECT r.*, pg_notify('{CHANNEL}', '') FROM r")
}

/// Inserts a new queued run with `statement` (`SQL.submit` or `SQL.submit_notify`);
/// `None`: its idempotency key names an existing one.
async fn insert<'e>(
    db: impl sqlx::PgExecutor<'e>,
    statement: &'static str,
    row: &NewRow,
) -> Result<Option<PgRow>> {
    row.insert(statement)
        .fetch_optional(db)
        .await
        .map_err(backend)
}

#[async_trait]
impl RunQueue for PgRunQueue {
    async fn submit(&self, new: NewRun) -> Result<Submitted> {
        let new = NewRow::of(&new)?;
        if let Some(row) = insert(&self.pool, SQL.submit_notify.as_str(), &new).await? {
            return Ok(Submitted::stored(to_run(&row)?));
        }
        let row = new
            .earlier(SQL.by_key.as_str())
            .fetch_one(&self.pool)
            .await
            .map_err(backend)?;
        Ok(Submitted::earlier(to_run(&row)?))
    }

    async fn submit_claimed(
        &self,
        new: NewRun,
        options: &ClaimOptions,
    ) -> Result<(Submitted, Option<Claim>)> {
        let row = NewRow::of(&new)?;
        let token = new_token();
        let mut tx = self.pool.begin().await.map_err(backend)?;
        // Submit-and-claims of one session take turns (a plain claim sees only committed
        // runs, so it cannot take the new run before the commit).
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(row.session_lock())
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
        let Some(inserted) = insert(&mut *tx, SQL.submit.as_str(), &row).await? else {
            tx.rollback().await.map_err(backend)?;
            return Ok((self.submit(new).await?, None));
        };
        let claimed = claim_query(SQL.claim_new.as_str(), &token, options)
            .bind(&row.run.id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        let Some(claimed) = claimed else {
            self.notify().await;
            return Ok((Submitted::stored(to_run(&inserted)?), None));
        };
        let claim = Claim::of(to_run(&claimed)?, token, options);
        Ok((Submitted::stored(claim.run.clone()), Some(claim)))
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
        let rows = sqlx::query(SQL.list.as_str())
            .bind(agent)
            .bind(user.unwrap_or(""))
            .bind(session)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?;
        rows.iter().map(to_run).collect()
    }

    async fn claim(&self, options: &ClaimOptions) -> Result<Option<Claim>> {
        let token = new_token();
        // The same rule as `runs::pick`: the earliest queued (or lapsed) run of a session
        // with nothing earlier active and nothing live.
        let row = claim_query(SQL.claim.as_str(), &token, options)
            .bind(&options.agent)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(Claim::of(to_run(&row)?, token, options)))
    }

    async fn heartbeat(&self, claim: &Claim) -> Result<Beat> {
        let row = sqlx::query(
            "UPDATE hame_runs SET expires_at = clock_timestamp() + $3 * interval '1 microsecond'
             WHERE id = $1 AND token = $2 AND status = 'running'
             RETURNING cancel_requested",
        )
        .bind(&claim.run.id)
        .bind(&claim.token)
        .bind(ttl_micros(claim.lapse))
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        let Some(row) = row else {
            return Err(claim_lost(&claim.run.id));
        };
        Ok(Beat {
            cancel_requested: row.try_get(0).map_err(backend)?,
        })
    }

    async fn finish(&self, claim: &Claim, end: &RunEnd) -> Result<Run> {
        let finish = sqlx::query(SQL.finish.as_str())
            .bind(&claim.run.id)
            .bind(&claim.token);
        let row = EndColumns::of(&claim.run, end)?
            .bind(finish)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        let Some(row) = row else {
            return Err(claim_lost(&claim.run.id));
        };
        to_run(&row)
    }

    async fn cancel(&self, id: &str) -> Result<CancelOutcome> {
        if validate_run_id(id).is_err() {
            return Ok(CancelOutcome::NotFound);
        }
        let error = error_json(&RunError::cancelled())?;
        let row = sqlx::query(SQL.cancel.as_str())
            .bind(id)
            .bind(error)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?;
        Ok(match row {
            Some(row) => {
                let run = to_run(&row)?;
                if run.status == RunStatus::Cancelled {
                    // The session's next run may be free now.
                    self.notify().await;
                    CancelOutcome::Cancelled(run)
                } else {
                    // Wakes the run's worker now; its heartbeat would find the flag anyway.
                    if let Err(e) = sqlx::query("SELECT pg_notify($1, $2)")
                        .bind(CANCEL_CHANNEL)
                        .bind(&run.id)
                        .execute(&self.pool)
                        .await
                    {
                        tracing::debug!(error = %e, "run queue: cancel NOTIFY failed; the heartbeat carries it");
                    }
                    CancelOutcome::Requested(run)
                }
            }
            None => match self.by_id(id).await? {
                Some(run) => CancelOutcome::Finished(run),
                None => CancelOutcome::NotFound,
            },
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
        let head = SQL.head.as_str();
        let (mut tx, run, approvals) =
            match super::decide_head(tx, head, key, decision, to_run, "postgres").await? {
                Ok(resume) => resume,
                Err(answer) => return Ok(*answer),
            };
        let row = claim_query(SQL.decide.as_str(), &token, options)
            .bind(&run.id)
            .bind(approvals.to_string())
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        Ok(Decided::Claimed(Claim::of(to_run(&row)?, token, options)))
    }

    async fn purge_finished(
        &self,
        agent: &str,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<usize> {
        let done = sqlx::query(SQL.purge.as_str())
            .bind(before)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .bind(agent)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    async fn wait_for_work(&self, max: Duration) -> Result<()> {
        let max = max.min(SQL_POLL);
        let mut guard = self.listener.lock().await;
        if guard.is_none() {
            match PgListener::connect_with(&self.pool).await {
                Ok(mut l) => match l.listen(CHANNEL).await {
                    Ok(()) => *guard = Some(l),
                    Err(e) => tracing::debug!(error = %e, "run queue: LISTEN failed; polling"),
                },
                Err(e) => tracing::debug!(error = %e, "run queue: LISTEN failed; polling"),
            }
        }
        match guard.as_mut() {
            Some(l) => match tokio::time::timeout(max, l.try_recv()).await {
                Ok(Ok(Some(_)) | Ok(None)) | Err(_) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "run queue: listening connection lost; polling");
                    *guard = None;
                    drop(guard);
                    tokio::time::sleep(max).await;
                }
            },
            None => {
                drop(guard);
                tokio::time::sleep(max).await;
            }
        }
        Ok(())
    }

    async fn wait_for_cancel(&self, id: &str, max: Duration) -> Result<()> {
        let pool = self.pool.clone();
        self.cancels.start_once(|tx| listen_cancels(pool, tx));
        self.cancels.wait(id, max).await;
        Ok(())
    }

    fn is_shared(&self) -> bool {
        true
    }
}

/// `LISTEN hame_runs_cancel` on a connection of its own, forwarding each run id to `tx`;
/// reconnects after a second when the connection breaks.
async fn listen_cancels(pool: PgPool, tx: tokio::sync::broadcast::Sender<String>) {
    loop {
        let listener = match PgListener::connect_with(&pool).await {
            Ok(mut l) => l.listen(CANCEL_CHANNEL).await.map(|()| l),
            Err(e) => Err(e),
        };
        match listener {
            Ok(mut l) => loop {
                match l.try_recv().await {
                    Ok(Some(n)) => {
                        let _ = tx.send(n.payload().to_owned());
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "run queue: cancel listener lost; reconnecting");
                        break;
                    }
                }
            },
            Err(e) => tracing::debug!(error = %e, "run queue: LISTEN for cancels failed; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
