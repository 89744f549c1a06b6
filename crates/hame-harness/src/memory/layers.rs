//! The memory layers: offloading of large tool results before they join the state, and the
//! flush that runs before every compaction (the compaction layer itself is
//! `hame_memory::CompactionLayer`).

use std::sync::Arc;

use async_trait::async_trait;
use hame_core::{AgentEvent, AppendNext, CallCtx, ContentBlock, Layer, Message, Role, ToolCall};
use hame_memory::{BeforeCompaction, FactsPlan, FactsRequest, Offloader, SeqSpan};
use hame_tools::Workspace;

use super::layer::MemoryLayer;

/// Moves oversized tool results out of the context (to `large_tool_results/` in the caller's
/// files) before the results message joins the state. Sits inside the session-log layer, so
/// the log keeps the full result and the state keeps the preview.
#[derive(Debug)]
pub(crate) struct OffloadLayer {
    layer: Arc<MemoryLayer>,
}

impl OffloadLayer {
    pub(crate) fn new(layer: Arc<MemoryLayer>) -> Self {
        Self { layer }
    }
}

#[async_trait]
impl Layer for OffloadLayer {
    fn name(&self) -> &str {
        "offload"
    }

    async fn append(
        &self,
        cx: &mut CallCtx<'_>,
        mut message: Message,
        next: AppendNext<'_>,
    ) -> Result<(), hame_core::Error> {
        if message.role == Role::Tool
            && let Some(ws) = cx.extensions.get::<Workspace>()
        {
            // Results go to the caller's home; the preview names them as the caller's
            // file tools see them (`/<userId>/large_tool_results/...` in local mode with a
            // user id, `/large_tool_results/...` otherwise).
            let mut policy = self.layer.options.offload.clone();
            if !ws.home_in_files().is_root() {
                policy.model_path_prefix = format!(
                    "{}/{}/",
                    policy.model_path_prefix.trim_end_matches('/'),
                    ws.home_in_files().as_str()
                );
            }
            // In sandbox mode the caller's home is on the host, where the sandboxed file
            // tools cannot read: the results go into the sandbox's `/workspace` instead
            // (snapshotted with it), so `read_file` pages them like any file there.
            let sink = if ws.mode() == hame_tools::WorkspaceMode::Sandbox {
                super::files::FsFiles::new(ws.files().clone())
            } else {
                self.layer.files(ws)
            };
            let offloader = Offloader::new(policy, Arc::new(sink))
                .with_context_window(self.layer.context_window);
            let threshold = offloader.threshold();
            if message
                .tool_results_iter()
                .any(|r| r.content.len() > threshold)
            {
                // The calls, by id, from the assistant message that asked for them.
                let calls: Vec<ToolCall> = cx
                    .state
                    .messages
                    .iter()
                    .rev()
                    .find(|m| m.role == Role::Assistant && m.has_tool_calls())
                    .map(|m| m.tool_calls().cloned().collect())
                    .unwrap_or_default();
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
                if changed > 0 {
                    cx.events.emit(AgentEvent::Custom {
                        kind: "memory.offload".into(),
                        data: serde_json::json!({ "results": changed }),
                    });
                }
            }
        }
        next.run(cx, message).await
    }
}

/// Records the facts of the messages about to be summarised in the daily log, so no fact
/// is lost to a summary: asked of the summary call itself (one model call for both), or,
/// when its answer has no facts section, with a flush call of their own before the summary
/// replaces the messages. A failure is reported and does not stop the compaction (the
/// watermark stays, and the next flush reads the summary).
#[derive(Debug)]
pub(crate) struct FlushBeforeCompaction {
    layer: Arc<MemoryLayer>,
}

impl FlushBeforeCompaction {
    pub(crate) fn new(layer: Arc<MemoryLayer>) -> Self {
        Self { layer }
    }
}

#[async_trait]
impl BeforeCompaction for FlushBeforeCompaction {
    async fn plan_facts(&self, cx: &mut CallCtx<'_>, span: SeqSpan) -> FactsPlan {
        let Some(ws) = cx.extensions.get::<Workspace>() else {
            return FactsPlan::Nothing;
        };
        match self
            .layer
            .flusher(ws)
            .facts_request(cx.state, span, chrono::Utc::now())
            .await
        {
            Ok(Some(request)) => FactsPlan::Ask(request),
            Ok(None) => FactsPlan::Nothing,
            Err(e) => {
                tracing::warn!(error = %e, "reading the memory files for the summary failed; flushing separately");
                FactsPlan::Separate
            }
        }
    }

    async fn record_facts(&self, cx: &mut CallCtx<'_>, request: &FactsRequest, facts: Vec<String>) {
        let Some(ws) = cx.extensions.get::<Workspace>() else {
            return;
        };
        let session = ws.identity().session.clone();
        let flusher = self.layer.flusher(ws);
        match flusher
            .record_facts(cx.state, &session, chrono::Utc::now(), request, facts)
            .await
        {
            Ok(report) => cx.events.emit(AgentEvent::Custom {
                kind: "memory.flush".into(),
                data: serde_json::json!({
                    "facts": report.appended, "rounds": 0, "before": "compaction",
                    "with": "summary", "from_seq": request.span.from, "to_seq": request.span.to,
                }),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "recording the summary's facts failed; compacting anyway");
                cx.events.emit(AgentEvent::Custom {
                    kind: "memory.flush_failed".into(),
                    data: serde_json::json!({ "error": e.to_string() }),
                });
            }
        }
    }

    async fn before_compaction(&self, cx: &mut CallCtx<'_>) {
        let Some(ws) = cx.extensions.get::<Workspace>() else {
            return;
        };
        match self.layer.flush(cx.state, ws).await {
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
    }
}
