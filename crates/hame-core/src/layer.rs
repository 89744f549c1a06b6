//! Layers: behaviour *around* the four places of a call — the whole call, each model
//! request, each tool call, and each message joining the conversation.
//!
//! A [`Layer`] is tower's `Service`/`Layer` idea cut to the four shapes an agent loop has:
//! every method receives the thing it wraps and a `next` handle to the rest of the stack;
//! it may change the input, call `next` zero times (short-circuit), once, or several times
//! (retry), time it, change the output, or — for tool calls — **suspend** it
//! ([`ToolOutcome::Suspend`]). Every method has a default that just calls `next`, so a
//! layer implements only the places it cares about.
//!
//! # Order
//! Layers form one stack: the first layer of the [`AgentLoop`](crate::AgentLoop) is the
//! outermost. For a model request the outermost layer sees the request first and the
//! response last; the innermost sits next to the model and sees the final prompt. The
//! harness's stack is drawn in `docs/ARCHITECTURE.md`.
//!
//! # Notifications
//! Layers are for behaviour that wraps. To *observe* a call (progress, UI, metrics) read
//! its [`AgentEvent`](crate::AgentEvent) stream instead; events never change the call.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::CancellationToken;
use crate::agent::Core;
use crate::context::{RuntimeContext, ToolContext};
use crate::error::Result;
use crate::event::EventSink;
use crate::extensions::Extensions;
use crate::message::{Message, ToolCall};
use crate::model::{ModelRequest, ModelResponse};
use crate::state::AgentState;
use crate::suspend::{Resolution, Suspension};
use crate::tool::{ToolError, ToolOutput};

/// What a layer sees of the running call, with the state it may edit.
#[derive(Debug)]
pub struct CallCtx<'a> {
    /// Who is calling.
    pub runtime: &'a RuntimeContext,
    /// The session state; layers may edit it (compaction, sub-states).
    pub state: &'a mut AgentState,
    /// The call's event stream.
    pub events: &'a EventSink,
    /// Typed values of the call (the harness's tenant workspace handle, ...).
    pub extensions: &'a Extensions,
    /// The call's cancellation.
    pub cancel: &'a CancellationToken,
    /// The current step (0 before the first model request).
    pub iteration: usize,
}

/// What a layer sees of one tool call. Tool calls of a step run concurrently, so the state
/// is read-only here.
#[derive(Debug)]
pub struct ToolCtx<'a> {
    /// The context the tool itself gets (runtime, call id, cancellation, extensions).
    pub tool: &'a ToolContext,
    /// The session state as of this step.
    pub state: &'a AgentState,
    /// The call's event stream.
    pub events: &'a EventSink,
    /// The current step.
    pub iteration: usize,
    /// On resume: the decision for this call, when it was suspended. The layer named in
    /// the suspension acts on it (e.g. runs the call after an approval).
    pub resume: Option<&'a Resumed>,
}

/// A suspended call being resumed: why it was suspended and the decision taken.
#[derive(Debug, Clone, PartialEq)]
pub struct Resumed {
    /// The suspension, as the layer made it (with its id).
    pub suspension: Suspension,
    /// The decision.
    pub resolution: Resolution,
}

impl ToolCtx<'_> {
    /// The decision addressed to layer `name`, when this call is being resumed after that
    /// layer suspended it.
    pub fn resumed_for(&self, name: &str) -> Option<&Resumed> {
        self.resume.filter(|r| r.suspension.layer == name)
    }
}

/// The outcome of a tool call through the layers.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutcome {
    /// The call finished (or was answered by a layer).
    Done(ToolOutput),
    /// The call must wait for a decision; the loop saves the step and the call returns
    /// [`Error::Suspended`](crate::Error::Suspended).
    Suspend(Suspension),
}

impl From<ToolOutput> for ToolOutcome {
    fn from(out: ToolOutput) -> Self {
        ToolOutcome::Done(out)
    }
}

/// What a call works on: a new user message, the decisions for a suspended step, or a turn
/// to go on with.
#[derive(Debug, Clone, PartialEq)]
pub enum CallInput {
    /// A new message from the user.
    Message(Message),
    /// Decisions for the suspended step in [`AgentState::pending`].
    Resume(Vec<Resolution>),
    /// Go on with the turn the conversation ends with, without a new message: its last
    /// messages are the turn's own (the harness adopts them from the session log when a
    /// durable run's process died before saving its state) and every tool call in them
    /// has its result. The next step asks the model; when the conversation ends with the
    /// turn's final reply (an assistant message without tool calls), the turn is over and
    /// that reply is the call's output, without a model request.
    Continue {
        /// Model requests the turn already made (they count against the step limit).
        steps: usize,
        /// Their usage, summed into the call's.
        usage: crate::Usage,
    },
}

/// Behaviour around a call, its model requests, its tool calls and its messages. See the
/// [module docs](self).
#[async_trait]
pub trait Layer: Send + Sync + fmt::Debug + 'static {
    /// A short name for logs, errors and suspensions.
    fn name(&self) -> &str;

    /// Around the whole call. The default calls `next`.
    async fn call(
        &self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
        next: CallNext<'_>,
    ) -> Result<crate::CallOutput> {
        next.run(cx, input).await
    }

    /// Around one model request. The default calls `next`.
    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        request: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse> {
        next.run(cx, request).await
    }

    /// Around one tool call. The default calls `next`.
    async fn tool(&self, cx: &ToolCtx<'_>, call: ToolCall, next: ToolNext<'_>) -> ToolOutcome {
        next.run(cx, call).await
    }

    /// Around a message joining the conversation (the user's input, each assistant
    /// message, each batch of tool results). The innermost step pushes it onto
    /// `cx.state.messages`; durable logs record it on the way in, so nothing joins the
    /// state before it is recorded. The default calls `next`.
    async fn append(
        &self,
        cx: &mut CallCtx<'_>,
        message: Message,
        next: AppendNext<'_>,
    ) -> Result<()> {
        next.run(cx, message).await
    }
}

macro_rules! next_handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name<'a> {
            pub(crate) layers: &'a [Arc<dyn Layer>],
            pub(crate) core: &'a Core,
        }

        impl fmt::Debug for $name<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("remaining", &self.layers.iter().map(|l| l.name().to_owned()).collect::<Vec<_>>())
                    .finish()
            }
        }

        impl<'a> $name<'a> {
            fn split(self) -> Option<(&'a Arc<dyn Layer>, Self)> {
                self.layers
                    .split_first()
                    .map(|(first, rest)| (first, Self { layers: rest, core: self.core }))
            }
        }
    };
}

next_handle!(
    /// The rest of the stack below a layer's [`Layer::call`].
    CallNext
);
next_handle!(
    /// The rest of the stack below a layer's [`Layer::model`]; it is `Copy`, so a layer
    /// may call it again to retry.
    ModelNext
);
next_handle!(
    /// The rest of the stack below a layer's [`Layer::tool`]; `Copy`, so a layer may retry.
    ToolNext
);
next_handle!(
    /// The rest of the stack below a layer's [`Layer::append`].
    AppendNext
);

impl<'a> CallNext<'a> {
    /// The append chain of the rest of the stack: a message a call layer adds before the
    /// loop runs (a result settled on resumption, say) passes the [`Layer::append`] of every
    /// layer below it, as the loop's own messages do, so it is recorded like them.
    pub fn appender(&self) -> AppendNext<'a> {
        AppendNext {
            layers: self.layers,
            core: self.core,
        }
    }

    /// Runs the rest of the stack, then the loop itself.
    pub async fn run(self, cx: &mut CallCtx<'_>, input: CallInput) -> Result<crate::CallOutput> {
        match self.split() {
            Some((layer, next)) => layer.call(cx, input, next).await,
            None => self.core.drive(cx, input).await,
        }
    }

    /// Runs the rest of the stack with a fresh `T` of this call added to the extensions (a
    /// collector the layers and tools below fill in), and gives it back with the output.
    pub async fn run_collecting<T: Default + Send + Sync + 'static>(
        self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
    ) -> (Result<crate::CallOutput>, Arc<T>) {
        let collector: Arc<T> = Arc::default();
        let out = self.run_adding(cx, collector.clone(), input).await;
        (out, collector)
    }

    /// Runs the rest of the stack with `value` added to the extensions (a value of this call
    /// that the layers and tools below read or fill in).
    pub async fn run_adding<T: Send + Sync + 'static>(
        self,
        cx: &mut CallCtx<'_>,
        value: Arc<T>,
        input: CallInput,
    ) -> Result<crate::CallOutput> {
        let mut extensions = cx.extensions.clone();
        extensions.insert_arc(value);
        self.run_with(cx, &extensions, input).await
    }

    /// Runs the rest of the stack with other extensions (e.g. the caller's plus a value of
    /// this call that the layers and tools below read); the rest of `cx` is shared.
    pub async fn run_with(
        self,
        cx: &mut CallCtx<'_>,
        extensions: &Extensions,
        input: CallInput,
    ) -> Result<crate::CallOutput> {
        let mut inner = CallCtx {
            runtime: cx.runtime,
            state: &mut *cx.state,
            events: cx.events,
            extensions,
            cancel: cx.cancel,
            iteration: cx.iteration,
        };
        self.run(&mut inner, input).await
    }
}

impl ModelNext<'_> {
    /// The model the stack ends at (its provider and name: what a request is priced by).
    pub fn model_info(&self) -> crate::ModelInfo {
        self.core.model().info()
    }

    /// Runs the rest of the stack, then the model.
    pub async fn run(self, cx: &mut CallCtx<'_>, request: ModelRequest) -> Result<ModelResponse> {
        match self.split() {
            Some((layer, next)) => layer.model(cx, request, next).await,
            None => {
                if tracing::enabled!(tracing::Level::DEBUG) {
                    tracing::debug!(
                        prefix = %prefix_hash(&request),
                        iteration = cx.iteration,
                        messages = request.messages.len(),
                        "model request"
                    );
                }
                let manifest = cx
                    .extensions
                    .get::<crate::telemetry::ManifestAttribute>()
                    .and_then(crate::telemetry::ManifestAttribute::take);
                self.core
                    .request_once(request, cx.events, cx.cancel, manifest)
                    .await
            }
        }
    }
}

/// A hash of what a provider's prompt cache keys on first: the system prompt and the tool
/// schemas. Equal hashes on consecutive requests mean the cached prefix is reused (logged at
/// `debug` per request: `RUST_LOG=hame_core=debug`).
pub fn prefix_hash(request: &ModelRequest) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    request.system.hash(&mut h);
    for t in &request.tools {
        t.name.hash(&mut h);
        t.description.hash(&mut h);
        t.parameters.to_string().hash(&mut h);
    }
    format!("{:016x}", h.finish())
}

impl ToolNext<'_> {
    /// The error the agent's own tools give a call of `name` when they have no visible tool
    /// of that name (`unknown_tool`, listing the names they have that `offered` keeps);
    /// `None` when they have one. A layer that dispatches tools of its own (MCP) knows
    /// those itself.
    pub fn unknown_tool(&self, name: &str, offered: &dyn Fn(&str) -> bool) -> Option<ToolError> {
        let tools = self.core.tools();
        tools
            .get(name)
            .is_none()
            .then(|| tools.unknown(name, offered))
    }

    /// Runs the rest of the stack, then the tool.
    pub async fn run(self, cx: &ToolCtx<'_>, call: ToolCall) -> ToolOutcome {
        match self.split() {
            Some((layer, next)) => layer.tool(cx, call, next).await,
            None => ToolOutcome::Done(self.core.run_tool(&call, cx.tool).await),
        }
    }
}

impl AppendNext<'_> {
    /// Runs the rest of the stack, then adds the message to the state.
    ///
    /// The message is redacted first ([`secrets::redact_message`](crate::secrets::redact_message)):
    /// at every layer it passes, so a message a layer adds (a subagent's result) is as
    /// clean in the log, the state and the next model request as the loop's own.
    pub async fn run(self, cx: &mut CallCtx<'_>, message: Message) -> Result<()> {
        let message = crate::secrets::redact_message(message);
        match self.split() {
            Some((layer, next)) => layer.append(cx, message, next).await,
            None => {
                cx.state.messages.push(message);
                Ok(())
            }
        }
    }
}
