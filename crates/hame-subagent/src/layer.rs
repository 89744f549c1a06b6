//! The `subagents` layer: lists the declarations in the system prompt, marks orphaned
//! tasks interrupted at the start of a call, and pushes finished background results into
//! the parent's context once, before its next reasoning step (the order of a delivery and
//! what a crash between its steps leaves: [`crate::delivery`]).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hame_core::{
    AgentEvent, AppendNext, CallCtx, CallInput, CallNext, CallOutput, Layer, Message, ModelNext,
    ModelRequest, ModelResponse, Role,
};
use hame_tools::Workspace;

use crate::delivery::{Delivered, logged_notifications};
use crate::manager::{ParentCall, Subagents, depth_of};
use crate::task::{TaskRecord, TaskStatus};

/// (user, session) of a caller.
type TenantSession = (Option<String>, String);

/// The layer (place it outside the session log, so pushed results are logged).
#[derive(Debug)]
pub struct SubagentLayer {
    subagents: Arc<Subagents>,
    /// Results read from the task records at the start of a call, waiting for the next
    /// append, by (user, session).
    inbox: Mutex<HashMap<TenantSession, Vec<TaskRecord>>>,
}

impl SubagentLayer {
    /// A layer over the runtime.
    pub fn new(subagents: Arc<Subagents>) -> Self {
        Self {
            subagents,
            inbox: Mutex::new(HashMap::new()),
        }
    }

    fn key(ws: &Workspace) -> TenantSession {
        let id = ws.identity();
        (id.user.clone(), id.session.clone())
    }

    /// Sorts the session's records at the start of a call; returns the finished results
    /// still to push. A result the saved state holds (its call stopped before marking it)
    /// is marked delivered now; one whose call stopped before saving is taken from the
    /// session log into the conversation when that call logged its notification.
    async fn settle(
        &self,
        cx: &mut CallCtx<'_>,
        ws: &Workspace,
        records: Vec<TaskRecord>,
    ) -> Vec<TaskRecord> {
        let mut seen = Delivered::of(cx.state);
        let (mut waiting, mut stopped) = (Vec::new(), Vec::new());
        let Ok(store) = self.subagents.store(ws) else {
            return records
                .into_iter()
                .filter(TaskRecord::undelivered)
                .collect();
        };
        let store = &store;
        for r in records.into_iter().filter(TaskRecord::undelivered) {
            if seen.has(&r) {
                if lease_held(cx) {
                    self.subagents.confirm(store, r).await;
                }
            } else if r.delivery_call.is_some() {
                stopped.push(r);
            } else {
                waiting.push(r);
            }
        }
        // A step waiting for approval must get its results first: what a stopped call
        // pushed waits for a later call.
        if stopped.is_empty() || cx.state.pending.is_some() {
            return waiting;
        }
        let (logged, missing) = logged_notifications(ws, self.subagents.agent(), stopped).await;
        waiting.extend(missing);
        let parent = cx.extensions.get::<ParentCall>();
        for (message, records) in logged {
            // In the log already (a line of the call that stopped): it joins the
            // conversation without a second line.
            cx.state.messages.push(message);
            seen.remember(cx.state, records.iter().map(TaskRecord::delivery_key));
            for r in records {
                cx.events.emit(AgentEvent::Custom {
                    kind: "subagent.delivered".into(),
                    data: serde_json::json!({ "task_id": r.task_id, "from_log": true }),
                });
                self.subagents.hand_over(store, parent, r).await;
            }
        }
        waiting
    }
}

/// Whether the call's session lease (when it has one) is still held: records are marked
/// only under it.
fn lease_held(cx: &CallCtx<'_>) -> bool {
    cx.extensions
        .get::<hame_state::Lease>()
        .is_none_or(|l| l.check().is_ok())
}

/// The notification pushed into the parent's context for finished tasks.
pub fn notification(records: &[TaskRecord], max_chars: usize) -> String {
    let mut s = String::from("<system-notification>\n");
    for r in records {
        let _ = write!(
            s,
            "Background task {} (subagent {}) {}",
            r.task_id,
            r.agent_id,
            r.status.as_str()
        );
        match r.status {
            TaskStatus::Completed => {
                let text = r.result.as_deref().unwrap_or("(no output)");
                let _ = writeln!(s, ". Result:\n{}", clip(text, max_chars, &r.task_id));
            }
            _ => {
                let _ = writeln!(
                    s,
                    ": {}",
                    r.error.as_deref().unwrap_or("(no reason recorded)")
                );
            }
        }
    }
    s.push_str("</system-notification>");
    s
}

fn clip(text: &str, max: usize, task_id: &str) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_owned();
    }
    let head: String = text.chars().take(max / 2).collect();
    let tail: String = text.chars().skip(n - max / 2).collect();
    format!(
        "{head}\n[… {} characters cut; task_output(task_id=\"{task_id}\") returns all of it …]\n{tail}",
        n - max
    )
}

#[async_trait]
impl Layer for SubagentLayer {
    fn name(&self) -> &str {
        "subagents"
    }

    async fn call(
        &self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
        next: CallNext<'_>,
    ) -> hame_core::Result<CallOutput> {
        if let Some(ws) = cx.extensions.get::<Workspace>().cloned() {
            // Children read the same specs; their parent's call warned already.
            let catalog = self.subagents.catalog(&ws).await;
            let warnings = if depth_of(cx.runtime) == 0 {
                catalog.warnings.as_slice()
            } else {
                &[]
            };
            for w in warnings {
                cx.events.emit(AgentEvent::Custom {
                    kind: "workspace.invalid_subagent".into(),
                    data: serde_json::json!({ "path": w.path, "error": w.error }),
                });
            }
            match self.subagents.sweep(&ws).await {
                Ok(records) => {
                    let waiting = self.settle(cx, &ws, records).await;
                    if !waiting.is_empty()
                        && let Ok(mut inbox) = self.inbox.lock()
                    {
                        let slot = inbox.entry(Self::key(&ws)).or_default();
                        for r in waiting {
                            if !slot.iter().any(|x| x.task_id == r.task_id) {
                                slot.push(r);
                            }
                        }
                    }
                }
                Err(e) => cx.events.emit(AgentEvent::Custom {
                    kind: "subagent.sweep_failed".into(),
                    data: serde_json::json!({ "path": "agents/", "error": e.to_string() }),
                }),
            }
        }
        let out = next.run(cx, input).await;
        // What the tools of this call handed over (task_output, sync spawns) is remembered
        // in the state saved with their results: a crash between that save and the mark
        // never pushes them again.
        if let Some(parent) = cx.extensions.get::<ParentCall>() {
            let keys = parent.deliveries.keys();
            Delivered::of(cx.state).remember(cx.state, keys);
        }
        out
    }

    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        mut request: ModelRequest,
        next: ModelNext<'_>,
    ) -> hame_core::Result<ModelResponse> {
        if depth_of(cx.runtime) < self.subagents.options().max_depth
            && let Some(ws) = hame_tools::snapshot::config_view(cx.extensions, cx.iteration)
        {
            let catalog = self.subagents.catalog(&ws).await;
            if !catalog.specs.is_empty() {
                let mut s = String::from(
                    "\n\n# Subagents\nagent_spawn hands a self-contained task to a subagent, which does not see this conversation; with background=true it runs while you continue and its result is delivered when it ends. Available subagents:\n",
                );
                for (id, d) in &catalog.specs {
                    let _ = writeln!(s, "- {id}: {}", d.spec.description);
                }
                request.system.push_str(s.trim_end());
                // Declared subagents (more than the built-in one): the task tools are
                // offered with agent_spawn, deferred or not.
                if catalog.specs.keys().any(|id| id != crate::GENERAL_PURPOSE)
                    && let Some(offers) = cx.extensions.get::<hame_core::ToolOffers>()
                {
                    offers.offer(crate::SUBAGENT_TOOLS);
                }
            }
        }
        next.run(cx, request).await
    }

    async fn append(
        &self,
        cx: &mut CallCtx<'_>,
        message: Message,
        next: AppendNext<'_>,
    ) -> hame_core::Result<()> {
        // Results are pushed only where a reasoning step follows: after the user's message
        // or a batch of tool results (never between tool calls and their results).
        let before_step = matches!(message.role, Role::User | Role::Tool);
        next.run(cx, message).await?;
        if !before_step {
            return Ok(());
        }
        let Some(ws) = cx.extensions.get::<Workspace>().cloned() else {
            return Ok(());
        };
        let mut records = self.subagents.take_finished(&ws);
        if let Ok(mut inbox) = self.inbox.lock()
            && let Some(mut waiting) = inbox.remove(&Self::key(&ws))
        {
            waiting.retain(|r| !records.iter().any(|x| x.task_id == r.task_id));
            records.extend(waiting);
        }
        let parent = cx.extensions.get::<ParentCall>().cloned();
        let mut seen = Delivered::of(cx.state);
        records.retain(|r| {
            !seen.has(r)
                && !parent
                    .as_ref()
                    .is_some_and(|p| p.deliveries.contains(&r.task_id))
        });
        if records.is_empty() {
            return Ok(());
        }
        let store = match self.subagents.store(&ws) {
            Ok(store) => store,
            Err(e) => {
                tracing::warn!(error = %e, "the task records cannot be opened; results are pushed later");
                return Ok(());
            }
        };
        // 1. The records name this call before the push: should the call stop before its
        //    state is saved, the next call finds the notification in the log by it.
        if let Some(call) = cx.runtime.call_id() {
            for r in &mut records {
                r.delivery_call = Some(call.to_owned());
                if let Err(e) = store.save(r).await {
                    tracing::warn!(task = %r.task_id, error = %e, "recording the delivering call failed");
                }
            }
        }
        hame_core::failpoint("subagent.claimed");
        let text = notification(&records, self.subagents.options().max_delivered_chars);
        next.run(cx, Message::user(text)).await?;
        seen.remember(cx.state, records.iter().map(TaskRecord::delivery_key));
        hame_core::failpoint("subagent.pushed");
        // 2 and 3: the harness saves the state, then marks the records delivered
        // (`Subagents::confirm_deliveries`); outside a harness call they are marked now.
        for r in records {
            cx.events.emit(AgentEvent::Custom {
                kind: "subagent.delivered".into(),
                data: serde_json::json!({ "task_id": r.task_id }),
            });
            self.subagents.hand_over(&store, parent.as_ref(), r).await;
        }
        Ok(())
    }
}
