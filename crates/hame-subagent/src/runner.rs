//! The seam between the subagent runtime and whatever runs a child: the harness implements
//! [`SubagentRunner`] (it builds the child's loop from the spec); a declaration may bring
//! its own runner (full control, or a remote agent).

use async_trait::async_trait;
use hame_core::{CancellationToken, EventSink, RuntimeContext, Usage};
use hame_tools::Workspace;

use crate::spec::SubagentSpec;

/// One run of a child.
#[derive(Debug, Clone)]
pub struct ChildRun {
    /// The child's declaration.
    pub spec: SubagentSpec,
    /// The message it gets (the task, or an `agent_send` message).
    pub message: String,
    /// The child's context: its own session (derived from the parent's), the parent's
    /// user, its depth in [`DEPTH_EXTRA`](crate::DEPTH_EXTRA).
    pub runtime: RuntimeContext,
    /// The child's workspace handle (the parent's, or its isolated folder).
    pub workspace: Workspace,
    /// The child's depth (1 for a child of the top-level agent).
    pub depth: usize,
    /// Whether the child may spawn children of its own (its depth is below the maximum):
    /// when false the runner must not offer the subagent tools.
    pub may_spawn: bool,
    /// Where the child's events go (tagged and forwarded to the parent's stream).
    pub events: EventSink,
    /// Cancelled by `task_cancel`, the time limit, or the parent's cancellation.
    pub cancel: CancellationToken,
    /// Where the runner reads environment variables (a remote agent's `a2a_auth_env`):
    /// [`SubagentOptions::env`](crate::SubagentOptions::env).
    pub env: hame_core::EnvLookup,
}

/// A child's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildReply {
    /// Its final reply.
    pub text: String,
    /// Reasoning steps it took.
    pub iterations: usize,
    /// Tokens it used.
    pub usage: Usage,
}

/// Runs children. Errors are the reason the child failed, as the parent should read it.
#[async_trait]
pub trait SubagentRunner: Send + Sync + std::fmt::Debug + 'static {
    /// Runs one child to its final reply.
    async fn run(&self, run: ChildRun) -> Result<ChildReply, String>;
}
