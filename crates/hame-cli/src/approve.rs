//! `hame approve` / `hame deny` (decide a suspended tool call in any process), the `--plan`
//! flag, and the inline y/n of `hame chat`.

use clap::Args;
use hame::{CallInput, EventSink, HarnessAgent, Resolution, RuntimeContext, SuspendedCall};

use crate::ConfigError;
use crate::common::{Common, build_resolved};
use crate::run::outcome;
use crate::signals::Signals;

/// Flags of `hame approve` and `hame deny`.
#[derive(Debug, Args)]
pub(crate) struct DecideArgs {
    #[command(flatten)]
    pub(crate) common: Common,
    /// Print one JSON object {"reply", "session", "usage", ...} instead of the text.
    #[arg(long)]
    json: bool,
    /// The approval id (`ap-…`, as `hame run` printed it); default: the only pending one.
    id: Option<String>,
}

/// `--plan` of `hame run` / `hame chat`.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct PlanArgs {
    /// Enter plan mode for the session (kept in its state until a plan is approved):
    /// tools that change something are denied; plan_write writes plans/PLAN.md and
    /// plan_exit asks for approval.
    #[arg(long, help_heading = "Permissions")]
    pub(crate) plan: bool,
}

/// Marks the call context to enter plan mode (`--plan`, `--permission-mode plan`).
pub(crate) fn with_plan(ctx: RuntimeContext, plan: bool) -> RuntimeContext {
    if plan {
        ctx.with_extra(
            hame::harness::permissions::PLAN_EXTRA,
            serde_json::json!(true),
        )
    } else {
        ctx
    }
}

/// The id to decide: the given one when it is pending, else the only pending one.
fn pick(pending: &[SuspendedCall], id: Option<&str>, session: &str) -> anyhow::Result<String> {
    let ids: Vec<&str> = pending.iter().map(|c| c.suspension.id.as_str()).collect();
    match id {
        Some(id) if ids.contains(&id) => Ok(id.to_owned()),
        Some(id) => Err(ConfigError(format!(
            "unknown approval id {} in session {session} (pending: {})",
            id.chars().take(40).collect::<String>(),
            ids.join(", ")
        ))
        .into()),
        None if ids.len() == 1 => Ok(ids[0].to_owned()),
        None => Err(ConfigError(format!(
            "{} calls wait for a decision in session {session}; name one: {}",
            ids.len(),
            ids.join(", ")
        ))
        .into()),
    }
}

/// `hame approve` (`approve = true`) or `hame deny`.
pub(crate) async fn decide(
    args: DecideArgs,
    approve: bool,
    reason: Option<String>,
) -> anyhow::Result<()> {
    let signals = Signals::watch();
    let config = crate::config::resolve(&args.common)?;
    let (agent, ctx) = build_resolved(&args.common, &config).await?;
    let pending = agent
        .pending(&ctx)
        .await?
        .map(|s| s.calls)
        .unwrap_or_default();
    if pending.is_empty() {
        return Err(ConfigError(format!(
            "nothing is pending in session {} (no tool call waits for a decision)",
            ctx.session_id
        ))
        .into());
    }
    let id = pick(&pending, args.id.as_deref(), &ctx.session_id)?;
    let value = match (approve, reason) {
        (true, _) => serde_json::json!({"approve": true}),
        (false, Some(r)) => serde_json::json!({"approve": false, "reason": r}),
        (false, None) => serde_json::json!({"approve": false}),
    };
    // A session suspended by a run of `hame serve` / `hame worker`: the decision resumes
    // that run (docs/replicas.md, *Approvals*), else the session, here.
    let claim = waiting_run(&agent, &config, &ctx, &id, &value).await?;
    let (sink, mut rx) = EventSink::channel();
    let cancel = signals.begin();
    let result = match claim {
        Some((queue, claim)) => {
            let call = hame_gateway::resume_claimed(&agent, &ctx, queue, claim, &sink, &cancel);
            crate::run::with_warnings(call, &mut rx).await
        }
        None => {
            let call = agent.resume(vec![Resolution::new(id, value)], &ctx, &sink, &cancel);
            crate::run::with_warnings(call, &mut rx).await
        }
    };
    let signal = signals.end();
    drop(sink);
    // A refused decision (decided already by another process) is a usage error.
    let result = match result {
        Err(hame::harness::Error::Call(
            e @ (hame::Error::NothingPending | hame::Error::UnknownResolution(_)),
        )) => return Err(ConfigError(format!("{e} (decided already?)")).into()),
        r => r,
    };
    let out = outcome(result, signal)?;
    crate::run::print_reply(&agent, &ctx, &out, args.json)?;
    crate::tasks::wait_for_background(&agent, &args.common, &signals, &mut rx).await;
    crate::run::finish(&agent).await
}

/// The session's `waiting_approval` run, when its queue (the state store's) has one: the
/// decision recorded on it and the run claimed by this process ([`RunQueue::decide`]).
/// `None`: no run waits (the session was suspended by `hame run` or `hame chat`), or the
/// default JSON state has never had a run queue.
///
/// [`RunQueue::decide`]: hame::state::runs::RunQueue::decide
async fn waiting_run(
    agent: &HarnessAgent,
    config: &crate::config::Effective,
    ctx: &RuntimeContext,
    id: &str,
    value: &serde_json::Value,
) -> anyhow::Result<
    Option<(
        std::sync::Arc<dyn hame::state::runs::RunQueue>,
        hame::state::runs::Claim,
    )>,
> {
    use hame::state::runs::{ClaimOptions, DEFAULT_RUN_LAPSE, Decided, Decision};
    let never_queued = config.state.value.is_none()
        && agent
            .default_state_root()
            .is_none_or(|root| !root.join(".runs").exists());
    if never_queued {
        return Ok(None);
    }
    let queue = crate::runs::queue(agent, config).await?;
    let key = hame::state::StateKey::new(agent.name(), ctx.user_id.as_deref(), &ctx.session_id)
        .map_err(|e| ConfigError(e.to_string()))?;
    let options = ClaimOptions::new(
        agent.name(),
        hame_gateway::WorkerOptions::default().name,
        DEFAULT_RUN_LAPSE,
    );
    let decided = queue
        .decide(&key, &Decision::new(id, value.clone()), &options)
        .await
        .map_err(|e| {
            ConfigError(format!(
                "cannot record the decision on the session's run: {e}"
            ))
        })?;
    match decided {
        Decided::Claimed(claim) => Ok(Some((queue, claim))),
        Decided::NoneWaiting => Ok(None),
        Decided::Busy(run) => Err(ConfigError(format!(
            "run {} of session {} is {} (a decision is being carried out); decide again once it waits",
            run.id, ctx.session_id, run.status
        ))
        .into()),
        Decided::UnknownApproval(run) => Err(ConfigError(format!(
            "run {} of session {} does not wait for a decision on {} (decided already?)",
            run.id,
            ctx.session_id,
            id.chars().take(40).collect::<String>()
        ))
        .into()),
    }
}

/// The inline question of `hame chat`: each waiting call is asked `y/N` on stdin, then the
/// turn resumes with the answers (and asks again if it stops again).
pub(crate) async fn inline(
    agent: &HarnessAgent,
    ctx: &RuntimeContext,
    lines: &mut crate::chat::LineReader,
    mut suspended: Option<Vec<SuspendedCall>>,
    signals: &Signals,
) -> anyhow::Result<()> {
    while let Some(calls) = suspended.take() {
        let mut resolutions = Vec::new();
        for c in &calls {
            let prompt = format!(
                "allow {} {}? [y/N/a(lways)] ",
                c.call.name,
                shown_argument(c)
            );
            let answer = match lines.read(&prompt).await? {
                crate::chat::Input::Line(l) => l,
                crate::chat::Input::Interrupted | crate::chat::Input::Eof => String::new(),
            };
            let value = match answer.trim().to_ascii_lowercase().as_str() {
                "y" | "yes" => serde_json::json!({"approve": true}),
                "a" | "always" => serde_json::json!({"approve": true, "always": true}),
                _ => serde_json::json!({"approve": false, "reason": "declined in chat"}),
            };
            resolutions.push(Resolution::new(c.suspension.id.clone(), value));
        }
        signals.end();
        let cancel = signals.begin();
        let events = agent.stream_with(CallInput::Resume(resolutions), ctx, cancel);
        suspended = crate::run::show_events(events).await?.suspended;
    }
    Ok(())
}

/// The argument of a waiting call as a person should read it: the one the permission
/// layer decided on (for a path, the file the tool will touch), else the call's own.
pub(crate) fn shown_argument(c: &SuspendedCall) -> String {
    if let Some(a) = c.suspension.data.get("argument").and_then(|v| v.as_str()) {
        return a.to_owned();
    }
    crate::run::key_argument_values(&c.call.arguments)
        .into_iter()
        .next()
        .map(|(_, v)| v)
        .unwrap_or_default()
}
