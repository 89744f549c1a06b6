//! Subagent flags, `hame tasks`, and the wait for background tasks before `hame run` exits.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use hame::{HarnessAgent, HarnessAgentBuilder};

use crate::common::{Common, build_without_model};
use crate::config::Effective;
use crate::signals::Signals;

/// Subagent flags of `run`, `chat` (and `tasks`).
#[derive(Debug, Args)]
pub(crate) struct SubagentArgs {
    /// Do not offer the built-in `general-purpose` subagent (workspace specs in
    /// subagents/<id>.md still work).
    #[arg(long, help_heading = "Subagents")]
    pub(crate) no_general_subagent: bool,
    /// How deep subagents may nest: 1 = children are leaves (0 switches subagents off) [default: 1]
    #[arg(long, help_heading = "Subagents")]
    pub(crate) subagent_depth: Option<usize>,
    /// `hame run` waits up to this many seconds for background tasks it started before it
    /// exits; tasks still running then are stopped and recorded failed (interrupted) [default: 600]
    #[arg(long, value_name = "SECONDS", help_heading = "Subagents")]
    pub(crate) task_wait: Option<u64>,
}

/// Applies the flags to the builder; subagent specs naming a model open it like --model.
pub(crate) fn configure(
    args: &SubagentArgs,
    config: &Effective,
    builder: HarnessAgentBuilder,
) -> HarnessAgentBuilder {
    let options = hame::subagent::SubagentOptions {
        general_purpose: !args.no_general_subagent,
        max_depth: config.subagent_depth.value,
        ..hame::subagent::SubagentOptions::default()
    };
    let env = config.model_env();
    builder
        .subagent_options(options)
        .model_resolver(hame::harness::ModelResolver(Arc::new(move |spec: &str| {
            hame::model::open(spec, &env).map_err(|e| e.to_string())
        })))
}

/// After `hame run` printed its reply: waits for the background tasks it started (bounded
/// by --task-wait; a signal stops the wait), then stops and records what still runs.
pub(crate) async fn wait_for_background(
    agent: &HarnessAgent,
    common: &Common,
    signals: &Signals,
    events: &mut tokio::sync::mpsc::UnboundedReceiver<hame::AgentEvent>,
) {
    let n = agent.running_tasks();
    if n == 0 {
        return;
    }
    let task_wait = crate::config::resolve(common)
        .map(|c| c.task_wait.value)
        .unwrap_or(crate::config::DEFAULT_TASK_WAIT);
    eprintln!(
        "hame: waiting for {n} background task(s) (up to {} s; --task-wait)",
        task_wait
    );
    let cancel = signals.begin();
    let wait = agent.wait_tasks(Duration::from_secs(task_wait));
    tokio::pin!(wait);
    loop {
        tokio::select! {
            _ = &mut wait => break,
            _ = cancel.cancelled() => break,
            // The children's events: their warnings are the user's too.
            Some(ev) = events.recv() => {
                if let hame::AgentEvent::Subagent { event, .. } = &ev {
                    crate::run::warn_on(event);
                }
            }
        }
    }
    let signal = signals.end();
    let left = agent.running_tasks();
    if left > 0 {
        let reason = match signal {
            Some(_) => {
                "interrupted: hame run was stopped by a signal before the task finished".to_owned()
            }
            None => format!(
                "interrupted: still running when hame run stopped waiting (--task-wait {} s)",
                task_wait
            ),
        };
        let stopped = agent.interrupt_tasks(&reason).await;
        eprintln!("hame: {stopped} background task(s) stopped and recorded failed (interrupted)");
    }
}

/// `hame tasks`: the task records of a session.
pub(crate) async fn tasks(common: Common, json: bool) -> anyhow::Result<()> {
    let (agent, ctx) = build_without_model(&common).await?;
    let records = agent.tasks(&ctx).await?;
    if json {
        println!("{}", serde_json::to_string(&records)?);
        return Ok(());
    }
    if records.is_empty() {
        println!("no tasks in session {}", ctx.session_id);
        return Ok(());
    }
    for r in records {
        let detail = r
            .error
            .as_deref()
            .or(r.result.as_deref())
            .unwrap_or("")
            .lines()
            .next()
            .unwrap_or("");
        let detail: String = detail.chars().take(80).collect();
        println!(
            "{}  {:<16} {:<9}  {}  {}",
            r.task_id,
            r.agent_id,
            r.status.as_str(),
            r.created_at.format("%Y-%m-%d %H:%M:%S"),
            detail
        );
    }
    Ok(())
}
