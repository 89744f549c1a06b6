//! [`HarnessAgent`]: the composition root.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use hame_core::{
    AgentEvent, AgentLoop, AgentState, CallOutput, CancellationToken, EventSink, LoopConfig,
    Message, Middleware, Model, RuntimeContext, Tool, ToolSet,
};

use crate::context::{
    ContextOptions, DEFAULT_MEMORY_BUDGET_TOKENS, TokenCount, WorkspaceContext, WorkspaceReader,
};
use crate::error::{Error, Result};
use crate::ids::validate_id;
use crate::local::LocalWorkspaceReader;
use crate::workspace::resolve_workspace;

/// Default agent name (and agent id).
pub const DEFAULT_AGENT_NAME: &str = "hame";

/// Builds a [`HarnessAgent`]; start with [`HarnessAgent::builder`].
#[derive(Debug, Default)]
pub struct HarnessAgentBuilder {
    name: Option<String>,
    model: Option<Arc<dyn Model>>,
    workspace: Option<PathBuf>,
    system_prompt: String,
    middleware: Vec<Arc<dyn Middleware>>,
    tools: Vec<Arc<dyn Tool>>,
    loop_config: LoopConfig,
    memory_budget_tokens: Option<usize>,
    additional_context_files: Vec<String>,
    env: Option<EnvLookup>,
}

/// Reads environment variables; the default reads the process environment.
#[derive(Clone)]
pub struct EnvLookup(pub Arc<dyn Fn(&str) -> Option<String> + Send + Sync>);

impl std::fmt::Debug for EnvLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EnvLookup")
    }
}

impl EnvLookup {
    /// The process environment.
    pub fn process() -> Self {
        Self(Arc::new(|k| std::env::var(k).ok()))
    }
    /// Looks up `key`.
    pub fn get(&self, key: &str) -> Option<String> {
        (self.0)(key)
    }
}

impl HarnessAgentBuilder {
    /// The agent's name, also its id in state keys and log paths. Default `hame`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The model (required).
    pub fn model(mut self, model: Arc<dyn Model>) -> Self {
        self.model = Some(model);
        self
    }

    /// The workspace directory. Default: `HAME_WORKSPACE`, else `./.hame/workspace`.
    pub fn workspace(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workspace = Some(dir.into());
        self
    }

    /// The base system prompt, placed before the workspace context.
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = prompt.into();
        self
    }

    /// Adds a middleware. User middleware runs before the harness's built-ins, in the
    /// order added.
    pub fn middleware(mut self, mw: Arc<dyn Middleware>) -> Self {
        self.middleware.push(mw);
        self
    }

    /// Adds a tool.
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.push(tool);
        self
    }

    /// Maximum reasoning steps per call (default [`hame_core::DEFAULT_MAX_ITERATIONS`]).
    pub fn max_iterations(mut self, n: usize) -> Self {
        self.loop_config.max_iterations = n;
        self
    }

    /// Replaces the whole loop configuration (the system prompt set here is ignored; use
    /// [`system_prompt`](Self::system_prompt)).
    pub fn loop_config(mut self, config: LoopConfig) -> Self {
        self.loop_config = config;
        self
    }

    /// Token budget of `MEMORY.md` in the prompt (default 8000).
    pub fn memory_budget_tokens(mut self, tokens: usize) -> Self {
        self.memory_budget_tokens = Some(tokens);
        self
    }

    /// A workspace file injected into every system prompt.
    pub fn additional_context_file(mut self, path: impl Into<String>) -> Self {
        self.additional_context_files.push(path.into());
        self
    }

    /// Where environment variables are read from (default: the process environment).
    pub fn env(mut self, env: EnvLookup) -> Self {
        self.env = Some(env);
        self
    }

    /// Validates the configuration and builds the agent.
    pub fn build(self) -> Result<HarnessAgent> {
        let env = self.env.unwrap_or_else(EnvLookup::process);
        let model = self.model.ok_or_else(|| {
            Error::Config(
                "no model configured: call .model(...) (CLI: --model or HAME_MODEL)".into(),
            )
        })?;
        let name = self.name.unwrap_or_else(|| DEFAULT_AGENT_NAME.to_owned());
        validate_id("agent name", &name)?;
        let workspace = resolve_workspace(self.workspace.as_deref(), &|k| env.get(k));
        if workspace.exists() && !workspace.is_dir() {
            return Err(Error::Config(format!(
                "workspace {} is not a directory (set --workspace or HAME_WORKSPACE)",
                workspace.display()
            )));
        }
        let reader: Arc<dyn WorkspaceReader> =
            Arc::new(LocalWorkspaceReader::new(workspace.clone()));
        let context = WorkspaceContext::new(
            reader,
            ContextOptions {
                agent: name.clone(),
                memory_budget_tokens: self
                    .memory_budget_tokens
                    .unwrap_or(DEFAULT_MEMORY_BUDGET_TOKENS),
                additional_context_files: self.additional_context_files,
            },
            TokenCount::estimate(),
        );
        let mut tools = ToolSet::new();
        for t in self.tools {
            tools.register(t);
        }
        let mut config = self.loop_config;
        config.system_prompt = self.system_prompt;
        let mut agent_loop = AgentLoop::new(model).with_tools(tools).with_config(config);
        // User middleware first, then the built-ins in their fixed order.
        for mw in self.middleware {
            agent_loop = agent_loop.with_middleware(mw);
        }
        agent_loop = agent_loop.with_middleware(Arc::new(context));
        Ok(HarnessAgent {
            inner: Arc::new(Inner {
                name,
                workspace,
                agent_loop,
                sessions: Mutex::new(HashMap::new()),
            }),
        })
    }
}

#[derive(Debug)]
struct Inner {
    name: String,
    workspace: PathBuf,
    agent_loop: AgentLoop,
    sessions: Mutex<HashMap<String, Arc<tokio::sync::Mutex<AgentState>>>>,
}

/// An agent that keeps working across calls: a ReAct loop plus workspace context, state and
/// the harness's capabilities. Cheap to clone; one instance serves many users and sessions
/// at once (calls on one session queue, different sessions run in parallel).
#[derive(Debug, Clone)]
pub struct HarnessAgent {
    inner: Arc<Inner>,
}

impl HarnessAgent {
    /// Starts building an agent.
    pub fn builder() -> HarnessAgentBuilder {
        HarnessAgentBuilder::default()
    }

    /// The agent's name (its id).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The resolved workspace directory.
    pub fn workspace(&self) -> &std::path::Path {
        &self.inner.workspace
    }

    /// The loop (model, tools, middleware) this agent runs.
    pub fn agent_loop(&self) -> &AgentLoop {
        &self.inner.agent_loop
    }

    /// Runs one call and returns the final reply.
    pub async fn call(&self, message: Message, ctx: &RuntimeContext) -> Result<CallOutput> {
        self.call_with(message, ctx, &EventSink::none(), &CancellationToken::new())
            .await
    }

    /// Runs one call, streaming its events; the stream ends with `Finished` or `Failed`.
    pub fn stream(&self, message: Message, ctx: &RuntimeContext) -> BoxStream<'static, AgentEvent> {
        let (sink, rx) = EventSink::channel();
        let this = self.clone();
        let ctx = ctx.clone();
        tokio::spawn(async move {
            // Loop errors are reported as a `Failed` event by the loop itself; errors
            // before the loop starts are reported here.
            if let Err(e) = this
                .call_with(message, &ctx, &sink, &CancellationToken::new())
                .await
            {
                if !matches!(e, Error::Call(_)) {
                    sink.emit(AgentEvent::Failed {
                        message: e.to_string(),
                    });
                }
            }
        });
        Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        }))
    }

    /// Runs one call with an explicit event sink and cancellation token.
    pub async fn call_with(
        &self,
        message: Message,
        ctx: &RuntimeContext,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> Result<CallOutput> {
        validate_id("session id", &ctx.session_id)?;
        if let Some(u) = &ctx.user_id {
            validate_id("user id", u)?;
        }
        let key = format!(
            "{}/{}",
            ctx.user_id.as_deref().unwrap_or("-"),
            ctx.session_id
        );
        let slot = {
            let mut map = self
                .inner
                .sessions
                .lock()
                .map_err(|_| Error::Config("session table poisoned".into()))?;
            map.entry(key).or_default().clone()
        };
        let mut state = slot.lock().await;
        let out = self
            .inner
            .agent_loop
            .run(&mut state, message, ctx, events, cancel)
            .await?;
        Ok(out)
    }
}
