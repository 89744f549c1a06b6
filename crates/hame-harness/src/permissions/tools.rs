//! `plan_enter`, `plan_write`, `plan_exit` and `todo_write`: they change the call's
//! [`PermissionCell`] (written back to the session state when the call ends).

use std::sync::Arc;

use async_trait::async_trait;
use hame_core::{Tool, ToolContext, ToolError, ToolOutput, TypedTool, codes, typed};
use hame_fs::{FsPath, WriteOptions};
use hame_tools::WorkspaceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::PermissionCell;

/// Where `plan_write` writes, in the caller's files (the tenant's namespace).
pub const PLAN_FILE: &str = "plans/PLAN.md";
/// Most items of a todo list.
pub const MAX_TODOS: usize = 100;
/// Longest todo item, in characters.
const MAX_TODO_CHARS: usize = 500;
/// Largest plan, in bytes.
const MAX_PLAN_BYTES: usize = 256 * 1024;

/// What the system prompt says while plan mode is on.
pub(crate) const PLAN_MODE_NOTE: &str = "\n\n# Plan mode\nYou are in plan mode (read-only): tools that change something (writing, editing or deleting files, the shell, saving memory, MCP tools not marked read-only) are denied. Explore with read-only tools, write your plan with plan_write, then call plan_exit; a human approves the plan before you may change anything.";

/// The status of a todo item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    /// Not started.
    Pending,
    /// Being worked on (at most one).
    InProgress,
    /// Done.
    Completed,
}

/// One item of the todo list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Todo {
    /// What to do.
    #[schemars(description = "")] // the names say it; the model reads the tool's text
    pub content: String,
    /// `pending`, `in_progress` or `completed`.
    #[schemars(description = "")]
    pub status: TodoStatus,
}

/// The todo list as the model reads it.
pub(crate) fn render_todos(todos: &[Todo]) -> String {
    todos
        .iter()
        .map(|t| {
            let mark = match t.status {
                TodoStatus::Pending => "[ ]",
                TodoStatus::InProgress => "[~]",
                TodoStatus::Completed => "[x]",
            };
            let tail = if t.status == TodoStatus::InProgress {
                " (in progress)"
            } else {
                ""
            };
            format!("- {mark} {}{tail}\n", t.content)
        })
        .collect()
}

/// The plan and todo tools.
pub fn plan_tools() -> Vec<Arc<dyn Tool>> {
    vec![
        typed(PlanEnter),
        typed(PlanWrite),
        typed(PlanExit),
        typed(TodoWrite),
    ]
}

fn cell(ctx: &ToolContext) -> Result<Arc<PermissionCell>, ToolError> {
    ctx.extensions.get_arc::<PermissionCell>().ok_or_else(|| {
        ToolError::new(
            codes::FAILED,
            "plan mode and the todo list need the permissions layer, which is not in this agent",
        )
    })
}

/// Arguments of `plan_enter`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoArgs {}

#[derive(Debug)]
struct PlanEnter;

#[async_trait]
impl TypedTool for PlanEnter {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "plan_enter"
    }
    fn description(&self) -> String {
        "Enter plan mode: a read-only phase for exploring and writing a plan (plan_write) before changing anything. Tools that change something are denied until a human approves the plan (plan_exit).".into()
    }
    async fn run(&self, _args: NoArgs, ctx: &ToolContext) -> ToolOutput {
        let cell = cell(ctx)?;
        let was = cell.update(|s| std::mem::replace(&mut s.plan_mode, true));
        Ok(if was == Some(true) {
            "Already in plan mode.".into()
        } else {
            format!(
                "Plan mode is on. Explore with read-only tools, write the plan with plan_write ({PLAN_FILE}), then call plan_exit to ask for approval."
            )
        })
    }
}

/// Arguments of `plan_write`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PlanWriteArgs {
    /// The whole plan, in Markdown (it replaces the previous one).
    content: String,
}

#[derive(Debug)]
struct PlanWrite;

#[async_trait]
impl TypedTool for PlanWrite {
    type Args = PlanWriteArgs;
    fn name(&self) -> &str {
        "plan_write"
    }
    fn description(&self) -> String {
        format!("Write the plan to {PLAN_FILE} (replacing it). Allowed in plan mode.")
    }
    async fn run(&self, args: PlanWriteArgs, ctx: &ToolContext) -> ToolOutput {
        if args.content.len() > MAX_PLAN_BYTES {
            return Err(ToolError::invalid_arguments(format!(
                "a plan is at most {MAX_PLAN_BYTES} bytes"
            )));
        }
        let ws = ctx.workspace()?;
        let path =
            FsPath::parse(PLAN_FILE).map_err(|e| ToolError::new(codes::FAILED, e.to_string()))?;
        let len = args.content.len();
        ws.files()
            .write(&path, args.content.into_bytes(), WriteOptions::default())
            .await
            .map_err(|e| ToolError::new(codes::FAILED, format!("cannot write {PLAN_FILE}: {e}")))?;
        Ok(format!("Wrote the plan ({len} bytes) to {PLAN_FILE}."))
    }
}

/// Arguments of `plan_exit`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PlanExitArgs {
    /// A short summary of the plan for the person who approves it.
    #[serde(default)]
    summary: Option<String>,
}

#[derive(Debug)]
struct PlanExit;

#[async_trait]
impl TypedTool for PlanExit {
    type Args = PlanExitArgs;
    fn name(&self) -> &str {
        "plan_exit"
    }
    fn description(&self) -> String {
        format!(
            "Ask a human to approve the plan ({PLAN_FILE}) and leave plan mode. After approval you may change things."
        )
    }
    async fn run(&self, args: PlanExitArgs, ctx: &ToolContext) -> ToolOutput {
        let cell = cell(ctx)?;
        if cell.plan_mode_inherited() {
            return Err(ToolError::new(
                codes::DENIED,
                "plan mode was set by the agent that spawned you; it cannot be left here",
            ));
        }
        match cell.update(|s| std::mem::replace(&mut s.plan_mode, false)) {
            Some(true) => Ok(format!(
                "The plan{} was approved: plan mode is off and you may now make changes. Follow {PLAN_FILE}; track the steps with todo_write.",
                args.summary
                    .filter(|s| !s.trim().is_empty())
                    .map(|s| format!(" ({})", s.trim()))
                    .unwrap_or_default()
            )),
            _ => Err(ToolError::new(
                codes::INVALID_ARGUMENTS,
                "not in plan mode (plan_enter starts it)",
            )),
        }
    }
}

/// Arguments of `todo_write`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TodoWriteArgs {
    /// The whole list.
    todos: Vec<Todo>,
}

#[derive(Debug)]
struct TodoWrite;

#[async_trait]
impl TypedTool for TodoWrite {
    type Args = TodoWriteArgs;
    fn name(&self) -> &str {
        "todo_write"
    }
    fn description(&self) -> String {
        "Replace your todo list (shown to you every step); at most one item in_progress.".into()
    }
    async fn run(&self, args: TodoWriteArgs, ctx: &ToolContext) -> ToolOutput {
        let todos = validate_todos(args.todos).map_err(ToolError::invalid_arguments)?;
        let cell = cell(ctx)?;
        let text = render_todos(&todos);
        let n = todos.len();
        cell.update(|s| s.todos = todos);
        Ok(if n == 0 {
            "The todo list is empty.".into()
        } else {
            format!("Todo list ({n} items):\n{text}")
        })
    }
}

/// Checks a new todo list: at most [`MAX_TODOS`] items, none blank or over 500
/// characters, at most one `in_progress`. Content is trimmed.
pub(crate) fn validate_todos(todos: Vec<Todo>) -> Result<Vec<Todo>, String> {
    if todos.len() > MAX_TODOS {
        return Err(format!("a todo list has at most {MAX_TODOS} items"));
    }
    let mut out = Vec::with_capacity(todos.len());
    for (i, mut t) in todos.into_iter().enumerate() {
        t.content = t.content.trim().to_owned();
        if t.content.is_empty() {
            return Err(format!("item {} has no content", i + 1));
        }
        if t.content.chars().count() > MAX_TODO_CHARS {
            return Err(format!(
                "item {} is longer than {MAX_TODO_CHARS} characters",
                i + 1
            ));
        }
        out.push(t);
    }
    if out
        .iter()
        .filter(|t| t.status == TodoStatus::InProgress)
        .count()
        > 1
    {
        return Err("at most one item may be in_progress".into());
    }
    Ok(out)
}
