//! `hame run`, and the event display of `hame chat`.

use std::fmt::Write as _;
use std::io::Write;

use futures::StreamExt;
use hame::{AgentEvent, EventSink, HarnessAgent, Message};

use crate::common::{Common, build};
use crate::signals::Signals;
use crate::{ConfigError, Stopped};

/// Prints the events a user of `hame run` should see on stderr: workspace files that could
/// not be read, failed compactions, suspended tool calls.
pub(crate) fn warn_on(ev: &AgentEvent) {
    match ev {
        AgentEvent::Custom { kind, data }
            if kind.starts_with("workspace.")
                || kind.starts_with("mcp.tool_")
                || kind.ends_with("_failed")
                || kind.ends_with(".failed") =>
        {
            let path = data.get("path").and_then(|p| p.as_str()).unwrap_or("");
            let error = data.get("error").and_then(|p| p.as_str()).unwrap_or("");
            eprintln!("hame: warning: {kind} {path}: {error}");
        }
        // A call the policy denied: the model gets an error result; the user sees why.
        AgentEvent::Custom { kind, data }
            if kind == hame::harness::permissions::DECIDED_EVENT
                && data.get("outcome").and_then(|o| o.as_str()) == Some("deny") =>
        {
            let field = |k: &str| data.get(k).and_then(|v| v.as_str()).unwrap_or("");
            let argument = match field("argument") {
                "" => String::new(),
                a => format!(" {}", clip(a)),
            };
            eprintln!(
                "hame: denied: {}{argument} ({})",
                field("tool"),
                field("rule")
            );
        }
        _ => {}
    }
}

/// The argument keys that name what a call works on, in order: paths, the command,
/// subagent and task ids, search patterns.
const KEY_ARGUMENTS: &[&str] = &[
    "file_path",
    "path",
    "command",
    "agent_id",
    "task_id",
    "subagent_type",
    "id",
    "pattern",
    "query",
];

/// The key arguments of a call whose arguments are `arguments` (JSON text), in
/// [`KEY_ARGUMENTS`] order, as given.
pub(crate) fn key_argument_values(arguments: &str) -> Vec<(&'static str, String)> {
    let args: serde_json::Value =
        serde_json::from_str(arguments).unwrap_or(serde_json::Value::Null);
    KEY_ARGUMENTS
        .iter()
        .filter_map(|k| Some((*k, args.get(*k)?.as_str()?.to_owned())))
        .collect()
}

/// Longest value a tool line shows of one argument, in characters.
const ARGUMENT_CHARS: usize = 60;

/// The key arguments of a call whose arguments are `arguments` (JSON text): `(key, value)`
/// in [`KEY_ARGUMENTS`] order, each value on one line and clipped to [`ARGUMENT_CHARS`].
pub(crate) fn key_arguments(arguments: &str) -> Vec<(&'static str, String)> {
    key_argument_values(arguments)
        .into_iter()
        .map(|(k, v)| (k, clip(&v)))
        .collect()
}

/// A value on one line, at most [`ARGUMENT_CHARS`] characters (`…` when cut).
fn clip(v: &str) -> String {
    let one_line = v.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= ARGUMENT_CHARS {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(ARGUMENT_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// A tool call as `hame chat` shows it: `read_file path=notes.txt`, `execute command="ls -l"`.
pub(crate) fn tool_line(name: &str, arguments: &str) -> String {
    let mut line = name.to_owned();
    for (k, v) in key_arguments(arguments) {
        line.push(' ');
        line.push_str(k);
        line.push('=');
        if v.contains(' ') || v.is_empty() {
            line.push_str(&format!("{v:?}"));
        } else {
            line.push_str(&v);
        }
    }
    line
}

/// The line `hame run` prints for each suspended tool call: the approval id, the tool and
/// its main argument.
pub(crate) fn suspended_lines(s: &hame::Suspended) -> String {
    s.calls
        .iter()
        .map(|c| {
            let main = crate::approve::shown_argument(c);
            format!(
                "approval needed: {} {} {} ({})",
                c.suspension.id, c.call.name, main, c.suspension.reason
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Exit code of a call that a budget stopped (`budget_exceeded`).
pub(crate) const EXIT_BUDGET_EXCEEDED: u8 = 6;

/// Maps a call's outcome to the exit the user sees: a signal (130/143), a suspension (3),
/// a budget reached (6, one line saying what was spent), a session state written by a
/// newer hame (2, one line naming its version).
pub(crate) fn outcome<T>(
    result: Result<T, hame::harness::Error>,
    signal: Option<u8>,
) -> anyhow::Result<T> {
    match result {
        Ok(v) => Ok(v),
        Err(hame::harness::Error::Call(hame::Error::Suspended(s))) => {
            Err(Stopped(3, suspended_lines(&s)).into())
        }
        Err(hame::harness::Error::Call(hame::Error::BudgetExceeded(b))) => {
            Err(Stopped(EXIT_BUDGET_EXCEEDED, b.to_string()).into())
        }
        Err(e) if e.is_too_new() => {
            Err(ConfigError(crate::one_line(&anyhow::Error::new(e))).into())
        }
        Err(e) => match signal {
            Some(code) => Err(Stopped(
                code,
                format!(
                    "stopped by {}: {e} (the conversation so far is saved)",
                    if code == 130 { "SIGINT" } else { "SIGTERM" }
                ),
            )
            .into()),
            None => Err(e.into()),
        },
    }
}

/// Exit code of a run whose required checks still fail (`unverified`).
pub(crate) const EXIT_UNVERIFIED: u8 = 5;

/// The completion gate of `hame run` (docs/evidence.md).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct VerifyArgs {
    /// Required checks (names of `[[verify]]` in hame.toml, comma-separated): after the
    /// final answer the checks whose evidence is missing or stale run; still failing after
    /// --verify-attempts rounds, the run exits 5 (`unverified`).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub(crate) verify: Vec<String>,
    /// Check rounds of the gate: after a failure the model gets one more step with the
    /// failing evidence, until this many rounds ran (1..=10).
    #[arg(long, default_value_t = hame::harness::evidence::DEFAULT_VERIFY_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..=10))]
    pub(crate) verify_attempts: u32,
    /// The session's goal (kept in its task state, shown in every request; docs/evidence.md).
    #[arg(long, value_name = "TEXT")]
    pub(crate) goal: Option<String>,
}

impl VerifyArgs {
    /// The context with the required checks, after checking that each is declared.
    pub(crate) fn apply(
        &self,
        agent: &HarnessAgent,
        ctx: hame::RuntimeContext,
    ) -> anyhow::Result<hame::RuntimeContext> {
        let ctx = match self.goal.as_deref().map(str::trim) {
            Some(g) if !g.is_empty() => hame::harness::task::with_goal(ctx, g),
            Some(_) => return Err(crate::ConfigError("--goal is empty".into()).into()),
            None => ctx,
        };
        let names: Vec<String> = self
            .verify
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return Ok(ctx);
        }
        let declared = agent.verifier_names();
        if let Some(unknown) = names.iter().find(|n| !declared.contains(n)) {
            return Err(crate::ConfigError(format!(
                "--verify {unknown:?}: no such check (declared in hame.toml [[verify]]: {})",
                if declared.is_empty() {
                    "none".to_owned()
                } else {
                    declared.join(", ")
                }
            ))
            .into());
        }
        Ok(hame::harness::evidence::require_checks(
            ctx,
            &names,
            Some(self.verify_attempts),
        ))
    }
}

/// One line per evidence: `check outcome (evidence id, version, files)` and the detail of a
/// failure.
pub(crate) fn evidence_lines(evidence: &[hame::Evidence]) -> String {
    let mut s = String::new();
    for e in evidence {
        let outcome = match e.outcome {
            hame::CheckOutcome::Passed => "passed",
            hame::CheckOutcome::Failed => "failed",
            hame::CheckOutcome::Error => "error",
        };
        let _ = write!(
            s,
            "{} {outcome}{} (evidence {}, version {}, {} files, exit code {})",
            e.check,
            if e.stale { ", stale" } else { "" },
            e.id,
            &e.version[..e.version.len().min(12)],
            e.files,
            e.exit_code
                .map_or_else(|| "-".to_owned(), |c| c.to_string()),
        );
        s.push('\n');
        for line in e.detail.lines() {
            s.push_str("    ");
            s.push_str(line);
            s.push('\n');
        }
    }
    s
}

/// After the reply is printed: exit 5 with the failing evidence when the gate says
/// `unverified`; otherwise name the evidence that backed it (stderr).
pub(crate) fn verdict(out: &hame::CallOutput) -> anyhow::Result<()> {
    let Some(v) = &out.verification else {
        return Ok(());
    };
    match v.status {
        hame::VerificationStatus::Verified => {
            crate::status::clear();
            eprint!("hame: verified by\n{}", evidence_lines(&v.evidence));
            Ok(())
        }
        hame::VerificationStatus::Unverified => {
            let failing: Vec<hame::Evidence> = v
                .evidence
                .iter()
                .filter(|e| e.outcome != hame::CheckOutcome::Passed)
                .cloned()
                .collect();
            Err(Stopped(
                EXIT_UNVERIFIED,
                format!(
                    "unverified: required checks failed after {} extra step{}\n{}",
                    v.extra_steps,
                    if v.extra_steps == 1 { "" } else { "s" },
                    evidence_lines(&failing).trim_end()
                ),
            )
            .into())
        }
    }
}

/// The images of `--image`: each file read whole, its type from its signature (PNG, JPEG,
/// GIF, WebP), at most [`hame::ImageBlock::MAX_BYTES`] each and
/// [`hame::ImageBlock::MAX_PER_REQUEST`] in all.
fn read_images(paths: &[std::path::PathBuf]) -> anyhow::Result<Vec<hame::ImageBlock>> {
    use base64::Engine as _;
    use std::io::Read as _;
    let most = hame::ImageBlock::MAX_PER_REQUEST;
    if paths.len() > most {
        anyhow::bail!(
            "{} images given; at most {most} go with one message",
            paths.len()
        );
    }
    let max = hame::ImageBlock::MAX_BYTES;
    paths
        .iter()
        .map(|path| {
            let shown = path.display();
            let file = std::fs::File::open(path)
                .map_err(|e| anyhow::anyhow!("cannot read image {shown}: {e}"))?;
            let mut bytes = Vec::new();
            // One byte past the limit tells an oversized file without reading it all.
            file.take(max as u64 + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| anyhow::anyhow!("cannot read image {shown}: {e}"))?;
            if bytes.len() > max {
                anyhow::bail!(
                    "image {shown} is larger than {} MiB; send a smaller image",
                    max / (1024 * 1024)
                );
            }
            let media_type = hame::ImageBlock::sniff(&bytes)
                .ok_or_else(|| anyhow::anyhow!("{shown} is not a PNG, JPEG, GIF or WebP image"))?;
            Ok(hame::ImageBlock {
                media_type: media_type.to_owned(),
                data: base64::engine::general_purpose::STANDARD.encode(&bytes),
            })
        })
        .collect()
}

pub(crate) async fn run(
    common: Common,
    pick: crate::resume::SessionPick,
    json: bool,
    verify: VerifyArgs,
    images: &[std::path::PathBuf],
    message: String,
) -> anyhow::Result<()> {
    let message = Message::user_with_images(message, read_images(images)?);
    let signals = Signals::watch();
    let (agent, ctx) = build(&common).await?;
    let mut ctx = verify.apply(&agent, ctx)?;
    crate::resume::apply(&pick, &agent, &mut ctx).await?;
    let (sink, mut rx) = EventSink::channel();
    let cancel = signals.begin();
    // The warnings of the call are printed as they come (background subagents keep the
    // event stream open after the call, so it is read alongside, not to its end).
    let call = agent.call_with(message, &ctx, &sink, &cancel);
    let result = with_warnings(call, &mut rx).await;
    let signal = signals.end();
    drop(sink);
    let out = outcome(result, signal)?;
    print_reply(&agent, &ctx, &out, json)?;
    crate::tasks::wait_for_background(&agent, &common, &signals, &mut rx).await;
    // The reply is printed and durable; let background memory work (flush,
    // consolidation) finish before the process exits, within a bound. Unfinished work is
    // redone by the session's next call.
    finish(&agent).await?;
    verdict(&out)
}

/// Awaits `call`, printing the warnings among its events as they come (and those left
/// when it ends).
pub(crate) async fn with_warnings<T>(
    call: impl std::future::Future<Output = T>,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<AgentEvent>,
) -> T {
    tokio::pin!(call);
    let result = loop {
        tokio::select! {
            r = &mut call => break r,
            Some(ev) = rx.recv() => warn_on(&ev),
        }
    };
    while let Ok(ev) = rx.try_recv() {
        warn_on(&ev);
    }
    result
}

/// Prints a call's reply: its text, or with `json` one object.
pub(crate) fn print_reply(
    agent: &HarnessAgent,
    ctx: &hame::RuntimeContext,
    out: &hame::CallOutput,
    json: bool,
) -> anyhow::Result<()> {
    crate::status::clear();
    if json {
        let obj = serde_json::json!({
            "reply": out.reply.text_content(),
            "agent": agent.name(),
            "session": ctx.session_id,
            "user": ctx.user_id,
            "usage": out.usage,
            "iterations": out.iterations,
            "verification": out.verification,
        });
        println!("{obj}");
    } else {
        println!("{}", out.reply.text_content());
    }
    std::io::stdout().flush()?;
    Ok(())
}

/// Lets background memory work finish (bounded) before the process exits.
pub(crate) async fn finish(agent: &HarnessAgent) -> anyhow::Result<()> {
    if !agent
        .wait_background(hame::harness::memory::DEFAULT_BACKGROUND_WAIT)
        .await
    {
        tracing::warn!("background memory work did not finish; the next call redoes it");
    }
    Ok(())
}

/// What one chat turn showed and counted.
#[derive(Debug, Default)]
pub(crate) struct Turn {
    /// The calls waiting for a decision, if the turn stopped for one.
    pub(crate) suspended: Option<Vec<hame::SuspendedCall>>,
    /// The usage of the turn's last model request (its input tokens: what the context
    /// held), if one was answered.
    pub(crate) last_request: Option<hame::Usage>,
}

/// Prints a chat turn's events: text as it streams, each tool call with its key arguments,
/// and on a terminal a spinner while the model has not answered yet.
pub(crate) async fn show_events(
    mut events: futures::stream::BoxStream<'static, AgentEvent>,
) -> anyhow::Result<Turn> {
    let mut out = std::io::stdout();
    let mut turn = Turn::default();
    let spinner = crate::status::Spinner::for_stderr();
    spinner.start();
    while let Some(ev) = events.next().await {
        // Reasoning is not shown: the wait goes on.
        if !matches!(
            ev,
            AgentEvent::ReasoningDelta { .. } | AgentEvent::Usage { .. }
        ) {
            spinner.stop();
            crate::status::clear();
        }
        match ev {
            AgentEvent::StepStarted { .. } => spinner.start(),
            AgentEvent::TextDelta { text } => {
                print!("{text}");
                out.flush()?;
            }
            AgentEvent::ToolStarted {
                name, arguments, ..
            } => eprintln!(
                "\n{}",
                crate::chat::dim(&format!("  ⚙ {} …", tool_line(&name, &arguments)))
            ),
            AgentEvent::ToolFinished {
                name,
                duration_ms,
                is_error,
                code,
                ..
            } => {
                let status = if is_error {
                    format!("error {}", code.unwrap_or_default())
                } else {
                    "ok".into()
                };
                eprintln!(
                    "{}",
                    crate::chat::dim(&format!("  ⚙ {name} {status} ({duration_ms} ms)"))
                );
            }
            AgentEvent::Usage { usage } => turn.last_request = Some(usage),
            AgentEvent::Finished { .. } => println!(),
            AgentEvent::Suspended { calls } => {
                eprintln!(
                    "\n{}",
                    suspended_lines(&hame::Suspended {
                        calls: calls.clone()
                    })
                );
                turn.suspended = Some(calls);
            }
            AgentEvent::Failed { message } => eprintln!("\nerror: {message}"),
            AgentEvent::Subagent {
                task_id,
                agent_id,
                event,
            } => child_line(&task_id, &agent_id, &event),
            other => warn_on(&other),
        }
    }
    spinner.stop();
    Ok(turn)
}

/// A subagent's progress in `hame chat`, indented under the tool call that spawned it.
fn child_line(task_id: &str, agent_id: &str, event: &AgentEvent) {
    let who = format!("    ↳ {agent_id} {task_id}");
    match event {
        AgentEvent::ToolStarted {
            name, arguments, ..
        } => eprintln!("{who} ⚙ {} …", tool_line(name, arguments)),
        AgentEvent::ToolFinished {
            name,
            duration_ms,
            is_error,
            ..
        } => eprintln!(
            "{who} ⚙ {name} {} ({duration_ms} ms)",
            if *is_error { "error" } else { "ok" }
        ),
        AgentEvent::Custom { kind, data } if kind.starts_with("subagent.") => {
            let status = kind.trim_start_matches("subagent.");
            match data.get("error").and_then(|e| e.as_str()) {
                Some(e) => eprintln!("{who} {status}: {e}"),
                None => eprintln!("{who} {status}"),
            }
        }
        // A remote (A2A) child's task: its state changes and what it said.
        AgentEvent::Custom { kind, data } if kind == "a2a.status" => {
            let state = data.get("state").and_then(|s| s.as_str()).unwrap_or("");
            match data.get("message").and_then(|m| m.as_str()) {
                Some(m) => eprintln!("{who} remote {state}: {}", clip(m)),
                None => eprintln!("{who} remote {state}"),
            }
        }
        AgentEvent::Subagent {
            task_id,
            agent_id,
            event,
        } => child_line(task_id, agent_id, event),
        other => warn_on(other),
    }
}
