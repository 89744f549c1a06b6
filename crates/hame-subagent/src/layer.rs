//! The `subagents` layer: lists the declarations in the system prompt, marks orphaned
//! tasks interrupted at the start of a call, and pushes finished background results into
//! the parent's context once, before its next reasoning step.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hame_core::{
    AgentEvent, AppendNext, CallCtx, CallInput, CallNext, CallOutput, Layer, Message, ModelNext,
    ModelRequest, ModelResponse, Role,
};
use hame_tools::Workspace;

use crate::manager::{Subagents, depth_of};
use crate::task::{TaskRecord, TaskStatus};

/// The state extension that remembers which task results joined this conversation (so a
/// crash between the push and the record update never delivers twice).
pub const DELIVERED_EXTENSION: &str = "subagents";
/// Task ids remembered in [`DELIVERED_EXTENSION`].
const MAX_REMEMBERED: usize = 1000;

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Delivered {
    #[serde(default)]
    delivered: Vec<String>,
}

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
                    let waiting: Vec<TaskRecord> = records
                        .into_iter()
                        .filter(TaskRecord::undelivered)
                        .collect();
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
        next.run(cx, input).await
    }

    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        mut request: ModelRequest,
        next: ModelNext<'_>,
    ) -> hame_core::Result<ModelResponse> {
        if depth_of(cx.runtime) < self.subagents.options().max_depth
            && let Some(ws) = cx.extensions.get::<Workspace>()
        {
            let catalog = self.subagents.catalog(ws).await;
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
        let mut seen: Delivered = cx.state.extension(DELIVERED_EXTENSION).unwrap_or_default();
        records.retain(|r| !seen.delivered.contains(&r.task_id));
        if records.is_empty() {
            return Ok(());
        }
        let text = notification(&records, self.subagents.options().max_delivered_chars);
        next.run(cx, Message::user(text)).await?;
        seen.delivered
            .extend(records.iter().map(|r| r.task_id.clone()));
        let excess = seen.delivered.len().saturating_sub(MAX_REMEMBERED);
        seen.delivered.drain(..excess);
        if let Err(e) = cx.state.set_extension(DELIVERED_EXTENSION, &seen) {
            tracing::warn!(error = %e, "remembering delivered tasks failed");
        }
        if let Ok(store) = self.subagents.store(&ws) {
            for r in records {
                cx.events.emit(AgentEvent::Custom {
                    kind: "subagent.delivered".into(),
                    data: serde_json::json!({ "task_id": r.task_id }),
                });
                self.subagents.mark_delivered(&store, r).await;
            }
        }
        Ok(())
    }
}
