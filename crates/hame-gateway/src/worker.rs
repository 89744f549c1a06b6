//! The worker: claims runs from the queue ([`hame::state::runs::RunQueue`]) and executes
//! them with the harness, heartbeating each one; what `hame worker` runs and what
//! `hame serve` runs beside its routes (unless `--no-worker`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hame::state::runs::{Claim, ClaimOptions, Run, RunEnd, RunError, RunInput, RunQueue};
use hame::{CancellationToken, EventSink, HarnessAgent, Message, RuntimeContext};
use serde_json::json;
use tokio_util::task::TaskTracker;

use crate::error::{ApiError, for_callers};

/// Settings of a [`Worker`]; `Default` gives the documented defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerOptions {
    /// Runs executed at once by this process (default 4).
    pub concurrency: usize,
    /// How long a claim lasts without a heartbeat before another worker reclaims the run
    /// (default [`hame::state::runs::DEFAULT_RUN_LAPSE`], 14 s).
    pub lapse: Duration,
    /// How often a running run is heartbeated and its cancel flag read (default
    /// [`hame::state::runs::HEARTBEAT_EVERY`], 1 s; at most a third of the lapse).
    pub heartbeat: Duration,
    /// The name written into claimed runs (default `<host>:<pid>`).
    pub name: String,
    /// Finished runs older than this are deleted by the worker, every
    /// [`PURGE_EVERY`] (default [`hame::state::runs::DEFAULT_KEEP_FINISHED`], 7 days;
    /// `None` keeps them for good).
    pub keep_finished: Option<Duration>,
}

/// How often a worker deletes the finished runs past [`WorkerOptions::keep_finished`]
/// (10 min; also once when it starts), at most [`PURGE_BATCH`] per statement.
pub const PURGE_EVERY: Duration = Duration::from_secs(600);
/// Finished runs deleted per statement (1,000); a purge repeats while a batch is full.
pub const PURGE_BATCH: usize = 1000;

impl Default for WorkerOptions {
    fn default() -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "host".into());
        Self {
            concurrency: 4,
            lapse: hame::state::runs::DEFAULT_RUN_LAPSE,
            heartbeat: hame::state::runs::HEARTBEAT_EVERY,
            name: format!("{host}:{}", std::process::id()),
            keep_finished: Some(hame::state::runs::DEFAULT_KEEP_FINISHED),
        }
    }
}

impl WorkerOptions {
    /// With this many runs at once (at least 1).
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Keeping finished runs this long (`None`: for good).
    pub fn with_keep_finished(mut self, keep: Option<Duration>) -> Self {
        self.keep_finished = keep;
        self
    }

    /// With this claim lapse (the heartbeat becomes at most a third of it).
    pub fn with_lapse(mut self, lapse: Duration) -> Self {
        self.lapse = lapse.max(Duration::from_millis(300));
        self.heartbeat = self.heartbeat.min(self.lapse / 3);
        self
    }
}

/// Deletes `agent`'s finished runs older than `keep`, a batch at a time.
async fn purge(queue: &dyn RunQueue, agent: &str, keep: Duration) {
    let Some(before) = chrono::TimeDelta::from_std(keep)
        .ok()
        .and_then(|k| chrono::Utc::now().checked_sub_signed(k))
    else {
        return;
    };
    let mut total = 0;
    loop {
        match queue.purge_finished(agent, before, PURGE_BATCH).await {
            Ok(n) => {
                total += n;
                if n < PURGE_BATCH {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "deleting finished runs failed; trying again later");
                break;
            }
        }
    }
    if total > 0 {
        tracing::info!(runs = total, "deleted finished runs past their retention");
    }
}

/// The end of a task run, from the task record as it ended.
fn task_end(record: &hame::subagent::TaskRecord) -> RunEnd {
    use hame::subagent::TaskStatus;
    match record.status {
        TaskStatus::Completed => RunEnd::Completed {
            reply: for_callers(json!(record.result.clone().unwrap_or_default()))
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            usage: json!({}),
            verification: None,
        },
        TaskStatus::Cancelled => RunEnd::Cancelled,
        status => RunEnd::Failed(RunError {
            code: "subagent_failed".into(),
            message: for_callers(json!(
                record
                    .error
                    .clone()
                    .unwrap_or_else(|| format!("the task is {}", status.as_str()))
            ))
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        }),
    }
}

/// Drains a run queue with one agent.
#[derive(Debug, Clone)]
pub struct Worker {
    agent: HarnessAgent,
    base: RuntimeContext,
    queue: Arc<dyn RunQueue>,
    options: WorkerOptions,
}

impl Worker {
    /// A worker executing the runs of `agent` from `queue`; each run's context is `base`
    /// with the run's session and user.
    pub fn new(
        agent: HarnessAgent,
        base: RuntimeContext,
        queue: Arc<dyn RunQueue>,
        options: WorkerOptions,
    ) -> Self {
        // Background subagent tasks of this agent become runs of this queue.
        agent.use_run_queue(queue.clone());
        Self {
            agent,
            base,
            queue,
            options,
        }
    }

    /// Claims and executes runs until `stop` is cancelled, then waits for the runs in
    /// flight (they are cancelled when `abort` is).
    pub async fn run(self, stop: CancellationToken, abort: CancellationToken) {
        let slots = Arc::new(tokio::sync::Semaphore::new(self.options.concurrency));
        let tasks = TaskTracker::new();
        let claim = ClaimOptions::new(
            self.agent.name(),
            self.options.name.clone(),
            self.options.lapse,
        );
        tracing::info!(worker = %self.options.name, concurrency = self.options.concurrency, "worker started");
        let purger = self.options.keep_finished.map(|keep| {
            let (queue, agent, stop) = (
                self.queue.clone(),
                self.agent.name().to_owned(),
                stop.clone(),
            );
            tokio::spawn(async move {
                loop {
                    purge(queue.as_ref(), &agent, keep).await;
                    tokio::select! {
                        () = tokio::time::sleep(PURGE_EVERY) => {}
                        () = stop.cancelled() => return,
                    }
                }
            })
        });
        'outer: loop {
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                () = stop.cancelled() => break,
            };
            loop {
                if stop.is_cancelled() {
                    break 'outer;
                }
                match self.queue.claim(&claim).await {
                    Ok(Some(c)) => {
                        let me = self.clone();
                        let abort = abort.clone();
                        let span = tracing::info_span!("hame.run", run = %c.run.id, session = %c.run.session, attempt = c.attempt);
                        // The run continues the submitting request's trace, in whichever
                        // replica executes it.
                        if let RunInput::Message { trace, .. } = &c.run.input {
                            crate::http_trace::continue_trace(&span, trace);
                        }
                        tasks.spawn(tracing::Instrument::instrument(
                            async move {
                                me.execute(c, abort).await;
                                drop(permit);
                            },
                            span,
                        ));
                        break;
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "run queue: claim failed; retrying"),
                }
                tokio::select! {
                    r = self.queue.wait_for_work(Duration::from_secs(1)) => {
                        if let Err(e) = r {
                            tracing::warn!(error = %e, "run queue: waiting for work failed");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                    () = stop.cancelled() => break 'outer,
                }
            }
        }
        if let Some(p) = purger {
            p.abort();
        }
        tasks.close();
        tasks.wait().await;
        tracing::info!(worker = %self.options.name, "worker stopped");
    }

    /// Executes one claimed run: heartbeats it, runs the turn (or the subagent task),
    /// writes its end under the claim.
    async fn execute(&self, claim: Claim, abort: CancellationToken) {
        let run = &claim.run;
        match &run.input {
            RunInput::Message {
                message,
                extras,
                verify,
                verify_attempts,
                ..
            } => {
                self.execute_message(&claim, message, extras, verify, *verify_attempts, abort)
                    .await;
            }
            RunInput::SubagentTask {
                task_id,
                parent_session,
                inherit,
            } => {
                self.execute_task(&claim, task_id, parent_session, inherit, abort)
                    .await;
            }
            #[allow(unreachable_patterns)]
            _ => {
                let end = RunEnd::Failed(RunError {
                    code: "unsupported".into(),
                    message: "this worker cannot execute this kind of run; upgrade it".into(),
                });
                self.finish(&claim, &end).await;
            }
        }
    }

    /// A message run: the turn of the run's session, or, once a decision was recorded on
    /// its approvals ([`RunQueue::decide`]), the resumption of its suspended turn with
    /// those decisions.
    async fn execute_message(
        &self,
        claim: &Claim,
        message: &str,
        extras: &serde_json::Map<String, serde_json::Value>,
        verify: &[String],
        verify_attempts: Option<u32>,
        abort: CancellationToken,
    ) {
        let run = &claim.run;
        if run.cancel_requested {
            self.finish(claim, &RunEnd::Cancelled).await;
            return;
        }
        let mut ctx = self.base.clone();
        ctx.session_id = run.session.clone();
        ctx.user_id = run.user.clone();
        ctx.extras
            .extend(extras.iter().map(|(k, v)| (k.clone(), v.clone())));
        run_context(&mut ctx, claim);
        if !verify.is_empty() {
            ctx = hame::harness::evidence::require_checks(ctx, verify, verify_attempts);
        }
        // Taken over from a worker that died (or resumed by a decision): if its turn was
        // saved, it is not run again.
        if claim.attempt > 1
            && let Some(end) = self.already_ran(&ctx, run).await
        {
            tracing::info!(run = %run.id, "the run's turn was saved by its previous worker; not running it again");
            self.finish(claim, &end).await;
            return;
        }
        // A message for a session whose calls still wait for a decision (its waiting run
        // was cancelled, or a turn outside the queue suspended it) is not taken by the
        // harness, which would answer it with those calls: fail the run saying so rather
        // than swallow its message.
        if resolutions(run).is_none()
            && let Some(end) = self.session_waits(&ctx, &run.id).await
        {
            self.finish(claim, &end).await;
            return;
        }
        let cancel = abort.child_token();
        let beats = Beating::start(
            self.queue.clone(),
            claim.clone(),
            cancel.clone(),
            self.options.heartbeat,
        );
        let (sink, mut events) = EventSink::channel();
        let drain = tokio::spawn(async move { while events.recv().await.is_some() {} });
        let result = match resolutions(run) {
            Some(decided) => self.agent.resume(decided, &ctx, &sink, &cancel).await,
            None => {
                self.agent
                    .call_with(Message::user(message.to_owned()), &ctx, &sink, &cancel)
                    .await
            }
        };
        beats.stop();
        drop(sink);
        drain.abort();
        if beats.lost() {
            return;
        }
        if abort.is_cancelled() && !beats.cancelled() {
            // Shut down mid-run: another worker reclaims it after its lapse.
            tracing::warn!(run = %run.id, "worker stopped mid-run; the run is left for another worker");
            return;
        }
        let end = end_of(&result, beats.cancelled());
        self.finish(claim, &end).await;
    }

    /// A background subagent task (docs/subagents.md, *Replicas*): the child runs here
    /// under the run's heartbeats, its end goes into the task record (whence the parent's
    /// next call takes it, on any replica) and into the run. A run taken over from a dead
    /// worker continues the child; one whose record had already ended just ends like it.
    async fn execute_task(
        &self,
        claim: &Claim,
        task_id: &str,
        parent_session: &str,
        inherit: &std::collections::BTreeMap<String, serde_json::Value>,
        abort: CancellationToken,
    ) {
        let run = &claim.run;
        let mut ctx = self.base.clone();
        ctx.session_id = parent_session.to_owned();
        ctx.user_id = run.user.clone();
        // The run's cancel (task_cancel, the runs route) and this worker's stop (shutdown,
        // a lost claim) end the task differently: cancelled, or failed as interrupted.
        let cancel = CancellationToken::new();
        let stopped = abort.child_token();
        let beats = Beating::start(
            self.queue.clone(),
            claim.clone(),
            cancel.clone(),
            self.options.heartbeat,
        );
        let watch = {
            let (cancel, stopped, lost) = (cancel.clone(), stopped.clone(), beats.lost.clone());
            tokio::spawn(async move {
                cancel.cancelled().await;
                if lost.load(std::sync::atomic::Ordering::Acquire) {
                    stopped.cancel();
                }
            })
        };
        if run.cancel_requested {
            cancel.cancel();
        }
        let result = self
            .agent
            .run_task(&ctx, &run.id, task_id, inherit.clone(), &cancel, &stopped)
            .await;
        beats.stop();
        watch.abort();
        if beats.lost() {
            return;
        }
        if abort.is_cancelled() && !beats.cancelled() && !run.cancel_requested {
            tracing::warn!(run = %run.id, "worker stopped mid-task; the run is left for another worker");
            return;
        }
        let end = match result {
            Ok(record) => task_end(&record),
            Err(e) => {
                let err = ApiError::from_harness(&e);
                RunEnd::Failed(RunError {
                    code: "task_unavailable".into(),
                    message: err.message,
                })
            }
        };
        self.finish(claim, &end).await;
    }

    /// `failed` (`session_waiting`) when the session has calls waiting for a decision;
    /// `None` when it has none (or its state cannot be read: the turn then says).
    async fn session_waits(&self, ctx: &RuntimeContext, id: &str) -> Option<RunEnd> {
        let pending = match self.agent.pending(ctx).await {
            Ok(p) => p?,
            Err(e) => {
                tracing::warn!(run = %id, error = %e, "reading the session state failed; running the run");
                return None;
            }
        };
        let ids: Vec<&str> = pending
            .calls
            .iter()
            .map(|c| c.suspension.id.as_str())
            .collect();
        Some(RunEnd::Failed(RunError {
            code: "session_waiting".into(),
            message: format!(
                "the session's calls wait for a decision ({}): decide them (POST /v1/sessions/{}/approvals/{{id}}), then submit the message again",
                ids.join(", "),
                ctx.session_id
            ),
        }))
    }

    /// The end of `run` when the session's saved state says its turn already ran (the
    /// harness records the run id with the turn's fenced save): see [`saved_end`]. `None`
    /// when it did not run, or when the state cannot be read (then the run is executed).
    async fn already_ran(&self, ctx: &RuntimeContext, run: &Run) -> Option<RunEnd> {
        match self.agent.state(ctx).await {
            Ok(Some(state)) => saved_end(&state, run),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(run = %run.id, error = %e, "reading the session state failed; running the run");
                None
            }
        }
    }

    async fn finish(&self, claim: &Claim, end: &RunEnd) {
        match self.queue.finish(claim, end).await {
            Ok(run) => tracing::info!(run = %run.id, status = %run.status, "run finished"),
            Err(e) => {
                tracing::warn!(run = %claim.run.id, error = %e, "run could not be finished; another worker reclaims it")
            }
        }
    }
}

/// Names the claimed run and its attempt in a call's context: the harness tags the
/// call's records with both, saves them with the state, and above the attempt the state
/// holds adopts what earlier attempts logged and did not save (docs/replicas.md).
pub(crate) fn run_context(ctx: &mut RuntimeContext, claim: &Claim) {
    ctx.extras.insert(
        hame::harness::RUN_ID_EXTRA.to_owned(),
        serde_json::Value::String(claim.run.id.clone()),
    );
    ctx.extras.insert(
        hame::harness::RUN_ATTEMPT_EXTRA.to_owned(),
        serde_json::Value::from(claim.attempt),
    );
}

/// The end of a message run's turn: its reply (`completed`, or `unverified` when its
/// required checks' verdict says so, docs/evidence.md), the calls that wait
/// (`waiting_approval`), `cancelled` when a cancel of the run stopped it, else `failed`.
fn end_of(result: &hame::harness::Result<hame::CallOutput>, cancelled: bool) -> RunEnd {
    match result {
        Ok(out) => {
            let body = for_callers(json!({
                "reply": out.reply.text_content(),
                "usage": out.usage,
                "verification": out.verification,
            }));
            let reply = body["reply"].as_str().unwrap_or_default().to_owned();
            let usage = crate::runs::run_usage(
                &body["usage"],
                u64::try_from(out.iterations).unwrap_or(u64::MAX),
            );
            // A run with required checks ends `unverified` when the gate's verdict says so,
            // with the failing evidence (docs/evidence.md).
            match &out.verification {
                Some(v) if v.status == hame::VerificationStatus::Unverified => RunEnd::Unverified {
                    reply,
                    usage,
                    verification: body["verification"].clone(),
                },
                Some(_) => RunEnd::Completed {
                    reply,
                    usage,
                    verification: Some(body["verification"].clone()),
                },
                None => RunEnd::Completed {
                    reply,
                    usage,
                    verification: None,
                },
            }
        }
        Err(hame::harness::Error::Call(hame::Error::Suspended(s))) => {
            let approvals: Vec<serde_json::Value> =
                s.calls.iter().map(crate::turn::approval).collect();
            RunEnd::WaitingApproval(for_callers(json!(approvals)))
        }
        Err(_) if cancelled => RunEnd::Cancelled,
        Err(e) => {
            let err = ApiError::from_harness(e);
            RunEnd::Failed(RunError {
                code: err.code.to_owned(),
                message: err.message,
            })
        }
    }
}

/// Resumes, in this process, a waiting run that a decision claimed
/// ([`RunQueue::decide`]): the session's suspended turn with the run's decisions
/// ([`Run::decisions`]), under heartbeats of the claim (every
/// [`hame::state::runs::HEARTBEAT_EVERY`]; a cancel of the run, from any replica, stops
/// the turn), then writes the run's end — what `hame approve` does on a session whose
/// waiting run is in the store. `ctx` is the session's context; the run's own extras (a
/// caller's budget, checks) are added. When another worker took the run over meanwhile,
/// its end is not written (the other worker's is).
pub async fn resume_claimed(
    agent: &HarnessAgent,
    ctx: &RuntimeContext,
    queue: Arc<dyn RunQueue>,
    claim: Claim,
    events: &EventSink,
    cancel: &CancellationToken,
) -> hame::harness::Result<hame::CallOutput> {
    let mut ctx = ctx.clone();
    if let RunInput::Message { extras, .. } = &claim.run.input {
        ctx.extras
            .extend(extras.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    run_context(&mut ctx, &claim);
    let stop = cancel.child_token();
    let beats = Beating::start(
        queue.clone(),
        claim.clone(),
        stop.clone(),
        hame::state::runs::HEARTBEAT_EVERY,
    );
    let decided = resolutions(&claim.run).unwrap_or_default();
    let result = agent.resume(decided, &ctx, events, &stop).await;
    beats.stop();
    if !beats.lost() {
        let end = end_of(&result, beats.cancelled());
        if let Err(e) = queue.finish(&claim, &end).await {
            tracing::warn!(run = %claim.run.id, error = %e, "run could not be finished; a worker takes it over");
        }
    }
    result
}

/// The decisions a run's next leg resumes its suspended turn with (`None`: none recorded,
/// the run's message starts the turn).
pub(crate) fn resolutions(run: &Run) -> Option<Vec<hame::Resolution>> {
    let decided = run.decisions();
    (!decided.is_empty()).then(|| {
        decided
            .into_iter()
            .map(|(id, value)| hame::Resolution::new(id, value))
            .collect()
    })
}

/// The end of `run` that the session's saved `state` already holds, when the state was last
/// saved by a turn of this run (the `runs` extension names it): nothing to run again.
///
/// - A suspended step that still waits on every decision the run carries: `None`, the
///   resumption has not happened (a run resumed by a decision, or taken over before it
///   resumed); run it.
/// - Another suspended step: the run ends `waiting_approval` again, with that step's calls.
/// - No suspended step: its last reply (`completed`), or `failed` (`interrupted`) when the
///   state does not end on one.
fn saved_end(state: &hame::AgentState, run: &Run) -> Option<RunEnd> {
    let last = state
        .extensions
        .get(hame::harness::RUNS_EXTENSION)
        .and_then(|v| v.get("last"))
        .and_then(|v| v.as_str());
    if last != Some(run.id.as_str()) {
        return None;
    }
    if let Some(pending) = &state.pending {
        let waiting = pending.to_suspended().calls;
        let decided = run.decisions();
        let unresumed = !decided.is_empty()
            && decided
                .iter()
                .all(|(id, _)| waiting.iter().any(|c| &c.suspension.id == id));
        if unresumed {
            return None;
        }
        let approvals: Vec<serde_json::Value> = waiting.iter().map(crate::turn::approval).collect();
        return Some(RunEnd::WaitingApproval(for_callers(json!(approvals))));
    }
    let reply = state
        .messages
        .last()
        .filter(|m| m.role == hame::Role::Assistant)
        .map(hame::Message::text_content);
    Some(match reply {
        Some(text) => RunEnd::Completed {
            reply: for_callers(json!(text))
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            usage: json!({}),
            verification: None,
        },
        None => RunEnd::Failed(RunError {
            code: "interrupted".into(),
            message:
                "the worker running this turn died after saving it; see the session's messages"
                    .into(),
        }),
    })
}

/// The heartbeat of a claimed run, in a task of its own: every `every` (or at once when a
/// cancel wake-up arrives) it extends the claim and reads the cancel flag; a cancel, or a
/// claim taken over by another worker, cancels the turn's token.
#[derive(Debug)]
pub(crate) struct Beating {
    task: tokio::task::JoinHandle<()>,
    cancelled: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
}

impl Beating {
    /// Starts heartbeating `claim`; `cancel` is the token of the run's turn.
    pub(crate) fn start(
        queue: Arc<dyn RunQueue>,
        claim: Claim,
        cancel: CancellationToken,
        every: Duration,
    ) -> Self {
        let cancelled = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicBool::new(false));
        let (c, l) = (cancelled.clone(), lost.clone());
        let task = tokio::spawn(async move {
            loop {
                // A cancel wake-up (`NOTIFY`, pub/sub) ends the wait early; the heartbeat
                // then reads the flag.
                if let Err(e) = queue.wait_for_cancel(&claim.run.id, every).await {
                    tracing::debug!(run = %claim.run.id, error = %e, "waiting for a cancel failed");
                    tokio::time::sleep(every).await;
                }
                match queue.heartbeat(&claim).await {
                    Ok(beat) if beat.cancel_requested => {
                        c.store(true, Ordering::Release);
                        cancel.cancel();
                    }
                    Ok(_) => {}
                    Err(hame::state::Error::LeaseLost { .. }) => {
                        tracing::warn!(run = %claim.run.id, "run was reclaimed by another worker; stopping it");
                        l.store(true, Ordering::Release);
                        cancel.cancel();
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(run = %claim.run.id, error = %e, "heartbeat failed; retrying")
                    }
                }
            }
        });
        Self {
            task,
            cancelled,
            lost,
        }
    }

    /// Stops heartbeating.
    pub(crate) fn stop(&self) {
        self.task.abort();
    }

    /// Whether a cancel of the run was asked for.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// Whether another worker took the run over (its end is no longer ours to write).
    pub(crate) fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }
}

impl Drop for Beating {
    fn drop(&mut self) {
        self.task.abort();
    }
}
