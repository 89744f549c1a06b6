//! The worker: claims runs from the queue ([`hame::state::runs::RunQueue`]) and executes
//! them with the harness, heartbeating each one; what `hame worker` runs and what
//! `hame serve` runs beside its routes (unless `--no-worker`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hame::state::runs::{Claim, ClaimOptions, RunEnd, RunError, RunInput, RunQueue};
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

    /// A message run: the turn of the run's session.
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
        ctx.extras.insert(
            hame::harness::RUN_ID_EXTRA.to_owned(),
            serde_json::Value::String(run.id.clone()),
        );
        // Above 1: taken over; the call adopts what the dead worker logged of the turn.
        ctx.extras.insert(
            hame::harness::RUN_ATTEMPT_EXTRA.to_owned(),
            serde_json::Value::from(claim.attempt),
        );
        if !verify.is_empty() {
            ctx = hame::harness::evidence::require_checks(ctx, verify, verify_attempts);
        }
        // Taken over from a worker that died: if its turn was saved, it is not run again.
        if claim.attempt > 1
            && let Some(end) = self.already_ran(&ctx, &run.id).await
        {
            tracing::info!(run = %run.id, "the run's turn was saved by its previous worker; not running it again");
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
        let result = self
            .agent
            .call_with(Message::user(message.to_owned()), &ctx, &sink, &cancel)
            .await;
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
        let end = match result {
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
                // A run with required checks ends `unverified` when the gate's verdict says
                // so, with the failing evidence (docs/evidence.md).
                match &out.verification {
                    Some(v) if v.status == hame::VerificationStatus::Unverified => {
                        RunEnd::Unverified {
                            reply,
                            usage,
                            verification: body["verification"].clone(),
                        }
                    }
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
            Err(_) if beats.cancelled() => RunEnd::Cancelled,
            Err(e) => {
                let err = ApiError::from_harness(&e);
                RunEnd::Failed(RunError {
                    code: err.code.to_owned(),
                    message: err.message,
                })
            }
        };
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

    /// The end of run `id` when the session's saved state says its turn already ran (the
    /// harness records the run id with the turn's fenced save): its last reply, or, when
    /// the state does not end on one, a failure saying so. `None` when it did not run, or
    /// when the state cannot be read (then the run is executed).
    async fn already_ran(&self, ctx: &RuntimeContext, id: &str) -> Option<RunEnd> {
        let state = match self.agent.state(ctx).await {
            Ok(Some(s)) => s,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(run = %id, error = %e, "reading the session state failed; running the run");
                return None;
            }
        };
        let last = state
            .extensions
            .get(hame::harness::RUNS_EXTENSION)
            .and_then(|v| v.get("last"))
            .and_then(|v| v.as_str());
        if last != Some(id) {
            return None;
        }
        let reply = state
            .messages
            .last()
            .filter(|m| m.role == hame::Role::Assistant && state.pending.is_none())
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

    async fn finish(&self, claim: &Claim, end: &RunEnd) {
        match self.queue.finish(claim, end).await {
            Ok(run) => tracing::info!(run = %run.id, status = %run.status, "run finished"),
            Err(e) => {
                tracing::warn!(run = %claim.run.id, error = %e, "run could not be finished; another worker reclaims it")
            }
        }
    }
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
