//! The harness side of subagents: the runner that builds a child's loop from the parent's
//! model, tools and layers, and the task API of [`HarnessAgent`].

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use hame_core::{AgentLoop, CallInput, Message, Model, RuntimeContext};
use hame_subagent::{
    ChildReply, ChildRun, Declaration, GENERAL_PURPOSE, SUBAGENT_TOOLS, SpecSandbox, SpecSource,
    SubagentRunner, SubagentSpec, TaskRecord,
};

use crate::agent::{HarnessAgent, Inner};
use crate::error::{Error, Result};

/// The built-in `general-purpose` declaration: this agent's base prompt and all its tools.
pub(crate) fn general_purpose(base_prompt: &str) -> Declaration {
    let mut spec = SubagentSpec::new(
        GENERAL_PURPOSE,
        "General-purpose subagent with the same tools as you: research, multi-step work, anything you can do yourself but want done in a separate context.",
        base_prompt,
    );
    spec.source = SpecSource::Builtin;
    spec.into()
}

/// What every child's system prompt ends with.
fn child_context(spec: &SubagentSpec) -> String {
    format!(
        "\n\n## Subagent context\nYou are the subagent `{}`, working on one task for another agent. No user will answer questions: decide for yourself and finish the task. Your final message is your report to that agent: make it complete and self-contained.",
        spec.id
    )
}

/// Runs children as calls of the same agent on their own sessions, with a loop built from
/// the parent's: the spec's prompt, model, step limit and tool allowlist; every layer of
/// the parent (so permissions, plan mode, audit and budgets reach children).
#[derive(Debug)]
pub(crate) struct HarnessRunner {
    inner: Weak<Inner>,
}

impl HarnessRunner {
    pub(crate) fn new(inner: &Arc<Inner>) -> Self {
        Self {
            inner: Arc::downgrade(inner),
        }
    }
}

#[async_trait]
impl SubagentRunner for HarnessRunner {
    async fn run(&self, run: ChildRun) -> std::result::Result<ChildReply, String> {
        let inner = self
            .inner
            .upgrade()
            .ok_or_else(|| "the agent that spawned it is gone".to_owned())?;
        let agent = HarnessAgent { inner };
        let child = agent.child_loop(&run.spec, run.may_spawn)?;
        let (workspace, runtime) = child_sandbox(&agent.inner.tenancy, &run)?;
        let out = agent
            .run_loop(
                &child,
                CallInput::Message(Message::user(run.message)),
                &runtime,
                Some(workspace),
                &run.events,
                &run.cancel,
            )
            .await
            .map_err(|e| child_error(&e))?;
        Ok(ChildReply {
            text: out.reply.text_content(),
            iterations: out.iterations,
            usage: out.usage,
        })
    }
}

/// The handle and context of a child in sandbox mode: `sandbox: own` gives it the sandbox
/// of its own session (named in [`crate::sandbox::SANDBOX_KEY_EXTRA`], so the `sandbox`
/// layer begins and ends it around the child's call); `shared` (the default) keeps the
/// parent's (and drops a key inherited from an `own` parent: that sandbox is its
/// parent's, begun by the parent's call).
fn child_sandbox(
    tenancy: &crate::tenancy::Tenancy,
    run: &ChildRun,
) -> std::result::Result<(hame_tools::Workspace, RuntimeContext), String> {
    let mut runtime = run.runtime.clone();
    runtime.extras.remove(crate::sandbox::SANDBOX_KEY_EXTRA);
    let (SpecSandbox::Own, Some(sandboxes)) = (run.spec.sandbox, tenancy.sandboxes()) else {
        return Ok((run.workspace.clone(), runtime));
    };
    let ws = &run.workspace;
    let id = ws.identity();
    let key = hame_fs::Namespace::derive(
        &id.agent,
        id.user.as_deref(),
        &id.session,
        hame_fs::Scope::Session,
    )
    .map_err(|e| e.to_string())?
    .path()
    .as_str()
    .to_owned();
    let sandbox = sandboxes.scope(&key);
    let files: Arc<dyn hame_fs::Filesystem> = sandbox.clone();
    let exec: Arc<dyn hame_fs::Execute> = sandbox;
    let mut own = hame_tools::Workspace::new(id.clone(), ws.mode(), files, ws.records().clone())
        .with_home(ws.home().clone(), hame_fs::FsPath::root())
        .with_exec(exec);
    if let Some(o) = ws.overrides() {
        own = own.with_overrides(o.clone());
    }
    runtime.extras.insert(
        crate::sandbox::SANDBOX_KEY_EXTRA.to_owned(),
        serde_json::Value::String(key),
    );
    Ok((own, runtime))
}

/// A child's failure as its parent reads it.
fn child_error(e: &Error) -> String {
    match e {
        Error::Call(hame_core::Error::MaxIterations { limit }) => {
            format!("it reached its step limit ({limit} steps) without a final answer")
        }
        Error::Call(hame_core::Error::Cancelled) => "it was cancelled".into(),
        Error::Call(hame_core::Error::Suspended(s)) => format!(
            "it stopped waiting for a decision on {} tool call(s); approve or deny them in its session",
            s.calls.len()
        ),
        other => other.to_string(),
    }
}

impl HarnessAgent {
    /// The loop of a child: the parent's layers, the spec's model (or the parent's), its
    /// prompt, its step limit, and the parent's tools filtered by the spec's allowlist —
    /// never the subagent tools when the child may not spawn.
    pub(crate) fn child_loop(
        &self,
        spec: &SubagentSpec,
        may_spawn: bool,
    ) -> std::result::Result<AgentLoop, String> {
        let parent = &self.inner.agent_loop;
        let model = match &spec.model {
            None => parent.model().clone(),
            Some(name) => self.child_model(name)?,
        };
        let mut tools = parent.tools().clone();
        let names: Vec<String> = tools
            .names()
            .into_iter()
            .filter(|n| may_spawn || !SUBAGENT_TOOLS.contains(&n.as_str()))
            .filter(|n| {
                spec.tools
                    .as_ref()
                    .is_none_or(|allow| allow.iter().any(|a| a == n))
            })
            .collect();
        // A tool the spec names is offered to the child, deferred or not.
        for n in spec.tools.iter().flatten() {
            tools.undefer(n);
        }
        tools.set_allow(Some(names));
        let mut config = parent.config().clone();
        config.system_prompt = format!("{}{}", spec.prompt, child_context(spec));
        if let Some(n) = spec.max_iterations {
            config.max_iterations = n;
        }
        let mut child = AgentLoop::new(model).with_tools(tools).with_config(config);
        for layer in parent.layers() {
            child = child.with_layer(layer.clone());
        }
        Ok(child)
    }

    fn child_model(&self, name: &str) -> std::result::Result<Arc<dyn Model>, String> {
        if let Some(m) = self
            .inner
            .child_models
            .lock()
            .ok()
            .and_then(|c| c.get(name).cloned())
        {
            return Ok(m);
        }
        let resolver = self.inner.model_resolver.as_ref().ok_or_else(|| {
            format!("its spec names the model `{name}`, but this agent has no model resolver (builder.model_resolver)")
        })?;
        let model =
            (resolver.0)(name).map_err(|e| format!("cannot open its model `{name}`: {e}"))?;
        if let Ok(mut c) = self.inner.child_models.lock() {
            c.insert(name.to_owned(), model.clone());
        }
        Ok(model)
    }

    /// The subagent runtime (declarations, live tasks, limits).
    pub fn subagents(&self) -> &Arc<hame_subagent::Subagents> {
        &self.inner.subagents
    }

    /// The task records of a caller's session, oldest first; records left `pending` or
    /// `running` by a process that is gone are marked `failed` (interrupted) first.
    pub async fn tasks(&self, ctx: &RuntimeContext) -> Result<Vec<TaskRecord>> {
        let ws = self.workspace_for(ctx)?;
        self.inner
            .subagents
            .sweep(&ws)
            .await
            .map_err(|e| Error::storage("reading task records failed", e))
    }

    /// Sends this agent's background subagent tasks through `queue` (the deployment's run
    /// queue: `hame serve`, `hame worker`): any worker of the agent runs them, and another
    /// takes a task over when its worker dies ([`run_task`](Self::run_task)). In sandbox
    /// mode a `sandbox: shared` child stays in the spawning process (it works in the
    /// parent's sandbox). Only the first call counts; without it a background task runs in
    /// the process that spawned it.
    pub fn use_run_queue(&self, queue: Arc<dyn hame_state::runs::RunQueue>) {
        self.inner.subagents.set_queue(hame_subagent::TaskQueue {
            queue,
            keep_shared_sandbox_local: self.inner.tenancy.sandboxes().is_some(),
        });
    }

    /// Runs the queued background task `task_id` of the parent session of `ctx` (session
    /// and user are the parent's) as run `run_id`: what a worker does with a claimed
    /// [`hame_state::runs::RunInput::SubagentTask`] run. `cancel` ends it `cancelled`,
    /// `abort` (a worker shutting down) `failed`; the record as it ended is returned
    /// ([`hame_subagent::Subagents::run_queued`]).
    pub async fn run_task(
        &self,
        ctx: &RuntimeContext,
        run_id: &str,
        task_id: &str,
        inherit: std::collections::BTreeMap<String, serde_json::Value>,
        cancel: &hame_core::CancellationToken,
        abort: &hame_core::CancellationToken,
    ) -> Result<TaskRecord> {
        let ws = self.workspace_for(ctx)?;
        self.inner
            .subagents
            .run_queued(&ws, run_id, task_id, inherit, cancel, abort)
            .await
            .map_err(|e| match e {
                hame_subagent::Error::Storage(_) => {
                    Error::storage("running a queued task failed", e)
                }
                other => Error::Config(other.to_string()),
            })
    }

    /// Background tasks this process runs that have not finished.
    pub fn running_tasks(&self) -> usize {
        self.inner.subagents.running()
    }

    /// Waits up to `timeout` for this process's background tasks; returns how many still
    /// run.
    pub async fn wait_tasks(&self, timeout: Duration) -> usize {
        self.inner.subagents.wait_idle(timeout).await
    }

    /// Stops this process's unfinished tasks and records them `failed` with `reason` (a
    /// process about to exit). Returns how many were stopped.
    pub async fn interrupt_tasks(&self, reason: &str) -> usize {
        self.inner
            .subagents
            .interrupt_all(reason, Duration::from_secs(10))
            .await
    }
}
