//! Permissions (allow / ask / deny with durable human approval), plan mode and the todo
//! list: one layer, `permissions`, that every tool call passes (built-ins, MCP tools,
//! subagent tools, skills), and the tools `plan_enter`, `plan_write`, `plan_exit`,
//! `todo_write` (ADR 0011, `docs/permissions.md`).
//!
//! The layer sits inside the user's inner layers and outside `tools-config`, so it sees
//! MCP calls before they are dispatched; children run with every parent layer, and the
//! layer hands its plan mode and deny rules to them (`hame.inherit.permissions`).

pub mod decide;
mod tools;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hame_core::{
    AgentEvent, CallCtx, CallInput, CallNext, CallOutput, Layer, ModelNext, ModelRequest,
    ModelResponse, Suspension, ToolCall, ToolContext, ToolCtx, ToolError, ToolNext, ToolOutcome,
    codes,
};
use hame_tools::Workspace;
use serde::{Deserialize, Serialize};

use crate::tools_config::{PermissionRule, Permissions};
use crate::tools_layer::ToolsConfigLayer;
pub use decide::{BUILTIN_EFFECTS, Effect, Mode, Outcome, Verdict};
pub use tools::{MAX_TODOS, PLAN_FILE, Todo, TodoStatus, plan_tools};

/// The layer's name (suspensions by it are decided with `{"approve": bool}`).
pub const LAYER: &str = "permissions";
/// The state extension that holds a session's plan mode, todo list, "always allow"
/// answers and its recent decisions.
pub const STATE_KEY: &str = "permissions";
/// Runtime-context extra: `true` enters plan mode at the start of the call (`hame run
/// --plan`).
pub const PLAN_EXTRA: &str = "hame.permissions.enter_plan";
/// Runtime-context extra a child gets from its parent: `{"plan_mode": bool, "deny":
/// [rule]}`.
pub const INHERIT_EXTRA: &str = "hame.inherit.permissions";
/// Event kind of every decision (`AgentEvent::Custom`): tool, argument, rule, outcome, by.
pub const DECIDED_EVENT: &str = "permission_decided";
/// Decisions kept in the session state (the oldest are dropped).
pub const MAX_RECORDED_DECISIONS: usize = 200;

/// One decision, as recorded in the state and sent as a [`DECIDED_EVENT`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// When (RFC 3339).
    pub time: String,
    /// The tool.
    pub tool: String,
    /// Its main argument, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argument: Option<String>,
    /// What decided: `deny execute(rm *)`, `plan mode`, `default allow`, `human`.
    pub rule: String,
    /// `allow`, `ask` or `deny`.
    pub outcome: Outcome,
    /// `policy` or `human`.
    pub by: String,
    /// The approval id when a human decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
}

/// A session's permission state (the `permissions` state extension).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionPermissions {
    /// Whether the session is in plan mode.
    #[serde(default)]
    pub plan_mode: bool,
    /// The todo list (`todo_write`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub todos: Vec<Todo>,
    /// Rules a human answered "always allow" to (`tool` or `tool(argument)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub always_allow: Vec<String>,
    /// The most recent decisions, oldest first (at most [`MAX_RECORDED_DECISIONS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Decision>,
}

/// What a child inherits from its parent call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Inherited {
    #[serde(default)]
    plan_mode: bool,
    #[serde(default)]
    deny: Vec<String>,
}

/// The permission state of the running call, shared by the layer and the plan/todo tools
/// (in the call's extensions); written back to the state when the call ends.
#[derive(Debug, Default)]
pub struct PermissionCell {
    state: Mutex<SessionPermissions>,
    inherited: Inherited,
    /// How many decisions this call recorded (the last ones of `state.decisions`).
    recorded: AtomicUsize,
    /// Whether anything but recorded decisions changed (then the state's extension is
    /// written whole at the end of the call, else only the new decisions are appended).
    changed: AtomicBool,
}

impl PermissionCell {
    /// A copy of the session's permission state.
    pub fn snapshot(&self) -> SessionPermissions {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Reads the session's permission state without copying it.
    pub fn read<R>(&self, f: impl FnOnce(&SessionPermissions) -> R) -> Option<R> {
        self.state.lock().ok().map(|s| f(&s))
    }

    /// Changes the session's permission state.
    pub fn update<R>(&self, f: impl FnOnce(&mut SessionPermissions) -> R) -> Option<R> {
        self.changed.store(true, Ordering::Relaxed);
        self.state.lock().ok().map(|mut s| f(&mut s))
    }

    /// Records a decision.
    fn record(&self, d: Decision) {
        if let Ok(mut s) = self.state.lock() {
            s.decisions.push(d);
            let over = s.decisions.len().saturating_sub(MAX_RECORDED_DECISIONS);
            s.decisions.drain(..over);
            self.recorded.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes the call's changes to the state's extension: the whole permission state if
    /// anything but decisions changed, else only the decisions recorded in this call,
    /// appended to the stored list (so a call does not re-encode the 200 kept decisions).
    fn store(&self, state: &mut hame_core::AgentState) -> Result<(), String> {
        let recorded = self.recorded.swap(0, Ordering::Relaxed);
        let changed = self.changed.load(Ordering::Relaxed);
        let s = self
            .state
            .lock()
            .map_err(|_| "its lock is poisoned".to_owned())?;
        if !changed {
            let new = &s.decisions[s.decisions.len().saturating_sub(recorded)..];
            if new.is_empty() {
                return Ok(());
            }
            let list = state
                .extensions
                .get_mut(STATE_KEY)
                .and_then(serde_json::Value::as_object_mut)
                .map(|o| {
                    o.entry("decisions")
                        .or_insert_with(|| serde_json::Value::Array(Vec::new()))
                });
            if let Some(serde_json::Value::Array(list)) = list
                && let Ok(new) = new
                    .iter()
                    .map(serde_json::to_value)
                    .collect::<Result<Vec<_>, _>>()
            {
                list.extend(new);
                let over = list.len().saturating_sub(MAX_RECORDED_DECISIONS);
                list.drain(..over);
                return Ok(());
            }
        }
        state
            .set_extension(STATE_KEY, &*s)
            .map_err(|e| e.to_string())
    }

    /// Whether plan mode applies (the session's, or the parent's for a child).
    pub fn plan_mode(&self) -> bool {
        self.inherited.plan_mode || self.read(|s| s.plan_mode).unwrap_or(false)
    }

    /// Whether plan mode was set by the parent call (a child cannot leave it).
    pub fn plan_mode_inherited(&self) -> bool {
        self.inherited.plan_mode
    }
}

/// The `permissions` layer. See the [module docs](self).
#[derive(Debug)]
pub struct PermissionLayer {
    tools_config: Option<Arc<ToolsConfigLayer>>,
    rules: Permissions,
    mode: Mode,
}

/// The rules a session's "always" answers allow.
fn session_allow(s: &SessionPermissions) -> Vec<PermissionRule> {
    s.always_allow
        .iter()
        .filter_map(|r| PermissionRule::parse(r).ok())
        .collect()
}

/// Adds a caller's `tools.json` permissions to `rules` (its `default` replaces theirs).
fn add_rules(rules: &mut Permissions, more: Option<&Permissions>) {
    if let Some(p) = more {
        rules.allow.extend(p.allow.iter().cloned());
        rules.ask.extend(p.ask.iter().cloned());
        rules.deny.extend(p.deny.iter().cloned());
        if p.default.is_some() {
            rules.default = p.default;
        }
    }
}

/// The rules of one call, with what its step's `tools.json` says of the tool.
struct StepRules {
    /// The builder's rules, the inherited denies and `tools.json`'s.
    rules: Permissions,
    /// For an MCP tool the step's servers list: whether it says it only reads.
    mcp_read_only: Option<bool>,
    /// The step's `tools.json`, when the agent reads one.
    config: Option<Arc<crate::tools_config::ToolsConfig>>,
}

impl PermissionLayer {
    /// A layer with the builder's `rules` and `mode`; the caller's `tools.json`
    /// `permissions` (read through `tools_config`) is added to them per call.
    pub fn new(
        tools_config: Option<Arc<ToolsConfigLayer>>,
        rules: Permissions,
        mode: Mode,
    ) -> Self {
        Self {
            tools_config,
            rules,
            mode,
        }
    }

    /// The builder's rules with the caller's `tools.json` ones (and a parent's deny
    /// rules), and whether the called MCP tool is read-only.
    async fn rules_for(
        &self,
        cx: &ToolCtx<'_>,
        call: &ToolCall,
        inherited: &Inherited,
    ) -> Result<StepRules, String> {
        let mut rules = self.rules.clone();
        for d in &inherited.deny {
            rules.deny.push(PermissionRule::parse(d)?);
        }
        let (mut mcp_read_only, mut step_config) = (None, None);
        if let (Some(layer), Some(ws)) = (
            &self.tools_config,
            hame_tools::snapshot::config_view(&cx.tool.extensions, cx.iteration),
        ) {
            let config = layer
                .load_step(
                    &ws,
                    &cx.tool.extensions,
                    cx.tool.runtime.call_id(),
                    cx.iteration,
                )
                .await?;
            add_rules(&mut rules, config.permissions.as_ref());
            if call.name.starts_with("mcp__") {
                let tools = layer.mcp_tools(&config, cx.events).await;
                mcp_read_only = tools
                    .iter()
                    .find(|t| t.qualified == call.name)
                    .map(|t| t.read_only);
            }
            step_config = Some(config);
        }
        Ok(StepRules {
            rules,
            mcp_read_only,
            config: step_config,
        })
    }

    /// The verdict of the rules on a request the caller makes itself, outside a call (the
    /// gateway's file routes: `read_file`, `write_file`, `list_files` on `path`): the
    /// builder's rules with the caller's `tools.json` ones, the mode, and the `session`'s
    /// plan mode and "always" answers — what [`decide::decide`] is given for a call of the
    /// tool. The outer `Err`: a broken `tools.json`; the inner one: a path the file tools
    /// refuse (the filesystem's reason).
    pub async fn verdict_for(
        &self,
        ws: &Workspace,
        tool: &str,
        path: &str,
        session: &SessionPermissions,
    ) -> Result<Result<Verdict, String>, String> {
        let case = ws.name_case();
        let argument = match decide::call_argument(tool, &serde_json::json!({"path": path}), case) {
            Ok(a) => a,
            Err(reason) => return Ok(Err(reason)),
        };
        let mut rules = self.rules.clone();
        if let Some(layer) = &self.tools_config {
            let config = layer.load(ws).await?;
            add_rules(&mut rules, config.permissions.as_ref());
        }
        let question = decide::Question {
            tool,
            argument,
            effect: decide::effect_of(tool, None),
            plan_mode: session.plan_mode,
            mode: self.mode,
            case,
        };
        Ok(Ok(decide::decide(
            &question,
            &rules,
            &session_allow(session),
        )))
    }

    fn record(&self, cx: &ToolCtx<'_>, cell: Option<&PermissionCell>, d: Decision) {
        cx.events.emit(AgentEvent::Custom {
            kind: DECIDED_EVENT.into(),
            data: serde_json::to_value(&d).unwrap_or_default(),
        });
        tracing::info!(tool = %d.tool, rule = %d.rule, outcome = ?d.outcome, by = %d.by, "permission decided");
        if let Some(cell) = cell {
            cell.record(d);
        }
    }

    /// Runs the call; a spawn or send carries plan mode and the deny rules to the child.
    async fn run(
        &self,
        cx: &ToolCtx<'_>,
        call: ToolCall,
        next: ToolNext<'_>,
        inherit: Option<Inherited>,
    ) -> ToolOutcome {
        let Some(inherit) = inherit else {
            return next.run(cx, call).await;
        };
        let mut extensions = cx.tool.extensions.clone();
        let mut parent = extensions
            .get::<hame_subagent::ParentCall>()
            .cloned()
            .unwrap_or_default();
        parent.inherit.insert(
            INHERIT_EXTRA.to_owned(),
            serde_json::to_value(&inherit).unwrap_or_default(),
        );
        extensions.insert(parent);
        let tool = ToolContext {
            extensions,
            ..cx.tool.clone()
        };
        let tcx = ToolCtx {
            tool: &tool,
            state: cx.state,
            events: cx.events,
            iteration: cx.iteration,
            resume: cx.resume,
        };
        next.run(&tcx, call).await
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn denied(message: String) -> ToolOutcome {
    ToolOutcome::Done(Err(ToolError::new(codes::DENIED, message)))
}

fn describe(tool: &str, argument: Option<&str>) -> String {
    match argument {
        Some(a) => format!("`{tool}` ({a})"),
        None => format!("`{tool}`"),
    }
}

#[async_trait]
impl Layer for PermissionLayer {
    fn name(&self) -> &str {
        LAYER
    }

    async fn call(
        &self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
        next: CallNext<'_>,
    ) -> Result<CallOutput, hame_core::Error> {
        // An unreadable stored value is replaced whole at the end of the call.
        let (mut session, mut changed) = match cx.state.extensions.get(STATE_KEY) {
            None => (SessionPermissions::default(), false),
            Some(v) => match SessionPermissions::deserialize(v) {
                Ok(s) => (s, false),
                Err(_) => (SessionPermissions::default(), true),
            },
        };
        if cx
            .runtime
            .extras
            .get(PLAN_EXTRA)
            .and_then(serde_json::Value::as_bool)
            == Some(true)
            && !session.plan_mode
        {
            session.plan_mode = true;
            changed = true;
        }
        let inherited: Inherited = cx
            .runtime
            .extras
            .get(INHERIT_EXTRA)
            .and_then(|v| Inherited::deserialize(v).ok())
            .unwrap_or_default();
        let cell = Arc::new(PermissionCell {
            state: Mutex::new(session),
            inherited,
            recorded: AtomicUsize::new(0),
            changed: AtomicBool::new(changed),
        });
        let out = next.run_adding(cx, cell.clone(), input).await;
        if let Err(e) = cell.store(cx.state) {
            tracing::warn!(error = %e, "saving the permission state failed");
        }
        out
    }

    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        mut request: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse, hame_core::Error> {
        if let Some(cell) = cx.extensions.get::<PermissionCell>() {
            if cell.plan_mode() {
                request.system.push_str(tools::PLAN_MODE_NOTE);
            }
            let todos = cell
                .read(|s| (!s.todos.is_empty()).then(|| tools::render_todos(&s.todos)))
                .flatten();
            if let Some(todos) = todos {
                request.system.push_str("\n\n# Todo list\n");
                request.system.push_str(&todos);
            }
        }
        next.run(cx, request).await
    }

    async fn tool(&self, cx: &ToolCtx<'_>, call: ToolCall, next: ToolNext<'_>) -> ToolOutcome {
        let cell = cx.tool.extensions.get::<PermissionCell>();
        let args: serde_json::Value = serde_json::from_str(&call.arguments).unwrap_or_default();
        let case = cx
            .tool
            .extensions
            .get::<Workspace>()
            .map(Workspace::name_case)
            .unwrap_or_default();
        // The path the tool will touch, from the function the tool takes it from.
        let parsed = match decide::call_argument(&call.name, &args, case) {
            Ok(a) => a,
            Err(reason) => {
                let raw = decide::main_argument(&args);
                self.record(
                    cx,
                    cell,
                    Decision {
                        time: now(),
                        tool: call.name.clone(),
                        argument: raw.clone(),
                        rule: "invalid path".into(),
                        outcome: Outcome::Deny,
                        by: "policy".into(),
                        approval: None,
                    },
                );
                return ToolOutcome::Done(Err(ToolError::new(
                    hame_fs::codes::INVALID_PATH,
                    reason,
                )));
            }
        };
        let argument = parsed.as_ref().map(|a| a.shown.clone());
        let plan_mode = cell.is_some_and(PermissionCell::plan_mode);
        let inherited = cell.map(|c| c.inherited.clone()).unwrap_or_default();
        let StepRules {
            rules,
            mcp_read_only,
            config,
        } = match self.rules_for(cx, &call, &inherited).await {
            Ok(r) => r,
            Err(e) => return ToolOutcome::Done(Err(ToolError::new(codes::FAILED, e))),
        };
        // A call that cannot run (a tool the agent does not have, one tools.json or a
        // subagent's list refuses) is answered so before any rule: no human is asked to
        // approve it, and plan or read-only mode does not say a mutation was blocked. The
        // names an unknown tool's error lists are those the step lets the caller run.
        let refusal = |n: &str| {
            (self.tools_config.as_ref().zip(config.as_deref()))
                .and_then(|(layer, config)| layer.refusal(config, &cx.tool.runtime, n))
        };
        if let Some(e) = refusal(&call.name).or_else(|| {
            mcp_read_only
                .is_none()
                .then(|| next.unknown_tool(&call.name, &|n| refusal(n).is_none()))
                .flatten()
        }) {
            return ToolOutcome::Done(Err(e));
        }
        let inherit =
            matches!(call.name.as_str(), "agent_spawn" | "agent_send").then(|| Inherited {
                plan_mode,
                deny: rules.deny.iter().map(decide::rule_text).collect(),
            });
        let what = describe(&call.name, argument.as_deref());
        let decision = |outcome, rule: &str, by: &str, approval: Option<String>| Decision {
            time: now(),
            tool: call.name.clone(),
            argument: argument.clone(),
            rule: rule.to_owned(),
            outcome,
            by: by.to_owned(),
            approval,
        };

        // A human's answer to an earlier suspension of this call.
        if let Some(r) = cx.resumed_for(LAYER) {
            let v = &r.resolution.value;
            let approve = v.get("approve").and_then(serde_json::Value::as_bool) == Some(true);
            let reason = v.get("reason").and_then(|x| x.as_str()).unwrap_or("");
            let id = Some(r.suspension.id.clone());
            if !approve {
                self.record(cx, cell, decision(Outcome::Deny, "human", "human", id));
                let why = if reason.is_empty() {
                    String::new()
                } else {
                    format!(": {reason}")
                };
                return denied(format!("{what} was denied by the user{why}"));
            }
            self.record(cx, cell, decision(Outcome::Allow, "human", "human", id));
            if v.get("always").and_then(serde_json::Value::as_bool) == Some(true)
                && let Some(cell) = cell
            {
                let rule = decide::always_rule(&call.name, parsed.as_ref());
                cell.update(|s| {
                    if !s.always_allow.contains(&rule) {
                        s.always_allow.push(rule);
                    }
                });
            }
            return self.run(cx, call, next, inherit).await;
        }

        let effect = decide::effect_of(&call.name, mcp_read_only);
        let session_allow = cell.and_then(|c| c.read(session_allow)).unwrap_or_default();
        let question = decide::Question {
            tool: &call.name,
            argument: parsed,
            effect,
            plan_mode,
            mode: self.mode,
            case,
        };
        let verdict = decide::decide(&question, &rules, &session_allow);
        self.record(
            cx,
            cell,
            decision(verdict.outcome, &verdict.rule, "policy", None),
        );
        match verdict.outcome {
            Outcome::Allow => {
                if verdict.rule == "mode bypass" {
                    tracing::warn!(tool = %call.name, "permission mode bypass: call allowed without a rule");
                }
                self.run(cx, call, next, inherit).await
            }
            Outcome::Deny if verdict.rule == "plan mode" => denied(format!(
                "{what} is blocked: the session is in plan mode (read-only), where tools that change something are denied. Explore with read-only tools, write the plan with plan_write, then call plan_exit to ask for approval."
            )),
            Outcome::Deny if verdict.rule == "mode read-only" => denied(format!(
                "{what} is blocked: the permission mode is read-only (rule `mode read-only`), where tools that change something are denied. Use read-only tools, and tell the user what you would change."
            )),
            Outcome::Deny => denied(format!(
                "{what} was denied by policy (rule `{}`)",
                verdict.rule
            )),
            Outcome::Ask => {
                let reason = if call.name == "plan_exit" {
                    "plan approval".to_owned()
                } else {
                    format!("rule `{}`", verdict.rule)
                };
                ToolOutcome::Suspend(Suspension::new(LAYER, reason).with_data(serde_json::json!({
                    "tool": call.name,
                    "argument": argument,
                    "rule": verdict.rule,
                })))
            }
        }
    }
}

#[cfg(test)]
#[path = "cell_tests.rs"]
mod cell_tests;
