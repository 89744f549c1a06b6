//! The memory middleware: offloading after the session log, flush-then-compact before a
//! request, flush-then-compact-and-retry after a context overflow.

use std::sync::Arc;

use async_trait::async_trait;
use hame_core::{
    AgentEvent, CallCtx, ContentBlock, ErrorAction, Message, Middleware, ModelError, ModelRequest,
    Role, ToolCall,
};
use hame_memory::tokens::{messages_tokens, request_tokens};
use hame_memory::{CompactionPolicy, Offloader, plan_forced};

use super::layer::MemoryLayer;

/// Registered after the session-log middleware (see the [module docs](super)).
#[derive(Debug)]
pub(crate) struct MemoryMiddleware {
    layer: Arc<MemoryLayer>,
}

impl MemoryMiddleware {
    pub(crate) fn new(layer: Arc<MemoryLayer>) -> Self {
        Self { layer }
    }

    /// Flushes, then compacts `cx.state` by `policy`. Returns the compaction's sequence
    /// range when it compacted. A failed flush is reported and does not stop the
    /// compaction (the summary covers the unflushed messages and the next flush reads it).
    async fn flush_then_compact(
        &self,
        cx: &mut CallCtx<'_>,
        policy: &CompactionPolicy,
    ) -> Result<Option<(u64, u64)>, hame_memory::Error> {
        match self.layer.flush(cx.state, cx.runtime).await {
            Ok(done) => {
                if done.rounds > 0 {
                    cx.events.emit(AgentEvent::Custom {
                        kind: "memory.flush".into(),
                        data: serde_json::json!({ "facts": done.facts, "rounds": done.rounds, "before": "compaction" }),
                    });
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "memory flush before compaction failed; compacting anyway");
                cx.events.emit(AgentEvent::Custom {
                    kind: "memory.flush_failed".into(),
                    data: serde_json::json!({ "error": e.to_string() }),
                });
            }
        }
        let Some(plan) = plan_forced(&cx.state.messages, policy, self.layer.counter.as_ref())
        else {
            return Ok(None);
        };
        let report = self
            .layer
            .compactor
            .run(cx.state, &self.layer.model, plan)
            .await?;
        Ok(Some((report.from_seq, report.to_seq)))
    }

    /// Offloads the oversized results of a tool-results message (the last one in state).
    async fn offload_last(&self, cx: &mut CallCtx<'_>) -> Result<(), hame_core::Error> {
        let files = Arc::new(self.layer.files(cx.runtime)?);
        let offloader = Offloader::new(self.layer.options.offload.clone(), files)
            .with_context_window(self.layer.context_window);
        let threshold = offloader.threshold();
        let n = cx.state.messages.len();
        let Some(last) = cx.state.messages.last() else {
            return Ok(());
        };
        if !last
            .tool_results_iter()
            .any(|r| r.content.len() > threshold)
        {
            return Ok(());
        }
        // The calls, by id, from the assistant message that asked for them.
        let calls: Vec<ToolCall> = cx.state.messages[..n - 1]
            .iter()
            .rev()
            .find(|m| m.role == Role::Assistant && m.has_tool_calls())
            .map(|m| m.tool_calls().cloned().collect())
            .unwrap_or_default();
        let mut message: Message = last.clone();
        let mut changed = 0usize;
        for block in &mut message.content {
            if let ContentBlock::ToolResult(result) = block {
                let call = calls
                    .iter()
                    .find(|c| c.id == result.id)
                    .cloned()
                    .unwrap_or_else(|| ToolCall {
                        id: result.id.clone(),
                        name: String::new(),
                        arguments: String::new(),
                    });
                if offloader.offload(&call, result).await {
                    changed += 1;
                }
            }
        }
        if changed > 0
            && let Some(slot) = cx.state.messages.last_mut()
        {
            *slot = message;
            cx.events.emit(AgentEvent::Custom {
                kind: "memory.offload".into(),
                data: serde_json::json!({ "results": changed }),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Middleware for MemoryMiddleware {
    fn name(&self) -> &str {
        "memory"
    }

    async fn on_message_appended(
        &self,
        cx: &mut CallCtx<'_>,
        message: &Message,
    ) -> Result<(), hame_core::Error> {
        // The session log (registered before) already has the full message.
        if message.role == Role::Tool {
            self.offload_last(cx).await?;
        }
        Ok(())
    }

    async fn on_model_request(
        &self,
        cx: &mut CallCtx<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), hame_core::Error> {
        let counter = self.layer.counter.as_ref();
        let policy = self.layer.policy();
        let before = request_tokens(counter, &request.system, &request.messages, &request.tools);
        if !policy.triggers(cx.state.messages.len(), before) {
            return Ok(());
        }
        let old = cx.state.messages.clone();
        match self.flush_then_compact(cx, &policy).await {
            Ok(Some((from_seq, to_seq))) => {
                // Keep what earlier middleware appended to the request after the state.
                let extra = if request.messages.len() >= old.len()
                    && request.messages[..old.len()] == old[..]
                {
                    request.messages.split_off(old.len())
                } else {
                    Vec::new()
                };
                request.messages = cx.state.messages.clone();
                request.messages.extend(extra);
                let after =
                    request_tokens(counter, &request.system, &request.messages, &request.tools);
                cx.events.emit(AgentEvent::Compaction {
                    before_tokens: before,
                    after_tokens: after,
                    from_seq,
                    to_seq,
                });
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "compaction failed; continuing uncompacted");
                cx.events.emit(AgentEvent::Custom {
                    kind: "compaction.failed".into(),
                    data: serde_json::json!({ "error": e.to_string() }),
                });
            }
        }
        Ok(())
    }

    async fn on_model_error(
        &self,
        cx: &mut CallCtx<'_>,
        error: &ModelError,
    ) -> Result<ErrorAction, hame_core::Error> {
        if !error.is_context_overflow() {
            return Ok(ErrorAction::Propagate);
        }
        let counter = self.layer.counter.as_ref();
        let before = messages_tokens(counter, &cx.state.messages);
        match self
            .flush_then_compact(cx, &self.layer.overflow_policy())
            .await
        {
            Ok(Some((from_seq, to_seq))) => {
                let after = messages_tokens(counter, &cx.state.messages);
                cx.events.emit(AgentEvent::Compaction {
                    before_tokens: before,
                    after_tokens: after,
                    from_seq,
                    to_seq,
                });
                Ok(ErrorAction::Retry)
            }
            Ok(None) => {
                tracing::warn!("context overflow and nothing left to compact");
                Ok(ErrorAction::Propagate)
            }
            Err(e) => {
                tracing::warn!(error = %e, "compaction after a context overflow failed");
                cx.events.emit(AgentEvent::Custom {
                    kind: "compaction.failed".into(),
                    data: serde_json::json!({ "error": e.to_string() }),
                });
                Ok(ErrorAction::Propagate)
            }
        }
    }
}
