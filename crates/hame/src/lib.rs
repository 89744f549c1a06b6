//! # hame
//!
//! An agent harness: it wraps a tool-calling LLM in a ReAct loop with everything a
//! long-running agent needs — a workspace as the single source of truth (`AGENTS.md`,
//! `MEMORY.md`, `knowledge/`, skills), a pluggable filesystem with tenant isolation,
//! per-session state that survives processes and replicas, and never-compacted session logs.
//!
//! This facade re-exports the public API. Pick backends with Cargo features; each one is
//! declared in the leaf crate that owns it and forwarded here once:
//!
//! | feature | what it adds |
//! |---|---|
//! | `openai` | OpenAI-compatible Chat Completions client ([`model::OpenAiModel`]) |
//! | `anthropic` | Anthropic Messages client ([`model::AnthropicModel`]) |
//! | `redis` | Redis shared-store filesystem and state store |
//! | `postgres` | PostgreSQL state store |
//! | `mysql` | MySQL / MariaDB state store |
//! | `s3` | object storage (S3 and S3-compatible) as the shared-store filesystem |
//! | `sandbox` | the Docker sandbox ([`sandbox::DockerSandboxes`], bollard) |
//! | `mcp-http` | MCP servers over streamable HTTP (stdio servers need no feature) |
//! | `skills-git` | skill repositories in Git (`skills::GitRepository`, through gix) |
//! | `skills-sql` | skill repositories in a PostgreSQL or MySQL/MariaDB table (`skills::SqlRepository`) |
//! | `full` | all of the above |
//! | `test-support` | an in-process model double for unit tests |
//!
//! Without features you get the loop, the local filesystem, JSON-file state and the
//! session logs.
//!
//! ```no_run
//! # #[cfg(feature = "openai")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use hame::{HarnessAgent, Message, RuntimeContext};
//!
//! let env = |k: &str| std::env::var(k).ok();
//! let model = hame::model::open("openai:gpt-4o-mini", &env)?;
//! let agent = HarnessAgent::builder().name("helper").model(model).workspace("./ws").build()?;
//! let out = agent.call(Message::user("hi"), &RuntimeContext::new("s1")).await?;
//! println!("{}", out.reply.text_content());
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub use hame_core::*;
pub use hame_harness::{
    DEFAULT_AGENT_NAME, EnvLookup, FilesystemMode, HarnessAgent, HarnessAgentBuilder,
    WorkspaceContext, resolve_workspace,
};
pub use hame_tools::{Identity, Workspace, WorkspaceExt, WorkspaceMode};
/// Re-exported: the `Deserialize` of a tool's arguments uses the same serde as hame.
pub use serde;
/// Re-exported: tool results and arguments are JSON.
pub use serde_json;

/// What a custom tool needs, in one import: `use hame::prelude::*;`.
///
/// With it, `#[derive(Deserialize, JsonSchema)]` on the argument struct works with only
/// `hame` and `serde` in your `[dependencies]` (the schema derive finds `schemars` through
/// this module; serde's derive needs the `serde` crate itself, or
/// `#[serde(crate = "hame::serde")]`). See `docs/tools.md` and `examples/custom-tool`.
///
/// ```
/// use hame::prelude::*;
///
/// /// Arguments of `add`.
/// #[derive(Debug, Deserialize, JsonSchema)]
/// #[serde(crate = "hame::serde")]
/// struct AddArgs {
///     /// The first number.
///     a: f64,
///     /// The second number.
///     b: f64,
/// }
///
/// #[derive(Debug)]
/// struct Add;
///
/// #[async_trait]
/// impl TypedTool for Add {
///     type Args = AddArgs;
///     fn name(&self) -> &str { "add" }
///     fn description(&self) -> String { "Add two numbers.".into() }
///     async fn run(&self, args: AddArgs, _ctx: &ToolContext) -> ToolOutput {
///         Ok(format!("{}", args.a + args.b))
///     }
/// }
///
/// let tool = typed(Add);
/// assert_eq!(tool.spec().name, "add");
/// ```
pub mod prelude {
    pub use crate::schemars::{self, JsonSchema};
    pub use crate::serde::{self, Deserialize, Serialize};
    pub use crate::{
        Reconciled, Tool, ToolContext, ToolError, ToolOutput, TypedTool, WorkspaceExt, async_trait,
        typed,
    };
}

/// Tools over the caller's workspace and the workspace handle (`hame-tools`).
pub mod tools {
    pub use hame_tools::*;
}

/// Model providers (`hame-model`).
pub mod model {
    pub use hame_model::*;
}

/// The harness (`hame-harness`).
pub mod harness {
    pub use hame_harness::*;
}

/// The filesystem layer (`hame-fs`), with the file tools of `hame-tools` beside it.
pub mod fs {
    pub use hame_fs::*;
    pub use hame_tools::{FsToolOptions, fs_tools, fs_tools_with_execute};
    /// Shared-store backends (`hame-fs-remote`): Redis and object storage.
    pub mod remote {
        pub use hame_fs_remote::*;
    }
}

/// The Docker sandbox (`hame-sandbox`): tools in a locked-down container per isolation scope.
pub mod sandbox {
    pub use hame_sandbox::*;
}

/// Subagents (`hame-subagent`): declarations, durable tasks, the spawn and task tools.
pub mod subagent {
    pub use hame_subagent::*;
}

/// State stores (`hame-state`).
pub mod state {
    pub use hame_state::*;
}

/// Session logs and their tools (`hame-session`).
pub mod session {
    pub use hame_session::*;
}

/// The memory and context engine (`hame-memory`): search index, token counting,
/// compaction, offloading, daily logs and consolidation. The harness wires it in through
/// [`HarnessAgentBuilder::memory`](crate::HarnessAgentBuilder::memory).
pub mod memory {
    pub use hame_memory::*;
}

/// Skills: `SKILL.md` discovery, `load_skill`, drafts and the curator (`hame-skills`).
pub mod skills {
    pub use hame_skills::*;
}

/// The MCP client (`hame-mcp`).
pub mod mcp {
    pub use hame_mcp::*;
}
