//! One turn (a message or a decision) of a session: queued behind the session's gate, run
//! by the harness in a task of its own (a client that goes away does not stop it), its
//! events published to the session's ring and to the request that started it.

use std::sync::Arc;
use std::time::Instant;

use hame::harness::caller::CallerRequest;
use hame::state::StateKey;
use hame::state::runs::{
    Claim, ClaimOptions, Decided, Decision, NewRun, Run, RunEnd, RunError, RunQueue, RunStatus,
};
use hame::{AgentEvent, CallInput, EventSink, HarnessAgent, RuntimeContext};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::Shared;
use crate::error::{ApiError, for_callers};
use crate::events::Event;

/// How a turn ended.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// The reply: `{"reply", "session", "user", "usage", "iterations"}`.
    Finished(Value),
    /// Tool calls wait for decisions: `{"status": "approval_needed", "approvals": [...],
    /// "usage"}` (`usage`: the tokens this request spent before it stopped).
    Suspended(Value),
    /// The call failed.
    Failed(ApiError),
}

/// A started turn: its events as they come, and its outcome.
#[derive(Debug)]
pub(crate) struct Turn {
    pub(crate) events: mpsc::UnboundedReceiver<Arc<Event>>,
    pub(crate) outcome: oneshot::Receiver<Outcome>,
    pub(crate) session: String,
    /// A retry answered from its first attempt ([`crate::replay`]): its events are only
    /// the ones that ended that turn (no text deltas).
    pub(crate) replayed: bool,
}

/// Queues a turn on `(user, session)` and starts its task ([`start_recorded`]), unless the
/// request is a retry ([`crate::replay`]): a retry of a request whose turn ran (or runs)
/// gets that turn's end instead of a turn of its own.
///
/// `caller`: what an OpenAI-compatible request adds to the call (`hame::harness::caller`).
pub(crate) fn start_once(
    shared: &Arc<Shared>,
    agent: &HarnessAgent,
    user: Option<String>,
    session: String,
    input: CallInput,
    key: Option<crate::replay::RequestKey>,
    caller: Option<CallerRequest>,
) -> Result<Turn, ApiError> {
    let with = With {
        caller,
        ..With::default()
    };
    start_once_with(shared, agent, user, session, input, key, with)
}

/// Values a request adds to its turn's runtime context (a caller's own budget).
pub(crate) type Extras = std::collections::BTreeMap<String, Value>;

/// What a request adds to its turn beyond its input.
#[derive(Default)]
pub(crate) struct With {
    /// What an OpenAI-compatible request adds to the call (`hame::harness::caller`).
    pub(crate) caller: Option<CallerRequest>,
    /// Stops the turn (a child of the gateway's token, so the drain timeout stops it too).
    pub(crate) cancel: Option<hame::CancellationToken>,
    /// Values for the turn's runtime context (a caller's own budget).
    pub(crate) extras: Extras,
    /// The turn is a run of the server's queue ([`GatewayOptions::runs`]): submitted (or
    /// resumed by a decision) and claimed when the turn's time comes, heartbeated while it
    /// runs, finished with its outcome (docs/replicas.md). `None`: a turn of this process
    /// only.
    ///
    /// [`GatewayOptions::runs`]: crate::GatewayOptions::runs
    pub(crate) as_run: Option<AsRun>,
}

/// How a request's turn is a run of the queue.
pub(crate) enum AsRun {
    /// A new message run (`POST …/messages`), unless the session waits for a decision:
    /// then the turn answers with the waiting calls, as a turn does, and no run is made.
    Submit(NewRun),
    /// A decision (`POST …/approvals/{id}`): recorded on the session's `waiting_approval`
    /// run, which this request claims and resumes ([`RunQueue::decide`]). Without such a
    /// run (a session suspended by a turn outside the queue), the turn resumes in this
    /// process, as before.
    Decide(StateKey, Decision),
}

/// [`start_once`] with everything a request may add ([`With`]).
pub(crate) fn start_once_with(
    shared: &Arc<Shared>,
    agent: &HarnessAgent,
    user: Option<String>,
    session: String,
    input: CallInput,
    key: Option<crate::replay::RequestKey>,
    with: With,
) -> Result<Turn, ApiError> {
    use crate::replay::Claim;
    let Some(key) = key else {
        return start_recorded(shared, agent, user, session, input, None, with);
    };
    match shared.replays.claim(&key, &session)? {
        Claim::New(recorder) => {
            start_recorded(shared, agent, user, session, input, Some(recorder), with)
        }
        Claim::Replay(mut done, session) => {
            let (tx, rx) = mpsc::unbounded_channel();
            let (out_tx, out_rx) = oneshot::channel();
            tokio::spawn(async move {
                let outcome = match done.wait_for(Option::is_some).await {
                    Ok(d) => match d.as_ref() {
                        Some(d) => {
                            for ev in &d.events {
                                let _ = tx.send(ev.clone());
                            }
                            d.outcome.clone()
                        }
                        None => Outcome::Failed(ApiError::internal("no outcome")),
                    },
                    Err(_) => Outcome::Failed(ApiError::internal(
                        "the first attempt of this request ended without an answer",
                    )),
                };
                drop(tx);
                let _ = out_tx.send(outcome);
            });
            Ok(Turn {
                events: rx,
                outcome: out_rx,
                session,
                replayed: true,
            })
        }
    }
}

/// Queues a turn on `(user, session)` and starts its task, which `cancel` stops (it
/// should be a child of the gateway's token, so the drain timeout stops it too). No
/// retries are recognised (the MCP server's `ask`).
pub(crate) fn start_cancellable(
    shared: &Arc<Shared>,
    user: Option<String>,
    session: String,
    input: CallInput,
    cancel: hame::CancellationToken,
) -> Result<Turn, ApiError> {
    let with = With {
        cancel: Some(cancel),
        ..With::default()
    };
    start_recorded(shared, &shared.agent, user, session, input, None, with)
}

/// A waiting tool call as the API shows it (the approvals route, a run's `approvals`, the
/// `approval_required` event): its approval id, tool, call id, arguments and reason.
pub(crate) fn approval(c: &hame::SuspendedCall) -> Value {
    json!({
        "id": c.suspension.id,
        "tool": c.call.name,
        "call_id": c.call.id,
        "arguments": c.call.arguments,
        "reason": c.suspension.reason,
    })
}

/// The key of a session in the gate table and the event hub.
pub(crate) fn key(agent: &str, user: Option<&str>, session: &str) -> String {
    format!("{agent}\u{0}{}\u{0}{session}", user.unwrap_or(""))
}

/// Queues a turn on `(user, session)` and starts its task; its end goes to `recorder`
/// (for the request's retries). Refused with 429 when the session's queue is full, 503
/// while the gateway drains.
fn start_recorded(
    shared: &Arc<Shared>,
    agent: &HarnessAgent,
    user: Option<String>,
    session: String,
    input: CallInput,
    recorder: Option<crate::replay::Recorder>,
    with: With,
) -> Result<Turn, ApiError> {
    if shared.draining.is_cancelled() {
        return Err(ApiError::draining());
    }
    crate::routes::valid_session(&session)?;
    let key = key(agent.name(), user.as_deref(), &session);
    let Some(mut ticket) = shared.gates.enter(&key) else {
        shared.metrics.refused("queue_full");
        return Err(ApiError::busy(shared.options.retry_after_secs));
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let (out_tx, out_rx) = oneshot::channel();
    let mut ctx = crate::routes::context(shared, user, &session);
    let With {
        caller,
        cancel: with_cancel,
        extras,
        as_run,
    } = with;
    if let Some(caller) = caller {
        ctx = caller.into_context(ctx);
    }
    ctx.extras.extend(extras);
    let me = shared.clone();
    let agent = agent.clone();
    shared.hub.active(&key, 1);
    let span = tracing::info_span!(
        "hame.turn",
        agent = %agent.name(),
        session = %ctx.session_id,
        user = ctx.user_id.as_deref().unwrap_or("")
    );
    let task = async move {
        ticket.ready().await;
        let started = Instant::now();
        let cancel = with_cancel.unwrap_or_else(|| me.cancel.child_token());
        let mut ctx = ctx;
        let (outcome, ended) = match submit_run(&me, &agent, as_run, &ctx, &cancel).await {
            Ok(None) => run(&me, &agent, &key, &ctx, input, &tx, &cancel).await,
            Ok(Some(RequestRun::Own {
                queue,
                claim,
                beats,
            })) => {
                crate::worker::run_context(&mut ctx, &claim);
                let done = run(&me, &agent, &key, &ctx, input, &tx, &cancel).await;
                beats.stop();
                finish_own(&me, queue.as_ref(), &claim, &beats, &done.0).await;
                done
            }
            Ok(Some(RequestRun::Queued { queue, run })) => {
                wait_for_run(&me, &key, queue.as_ref(), run, &tx, &cancel).await
            }
            Err(e) => (Outcome::Failed(e), Vec::new()),
        };
        if let Some(recorder) = recorder {
            recorder.finish(crate::replay::Done::new(outcome.clone(), ended));
        }
        let label = match &outcome {
            Outcome::Finished(_) => "finished",
            Outcome::Suspended(_) => "suspended",
            Outcome::Failed(_) => "failed",
        };
        me.metrics.turn(
            label,
            u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        );
        me.hub.active(&key, -1);
        drop(ticket);
        let _ = out_tx.send(outcome);
    };
    shared
        .turns
        .spawn(tracing::Instrument::instrument(task, span));
    Ok(Turn {
        events: rx,
        outcome: out_rx,
        session,
        replayed: false,
    })
}

/// The SSE name and JSON data of a loop event shown to clients, if it is one.
fn shown(ev: &AgentEvent) -> Option<(&'static str, Value)> {
    match ev {
        AgentEvent::TextDelta { text } => Some(("text_delta", json!({"text": text}))),
        AgentEvent::ToolStarted {
            id,
            name,
            arguments,
        } => Some((
            "tool_started",
            json!({"id": id, "name": name, "arguments": arguments}),
        )),
        AgentEvent::ToolFinished {
            id,
            name,
            duration_ms,
            is_error,
            code,
        } => Some((
            "tool_finished",
            json!({"id": id, "name": name, "duration_ms": duration_ms, "is_error": is_error, "code": code}),
        )),
        _ => None,
    }
}

/// Runs the turn: its outcome and the events that ended it (for its retries).
async fn run(
    shared: &Arc<Shared>,
    agent: &HarnessAgent,
    key: &str,
    ctx: &RuntimeContext,
    input: CallInput,
    tx: &mpsc::UnboundedSender<Arc<Event>>,
    cancel: &hame::CancellationToken,
) -> (Outcome, Vec<Arc<Event>>) {
    let emit = |name: &'static str, data: Value, terminal: bool| async move {
        let ev = shared.publish(key, name, data.to_string(), terminal).await;
        let _ = tx.send(ev.clone());
        ev
    };
    let mut ended = Vec::new();
    let (sink, mut rx) = EventSink::channel();
    // The tokens of this request's model calls (a resumed turn's earlier ones are not).
    let spent = std::sync::Mutex::new(hame::Usage::default());
    let spent = &spent;
    let on_event = |ev: AgentEvent| async move {
        if let AgentEvent::Usage { usage } = &ev
            && let Ok(mut s) = spent.lock()
        {
            s.add(usage);
        }
        shared.metrics.event(&ev);
        if let Some((name, data)) = shown(&ev) {
            emit(name, data, false).await;
        }
    };
    let result = {
        let call = async {
            match input {
                CallInput::Message(m) => agent.call_with(m, ctx, &sink, cancel).await,
                CallInput::Resume(r) => agent.resume(r, ctx, &sink, cancel).await,
                other => agent.call_input(other, ctx, &sink, cancel).await,
            }
        };
        tokio::pin!(call);
        loop {
            tokio::select! {
                r = &mut call => break r,
                Some(ev) = rx.recv() => on_event(ev).await,
            }
        }
    };
    while let Ok(ev) = rx.try_recv() {
        on_event(ev).await;
    }
    drop(sink);
    let outcome = match result {
        Ok(out) => {
            let verdict = out.verification.as_ref().map(|v| {
                let unverified = v.status == hame::VerificationStatus::Unverified;
                (unverified, json!(v))
            });
            let body = turn_reply(
                json!(out.reply.text_content()),
                (&ctx.session_id, ctx.user_id.as_deref()),
                json!(out.usage),
                u64::try_from(out.iterations).unwrap_or(u64::MAX),
                verdict,
            );
            ended.push(emit("finished", body.clone(), true).await);
            Outcome::Finished(body)
        }
        Err(hame::harness::Error::Call(hame::Error::Suspended(s))) => {
            let approvals: Vec<Value> = s
                .calls
                .iter()
                .map(|c| {
                    let mut a = approval(c);
                    a["layer"] = json!(c.suspension.layer);
                    a
                })
                .collect();
            let n = approvals.len();
            for (i, a) in approvals.iter().enumerate() {
                let mut data = a.clone();
                if let Some(o) = data.as_object_mut() {
                    o.insert("session".into(), json!(ctx.session_id));
                }
                ended.push(emit("approval_needed", data, i + 1 == n).await);
            }
            let usage = spent.lock().map(|s| *s).unwrap_or_default();
            Outcome::Suspended(for_callers(json!({
                "status": "approval_needed",
                "session": ctx.session_id,
                "user": ctx.user_id,
                "approvals": approvals,
                "usage": usage,
            })))
        }
        Err(e) => {
            let err = ApiError::from_harness(&e);
            ended.push(
                emit(
                    "failed",
                    json!({"code": err.code, "message": err.message, "session": ctx.session_id}),
                    true,
                )
                .await,
            );
            Outcome::Failed(err)
        }
    };
    // Background work the turn started (subagents) reports into the session after it.
    if !rx.is_closed() || !rx.is_empty() {
        let shared = shared.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                shared.metrics.event(&ev);
                if let AgentEvent::Subagent { .. } | AgentEvent::Custom { .. } = &ev
                    && let Ok(data) = serde_json::to_string(&ev)
                {
                    shared.publish(&key, "subagent", data, false).await;
                }
            }
        });
    }
    (outcome, ended)
}

/// The run of a request that executes its own turn (`POST …/messages`).
enum RequestRun {
    /// Claimed at submission: this process runs the turn, heartbeats the claim and writes
    /// the run's end. If it dies, the claim lapses and a worker takes the run over.
    Own {
        queue: Arc<dyn RunQueue>,
        claim: Claim,
        beats: crate::worker::Beating,
    },
    /// Its session was busy with another run (one submitted to `/runs`, or left by a dead
    /// replica): a worker runs it after that one; the request waits for its end.
    Queued { queue: Arc<dyn RunQueue>, run: Run },
}

/// Submits the request's run (if any) and claims it at once when its session is free
/// ([`RunQueue::submit_claimed`]), or records its decision and claims the waiting run
/// ([`RunQueue::decide`]); `None` without a run.
async fn submit_run(
    shared: &Arc<Shared>,
    agent: &HarnessAgent,
    plan: Option<AsRun>,
    ctx: &RuntimeContext,
    cancel: &hame::CancellationToken,
) -> Result<Option<RequestRun>, ApiError> {
    let (Some(plan), Some(queue)) = (plan, shared.options.runs.clone()) else {
        return Ok(None);
    };
    let worker = shared.options.worker.clone().unwrap_or_default();
    let options = ClaimOptions::new(agent.name(), worker.name.clone(), worker.lapse);
    let own = |claim: Claim| {
        let beats = crate::worker::Beating::start(
            queue.clone(),
            claim.clone(),
            cancel.clone(),
            worker.heartbeat,
        );
        RequestRun::Own {
            queue: queue.clone(),
            claim,
            beats,
        }
    };
    let new = match plan {
        AsRun::Submit(new) => new,
        AsRun::Decide(key, decision) => {
            return decide_run(
                queue.as_ref(),
                agent,
                ctx,
                &key,
                &decision,
                &options,
                cancel,
            )
            .await
            .map(|claim| claim.map(own));
        }
    };
    // A session waiting for a decision takes no message: the turn answers with the calls
    // that wait (202, as before), and no run is made (it would wait behind the decision).
    if pending_ids(agent, ctx).await?.is_some() {
        return Ok(None);
    }
    let (submitted, claim) = queue
        .submit_claimed(new, &options)
        .await
        .map_err(|e| crate::runs::store_error(&e))?;
    Ok(Some(match claim {
        Some(claim) => own(claim),
        None => {
            tracing::info!(run = %submitted.run.id, "the session is busy with another run; a worker runs this one");
            RequestRun::Queued {
                queue,
                run: submitted.run,
            }
        }
    }))
}

/// The ids of the calls that wait for a decision in the session (`None`: nothing waits).
async fn pending_ids(
    agent: &HarnessAgent,
    ctx: &RuntimeContext,
) -> Result<Option<Vec<String>>, ApiError> {
    Ok(agent
        .pending(ctx)
        .await?
        .map(|s| s.calls.into_iter().map(|c| c.suspension.id).collect()))
}

/// The 404 of a decision on a call that does not wait for one.
pub(crate) fn no_such_approval(id: &str, session: &str) -> ApiError {
    ApiError::not_found(format!(
        "no call waits for a decision with id {} in session {session}",
        id.chars().take(40).collect::<String>()
    ))
}

/// Records `decision` on the session's waiting run and claims it for this request. While
/// the session's head run runs (a resumption of an earlier decision that has not stopped
/// yet), waits for it, as long as the call still waits for a decision. `None`: no run of
/// the session waits (the session was suspended outside the queue): resume in this process.
async fn decide_run(
    queue: &dyn RunQueue,
    agent: &HarnessAgent,
    ctx: &RuntimeContext,
    key: &StateKey,
    decision: &Decision,
    options: &ClaimOptions,
    cancel: &hame::CancellationToken,
) -> Result<Option<Claim>, ApiError> {
    loop {
        match queue
            .decide(key, decision, options)
            .await
            .map_err(|e| crate::runs::store_error(&e))?
        {
            Decided::Claimed(claim) => {
                tracing::info!(run = %claim.run.id, approval = %decision.approval, "decision recorded; resuming the run");
                return Ok(Some(claim));
            }
            Decided::NoneWaiting => return Ok(None),
            Decided::UnknownApproval(_) => {
                return Err(no_such_approval(&decision.approval, key.session()));
            }
            Decided::Busy(run) => {
                let waits = pending_ids(agent, ctx)
                    .await?
                    .is_some_and(|ids| ids.contains(&decision.approval));
                if !waits {
                    return Err(no_such_approval(&decision.approval, key.session()));
                }
                tracing::debug!(run = %run.id, "the session's run is busy; deciding once it waits");
                tokio::select! {
                    () = tokio::time::sleep(crate::runs::RUN_POLL) => {}
                    () = cancel.cancelled() => return Err(ApiError::draining()),
                }
            }
        }
    }
}

/// Writes the end of a run this request executed: its reply, its approvals or its error.
/// Nothing when another worker took the run over, or when the server shut down mid-turn
/// (a worker takes it over after its lapse).
async fn finish_own(
    shared: &Shared,
    queue: &dyn RunQueue,
    claim: &Claim,
    beats: &crate::worker::Beating,
    outcome: &Outcome,
) {
    if beats.lost() {
        return;
    }
    let end = match outcome {
        Outcome::Finished(body) => {
            let reply = body["reply"].as_str().unwrap_or_default().to_owned();
            let usage =
                crate::runs::run_usage(&body["usage"], body["iterations"].as_u64().unwrap_or(0));
            match body.get("verification").cloned() {
                Some(verification) if body["status"] == "unverified" => RunEnd::Unverified {
                    reply,
                    usage,
                    verification,
                },
                verification => RunEnd::Completed {
                    reply,
                    usage,
                    verification,
                },
            }
        }
        Outcome::Suspended(body) => RunEnd::WaitingApproval(body["approvals"].clone()),
        Outcome::Failed(_) if beats.cancelled() => RunEnd::Cancelled,
        Outcome::Failed(_) if shared.cancel.is_cancelled() => {
            tracing::warn!(run = %claim.run.id, "stopped mid-run; the run is left for a worker");
            return;
        }
        Outcome::Failed(e) => RunEnd::Failed(RunError {
            code: e.code.to_owned(),
            message: e.message.clone(),
        }),
    };
    if let Err(e) = queue.finish(claim, &end).await {
        tracing::warn!(run = %claim.run.id, error = %e, "run could not be finished; a worker takes it over");
    }
}

/// A finished turn as callers see it: `{reply, session, user, usage, iterations}` and, for a
/// turn with required checks, whether its evidence backs it (docs/evidence.md): `status`
/// `completed` or `unverified` (`verdict.0`) and the `verification` (`verdict.1`). The one
/// shape for a turn run in the request and for one a worker ran.
fn turn_reply(
    reply: Value,
    (session, user): (&str, Option<&str>),
    usage: Value,
    iterations: u64,
    verdict: Option<(bool, Value)>,
) -> Value {
    let mut body = json!({
        "reply": reply,
        "session": session,
        "user": user,
        "usage": usage,
        "iterations": iterations,
    });
    if let (Some((unverified, v)), Some(o)) = (verdict, body.as_object_mut()) {
        let status = if unverified {
            "unverified"
        } else {
            "completed"
        };
        o.insert("status".into(), json!(status));
        o.insert("verification".into(), v);
    }
    for_callers(body)
}

/// Waits for a run a worker executes and answers with its end, as the turn would have
/// (`iterations` from the run's `usage.requests`; SSE gets only the ending events).
async fn wait_for_run(
    shared: &Arc<Shared>,
    key: &str,
    queue: &dyn RunQueue,
    mut run: Run,
    tx: &mpsc::UnboundedSender<Arc<Event>>,
    cancel: &hame::CancellationToken,
) -> (Outcome, Vec<Arc<Event>>) {
    while !run.status.is_finished() {
        tokio::select! {
            () = tokio::time::sleep(crate::runs::RUN_POLL) => {}
            () = cancel.cancelled() => {
                return (Outcome::Failed(ApiError::draining()), Vec::new());
            }
        }
        match queue.get(&run.id).await {
            Ok(Some(r)) => run = r,
            Ok(None) => {
                return (
                    Outcome::Failed(ApiError::internal("the run was deleted")),
                    Vec::new(),
                );
            }
            Err(e) => tracing::warn!(run = %run.id, error = %e, "reading the run failed"),
        }
    }
    let mut ended = Vec::new();
    let mut emit = async |name: &'static str, data: Value, terminal: bool| {
        let ev = shared.publish(key, name, data.to_string(), terminal).await;
        let _ = tx.send(ev.clone());
        ended.push(ev);
    };
    let outcome = match run.status {
        RunStatus::Completed | RunStatus::Unverified => {
            let mut usage = run.usage.clone().unwrap_or_else(|| json!({}));
            let iterations = usage
                .as_object_mut()
                .and_then(|o| o.remove("requests"))
                .and_then(|n| n.as_u64())
                .unwrap_or(0);
            let verdict = run
                .verification
                .clone()
                .map(|v| (run.status == RunStatus::Unverified, v));
            let body = turn_reply(
                json!(run.reply),
                (&run.session, run.user.as_deref()),
                usage,
                iterations,
                verdict,
            );
            emit("finished", body.clone(), true).await;
            Outcome::Finished(body)
        }
        RunStatus::WaitingApproval => {
            let approvals = run.approvals.clone().unwrap_or_else(|| json!([]));
            let list = approvals.as_array().cloned().unwrap_or_default();
            let n = list.len();
            for (i, a) in list.into_iter().enumerate() {
                let mut data = a;
                if let Some(o) = data.as_object_mut() {
                    o.insert("session".into(), json!(run.session));
                }
                emit("approval_needed", data, i + 1 == n).await;
            }
            Outcome::Suspended(for_callers(json!({
                "status": "approval_needed",
                "session": run.session,
                "user": run.user,
                "approvals": approvals,
                "usage": {},
            })))
        }
        _ => {
            let (code, message) = run.error.as_ref().map_or_else(
                || ("run_failed", "the run failed".to_owned()),
                |e| {
                    let code = if run.status == RunStatus::Cancelled {
                        "cancelled"
                    } else {
                        "run_failed"
                    };
                    (code, format!("{}: {}", e.code, e.message))
                },
            );
            let err = ApiError::new(axum::http::StatusCode::BAD_GATEWAY, code, message);
            emit(
                "failed",
                json!({"code": err.code, "message": err.message, "session": run.session}),
                true,
            )
            .await;
            Outcome::Failed(err)
        }
    };
    (outcome, ended)
}
