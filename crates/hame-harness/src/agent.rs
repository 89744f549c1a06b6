//! [`HarnessAgent`]: the composition root.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use hame_core::{
    AgentEvent, AgentLoop, AgentState, CallOutput, CancellationToken, EventSink, LoopConfig,
    Message, Middleware, Model, RuntimeContext, Tool, ToolSet,
};
use hame_fs::{Filesystem, Scope};
use hame_state::{LeaseOptions, StateKey, StateStore};

use crate::context::{
    ContextOptions, DEFAULT_MEMORY_BUDGET_TOKENS, TokenCount, WorkspaceContext, WorkspaceReader,
};
use crate::error::{Error, Result};
use crate::ids::validate_id;
use crate::memory::{MemoryLayer, MemoryMiddleware, MemoryOptions};
use crate::reader::FsWorkspaceReader;
use crate::recorder::{CALL_ID_EXTRA, SessionRecorder};
use crate::tenancy::{FilesystemMode, Tenancy};
use crate::workspace::resolve_workspace;

/// Default agent name (and agent id).
pub const DEFAULT_AGENT_NAME: &str = "hame";
/// Environment variable naming the base directory of the default JSON state store.
pub const STATE_HOME_ENV: &str = "HAME_STATE_HOME";

/// Reads environment variables; the default reads the process environment.
#[derive(Clone)]
pub struct EnvLookup(pub Arc<EnvFn>);

/// A function that looks up an environment variable.
pub type EnvFn = dyn Fn(&str) -> Option<String> + Send + Sync;

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
    /// Looks up `key`; blank values count as unset.
    pub fn get(&self, key: &str) -> Option<String> {
        (self.0)(key).filter(|v| !v.trim().is_empty())
    }
}

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
    filesystem: Option<FilesystemMode>,
    scope: Scope,
    state_store: Option<Arc<dyn StateStore>>,
    allow_local_state: bool,
    lease: Option<LeaseOptions>,
    memory: Option<MemoryOptions>,
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

    /// Adds a tool (it replaces a built-in tool of the same name).
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.push(tool);
        self
    }

    /// Maximum reasoning steps per call (default [`hame_core::DEFAULT_MAX_ITERATIONS`]).
    pub fn max_iterations(mut self, n: usize) -> Self {
        self.loop_config.max_iterations = n;
        self
    }

    /// Replaces the loop configuration (its system prompt is ignored; use
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

    /// Where workspace files live (default: [`FilesystemMode::Local`] with the shell).
    pub fn filesystem(mut self, mode: FilesystemMode) -> Self {
        self.filesystem = Some(mode);
        self
    }

    /// Which runtime data tenants share (default [`Scope::User`]).
    pub fn isolation_scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// Where session state is kept. Default: JSON files under `HAME_STATE_HOME/<agent>`,
    /// else `~/.hame/state/<agent>`.
    pub fn state_store(mut self, store: Arc<dyn StateStore>) -> Self {
        self.state_store = Some(store);
        self
    }

    /// Allows a single-machine state store (JSON files, memory) with a shared-store
    /// filesystem. Only for tests: replicas would not see each other's sessions.
    pub fn allow_local_state_with_shared_filesystem(mut self, allow: bool) -> Self {
        self.allow_local_state = allow;
        self
    }

    /// Session lease time-to-live and how long a call waits for a busy session (defaults
    /// [`hame_state::DEFAULT_LEASE_TTL`], [`hame_state::DEFAULT_LEASE_WAIT`]).
    pub fn session_lease(mut self, options: LeaseOptions) -> Self {
        self.lease = Some(options);
        self
    }

    /// Memory and context management: compaction, offloading of large tool results, daily
    /// logs and `MEMORY.md`, the memory tools (default [`MemoryOptions::default`]; see
    /// `docs/memory-wiring.md`).
    pub fn memory(mut self, options: MemoryOptions) -> Self {
        self.memory = Some(options);
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
        std::fs::create_dir_all(&workspace).map_err(|e| {
            Error::Config(format!(
                "cannot create workspace {}: {e} (set --workspace or HAME_WORKSPACE)",
                workspace.display()
            ))
        })?;
        let local: Arc<dyn Filesystem> =
            Arc::new(hame_fs::LocalFs::new(&workspace).map_err(|e| {
                Error::Config(format!(
                    "cannot open workspace {}: {e}",
                    workspace.display()
                ))
            })?);

        let mode = self.filesystem.unwrap_or_default();
        let state_store = match self.state_store {
            Some(s) => s,
            None => default_state_store(&env)?,
        };
        if mode.is_shared() && !state_store.is_shared() && !self.allow_local_state {
            return Err(Error::Config(
                "a shared-store filesystem needs a shared state store: set .state_store(...) to Redis, \
                 PostgreSQL or MySQL (CLI: --state redis://... ), or allow a local one for tests"
                    .into(),
            ));
        }
        let (store, shell) = match &mode {
            FilesystemMode::Local { shell } => (local.clone(), *shell),
            FilesystemMode::SharedStore { store } => (store.clone(), false),
        };
        let tenancy = Arc::new(Tenancy::new(store, local, &name, self.scope));

        // One token counter for every budget (tiktoken for OpenAI families, else the
        // calibrated estimate of hame-memory).
        let counter = hame_memory::counter_for_model(&model.info().model);
        let memory_options = self.memory.unwrap_or_default();
        let memory = memory_options.enabled.then(|| {
            Arc::new(MemoryLayer::new(
                memory_options,
                tenancy.clone(),
                &name,
                model.clone(),
                counter.clone(),
                &workspace,
            ))
        });

        let reader: Arc<dyn WorkspaceReader> = Arc::new(FsWorkspaceReader::new(tenancy.clone()));
        let context = WorkspaceContext::new(
            reader,
            ContextOptions {
                agent: name.clone(),
                memory_budget_tokens: self
                    .memory_budget_tokens
                    .unwrap_or(DEFAULT_MEMORY_BUDGET_TOKENS),
                additional_context_files: self.additional_context_files,
            },
            TokenCount(Arc::new(move |s: &str| {
                usize::try_from(counter.count(s)).unwrap_or(usize::MAX)
            })),
        );
        let recorder = Arc::new(SessionRecorder::new(tenancy.clone(), name.clone()));

        let mut tools = ToolSet::new();
        for t in crate::tools::builtin_tools(&tenancy, &name, shell, &workspace, memory.is_some())?
        {
            tools.register(t);
        }
        if let Some(layer) = &memory {
            for t in crate::memory::memory_tools(layer) {
                tools.register(t);
            }
        }
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
        agent_loop = agent_loop
            .with_middleware(Arc::new(context))
            .with_middleware(recorder);
        // After the session log: it records full tool results before offloading.
        if let Some(layer) = &memory {
            agent_loop = agent_loop.with_middleware(Arc::new(MemoryMiddleware::new(layer.clone())));
        }
        Ok(HarnessAgent {
            inner: Arc::new(Inner {
                name,
                workspace,
                agent_loop,
                tenancy,
                state_store,
                lease: self.lease.unwrap_or_default(),
                local_locks: Mutex::new(HashMap::new()),
                memory,
            }),
        })
    }
}

fn default_state_store(env: &EnvLookup) -> Result<Arc<dyn StateStore>> {
    let base = match env.get(STATE_HOME_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home = env.get("HOME").ok_or_else(|| {
                Error::Config(format!(
                    "neither {STATE_HOME_ENV} nor HOME is set: set {STATE_HOME_ENV} to a directory"
                ))
            })?;
            PathBuf::from(home).join(".hame").join("state")
        }
    };
    // The JSON store keeps each agent in its own `<base>/<agent>/` folder.
    let dir = base;
    let store = hame_state::JsonStore::open(&dir).map_err(|e| {
        Error::Config(format!(
            "cannot open state directory {}: {e} (set {STATE_HOME_ENV})",
            dir.display()
        ))
    })?;
    Ok(Arc::new(store))
}

#[derive(Debug)]
struct Inner {
    name: String,
    workspace: PathBuf,
    agent_loop: AgentLoop,
    tenancy: Arc<Tenancy>,
    state_store: Arc<dyn StateStore>,
    lease: LeaseOptions,
    local_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    memory: Option<Arc<MemoryLayer>>,
}

/// An agent that keeps working across calls: a ReAct loop plus workspace context, state and
/// the harness's capabilities. Cheap to clone; one instance serves many users and sessions
/// at once: calls on one session queue (in this process by a lock, across processes by the
/// state store's lease), different sessions run in parallel. No per-call data lives in the
/// agent.
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

    /// The agent's filesystems (store, template, isolation).
    pub fn tenancy(&self) -> Arc<Tenancy> {
        self.inner.tenancy.clone()
    }

    /// The state store.
    pub fn state_store(&self) -> &Arc<dyn StateStore> {
        &self.inner.state_store
    }

    /// The filesystem a caller sees (its namespace over the workspace template).
    pub fn filesystem_for(&self, ctx: &RuntimeContext) -> Result<Arc<dyn Filesystem>> {
        self.inner
            .tenancy
            .fs_for(ctx)
            .map_err(|e| Error::InvalidId(e.to_string()))
    }

    /// The session state of a caller, if the session exists.
    pub async fn state(&self, ctx: &RuntimeContext) -> Result<Option<AgentState>> {
        let key = self.key(ctx)?;
        let stored = self
            .inner
            .state_store
            .load(&key)
            .await
            .map_err(|e| Error::storage("loading session state failed", e))?;
        Ok(stored.map(|s| s.state))
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
            // around it (ids, storage, busy session) are reported here.
            let result = this
                .call_with(message, &ctx, &sink, &CancellationToken::new())
                .await;
            if let Err(e) = result
                && !matches!(e, Error::Call(_))
            {
                sink.emit(AgentEvent::Failed {
                    message: e.to_string(),
                });
            }
        });
        Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        }))
    }

    fn key(&self, ctx: &RuntimeContext) -> Result<StateKey> {
        validate_id("session id", &ctx.session_id)?;
        if let Some(u) = &ctx.user_id {
            validate_id("user id", u)?;
        }
        StateKey::new(&self.inner.name, ctx.user_id.as_deref(), &ctx.session_id)
            .map_err(|e| Error::InvalidId(e.to_string()))
    }

    /// Runs one call with an explicit event sink and cancellation token.
    ///
    /// Before it returns, the reply is in the session log and the state is saved: a reply
    /// the caller saw is never lost.
    pub async fn call_with(
        &self,
        message: Message,
        ctx: &RuntimeContext,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> Result<CallOutput> {
        let key = self.key(ctx)?;
        // Calls on one session queue in this process ...
        let slot = {
            let mut locks = self
                .inner
                .local_locks
                .lock()
                .map_err(|_| Error::Config("session lock table poisoned".into()))?;
            if locks.len() > 65_536 {
                locks.retain(|_, m| Arc::strong_count(m) > 1);
            }
            locks
                .entry(format!("{}/{}", key.user().unwrap_or("-"), key.session()))
                .or_default()
                .clone()
        };
        let _local = slot.lock().await;
        // ... and across processes and replicas behind the store's lease.
        let lease = match self.inner.state_store.acquire(&key, self.inner.lease).await {
            Ok(l) => l,
            Err(hame_state::Error::SessionBusy { .. }) => {
                return Err(Error::SessionBusy(ctx.session_id.clone()));
            }
            Err(e) => return Err(Error::storage("acquiring the session lease failed", e)),
        };
        let result = self
            .run_leased(&key, &lease, message, ctx, events, cancel)
            .await;
        if let Err(e) = lease.release().await {
            tracing::warn!(error = %e, "releasing the session lease failed; it expires by itself");
        }
        // The reply is durable: flush memory in the background, off the caller's path.
        if let (Ok(_), Some(layer)) = (&result, &self.inner.memory) {
            crate::memory::spawn_after_call(
                layer,
                self.inner.state_store.clone(),
                key,
                ctx.clone(),
                self.inner.lease,
            );
        }
        result
    }

    /// Waits up to `timeout` for background memory work (the after-call flush and
    /// consolidation) started so far; returns whether it all finished. A process that
    /// exits right after a call (the CLI) calls this first; unfinished work is redone by
    /// the session's next call.
    pub async fn wait_background(&self, timeout: Duration) -> bool {
        match &self.inner.memory {
            Some(layer) => layer.wait_background(timeout).await,
            None => true,
        }
    }

    async fn run_leased(
        &self,
        key: &StateKey,
        lease: &hame_state::Lease,
        message: Message,
        ctx: &RuntimeContext,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> Result<CallOutput> {
        let store = &self.inner.state_store;
        let (mut state, version) = match store
            .load(key)
            .await
            .map_err(|e| Error::storage("loading session state failed", e))?
        {
            Some(s) => (s.state, Some(s.version)),
            None => (AgentState::default(), None),
        };
        let mut runtime = ctx.clone();
        runtime.extras.insert(
            CALL_ID_EXTRA.to_owned(),
            serde_json::Value::String(uuid::Uuid::new_v4().to_string()),
        );
        let outcome = {
            let run = self
                .inner
                .agent_loop
                .run(&mut state, message, &runtime, events, cancel);
            tokio::pin!(run);
            let period = (lease.ttl() / 3).max(Duration::from_millis(100));
            let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            loop {
                tokio::select! {
                    out = &mut run => break out,
                    _ = ticker.tick() => {
                        if let Err(e) = lease.renew().await {
                            tracing::warn!(error = %e, "renewing the session lease failed");
                        }
                    }
                }
            }
        };
        // The state is saved whether the call succeeded or not: the messages it holds are
        // already in the session log, and tool calls are always paired with results.
        store
            .save(key, &state, version)
            .await
            .map_err(|e| Error::storage("saving session state failed", e))?;
        Ok(outcome?)
    }
}
