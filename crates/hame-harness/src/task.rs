//! Task state (issue #33, `docs/evidence.md`): the session's **goal** (set by the caller),
//! its **requirements** — proposed by the model with `requirement_propose` as
//! `candidate`, `confirmed` only by the application or a person
//! ([`HarnessAgent::confirm_requirement`](crate::HarnessAgent::confirm_requirement),
//! `hame requirements confirm S ID`) — beside the todo list (progress) and the evidence.
//!
//! It is the `task` extension of the session state (so it survives compaction and
//! processes) and the `task` layer projects it into every model request as its own
//! section of the system prompt, not re-inferred from old messages. A confirmed requirement
//! that names a declared check makes that check required for every later call of the
//! session (the completion gate, [`crate::evidence`]).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hame_core::{
    CallCtx, CallInput, CallNext, CallOutput, Layer, ModelNext, ModelRequest, ModelResponse,
    RuntimeContext, Tool, ToolContext, ToolError, ToolOutput, TypedTool, codes, typed,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The state extension of the task state.
pub const STATE_KEY: &str = "task";
/// Runtime-context extra: the goal the caller sets for the session (`hame run --goal`).
pub const GOAL_EXTRA: &str = "hame.task.goal";
/// Most requirements of a session.
pub const MAX_REQUIREMENTS: usize = 50;
/// Longest requirement or goal, in characters.
pub const MAX_TEXT_CHARS: usize = 1000;

/// Whether a requirement binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequirementStatus {
    /// Proposed by the model; not enforced.
    Candidate,
    /// Confirmed by the application or a person; binding.
    Confirmed,
}

/// One requirement of the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirement {
    /// `rq-1`, `rq-2`, … in the order proposed.
    pub id: String,
    /// What must hold ("tests must pass on Java 17").
    pub text: String,
    /// A declared check that verifies it: required by the gate once confirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    /// Candidate or confirmed.
    pub status: RequirementStatus,
    /// When it was proposed.
    pub proposed: DateTime<Utc>,
    /// When it was confirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed: Option<DateTime<Utc>>,
}

/// The task state of a session (the [`STATE_KEY`] extension).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskState {
    /// The goal, as the caller set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<String>,
    /// The requirements, in the order proposed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<Requirement>,
}

impl TaskState {
    /// The task state of `state` (default when it has none or it cannot be read).
    pub fn of(state: &hame_core::AgentState) -> Self {
        state
            .extensions
            .get(STATE_KEY)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }

    /// The checks the confirmed requirements name.
    pub fn required_checks(&self) -> Vec<String> {
        self.requirements
            .iter()
            .filter(|r| r.status == RequirementStatus::Confirmed)
            .filter_map(|r| r.check.clone())
            .collect()
    }

    /// Confirms requirement `id`; `false` when there is none.
    pub fn confirm(&mut self, id: &str) -> bool {
        match self.requirements.iter_mut().find(|r| r.id == id) {
            Some(r) => {
                if r.status != RequirementStatus::Confirmed {
                    r.status = RequirementStatus::Confirmed;
                    r.confirmed = Some(Utc::now());
                }
                true
            }
            None => false,
        }
    }

    /// The section of the system prompt (`None` when there is nothing to say).
    pub fn render(&self, evidence: &[hame_core::Evidence]) -> Option<String> {
        if self.goal.is_none() && self.requirements.is_empty() && evidence.is_empty() {
            return None;
        }
        let mut s = String::from("\n\n# Task\n");
        if let Some(goal) = &self.goal {
            s.push_str(&format!("Goal: {goal}\n"));
        }
        s.push_str("Progress: the todo list (todo_write).\n");
        let (confirmed, candidates): (Vec<&Requirement>, Vec<&Requirement>) = self
            .requirements
            .iter()
            .partition(|r| r.status == RequirementStatus::Confirmed);
        if !confirmed.is_empty() {
            s.push_str("Requirements (confirmed; they bind you):\n");
            for r in confirmed {
                s.push_str(&line(r));
            }
        }
        if !candidates.is_empty() {
            s.push_str("Requirements you proposed (candidates; not binding until confirmed):\n");
            for r in candidates {
                s.push_str(&line(r));
            }
        }
        if !evidence.is_empty() {
            s.push_str("Evidence (as of the start of this call):\n");
            for e in evidence {
                s.push_str(&format!(
                    "- {}: {} ({}, version {})\n",
                    e.check,
                    match e.outcome {
                        hame_core::CheckOutcome::Passed => "passed",
                        hame_core::CheckOutcome::Failed => "failed",
                        hame_core::CheckOutcome::Error => "could not run",
                    },
                    e.id,
                    &e.version[..e.version.len().min(12)]
                ));
            }
        }
        Some(s)
    }
}

fn line(r: &Requirement) -> String {
    match &r.check {
        Some(c) => format!("- {}: {} (check `{c}`)\n", r.id, r.text),
        None => format!("- {}: {}\n", r.id, r.text),
    }
}

/// Sets the session's goal for a call (`hame run --goal`).
pub fn with_goal(ctx: RuntimeContext, goal: impl Into<String>) -> RuntimeContext {
    ctx.with_extra(GOAL_EXTRA, serde_json::Value::String(goal.into()))
}

fn clip(text: &str) -> String {
    text.trim().chars().take(MAX_TEXT_CHARS).collect()
}

/// The task state of the running call, shared by the layer and `requirement_propose`.
#[derive(Debug, Default)]
pub(crate) struct TaskCell {
    state: Mutex<TaskState>,
    evidence: Vec<hame_core::Evidence>,
    changed: std::sync::atomic::AtomicBool,
}

impl TaskCell {
    fn read<R>(&self, f: impl FnOnce(&TaskState) -> R) -> R {
        f(&self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    fn update<R>(&self, f: impl FnOnce(&mut TaskState) -> R) -> R {
        self.changed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        f(&mut self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// The `task` layer: the task state in and out of the call, and its section in every
/// request.
#[derive(Debug)]
pub struct TaskLayer {
    evidence: crate::evidence::EvidenceStore,
}

impl TaskLayer {
    pub(crate) fn new(evidence: crate::evidence::EvidenceStore) -> Self {
        Self { evidence }
    }
}

#[async_trait]
impl Layer for TaskLayer {
    fn name(&self) -> &str {
        "task"
    }

    async fn call(
        &self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
        next: CallNext<'_>,
    ) -> Result<CallOutput, hame_core::Error> {
        let mut task = TaskState::of(cx.state);
        let mut changed = false;
        if let Some(goal) = cx.runtime.extras.get(GOAL_EXTRA).and_then(|v| v.as_str()) {
            let goal = clip(goal);
            if !goal.is_empty() && task.goal.as_deref() != Some(goal.as_str()) {
                task.goal = Some(goal);
                changed = true;
            }
        }
        // The evidence as of the start of the call: one read, no hashing.
        let evidence = match cx.extensions.get::<hame_tools::Workspace>() {
            Some(ws) => self
                .evidence
                .recorded(cx.runtime, ws)
                .await
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let cell = Arc::new(TaskCell {
            state: Mutex::new(task),
            evidence,
            changed: std::sync::atomic::AtomicBool::new(changed),
        });
        let out = next.run_adding(cx, cell.clone(), input).await;
        if cell.changed.load(std::sync::atomic::Ordering::Relaxed) {
            let task = cell.read(Clone::clone);
            if let Err(e) = cx.state.set_extension(STATE_KEY, &task) {
                tracing::warn!(error = %e, "saving the task state failed");
            }
        }
        out
    }

    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        mut request: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse, hame_core::Error> {
        if let Some(cell) = cx.extensions.get::<TaskCell>()
            && let Some(section) = cell.read(|t| t.render(&cell.evidence))
        {
            request.system.push_str(&section);
        }
        next.run(cx, request).await
    }
}

/// Arguments of `requirement_propose`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProposeArgs {
    /// The requirement, one sentence ("must not publish to production").
    text: String,
    /// The declared check that verifies it, if one does.
    #[serde(default)]
    check: Option<String>,
}

#[derive(Debug)]
struct Propose {
    checks: Vec<String>,
}

#[async_trait]
impl TypedTool for Propose {
    type Args = ProposeArgs;
    fn name(&self) -> &str {
        "requirement_propose"
    }
    fn description(&self) -> String {
        let mut d = "Propose a requirement of the task that you inferred (\"must not publish to production\"). It stays a candidate, not binding, until the user or the application confirms it.".to_owned();
        if !self.checks.is_empty() {
            d.push_str(&format!(
                " Name the check that verifies it, if one does: {}.",
                self.checks.join(", ")
            ));
        }
        d
    }
    async fn run(&self, args: ProposeArgs, ctx: &ToolContext) -> ToolOutput {
        let cell = ctx
            .extensions
            .get_arc::<TaskCell>()
            .ok_or_else(|| ToolError::new(codes::FAILED, "the task state needs the task layer"))?;
        let text = clip(&args.text);
        if text.is_empty() {
            return Err(ToolError::invalid_arguments("text is empty"));
        }
        if let Some(c) = &args.check
            && !self.checks.contains(c)
        {
            return Err(ToolError::invalid_arguments(format!(
                "no check is named {c:?} (declared: {})",
                if self.checks.is_empty() {
                    "none".to_owned()
                } else {
                    self.checks.join(", ")
                }
            )));
        }
        let out = cell.update(|t| {
            if let Some(r) = t.requirements.iter().find(|r| r.text == text) {
                return Ok(format!(
                    "{} already says that ({}).",
                    r.id,
                    match r.status {
                        RequirementStatus::Candidate => "candidate",
                        RequirementStatus::Confirmed => "confirmed",
                    }
                ));
            }
            if t.requirements.len() >= MAX_REQUIREMENTS {
                return Err(ToolError::new(
                    codes::FAILED,
                    format!("the task has {MAX_REQUIREMENTS} requirements already"),
                ));
            }
            let id = format!("rq-{}", t.requirements.len() + 1);
            t.requirements.push(Requirement {
                id: id.clone(),
                text,
                check: args.check.clone(),
                status: RequirementStatus::Candidate,
                proposed: Utc::now(),
                confirmed: None,
            });
            Ok(format!(
                "Proposed {id} as a candidate: it binds once the user or the application confirms it."
            ))
        })?;
        Ok(out)
    }
}

/// The `requirement_propose` tool (its description lists the declared checks).
pub(crate) fn tools(checks: Vec<String>) -> Vec<Arc<dyn Tool>> {
    vec![typed(Propose { checks })]
}
