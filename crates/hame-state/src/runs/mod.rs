//! Durable runs: a queue of agent work that any replica can claim ([`RunQueue`]).
//!
//! A [`Run`] is one unit of agent work for a session (today: a user message), with an id, a
//! [`RunStatus`], its reply, usage and error. Runs live in the state backend the
//! deployment already uses ([`open_queue`] takes the same URL as [`crate::open`]):
//!
//! | backend | claim | wake-up of idle workers |
//! |---|---|---|
//! | [`InMemoryRunQueue`] (`memory://`) | under a mutex | in-process notify |
//! | `JsonRunQueue` (a path) | under an OS lock of `<root>/.runs/queue.lock` | polling every [`LOCAL_POLL`] |
//! | `PgRunQueue` (`postgres://`) | `SELECT … FOR UPDATE SKIP LOCKED` | `LISTEN/NOTIFY` (polling every [`SQL_POLL`] as a fallback) |
//! | `MySqlRunQueue` (`mysql://`) | `SELECT … FOR UPDATE SKIP LOCKED`, then `UPDATE` | polling every `MYSQL_POLL` (250 ms) |
//! | `RedisRunQueue` (`redis://`) | `XREADGROUP` in a consumer group (`XAUTOCLAIM` after a lapse), one Lua script | `XREAD BLOCK` on a wake-up stream (at most `REDIS_POLL`, 1 s) |
//!
//! A claim is fenced: each claim of a run gets a new token and a larger
//! [`Claim::attempt`]; heartbeats and the final write carry them, so an owner whose run was
//! reclaimed (it stopped heartbeating for longer than its lapse) can no longer write. The
//! turn itself runs under the session's fenced lease ([`crate::Lease`]), taken by the
//! harness, which lapses ([`crate::DEFAULT_LEASE_TTL`], 10 s) before a run is reclaimed
//! ([`DEFAULT_RUN_LAPSE`], 14 s).
#![allow(clippy::module_name_repetitions)]

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::key::{StateKey, validate_id};

mod decide;
mod local;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "postgres")]
mod sql;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub(crate) use decide::decide_on;
pub use decide::pick;
#[cfg(feature = "json")]
pub use local::JsonRunQueue;
pub use local::{InMemoryRunQueue, LOCAL_POLL};
#[cfg(feature = "mysql")]
pub use mysql::{MYSQL_POLL, MySqlRunQueue};
#[cfg(feature = "mysql")]
pub(crate) use mysql::{pool as mysql_pool, retry_deadlocks};
#[cfg(feature = "redis")]
pub use redis::{REDIS_POLL, RedisRunQueue};
#[cfg(feature = "postgres")]
pub(crate) use sql::pool as pg_pool;
#[cfg(feature = "postgres")]
pub use sql::{PgRunQueue, SQL_POLL};

/// How long a running run may go without a heartbeat before another worker reclaims it
/// (14 s). Workers heartbeat every [`HEARTBEAT_EVERY`].
///
/// Failover (a worker's death → its run claimed elsewhere) is at most this lapse plus one
/// idle wait of the other workers (at most 1 s: `SQL_POLL`, `REDIS_POLL`; less on the
/// other backends): 14 s + 1 s = 15 s, the bound. The claim's expiry is the last
/// heartbeat before the death plus the lapse, so never later than death + lapse. It stays
/// longer than the session lease ([`crate::DEFAULT_LEASE_TTL`], 10 s), so the new owner
/// never meets the dead one's lease.
pub const DEFAULT_RUN_LAPSE: Duration = Duration::from_secs(14);
/// How often a worker heartbeats a run it executes (1 s): the heartbeat also reads the
/// run's cancel flag, so a cancel sent to any replica stops the run within about this long.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// Largest accepted `Idempotency-Key`, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 200;
/// How long finished runs are kept by default before a worker deletes them (7 days;
/// `[runs] keep_finished` in hame.toml).
pub const DEFAULT_KEEP_FINISHED: Duration = Duration::from_secs(7 * 24 * 3600);
/// Largest run message, in bytes (1 MiB).
pub const MAX_RUN_INPUT: usize = 1024 * 1024;

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Waiting for a worker.
    Queued,
    /// A worker executes it (and heartbeats it).
    Running,
    /// It ended with tool calls that wait for a decision.
    WaitingApproval,
    /// It ended with a reply.
    Completed,
    /// It ended with a reply that its required checks do not back: a check still failed
    /// after the completion gate's extra steps (issue #33, `docs/evidence.md`). The run's
    /// [`Run::verification`] holds the failing evidence.
    Unverified,
    /// It ended with an error.
    Failed,
    /// It was cancelled.
    Cancelled,
}

impl RunStatus {
    /// Every status, in the order of a run's life (queued first, the ends last).
    pub const ALL: [Self; 7] = [
        Self::Queued,
        Self::Running,
        Self::WaitingApproval,
        Self::Completed,
        Self::Unverified,
        Self::Failed,
        Self::Cancelled,
    ];

    /// The status as text (`queued`, `running`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::WaitingApproval => "waiting_approval",
            Self::Completed => "completed",
            Self::Unverified => "unverified",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Parses [`as_str`](Self::as_str).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "waiting_approval" => Self::WaitingApproval,
            "completed" => Self::Completed,
            "unverified" => Self::Unverified,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }

    /// Whether [`RunQueue::purge_finished`] may delete a run in this status: `completed`,
    /// `unverified`, `failed` and `cancelled`; never `waiting_approval` (its approvals still wait for a
    /// decision), `queued` or `running`.
    pub fn is_purgeable(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Unverified | Self::Failed | Self::Cancelled
        )
    }

    /// Whether no worker executes or will claim the run: it ended (`completed`,
    /// `unverified`, `failed`, `cancelled`: nothing changes it any more), or it waits for a
    /// decision (`waiting_approval`: only [`RunQueue::decide`] or a cancel change it).
    pub fn is_finished(self) -> bool {
        !matches!(self, Self::Queued | Self::Running)
    }

    /// Whether the run holds its session: `queued`, `running` and `waiting_approval`. A
    /// later run of the session is claimed only when no earlier one holds it, so a session
    /// waiting for a decision starts nothing else until the decision resumes its run (or
    /// the run is cancelled).
    pub fn holds_session(self) -> bool {
        matches!(self, Self::Queued | Self::Running | Self::WaitingApproval)
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a run asks the agent to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunInput {
    /// A user message for the session.
    Message {
        /// The text.
        message: String,
        /// Values for the turn's runtime context (`RuntimeContext::extras`): what a
        /// `POST …/messages` request adds to its turn (a caller's budget, required checks,
        /// a goal), so a worker that takes the run over runs the same turn.
        #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
        extras: serde_json::Map<String, serde_json::Value>,
        /// The checks the reply must pass (names of the agent's `[[verify]]`; empty: none),
        /// the completion gate of `docs/evidence.md`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        verify: Vec<String>,
        /// The gate's check rounds (`None`: the default, 2).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verify_attempts: Option<u32>,
        /// The submitting request's W3C trace context (`traceparent`, `tracestate`), which
        /// the worker that executes the run continues (empty: none; stored with the input,
        /// so every backend keeps it without a schema change).
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        trace: std::collections::BTreeMap<String, String>,
    },
    /// A background subagent task (`agent_spawn` / `agent_send` with `background`): the
    /// run's session is the child's; the task record (under the parent's session) says
    /// what to run, and its result goes back to the parent through the record.
    SubagentTask {
        /// The task id (`task-` and 12 hex digits).
        task_id: String,
        /// The parent's session, whose records hold the task.
        parent_session: String,
        /// Runtime-context extras the child inherits from the parent call (plan mode,
        /// deny rules).
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        inherit: std::collections::BTreeMap<String, serde_json::Value>,
    },
}

/// Why a run failed: a stable code and one line for the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunError {
    /// Stable code (`model_error`, `cancelled`, `lease_lost`, …).
    pub code: String,
    /// One line.
    pub message: String,
}

impl RunError {
    /// The error of a cancelled run.
    pub fn cancelled() -> Self {
        Self {
            code: "cancelled".into(),
            message: "the run was cancelled".into(),
        }
    }
}

/// How a run ended: what the worker writes with [`RunQueue::finish`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RunEnd {
    /// A reply.
    Completed {
        /// The reply text.
        reply: String,
        /// Token usage, as JSON.
        usage: serde_json::Value,
        /// The completion gate's verdict when the run had required checks (all passed), as
        /// JSON `{status, evidence, extra_steps}`.
        verification: Option<serde_json::Value>,
    },
    /// A reply whose required checks still failed after the gate's extra steps.
    Unverified {
        /// The reply text.
        reply: String,
        /// Token usage, as JSON.
        usage: serde_json::Value,
        /// The gate's verdict with the failing evidence, as JSON `{status, evidence,
        /// extra_steps}`.
        verification: serde_json::Value,
    },
    /// Tool calls wait for decisions (the approvals, as JSON).
    WaitingApproval(serde_json::Value),
    /// An error.
    Failed(RunError),
    /// Stopped by a cancel.
    Cancelled,
}

impl RunEnd {
    /// The status a run gets with this end.
    pub fn status(&self) -> RunStatus {
        match self {
            Self::Completed { .. } => RunStatus::Completed,
            Self::Unverified { .. } => RunStatus::Unverified,
            Self::WaitingApproval(_) => RunStatus::WaitingApproval,
            Self::Failed(_) => RunStatus::Failed,
            Self::Cancelled => RunStatus::Cancelled,
        }
    }

    /// Writes this end into `run` (status, reply, usage, verification, approvals, error).
    pub fn apply(&self, run: &mut Run) {
        run.status = self.status();
        match self {
            Self::Completed {
                reply,
                usage,
                verification,
            } => run.replied(reply, usage, verification.clone()),
            Self::Unverified {
                reply,
                usage,
                verification,
            } => run.replied(reply, usage, Some(verification.clone())),
            Self::WaitingApproval(a) => run.approvals = Some(a.clone()),
            Self::Failed(e) => run.error = Some(e.clone()),
            Self::Cancelled => run.error = Some(RunError::cancelled()),
        }
    }
}

/// One run, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Run {
    /// `run-` and 32 hex digits.
    pub id: String,
    /// Agent id.
    pub agent: String,
    /// User id; `None`: the anonymous tenant.
    pub user: Option<String>,
    /// Session id.
    pub session: String,
    /// Order of submission across the queue (larger is later).
    pub seq: u64,
    /// Where it is.
    pub status: RunStatus,
    /// What to do.
    pub input: RunInput,
    /// The `Idempotency-Key` it was submitted with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The reply of a completed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    /// Token usage of a completed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<serde_json::Value>,
    /// The completion gate's verdict of a run with required checks (`completed` or
    /// `unverified`): `{status, evidence, extra_steps}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<serde_json::Value>,
    /// The error of a failed or cancelled run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    /// The tool calls a `waiting_approval` run waits on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<serde_json::Value>,
    /// How many times it was claimed (the fence of its current claim).
    pub attempts: u64,
    /// The worker of its current (or last) claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// A cancel was asked for while it ran.
    #[serde(default)]
    pub cancel_requested: bool,
    /// When it was submitted.
    pub created: DateTime<Utc>,
    /// When it last changed.
    pub updated: DateTime<Utc>,
    /// A running run's claim lapses then unless heartbeated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<DateTime<Utc>>,
    /// The token of the current claim (never shown to callers).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) token: String,
}

impl Run {
    /// The session this run belongs to.
    pub fn key(&self) -> Result<StateKey> {
        StateKey::new(&self.agent, self.user.as_deref(), &self.session)
    }

    /// Whether `(agent, user)` owns it.
    pub fn is_owned_by(&self, agent: &str, user: Option<&str>) -> bool {
        self.agent == agent && self.user.as_deref() == user
    }

    /// The decisions recorded on its approvals ([`RunQueue::decide`]) that its next leg
    /// resumes the suspended turn with: `(approval id, decision)` pairs, in the approvals'
    /// order. Empty for a run that has not waited for a decision.
    pub fn decisions(&self) -> Vec<(String, serde_json::Value)> {
        decide::decisions(self.approvals.as_ref())
    }

    /// Sets the reply of a run that ended with one.
    fn replied(
        &mut self,
        reply: &str,
        usage: &serde_json::Value,
        verification: Option<serde_json::Value>,
    ) {
        self.reply = Some(reply.to_owned());
        self.usage = Some(usage.clone());
        self.verification = verification;
    }

    /// A new queued run (backends fill in `seq`).
    pub(crate) fn new(new: &NewRun, now: DateTime<Utc>) -> Self {
        Self {
            id: new.id.clone(),
            agent: new.key.agent().to_owned(),
            user: new.key.user().map(str::to_owned),
            session: new.key.session().to_owned(),
            seq: 0,
            status: RunStatus::Queued,
            input: new.input.clone(),
            idempotency_key: new.idempotency_key.clone(),
            reply: None,
            usage: None,
            verification: None,
            error: None,
            approvals: None,
            attempts: 0,
            worker: None,
            cancel_requested: false,
            created: now,
            updated: now,
            expires: None,
            token: String::new(),
        }
    }
}

/// A run to submit.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NewRun {
    /// The id the run gets (`run-` and 32 hex digits), chosen before the submit so that
    /// the caller can write it down first (a subagent task's record names its run).
    pub id: String,
    /// The session.
    pub key: StateKey,
    /// What to do.
    pub input: RunInput,
    /// Submitting again with the same key for the same agent and user returns the first
    /// run instead of a new one.
    pub idempotency_key: Option<String>,
}

impl NewRun {
    /// A message run, checked: the message at most [`MAX_RUN_INPUT`] bytes, the
    /// idempotency key 1 to [`MAX_IDEMPOTENCY_KEY`] visible ASCII characters.
    pub fn message(
        key: StateKey,
        message: impl Into<String>,
        idempotency_key: Option<String>,
    ) -> Result<Self> {
        let message = message.into();
        if message.len() > MAX_RUN_INPUT {
            return Err(Error::InvalidInput(format!(
                "a run message is at most {MAX_RUN_INPUT} bytes; this one has {}",
                message.len()
            )));
        }
        if let Some(k) = &idempotency_key {
            validate_idempotency_key(k)?;
        }
        Ok(Self {
            id: new_run_id(),
            key,
            input: RunInput::Message {
                message,
                extras: serde_json::Map::new(),
                verify: Vec::new(),
                verify_attempts: None,
                trace: Default::default(),
            },
            idempotency_key,
        })
    }

    /// With these values for the turn's runtime context (see [`RunInput::Message`]).
    pub fn with_extras(mut self, values: serde_json::Map<String, serde_json::Value>) -> Self {
        if let RunInput::Message { extras, .. } = &mut self.input {
            *extras = values;
        }
        self
    }

    /// A background subagent task run on the child's session `child` (no idempotency key:
    /// the run id, written into the task record before the submit, links the two).
    pub fn subagent_task(
        child: StateKey,
        task_id: impl Into<String>,
        parent_session: impl Into<String>,
        inherit: std::collections::BTreeMap<String, serde_json::Value>,
    ) -> Self {
        Self {
            id: new_run_id(),
            key: child,
            input: RunInput::SubagentTask {
                task_id: task_id.into(),
                parent_session: parent_session.into(),
                inherit,
            },
            idempotency_key: None,
        }
    }

    /// With required checks and the gate's rounds (a message run; names are checked
    /// against the agent's declared checks by the caller, which knows them).
    pub fn with_verify(mut self, names: Vec<String>, attempts: Option<u32>) -> Self {
        if let RunInput::Message {
            verify,
            verify_attempts,
            ..
        } = &mut self.input
        {
            *verify = names;
            *verify_attempts = attempts;
        }
        self
    }

    /// With the submitting request's W3C trace context (at most 8 entries of at most 512
    /// bytes each are kept: a carrier is two short headers).
    pub fn with_trace(mut self, carrier: impl IntoIterator<Item = (String, String)>) -> Self {
        if let RunInput::Message { trace, .. } = &mut self.input {
            trace.extend(
                carrier
                    .into_iter()
                    .filter(|(k, v)| k.len() <= 512 && v.len() <= 512)
                    .take(8),
            );
        }
        self
    }
}

/// Checks an `Idempotency-Key`: 1 to [`MAX_IDEMPOTENCY_KEY`] bytes of visible ASCII.
pub fn validate_idempotency_key(k: &str) -> Result<()> {
    if k.is_empty() || k.len() > MAX_IDEMPOTENCY_KEY || !k.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::InvalidInput(format!(
            "an Idempotency-Key is 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters"
        )));
    }
    Ok(())
}

/// Checks a run id: `run-` and 32 lowercase hex digits. Anything else names no run.
pub fn validate_run_id(id: &str) -> Result<()> {
    let ok = id.strip_prefix("run-").is_some_and(|h| {
        h.len() == 32 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    });
    if ok {
        return validate_id("run", id);
    }
    Err(Error::InvalidId {
        field: "run",
        value: id.chars().take(64).collect(),
        reason: "a run id is `run-` and 32 lowercase hex digits",
    })
}

fn new_run_id() -> String {
    format!("run-{}", uuid::Uuid::new_v4().simple())
}

/// A new claim token (32 hex digits): what a claim's heartbeats and final write carry.
pub(crate) fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// What [`RunQueue::submit`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    /// The run (the earlier one for a repeated idempotency key).
    pub run: Run,
    /// False when the idempotency key named an existing run.
    pub created: bool,
}

impl Submitted {
    /// A run this submit stored.
    pub(crate) fn stored(run: Run) -> Self {
        Self { run, created: true }
    }

    /// The earlier run a repeated idempotency key named (nothing new was stored).
    pub(crate) fn earlier(run: Run) -> Self {
        Self {
            run,
            created: false,
        }
    }
}

/// A claimed run: its fence and the token its heartbeats and final write carry.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The run, as claimed (status `running`).
    pub run: Run,
    /// The claim's token.
    pub token: String,
    /// The fence: larger than every earlier claim of the run.
    pub attempt: u64,
    /// How long the claim lasts without a heartbeat.
    pub lapse: Duration,
}

impl Claim {
    /// The claim of `run`, as claimed under `token` with `options`: its fence is the run's
    /// attempts.
    pub(crate) fn of(run: Run, token: String, options: &ClaimOptions) -> Self {
        Self {
            attempt: run.attempts,
            token,
            lapse: options.lapse,
            run,
        }
    }
}

/// What a heartbeat learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// A cancel was asked for: stop the run and finish it [`RunEnd::Cancelled`].
    pub cancel_requested: bool,
}

/// A decision on one approval of a `waiting_approval` run ([`RunQueue::decide`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The approval id (the `id` of one of the run's `approvals`).
    pub approval: String,
    /// The decision in the suspending layer's terms (`{"approve": true}`, `{"approve":
    /// false, "reason": "..."}`), stored as the approval's `decision`.
    pub value: serde_json::Value,
}

impl Decision {
    /// A decision on approval `approval`.
    pub fn new(approval: impl Into<String>, value: serde_json::Value) -> Self {
        Self {
            approval: approval.into(),
            value,
        }
    }
}

/// What [`RunQueue::decide`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// The decision is recorded on the waiting run, which is claimed by the caller (status
    /// `running`): run its resumed turn under this claim.
    Claimed(Claim),
    /// The session's head run is queued or running: nothing changed; decide again once it
    /// waits (or ends).
    Busy(Run),
    /// The session's waiting run has no undecided approval with this id: nothing changed.
    UnknownApproval(Run),
    /// No run of the session waits for a decision.
    NoneWaiting,
}

/// What [`RunQueue::cancel`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// The run was queued (or waited for a decision) and is now cancelled; no worker will
    /// run it.
    Cancelled(Run),
    /// The run is running; its worker sees the request at its next heartbeat.
    Requested(Run),
    /// The run had already ended; nothing changed.
    Finished(Run),
    /// No such run.
    NotFound,
}

/// Which runs [`RunQueue::list`] returns: those of an agent and user (`None`: runs without
/// a user), of one session or of all, at most `limit` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunFilter<'a> {
    /// The agent whose runs are listed.
    pub agent: &'a str,
    /// The user whose runs are listed (`None`: the runs submitted without a user).
    pub user: Option<&'a str>,
    /// Only this session's runs (`None`: every session's).
    pub session: Option<&'a str>,
    /// At most this many runs, the newest.
    pub limit: usize,
}

impl<'a> RunFilter<'a> {
    /// The newest `limit` runs of `agent` and `user`, of `session` or of every session.
    pub fn new(
        agent: &'a str,
        user: Option<&'a str>,
        session: Option<&'a str>,
        limit: usize,
    ) -> Self {
        Self {
            agent,
            user,
            session,
            limit,
        }
    }
}

/// How to claim.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimOptions {
    /// Whose runs: a worker claims only the runs of the agent it serves.
    pub agent: String,
    /// Who claims (shown in the run as `worker`): host and pid by default.
    pub worker: String,
    /// How long the claim lasts without a heartbeat.
    pub lapse: Duration,
}

impl ClaimOptions {
    /// Options for `worker`, serving `agent`, with a lapse.
    pub fn new(agent: impl Into<String>, worker: impl Into<String>, lapse: Duration) -> Self {
        Self {
            agent: agent.into(),
            worker: worker.into(),
            lapse,
        }
    }
}

/// A durable queue of runs, shared by every replica that uses the same store.
///
/// # Contract
///
/// - **Submit.** [`submit`](Self::submit) stores a `queued` run. With an idempotency key,
///   at most one run exists per `(agent, user, key)`, even under concurrent submits from
///   several processes; a repeat returns it with `created: false`.
/// - **Submit and claim.** [`submit_claimed`](Self::submit_claimed) stores a run and
///   claims it atomically when its session is free; no [`claim`](Self::claim) can take it
///   in between. Otherwise it is a plain submit.
/// - **One at a time per session, in order.** [`claim`](Self::claim) hands out the oldest
///   claimable run of [`ClaimOptions::agent`], and a run only when no earlier run of its session is
///   queued or running: runs of one session never overlap and start in submission order.
///   Runs of different sessions are claimed in parallel.
/// - **Exactly one owner.** A run is claimed by one worker at a time. A claim lasts
///   [`ClaimOptions::lapse`] from the last heartbeat; after it, another claim may take the
///   run over with a new token and a larger [`Claim::attempt`]. The old claim's
///   [`heartbeat`](Self::heartbeat) and [`finish`](Self::finish) then fail with
///   [`Error::LeaseLost`] and change nothing.
/// - **Finish once.** [`finish`](Self::finish) ends a running run under its current claim;
///   an ended run (`completed`, `unverified`, `failed`, `cancelled`) never changes again.
/// - **A decision resumes the run.** A run finished [`RunEnd::WaitingApproval`] keeps
///   holding its session (no later run of the session is claimed) until
///   [`decide`](Self::decide) records a decision on one of its approvals and claims it
///   again, in one step, for the caller (a new token, one more attempt), or until it is
///   cancelled (then the session's next run is claimable).
/// - **Cancel from anywhere.** [`cancel`](Self::cancel) ends a queued or
///   `waiting_approval` run at once and flags a running one; the flag comes back in the
///   next [`Beat`].
/// - **Retention.** [`purge_finished`](Self::purge_finished) deletes `completed`, `failed`
///   and `cancelled` runs older than a time, never a queued, running or
///   `waiting_approval` one (its approvals still wait for a decision).
/// - **Isolation.** [`list`](Self::list) returns only the runs of the given agent and user;
///   [`get`](Self::get) returns any run by id, and callers check [`Run::is_owned_by`].
#[async_trait]
pub trait RunQueue: Send + Sync + fmt::Debug + 'static {
    /// Stores a new queued run, or returns the run of a repeated idempotency key.
    async fn submit(&self, new: NewRun) -> Result<Submitted>;

    /// Stores a new run and, when its session has no other queued or running run, claims
    /// it for `options.worker` in the same step: no other worker can claim it first. A
    /// request that executes its own run (`POST …/messages`) uses it; if its process dies,
    /// the claim lapses and another worker takes the run over like any other. The claim is
    /// `None` when the session is busy (the run waits in the queue for a worker) and for a
    /// repeated idempotency key (nothing new was stored).
    async fn submit_claimed(
        &self,
        new: NewRun,
        options: &ClaimOptions,
    ) -> Result<(Submitted, Option<Claim>)>;

    /// A run by id; `None` when there is none (an invalid id names none).
    async fn get(&self, id: &str) -> Result<Option<Run>>;

    /// The runs `filter` selects, newest first.
    async fn list(&self, filter: RunFilter<'_>) -> Result<Vec<Run>>;

    /// Claims the next claimable run (see the contract); `None` when there is none.
    async fn claim(&self, options: &ClaimOptions) -> Result<Option<Claim>>;

    /// Extends a claim by its lapse and reads the cancel flag; [`Error::LeaseLost`] when
    /// the run was reclaimed or finished.
    async fn heartbeat(&self, claim: &Claim) -> Result<Beat>;

    /// Ends a run under its claim; [`Error::LeaseLost`] when the claim is no longer the
    /// run's current one. Returns the run as stored.
    async fn finish(&self, claim: &Claim, end: &RunEnd) -> Result<Run>;

    /// Cancels a run (see [`CancelOutcome`]).
    async fn cancel(&self, id: &str) -> Result<CancelOutcome>;

    /// Records `decision` on the `waiting_approval` run of session `key` and claims that
    /// run for `options.worker` in the same step ([`Decided::Claimed`]): the caller runs
    /// the resumed turn ([`Run::decisions`]), heartbeats and finishes it like any claim;
    /// if it dies, the claim lapses and another worker takes the run over. Nothing changes
    /// when the session's head run is queued or running ([`Decided::Busy`]: try again
    /// once it waits), when it waits on no undecided approval with that id, or when no
    /// run of the session waits.
    async fn decide(
        &self,
        key: &StateKey,
        decision: &Decision,
        options: &ClaimOptions,
    ) -> Result<Decided>;

    /// Deletes at most `limit` finished runs of `agent` last changed before `before`,
    /// oldest first, and returns how many it deleted. A deleted run is gone for
    /// [`get`](Self::get) and [`list`](Self::list), and its idempotency key with it (the key
    /// makes a new run again). Queued and running runs are never deleted.
    async fn purge_finished(
        &self,
        agent: &str,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<usize>;

    /// Waits until new work may be there (a submit, a cancel) or `max` has passed.
    async fn wait_for_work(&self, max: Duration) -> Result<()> {
        tokio::time::sleep(max).await;
        Ok(())
    }

    /// Waits until a cancel of run `id` may have been asked for or `max` has passed; the
    /// worker then heartbeats at once and reads the flag. PostgreSQL wakes it with
    /// `NOTIFY hame_runs_cancel`, Redis with a pub/sub message, so a cancel sent to any
    /// replica reaches the run's worker in milliseconds; the default (JSON, MySQL, memory)
    /// sleeps `max`, and the next heartbeat finds the flag. A spurious early return is
    /// allowed (the heartbeat then reads no flag).
    async fn wait_for_cancel(&self, id: &str, max: Duration) -> Result<()> {
        let _ = id;
        tokio::time::sleep(max).await;
        Ok(())
    }

    /// Whether several machines may share this queue.
    fn is_shared(&self) -> bool;
}

/// Cancel wake-ups fanned out to the runs of one process: a backend's listener task sends
/// the id of every run whose cancel was asked for; [`CancelWatch::wait`] waits for one id.
#[cfg(any(feature = "postgres", feature = "redis"))]
#[derive(Debug)]
pub(crate) struct CancelWatch {
    tx: tokio::sync::broadcast::Sender<String>,
    task: std::sync::OnceLock<tokio::task::AbortHandle>,
}

#[cfg(any(feature = "postgres", feature = "redis"))]
impl CancelWatch {
    pub(crate) fn new() -> Self {
        Self {
            tx: tokio::sync::broadcast::channel(256).0,
            task: std::sync::OnceLock::new(),
        }
    }

    /// Starts the listener once (`start` gets the sender to feed).
    pub(crate) fn start_once<F>(
        &self,
        start: impl FnOnce(tokio::sync::broadcast::Sender<String>) -> F,
    ) where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.task
            .get_or_init(|| tokio::spawn(start(self.tx.clone())).abort_handle());
    }

    /// Waits for a wake-up naming `id` (or a lag: then the caller heartbeats to be sure),
    /// at most `max`.
    pub(crate) async fn wait(&self, id: &str, max: Duration) {
        let mut rx = self.tx.subscribe();
        let _ = tokio::time::timeout(max, async {
            loop {
                match rx.recv().await {
                    Ok(got) if got == id => return,
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        std::future::pending::<()>().await;
                    }
                }
            }
        })
        .await;
    }
}

#[cfg(any(feature = "postgres", feature = "redis"))]
impl Drop for CancelWatch {
    fn drop(&mut self) {
        if let Some(task) = self.task.get() {
            task.abort();
        }
    }
}

macro_rules! forward_queue {
    ($ty:ty) => {
        #[async_trait]
        impl<T: RunQueue + ?Sized> RunQueue for $ty {
            async fn submit(&self, new: NewRun) -> Result<Submitted> {
                (**self).submit(new).await
            }
            async fn submit_claimed(
                &self,
                new: NewRun,
                options: &ClaimOptions,
            ) -> Result<(Submitted, Option<Claim>)> {
                (**self).submit_claimed(new, options).await
            }
            async fn get(&self, id: &str) -> Result<Option<Run>> {
                (**self).get(id).await
            }
            async fn list(&self, filter: RunFilter<'_>) -> Result<Vec<Run>> {
                (**self).list(filter).await
            }
            async fn claim(&self, options: &ClaimOptions) -> Result<Option<Claim>> {
                (**self).claim(options).await
            }
            async fn heartbeat(&self, claim: &Claim) -> Result<Beat> {
                (**self).heartbeat(claim).await
            }
            async fn finish(&self, claim: &Claim, end: &RunEnd) -> Result<Run> {
                (**self).finish(claim, end).await
            }
            async fn cancel(&self, id: &str) -> Result<CancelOutcome> {
                (**self).cancel(id).await
            }
            async fn decide(
                &self,
                key: &StateKey,
                decision: &Decision,
                options: &ClaimOptions,
            ) -> Result<Decided> {
                (**self).decide(key, decision, options).await
            }
            async fn purge_finished(
                &self,
                agent: &str,
                before: DateTime<Utc>,
                limit: usize,
            ) -> Result<usize> {
                (**self).purge_finished(agent, before, limit).await
            }
            async fn wait_for_work(&self, max: Duration) -> Result<()> {
                (**self).wait_for_work(max).await
            }
            async fn wait_for_cancel(&self, id: &str, max: Duration) -> Result<()> {
                (**self).wait_for_cancel(id, max).await
            }
            fn is_shared(&self) -> bool {
                (**self).is_shared()
            }
        }
    };
}

forward_queue!(Arc<T>);
forward_queue!(Box<T>);

/// A run from a row of the SQL queues (PostgreSQL, MySQL): one reading for both dialects;
/// `number` and `time` read the columns whose types differ (`BIGINT` against `BIGINT
/// UNSIGNED`, `TIMESTAMPTZ` against `DATETIME(6)`). A column that does not parse is a
/// `backend` error naming it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn run_of<R>(
    row: &R,
    backend: &'static str,
    number: impl Fn(&R, &str) -> Result<u64>,
    time: impl Fn(&R, &str) -> Result<Option<DateTime<Utc>>>,
) -> Result<Run>
where
    R: sqlx::Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let err = |e: sqlx::Error| Error::backend(backend, e);
    let text = |c: &str| row.try_get::<String, _>(c).map_err(err);
    let opt = |c: &str| row.try_get::<Option<String>, _>(c).map_err(err);
    let json = |c: &str| parse_json(backend, opt(c)?.as_deref());
    let at = |c: &str| {
        time(row, c)?.ok_or_else(|| Error::backend(backend, format!("run column {c} is null")))
    };
    let user = text("user_key")?;
    Ok(Run {
        id: text("id")?,
        agent: text("agent")?,
        user: (!user.is_empty()).then_some(user),
        session: text("session")?,
        seq: number(row, "seq")?,
        status: parse_status(backend, &text("status")?)?,
        input: serde_json::from_str::<RunInput>(&text("input")?)
            .map_err(|e| Error::backend(backend, e))?,
        idempotency_key: opt("idempotency_key")?,
        reply: opt("reply")?,
        usage: json("usage")?,
        verification: json("verification")?,
        error: parse_error(backend, opt("error")?.as_deref())?,
        approvals: json("approvals")?,
        attempts: number(row, "attempts")?,
        worker: opt("worker")?,
        cancel_requested: row.try_get::<bool, _>("cancel_requested").map_err(err)?,
        created: at("created_at")?,
        updated: at("updated_at")?,
        expires: time(row, "expires_at")?,
        token: text("token")?,
    })
}

/// A stored status, or a `backend` error naming it.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
pub(crate) fn parse_status(backend: &'static str, status: &str) -> Result<RunStatus> {
    RunStatus::parse(status)
        .ok_or_else(|| Error::backend(backend, format!("unknown run status {status:?}")))
}

/// A stored JSON field (`None`: absent).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
pub(crate) fn parse_json(
    backend: &'static str,
    text: Option<&str>,
) -> Result<Option<serde_json::Value>> {
    text.map(|t| serde_json::from_str(t).map_err(|e| Error::backend(backend, e)))
        .transpose()
}

/// A stored [`RunError`] (`None`: absent).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
pub(crate) fn parse_error(backend: &'static str, text: Option<&str>) -> Result<Option<RunError>> {
    text.map(|t| serde_json::from_str::<RunError>(t).map_err(|e| Error::backend(backend, e)))
        .transpose()
}

/// A stored [`RunError`]: JSON `{code, message}`.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
pub(crate) fn error_json(error: &RunError) -> Result<String> {
    serde_json::to_string(error).map_err(Error::Serialize)
}

/// What a finish writes, as text: the status, the reply, and usage, error, approvals and
/// verification as JSON (`None`: absent).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
pub(crate) struct EndColumns {
    /// The run's new status ([`RunEnd::status`]).
    pub(crate) status: &'static str,
    /// The reply of a run that ended with one.
    pub(crate) reply: Option<String>,
    /// Its token usage.
    pub(crate) usage: Option<String>,
    /// A failed or cancelled run's [`RunError`].
    pub(crate) error: Option<String>,
    /// The approvals a `waiting_approval` run waits on.
    pub(crate) approvals: Option<String>,
    /// The completion gate's verdict.
    pub(crate) verification: Option<String>,
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
impl EndColumns {
    /// What ending the claimed `run` with `end` writes.
    pub(crate) fn of(run: &Run, end: &RunEnd) -> Result<Self> {
        let mut done = run.clone();
        end.apply(&mut done);
        let text = |v: Option<serde_json::Value>| v.map(|v| v.to_string());
        Ok(Self {
            status: done.status.as_str(),
            error: done.error.as_ref().map(error_json).transpose()?,
            reply: done.reply,
            usage: text(done.usage),
            approvals: text(done.approvals),
            verification: text(done.verification),
        })
    }

    /// The values after the status, in the order every backend passes them: reply, usage,
    /// error, approvals, verification.
    pub(crate) fn values(&self) -> [Option<&str>; 5] {
        [
            self.reply.as_deref(),
            self.usage.as_deref(),
            self.error.as_deref(),
            self.approvals.as_deref(),
            self.verification.as_deref(),
        ]
    }

    /// `query` with the status and then the [`values`](Self::values) bound next.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn bind<DB: QueueDb>(&self, query: SqlQuery<DB>) -> SqlQuery<DB> {
        let query = DB::bind_text(query, Some(self.status));
        self.values().into_iter().fold(query, DB::bind_text)
    }
}

/// A run to insert into a SQL queue (PostgreSQL, MySQL): the queued run, its input as JSON
/// and its `user_key` column. The dialects bind the same values; only their statements
/// differ.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct NewRow {
    /// The run as submitted (queued; the database fills in `seq` and the times).
    pub(crate) run: Run,
    /// [`Run::input`] as JSON.
    pub(crate) input: String,
    /// The `user_key` column (`''`: the anonymous tenant).
    pub(crate) user: String,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl NewRow {
    /// The row of `new`, submitted now.
    pub(crate) fn of(new: &NewRun) -> Result<Self> {
        let run = Run::new(new, Utc::now());
        let input = serde_json::to_string(&run.input).map_err(Error::Serialize)?;
        let user = crate::sql::user_key(new.key.user());
        Ok(Self { run, input, user })
    }

    /// The name of the lock under which the submit-and-claims of the run's session take
    /// turns.
    pub(crate) fn session_lock(&self) -> String {
        let Self { run, user, .. } = self;
        format!("hame_runs\n{}\n{user}\n{}", run.agent, run.session)
    }

    /// `statement`, the dialect's `INSERT` of a queued run, with its six values bound: id,
    /// agent, `user_key`, session, idempotency key, input.
    pub(crate) fn insert<DB: QueueDb>(&self, statement: &'static str) -> SqlQuery<DB> {
        let Self { run, input, user } = self;
        texts(
            statement,
            &[
                Some(&run.id),
                Some(&run.agent),
                Some(user),
                Some(&run.session),
                run.idempotency_key.as_deref(),
                Some(input),
            ],
        )
    }

    /// `statement`, the dialect's read of the run of an idempotency key, with its three
    /// values bound: agent, `user_key`, idempotency key.
    pub(crate) fn earlier<DB: QueueDb>(&self, statement: &'static str) -> SqlQuery<DB> {
        let key = self.run.idempotency_key.as_deref();
        texts(statement, &[Some(&self.run.agent), Some(&self.user), key])
    }
}

/// A statement of a SQL queue with (some of) its values bound.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) type SqlQuery<DB> = sqlx::query::Query<'static, DB, <DB as sqlx::Database>::Arguments>;

/// A database of the SQL queues (PostgreSQL, MySQL): their statements differ, the values
/// they bind (text and microseconds) do not.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) trait QueueDb: sqlx::Database {
    /// `query` with `value` bound next (`None`: `NULL`).
    fn bind_text(query: SqlQuery<Self>, value: Option<&str>) -> SqlQuery<Self>;
    /// `query` with `value` bound next.
    fn bind_number(query: SqlQuery<Self>, value: i64) -> SqlQuery<Self>;
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB> QueueDb for DB
where
    DB: sqlx::Database,
    for<'t> Option<&'t str>: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
{
    fn bind_text(query: SqlQuery<Self>, value: Option<&str>) -> SqlQuery<Self> {
        query.bind(value)
    }

    fn bind_number(query: SqlQuery<Self>, value: i64) -> SqlQuery<Self> {
        query.bind(value)
    }
}

/// `statement` with `values` bound in order (`None`: `NULL`).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn texts<DB: QueueDb>(statement: &'static str, values: &[Option<&str>]) -> SqlQuery<DB> {
    values
        .iter()
        .fold(sqlx::query(statement), |q, v| DB::bind_text(q, *v))
}

/// The first step of a SQL queue's [`RunQueue::decide`], in `tx`: the head of session
/// `key`, read (and locked) with `statement` (the dialect's; binds agent, `user_key`,
/// session), and `decision` checked against it ([`decide_on`]). Gives `tx` back with the
/// run to claim and its approvals with the decision; otherwise rolls `tx` back and gives
/// the answer. `backend` names the queue in errors.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn decide_head<DB: QueueDb>(
    mut tx: sqlx::Transaction<'static, DB>,
    statement: &'static str,
    key: &StateKey,
    decision: &Decision,
    to_run: fn(&DB::Row) -> Result<Run>,
    backend: &'static str,
) -> Result<std::result::Result<Resume<DB>, Box<Decided>>>
where
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let err = |e: sqlx::Error| Error::backend(backend, e);
    let user = crate::sql::user_key(key.user());
    let head = texts::<DB>(
        statement,
        &[Some(key.agent()), Some(&user), Some(key.session())],
    )
    .fetch_optional(&mut *tx)
    .await
    .map_err(err)?;
    match decide_on(head.as_ref().map(to_run).transpose()?, decision) {
        Ok((run, approvals)) => Ok(Ok((tx, run, approvals))),
        Err(answer) => {
            tx.rollback().await.map_err(err)?;
            Ok(Err(answer))
        }
    }
}

/// What [`decide_head`] found to claim: the transaction that read (and locked) the run, the
/// run and its approvals with the decision.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) type Resume<DB> = (sqlx::Transaction<'static, DB>, Run, serde_json::Value);

/// `statement`, a claim of a SQL queue, with the three values every claim writes bound
/// first: the token, the worker and the lapse in microseconds (`$1` to `$3` on
/// PostgreSQL, the first three `?` on MySQL). The caller binds what its statement adds.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn claim_query<DB: QueueDb>(
    statement: &'static str,
    token: &str,
    options: &ClaimOptions,
) -> SqlQuery<DB> {
    let q = texts(statement, &[Some(token), Some(&options.worker)]);
    DB::bind_number(q, crate::sql::ttl_micros(options.lapse))
}

/// The purgeable statuses as a SQL list (`'completed', …`), for the purge statements.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn purgeable_sql() -> String {
    RunStatus::ALL
        .iter()
        .filter(|s| s.is_purgeable())
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error of a claim that is no longer a run's current one.
pub(crate) fn claim_lost(id: &str) -> Error {
    Error::LeaseLost {
        key: format!("run {id}"),
    }
}

/// Opens the run queue of the store at `url` (the same URL [`crate::open`] takes).
///
/// | input | queue |
/// |---|---|
/// | `memory://` | a new [`InMemoryRunQueue`] |
/// | a path, `file:///path` | `JsonRunQueue` under `<path>/.runs/` (feature `json`) |
/// | `postgres://`, `postgresql://` | `PgRunQueue` (feature `postgres`), migrations applied |
/// | `mysql://`, `mariadb://` | `MySqlRunQueue` (feature `mysql`), migrations applied |
/// | `redis://`, `rediss://` | `RedisRunQueue` (feature `redis`), keys under `hame:state:{runs}` |
pub async fn open_queue(url: &str) -> Result<Arc<dyn RunQueue>> {
    hame_core::secrets::add_url(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return open_local(url);
    };
    match scheme.to_ascii_lowercase().as_str() {
        "memory" => Ok(Arc::new(InMemoryRunQueue::new())),
        "file" => open_local(rest),
        "postgres" | "postgresql" => {
            #[cfg(feature = "postgres")]
            {
                Ok(Arc::new(
                    PgRunQueue::connect(url, crate::SqlOptions::default()).await?,
                ))
            }
            #[cfg(not(feature = "postgres"))]
            Err(Error::FeatureDisabled {
                scheme: scheme.to_owned(),
                feature: "postgres",
            })
        }
        "mysql" | "mariadb" => {
            #[cfg(feature = "mysql")]
            {
                Ok(Arc::new(
                    MySqlRunQueue::connect(url, crate::SqlOptions::default()).await?,
                ))
            }
            #[cfg(not(feature = "mysql"))]
            Err(Error::FeatureDisabled {
                scheme: scheme.to_owned(),
                feature: "mysql",
            })
        }
        "redis" | "rediss" => {
            #[cfg(feature = "redis")]
            {
                Ok(Arc::new(
                    RedisRunQueue::connect(url, crate::RedisOptions::default()).await?,
                ))
            }
            #[cfg(not(feature = "redis"))]
            Err(Error::FeatureDisabled {
                scheme: scheme.to_owned(),
                feature: "redis",
            })
        }
        other => Err(Error::Config(format!(
            "unknown state store URL scheme `{other}` for runs (expected memory, file, redis, rediss, postgres, postgresql, mysql or mariadb)"
        ))),
    }
}

fn open_local(path: &str) -> Result<Arc<dyn RunQueue>> {
    if path.is_empty() {
        return Err(Error::Config("empty state store path".into()));
    }
    #[cfg(feature = "json")]
    {
        Ok(Arc::new(JsonRunQueue::open(path)?))
    }
    #[cfg(not(feature = "json"))]
    Err(Error::FeatureDisabled {
        scheme: "file".into(),
        feature: "json",
    })
}
