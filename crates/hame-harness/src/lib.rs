//! # hame-harness
//!
//! The composition root of hame: [`HarnessAgent`] wraps the ReAct loop of `hame-core` with
//! workspace context (the system prompt is rebuilt from `AGENTS.md`, `MEMORY.md` and
//! `knowledge/` before every step), per-session state, and the harness's built-in
//! layers. It contains no backend code: backends come from the leaf crates.
//!
//! Workspace-declared capabilities are wired here too: skills (`hame-skills`: the
//! `<available_skills>` block, `load_skill`, `propose_skill`) and `tools.json`
//! ([`tools_config`]: allow/deny and MCP servers through `hame-mcp`, applied per call by
//! the innermost [`ToolsConfigLayer`]); see `docs/skills.md` and `docs/tools-and-mcp.md`.
//! Every tool call passes the [`permissions`] layer (allow / ask / deny rules with durable
//! human approval, plan mode, the todo list; `docs/permissions.md`). Every model request
//! passes the innermost [`cost::BudgetLayer`]: spend recorded in the session state,
//! budgets per run, session and user-day checked before the request, and the call's prompt
//! cache key ([`cost::prompt_cache_key`]); `docs/cost.md`. What an API caller adds
//! to one call — instructions, client tools, a reply format, history — is [`caller`].
//!
//! Applications depend on the `hame` facade, which re-exports this crate.
//!
//! ```
//! # #[cfg(feature = "test-support")]
//! # async fn demo() -> Result<(), hame_harness::Error> {
//! use std::sync::Arc;
//! use hame_core::{Message, RuntimeContext, test_support::{Reply, ScriptedModel}};
//! use hame_harness::HarnessAgent;
//!
//! let dir = std::env::temp_dir().join("hame-doc-ws");
//! let agent = HarnessAgent::builder()
//!     .name("helper")
//!     .model(Arc::new(ScriptedModel::new([Reply::text("hello")])))
//!     .workspace(&dir)
//!     .build()?;
//! let out = agent.call(Message::user("hi"), &RuntimeContext::new("s1")).await?;
//! assert_eq!(out.reply.text_content(), "hello");
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod adopt;
mod agent;
pub mod caller;
mod caller_schema;
mod capabilities;
pub mod catalog;
mod context;
pub mod cost;
mod error;
pub mod evidence;
mod guard;
mod ids;
mod inspect;
pub mod intent;
pub mod manifest;
pub mod memory;
pub mod permissions;
pub mod prompt;
mod recorder;
mod sandbox;
pub mod snapshot;
pub use sandbox::{
    DEFAULT_SANDBOX_LEASE_WAIT, SANDBOX_KEY_EXTRA, SANDBOX_LEASE_SESSION, default_sandbox_lease,
    sandbox_lease_key,
};
mod subagents;
pub mod task;
mod template;
mod tenancy;
mod tools;
pub mod tools_config;
mod tools_layer;
pub mod users;
mod workspace;

pub use agent::{
    DEFAULT_AGENT_NAME, EnvFn, EnvLookup, FileAccess, HarnessAgent, HarnessAgentBuilder,
    ModelResolver, RUN_ATTEMPT_EXTRA, RUN_ID_EXTRA, RUNS_EXTENSION, ResolveFn, STATE_HOME_ENV,
    workspace_identity,
};
pub use context::{
    ContextOptions, DEFAULT_MEMORY_BUDGET_TOKENS, MAX_CONTEXT_FILE_BYTES, MAX_LISTED_FILES,
    TokenCount, WorkspaceContext,
};
pub use error::{Error, Result};
pub use guard::{GuardFs, GuardRules, USER_FOLDER_MARKERS};
pub use hame_tools::{Identity, Workspace, WorkspaceExt, WorkspaceMode};
pub use ids::{MAX_ID_LEN, validate_id};
pub use inspect::SessionHit;
pub use memory::{FlushPolicy, MemoryOptions};
pub use recorder::{CALL_ID_EXTRA, SessionRecorder};
pub use template::{RUNTIME_ROOTS, TemplateFs};
pub use tenancy::{FilesystemMode, Tenancy};
pub use tools_layer::{
    MCP_DROPPED_EVENT, MCP_FAILED_EVENT, MCP_RENAMED_EVENT, ToolsConfigError, ToolsConfigLayer,
};
pub use users::UserRegistry;
pub use workspace::{DEFAULT_WORKSPACE, WORKSPACE_ENV, resolve_workspace};
