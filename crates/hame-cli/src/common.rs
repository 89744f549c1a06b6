//! The agent flags shared by `run`, `chat` (and later `serve`), and the agent they build.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use hame::{HarnessAgent, Model, RuntimeContext};

use crate::{ConfigError, secrets};

#[derive(Debug, Args)]
pub(crate) struct Common {
    /// Workspace directory [default: $HAME_WORKSPACE, else ./.hame/workspace]
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
    /// Model as provider:model, e.g. openai:gpt-4o-mini or anthropic:claude-sonnet-4-5 [default: $HAME_MODEL]
    #[arg(long)]
    model: Option<String>,
    /// Maximum reasoning steps per call, at least 1 [default: 50]
    #[arg(long, value_parser = at_least_one)]
    max_iterations: Option<usize>,
    /// Shared-store mode: tenant files live in this store (redis://..., s3://bucket/prefix)
    /// over the read-only workspace template; no shell tool.
    #[arg(long)]
    store: Option<String>,
    /// Isolated local mode: each tenant sees only its namespace on local disk over the
    /// read-only workspace template; no shell tool. For several untrusted tenants on one
    /// machine.
    #[arg(long, conflicts_with = "store")]
    isolated: bool,
    /// Which runtime data tenants share (isolated and store modes).
    #[arg(long, value_enum, default_value_t = Isolation::User)]
    isolation: Isolation,
    /// Where session state lives: a directory, redis://, postgres://, mysql:// [default: $HAME_STATE, else JSON files under $HAME_STATE_HOME or ~/.hame/state]
    #[arg(long)]
    state: Option<String>,
    /// Switch off memory and context management (compaction, offloading of large tool
    /// results, daily logs and MEMORY.md consolidation, the memory tools).
    #[arg(long)]
    no_memory: bool,
    /// The memory search index: a SQLite file, or postgres://... for an index shared by
    /// replicas [default: <workspace>/agents/<agent>/.memory-index.sqlite]
    #[arg(long)]
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

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum Isolation {
    Session,
    User,
    Agent,
    Global,
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

pub(crate) fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

pub(crate) async fn build(common: &Common) -> anyhow::Result<(HarnessAgent, RuntimeContext)> {
    build_agent(common, true).await
}

/// The agent of a command that never calls the model (`hame tasks`): a configured model is
/// used, else a stand-in that fails if asked.
pub(crate) async fn build_without_model(
    common: &Common,
) -> anyhow::Result<(HarnessAgent, RuntimeContext)> {
    build_agent(common, false).await
}

async fn build_agent(
    common: &Common,
    need_model: bool,
) -> anyhow::Result<(HarnessAgent, RuntimeContext)> {
    let spec = common.model.clone().or_else(|| env("HAME_MODEL"));
    let model: Arc<dyn Model> = match spec {
        Some(spec) => hame::model::open(&spec, &env).map_err(|e| ConfigError(e.to_string()))?,
        None if !need_model => Arc::new(NoModel),
        None => {
            return Err(ConfigError("no model configured: pass --model provider:model or set HAME_MODEL (e.g. openai:gpt-4o-mini)".into()).into());
        }
    };
    let mut builder = HarnessAgent::builder()
        .name(common.agent.clone())
        .model(model);
    builder = crate::tasks::configure(&common.subagents, builder);
    builder = crate::skills::configure(builder, &common.capabilities);
    if let Some(ws) = &common.workspace {
        builder = builder.workspace(ws.clone());
    }
    if let Some(n) = common.max_iterations {
        builder = builder.max_iterations(n);
    }
    builder = builder.isolation_scope(common.isolation.into());
    let memory = if common.no_memory {
        hame::harness::MemoryOptions::disabled()
    } else {
        let mut options = hame::harness::MemoryOptions::default();
        match common.memory_index.as_deref() {
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
    if let Some(url) = common.state.clone().or_else(|| env("HAME_STATE")) {
        let store = hame::state::open(&url).await.map_err(|e| {
            ConfigError(format!(
                "cannot open state store {}: {e} (check --state / HAME_STATE)",
                hame::state::redact_url(&url)
            ))
        })?;
        builder = builder.state_store(store);
        if !url.contains("://") {
            // A JSON state directory inside the workspace is never shown to the tools.
            builder = builder.hide_path(PathBuf::from(&url));
        }
    }
    if common.isolated {
        builder = builder.filesystem(hame::FilesystemMode::IsolatedLocal);
    }
    if let Some(url) = &common.store {
        let store = hame::fs::remote::open(url, "hame").await.map_err(|e| {
            ConfigError(format!(
                "cannot open shared store {}: {e} (check --store)",
                hame::state::redact_url(url)
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
    let ctx = crate::approve::with_plan(ctx, &common.plan);
    hame::harness::validate_id("session id", &ctx.session_id)
        .map_err(|e| ConfigError(e.to_string()))?;
    if let Some(u) = &ctx.user_id {
        hame::harness::validate_id("user id", u).map_err(|e| ConfigError(e.to_string()))?;
    }
    if need_model {
        crate::skills::check(&agent, &ctx).await?;
    }
    // Every credential has been read: keep them from the shell's commands.
    let sealed = secrets::seal();
    tracing::debug!(
        non_dumpable = sealed.non_dumpable,
        scrubbed = sealed.scrubbed,
        "secrets sealed"
    );
    Ok((agent, ctx))
}

/// The model of a command that never calls one.
#[derive(Debug)]
struct NoModel;

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

/// A count that must be at least 1 (checked when the flags are parsed: exit 2).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
