//! [`HarnessAgent`]: the composition root.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::BoxStream;
use hame_core::{
    AgentEvent, AgentLoop, AgentState, CallEnv, CallInput, CallOutput, CancellationToken,
    EventSink, Extensions, Layer, LoopConfig, Message, Model, Resolution, RuntimeContext,
    Suspended, Tool, ToolSet,
};
use hame_fs::{Filesystem, Scope};
use hame_memory::CompactionLayer;
use hame_state::{LeaseOptions, StateKey, StateStore};
use hame_tools::Workspace;

use crate::context::{ContextOptions, DEFAULT_MEMORY_BUDGET_TOKENS, TokenCount, WorkspaceContext};
use crate::error::{Error, Result};
use crate::ids::validate_id;
use crate::memory::{FlushBeforeCompaction, MemoryLayer, MemoryOptions, OffloadLayer};
use crate::recorder::{CALL_ID_EXTRA, SessionRecorder};
use crate::tenancy::{FilesystemMode, Tenancy};
use crate::workspace::resolve_workspace;

/// Default agent name (and agent id).
pub const DEFAULT_AGENT_NAME: &str = "hame";
/// Environment variable naming the base directory of the default JSON state store.
pub const STATE_HOME_ENV: &str = "HAME_STATE_HOME";

pub use hame_core::{EnvFn, EnvLookup};

/// Builds a [`HarnessAgent`]; start with [`HarnessAgent::builder`].
#[derive(Debug, Default)]
pub struct HarnessAgentBuilder {
    name: Option<String>,
    model: Option<Arc<dyn Model>>,
    workspace: Option<PathBuf>,
    system_prompt: String,
    outer_layers: Vec<Arc<dyn Layer>>,
    inner_layers: Vec<Arc<dyn Layer>>,
    tools: Vec<Arc<dyn Tool>>,
    allow_tools: Option<Vec<String>>,
    deny_tools: Vec<String>,
    deferred_tools: Option<Vec<String>>,
    loop_config: LoopConfig,
    memory_budget_tokens: Option<usize>,
    additional_context_files: Vec<String>,
    env: Option<EnvLookup>,
    filesystem: Option<FilesystemMode>,
    scope: Scope,
    state_store: Option<Arc<dyn StateStore>>,
    allow_local_state: bool,
    hidden_paths: Vec<PathBuf>,
    declared_users: Vec<String>,
    lease: Option<LeaseOptions>,
    sandbox_lease: Option<LeaseOptions>,
    memory: Option<MemoryOptions>,
    capabilities: crate::capabilities::Capabilities,
    subagent_options: hame_subagent::SubagentOptions,
    subagents: Vec<hame_subagent::Declaration>,
    model_resolver: Option<ModelResolver>,
    permission_rules: crate::tools_config::Permissions,
    permission_mode: crate::permissions::Mode,
    budgets: crate::cost::Budgets,
    prices: Option<crate::cost::Prices>,
    verifiers: crate::evidence::Verifiers,
    no_action_records: bool,
}

/// Opens a model from a `provider:model` spec (a subagent spec's `model` key); the CLI
/// passes `hame_model::open`.
#[derive(Clone)]
pub struct ModelResolver(pub Arc<ResolveFn>);

/// A function that opens a model from `provider:model`.
pub type ResolveFn = dyn Fn(&str) -> std::result::Result<Arc<dyn Model>, String> + Send + Sync;

impl std::fmt::Debug for ModelResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ModelResolver")
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

    /// Adds a layer *inside* the built-ins, next to the model and the tools (after the
    /// ones added before): it sees the final prompt (workspace context, compaction) and
    /// every tool call as it is about to run. Audit logs, caching, fallback models and
    /// policy checks usually go here. See `docs/ARCHITECTURE.md` for the stack.
    pub fn layer(mut self, layer: Arc<dyn Layer>) -> Self {
        self.inner_layers.push(layer);
        self
    }

    /// Declares a check (`[[verify]]` of `hame.toml`): a call that names it as required
    /// ([`require_checks`](crate::evidence::require_checks), `hame run --verify NAME`) is
    /// gated on its evidence. A later check of the same name replaces the earlier one.
    /// See `docs/evidence.md`.
    pub fn verifier(mut self, verifier: crate::evidence::Verifier) -> Self {
        self.verifiers.add(verifier);
        self
    }

    /// Whether every tool call leaves an observation and every model request a context
    /// manifest (default: yes; docs/evidence.md, docs/context-manifest.md). Off, the
    /// `observations` and `context-manifest` layers are left out of the stack: what the step
    /// benchmark compares (docs/benchmarks.md). Checks and the completion gate still work;
    /// a model's own `execute` of a check's command then records no evidence (there is no
    /// observation to bind it to), so the gate runs the check itself.
    pub fn action_records(mut self, on: bool) -> Self {
        self.no_action_records = !on;
        self
    }

    /// Adds a layer *outside* the built-ins (after the outer ones added before): it wraps
    /// the whole call as the caller made it, before the session log and the workspace
    /// context, and sees the prompt before the harness rebuilds it.
    pub fn outer_layer(mut self, layer: Arc<dyn Layer>) -> Self {
        self.outer_layers.push(layer);
        self
    }

    /// The tools that are registered and callable but offered only on demand (after the
    /// model looked them up with `tool_search`, used a tool of their group, or while plan
    /// mode is on; see `docs/tools.md`). Default:
    /// [`DEFAULT_DEFERRED_TOOLS`](crate::catalog::DEFAULT_DEFERRED_TOOLS); an empty list
    /// offers every tool in every request (and no `tool_search`).
    pub fn defer_tools<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.deferred_tools = Some(owned(names).collect());
        self
    }

    /// Only these tools are offered to the model and may run (built-in and added ones
    /// alike); a call to another tool gets an `unknown_tool` error result.
    pub fn allow_tools<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.allow_tools = Some(owned(names).collect());
        self
    }

    /// These tools are never offered and never run (deny wins over allow).
    pub fn deny_tools<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.deny_tools.extend(owned(names));
        self
    }

    /// Adds a tool (it replaces a built-in tool of the same name).
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.push(tool);
        self
    }

    /// Spending limits per run, session and user day (default: none). Spend is recorded
    /// either way (`docs/cost.md`).
    pub fn budgets(mut self, budgets: crate::cost::Budgets) -> Self {
        self.budgets = budgets;
        self
    }

    /// The price table (default [`crate::cost::DEFAULT_PRICES`]).
    pub fn prices(mut self, prices: crate::cost::Prices) -> Self {
        self.prices = Some(prices);
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

    /// Where session state is kept. Default: JSON files under
    /// `<HAME_STATE_HOME or ~/.hame/state>/ws-<16 hex>/<agent>/`, where `ws-<16 hex>` is
    /// [`workspace_identity`] (a hash of the workspace's canonical path), so two workspaces
    /// never share a conversation. An explicit store keeps its own addressing (replicas
    /// sharing a template share sessions).
    pub fn state_store(mut self, store: Arc<dyn StateStore>) -> Self {
        self.state_store = Some(store);
        self
    }

    /// A host directory the file tools never see when it lies inside the workspace (the
    /// directory of an explicit JSON state store; the default state home is hidden
    /// already).
    pub fn hide_path(mut self, dir: impl Into<PathBuf>) -> Self {
        self.hidden_paths.push(dir.into());
        self
    }

    /// User ids whose `<userId>/` folder of the workspace is theirs (hidden from every other
    /// user) before their first call; a user is registered at its first call anyway
    /// (`docs/filesystem.md`, ADR 0022). CLI: `users = [...]` in `hame.toml`.
    pub fn users<I, S>(mut self, users: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.declared_users.extend(owned(users));
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

    /// Sandbox mode: the TTL of the lease that orders the calls of one shared sandbox scope
    /// across processes, and how long a call waits for it (defaults
    /// [`hame_state::DEFAULT_LEASE_TTL`], [`crate::DEFAULT_SANDBOX_LEASE_WAIT`]; see
    /// `docs/sandbox.md`).
    pub fn sandbox_lease(mut self, options: LeaseOptions) -> Self {
        self.sandbox_lease = Some(options);
        self
    }

    /// Memory and context management: compaction, offloading of large tool results, daily
    /// logs and `MEMORY.md`, the memory tools (default [`MemoryOptions::default`]; see
    /// `docs/memory-wiring.md`).
    pub fn memory(mut self, options: MemoryOptions) -> Self {
        self.memory = Some(options);
        self
    }

    /// Skills (default on, no global directory): the `<available_skills>` block,
    /// `load_skill` and `propose_skill`; `None` switches them off. See `docs/skills.md`.
    pub fn skills(mut self, options: Option<hame_skills::SkillsOptions>) -> Self {
        self.capabilities.skills = options;
        self
    }

    /// Reading `tools.json` for every call (default on): allow/deny and MCP servers. See
    /// `docs/tools-and-mcp.md`.
    pub fn tools_config(mut self, enabled: bool) -> Self {
        self.capabilities.tools_config = enabled;
        self
    }

    /// The MCP connections to use (default: the agent's own); agents of one process can
    /// share one pool.
    pub fn mcp_pool(mut self, pool: Arc<hame_mcp::McpPool>) -> Self {
        self.capabilities.mcp_pool = Some(pool);
        self
    }

    /// Declares a subagent in code (it shadows the built-in one of the same id; workspace
    /// specs `subagents/<id>.md` shadow it in turn). See `docs/subagents.md`.
    pub fn subagent(mut self, spec: hame_subagent::SubagentSpec) -> Self {
        self.subagents.push(spec.into());
        self
    }

    /// Declares a subagent with its own runner: full control over how the child runs (a
    /// different engine, a remote agent).
    pub fn subagent_factory(
        mut self,
        spec: hame_subagent::SubagentSpec,
        runner: Arc<dyn hame_subagent::SubagentRunner>,
    ) -> Self {
        self.subagents.push(hame_subagent::Declaration {
            spec,
            runner: Some(runner),
        });
        self
    }

    /// Subagent limits: depth, concurrency, time limits, heartbeats (default
    /// [`hame_subagent::SubagentOptions::default`]).
    pub fn subagent_options(mut self, options: hame_subagent::SubagentOptions) -> Self {
        self.subagent_options = options;
        self
    }

    /// Offers the built-in `general-purpose` subagent (a copy of this agent with its tools
    /// and prompt). Default on; CLI `--no-general-subagent`.
    pub fn general_subagent(mut self, on: bool) -> Self {
        self.subagent_options.general_purpose = on;
        self
    }

    /// Opens the models that subagent specs name (`model: provider:model`); without one, a
    /// spec naming a model fails its spawn with a message saying so.
    pub fn model_resolver(mut self, resolver: ModelResolver) -> Self {
        self.model_resolver = Some(resolver);
        self
    }

    /// Permission rules of the agent (added to every caller's `tools.json` `permissions`;
    /// see `docs/permissions.md`).
    pub fn permission_rules(mut self, rules: crate::tools_config::Permissions) -> Self {
        self.permission_rules = rules;
        self
    }

    /// The permission mode: what applies when no rule matches (default
    /// [`Mode::Default`](crate::permissions::Mode::Default)).
    pub fn permission_mode(mut self, mode: crate::permissions::Mode) -> Self {
        self.permission_mode = mode;
        self
    }

    /// Validates the configuration and builds the agent.
    pub fn build(self) -> Result<HarnessAgent> {
        // `${VAR}` of tools.json is read later, per call: from a copy taken now.
        let vars = self.env.clone().unwrap_or_else(EnvLookup::snapshot);
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
        let cannot_open = |e| {
            Error::Config(format!(
                "cannot open workspace {}: {e}",
                workspace.display()
            ))
        };
        let local_fs = hame_fs::LocalFs::new(&workspace).map_err(cannot_open)?;
        let local: Arc<dyn Filesystem> = Arc::new(local_fs.clone());

        // Runtime data (session logs, memory, offloaded results) is created 0600 / 0700.
        let private: Arc<dyn Filesystem> = Arc::new(private_fs(&workspace).map_err(cannot_open)?);

        let mode = self.filesystem.unwrap_or_default();
        let (state_store, state_dir, state_root) = match self.state_store {
            Some(s) => (s, None, None),
            None => {
                let (store, dir, root) = default_state_store(&env, &workspace)?;
                (store, Some(dir), Some(root))
            }
        };
        if mode.is_shared() && !state_store.is_shared() && !self.allow_local_state {
            return Err(Error::Config(
                "a shared-store filesystem needs a shared state store: set .state_store(...) to Redis, \
                 PostgreSQL or MySQL (CLI: --state redis://... ), or allow a local one for tests"
                    .into(),
            ));
        }
        // Sandbox mode keeps runtime data (session logs, memory) on the host but outside
        // the workspace: `<state home>/sandbox-runtime/<workspace identity>/`.
        let runtime_dir = match &mode {
            FilesystemMode::Sandbox { .. } => Some(sandbox_runtime_dir(&env, &workspace)?),
            _ => None,
        };
        let (store, shell) = match (&mode, &runtime_dir) {
            (FilesystemMode::Local { shell }, _) => (private.clone(), *shell),
            (FilesystemMode::IsolatedLocal, _) => (private.clone(), false),
            (FilesystemMode::SharedStore { store }, _) => (store.clone(), false),
            (FilesystemMode::Sandbox { .. }, Some(dir)) => {
                let runtime: Arc<dyn Filesystem> =
                    Arc::new(private_fs(dir).map_err(|e| {
                        Error::Config(format!("cannot open {}: {e}", dir.display()))
                    })?);
                (runtime, false)
            }
            (FilesystemMode::Sandbox { .. }, None) => (private.clone(), false),
        };
        // A state home inside the workspace is never shown to the file tools.
        let mut hidden = Vec::new();
        for dir in state_dir.iter().chain(self.hidden_paths.iter()) {
            if let Some(p) = inside(&workspace, dir) {
                hidden.push(p);
            }
        }
        let memory_options = self.memory.unwrap_or_default();
        let exec = shell.then(|| crate::tools::local_shell(&workspace, memory_options.enabled));
        let mut tenancy = Tenancy::new(
            store,
            local,
            &name,
            self.scope,
            mode.workspace_mode(),
            exec.clone(),
        )
        .with_hidden(hidden)
        .with_declared_users(validated_users(&self.declared_users)?)
        .with_links(Arc::new(local_fs.clone()))
        .with_name_case(local_fs.name_case());
        if let Some(sandboxes) = mode.sandboxes() {
            tenancy = tenancy.with_sandboxes(sandboxes.clone());
        }
        let tenancy = Arc::new(tenancy);
        let sandbox_lease = self
            .sandbox_lease
            .unwrap_or_else(crate::sandbox::default_sandbox_lease);
        let sandbox = mode.sandboxes().map(|_| {
            Arc::new(crate::sandbox::SandboxLayer::new(
                tenancy.clone(),
                state_store.clone(),
                sandbox_lease,
            ))
        });
        let sandbox_layer: Option<Arc<dyn Layer>> = sandbox.clone().map(|l| l as Arc<dyn Layer>);

        // One token counter for every budget (tiktoken for OpenAI families, else the
        // calibrated estimate of hame-memory).
        let counter = hame_memory::counter_for_model(&model.info().model);
        let manifest_counter = counter.clone();
        let prices = self.prices.clone().unwrap_or_default();
        // The requests beside the loop's (compaction, memory flush) count in the call's
        // spend (docs/cost.md).
        let side_model: Arc<dyn Model> = Arc::new(crate::cost::MeteredModel::new(
            model.clone(),
            prices.clone(),
        ));
        let memory = memory_options.enabled.then(|| {
            Arc::new(MemoryLayer::new(
                memory_options,
                self.scope,
                &name,
                side_model.clone(),
                counter.clone(),
                runtime_dir.as_deref().unwrap_or(&workspace),
            ))
        });

        let capabilities = self.capabilities.build(
            vars.clone(),
            &workspace,
            mode.sandboxes().map(|_| tenancy.template.clone()),
        )?;
        let context = WorkspaceContext::new(
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
        let context = match &capabilities.skills {
            Some(skills) => context.with_skills(skills.clone()),
            None => context,
        };
        let recorder = Arc::new(SessionRecorder::new(name.clone()));
        let manifest_layer = Arc::new(crate::manifest::ManifestLayer::new(
            recorder.clone(),
            manifest_counter,
        ));
        let evidence =
            crate::evidence::EvidenceStore::new(recorder.clone(), Arc::new(self.verifiers));

        let mut tools = ToolSet::new();
        let has_shell = exec.is_some() || sandbox_layer.is_some();
        for t in crate::tools::builtin_tools(&name, has_shell, memory.is_some())? {
            tools.register(t);
        }
        if let Some(layer) = &memory {
            for t in crate::memory::memory_tools(layer) {
                tools.register(t);
            }
        }
        for t in capabilities.tools() {
            tools.register(t);
        }
        for t in crate::permissions::plan_tools() {
            tools.register(t);
        }
        for t in crate::task::tools(evidence.verifier_names()) {
            tools.register(t);
        }
        // Subagents: the built-in general-purpose one mirrors this agent's prompt and tools.
        let mut declarations = Vec::new();
        if self.subagent_options.general_purpose {
            declarations.push(crate::subagents::general_purpose(&self.system_prompt));
        }
        for d in self.subagents {
            validate_id("subagent id", &d.spec.id)?;
            declarations.push(d);
        }
        // A remote subagent's `a2a_auth_env` is read per run, from the same copy as the
        // `${VAR}` of tools.json (the CLI blanks secret variables after the build).
        let subagent_options = hame_subagent::SubagentOptions {
            env: vars.clone(),
            ..self.subagent_options
        };
        let subagents = Arc::new(hame_subagent::Subagents::new(
            name.clone(),
            subagent_options,
            declarations,
        ));
        if subagents.options().max_depth > 0 {
            for t in hame_subagent::subagent_tools(&subagents) {
                tools.register(t);
            }
        }
        for t in self.tools {
            tools.register(t);
        }
        tools.set_allow(self.allow_tools);
        tools.set_deny(self.deny_tools);
        tools.set_deferred(self.deferred_tools.unwrap_or_else(|| {
            crate::catalog::DEFAULT_DEFERRED_TOOLS
                .iter()
                .map(|s| (*s).to_owned())
                .collect()
        }));
        let catalog =
            crate::catalog::Catalog::new(tools.deferred_specs(), subagents.options().max_depth);
        if let Some(catalog) = &catalog {
            tools.register(crate::catalog::search_tool(catalog.clone()));
            if let Some(layer) = &capabilities.tools_layer {
                layer.set_deferred(catalog.clone());
            }
        }
        let mut config = self.loop_config;
        config.system_prompt = self.system_prompt;
        // The intents layer asks the agent's own tools to reconcile or re-run a cut call.
        let own_tools = tools.clone();
        let mut agent_loop = AgentLoop::new(model.clone())
            .with_tools(tools)
            .with_config(config);
        let mut outer = self.outer_layers;
        outer.extend(sandbox_layer);
        // One snapshot of the workspace configuration per step, read by every layer inside
        // it and the step's tools (ADR 0028).
        outer.push(Arc::new(
            crate::snapshot::SnapshotLayer::new(Arc::default(), self.scope)
                .with_sandbox_host(mode.sandboxes().map(|_| tenancy.template.clone())),
        ));
        outer.push(Arc::new(hame_subagent::SubagentLayer::new(
            subagents.clone(),
        )));
        // An API caller's earlier messages: outside the log, so they are recorded.
        outer.push(Arc::new(crate::caller::HistoryLayer));
        // Tool calls cut by a crash settled on resumption: outside the log too, so the
        // results it adds (`outcome_unknown`, reconciled, run again) are recorded (issues
        // #31, #33).
        outer.push(Arc::new(crate::intent::IntentLayer::new(
            name.clone(),
            own_tools,
            evidence.clone(),
        )));
        for layer in builtin_stack(
            outer,
            recorder,
            &evidence,
            Arc::new(context),
            memory.as_ref().map(|m| (m, &side_model)),
            self.inner_layers,
            !self.no_action_records,
        ) {
            agent_loop = agent_loop.with_layer(layer);
        }
        // Permissions, plan mode, todo list: outside tools-config, so it sees MCP calls before
        // they are dispatched; every tool call passes it (ADR 0011).
        let permissions = Arc::new(crate::permissions::PermissionLayer::new(
            capabilities.tools_layer.clone(),
            self.permission_rules,
            self.permission_mode,
        ));
        agent_loop = agent_loop.with_layer(permissions.clone());
        // Intent records: inside permissions, so only a call about to act is recorded (a
        // denied or suspended call never acts).
        agent_loop = agent_loop.with_layer(Arc::new(crate::intent::IntentToolLayer::new(
            name.clone(),
            capabilities.tools_layer.clone(),
        )));
        // Deferred tools: inside permissions (it sees plan mode), outside tools-config (whose
        // allow/deny also filters what it offers).
        if let Some(catalog) = catalog {
            agent_loop =
                agent_loop.with_layer(Arc::new(crate::catalog::CatalogLayer::new(catalog)));
        }
        // Innermost: allow/deny of tools.json over every tool, MCP calls dispatched below
        // every other layer (ADR 0006).
        if let Some(layer) = &capabilities.tools_layer {
            agent_loop = agent_loop.with_layer(layer.clone());
        }
        // Innermost of all: spend recorded and budgets checked on each request as sent
        // (compaction's retries included).
        let budgets = self.budgets;
        agent_loop =
            agent_loop.with_layer(Arc::new(crate::cost::BudgetLayer::new(budgets, prices)));
        // Innermost: the manifest of each request as sent (ADR 0035).
        if !self.no_action_records {
            agent_loop = agent_loop.with_layer(manifest_layer);
        }
        let inner = Arc::new(Inner {
            budgets,
            day_spend: crate::cost::DaySpendCache::default(),
            name,
            workspace,
            agent_loop,
            tenancy,
            state_store,
            state_root,
            lease: self.lease.unwrap_or_default(),
            local_locks: Mutex::new(HashMap::new()),
            memory,
            capabilities,
            subagents: subagents.clone(),
            model_resolver: self.model_resolver,
            child_models: Mutex::new(HashMap::new()),
            evidence,
            permissions,
            sandbox,
        });
        subagents.set_runner(Arc::new(crate::subagents::HarnessRunner::new(&inner)));
        Ok(HarnessAgent { inner })
    }
}

/// The layer stack, outermost first (drawn in `docs/ARCHITECTURE.md`):
///
/// 1. the caller's outer layers, then `subagents` (the subagents section of the prompt,
///    finished background results pushed before a step: outside the log, so they are
///    logged), then `caller-history` (an API caller's earlier messages start a new
///    session: outside the log, so they are logged);
/// 2. `session-log`: records each message before it joins the state, the index once per
///    call; then `verify` (the completion gate: required checks after the final answer,
///    an extra step on failure) and `observations` (one record per tool call) — ADR 0035;
/// 3. `workspace-context`: rebuilds the system prompt from the caller's workspace;
/// 4. `compaction` (memory on): flush, then compact before a request that triggers the
///    policy, compact and retry after a context overflow;
/// 5. `offload` (memory on): large tool results to files before they join the state (the
///    log, outside, has them whole);
/// 6. `caller`: an API caller's instructions, client tools and reply format
///    ([`crate::caller`]);
/// 7. the caller's inner layers, next to the model and the tools.
fn builtin_stack(
    outer: Vec<Arc<dyn Layer>>,
    recorder: Arc<SessionRecorder>,
    evidence: &crate::evidence::EvidenceStore,
    context: Arc<WorkspaceContext>,
    memory: Option<(&Arc<MemoryLayer>, &Arc<dyn Model>)>,
    inner: Vec<Arc<dyn Layer>>,
    observations: bool,
) -> Vec<Arc<dyn Layer>> {
    let mut stack = outer;
    stack.push(recorder);
    stack.push(Arc::new(crate::evidence::VerifyLayer::new(
        evidence.clone(),
    )));
    if observations {
        stack.push(Arc::new(crate::evidence::ObservationLayer::new(
            evidence.clone(),
        )));
    }
    stack.push(context);
    if let Some((layer, model)) = memory {
        let compaction = CompactionLayer::new(layer.compactor.clone(), model.clone())
            .with_context_window(layer.context_window)
            .with_before_compaction(Arc::new(FlushBeforeCompaction::new(layer.clone())));
        stack.push(Arc::new(compaction));
        stack.push(Arc::new(OffloadLayer::new(layer.clone())));
    }
    // An API caller's instructions, tools and reply format: inside workspace-context (it
    // sees the final prompt), outside the user's inner layers and permissions (a client
    // tool call never reaches hame's tools or rules) — ADR 0033.
    // The task state's section: inside workspace-context (which rebuilds the prompt), so
    // it is in every request, after compaction too.
    stack.push(Arc::new(crate::task::TaskLayer::new(evidence.clone())));
    stack.push(Arc::new(crate::caller::CallerLayer));
    stack.extend(inner);
    stack
}

/// The names a builder method takes, as owned strings.
fn owned<S: Into<String>>(names: impl IntoIterator<Item = S>) -> impl Iterator<Item = String> {
    names.into_iter().map(Into::into)
}

/// A filesystem at `dir` for runtime data (session logs, memory, offloaded results): what
/// it creates is 0600 / 0700.
fn private_fs(dir: &std::path::Path) -> hame_fs::Result<hame_fs::LocalFs> {
    hame_fs::LocalFs::with_options(
        dir,
        hame_fs::LocalFsOptions {
            private: true,
            ..hame_fs::LocalFsOptions::default()
        },
    )
}

/// `dir` as a path of the workspace, when it is inside it (both canonicalised).
fn inside(workspace: &std::path::Path, dir: &std::path::Path) -> Option<hame_fs::FsPath> {
    let ws = std::fs::canonicalize(workspace).ok()?;
    let d = std::fs::canonicalize(dir).ok()?;
    if d == ws {
        // The whole workspace cannot be hidden; the state store refuses nothing here.
        return None;
    }
    let rel = d.strip_prefix(&ws).ok()?;
    hame_fs::FsPath::parse(rel.to_str()?).ok()
}

/// The stable identity of a workspace: `ws-` and 16 hex digits of the FNV-1a 64 hash of
/// its canonical path (stable across builds and platforms, unlike `DefaultHasher`). The
/// default state of two workspaces never mixes, even with the same agent and session ids.
pub fn workspace_identity(workspace: &std::path::Path) -> String {
    let canonical = std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canonical.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("ws-{hash:016x}")
}

/// The default JSON state store: `<HAME_STATE_HOME or ~/.hame/state>/<workspace identity>/`
/// (created `0700`), the state home (its parent) and its own directory.
fn default_state_store(
    env: &EnvLookup,
    workspace: &std::path::Path,
) -> Result<(Arc<dyn StateStore>, PathBuf, PathBuf)> {
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
    // The JSON store keeps each agent in its own `<dir>/<agent>/` folder; `dir` is per
    // workspace.
    let dir = base.join(workspace_identity(workspace));
    create_private_dir(&dir).map_err(|e| {
        Error::Config(format!(
            "cannot create state directory {}: {e} (set {STATE_HOME_ENV})",
            dir.display()
        ))
    })?;
    let store = hame_state::JsonStore::open(&dir).map_err(|e| {
        Error::Config(format!(
            "cannot open state directory {}: {e} (set {STATE_HOME_ENV})",
            dir.display()
        ))
    })?;
    // The whole state home is hidden from the file tools when it is inside the workspace
    // (it holds other workspaces' state too).
    Ok((Arc::new(store), base, dir))
}

/// Where sandbox mode keeps a workspace's runtime data on the host:
/// `<HAME_STATE_HOME or ~/.hame/state>/sandbox-runtime/<workspace identity>/` (created
/// `0700`).
fn sandbox_runtime_dir(env: &EnvLookup, workspace: &std::path::Path) -> Result<PathBuf> {
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
    let dir = base
        .join("sandbox-runtime")
        .join(workspace_identity(workspace));
    create_private_dir(&dir).map_err(|e| {
        Error::Config(format!(
            "cannot create {}: {e} (set {STATE_HOME_ENV})",
            dir.display()
        ))
    })?;
    Ok(dir)
}

/// Creates `dir` and its missing parents `0700`.
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[derive(Debug)]
pub(crate) struct Inner {
    budgets: crate::cost::Budgets,
    /// What the users' other sessions spent today, as last read (user-day budgets).
    day_spend: crate::cost::DaySpendCache,
    pub(crate) name: String,
    pub(crate) workspace: PathBuf,
    pub(crate) agent_loop: AgentLoop,
    pub(crate) tenancy: Arc<Tenancy>,
    pub(crate) state_store: Arc<dyn StateStore>,
    /// The directory of the default JSON state store, when the harness opened it.
    pub(crate) state_root: Option<PathBuf>,
    pub(crate) lease: LeaseOptions,
    local_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub(crate) memory: Option<Arc<MemoryLayer>>,
    capabilities: crate::capabilities::Built,
    pub(crate) subagents: Arc<hame_subagent::Subagents>,
    pub(crate) model_resolver: Option<ModelResolver>,
    pub(crate) child_models: Mutex<HashMap<String, Arc<dyn Model>>>,
    pub(crate) evidence: crate::evidence::EvidenceStore,
    /// The permission layer of the stack (also asked by [`HarnessAgent::file_verdict`]).
    permissions: Arc<crate::permissions::PermissionLayer>,
    /// The sandbox layer of sandbox mode (also entered by [`HarnessAgent::file_access`]).
    sandbox: Option<Arc<crate::sandbox::SandboxLayer>>,
}

/// A caller's files held for one request of its own ([`HarnessAgent::file_access`]).
/// Dropped without [`close`](Self::close) (a download cut short), it lets the sandbox
/// scope go without a snapshot.
#[derive(Debug)]
pub struct FileAccess {
    files: Arc<dyn Filesystem>,
    hold: Option<crate::sandbox::ScopeHold>,
}

impl FileAccess {
    /// The caller's files (the tenant view, or the held sandbox).
    pub fn files(&self) -> &Arc<dyn Filesystem> {
        &self.files
    }

    /// Ends the request: in sandbox mode snapshots `/workspace` and lets the scope go.
    pub async fn close(self) -> Result<()> {
        match self.hold {
            Some(hold) => hold.exit().await.map_err(Error::Call),
            None => Ok(()),
        }
    }
}

/// An agent that keeps working across calls: a ReAct loop plus workspace context, state and
/// the harness's capabilities. Cheap to clone; one instance serves many users and sessions
/// at once: calls on one session queue (in this process by a lock, across processes by the
/// state store's lease), different sessions run in parallel. No per-call data lives in the
/// agent.
#[derive(Debug, Clone)]
pub struct HarnessAgent {
    pub(crate) inner: Arc<Inner>,
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

    /// The loop (model, tools, layers) this agent runs.
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

    /// The directory of the JSON state store the harness opened itself (no
    /// [`state_store`](HarnessAgentBuilder::state_store) given): where the run queue of such a
    /// deployment lives too. `None` when a store was given.
    pub fn default_state_root(&self) -> Option<&std::path::Path> {
        self.inner.state_root.as_deref()
    }

    /// The skills capability, when on (`hame skills list|promote` use it with
    /// [`workspace_for`](Self::workspace_for)).
    pub fn skills(&self) -> Option<&Arc<hame_skills::Skills>> {
        self.inner.capabilities.skills.as_ref()
    }

    /// Reads and checks a caller's `tools.json` (and its `<userId>/tools.json`) as the next
    /// call will: a broken file is [`Error::Config`] naming it. `None` when `tools.json` is
    /// not read (switched off).
    pub async fn tools_config_for(
        &self,
        ctx: &RuntimeContext,
    ) -> Result<Option<crate::tools_config::ToolsConfig>> {
        let Some(layer) = &self.inner.capabilities.tools_layer else {
            return Ok(None);
        };
        // In sandbox mode the layer reads the host's copy: no container starts here.
        let ws = self.workspace_for(ctx)?;
        layer.load(&ws).await.map(Some).map_err(Error::Config)
    }

    /// The workspace handle of a caller: what its tools and layers see.
    pub fn workspace_for(&self, ctx: &RuntimeContext) -> Result<Workspace> {
        self.key(ctx)?;
        self.inner
            .tenancy
            .workspace(ctx)
            .map_err(|e| Error::InvalidId(e.to_string()))
    }

    /// What the permission rules say of the caller itself using file tool `tool`
    /// (`read_file`, `write_file`, `list_files`) on `path`: the agent's rules with the
    /// caller's `tools.json` ones, the permission mode, and the session's plan mode and
    /// "always" answers, decided by the function that decides the agent's own calls (the
    /// gateway's file routes ask it). `Ok(Err(reason))`: a path the file tools refuse;
    /// [`Error::Config`]: a broken `tools.json`.
    pub async fn file_verdict(
        &self,
        ctx: &RuntimeContext,
        tool: &str,
        path: &str,
    ) -> Result<std::result::Result<crate::permissions::Verdict, String>> {
        let ws = self.workspace_for(ctx)?;
        let session = self
            .state(ctx)
            .await?
            .and_then(|s| s.extensions.get(crate::permissions::STATE_KEY).cloned())
            .and_then(|v| serde_json::from_value::<crate::permissions::SessionPermissions>(v).ok())
            .unwrap_or_default();
        self.inner
            .permissions
            .verdict_for(&ws, tool, path, &session)
            .await
            .map_err(Error::Config)
    }

    /// The caller's files for a request of its own outside a call (the gateway's file
    /// routes), under the rules a call's file tools work under: in sandbox mode the
    /// scope's sandbox is held as a call holds it — the session lease first in SESSION
    /// scope, then this process's lock of the scope, then the sandbox lease of a shared
    /// scope — so the request never interleaves with a turn's tools, and
    /// [`FileAccess::close`] snapshots what it wrote. Without a sandbox, the tenant view
    /// ([`filesystem_for`](Self::filesystem_for)).
    pub async fn file_access(&self, ctx: &RuntimeContext) -> Result<FileAccess> {
        let ws = self.workspace_for(ctx)?;
        let Some(layer) = &self.inner.sandbox else {
            return Ok(FileAccess {
                files: ws.files().clone(),
                hold: None,
            });
        };
        let scope_key = self
            .inner
            .tenancy
            .sandbox_key(ws.identity())
            .map_err(|e| Error::InvalidId(e.to_string()))?;
        let held = if self.inner.tenancy.isolation.scope == hame_fs::Scope::Session {
            let key = self.key(ctx)?;
            match self.inner.state_store.acquire(&key, self.inner.lease).await {
                Ok(lease) => Some(lease),
                Err(hame_state::Error::SessionBusy { .. }) => {
                    return Err(Error::SessionBusy(ctx.session_id.clone()));
                }
                Err(e) => return Err(Error::storage("acquiring the session lease failed", e)),
            }
        } else {
            None
        };
        let hold = layer
            .enter(&scope_key, false, held, &ws)
            .await
            .map_err(Error::Call)?;
        let files = hold
            .files()
            .ok_or_else(|| Error::Config("the sandbox hold ended before it was used".to_owned()))?;
        Ok(FileAccess {
            files,
            hold: Some(hold),
        })
    }

    /// The files a caller sees (those of its [`workspace_for`](Self::workspace_for)).
    pub fn filesystem_for(&self, ctx: &RuntimeContext) -> Result<Arc<dyn Filesystem>> {
        Ok(self.workspace_for(ctx)?.files().clone())
    }

    /// The tool calls of a caller's session that wait for decisions, if any.
    pub async fn pending(&self, ctx: &RuntimeContext) -> Result<Option<Suspended>> {
        Ok(self
            .state(ctx)
            .await?
            .and_then(|s| s.pending.map(|p| p.to_suspended())))
    }

    /// What the sessions of `user` (`None`: the anonymous tenant) spent, by session and
    /// model, on UTC days from `since` (`YYYY-MM-DD`; `None`: all), as saved with their
    /// state (`hame usage`).
    pub async fn usage(
        &self,
        user: Option<&str>,
        since: Option<&str>,
    ) -> Result<Vec<crate::cost::SessionSpend>> {
        if let Some(u) = user {
            validate_id("user id", u)?;
        }
        crate::cost::spend_by_session(
            self.inner.state_store.as_ref(),
            &self.inner.name,
            user,
            since,
        )
        .await
        .map_err(|e| Error::storage("reading the sessions' spend failed", e))
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

    /// The task state of the caller's session (goal, requirements; docs/evidence.md).
    pub async fn task_state(&self, ctx: &RuntimeContext) -> Result<crate::task::TaskState> {
        Ok(self
            .state(ctx)
            .await?
            .map(|s| crate::task::TaskState::of(&s))
            .unwrap_or_default())
    }

    /// Confirms the requirement `id` of the caller's session (`hame requirements confirm S
    /// ID`): it binds from the next request on, and the check it names becomes required
    /// for every later call. Under the session's lease, saved by compare-and-set; a
    /// configuration error when the session has no such requirement.
    pub async fn confirm_requirement(
        &self,
        ctx: &RuntimeContext,
        id: &str,
    ) -> Result<crate::task::Requirement> {
        let key = self.key(ctx)?;
        let store = &self.inner.state_store;
        let lease = match store.acquire(&key, self.inner.lease).await {
            Ok(l) => l,
            Err(hame_state::Error::SessionBusy { .. }) => {
                return Err(Error::SessionBusy(ctx.session_id.clone()));
            }
            Err(e) => return Err(Error::storage("acquiring the session lease failed", e)),
        };
        let result = async {
            let stored = store
                .load(&key)
                .await
                .map_err(|e| Error::storage("loading session state failed", e))?
                .ok_or_else(|| Error::Config(format!("session {} has no state", ctx.session_id)))?;
            let mut state = stored.state;
            let mut task = crate::task::TaskState::of(&state);
            if !task.confirm(id) {
                return Err(Error::Config(format!(
                    "session {} has no requirement {id:?} (it has: {})",
                    ctx.session_id,
                    task.requirements
                        .iter()
                        .map(|r| r.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            state
                .set_extension(crate::task::STATE_KEY, &task)
                .map_err(|e| Error::storage("encoding the task state failed", e))?;
            store
                .save_fenced(&key, &state, Some(stored.version), &lease)
                .await
                .map_err(|e| Error::storage("saving session state failed", e))?;
            task.requirements
                .into_iter()
                .find(|r| r.id == id)
                .ok_or_else(|| Error::Config(format!("no requirement {id:?}")))
        }
        .await;
        if let Err(e) = lease.release().await {
            tracing::warn!(error = %e, "releasing the session lease failed; it expires by itself");
        }
        result
    }

    /// Runs one call and returns the final reply.
    pub async fn call(&self, message: Message, ctx: &RuntimeContext) -> Result<CallOutput> {
        self.call_with(message, ctx, &EventSink::none(), &CancellationToken::new())
            .await
    }

    /// Runs one call, streaming its events; the stream ends with `Finished`, `Suspended` or
    /// `Failed`.
    pub fn stream(&self, message: Message, ctx: &RuntimeContext) -> BoxStream<'static, AgentEvent> {
        self.stream_with(CallInput::Message(message), ctx, CancellationToken::new())
    }

    /// [`stream`](Self::stream) for a new message or a resume, with a cancellation token
    /// (cancelling it ends the call at the next await point; what joined the state is kept).
    pub fn stream_with(
        &self,
        input: CallInput,
        ctx: &RuntimeContext,
        cancel: CancellationToken,
    ) -> BoxStream<'static, AgentEvent> {
        let (sink, rx) = EventSink::channel();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let this = self.clone();
        let ctx = ctx.clone();
        tokio::spawn(async move {
            // Loop errors are reported as a `Failed` event by the loop itself; errors
            // around it (ids, storage, busy session) are reported here.
            let result = this.call_input(input, &ctx, &sink, &cancel).await;
            if let Err(e) = result
                && !matches!(e, Error::Call(_))
            {
                sink.emit(AgentEvent::Failed {
                    message: e.to_string(),
                });
            }
            let _ = done_tx.send(());
        });
        // The stream ends when the call is over — its state saved and its lease released —
        // with what the call emitted until then; background subagents may keep the sink
        // open after the call, so its closing is not waited for.
        struct Reading {
            rx: tokio::sync::mpsc::UnboundedReceiver<AgentEvent>,
            done: Option<tokio::sync::oneshot::Receiver<()>>,
        }
        let start = Reading {
            rx,
            done: Some(done_rx),
        };
        Box::pin(futures::stream::unfold(start, |mut st| async move {
            loop {
                let Some(done) = st.done.as_mut() else {
                    // The call is over: what it left queued, then the end.
                    let ev = st.rx.try_recv().ok()?;
                    return Some((ev, st));
                };
                tokio::select! {
                    biased;
                    ev = st.rx.recv() => return ev.map(|ev| (ev, st)),
                    _ = done => st.done = None,
                }
            }
        }))
    }

    pub(crate) fn key(&self, ctx: &RuntimeContext) -> Result<StateKey> {
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
    /// the caller saw is never lost. When a layer suspends a tool call (a human must
    /// approve it), the call returns [`Error::Call`] with [`hame_core::Error::Suspended`]
    /// after saving the pending step; [`resume`](Self::resume) finishes it, in this
    /// process or another.
    pub async fn call_with(
        &self,
        message: Message,
        ctx: &RuntimeContext,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> Result<CallOutput> {
        self.call_input(CallInput::Message(message), ctx, events, cancel)
            .await
    }

    /// Resumes a suspended call with decisions for its pending tool calls (by
    /// [`Suspension::id`](hame_core::Suspension::id)); the reply and the saved state are as
    /// for [`call_with`](Self::call_with).
    pub async fn resume(
        &self,
        resolutions: Vec<Resolution>,
        ctx: &RuntimeContext,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> Result<CallOutput> {
        self.call_input(CallInput::Resume(resolutions), ctx, events, cancel)
            .await
    }

    /// Runs one call on any [`CallInput`]: what [`call_with`](Self::call_with) and
    /// [`resume`](Self::resume) do for a message and for decisions.
    pub async fn call_input(
        &self,
        input: CallInput,
        ctx: &RuntimeContext,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> Result<CallOutput> {
        self.run_loop(&self.inner.agent_loop, input, ctx, None, events, cancel)
            .await
    }

    /// Runs a call of `agent_loop` (this agent's, or a subagent's built from it) on the
    /// session of `ctx`; `ws` is the handle when the caller has one already (a child shares
    /// its parent's), else it is made from `ctx`.
    pub(crate) async fn run_loop(
        &self,
        agent_loop: &AgentLoop,
        input: CallInput,
        ctx: &RuntimeContext,
        ws: Option<Workspace>,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> Result<CallOutput> {
        let key = self.key(ctx)?;
        // The ids are checked: make the handle directly (once per call).
        let ws = match ws {
            Some(ws) => ws,
            None => self
                .inner
                .tenancy
                .workspace(ctx)
                .map_err(|e| Error::InvalidId(e.to_string()))?,
        };
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
        // The caller's `<userId>/` folder is its own before the call writes anything there.
        self.inner
            .tenancy
            .register_user(ctx.user_id.as_deref())
            .await
            .map_err(|e| Error::storage("registering the user id failed", e))?;
        // ... and across processes and replicas behind the store's lease.
        let lease = match self.inner.state_store.acquire(&key, self.inner.lease).await {
            Ok(l) => Arc::new(l),
            Err(hame_state::Error::SessionBusy { .. }) => {
                return Err(Error::SessionBusy(ctx.session_id.clone()));
            }
            Err(e) => return Err(Error::storage("acquiring the session lease failed", e)),
        };
        let (result, unflushed) = self
            .run_leased(agent_loop, &key, &lease, input, ctx, &ws, events, cancel)
            .await;
        // The call's extensions (which held the lease for the session log) are gone.
        match Arc::try_unwrap(lease) {
            Ok(lease) => {
                if let Err(e) = lease.release().await {
                    tracing::warn!(error = %e, "releasing the session lease failed; it expires by itself");
                }
            }
            Err(_) => tracing::warn!("the session lease is still shared; it expires by itself"),
        }
        // The reply is durable: flush memory in the background, off the caller's path.
        if let (Ok(_), Some(layer)) = (&result, &self.inner.memory) {
            crate::memory::spawn_after_call(
                layer,
                self.inner.state_store.clone(),
                key,
                ws,
                self.inner.lease,
                unflushed,
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

    #[allow(clippy::too_many_arguments)]
    async fn run_leased(
        &self,
        agent_loop: &AgentLoop,
        key: &StateKey,
        lease: &Arc<hame_state::Lease>,
        input: CallInput,
        ctx: &RuntimeContext,
        ws: &Workspace,
        events: &EventSink,
        cancel: &CancellationToken,
    ) -> (Result<CallOutput>, u64) {
        let store = &self.inner.state_store;
        let loaded = store
            .load(key)
            .await
            .map_err(|e| Error::storage("loading session state failed", e));
        let (mut state, version) = match loaded {
            Ok(Some(s)) => (s.state, Some(s.version)),
            Ok(None) => (AgentState::default(), None),
            Err(e) => return (Err(e), 0),
        };
        // A durable run's calls carry its id and the claim's attempt in their call id, so
        // the records each attempt logs are known; a later attempt adopts those of the
        // attempts that logged and died before saving (docs/replicas.md).
        let run = crate::adopt::run_attempt(ctx);
        let adopted = match run {
            Some((run, attempt)) => {
                let saved = crate::adopt::saved_attempt(&state, run);
                if saved.saturating_add(1) < attempt {
                    let span = (saved, attempt);
                    let logged =
                        crate::adopt::logged_turn(ws, &self.inner.name, &ctx.session_id, run, span);
                    match logged.await {
                        Ok(a) => a,
                        Err(e) => return (Err(e), 0),
                    }
                } else {
                    None
                }
            }
            None => None,
        };
        let call_id = match run {
            Some((run, attempt)) => crate::adopt::call_id(run, attempt),
            None => uuid::Uuid::new_v4().to_string(),
        };
        let mut runtime = ctx.clone();
        runtime
            .extras
            .insert(CALL_ID_EXTRA.to_owned(), serde_json::Value::String(call_id));
        let input = match adopted {
            Some(a) => a.apply(&mut state, input),
            None => input,
        };
        let mut extensions = Extensions::new();
        extensions.insert(ws.clone());
        extensions.insert(Arc::new(crate::snapshot::StepSnapshot::new()));
        extensions.insert(crate::cost::prompt_cache_key(key));
        // `gen_ai.agent.name` of the call's `invoke_agent` span.
        extensions.insert(hame_core::telemetry::AgentName(self.inner.name.clone()));
        // The agent's budgets, tightened by the caller's own (`BUDGET_EXTRA`).
        let budgets = match self.inner.budgets.for_call(&ctx.extras) {
            Ok(b) => b,
            Err(e) => return (Err(Error::Config(e)), 0),
        };
        // A user-day budget counts what the user's other sessions saved today.
        let others_today = if budgets.user_day.is_unlimited() {
            crate::cost::Spend::default()
        } else {
            match crate::cost::others_on(
                store.as_ref(),
                key,
                &crate::cost::today(),
                Some(&self.inner.day_spend),
            )
            .await
            {
                Ok(s) => s,
                Err(e) => {
                    return (
                        Err(Error::storage("reading the user's spend today failed", e)),
                        0,
                    );
                }
            }
        };
        let spend = Arc::new(crate::cost::CallSpend::new(others_today, budgets));
        extensions.insert_arc(spend.clone());
        // The session-log layer checks it before every durable write: a call whose lease was
        // lost (a renewal failed past its TTL, another replica took over) stops writing.
        extensions.insert_arc(lease.clone());
        // The subagent tools forward child progress to this call's events and cancel
        // children with it.
        // The results this call takes from its children are marked delivered after its
        // save, below.
        let deliveries = hame_subagent::Deliveries::default();
        extensions.insert(hame_subagent::ParentCall {
            events: events.clone(),
            cancel: cancel.clone(),
            inherit: Default::default(),
            deliveries: deliveries.clone(),
        });
        let outcome = {
            let env = CallEnv {
                runtime: &runtime,
                events,
                cancel,
                extensions: &extensions,
            };
            let run = crate::cost::metering(spend.clone(), async {
                agent_loop.run_env(&mut state, input, env).await
            });
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
        spend.save_side(&mut state);
        // The state is saved whether the call succeeded or not: the messages it holds are
        // already in the session log, and tool calls are always paired with results.
        // Fenced: refused if the lease was lost or taken over, so a stale holder never
        // overwrites its successor's state.
        // A durable run's id goes into the state it ran in, with the same fenced save, so a
        // worker that takes the run over after a crash sees that its turn already happened
        // (docs/replicas.md).
        if let Some((run, attempt)) = run {
            state.extensions.insert(
                RUNS_EXTENSION.to_owned(),
                crate::adopt::saved_marker(run, attempt),
            );
        }
        hame_core::failpoint("call.before-save");
        let saved = store
            .save_fenced(key, &state, version, lease)
            .await
            .map_err(|e| Error::storage("saving session state failed", e));
        hame_core::failpoint("call.saved");
        if saved.is_ok() {
            self.inner
                .day_spend
                .saved(key, |day| crate::cost::SpendRecord::of(&state).day(day));
        }
        // Durable before acknowledged: the children's results this call took are in its
        // log and its saved state; only now are their records marked delivered, under the
        // lease (a call that loses it leaves them to the next holder, which finds them in
        // the state). A failed save leaves them undelivered: the next call pushes them.
        if saved.is_ok() && !deliveries.is_empty() {
            self.inner
                .subagents
                .confirm_deliveries(ws, &deliveries, || lease.check().is_ok())
                .await;
        }
        hame_core::failpoint("call.delivered");
        // What the after-call memory flush would find, read here instead of loading the
        // state again.
        let unflushed = crate::memory::unflushed(&state);
        let result = match (outcome, saved) {
            (Ok(out), Ok(_)) => Ok(out),
            // The reply is in the log but not in the state: the caller must know.
            (Ok(_), Err(e)) => Err(e),
            (Err(e), Ok(_)) => Err(e.into()),
            // The call's own failure came first and is the one to report.
            (Err(e), Err(save)) => {
                tracing::warn!(error = %save, "saving the state of a failed call failed too");
                Err(e.into())
            }
        };
        (result, unflushed)
    }
}

/// The [`RuntimeContext::extras`] key of the durable run a call executes (a string, the
/// run id); the harness writes it into the saved state's [`RUNS_EXTENSION`].
pub const RUN_ID_EXTRA: &str = "hame.run_id";
/// The state extension `{"last": "<run id>", "attempt": n}`: the last durable run whose
/// turn was saved, and the attempt (the claim) that saved it.
pub const RUNS_EXTENSION: &str = "runs";
/// The [`RuntimeContext::extras`] key of a durable run's claim count (a number; 1 for its
/// first claim): above 1, the run was taken over from a worker that died, and the call
/// adopts what that worker logged of the turn but did not save.
pub const RUN_ATTEMPT_EXTRA: &str = "hame.run_attempt";

/// The declared user ids, each checked by the one id rule (a bad one is a configuration
/// error naming it).
fn validated_users(users: &[String]) -> Result<Vec<String>> {
    for u in users {
        validate_id("user id", u)?;
    }
    Ok(users.to_vec())
}
