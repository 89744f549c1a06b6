//! Middleware: hook points around the call, each model request and each tool call.
//!
//! # Order
//! Hooks run in the order the middleware was added to the [`AgentLoop`](crate::AgentLoop):
//! the harness adds user middleware first and then its built-ins in a fixed order (see
//! `docs/ARCHITECTURE.md`). Every hook of one middleware sees the effects of the ones before
//! it. The first tool hook that denies or answers a call wins; later ones are not asked.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::context::RuntimeContext;
use crate::error::Error;
use crate::event::EventSink;
use crate::message::{Message, ToolCall, ToolResult};
use crate::model::{ModelError, ModelRequest, ModelResponse};
use crate::state::AgentState;
use crate::tool::ToolOutput;

/// What a hook sees of the running call.
#[derive(Debug)]
pub struct CallCtx<'a> {
    /// Who is calling.
    pub runtime: &'a RuntimeContext,
    /// The session state; hooks may edit it (compaction, sub-states).
    pub state: &'a mut AgentState,
    /// The call's event stream.
    pub events: &'a EventSink,
    /// The current step (0 before the first model request).
    pub iteration: usize,
}

/// What to do with a tool call.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolDecision {
    /// Run it (possibly rewritten by the hook).
    Allow,
    /// Do not run it; the model gets a `permission_denied` error with this reason.
    Deny(String),
    /// Do not run it; the model gets this output instead.
    Respond(ToolOutput),
}

/// What to do after a failed model request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorAction {
    /// Give up (unless another middleware retries).
    Propagate,
    /// The middleware changed the state (e.g. compacted it); rebuild the request and retry.
    Retry,
}

/// A hook into the loop. Every method has a no-op default.
#[async_trait]
pub trait Middleware: Send + Sync + fmt::Debug + 'static {
    /// A short name for logs and errors.
    fn name(&self) -> &str;

    /// Before the user's message is added to the state.
    async fn on_call_start(
        &self,
        _cx: &mut CallCtx<'_>,
        _input: &mut Message,
    ) -> Result<(), Error> {
        Ok(())
    }

    /// Before each model request; may rewrite the system prompt, messages and tools.
    async fn on_model_request(
        &self,
        _cx: &mut CallCtx<'_>,
        _request: &mut ModelRequest,
    ) -> Result<(), Error> {
        Ok(())
    }

    /// After a message was appended to `cx.state.messages`: the user's input, each
    /// assistant message, each batch of tool results. Durable logs hook in here, so every
    /// message is recorded before the loop moves on.
    async fn on_message_appended(
        &self,
        _cx: &mut CallCtx<'_>,
        _message: &Message,
    ) -> Result<(), Error> {
        Ok(())
    }

    /// After each model response, before it is added to the state.
    async fn on_model_response(
        &self,
        _cx: &mut CallCtx<'_>,
        _response: &mut ModelResponse,
    ) -> Result<(), Error> {
        Ok(())
    }

    /// After a failed model request. Return [`ErrorAction::Retry`] only after changing
    /// something that makes a retry worthwhile; the loop bounds retries.
    async fn on_model_error(
        &self,
        _cx: &mut CallCtx<'_>,
        _error: &ModelError,
    ) -> Result<ErrorAction, Error> {
        Ok(ErrorAction::Propagate)
    }

    /// Before a tool call runs; may rewrite the call, deny it or answer it.
    async fn on_tool_call(
        &self,
        _cx: &mut CallCtx<'_>,
        _call: &mut ToolCall,
    ) -> Result<ToolDecision, Error> {
        Ok(ToolDecision::Allow)
    }

    /// After a tool call, before its result is added to the state; may rewrite the result.
    async fn on_tool_result(
        &self,
        _cx: &mut CallCtx<'_>,
        _call: &ToolCall,
        _result: &mut ToolResult,
    ) -> Result<(), Error> {
        Ok(())
    }

    /// After the call, with its reply or error. Errors here fail the call.
    async fn on_call_end(
        &self,
        _cx: &mut CallCtx<'_>,
        _outcome: Result<&Message, &Error>,
    ) -> Result<(), Error> {
        Ok(())
    }
}

#[async_trait]
impl<T: Middleware + ?Sized> Middleware for Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    async fn on_call_start(&self, cx: &mut CallCtx<'_>, input: &mut Message) -> Result<(), Error> {
        (**self).on_call_start(cx, input).await
    }
    async fn on_model_request(
        &self,
        cx: &mut CallCtx<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), Error> {
        (**self).on_model_request(cx, request).await
    }
    async fn on_model_response(
        &self,
        cx: &mut CallCtx<'_>,
        response: &mut ModelResponse,
    ) -> Result<(), Error> {
        (**self).on_model_response(cx, response).await
    }
    async fn on_message_appended(
        &self,
        cx: &mut CallCtx<'_>,
        message: &Message,
    ) -> Result<(), Error> {
        (**self).on_message_appended(cx, message).await
    }
    async fn on_model_error(
        &self,
        cx: &mut CallCtx<'_>,
        error: &ModelError,
    ) -> Result<ErrorAction, Error> {
        (**self).on_model_error(cx, error).await
    }
    async fn on_tool_call(
        &self,
        cx: &mut CallCtx<'_>,
        call: &mut ToolCall,
    ) -> Result<ToolDecision, Error> {
        (**self).on_tool_call(cx, call).await
    }
    async fn on_tool_result(
        &self,
        cx: &mut CallCtx<'_>,
        call: &ToolCall,
        result: &mut ToolResult,
    ) -> Result<(), Error> {
        (**self).on_tool_result(cx, call, result).await
    }
    async fn on_call_end(
        &self,
        cx: &mut CallCtx<'_>,
        outcome: Result<&Message, &Error>,
    ) -> Result<(), Error> {
        (**self).on_call_end(cx, outcome).await
    }
}
