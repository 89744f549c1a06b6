//! [`Subagents`]: the runtime that spawns children, tracks their tasks and hands their
//! results back. One per agent, shared by every call; nothing in it is per call (the
//! declarations are read per call through the caller's workspace handle).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chrono::Utc;
use hame_core::{AgentEvent, CancellationToken, EventSink, RuntimeContext, ToolContext};
use hame_state::Holder;
use hame_tools::{Workspace, WorkspaceExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::delivery::Deliveries;
use crate::error::{Error, Result};
use crate::runner::{ChildReply, ChildRun, SubagentRunner};
use crate::spec::{Catalog, Declaration, SpecWorkspace};
use crate::task::{TaskEvent, TaskRecord, TaskStatus, TaskStore, is_interrupted, new_task_id};

/// The runtime-context extra that holds a caller's depth (0 or absent: the top-level
/// agent).
pub const DEPTH_EXTRA: &str = "hame.subagent_depth";
/// The runtime-context extra of a child that names its task.
pub const TASK_EXTRA: &str = "hame.task_id";
/// The runtime-context extra of a child whose spec has a `tools` allowlist: layers that
/// offer tools of their own (MCP) apply it too.
pub const TOOLS_EXTRA: &str = "hame.tool_allowlist";

/// The tool allowlist of a caller (a child whose spec has `tools`), if any.
pub fn tool_allowlist(runtime: &RuntimeContext) -> Option<Vec<String>> {
    runtime
        .extras
        .get(TOOLS_EXTRA)
        .and_then(|v| <Vec<String> as serde::Deserialize>::deserialize(v).ok())
}

/// Limits and switches of the subagent runtime (every default is in `docs/subagents.md`).
#[derive(Debug, Clone)]
pub struct SubagentOptions {
    /// Offer the built-in `general-purpose` subagent. Default true.
    pub general_purpose: bool,
    /// How deep children may nest: 1 (the default) means the top-level agent spawns and
    /// children are leaves; 2 lets children spawn leaves; enforced at every level.
    pub max_depth: usize,
    /// Children running at once in this process (the others wait as `pending`). Default 8.
    pub max_concurrency: usize,
    /// Wall-clock limit of one child run when its spec sets none. Default 600 s.
    pub default_timeout: Duration,
    /// Upper bound of any child's wall-clock limit. Default 3600 s.
    pub max_timeout: Duration,
    /// How often a running task's record is refreshed (and checked for a cancellation
    /// asked by another process). Default 5 s.
    pub heartbeat: Duration,
    /// A running record whose owner is on another machine and silent for this long is
    /// failed as interrupted. Default 60 s.
    pub heartbeat_lapse: Duration,
    /// Longest `task_output` wait and longest sync `agent_spawn` wait. Default 600 s.
    pub max_wait: Duration,
    /// Longest result pushed into the parent's context (the middle is cut; `task_output`
    /// returns it whole). Default 20,000 characters.
    pub max_delivered_chars: usize,
    /// Where a remote subagent's `a2a_auth_env` is read, at each run. Default: the process
    /// environment. The harness always sets it to its builder's `env` (default: a copy of
    /// the process environment taken at `build`, since the CLI scrubs secret values from
    /// the process environment after that).
    pub env: hame_core::EnvLookup,
}

impl Default for SubagentOptions {
    fn default() -> Self {
        Self {
            general_purpose: true,
            max_depth: 1,
            max_concurrency: 8,
            default_timeout: Duration::from_secs(600),
            max_timeout: Duration::from_secs(3600),
            heartbeat: Duration::from_secs(5),
            heartbeat_lapse: Duration::from_secs(60),
            max_wait: Duration::from_secs(600),
            max_delivered_chars: 20_000,
            env: hame_core::EnvLookup::process(),
        }
    }
}

/// What the harness puts in every call's extensions for the subagent tools: the call's
/// event stream (child progress goes there) and its cancellation (a cancelled parent
/// cancels its children).
#[derive(Debug, Clone, Default)]
pub struct ParentCall {
    /// The parent call's events.
    pub events: EventSink,
    /// The parent call's cancellation.
    pub cancel: CancellationToken,
    /// Runtime-context extras every child of this call gets (layers put what must reach
    /// children here, e.g. the permissions layer its plan mode and deny rules).
    pub inherit: std::collections::BTreeMap<String, serde_json::Value>,
    /// The results this call took (pushed, or returned by `task_output` / a sync spawn):
    /// marked delivered once the call's state is saved ([`Subagents::confirm_deliveries`]).
    /// Whoever puts a `ParentCall` into a call confirms them after saving its state (the
    /// harness does); unconfirmed, they are delivered again by the session's next call.
    pub deliveries: Deliveries,
}

/// A spawn or send as the tools ask for it.
#[derive(Debug, Clone)]
pub struct SpawnRequest {
    /// The declaration id (`agent_spawn`), ignored by `send`.
    pub agent_id: String,
    /// The message for the child.
    pub message: String,
    /// Return at once with the task id.
    pub background: bool,
    /// How long a sync spawn waits before it leaves the child running in the background;
    /// `None` = until the child's own time limit.
    pub wait: Option<Duration>,
}

/// How a spawn ended for the caller.
#[derive(Debug, Clone, PartialEq)]
pub enum SpawnOutcome {
    /// The child finished (completed, failed or cancelled) while the caller waited.
    Finished(TaskRecord),
    /// Started in the background.
    Background(TaskRecord),
    /// A sync spawn that did not finish within its wait; it keeps running as a background
    /// task.
    StillRunning(TaskRecord),
}

struct Live {
    tx: watch::Sender<TaskRecord>,
    cancel: CancellationToken,
    /// How a cancellation is recorded (status, reason); `None` = the parent was cancelled.
    stop: Arc<Mutex<Option<(TaskEvent, String)>>>,
    /// A sync spawn waits for the result: whichever of the finish and the waiter's timeout
    /// takes this flag decides whether the result counts as delivered by the tool result.
    sync_waiting: Arc<AtomicBool>,
}

/// The subagent runtime of one agent.
pub struct Subagents {
    agent: String,
    options: SubagentOptions,
    base: Vec<Declaration>,
    runner: OnceLock<Arc<dyn SubagentRunner>>,
    live: Mutex<HashMap<String, Live>>,
    slots: Arc<Semaphore>,
}

impl std::fmt::Debug for Subagents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subagents")
            .field("agent", &self.agent)
            .field("options", &self.options)
            .field("declarations", &self.base.len())
            .field("live", &self.live.lock().map(|l| l.len()).unwrap_or(0))
            .finish()
    }
}

/// Live entries kept before finished, undelivered ones are dropped from memory (they stay
/// on disk and are delivered from there).
const MAX_LIVE_ENTRIES: usize = 10_000;

impl Subagents {
    /// A runtime for `agent` with the code declarations `base` (the built-in
    /// general-purpose one included, when wanted). The runner is set once with
    /// [`set_runner`](Self::set_runner).
    pub fn new(agent: impl Into<String>, options: SubagentOptions, base: Vec<Declaration>) -> Self {
        let slots = Arc::new(Semaphore::new(options.max_concurrency.max(1)));
        Self {
            agent: agent.into(),
            options,
            base,
            runner: OnceLock::new(),
            live: Mutex::new(HashMap::new()),
            slots,
        }
    }

    /// Sets the runner of declarations without their own (the harness's). Only the first
    /// call counts.
    pub fn set_runner(&self, runner: Arc<dyn SubagentRunner>) {
        let _ = self.runner.set(runner);
    }

    /// The options.
    pub fn options(&self) -> &SubagentOptions {
        &self.options
    }

    /// The code declarations (built-in included).
    pub fn base(&self) -> &[Declaration] {
        &self.base
    }

    /// The declarations a caller sees (re-read on every call through its handle).
    pub async fn catalog(&self, ws: &Workspace) -> Catalog {
        Catalog::load(ws, &self.base).await
    }

    /// The task records of a workspace's agent.
    pub fn store(&self, ws: &Workspace) -> Result<TaskStore> {
        TaskStore::new(ws.records().clone(), &self.agent, &ws.identity().session)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Live>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn live_copy(&self, task_id: &str) -> Option<TaskRecord> {
        self.lock().get(task_id).map(|l| l.tx.borrow().clone())
    }

    fn is_live(&self, task_id: &str) -> bool {
        self.lock()
            .get(task_id)
            .is_some_and(|l| !l.tx.borrow().status.is_terminal())
    }

    /// Tasks this process keeps in memory: running, or finished and not yet delivered.
    pub fn tracked(&self) -> usize {
        self.lock().len()
    }

    /// Tasks of this process that have not finished.
    pub fn running(&self) -> usize {
        self.lock()
            .values()
            .filter(|l| !l.tx.borrow().status.is_terminal())
            .count()
    }

    /// Waits up to `timeout` for every unfinished task of this process; returns how many
    /// still run.
    pub async fn wait_idle(&self, timeout: Duration) -> usize {
        let receivers: Vec<_> = self
            .lock()
            .values()
            .filter(|l| !l.tx.borrow().status.is_terminal())
            .map(|l| l.tx.subscribe())
            .collect();
        let all = futures::future::join_all(receivers.into_iter().map(|mut rx| async move {
            let _ = rx.wait_for(|r| r.status.is_terminal()).await;
        }));
        let _ = tokio::time::timeout(timeout, all).await;
        self.running()
    }

    /// Stops every unfinished task of this process and records it `failed` with `reason`
    /// (a process about to exit); waits up to `grace` for the records.
    pub async fn interrupt_all(&self, reason: &str, grace: Duration) -> usize {
        let stopping: Vec<String> = {
            let live = self.lock();
            live.iter()
                .filter(|(_, l)| !l.tx.borrow().status.is_terminal())
                .map(|(id, l)| {
                    if let Ok(mut s) = l.stop.lock() {
                        *s = Some((TaskEvent::Fail, reason.to_owned()));
                    }
                    l.cancel.cancel();
                    id.clone()
                })
                .collect()
        };
        let n = stopping.len();
        if n > 0 {
            self.wait_idle(grace).await;
        }
        n
    }

    /// Marks the caller's orphaned records (`pending`/`running`, not run by this process,
    /// owner dead or silent past the lapse) `failed` as interrupted; returns the session's
    /// records afterwards.
    pub async fn sweep(&self, ws: &Workspace) -> Result<Vec<TaskRecord>> {
        let store = self.store(ws)?;
        let mut records = store.list().await?;
        let now = Utc::now();
        for r in &mut records {
            let live = self.is_live(&r.task_id);
            let gone = r.owner.as_ref().is_none_or(Holder::is_gone);
            if is_interrupted(r, live, gone, now, self.options.heartbeat_lapse) {
                let pid = r.owner.as_ref().map(|o| o.pid).unwrap_or_default();
                let reason = if gone {
                    format!(
                        "interrupted: the process that ran it (pid {pid}) stopped before it finished"
                    )
                } else {
                    format!(
                        "interrupted: the process that ran it (pid {pid}) stopped sending heartbeats"
                    )
                };
                r.apply(TaskEvent::Fail, now, Some(reason));
                store.save(r).await?;
            } else if let Some(fresh) = self.live_copy(&r.task_id) {
                *r = fresh;
            }
        }
        Ok(records)
    }

    /// The caller's task `task_id` (it must belong to the caller's session).
    async fn find(&self, ws: &Workspace, task_id: &str) -> Result<(TaskStore, TaskRecord)> {
        let store = self.store(ws)?;
        let id = ws.identity();
        let record = match self.live_copy(task_id) {
            Some(r) => Some(r),
            None => store.load(task_id).await?,
        };
        match record {
            Some(r) if r.parent_session == id.session && r.user == id.user => Ok((store, r)),
            _ => Err(Error::UnknownTask(task_id.chars().take(40).collect())),
        }
    }

    /// Spawns a child of the declaration `request.agent_id` for the caller of `ctx`.
    pub async fn spawn(
        self: &Arc<Self>,
        ctx: &ToolContext,
        request: SpawnRequest,
    ) -> Result<SpawnOutcome> {
        let depth = depth_of(&ctx.runtime);
        if depth >= self.options.max_depth {
            return Err(Error::DepthExceeded {
                depth,
                max: self.options.max_depth,
            });
        }
        let ws = workspace(ctx)?;
        let catalog = catalog_of(self, ctx).await?;
        let decl =
            catalog
                .get(&request.agent_id)
                .cloned()
                .ok_or_else(|| Error::UnknownSubagent {
                    id: request.agent_id.chars().take(64).collect(),
                    available: catalog.ids().join(", "),
                })?;
        let task_id = new_task_id();
        let parent = &ws.identity().session;
        let child_session = child_session_id(parent, &decl.spec.id, &task_id)?;
        let now = Utc::now();
        let timeout = self.timeout_of(&decl);
        let record = TaskRecord {
            task_id,
            agent_id: decl.spec.id.clone(),
            status: TaskStatus::Pending,
            parent_agent: self.agent.clone(),
            parent_session: parent.clone(),
            user: ws.identity().user.clone(),
            child_session,
            depth: depth + 1,
            task: request.message.clone(),
            background: request.background,
            result: None,
            error: None,
            iterations: None,
            timeout_seconds: timeout.as_secs(),
            cancel_requested: false,
            created_at: now,
            updated_at: now,
            heartbeat_at: now,
            delivered_at: None,
            delivery_call: None,
            owner: Some(Holder::current().clone()),
        };
        let mut record = record;
        // A free slot: the record is written once, as running.
        let permit = self.slots.clone().try_acquire_owned().ok();
        if permit.is_some() {
            record.apply(TaskEvent::Start, now, None);
        }
        let store = self.store(&ws)?;
        store.save(&record).await?;
        self.launch(ctx, &ws, store, decl, record, request, permit)
            .await
    }

    /// Continues a finished child's conversation (its own session) with a new message.
    pub async fn send(
        self: &Arc<Self>,
        ctx: &ToolContext,
        task_id: &str,
        request: SpawnRequest,
    ) -> Result<SpawnOutcome> {
        let ws = workspace(ctx)?;
        let (store, mut record) = self.find(&ws, task_id).await?;
        if !record.status.is_terminal() {
            return Err(Error::InvalidState(format!(
                "task {task_id} is still {}; wait for it with task_output, or task_cancel it",
                record.status.as_str()
            )));
        }
        let catalog = catalog_of(self, ctx).await?;
        let decl = catalog.get(&record.agent_id).cloned().ok_or_else(|| {
            Error::InvalidState(format!(
                "the subagent `{}` of task {task_id} is no longer declared",
                record.agent_id
            ))
        })?;
        record.apply(TaskEvent::Resend, Utc::now(), None);
        record.task = request.message.clone();
        record.background = request.background;
        record.owner = Some(Holder::current().clone());
        let permit = self.slots.clone().try_acquire_owned().ok();
        if permit.is_none() {
            // No slot yet: pending until one frees.
            record.status = TaskStatus::Pending;
        }
        store.save(&record).await?;
        self.launch(ctx, &ws, store, decl, record, request, permit)
            .await
    }

    fn timeout_of(&self, decl: &Declaration) -> Duration {
        decl.spec
            .timeout_seconds
            .map(Duration::from_secs)
            .unwrap_or(self.options.default_timeout)
            .min(self.options.max_timeout)
    }

    #[allow(clippy::too_many_arguments)]
    async fn launch(
        self: &Arc<Self>,
        ctx: &ToolContext,
        ws: &Workspace,
        store: TaskStore,
        decl: Declaration,
        record: TaskRecord,
        request: SpawnRequest,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<SpawnOutcome> {
        let parent_call = ctx.extensions.get::<ParentCall>().cloned();
        let parent = parent_call.clone().unwrap_or_default();
        let child_ws = child_workspace(ws, &decl, &record.child_session)?;
        let sync_waiting = Arc::new(AtomicBool::new(!request.background));
        let mut rx = self.start(
            store.clone(),
            decl,
            child_ws,
            record.clone(),
            parent,
            permit,
            sync_waiting.clone(),
        );
        if request.background {
            return Ok(SpawnOutcome::Background(record));
        }
        let wait = request
            .wait
            .unwrap_or(self.options.max_wait)
            .min(self.options.max_wait);
        let finished = tokio::time::timeout(wait, rx.wait_for(|r| r.status.is_terminal()))
            .await
            .map(|r| r.map(|r| r.clone()));
        match finished {
            Ok(Ok(r)) => Ok(SpawnOutcome::Finished(
                self.hand_over(&store, parent_call.as_ref(), r).await,
            )),
            Ok(Err(_)) => Err(Error::InvalidState(
                "the task ended without a record".into(),
            )),
            Err(_) if !sync_waiting.swap(false, Ordering::SeqCst) => {
                // The child finished as the wait ended, and its record counts the result as
                // delivered by this tool result: return it.
                let r = rx
                    .wait_for(|r| r.status.is_terminal())
                    .await
                    .map(|r| r.clone())
                    .map_err(|_| Error::InvalidState("the task ended without a record".into()))?;
                Ok(SpawnOutcome::Finished(
                    self.hand_over(&store, parent_call.as_ref(), r).await,
                ))
            }
            Err(_) => {
                let mut r = rx.borrow().clone();
                if !r.background {
                    r.background = true;
                    self.update(&r.task_id, |l| l.background = true);
                    if let Err(e) = store.save(&r).await {
                        tracing::warn!(error = %e, "saving a promoted task failed");
                    }
                }
                Ok(SpawnOutcome::StillRunning(r))
            }
        }
    }

    fn update(&self, task_id: &str, f: impl FnOnce(&mut TaskRecord)) {
        if let Some(l) = self.lock().get(task_id) {
            l.tx.send_modify(f);
        }
    }

    /// Marks a terminal record delivered now (memory and store) and frees its live entry.
    /// Inside a harness call a result is only marked once the call's state is saved
    /// ([`hand_over`](Self::hand_over), [`confirm_deliveries`](Self::confirm_deliveries)).
    pub async fn mark_delivered(&self, store: &TaskStore, record: TaskRecord) -> TaskRecord {
        let record = self.claim(record);
        self.confirm(store, record).await
    }

    /// Takes a terminal result for the caller: delivered in memory (so nothing in this
    /// process hands it over again) and its live entry freed; the store is not written.
    pub(crate) fn claim(&self, mut record: TaskRecord) -> TaskRecord {
        if record.status.is_terminal() {
            record.delivered_at.get_or_insert_with(Utc::now);
            self.lock().remove(&record.task_id);
        }
        record
    }

    /// Writes a claimed record delivered — unless the stored record is another run by now
    /// (an `agent_send` after the delivery, in the same call), whose result is still to
    /// deliver.
    pub(crate) async fn confirm(&self, store: &TaskStore, mut record: TaskRecord) -> TaskRecord {
        record.delivered_at.get_or_insert_with(Utc::now);
        record.delivery_call = None;
        self.write_delivered(store, &record).await;
        record
    }

    /// Writes `record` (delivered) over the stored one if that is still the same run;
    /// returns whether it wrote.
    async fn write_delivered(&self, store: &TaskStore, record: &TaskRecord) -> bool {
        let failed = |e: &Error| {
            tracing::warn!(task = %record.task_id, error = %e, "marking a task delivered failed; the next call of the session does");
        };
        match store.load(&record.task_id).await {
            Ok(Some(stored)) if stored.delivery_key() != record.delivery_key() => {
                tracing::debug!(task = %record.task_id, "the task ran again since its delivery: not marked");
                return false;
            }
            Ok(_) => {}
            Err(e) => {
                failed(&e);
                return false;
            }
        }
        match store.save(record).await {
            Ok(()) => true,
            Err(e) => {
                failed(&e);
                false
            }
        }
    }

    /// A result handed to the caller (pushed, or returned by `task_output` / a sync spawn):
    /// claimed now, marked delivered once the parent call's state is saved — or now,
    /// outside a harness call (no [`ParentCall`]).
    pub(crate) async fn hand_over(
        &self,
        store: &TaskStore,
        parent: Option<&ParentCall>,
        record: TaskRecord,
    ) -> TaskRecord {
        let record = self.claim(record);
        if !record.status.is_terminal() {
            return record;
        }
        match parent {
            Some(p) => {
                p.deliveries.add(record.clone());
                record
            }
            None => self.confirm(store, record).await,
        }
    }

    /// Marks the results a call took delivered, after the call's state (which holds them)
    /// was saved; stops when `held` says the call's session lease is lost (the next holder's
    /// call marks them, finding them in the state). Returns how many were marked.
    pub async fn confirm_deliveries(
        &self,
        ws: &Workspace,
        deliveries: &Deliveries,
        held: impl Fn() -> bool,
    ) -> usize {
        let records = deliveries.take();
        if records.is_empty() {
            return 0;
        }
        let store = match self.store(ws) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "marking delivered tasks failed; the next call of the session does");
                return 0;
            }
        };
        let mut marked = 0;
        for mut record in records {
            if !held() {
                tracing::warn!(task = %record.task_id, "the session lease is lost: the task is marked delivered by the next call");
                break;
            }
            record.delivered_at.get_or_insert_with(Utc::now);
            record.delivery_call = None;
            if self.write_delivered(&store, &record).await {
                marked += 1;
            }
        }
        marked
    }

    /// The agent whose tasks these are.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// Terminal, undelivered tasks of this process for the caller's session, marked
    /// delivered in memory and freed (the caller saves the records).
    pub fn take_finished(&self, ws: &Workspace) -> Vec<TaskRecord> {
        let id = ws.identity();
        let mut live = self.lock();
        let done: Vec<String> = live
            .iter()
            .filter(|(_, l)| {
                let r = l.tx.borrow();
                r.undelivered() && r.parent_session == id.session && r.user == id.user
            })
            .map(|(k, _)| k.clone())
            .collect();
        done.into_iter()
            .filter_map(|k| live.remove(&k).map(|l| l.tx.borrow().clone()))
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn start(
        self: &Arc<Self>,
        store: TaskStore,
        decl: Declaration,
        child_ws: Workspace,
        record: TaskRecord,
        parent: ParentCall,
        permit: Option<OwnedSemaphorePermit>,
        sync_waiting: Arc<AtomicBool>,
    ) -> watch::Receiver<TaskRecord> {
        let cancel = parent.cancel.child_token();
        let (tx, rx) = watch::channel(record.clone());
        let stop = Arc::new(Mutex::new(None));
        {
            let mut live = self.lock();
            if live.len() >= MAX_LIVE_ENTRIES {
                let old: Vec<String> = live
                    .iter()
                    .filter(|(_, l)| l.tx.borrow().status.is_terminal())
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in old {
                    live.remove(&k);
                }
            }
            live.insert(
                record.task_id.clone(),
                Live {
                    tx: tx.clone(),
                    cancel: cancel.clone(),
                    stop: stop.clone(),
                    sync_waiting,
                },
            );
        }
        let this = self.clone();
        tokio::spawn(async move {
            this.drive(
                store,
                decl,
                child_ws,
                record,
                parent.events,
                parent.inherit,
                cancel,
                stop,
                tx,
                permit,
            )
            .await;
        });
        rx
    }

    #[allow(clippy::too_many_arguments)]
    async fn drive(
        self: Arc<Self>,
        store: TaskStore,
        decl: Declaration,
        child_ws: Workspace,
        mut record: TaskRecord,
        parent_events: EventSink,
        inherit: std::collections::BTreeMap<String, serde_json::Value>,
        cancel: CancellationToken,
        stop: Arc<Mutex<Option<(TaskEvent, String)>>>,
        tx: watch::Sender<TaskRecord>,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let tag = |event: AgentEvent, r: &TaskRecord| AgentEvent::Subagent {
            task_id: r.task_id.clone(),
            agent_id: r.agent_id.clone(),
            event: Box::new(event),
        };
        let stop_reason = |default: (TaskEvent, String)| {
            stop.lock().ok().and_then(|s| s.clone()).unwrap_or(default)
        };
        // A slot first (the concurrency bound); a cancel while waiting ends it here.
        let permit = match permit {
            Some(p) => Some(p),
            None => tokio::select! {
                p = self.slots.clone().acquire_owned() => p.ok(),
                _ = cancel.cancelled() => None,
            },
        };
        let Some(_permit) = permit else {
            let (event, reason) =
                stop_reason((TaskEvent::Cancel, "cancelled before it started".into()));
            self.finish(&store, &mut record, event, Some(reason), None, &tx)
                .await;
            parent_events.emit(tag(finished_event(&record), &record));
            return;
        };
        if record.status == TaskStatus::Pending {
            // It waited for a slot: now it runs.
            record.apply(TaskEvent::Start, Utc::now(), None);
            record.owner = Some(Holder::current().clone());
            if let Err(e) = store.save(&record).await {
                tracing::warn!(task = %record.task_id, error = %e, "saving a started task failed");
            }
            tx.send_replace(record.clone());
        }
        tracing::debug!(task = %record.task_id, agent = %record.agent_id, "subagent task started");
        parent_events.emit(tag(
            AgentEvent::Custom {
                kind: "subagent.started".into(),
                data: serde_json::json!({ "child_session": record.child_session, "depth": record.depth }),
            },
            &record,
        ));

        // The child's events, tagged, into the parent's stream.
        let (child_sink, mut child_rx) = EventSink::channel();
        let forward = {
            let events = parent_events.clone();
            let (task_id, agent_id) = (record.task_id.clone(), record.agent_id.clone());
            tokio::spawn(async move {
                while let Some(ev) = child_rx.recv().await {
                    events.emit(AgentEvent::Subagent {
                        task_id: task_id.clone(),
                        agent_id: agent_id.clone(),
                        event: Box::new(ev),
                    });
                }
            })
        };
        let runner = decl.runner.clone().or_else(|| self.runner.get().cloned());
        let timeout = Duration::from_secs(record.timeout_seconds.max(1));
        let outcome = match runner {
            None => Err(Outcome::Failed("no subagent runner is configured".into())),
            Some(runner) => {
                let run = ChildRun {
                    spec: decl.spec.clone(),
                    message: record.task.clone(),
                    runtime: child_runtime(&record, &decl.spec, inherit),
                    workspace: child_ws,
                    depth: record.depth,
                    may_spawn: record.depth < self.options.max_depth,
                    events: child_sink,
                    cancel: cancel.clone(),
                    env: self.options.env.clone(),
                };
                self.supervise(&store, &mut record, runner, run, timeout, &cancel)
                    .await
            }
        };
        let _ = forward.await;
        tracing::debug!(task = %record.task_id, ok = outcome.is_ok(), "subagent run ended");
        // What the outcome means for the record: (event, detail, iterations).
        let (event, detail, iterations) = match outcome {
            Ok(reply) => (TaskEvent::Complete, reply.text, Some(reply.iterations)),
            Err(Outcome::TimedOut) => (
                TaskEvent::Fail,
                format!(
                    "timed out after {} s (its wall-clock limit)",
                    timeout.as_secs()
                ),
                None,
            ),
            Err(Outcome::Failed(reason)) if !cancel.is_cancelled() => {
                (TaskEvent::Fail, reason, None)
            }
            Err(Outcome::Failed(_)) => {
                let (event, reason) =
                    stop_reason((TaskEvent::Cancel, "the parent call was cancelled".into()));
                (event, reason, None)
            }
        };
        self.finish(&store, &mut record, event, Some(detail), iterations, &tx)
            .await;
        parent_events.emit(tag(finished_event(&record), &record));
    }

    /// Runs the child under its time limit with heartbeats; a cancellation asked by
    /// another process (in the record) cancels it.
    async fn supervise(
        &self,
        store: &TaskStore,
        record: &mut TaskRecord,
        runner: Arc<dyn SubagentRunner>,
        run: ChildRun,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<ChildReply, Outcome> {
        let work = runner.run(run);
        tokio::pin!(work);
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let period = self.options.heartbeat.max(Duration::from_millis(50));
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                // The child's failure is recorded and told to the parent and to API
                // callers: without secrets or model endpoints, as a failed turn's note.
                r = &mut work => return r.map_err(|e| {
                    Outcome::Failed(hame_core::secrets::redact_for_callers(&e).into_owned())
                }),
                _ = &mut deadline => {
                    cancel.cancel();
                    // Let the child save what it has (bounded).
                    let _ = tokio::time::timeout(Duration::from_secs(5), &mut work).await;
                    return Err(Outcome::TimedOut);
                }
                _ = ticker.tick() => {
                    if let Ok(Some(stored)) = store.load(&record.task_id).await
                        && stored.cancel_requested
                    {
                        if let Some(l) = self.lock().get(&record.task_id)
                            && let Ok(mut s) = l.stop.lock()
                        {
                            *s = Some((TaskEvent::Cancel, "cancelled by task_cancel (from another process)".into()));
                        }
                        cancel.cancel();
                    }
                    record.heartbeat_at = Utc::now();
                    if let Err(e) = store.save(record).await {
                        tracing::warn!(task = %record.task_id, error = %e, "task heartbeat failed");
                    }
                }
            }
        }
    }

    async fn finish(
        &self,
        store: &TaskStore,
        record: &mut TaskRecord,
        event: TaskEvent,
        detail: Option<String>,
        iterations: Option<usize>,
        tx: &watch::Sender<TaskRecord>,
    ) {
        let now = Utc::now();
        record.apply(event, now, detail);
        if iterations.is_some() {
            record.iterations = iterations;
        }
        // A sync spawn still waiting gets the result in its tool result: it is marked
        // delivered once the parent's call has saved that result (written undelivered here,
        // so a crash of the parent before its save leaves it to be pushed).
        let waited = self
            .lock()
            .get(&record.task_id)
            .is_some_and(|l| l.sync_waiting.swap(false, Ordering::SeqCst));
        // A failed write is retried once: a record must not stay `running`.
        if store.save(record).await.is_err()
            && let Err(e) = store.save(record).await
        {
            tracing::error!(task = %record.task_id, error = %e, "saving a finished task failed; the next call marks it interrupted");
        }
        if waited && record.status.is_terminal() {
            // In memory only: nothing in this process pushes what the waiting tool returns.
            record.delivered_at = Some(now);
        }
        tx.send_replace(record.clone());
    }

    /// `task_output`: the record, after waiting up to `wait` for it to finish; a terminal
    /// result is marked delivered.
    pub async fn output(
        &self,
        ctx: &ToolContext,
        task_id: &str,
        wait: Duration,
    ) -> Result<TaskRecord> {
        let ws = workspace(ctx)?;
        let (store, mut record) = self.find(&ws, task_id).await?;
        let wait = wait.min(self.options.max_wait);
        if !record.status.is_terminal() && !wait.is_zero() {
            let rx = self.lock().get(task_id).map(|l| l.tx.subscribe());
            match rx {
                Some(mut rx) => {
                    if let Ok(Ok(r)) =
                        tokio::time::timeout(wait, rx.wait_for(|r| r.status.is_terminal())).await
                    {
                        record = r.clone();
                    } else if let Some(r) = self.live_copy(task_id) {
                        record = r;
                    }
                }
                None => {
                    // Run by another process: poll its record.
                    let until = tokio::time::Instant::now() + wait;
                    while tokio::time::Instant::now() < until {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        if let Some(r) = store.load(task_id).await? {
                            record = r;
                            if record.status.is_terminal() {
                                break;
                            }
                        }
                    }
                }
            }
        }
        if record.status.is_terminal() {
            let parent = ctx.extensions.get::<ParentCall>();
            record = self.hand_over(&store, parent, record).await;
        }
        Ok(record)
    }

    /// `task_list`: the records of the caller's session (orphans marked first).
    pub async fn list(&self, ctx: &ToolContext) -> Result<Vec<TaskRecord>> {
        let ws = workspace(ctx)?;
        self.sweep(&ws).await
    }

    /// `task_cancel`: stops a running child (its model request is abandoned, its tools and
    /// children cancelled) and records it `cancelled`.
    pub async fn cancel(&self, ctx: &ToolContext, task_id: &str) -> Result<TaskRecord> {
        let ws = workspace(ctx)?;
        let (store, mut record) = self.find(&ws, task_id).await?;
        if record.status.is_terminal() {
            return Err(Error::InvalidState(format!(
                "task {task_id} is already {}",
                record.status.as_str()
            )));
        }
        let rx = {
            let live = self.lock();
            live.get(task_id).map(|l| {
                if let Ok(mut s) = l.stop.lock() {
                    *s = Some((TaskEvent::Cancel, "cancelled by task_cancel".into()));
                }
                l.cancel.cancel();
                l.tx.subscribe()
            })
        };
        if let Some(mut rx) = rx {
            if let Ok(Ok(r)) = tokio::time::timeout(
                Duration::from_secs(10),
                rx.wait_for(|r| r.status.is_terminal()),
            )
            .await
            {
                record = r.clone();
            }
            return Ok(record);
        }
        // Another process runs it (or ran it and died).
        if record.owner.as_ref().is_none_or(Holder::is_gone) {
            record.apply(
                TaskEvent::Cancel,
                Utc::now(),
                Some("cancelled by task_cancel".into()),
            );
        } else {
            record.cancel_requested = true;
            record.updated_at = Utc::now();
        }
        store.save(&record).await?;
        Ok(record)
    }
}

enum Outcome {
    Failed(String),
    TimedOut,
}

fn finished_event(r: &TaskRecord) -> AgentEvent {
    AgentEvent::Custom {
        kind: format!("subagent.{}", r.status.as_str()),
        data: serde_json::json!({
            "status": r.status.as_str(),
            "error": r.error,
            "iterations": r.iterations,
        }),
    }
}

fn workspace(ctx: &ToolContext) -> Result<Workspace> {
    ctx.workspace()
        .cloned()
        .map_err(|e| Error::Config(e.message))
}

/// The declarations `ctx`'s caller sees, from the step's snapshot (the specs its prompt
/// listed; no store round trip).
async fn catalog_of(subagents: &Subagents, ctx: &ToolContext) -> Result<Catalog> {
    let ws = ctx
        .config_workspace()
        .map_err(|e| Error::Config(e.message))?;
    Ok(subagents.catalog(&ws).await)
}

/// A caller's depth (0 for the top-level agent).
pub fn depth_of(runtime: &RuntimeContext) -> usize {
    runtime
        .extras
        .get(DEPTH_EXTRA)
        .and_then(serde_json::Value::as_u64)
        .and_then(|d| usize::try_from(d).ok())
        .unwrap_or(0)
}

fn child_runtime(
    record: &TaskRecord,
    spec: &crate::spec::SubagentSpec,
    inherit: std::collections::BTreeMap<String, serde_json::Value>,
) -> RuntimeContext {
    let mut rt = RuntimeContext::new(record.child_session.clone());
    rt.extras = inherit;
    let mut rt = rt
        .with_extra(DEPTH_EXTRA, serde_json::json!(record.depth))
        .with_extra(TASK_EXTRA, serde_json::json!(record.task_id));
    if let Some(u) = &record.user {
        rt = rt.with_user(u.clone());
    }
    if let Some(tools) = &spec.tools {
        rt = rt.with_extra(TOOLS_EXTRA, serde_json::json!(tools));
    }
    rt
}

/// The child's session id: `<parent>@<spec>-<12 hex of the task>`, the parent part cut so
/// the whole stays within the id limit.
pub fn child_session_id(parent: &str, spec: &str, task_id: &str) -> Result<String> {
    let hex = task_id.strip_prefix("task-").unwrap_or(task_id);
    let tail = format!("@{spec}-{hex}");
    let room = hame_id::MAX_ID_LEN.saturating_sub(tail.len());
    let head: String = parent.chars().take(room).collect();
    let id = format!("{head}{tail}");
    hame_id::validate("child session id", &id).map_err(|e| Error::Config(e.to_string()))?;
    Ok(id)
}

fn child_workspace(ws: &Workspace, decl: &Declaration, session: &str) -> Result<Workspace> {
    match decl.spec.workspace {
        SpecWorkspace::Shared => Ok(ws.for_session(session)),
        SpecWorkspace::Isolated => {
            let dir = hame_fs::FsPath::parse(&format!("subagents/{}/workspace", decl.spec.id))
                .map_err(|e| Error::Config(e.to_string()))?;
            let files: Arc<dyn hame_fs::Filesystem> =
                Arc::new(hame_fs::PrefixFs::new(ws.home().clone(), dir));
            let id = ws.identity();
            let identity = hame_tools::Identity::new(id.agent.clone(), id.user.as_deref(), session);
            // No shell: it would run in the parent's workspace.
            Ok(
                Workspace::new(identity, ws.mode(), files.clone(), ws.records().clone())
                    .with_home(files, hame_fs::FsPath::root()),
            )
        }
    }
}
