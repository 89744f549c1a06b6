//! Subagents for the hame agent harness: an agent hands a self-contained task to a child
//! agent, waits for its reply or lets it run in the background, and gets the result back
//! exactly once.
//!
//! Who depends on it: `hame-harness` (which implements [`SubagentRunner`] by building the
//! child's loop from the parent's model, tools and layers), and anyone who wants to run
//! children their own way (a declaration may bring its own runner: the seam for remote
//! agents).
//!
//! What is here:
//! - [`spec`]: declarations ([`SubagentSpec`]) from four places — the built-in
//!   `general-purpose`, code, workspace files `subagents/<id>.md` (YAML front matter, the
//!   body is the child's system prompt) and per-user overrides `<userId>/subagents/<id>.md`
//!   — read per call through the caller's workspace handle ([`Catalog::load`]);
//! - [`task`]: durable task records (`agents/<agent>/tasks/<session>/<task_id>.json` in the
//!   tenant's namespace) and their state machine as plain functions;
//! - [`Subagents`]: the runtime (spawn, send, output, cancel, heartbeats, the concurrency
//!   bound, wall-clock limits, orphan sweep);
//! - [`subagent_tools`]: `agent_spawn`, `agent_send`, `agent_list`, `task_output`,
//!   `task_list`, `task_cancel`;
//! - [`SubagentLayer`]: the subagents section of the system prompt and the push of
//!   finished background results into the parent's context.
//!
//! - [`a2a`]: remote subagents over A2A ([`A2aRunner`], the runner of a spec with
//!   front-matter `a2a: <url>`; `docs/a2a.md`).
//!
//! | feature | what it adds |
//! |---|---|
//! | `a2a` | the A2A client of remote subagents (reqwest); without it a remote spec's task fails naming the feature |
//!
//! Records go through the caller's filesystem (the shared store in store mode).
//!
//! # Example
//! A runner that answers without a model, driven through the `agent_spawn` tool:
//! ```
//! use std::sync::Arc;
//! use async_trait::async_trait;
//! use hame_core::{Extensions, RuntimeContext, Tool, ToolContext, Usage};
//! use hame_subagent::{ChildReply, ChildRun, SubagentOptions, SubagentRunner, SubagentSpec, Subagents};
//! use hame_tools::{Identity, Workspace, WorkspaceMode};
//!
//! #[derive(Debug)]
//! struct Echo;
//! #[async_trait]
//! impl SubagentRunner for Echo {
//!     async fn run(&self, run: ChildRun) -> Result<ChildReply, String> {
//!         Ok(ChildReply { text: format!("done: {}", run.message), iterations: 1, usage: Usage::default() })
//!     }
//! }
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let subagents = Arc::new(Subagents::new(
//!     "hame",
//!     SubagentOptions::default(),
//!     vec![SubagentSpec::new("echo", "Repeats the task", "You repeat.").into()],
//! ));
//! subagents.set_runner(Arc::new(Echo));
//! let fs: Arc<dyn hame_fs::Filesystem> = Arc::new(hame_fs::InMemoryFs::new());
//! let ws = Workspace::new(Identity::new("hame", None, "s1"), WorkspaceMode::IsolatedLocal, fs.clone(), fs);
//! let mut ext = Extensions::new();
//! ext.insert(ws);
//! let ctx = ToolContext::new(RuntimeContext::new("s1"), "call-1").with_extensions(ext);
//! let spawn = hame_subagent::subagent_tools(&subagents).remove(0);
//! let out = spawn.call(serde_json::json!({"agent_id": "echo", "task": "hello"}), &ctx).await?;
//! assert!(out.contains("status: completed") && out.contains("done: hello"));
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod a2a;
mod delivery;
mod error;
mod layer;
mod manager;
mod runner;
pub mod spec;
pub mod task;
mod tools;

pub use a2a::A2aRunner;
pub use delivery::{DELIVERED_EXTENSION, Deliveries};
pub use error::{Error, Result};
pub use layer::{SubagentLayer, notification};
pub use manager::{
    DEPTH_EXTRA, ParentCall, SpawnOutcome, SpawnRequest, SubagentOptions, Subagents, TASK_EXTRA,
    TOOLS_EXTRA, TaskQueue, child_session_id, depth_of, tool_allowlist,
};
pub use runner::{ChildReply, ChildRun, SubagentRunner};
pub use spec::{
    Catalog, Declaration, GENERAL_PURPOSE, SpecSandbox, SpecSource, SpecWorkspace, SubagentSpec,
};
pub use task::{TaskRecord, TaskStatus, TaskStore};
pub use tools::{SUBAGENT_FAILED, SUBAGENT_TOOLS, render, subagent_tools};
