//! The six tools offered to an agent that may spawn: `agent_spawn`, `agent_send`,
//! `agent_list`, `task_output`, `task_list`, `task_cancel`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hame_core::{Tool, ToolContext, ToolError, ToolOutput, TypedTool, typed};
use hame_tools::WorkspaceExt;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::error::Error;
use crate::manager::{SpawnOutcome, SpawnRequest, Subagents, depth_of};
use crate::task::{TaskRecord, TaskStatus};

/// Names of the subagent tools (a leaf never gets them).
pub const SUBAGENT_TOOLS: [&str; 6] = [
    "agent_spawn",
    "agent_send",
    "agent_list",
    "task_output",
    "task_list",
    "task_cancel",
];

/// Error code of a child that failed (or was cancelled) in a sync spawn.
pub const SUBAGENT_FAILED: &str = "subagent_failed";

/// The six tools over one runtime.
pub fn subagent_tools(subagents: &Arc<Subagents>) -> Vec<Arc<dyn Tool>> {
    vec![
        typed(Spawn(subagents.clone())),
        typed(Send(subagents.clone())),
        typed(List(subagents.clone())),
        typed(Output(subagents.clone())),
        typed(Tasks(subagents.clone())),
        typed(Cancel(subagents.clone())),
    ]
}

fn to_tool_error(e: Error) -> ToolError {
    let code = match &e {
        Error::UnknownSubagent { .. } => "unknown_subagent",
        Error::UnknownTask(_) => "unknown_task",
        Error::DepthExceeded { .. } => "depth_exceeded",
        Error::InvalidState(_) => "invalid_state",
        _ => hame_core::codes::FAILED,
    };
    ToolError::new(code, e.to_string())
}

/// The record as the model reads it: `key: value` lines, then the result or the error.
pub fn render(r: &TaskRecord) -> String {
    let mut s = format!(
        "task_id: {}\nagent_id: {}\nstatus: {}\n",
        r.task_id,
        r.agent_id,
        r.status.as_str()
    );
    if let Some(n) = r.iterations {
        let _ = writeln!(s, "iterations: {n}");
    }
    match r.status {
        TaskStatus::Completed => {
            let _ = write!(
                s,
                "result:\n{}",
                r.result.as_deref().unwrap_or("(no output)")
            );
        }
        TaskStatus::Failed | TaskStatus::Cancelled => {
            let _ = write!(
                s,
                "error: {}",
                r.error.as_deref().unwrap_or("(no reason recorded)")
            );
        }
        TaskStatus::Pending | TaskStatus::Running => {
            let _ = write!(
                s,
                "The task has not finished; call task_output(task_id=\"{}\", wait_seconds=...) to wait for it.",
                r.task_id
            );
        }
    }
    s
}

fn outcome_text(outcome: SpawnOutcome, wait: Option<u64>) -> ToolOutput {
    match outcome {
        SpawnOutcome::Finished(r) if r.status == TaskStatus::Completed => Ok(render(&r)),
        SpawnOutcome::Finished(r) => Err(ToolError::new(
            SUBAGENT_FAILED,
            format!(
                "task {} (subagent {}) {}: {}",
                r.task_id,
                r.agent_id,
                r.status.as_str(),
                r.error.as_deref().unwrap_or("no reason recorded")
            ),
        )),
        SpawnOutcome::Background(r) => Ok(format!(
            "task_id: {}\nagent_id: {}\nstatus: {}\nStarted in the background. Its result is delivered to you when it finishes; task_output(task_id=\"{}\") waits for it, task_cancel stops it.",
            r.task_id,
            r.agent_id,
            r.status.as_str(),
            r.task_id
        )),
        SpawnOutcome::StillRunning(r) => Ok(format!(
            "task_id: {}\nagent_id: {}\nstatus: {}\nThe subagent did not finish within {} s; it keeps running as background task {}. Its result is delivered to you when it finishes; task_output(task_id=\"{}\") waits for it.",
            r.task_id,
            r.agent_id,
            r.status.as_str(),
            wait.unwrap_or_default(),
            r.task_id,
            r.task_id
        )),
    }
}

#[derive(Debug)]
struct Spawn(Arc<Subagents>);

/// Arguments of `agent_spawn`.
#[derive(Debug, Deserialize, JsonSchema)]
struct SpawnArgs {
    /// A subagent id.
    agent_id: String,
    /// The whole task; it sees nothing of this chat.
    task: String,
    /// Return a task_id at once.
    #[serde(default)]
    background: bool,
    /// Past it, the task goes on in the background.
    #[serde(default)]
    timeout_seconds: Option<u64>,
}

#[async_trait]
impl TypedTool for Spawn {
    type Args = SpawnArgs;
    fn name(&self) -> &str {
        "agent_spawn"
    }
    fn description(&self) -> String {
        "Run a task in a subagent and return its final reply (see Subagents in the prompt).".into()
    }
    async fn run(&self, a: SpawnArgs, ctx: &ToolContext) -> ToolOutput {
        if a.task.trim().is_empty() {
            return Err(ToolError::invalid_arguments("`task` is empty"));
        }
        let req = SpawnRequest {
            agent_id: a.agent_id,
            message: a.task,
            background: a.background,
            wait: a.timeout_seconds.map(Duration::from_secs),
        };
        let out = self.0.spawn(ctx, req).await.map_err(to_tool_error)?;
        outcome_text(out, a.timeout_seconds)
    }
}

#[derive(Debug)]
struct Send(Arc<Subagents>);

/// Arguments of `agent_send`.
#[derive(Debug, Deserialize, JsonSchema)]
struct SendArgs {
    /// The task of the child to continue (it must have finished).
    task_id: String,
    /// The next message for the child; it remembers its earlier conversation.
    message: String,
    /// Return at once instead of waiting for the reply. Default false.
    #[serde(default)]
    background: bool,
    /// Wait at most this many seconds for the reply.
    #[serde(default)]
    timeout_seconds: Option<u64>,
}

#[async_trait]
impl TypedTool for Send {
    type Args = SendArgs;
    fn name(&self) -> &str {
        "agent_send"
    }
    fn description(&self) -> String {
        "Continue the conversation of a finished subagent task with a new message; answers like agent_spawn.".into()
    }
    async fn run(&self, a: SendArgs, ctx: &ToolContext) -> ToolOutput {
        let req = SpawnRequest {
            agent_id: String::new(),
            message: a.message,
            background: a.background,
            wait: a.timeout_seconds.map(Duration::from_secs),
        };
        let out = self
            .0
            .send(ctx, &a.task_id, req)
            .await
            .map_err(to_tool_error)?;
        outcome_text(out, a.timeout_seconds)
    }
}

#[derive(Debug)]
struct List(Arc<Subagents>);

/// `agent_list` takes no arguments.
#[derive(Debug, Deserialize, JsonSchema)]
struct NoArgs {}

#[async_trait]
impl TypedTool for List {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "agent_list"
    }
    fn description(&self) -> String {
        "List the subagents you may spawn (id and description) and your children that are still running.".into()
    }
    async fn run(&self, _: NoArgs, ctx: &ToolContext) -> ToolOutput {
        let ws = ctx.workspace()?.clone();
        // The specs the step's prompt listed (its snapshot).
        let catalog = self.0.catalog(&ctx.config_workspace()?).await;
        let mut s = String::from("subagents:\n");
        if depth_of(&ctx.runtime) >= self.0.options().max_depth {
            s.push_str("(none: you are at the maximum depth and cannot spawn)\n");
        } else {
            for (id, d) in &catalog.specs {
                let _ = writeln!(s, "- {id}: {}", d.spec.description);
            }
        }
        let tasks = self.0.sweep(&ws).await.map_err(to_tool_error)?;
        let live: Vec<_> = tasks.iter().filter(|r| !r.status.is_terminal()).collect();
        s.push_str("running children:\n");
        if live.is_empty() {
            s.push_str("(none)\n");
        }
        for r in live {
            let _ = writeln!(s, "- {} {} {}", r.task_id, r.agent_id, r.status.as_str());
        }
        Ok(s)
    }
}

#[derive(Debug)]
struct Output(Arc<Subagents>);

/// Arguments of `task_output`.
#[derive(Debug, Deserialize, JsonSchema)]
struct OutputArgs {
    /// The task id (task-...).
    task_id: String,
    /// Wait up to this many seconds for the task to finish (max 600). Default 0: answer at
    /// once.
    #[serde(default)]
    wait_seconds: Option<u64>,
}

#[async_trait]
impl TypedTool for Output {
    type Args = OutputArgs;
    fn name(&self) -> &str {
        "task_output"
    }
    fn description(&self) -> String {
        "The status of a subagent task (pending, running, completed, failed, cancelled) and, when it has finished, its result or error. wait_seconds waits for it to finish.".into()
    }
    async fn run(&self, a: OutputArgs, ctx: &ToolContext) -> ToolOutput {
        let wait = Duration::from_secs(a.wait_seconds.unwrap_or(0));
        let r = self
            .0
            .output(ctx, &a.task_id, wait)
            .await
            .map_err(to_tool_error)?;
        Ok(render(&r))
    }
}

#[derive(Debug)]
struct Tasks(Arc<Subagents>);

#[async_trait]
impl TypedTool for Tasks {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "task_list"
    }
    fn description(&self) -> String {
        "List the subagent tasks of this session with their status.".into()
    }
    async fn run(&self, _: NoArgs, ctx: &ToolContext) -> ToolOutput {
        let tasks = self.0.list(ctx).await.map_err(to_tool_error)?;
        if tasks.is_empty() {
            return Ok("no tasks in this session".into());
        }
        let mut s = String::new();
        for r in tasks {
            let _ = writeln!(
                s,
                "{} {} {} {}",
                r.task_id,
                r.agent_id,
                r.status.as_str(),
                r.created_at.format("%Y-%m-%dT%H:%M:%SZ")
            );
        }
        Ok(s)
    }
}

#[derive(Debug)]
struct Cancel(Arc<Subagents>);

/// Arguments of `task_cancel`.
#[derive(Debug, Deserialize, JsonSchema)]
struct CancelArgs {
    /// The task id (task-...).
    task_id: String,
}

#[async_trait]
impl TypedTool for Cancel {
    type Args = CancelArgs;
    fn name(&self) -> &str {
        "task_cancel"
    }
    fn description(&self) -> String {
        "Stop a running subagent task (and its own children); its status becomes cancelled.".into()
    }
    async fn run(&self, a: CancelArgs, ctx: &ToolContext) -> ToolOutput {
        let r = self
            .0
            .cancel(ctx, &a.task_id)
            .await
            .map_err(to_tool_error)?;
        if r.cancel_requested && !r.status.is_terminal() {
            return Ok(format!(
                "task_id: {}\nstatus: {}\nCancellation requested: another process runs this task and stops it within a few seconds.",
                r.task_id,
                r.status.as_str()
            ));
        }
        Ok(render(&r))
    }
}
