//! The ReAct loop: reason (model request), act (tool calls), observe (tool results), until a
//! final answer, the step limit or cancellation.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::context::{RuntimeContext, ToolContext};
use crate::error::{Error, Result};
use crate::event::{AgentEvent, EventSink};
use crate::message::{ContentBlock, Message, ToolCall, ToolResult, Usage};
use crate::middleware::{CallCtx, ErrorAction, Middleware, ToolDecision};
use crate::model::{
    Model, ModelError, ModelEvent, ModelParams, ModelRequest, ModelResponse, ResponseAssembler,
};
use crate::state::AgentState;
use crate::tool::{ToolError, ToolRunOptions, ToolSet, codes, to_tool_result};

/// Default step limit of a call.
pub const DEFAULT_MAX_ITERATIONS: usize = 50;
/// Default bound on middleware-driven retries of one model request.
pub const DEFAULT_MAX_MODEL_RETRIES: usize = 3;

/// Limits and parameters of the loop.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// Base system prompt; middleware usually extends it. Default empty.
    pub system_prompt: String,
    /// Maximum reasoning steps (model requests) per call. Default [`DEFAULT_MAX_ITERATIONS`].
    pub max_iterations: usize,
    /// How many times middleware may ask to retry one failed model request (e.g. after
    /// compacting on context overflow). Default [`DEFAULT_MAX_MODEL_RETRIES`].
    pub max_model_retries: usize,
    /// Tool concurrency and timeout.
    pub tools: ToolRunOptions,
    /// Model parameters.
    pub params: ModelParams,
}

impl Default for LoopConfig {
    fn default() -> Self {
        Self {
            system_prompt: String::new(),
            max_iterations: DEFAULT_MAX_ITERATIONS,
            max_model_retries: DEFAULT_MAX_MODEL_RETRIES,
            tools: ToolRunOptions::default(),
            params: ModelParams::default(),
        }
    }
}

/// The result of a successful call.
#[derive(Debug, Clone, PartialEq)]
pub struct CallOutput {
    /// The final assistant message.
    pub reply: Message,
    /// Usage summed over the call.
    pub usage: Usage,
    /// Reasoning steps taken.
    pub iterations: usize,
}

/// A model, tools and middleware: runs calls against an [`AgentState`].
///
/// The loop holds no per-call data; one `AgentLoop` serves any number of concurrent calls
/// on different states.
#[derive(Debug, Clone)]
pub struct AgentLoop {
    model: Arc<dyn Model>,
    tools: ToolSet,
    middleware: Vec<Arc<dyn Middleware>>,
    config: LoopConfig,
}

impl AgentLoop {
    /// A loop with no tools and no middleware.
    pub fn new(model: Arc<dyn Model>) -> Self {
        Self {
            model,
            tools: ToolSet::new(),
            middleware: Vec::new(),
            config: LoopConfig::default(),
        }
    }

    /// Sets the tools.
    pub fn with_tools(mut self, tools: ToolSet) -> Self {
        self.tools = tools;
        self
    }

    /// Appends a middleware (hooks run in insertion order).
    pub fn with_middleware(mut self, mw: Arc<dyn Middleware>) -> Self {
        self.middleware.push(mw);
        self
    }

    /// Sets the configuration.
    pub fn with_config(mut self, config: LoopConfig) -> Self {
        self.config = config;
        self
    }

    /// The model.
    pub fn model(&self) -> &Arc<dyn Model> {
        &self.model
    }

    /// The tools.
    pub fn tools(&self) -> &ToolSet {
        &self.tools
    }

    /// The configuration.
    pub fn config(&self) -> &LoopConfig {
        &self.config
    }

    /// Runs one call: appends `input` to `state`, loops until a final answer, and leaves the
    /// whole exchange in `state.messages`. Emits events on `events`; `cancel` stops it at
    /// the next await point (tool calls in flight get their tokens cancelled).
    pub async fn run(
        &self,
        state: &mut AgentState,
        input: Message,
        runtime: &RuntimeContext,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> Result<CallOutput> {
        let outcome = self.run_inner(state, input, runtime, events, cancel).await;
        let mut cx = CallCtx {
            runtime,
            state,
            events,
            iteration: 0,
        };
        let end = {
            let as_ref = outcome.as_ref().map(|o| &o.reply);
            let mut end = Ok(());
            for mw in &self.middleware {
                if let Err(e) = mw.on_call_end(&mut cx, as_ref).await {
                    end = Err(e);
                    break;
                }
            }
            end
        };
        match (&outcome, end) {
            (Ok(out), Ok(())) => events.emit(AgentEvent::Finished {
                reply: out.reply.clone(),
                usage: out.usage,
            }),
            (Ok(_), Err(e)) => {
                events.emit(AgentEvent::Failed {
                    message: e.to_string(),
                });
                return Err(e);
            }
            (Err(e), _) => events.emit(AgentEvent::Failed {
                message: e.to_string(),
            }),
        }
        outcome
    }

    async fn run_inner(
        &self,
        state: &mut AgentState,
        mut input: Message,
        runtime: &RuntimeContext,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> Result<CallOutput> {
        let mut cx = CallCtx {
            runtime,
            state,
            events,
            iteration: 0,
        };
        for mw in &self.middleware {
            mw.on_call_start(&mut cx, &mut input).await?;
        }
        self.append(&mut cx, input).await?;
        let mut usage = Usage::default();
        for iteration in 1..=self.config.max_iterations {
            if cancel.is_cancelled() {
                return Err(Error::Cancelled);
            }
            cx.iteration = iteration;
            events.emit(AgentEvent::StepStarted { iteration });
            let mut response = self.request_with_recovery(&mut cx, cancel).await?;
            for mw in &self.middleware {
                mw.on_model_response(&mut cx, &mut response).await?;
            }
            if let Some(u) = response.usage {
                usage.add(&u);
                cx.state.usage.add(&u);
                events.emit(AgentEvent::Usage { usage: u });
            }
            let message = response.message;
            let calls: Vec<ToolCall> = message.tool_calls().cloned().collect();
            self.append(&mut cx, message.clone()).await?;
            if calls.is_empty() {
                return Ok(CallOutput {
                    reply: message,
                    usage,
                    iterations: iteration,
                });
            }
            let results = self.act(&mut cx, calls, cancel).await?;
            self.append(&mut cx, Message::tool_results(results)).await?;
            if cancel.is_cancelled() {
                return Err(Error::Cancelled);
            }
        }
        Err(Error::MaxIterations {
            limit: self.config.max_iterations,
        })
    }

    async fn append(&self, cx: &mut CallCtx<'_>, message: Message) -> Result<()> {
        cx.state.messages.push(message);
        if let Some(last) = cx.state.messages.last().cloned() {
            for mw in &self.middleware {
                mw.on_message_appended(cx, &last).await?;
            }
        }
        Ok(())
    }

    async fn request_with_recovery(
        &self,
        cx: &mut CallCtx<'_>,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse> {
        let mut retries = 0;
        loop {
            let mut request = ModelRequest {
                system: self.config.system_prompt.clone(),
                messages: cx.state.messages.clone(),
                tools: self.tools.specs(),
                params: self.config.params.clone(),
            };
            for mw in &self.middleware {
                mw.on_model_request(cx, &mut request).await?;
            }
            let result = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(Error::Cancelled),
                r = self.request_once(request, cx.events) => r,
            };
            let error = match result {
                Ok(r) => return Ok(r),
                Err(e) => e,
            };
            if retries >= self.config.max_model_retries {
                return Err(error.into());
            }
            let mut action = ErrorAction::Propagate;
            for mw in &self.middleware {
                if mw.on_model_error(cx, &error).await? == ErrorAction::Retry {
                    action = ErrorAction::Retry;
                    break;
                }
            }
            if action == ErrorAction::Propagate {
                return Err(error.into());
            }
            retries += 1;
            cx.events.emit(AgentEvent::ModelRetry {
                reason: error.to_string(),
            });
        }
    }

    async fn request_once(
        &self,
        request: ModelRequest,
        events: &EventSink,
    ) -> Result<ModelResponse, ModelError> {
        let mut stream = self.model.stream(request).await?;
        let mut asm = ResponseAssembler::default();
        while let Some(ev) = stream.next().await {
            let ev = ev?;
            match &ev {
                ModelEvent::TextDelta(t) => events.emit(AgentEvent::TextDelta { text: t.clone() }),
                ModelEvent::ReasoningDelta(t) => {
                    events.emit(AgentEvent::ReasoningDelta { text: t.clone() })
                }
                _ => {}
            }
            asm.push(&ev);
        }
        Ok(asm.finish())
    }

    async fn act(
        &self,
        cx: &mut CallCtx<'_>,
        calls: Vec<ToolCall>,
        cancel: &CancellationToken,
    ) -> Result<Vec<ToolResult>> {
        // Hooks first, in order, one call at a time: they may edit the state.
        let mut planned: Vec<(ToolCall, Option<crate::tool::ToolOutput>)> =
            Vec::with_capacity(calls.len());
        for mut call in calls {
            let mut verdict = None;
            for mw in &self.middleware {
                match mw.on_tool_call(cx, &mut call).await? {
                    ToolDecision::Allow => {}
                    ToolDecision::Deny(reason) => {
                        verdict = Some(Err(ToolError::new(codes::DENIED, reason)));
                        break;
                    }
                    ToolDecision::Respond(out) => {
                        verdict = Some(out);
                        break;
                    }
                }
            }
            cx.events.emit(AgentEvent::ToolStarted {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            });
            planned.push((call, verdict));
        }
        // Then the allowed calls run concurrently, bounded.
        let timeout = self.config.tools.timeout;
        let mut runs = Vec::with_capacity(planned.len());
        for (call, verdict) in &planned {
            let ctx = ToolContext {
                runtime: cx.runtime.clone(),
                call_id: call.id.clone(),
                cancel: cancel.child_token(),
            };
            let verdict = verdict.clone();
            let call = call.clone();
            let tools = &self.tools;
            runs.push(async move {
                let started = Instant::now();
                let out = match verdict {
                    Some(v) => v,
                    None => tools.run_one(&call, &ctx, timeout).await,
                };
                (
                    out,
                    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                )
            });
        }
        let outputs: Vec<(crate::tool::ToolOutput, u64)> = futures::stream::iter(runs)
            .buffered(self.config.tools.max_concurrency.max(1))
            .collect()
            .await;
        // Then result hooks, in call order.
        let mut results = Vec::with_capacity(outputs.len());
        for ((call, _), (out, duration_ms)) in planned.iter().zip(outputs) {
            let mut result = to_tool_result(&call.id, out);
            for mw in &self.middleware {
                mw.on_tool_result(cx, call, &mut result).await?;
            }
            cx.events.emit(AgentEvent::ToolFinished {
                id: call.id.clone(),
                name: call.name.clone(),
                duration_ms,
                is_error: result.is_error,
                code: result.code.clone(),
            });
            results.push(result);
        }
        Ok(results)
    }
}

/// The final text of a reply (text blocks joined).
pub fn reply_text(message: &Message) -> String {
    message
        .content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("")
}

#[cfg(test)]
#[path = "agent_tests.rs"]
mod tests;
