//! Durable task records and their state machine (plain functions over plain data).
//!
//! ```text
//! pending ──start──► running ──complete──► completed
//!    │                  │ ──fail──────► failed
//!    └──cancel/fail──►  │ ──cancel────► cancelled
//! completed | failed | cancelled ──resend (agent_send)──► running
//! ```
//! A terminal record changes only by `resend`; nothing else moves it, so a late heartbeat
//! or a second cancel never turns `failed` into `completed` (or back).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use hame_fs::{Filesystem, FsPath, WriteOptions};
use hame_state::Holder;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Waiting for a slot (the concurrency bound).
    Pending,
    /// The child runs.
    Running,
    /// The child answered; `result` holds its reply.
    Completed,
    /// The child failed (model error, step or time limit, interrupted); `error` says why.
    Failed,
    /// Cancelled (`task_cancel`, or the parent call was cancelled).
    Cancelled,
}

impl TaskStatus {
    /// Whether the task is over.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }

    /// The lowercase name (`running`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Running => "running",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }
}

/// What happens to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEvent {
    /// It got a slot and runs.
    Start,
    /// The child answered.
    Complete,
    /// The child failed.
    Fail,
    /// It was cancelled.
    Cancel,
    /// `agent_send` continues a finished child.
    Resend,
}

/// The next status, or `None` when the event does not apply (the record stays as it is).
pub fn transition(from: TaskStatus, event: TaskEvent) -> Option<TaskStatus> {
    use TaskEvent as E;
    use TaskStatus as S;
    match (from, event) {
        (S::Pending, E::Start) => Some(S::Running),
        (S::Pending | S::Running, E::Complete) => Some(S::Completed),
        (S::Pending | S::Running, E::Fail) => Some(S::Failed),
        (S::Pending | S::Running, E::Cancel) => Some(S::Cancelled),
        (S::Completed | S::Failed | S::Cancelled, E::Resend) => Some(S::Running),
        _ => None,
    }
}

/// A task: one run (or, after `agent_send`, the latest run) of a child.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// `task-` and 12 hex digits.
    pub task_id: String,
    /// The subagent's declaration id.
    pub agent_id: String,
    /// Its status.
    pub status: TaskStatus,
    /// The parent agent.
    pub parent_agent: String,
    /// The parent's session.
    pub parent_session: String,
    /// The parent's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The child's own session (its conversation and log).
    pub child_session: String,
    /// The child's depth (1 for a child of the top-level agent).
    pub depth: usize,
    /// The latest message given to the child.
    pub task: String,
    /// Whether the parent did not wait for it.
    pub background: bool,
    /// The child's reply, when completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Why it failed or was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Reasoning steps of the child's last run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterations: Option<usize>,
    /// Wall-clock limit of one run, seconds.
    pub timeout_seconds: u64,
    /// A process other than the owner asked for cancellation; the owner stops the child at
    /// its next heartbeat.
    #[serde(default)]
    pub cancel_requested: bool,
    /// When created.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// Last sign of life of the owner while running.
    pub heartbeat_at: DateTime<Utc>,
    /// When the parent got the result (by `task_output`, the sync reply, or a push): set
    /// once the parent call that took the result has saved its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_at: Option<DateTime<Utc>>,
    /// The parent call (its id, as on its session-log lines) that pushed the result into
    /// its conversation and has not confirmed it yet: written before the push, so the next
    /// call of a parent that crashed before saving finds the notification in the session
    /// log instead of pushing it a second time (`docs/subagents.md`, *Delivery*).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_call: Option<String>,
    /// The process that runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Holder>,
    /// The run of the run queue that executes it (a background task of an agent served
    /// with a queue, `docs/subagents.md`): any replica claims it, and another one takes it
    /// over when its worker dies, so its liveness is the run's, not the owner's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

impl TaskRecord {
    /// Applies `event` at `now`: the status moves (when the event applies), with its
    /// result or error. Returns whether it moved.
    pub fn apply(&mut self, event: TaskEvent, now: DateTime<Utc>, detail: Option<String>) -> bool {
        let Some(next) = transition(self.status, event) else {
            return false;
        };
        self.status = next;
        self.updated_at = now;
        match event {
            TaskEvent::Start | TaskEvent::Resend => {
                self.heartbeat_at = now;
                self.result = None;
                self.error = None;
                self.delivered_at = None;
                self.delivery_call = None;
                self.cancel_requested = false;
            }
            TaskEvent::Complete => self.result = detail,
            TaskEvent::Fail | TaskEvent::Cancel => self.error = detail,
        }
        true
    }

    /// Whether the parent still has to be told the outcome.
    pub fn undelivered(&self) -> bool {
        self.status.is_terminal() && self.delivered_at.is_none()
    }

    /// What the parent's state remembers of a delivered result: the task id and when this
    /// run of it ended (an `agent_send` runs the task again, and its new result is another
    /// delivery).
    pub fn delivery_key(&self) -> String {
        format!("{}@{}", self.task_id, self.updated_at.timestamp_millis())
    }
}

/// Whether a non-terminal record is an orphan: not run by this process (`live` false) and
/// its owner is gone (a dead process on this machine) or silent for longer than `lapse`
/// (another machine that stopped heart-beating).
pub fn is_interrupted(
    record: &TaskRecord,
    live: bool,
    owner_gone: bool,
    now: DateTime<Utc>,
    lapse: std::time::Duration,
) -> bool {
    if record.status.is_terminal() || live {
        return false;
    }
    if owner_gone {
        return true;
    }
    let silent = now.signed_duration_since(record.heartbeat_at);
    silent.to_std().is_ok_and(|s| s > lapse)
}

/// Whether `id` has the shape of a task id (`task-` and 12 lowercase hex digits); ids from
/// the model are checked before they name a file.
pub fn is_task_id(id: &str) -> bool {
    id.strip_prefix("task-")
        .is_some_and(|h| h.len() == 12 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// A new task id.
pub fn new_task_id() -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    format!("task-{}", &hex[..12])
}

/// The task records of one parent session in one tenant's namespace:
/// `agents/<agent>/tasks/<session>/<task_id>.json` of the caller's records filesystem (the
/// shared store in store mode), one JSON file per task, written whole. One folder per
/// session keeps the per-call orphan sweep proportional to the session's own tasks.
#[derive(Debug, Clone)]
pub struct TaskStore {
    fs: Arc<dyn Filesystem>,
    dir: FsPath,
}

impl TaskStore {
    /// The task records of `agent`'s session `session` in `records`.
    pub fn new(records: Arc<dyn Filesystem>, agent: &str, session: &str) -> Result<Self> {
        hame_id::validate("session id", session).map_err(|e| Error::Config(e.to_string()))?;
        let dir = FsPath::parse(&format!("agents/{agent}/tasks/{session}"))
            .map_err(|e| Error::Config(format!("task folder of agent `{agent}`: {e}")))?;
        Ok(Self { fs: records, dir })
    }

    fn path(&self, task_id: &str) -> Result<FsPath> {
        if !is_task_id(task_id) {
            return Err(Error::UnknownTask(task_id.chars().take(40).collect()));
        }
        self.dir
            .join(&format!("{task_id}.json"))
            .map_err(|e| Error::Storage(e.to_string()))
    }

    /// Writes a record whole, atomically (readers never see half a record) but without
    /// fsync: it survives a crash of the process; after a power loss it may show an earlier
    /// status, which the orphan sweep repairs (the child's conversation itself is durable).
    pub async fn save(&self, record: &TaskRecord) -> Result<()> {
        let path = self.path(&record.task_id)?;
        let mut bytes =
            serde_json::to_vec_pretty(record).map_err(|e| Error::Storage(e.to_string()))?;
        bytes.push(b'\n');
        self.fs
            .write(&path, bytes, WriteOptions::atomic())
            .await
            .map_err(|e| Error::Storage(format!("writing task record {}: {e}", record.task_id)))?;
        Ok(())
    }

    /// Reads a record; `None` when there is none.
    pub async fn load(&self, task_id: &str) -> Result<Option<TaskRecord>> {
        let path = self.path(task_id)?;
        match self.fs.read_bytes(&path).await {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| Error::Storage(format!("task record {task_id} is not valid: {e}"))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(Error::Storage(format!(
                "reading task record {task_id}: {e}"
            ))),
        }
    }

    /// Every record of the session (unreadable ones are logged and skipped), oldest first.
    pub async fn list(&self) -> Result<Vec<TaskRecord>> {
        let entries = match self.fs.list(&self.dir).await {
            Ok(e) => e,
            Err(e) if e.is_not_found() => return Ok(Vec::new()),
            Err(e) => return Err(Error::Storage(format!("listing task records: {e}"))),
        };
        let mut out = Vec::new();
        for e in entries {
            let name = e.path.as_str().rsplit('/').next().unwrap_or_default();
            let Some(id) = name.strip_suffix(".json").filter(|id| is_task_id(id)) else {
                continue;
            };
            match self.load(id).await {
                Ok(Some(r)) => out.push(r),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "skipping a task record"),
            }
        }
        out.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then(a.task_id.cmp(&b.task_id))
        });
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn status() -> impl Strategy<Value = TaskStatus> {
        prop_oneof![
            Just(TaskStatus::Pending),
            Just(TaskStatus::Running),
            Just(TaskStatus::Completed),
            Just(TaskStatus::Failed),
            Just(TaskStatus::Cancelled),
        ]
    }

    fn event() -> impl Strategy<Value = TaskEvent> {
        prop_oneof![
            Just(TaskEvent::Start),
            Just(TaskEvent::Complete),
            Just(TaskEvent::Fail),
            Just(TaskEvent::Cancel),
            Just(TaskEvent::Resend),
        ]
    }

    proptest! {
        /// A terminal status moves only by an explicit resend.
        #[test]
        fn terminal_moves_only_by_resend(s in status(), e in event()) {
            if s.is_terminal() {
                let next = transition(s, e);
                prop_assert_eq!(next.is_some(), e == TaskEvent::Resend);
            }
        }

        /// Any sequence of events from pending ends in a status reachable by the graph,
        /// and `completed` is reached only through a `Complete` event.
        #[test]
        fn completed_only_by_complete(events in proptest::collection::vec(event(), 0..12)) {
            let mut s = TaskStatus::Pending;
            for e in events {
                if let Some(n) = transition(s, e) {
                    if n == TaskStatus::Completed {
                        prop_assert_eq!(e, TaskEvent::Complete);
                    }
                    s = n;
                }
            }
        }
    }

    pub(crate) fn record(status: TaskStatus, heartbeat_age_s: i64) -> TaskRecord {
        let now = Utc::now();
        TaskRecord {
            task_id: new_task_id(),
            agent_id: "a".into(),
            status,
            parent_agent: "hame".into(),
            parent_session: "s".into(),
            user: None,
            child_session: "s@x".into(),
            depth: 1,
            task: "t".into(),
            background: true,
            result: None,
            error: None,
            iterations: None,
            timeout_seconds: 60,
            cancel_requested: false,
            created_at: now,
            updated_at: now,
            heartbeat_at: now - chrono::Duration::seconds(heartbeat_age_s),
            delivered_at: None,
            delivery_call: None,
            run_id: None,
            owner: None,
        }
    }

    #[test]
    fn orphans_are_found_by_owner_or_silence() {
        let lapse = std::time::Duration::from_secs(60);
        let now = Utc::now();
        let fresh = record(TaskStatus::Running, 1);
        assert!(!is_interrupted(&fresh, false, false, now, lapse));
        assert!(is_interrupted(&fresh, false, true, now, lapse));
        assert!(!is_interrupted(&fresh, true, true, now, lapse));
        let silent = record(TaskStatus::Running, 120);
        assert!(is_interrupted(&silent, false, false, now, lapse));
        let done = record(TaskStatus::Completed, 120);
        assert!(!is_interrupted(&done, false, true, now, lapse));
    }

    #[test]
    fn a_resent_task_clears_its_delivery_and_gets_a_new_key() {
        let mut r = record(TaskStatus::Running, 0);
        let first = Utc::now();
        r.apply(TaskEvent::Complete, first, Some("one".into()));
        let key = r.delivery_key();
        r.delivered_at = Some(first);
        r.delivery_call = Some("call-1".into());
        r.apply(TaskEvent::Resend, first, None);
        assert_eq!((r.delivered_at, r.delivery_call.as_deref()), (None, None));
        r.apply(
            TaskEvent::Complete,
            first + chrono::Duration::milliseconds(5),
            Some("two".into()),
        );
        assert_ne!(r.delivery_key(), key);
        assert!(r.delivery_key().starts_with(&r.task_id));
    }

    #[test]
    fn apply_keeps_terminal_records() {
        let mut r = record(TaskStatus::Running, 0);
        assert!(r.apply(TaskEvent::Fail, Utc::now(), Some("boom".into())));
        assert!(!r.apply(TaskEvent::Complete, Utc::now(), Some("late".into())));
        assert_eq!(r.status, TaskStatus::Failed);
        assert_eq!(r.error.as_deref(), Some("boom"));
        assert!(r.undelivered());
        assert!(r.apply(TaskEvent::Resend, Utc::now(), None));
        assert_eq!((r.status, r.error.clone()), (TaskStatus::Running, None));
    }

    #[test]
    fn task_ids_are_checked() {
        assert!(is_task_id(&new_task_id()));
        for bad in ["task-../../x", "task-ABCDEF123456", "x", "task-123", ""] {
            assert!(!is_task_id(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn store_round_trip() -> Result<()> {
        let fs: Arc<dyn Filesystem> = Arc::new(hame_fs::InMemoryFs::new());
        let store = TaskStore::new(fs.clone(), "hame", "one")?;
        let other = TaskStore::new(fs, "hame", "two")?;
        let a = record(TaskStatus::Running, 0);
        let b = record(TaskStatus::Pending, 0);
        store.save(&a).await?;
        store.save(&b).await?;
        other.save(&record(TaskStatus::Pending, 0)).await?;
        assert_eq!(store.load(&a.task_id).await?, Some(a.clone()));
        assert_eq!(store.list().await?.len(), 2);
        assert_eq!(other.list().await?.len(), 1);
        assert!(TaskStore::new(Arc::new(hame_fs::InMemoryFs::new()), "hame", "../x").is_err());
        assert!(matches!(
            store.load("task-../etc").await,
            Err(Error::UnknownTask(_))
        ));
        Ok(())
    }
}
