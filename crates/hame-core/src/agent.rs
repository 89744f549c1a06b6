//! The ReAct loop: reason (model request), act (tool calls), observe (tool results), until a
//! final answer, the step limit or cancellation.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::context::{RuntimeContext, ToolContext};
use crate::decide;
use crate::error::{Error, Result};
use crate::event::{AgentEvent, EventSink};
use crate::extensions::Extensions;
use crate::layer::{
    AppendNext, CallCtx, CallInput, CallNext, Layer, ModelNext, Resumed, ToolCtx, ToolNext,
    ToolOutcome,
};
use crate::message::{ContentBlock, Message, ToolCall, Usage};
use crate::model::{
    Model, ModelError, ModelEvent, ModelParams, ModelRequest, ModelResponse, ResponseAssembler,
    StopReason,
};
use crate::state::AgentState;
use crate::suspend::Resolution;
use crate::tool::{ToolOutput, ToolRunOptions, ToolSet};

/// How a failed call is told, in its note and its event: without the process's secrets
/// and endpoints, since both reach the conversation and API callers
/// ([`secrets::redact_for_callers`](crate::secrets::redact_for_callers)).
fn failure_text(e: &Error) -> String {
    crate::secrets::redact_for_callers(&e.to_string()).into_owned()
}

/// The `error.type` of a failed call or model request on its span: a stable code.
fn error_type(e: &Error) -> &'static str {
    match e {
        Error::Model(m) => model_error_type(m),
        Error::MaxIterations { .. } => "max_iterations",
        Error::Cancelled => "cancelled",
        Error::Layer { .. } => "layer_failed",
        Error::Suspended(_) => "suspended",
        Error::BudgetExceeded(_) => "budget_exceeded",
        Error::NothingPending => "nothing_pending",
        Error::UnknownResolution(_) => "unknown_resolution",
        Error::Other { .. } => "error",
    }
}

/// The `error.type` of a failed model request.
fn model_error_type(e: &ModelError) -> &'static str {
    match e {
        ModelError::ContextOverflow { .. } => "context_overflow",
        ModelError::RateLimited { .. } => "rate_limited",
        ModelError::Auth { .. } => "auth",
        ModelError::Provider { .. } => "provider",
        ModelError::Transport { .. } => "transport",
        ModelError::InvalidResponse(_) => "invalid_response",
        ModelError::Config(_) => "config",
    }
}

/// Default step limit of a call.
pub const DEFAULT_MAX_ITERATIONS: usize = 50;
/// Default bound on layer-driven retries of one model request (e.g. compaction after a
/// context overflow); layers that retry use it.
pub const DEFAULT_MAX_MODEL_RETRIES: usize = 3;

/// Limits and parameters of the loop.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// Base system prompt; layers usually extend it. Default empty.
    pub system_prompt: String,
    /// Maximum reasoning steps (model requests) per call. Default [`DEFAULT_MAX_ITERATIONS`].
    pub max_iterations: usize,
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
    /// The completion gate's verdict, when the call had required checks (set by the
    /// harness's verify layer; `None` otherwise).
    pub verification: Option<crate::Verification>,
}

/// A model, tools and a stack of [`Layer`]s: runs calls against an [`AgentState`].
///
/// The loop holds no per-call data; one `AgentLoop` serves any number of concurrent calls
/// on different states.
#[derive(Debug, Clone)]
pub struct AgentLoop {
    model: Arc<dyn Model>,
    tools: ToolSet,
    layers: Vec<Arc<dyn Layer>>,
    config: LoopConfig,
}

/// The loop as the innermost end of every layer chain.
pub(crate) type Core = AgentLoop;

/// Everything about one call that is not the state: who calls, where events go, how to
/// cancel it, and its typed extensions.
#[derive(Debug, Clone, Copy)]
pub struct CallEnv<'a> {
    /// Who is calling.
    pub runtime: &'a RuntimeContext,
    /// Where events go.
    pub events: &'a EventSink,
    /// Cancels the call at the next await point.
    pub cancel: &'a CancellationToken,
    /// Typed values for layers and tools.
    pub extensions: &'a Extensions,
}

impl AgentLoop {
    /// A loop with no tools and no layers.
    pub fn new(model: Arc<dyn Model>) -> Self {
        Self {
            model,
            tools: ToolSet::new(),
            layers: Vec::new(),
            config: LoopConfig::default(),
        }
    }

    /// Sets the tools.
    pub fn with_tools(mut self, tools: ToolSet) -> Self {
        self.tools = tools;
        self
    }

    /// Adds a layer *inside* the ones added before (the first layer added is the
    /// outermost).
    pub fn with_layer(mut self, layer: Arc<dyn Layer>) -> Self {
        self.layers.push(layer);
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

    /// The layers, outermost first.
    pub fn layers(&self) -> &[Arc<dyn Layer>] {
        &self.layers
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
        let extensions = Extensions::new();
        let env = CallEnv {
            runtime,
            events,
            cancel,
            extensions: &extensions,
        };
        self.run_env(state, CallInput::Message(input), env).await
    }

    /// Runs one call on a new message or on the decisions for a suspended step.
    ///
    /// - A new message while a step is suspended ([`AgentState::pending`]) does not start a
    ///   turn: the call returns [`Error::Suspended`] with the same pending calls again.
    /// - When a layer suspends a tool call, the step (finished calls with their results,
    ///   waiting calls with their suspensions) is saved in `state.pending` and the call
    ///   returns [`Error::Suspended`]; save the state and resume later, in any process, with
    ///   [`CallInput::Resume`].
    /// - A call that fails closes its turn ([`decide::close_failed_turn`]): every tool call
    ///   has a result and an assistant note records the failure the caller saw, without
    ///   the process's secrets or model endpoints ([`crate::secrets`]).
    /// - Every message joining the conversation is redacted of the process's secrets.
    pub async fn run_env(
        &self,
        state: &mut AgentState,
        input: CallInput,
        env: CallEnv<'_>,
    ) -> Result<CallOutput> {
        let mut cx = CallCtx {
            runtime: env.runtime,
            state,
            events: env.events,
            extensions: env.extensions,
            cancel: env.cancel,
            iteration: 0,
        };
        let agent = env
            .extensions
            .get::<crate::telemetry::AgentName>()
            .map_or("hame", |a| a.0.as_str());
        let span = tracing::info_span!(
            "hame.call",
            otel.name = %format!("invoke_agent {agent}"),
            otel.kind = "internal",
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
            gen_ai.operation.name = "invoke_agent",
            gen_ai.agent.name = agent,
            gen_ai.conversation.id = %env.runtime.session_id,
            error.type = tracing::field::Empty,
            session = %env.runtime.session_id,
            user = env.runtime.user_id.as_deref().unwrap_or(""),
        );
        let outcome = CallNext {
            layers: &self.layers,
            core: self,
        }
        .run(&mut cx, input)
        .instrument(span.clone())
        .await;
        if let Err(e) = &outcome
            && !matches!(e, Error::Suspended(_))
        {
            crate::telemetry::fail(&span, error_type(e), &failure_text(e));
        }
        match &outcome {
            Ok(out) => env.events.emit(AgentEvent::Finished {
                reply: out.reply.clone(),
                usage: out.usage,
            }),
            Err(Error::Suspended(s)) => env.events.emit(AgentEvent::Suspended {
                calls: s.calls.clone(),
            }),
            Err(e) => env.events.emit(AgentEvent::Failed {
                message: failure_text(e),
            }),
        }
        outcome
    }

    /// Resumes a suspended step with decisions (see [`run_env`](Self::run_env)).
    pub async fn resume(
        &self,
        state: &mut AgentState,
        resolutions: Vec<Resolution>,
        env: CallEnv<'_>,
    ) -> Result<CallOutput> {
        self.run_env(state, CallInput::Resume(resolutions), env)
            .await
    }

    /// The innermost end of the call chain: the loop itself.
    pub(crate) async fn drive(&self, cx: &mut CallCtx<'_>, input: CallInput) -> Result<CallOutput> {
        let result = self.drive_inner(cx, input).await;
        // A suspended step is a consistent state, and a refused resume changed nothing.
        if let Err(e) = &result
            && cx.state.pending.is_none()
            && !matches!(
                e,
                Error::Suspended(_) | Error::NothingPending | Error::UnknownResolution(_)
            )
        {
            for message in decide::close_failed_turn(&cx.state.messages, &failure_text(e)) {
                if let Err(again) = self.append(cx, message).await {
                    tracing::warn!(error = %again, "recording the failed turn failed");
                    break;
                }
            }
        }
        result
    }

    async fn drive_inner(&self, cx: &mut CallCtx<'_>, input: CallInput) -> Result<CallOutput> {
        match input {
            CallInput::Message(message) => {
                if let Some(p) = &cx.state.pending {
                    return Err(Error::Suspended(p.to_suspended()));
                }
                self.append(cx, message).await?;
                self.steps(cx, 0, Usage::default()).await
            }
            CallInput::Continue { steps, usage } => {
                if let Some(p) = &cx.state.pending {
                    return Err(Error::Suspended(p.to_suspended()));
                }
                // The turn's final reply is already there: the turn is over, and the
                // layers around the call (a completion gate) see it end.
                if let Some(reply) = cx
                    .state
                    .messages
                    .last()
                    .filter(|m| m.role == crate::Role::Assistant && !m.has_tool_calls())
                {
                    return Ok(CallOutput {
                        reply: reply.clone(),
                        usage,
                        iterations: steps,
                        verification: None,
                    });
                }
                self.steps(cx, steps, usage).await
            }
            CallInput::Resume(resolutions) => {
                let Some(step) = cx.state.pending.clone() else {
                    return Err(Error::NothingPending);
                };
                let matched = decide::match_resolutions(&step, &resolutions)
                    .map_err(Error::UnknownResolution)?;
                let calls: Vec<(usize, ToolCall, Option<Resumed>)> = matched
                    .into_iter()
                    .filter_map(|(i, r)| step.calls.get(i).map(|c| (i, c.call.clone(), Some(r))))
                    .collect();
                cx.iteration = step.iteration;
                let outcomes = self.act(cx, &calls).await;
                let (iteration, usage) = (step.iteration, step.usage);
                let indexed = calls.iter().map(|(i, _, _)| *i).zip(outcomes).collect();
                match decide::apply_resume(step, indexed) {
                    decide::Settled::Pending(p) => {
                        let suspended = p.to_suspended();
                        cx.state.pending = Some(p);
                        Err(Error::Suspended(suspended))
                    }
                    decide::Settled::Results(results) => {
                        cx.state.pending = None;
                        self.append(cx, Message::tool_results(results)).await?;
                        self.steps(cx, iteration, usage).await
                    }
                }
            }
        }
    }

    async fn steps(
        &self,
        cx: &mut CallCtx<'_>,
        done: usize,
        mut usage: Usage,
    ) -> Result<CallOutput> {
        let mut iteration = done + 1;
        loop {
            match decide::before_step(
                iteration,
                self.config.max_iterations,
                cx.cancel.is_cancelled(),
            ) {
                Some(decide::Stop::Cancelled) => return Err(Error::Cancelled),
                Some(decide::Stop::MaxIterations) => {
                    return Err(Error::MaxIterations {
                        limit: self.config.max_iterations,
                    });
                }
                None => {}
            }
            cx.iteration = iteration;
            cx.events.emit(AgentEvent::StepStarted { iteration });
            let step = tracing::info_span!("hame.step", iteration);
            let request = ModelRequest {
                system: self.config.system_prompt.clone(),
                messages: cx.state.messages.clone(),
                tools: self.tools.specs(),
                params: self.config.params.clone(),
                cache_key: cx
                    .extensions
                    .get::<crate::PromptCacheKey>()
                    .map(|k| k.0.clone()),
            };
            let response = ModelNext {
                layers: &self.layers,
                core: self,
            }
            .run(cx, request)
            .instrument(step.clone())
            .await?;
            if let Some(u) = response.usage {
                usage.add(&u);
                cx.state.usage.add(&u);
                cx.events.emit(AgentEvent::Usage { usage: u });
            }
            // What runs and what is returned is what is recorded.
            let message = crate::secrets::redact_message(response.message);
            let next = decide::after_response(&message);
            self.append(cx, message.clone()).await?;
            let calls = match next {
                decide::AfterResponse::Finish => {
                    return Ok(CallOutput {
                        reply: message,
                        usage,
                        iterations: iteration,
                        verification: None,
                    });
                }
                decide::AfterResponse::RunTools(calls) => calls,
            };
            let position = cx.state.messages.len();
            let planned: Vec<(usize, ToolCall, Option<Resumed>)> = calls
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, c)| (i, c, None))
                .collect();
            let outcomes = self.act(cx, &planned).instrument(step).await;
            match decide::settle(calls, outcomes, position, iteration, usage) {
                decide::Settled::Results(results) => {
                    self.append(cx, Message::tool_results(results)).await?;
                }
                decide::Settled::Pending(p) => {
                    for (call, s) in p.waiting() {
                        cx.events.emit(AgentEvent::ToolSuspended {
                            id: call.id.clone(),
                            name: call.name.clone(),
                            suspension: s.clone(),
                        });
                    }
                    let suspended = p.to_suspended();
                    cx.state.pending = Some(p);
                    return Err(Error::Suspended(suspended));
                }
            }
            if cx.cancel.is_cancelled() {
                return Err(Error::Cancelled);
            }
            iteration += 1;
        }
    }

    async fn append(&self, cx: &mut CallCtx<'_>, message: Message) -> Result<()> {
        AppendNext {
            layers: &self.layers,
            core: self,
        }
        .run(cx, message)
        .await
    }

    /// The innermost end of the model chain: one streamed request, assembled; `manifest`
    /// is the request's compact context manifest for its span.
    pub(crate) async fn request_once(
        &self,
        request: ModelRequest,
        events: &EventSink,
        cancel: &CancellationToken,
        manifest: Option<String>,
    ) -> Result<ModelResponse> {
        let work = async {
            let mut stream = self.model.stream(request).await?;
            let mut asm = ResponseAssembler::default();
            while let Some(ev) = stream.next().await {
                let ev = ev?;
                match &ev {
                    ModelEvent::TextDelta(t) => {
                        events.emit(AgentEvent::TextDelta { text: t.clone() })
                    }
                    ModelEvent::ReasoningDelta(t) => {
                        events.emit(AgentEvent::ReasoningDelta { text: t.clone() })
                    }
                    _ => {}
                }
                asm.push(&ev);
            }
            Ok::<_, ModelError>(asm.finish())
        };
        let info = self.model.info();
        let span = tracing::info_span!(
            "hame.model",
            otel.name = %format!("chat {}", info.model),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = %info.provider,
            gen_ai.system = %info.provider,
            gen_ai.request.model = %info.model,
            gen_ai.response.model = tracing::field::Empty,
            gen_ai.response.id = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            gen_ai.response.finish_reasons = tracing::field::Empty,
            error.type = tracing::field::Empty,
            hame.context.manifest = tracing::field::Empty,
            model = %info.model,
        );
        if let Some(m) = &manifest {
            span.record("hame.context.manifest", m.as_str());
        }
        let started = Instant::now();
        let response = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                crate::telemetry::fail(&span, "cancelled", "the call was cancelled");
                return Err(Error::Cancelled);
            }
            r = work.instrument(span.clone()) => match r {
                Ok(r) => r,
                Err(e) => {
                    crate::telemetry::fail(&span, model_error_type(&e), &e.to_string());
                    return Err(e.into());
                }
            },
        };
        if let Some(u) = &response.usage {
            span.record("gen_ai.usage.input_tokens", u.input_tokens);
            span.record("gen_ai.usage.output_tokens", u.output_tokens);
        }
        if let Some(reason) = &response.stop_reason {
            let reason = match reason {
                StopReason::EndTurn => "stop",
                StopReason::ToolUse => "tool_calls",
                StopReason::MaxTokens => "length",
                StopReason::Other(o) => o.as_str(),
            };
            span.record("gen_ai.response.finish_reasons", reason);
        }
        events.emit(AgentEvent::ModelResponded {
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        });
        Ok(response)
    }

    /// The innermost end of the tool chain: the tool itself.
    pub(crate) async fn run_tool(&self, call: &ToolCall, ctx: &ToolContext) -> ToolOutput {
        self.tools
            .run_one(call, ctx, self.config.tools.timeout)
            .await
    }

    /// Runs `calls` through the tool chain, concurrently (bounded), outcomes in order.
    async fn act(
        &self,
        cx: &mut CallCtx<'_>,
        calls: &[(usize, ToolCall, Option<Resumed>)],
    ) -> Vec<ToolOutcome> {
        let events = cx.events;
        let iteration = cx.iteration;
        for (_, call, _) in calls {
            events.emit(AgentEvent::ToolStarted {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            });
        }
        let state: &AgentState = cx.state;
        let layers: &[Arc<dyn Layer>] = &self.layers;
        let mut runs = Vec::with_capacity(calls.len());
        for (_, call, resume) in calls {
            let ctx = ToolContext {
                runtime: cx.runtime.clone(),
                call_id: call.id.clone(),
                cancel: cx.cancel.child_token(),
                extensions: cx.extensions.clone(),
                facts: crate::ToolFacts::default(),
            };
            let call = call.clone();
            let resume = resume.clone();
            let span = tracing::info_span!(
                "hame.tool",
                otel.name = %format!("execute_tool {}", call.name),
                otel.kind = "internal",
                otel.status_code = tracing::field::Empty,
                otel.status_description = tracing::field::Empty,
                gen_ai.operation.name = "execute_tool",
                gen_ai.tool.name = %call.name,
                gen_ai.tool.call.id = %call.id,
                gen_ai.tool.type = "function",
                error.type = tracing::field::Empty,
                tool = %call.name,
                call_id = %call.id,
            );
            let marked = span.clone();
            runs.push(
                async move {
                    let tcx = ToolCtx {
                        tool: &ctx,
                        state,
                        events,
                        iteration,
                        resume: resume.as_ref(),
                    };
                    let started = Instant::now();
                    let outcome = ToolNext { layers, core: self }
                        .run(&tcx, call.clone())
                        .await;
                    let duration_ms =
                        u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    if let ToolOutcome::Done(Err(e)) = &outcome {
                        crate::telemetry::fail(&marked, &e.code, &e.message);
                    }
                    if let ToolOutcome::Done(out) = &outcome {
                        events.emit(AgentEvent::ToolFinished {
                            id: call.id.clone(),
                            name: call.name.clone(),
                            duration_ms,
                            is_error: out.is_err(),
                            code: out.as_ref().err().map(|e| e.code.clone()),
                        });
                    }
                    outcome
                }
                .instrument(span),
            );
        }
        futures::stream::iter(runs)
            .buffered(self.config.tools.max_concurrency.max(1))
            .collect()
            .await
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
