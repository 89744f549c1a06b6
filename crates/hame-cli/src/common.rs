//! The agent flags shared by `run`, `chat`, `serve` and the commands that inspect or decide,
//! and the agent they build.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use hame::{HarnessAgent, Model, RuntimeContext};

use crate::{ConfigError, secrets};

#[derive(Debug, Args)]
pub(crate) struct Common {
    /// Workspace directory; must exist (create one with `hame init DIR`) [default: $HAME_WORKSPACE, else ./.hame/workspace]
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// Agent id.
    #[arg(long, default_value = "hame")]
    agent: String,
    /// User id.
    #[arg(long)]
    user: Option<String>,
    /// Session id.
    #[arg(long, default_value = "default")]
    session: String,
    /// Model as provider:model, e.g. openai:gpt-4o-mini or anthropic:claude-sonnet-4-5 [default: $HAME_MODEL, else hame.toml]
    #[arg(long)]
    model: Option<String>,
    /// The model provider's endpoint [default: $OPENAI_BASE_URL / $ANTHROPIC_BASE_URL, else hame.toml `base_url`, else the provider's]
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// What tools may do without a decision (docs/permissions.md): default (tools.json's
    /// rules, else allow), ask (tools that change something ask; what `hame init` writes),
    /// accept-edits (file edits run, the shell asks), plan (plan mode, as --plan),
    /// read-only (tools that change something are denied), bypass (all but deny rules)
    /// [default: $HAME_PERMISSION_MODE, else `permission_mode` of hame.toml, else default]
    #[arg(long, value_enum, value_name = "MODE")]
    permission_mode: Option<PermissionMode>,
    /// Longest wait, in seconds, for the model's response to begin (connecting and
    /// retries included): a server that says nothing fails after it [default:
    /// $HAME_MODEL_TIMEOUT, else `model_timeout` of hame.toml, else 25]
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    model_timeout: Option<f64>,
    /// Longest wait, in seconds, for a connection to the model's endpoint [default:
    /// $HAME_MODEL_CONNECT_TIMEOUT, else `model_connect_timeout` of hame.toml, else 10]
    #[arg(long, value_name = "SECONDS", value_parser = seconds, help_heading = "Model and limits")]
    model_connect_timeout: Option<f64>,
    /// Maximum reasoning steps per call, at least 1 [default: 50, or limits.max_iterations of hame.toml]
    #[arg(long, value_parser = at_least_one, help_heading = "Model and limits")]
    max_iterations: Option<usize>,
    /// The model's context window in tokens, for compaction and offloading budgets (the
    /// token trigger is 80 % of it or window − 20,000, whichever is larger) [default:
    /// $HAME_CONTEXT_WINDOW, else limits.context_window of hame.toml, else the model's
    /// known window (128,000 for unknown models)]
    #[arg(long, value_name = "TOKENS", help_heading = "Model and limits")]
    context_window: Option<u64>,
    /// A spending limit, SCOPE.LIMIT=N, repeatable: SCOPE run, session or user_day (UTC),
    /// LIMIT usd, tokens, input_tokens or output_tokens; a bare number is run.usd. Over a
    /// limit the call stops before its next model request (exit 6) [default: [budget] of
    /// hame.toml, else none; docs/cost.md]
    #[arg(long, value_name = "SCOPE.LIMIT=N", value_parser = budget_spec, help_heading = "Model and limits")]
    budget: Vec<String>,
    /// Shared-store mode: tenant files live in this store (redis://..., s3://bucket/prefix)
    /// over the read-only workspace template; no shell tool; see docs/backends.md [default:
    /// $HAME_STORE, else `store` of hame.toml]
    #[arg(long, help_heading = "Modes and state")]
    store: Option<String>,
    /// Isolated local mode: each tenant sees only its namespace on local disk over the
    /// read-only workspace template; no shell tool. For several untrusted tenants on one
    /// machine.
    #[arg(long, conflicts_with = "store", help_heading = "Modes and state")]
    isolated: bool,
    /// Which runtime data tenants share (isolated and store modes) [default: $HAME_ISOLATION, else `isolation` of hame.toml, else user]
    #[arg(long, value_enum, help_heading = "Modes and state")]
    isolation: Option<Isolation>,
    /// Where session state lives: a directory, redis://, postgres://, mysql:// [default: $HAME_STATE, else `state` of hame.toml, else JSON files under $HAME_STATE_HOME or ~/.hame/state]
    #[arg(long, help_heading = "Modes and state")]
    state: Option<String>,
    /// Switch off memory and context management (compaction, offloading of large tool
    /// results, daily logs and MEMORY.md consolidation, the memory tools).
    #[arg(long, help_heading = "Memory")]
    no_memory: bool,
    /// The memory search index: a SQLite file, or postgres://... for an index shared by
    /// replicas [default: $HAME_MEMORY_INDEX, else `memory.index` of hame.toml, else
    /// <workspace>/agents/<agent>/.memory-index.sqlite]
    #[arg(long, help_heading = "Memory")]
    memory_index: Option<String>,
    #[command(flatten)]
    pub(crate) plan: crate::approve::PlanArgs,
    #[command(flatten)]
    sandbox: crate::sandbox::SandboxArgs,
    #[command(flatten)]
    pub(crate) subagents: crate::tasks::SubagentArgs,
    #[command(flatten)]
    pub(crate) capabilities: crate::skills::CapabilityArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Isolation {
    Session,
    User,
    Agent,
    Global,
}

impl Isolation {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Isolation::Session => "session",
            Isolation::User => "user",
            Isolation::Agent => "agent",
            Isolation::Global => "global",
        }
    }
}

/// `--permission-mode`: a permission mode of the harness, or plan mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum PermissionMode {
    Default,
    Ask,
    AcceptEdits,
    Plan,
    ReadOnly,
    Bypass,
}

impl PermissionMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PermissionMode::Default => "default",
            PermissionMode::Ask => "ask",
            PermissionMode::AcceptEdits => "accept-edits",
            PermissionMode::Plan => "plan",
            PermissionMode::ReadOnly => "read-only",
            PermissionMode::Bypass => "bypass",
        }
    }

    /// The harness's mode (`plan` is plan mode of the session over the default mode).
    fn harness_mode(self) -> hame::harness::permissions::Mode {
        use hame::harness::permissions::Mode;
        match self {
            PermissionMode::Default | PermissionMode::Plan => Mode::Default,
            PermissionMode::Ask => Mode::Ask,
            PermissionMode::AcceptEdits => Mode::AcceptEdits,
            PermissionMode::ReadOnly => Mode::ReadOnly,
            PermissionMode::Bypass => Mode::Bypass,
        }
    }
}

/// The configurable flags of [`Common`], as given on the command line (`None`: not given).
pub(crate) struct Flags {
    pub(crate) workspace: Option<PathBuf>,
    pub(crate) model: Option<String>,
    pub(crate) base_url: Option<String>,
    pub(crate) permission_mode: Option<PermissionMode>,
    pub(crate) model_timeout: Option<f64>,
    pub(crate) model_connect_timeout: Option<f64>,
    pub(crate) state: Option<String>,
    pub(crate) store: Option<String>,
    pub(crate) isolation: Option<Isolation>,
    pub(crate) isolated: bool,
    pub(crate) no_memory: bool,
    pub(crate) memory_index: Option<String>,
    pub(crate) max_iterations: Option<usize>,
    pub(crate) context_window: Option<u64>,
    pub(crate) budget: Vec<String>,
    pub(crate) subagent_depth: Option<usize>,
    pub(crate) task_wait: Option<u64>,
}

impl Common {
    /// `hame replay`: memory off (a compaction or flush would ask the model for text the
    /// recording does not hold).
    pub(crate) fn replay_settings(&mut self) {
        self.no_memory = true;
    }

    /// The configurable flags as given.
    pub(crate) fn flags(&self) -> Flags {
        Flags {
            workspace: self.workspace.clone(),
            model: self.model.clone(),
            base_url: self.base_url.clone(),
            permission_mode: self.permission_mode,
            model_timeout: self.model_timeout,
            model_connect_timeout: self.model_connect_timeout,
            state: self.state.clone(),
            store: self.store.clone(),
            isolation: self.isolation,
            isolated: self.isolated,
            no_memory: self.no_memory,
            memory_index: self.memory_index.clone(),
            max_iterations: self.max_iterations,
            context_window: self.context_window,
            budget: self.budget.clone(),
            subagent_depth: self.subagents.subagent_depth,
            task_wait: self.subagents.task_wait,
        }
    }
}

impl From<Isolation> for hame::fs::Scope {
    fn from(i: Isolation) -> Self {
        match i {
            Isolation::Session => hame::fs::Scope::Session,
            Isolation::User => hame::fs::Scope::User,
            Isolation::Agent => hame::fs::Scope::Agent,
            Isolation::Global => hame::fs::Scope::Global,
        }
    }
}

impl Common {
    /// Local mode: the file tools and the shell work on the workspace itself, with the
    /// host user's rights (no --isolated, no --store).
    pub(crate) fn is_local_mode(&self) -> bool {
        !self.isolated && self.store.is_none()
    }
}

/// The process environment as it was before the first [`secrets::seal`] blanked its
/// secret values: every later read (a second agent of `hame serve`, the `${VAR}` of
/// tools.json, a remote subagent's `a2a_auth_env`) reads this copy.
static START_ENV: std::sync::LazyLock<std::collections::HashMap<String, String>> =
    std::sync::LazyLock::new(|| std::env::vars().collect());

/// Takes the start-up copy of the environment now (before the first seal).
pub(crate) fn keep_start_env() {
    std::sync::LazyLock::force(&START_ENV);
}

/// A variable of the start-up environment ([`START_ENV`]); blank values count as unset.
pub(crate) fn env(key: &str) -> Option<String> {
    START_ENV.get(key).filter(|v| !v.trim().is_empty()).cloned()
}

pub(crate) async fn build(common: &Common) -> anyhow::Result<(HarnessAgent, RuntimeContext)> {
    build_agent(common, &crate::config::resolve(common)?, true, None).await
}

/// [`build`] from a configuration the caller has resolved already (`hame serve` reads it
/// for the shared-events URL first).
pub(crate) async fn build_resolved(
    common: &Common,
    config: &crate::config::Effective,
) -> anyhow::Result<(HarnessAgent, RuntimeContext)> {
    build_agent(common, config, true, None).await
}

/// The agent `name` of `hame serve --agent NAME=DIR`: the common flags with the workspace
/// `dir` (and that workspace's `hame.toml`).
pub(crate) async fn build_named(
    common: &Common,
    name: &str,
    flags: Flags,
) -> anyhow::Result<HarnessAgent> {
    let config = crate::config::resolve_flags(flags)?;
    let (agent, _) = build_agent_as(common, &config, true, None, Some(name)).await?;
    Ok(agent)
}

/// Wraps the configured model before the agent is built (`hame chat`'s switchable model).
pub(crate) type ModelHook = Box<dyn FnOnce(Arc<dyn Model>) -> Arc<dyn Model> + Send>;

/// [`build`] with a hook on the model.
pub(crate) async fn build_with(
    common: &Common,
    need_model: bool,
    hook: Option<ModelHook>,
) -> anyhow::Result<(HarnessAgent, RuntimeContext)> {
    build_agent(common, &crate::config::resolve(common)?, need_model, hook).await
}

/// The agent of a command that never calls the model (`hame tasks`): a configured model is
/// used, else a stand-in that fails if asked.
pub(crate) async fn build_without_model(
    common: &Common,
) -> anyhow::Result<(HarnessAgent, RuntimeContext)> {
    build_agent(common, &crate::config::resolve(common)?, false, None).await
}

async fn build_agent(
    common: &Common,
    config: &crate::config::Effective,
    need_model: bool,
    hook: Option<ModelHook>,
) -> anyhow::Result<(HarnessAgent, RuntimeContext)> {
    build_agent_as(common, config, need_model, hook, None).await
}

/// [`build_agent`], named `name` instead of `--agent`.
async fn build_agent_as(
    common: &Common,
    config: &crate::config::Effective,
    need_model: bool,
    hook: Option<ModelHook>,
    name: Option<&str>,
) -> anyhow::Result<(HarnessAgent, RuntimeContext)> {
    check_workspace(config)?;
    // The store URLs given by flag or file: their passwords are secrets too.
    for url in [
        &config.state.value,
        &config.store.value,
        &config.memory_index.value,
    ]
    .into_iter()
    .flatten()
    {
        hame::secrets::add_url(url);
    }
    let model_env = config.model_env();
    let model: Arc<dyn Model> = match &config.model.value {
        Some(spec) if need_model => {
            hame::model::open(spec, &model_env).map_err(|e| ConfigError(e.to_string()))?
        }
        // A command that does not call the model (`hame sessions`, `hame replay`) works
        // without a key.
        Some(spec) => hame::model::open(spec, &model_env).unwrap_or_else(|e| {
            tracing::debug!(error = %e, "the configured model is not used");
            Arc::new(NoModel)
        }),
        None if !need_model => Arc::new(NoModel),
        None => {
            return Err(ConfigError("no model configured: pass --model provider:model, set HAME_MODEL or `model` in hame.toml (e.g. openai:gpt-4o-mini)".into()).into());
        }
    };
    let model = match hook {
        Some(hook) => hook(model),
        None => model,
    };
    let mut builder = HarnessAgent::builder()
        .env(hame::EnvLookup(Arc::new(env)))
        .name(name.map_or_else(|| common.agent.clone(), str::to_owned))
        .model(model);
    builder = crate::tasks::configure(&common.subagents, config, builder);
    builder = crate::skills::configure(builder, &common.capabilities, config)?;
    builder = builder.workspace(config.workspace.value.clone());
    builder = builder.max_iterations(config.max_iterations.value);
    builder = builder.users(config.users.value.clone());
    builder = builder.isolation_scope(config.isolation.value.into());
    builder = builder.permission_mode(config.permission_mode.value.harness_mode());
    builder = builder
        .budgets(config.budgets)
        .prices(config.prices.clone());
    for v in &config.verifiers {
        builder = builder.verifier(v.clone());
    }
    let memory = if !config.memory.value {
        hame::harness::MemoryOptions::disabled()
    } else {
        let mut options = hame::harness::MemoryOptions {
            context_window: config.context_window.value,
            ..hame::harness::MemoryOptions::default()
        };
        match config.memory_index.value.as_deref() {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                let index =
                    hame::memory::PgIndex::connect(url, hame::memory::PgIndexOptions::default())
                        .await
                        .map_err(|e| {
                            ConfigError(format!(
                                "cannot open the memory index {}: {e} (check --memory-index)",
                                hame::state::redact_url(url)
                            ))
                        })?;
                options.index = Some(std::sync::Arc::new(index));
            }
            // Opened now, so a file that is not a hame index is refused before anything
            // runs (exit 2), and never overwritten.
            Some(path) => {
                let index = hame::memory::SqliteIndex::open(path)
                    .await
                    .map_err(|e| ConfigError(format!("{e} (check --memory-index)")))?;
                options.index = Some(std::sync::Arc::new(index));
            }
            None => {}
        }
        options
    };
    builder = builder.memory(memory);
    if let Some(url) = config.state.value.clone() {
        let store = hame::state::open(&url).await.map_err(|e| {
            ConfigError(format!(
                "cannot open state store {}: {e} (check {})",
                hame::state::redact_url(&url),
                config.state.source
            ))
        })?;
        builder = builder.state_store(store);
        if !url.contains("://") {
            // A JSON state directory inside the workspace is never shown to the tools.
            builder = builder.hide_path(PathBuf::from(&url));
        }
    }
    if config.isolated.value {
        builder = builder.filesystem(hame::FilesystemMode::IsolatedLocal);
    }
    if let Some(url) = &config.store.value {
        let store = hame::fs::remote::open(url, "hame").await.map_err(|e| {
            ConfigError(format!(
                "cannot open shared store {}: {e} (check {})",
                hame::state::redact_url(url),
                config.store.source
            ))
        })?;
        builder = builder.filesystem(hame::FilesystemMode::SharedStore { store });
    }
    builder = crate::sandbox::apply(&common.sandbox, builder).await?;
    let agent = builder.build().map_err(|e| {
        if e.is_config() {
            anyhow::Error::new(ConfigError(e.to_string()))
        } else {
            anyhow::Error::new(e)
        }
    })?;
    let mut ctx = RuntimeContext::new(common.session.clone());
    if let Some(u) = &common.user {
        ctx = ctx.with_user(u.clone());
    }
    let plan = common.plan.plan || config.permission_mode.value == PermissionMode::Plan;
    let ctx = crate::approve::with_plan(ctx, plan);
    hame::harness::validate_id("session id", &ctx.session_id)
        .map_err(|e| ConfigError(e.to_string()))?;
    if let Some(u) = &ctx.user_id {
        hame::harness::validate_id("user id", u).map_err(|e| ConfigError(e.to_string()))?;
    }
    if need_model {
        crate::skills::check(&agent, &ctx).await?;
    }
    // Every credential has been read: keep them from the shell's commands.
    keep_start_env();
    let sealed = secrets::seal();
    tracing::debug!(
        non_dumpable = sealed.non_dumpable,
        scrubbed = sealed.scrubbed,
        "secrets sealed"
    );
    Ok((agent, ctx))
}

/// A workspace named by --workspace or HAME_WORKSPACE must exist (a typo is not silently
/// made into an empty workspace); the default `./.hame/workspace` is created on first use,
/// with a note.
fn check_workspace(config: &crate::config::Effective) -> anyhow::Result<()> {
    let ws = &config.workspace.value;
    if ws.is_dir() {
        return Ok(());
    }
    if ws.exists() {
        return Err(ConfigError(format!(
            "workspace {} is not a directory (from {})",
            ws.display(),
            config.workspace.source
        ))
        .into());
    }
    match config.workspace.source {
        crate::config::Source::Default => {
            eprintln!(
                "hame: note: creating the default workspace {} (empty; `hame init` makes a starter one)",
                ws.display()
            );
            Ok(())
        }
        ref source => Err(ConfigError(format!(
            "workspace {} does not exist (from {source}); create it with `hame init {}`",
            ws.display(),
            ws.display()
        ))
        .into()),
    }
}

/// The model of a command that never calls one.
#[derive(Debug)]
pub(crate) struct NoModel;

#[async_trait::async_trait]
impl Model for NoModel {
    fn info(&self) -> hame::ModelInfo {
        hame::ModelInfo {
            provider: "none".into(),
            model: "none".into(),
            context_window: 128_000,
        }
    }

    async fn stream(
        &self,
        _request: hame::ModelRequest,
    ) -> Result<hame::ModelStream, hame::ModelError> {
        Err(hame::ModelError::Config(
            "no model configured: pass --model provider:model or set HAME_MODEL".into(),
        ))
    }
}

/// A number of seconds above 0 and at most a day (checked when the flags are parsed: exit 2).
pub(crate) fn seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(v),
        Ok(_) => Err("must be more than 0 and at most 86400 seconds".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A count that must be at least 1 (checked when the flags are parsed: exit 2).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// One `--budget SCOPE.LIMIT=N` (checked when the flags are parsed: exit 2).
fn budget_spec(s: &str) -> Result<String, String> {
    hame::harness::cost::Budgets::default().set(s)?;
    Ok(s.to_owned())
}
