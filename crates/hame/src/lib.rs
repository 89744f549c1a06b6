//! # hame
//!
//! An agent harness: it wraps a tool-calling LLM in a ReAct loop with everything a
//! long-running agent needs — a workspace as the single source of truth (`AGENTS.md`,
//! `MEMORY.md`, `knowledge/`, skills), per-session state, and pluggable backends.
//!
//! This facade re-exports the public API. Pick backends with Cargo features:
//!
//! | feature | what it adds |
//! |---|---|
//! | `openai` | OpenAI-compatible Chat Completions client ([`model::OpenAiModel`]) |
//! | `anthropic` | Anthropic Messages client ([`model::AnthropicModel`]) |
//! | `full` | all of the above |
//! | `test-support` | an in-process model double for unit tests |
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
    DEFAULT_AGENT_NAME, EnvLookup, HarnessAgent, HarnessAgentBuilder, WorkspaceContext,
    WorkspaceReader, resolve_workspace,
};

/// Model providers (`hame-model`).
pub mod model {
    pub use hame_model::*;
}

/// The harness (`hame-harness`).
pub mod harness {
    pub use hame_harness::*;
}
