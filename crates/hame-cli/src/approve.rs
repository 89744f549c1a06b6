//! `hame approve` / `hame deny` (decide a suspended tool call in any process), the `--plan`
//! flag, and the inline y/n of `hame chat`.

use clap::Args;
use hame::{CallInput, EventSink, HarnessAgent, Resolution, RuntimeContext, SuspendedCall};

use crate::ConfigError;
use crate::common::{Common, build};
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
    let (agent, ctx) = build(&args.common).await?;
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
    let (sink, mut rx) = EventSink::channel();
    let cancel = signals.begin();
    let call = agent.resume(vec![Resolution::new(id, value)], &ctx, &sink, &cancel);
    let result = crate::run::with_warnings(call, &mut rx).await;
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
