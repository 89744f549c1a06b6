//! # hame-core
//!
//! The contracts of the hame agent harness and its ReAct loop: [`Message`]s, the [`Model`]
//! and [`Tool`] traits, [`Layer`]s around the call, its model requests and tool calls (with
//! durable suspension), the [`AgentState`] resume document and the
//! [`AgentEvent`] stream, and the process's registry of [`secrets`] that no text it stores,
//! sends to a model or shows may carry. It knows no backend: no HTTP client, no database,
//! no filesystem.
//!
//! Depend on it to write a tool, a layer or a model provider. Applications use the
//! `hame` facade instead.
//!
//! | feature | what it adds |
//! |---|---|
//! | `test-support` | [`test_support::ScriptedModel`], an in-process model double for unit tests |
//! | `failpoints` | [`failpoint`] kills the process where `HAME_FAILPOINT` says (crash tests) |
//!
//! ```
//! use std::sync::Arc;
//! use hame_core::{AgentLoop, AgentState, EventSink, Message, RuntimeContext};
//! # #[cfg(feature = "test-support")]
//! # async fn demo() -> Result<(), hame_core::Error> {
//! use hame_core::test_support::{Reply, ScriptedModel};
//! let model = ScriptedModel::new([Reply::text("hello")]);
//! let agent = AgentLoop::new(Arc::new(model));
//! let mut state = AgentState::default();
//! let out = agent
//!     .run(&mut state, Message::user("hi"), &RuntimeContext::new("s1"), &EventSink::none(), &Default::default())
//!     .await?;
//! assert_eq!(out.reply.text_content(), "hello");
//! assert_eq!(state.messages.len(), 2);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod agent;
mod context;
pub mod decide;
mod env;
mod error;
mod event;
mod extensions;
mod failpoint;
mod layer;
mod message;
mod model;
mod observation;
pub mod secrets;
mod state;
mod suspend;
pub mod telemetry;
mod tool;

#[cfg(any(test, feature = "test-support"))]
pub mod test_support;

pub use agent::{
    AgentLoop, CallEnv, CallOutput, DEFAULT_MAX_ITERATIONS, DEFAULT_MAX_MODEL_RETRIES, LoopConfig,
    reply_text,
};
pub use context::{CALL_ID_EXTRA, IdempotencyKey, RuntimeContext, ToolContext};
pub use env::{EnvFn, EnvLookup};
pub use error::{BudgetExceeded, Error, Result};
pub use event::{AgentEvent, EventSink};
pub use extensions::Extensions;
pub use failpoint::{FAILPOINT_ENV, failpoint};
pub use layer::{
    AppendNext, CallCtx, CallInput, CallNext, Layer, ModelNext, Resumed, ToolCtx, ToolNext,
    ToolOutcome, prefix_hash,
};
pub use message::{ContentBlock, ImageBlock, Message, Role, ToolCall, ToolResult, Usage};
pub use model::{
    Model, ModelError, ModelEvent, ModelInfo, ModelParams, ModelRequest, ModelResponse,
    ModelStream, PromptCacheKey, ResponseAssembler, StopReason,
};
pub use observation::{
    CheckOutcome, Evidence, Observation, ObservationOutcome, ToolFacts, Verification,
    VerificationStatus,
};
pub use state::{AgentState, STATE_SCHEMA_VERSION, StateFormatError};
pub use suspend::{PendingCall, PendingStep, Resolution, Suspended, SuspendedCall, Suspension};
pub use tool::{
    DEFAULT_TOOL_TIMEOUT, Reconciled, Tool, ToolError, ToolOffers, ToolOutput, ToolRunOptions,
    ToolSet, ToolSpec, Typed, TypedTool, codes, compact_schema, inline_definitions, schema_for,
    to_tool_result, typed,
};

/// Re-exported for implementing traits.
pub use async_trait::async_trait;
/// Re-exported so tools can derive their argument schemas with the same version.
pub use schemars;
/// Cancellation token used by calls and tools.
pub use tokio_util::sync::CancellationToken;
