//! Intent records: a tool call that changes something is written down, durably, before it
//! runs, and marked done when it returns. A call whose process died in between (a SIGKILL,
//! a lost machine) has an intent without an end: on the session's next call — the run's
//! takeover by another worker, or the user's next message — it is **not** run again.
//! Instead the conversation (and so the session log and the next model request) gets the
//! call and a tool result saying that its outcome is unknown and that it was not re-run,
//! with its call id and arguments; the model decides what to do (look, ask, retry).
//!
//! Idempotent tools are not recorded, so they are simply asked for again: the built-in
//! read-only tools (`permissions::BUILTIN_EFFECTS`, [`Effect::ReadOnly`]). A tool that
//! changes something elsewhere can make itself safe to retry with
//! [`hame_core::ToolContext::idempotency_key`], stable for a call id.
//!
//! File: `agents/<agent>/sessions/<session>.intents.jsonl` in the caller's records, one
//! JSON line per intent (`call_id`, `tool`, `args`, `key`) and per end (`call_id`, `end`:
//! `done` or `outcome_unknown`). See docs/replicas.md.

use std::sync::Mutex;

use async_trait::async_trait;
use hame_core::{
    AppendNext, CallCtx, CallInput, CallNext, CallOutput, ContentBlock, Layer, Message, Result,
    Role, ToolCall, ToolCtx, ToolNext, ToolOutcome, ToolResult,
};
use hame_fs::{AppendOptions, FsPath};
use hame_tools::Workspace;
use serde::{Deserialize, Serialize};

use crate::permissions::Effect;
use crate::permissions::decide::effect_of;

/// An intents file holding only resolved records is deleted at the session's next call
/// once it is larger than this (64 KiB, about 400 tool calls).
pub const MAX_RESOLVED_BYTES: usize = 64 * 1024;

/// The stable code of a tool result whose call's outcome is unknown.
pub const OUTCOME_UNKNOWN: &str = "outcome_unknown";

/// One line of an intents file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentRecord {
    /// The tool call's id.
    pub call_id: String,
    /// The tool (intents only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The arguments as the model wrote them (intents only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<String>,
    /// [`hame_core::ToolContext::idempotency_key`] of the call (intents only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `done` (the call returned, whatever its outcome) or `outcome_unknown` (reported to
    /// the model); absent on an intent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
}

/// The intents without an end, in order: calls that started and never returned.
pub fn unresolved(records: &[IntentRecord]) -> Vec<IntentRecord> {
    let mut open: Vec<IntentRecord> = Vec::new();
    for r in records {
        if r.end.is_some() {
            open.retain(|o| o.call_id != r.call_id);
        } else if r.tool.is_some() && !open.iter().any(|o| o.call_id == r.call_id) {
            open.push(r.clone());
        }
    }
    open
}

/// The messages that tell the model about `unknown` calls: the calls, as the assistant
/// made them, and one result each saying the outcome is unknown.
pub fn outcome_unknown_messages(unknown: &[IntentRecord]) -> [Message; 2] {
    let calls: Vec<ContentBlock> = unknown
        .iter()
        .map(|r| {
            ContentBlock::ToolCall(ToolCall {
                id: r.call_id.clone(),
                name: r.tool.clone().unwrap_or_default(),
                arguments: r.args.clone().unwrap_or_default(),
            })
        })
        .collect();
    let results = unknown
        .iter()
        .map(|r| ToolResult {
            id: r.call_id.clone(),
            content: format!(
                "outcome_unknown: the process running this call of `{}` stopped before it \
                 returned, so whether it took effect is unknown. It was NOT run again. Check \
                 its effect before deciding to call it again (call id {}, arguments {}).",
                r.tool.as_deref().unwrap_or(""),
                r.call_id,
                r.args.as_deref().unwrap_or("{}")
            ),
            is_error: true,
            code: Some(OUTCOME_UNKNOWN.to_owned()),
        })
        .collect();
    [
        Message {
            role: Role::Assistant,
            content: calls.into_iter().collect(),
            usage: None,
        },
        Message::tool_results(results),
    ]
}

/// Whether a call of `name` may simply run again: the built-in read-only tools.
pub fn is_idempotent(name: &str) -> bool {
    effect_of(name, None) == Effect::ReadOnly
}

/// The `done` records of a call's returned tool calls not yet written: they go out with
/// the call's next intent (one append per step, not two) or at the end of the call. Lives
/// in the call's extensions.
#[derive(Debug, Default)]
struct PendingEnds(Mutex<Vec<IntentRecord>>);

impl PendingEnds {
    fn take(&self) -> Vec<IntentRecord> {
        std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn push(&self, record: IntentRecord) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(record);
    }
}

/// Writes intents before non-idempotent tool calls and turns a dead call's intent into an
/// `outcome_unknown` result on the session's next call (module docs). Sits outside the
/// session log, so what it adds to the conversation is recorded.
#[derive(Debug)]
pub(crate) struct IntentLayer {
    agent: String,
}

impl IntentLayer {
    pub(crate) fn new(agent: impl Into<String>) -> Self {
        Self {
            agent: agent.into(),
        }
    }

    fn path(&self, session: &str) -> std::result::Result<FsPath, hame_fs::Error> {
        FsPath::parse(&format!(
            "agents/{}/sessions/{session}.intents.jsonl",
            self.agent
        ))
    }

    async fn write(
        &self,
        ws: &Workspace,
        session: &str,
        records: &[IntentRecord],
        options: AppendOptions,
    ) -> std::result::Result<(), hame_fs::Error> {
        let mut bytes = Vec::new();
        for r in records {
            // Serialising plain strings cannot fail.
            if let Ok(line) = serde_json::to_vec(r) {
                bytes.extend(line);
                bytes.push(b'\n');
            }
        }
        ws.records()
            .append(&self.path(session)?, bytes, options)
            .await
    }

    /// The records and the file's size.
    async fn read(
        &self,
        ws: &Workspace,
        session: &str,
    ) -> std::result::Result<(Vec<IntentRecord>, usize), hame_fs::Error> {
        let bytes = match ws.records().read_bytes(&self.path(session)?).await {
            Ok(b) => b,
            Err(e) if e.is_not_found() => return Ok((Vec::new(), 0)),
            Err(e) => return Err(e),
        };
        // A line cut by a crash mid-append is skipped.
        let records = bytes
            .split(|b| *b == b'\n')
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        Ok((records, bytes.len()))
    }
}

#[async_trait]
impl Layer for IntentLayer {
    fn name(&self) -> &str {
        "intents"
    }

    async fn call(
        &self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
        next: CallNext<'_>,
    ) -> Result<CallOutput> {
        let (out, pending) = next.run_collecting::<PendingEnds>(cx, input).await;
        let ends = pending.take();
        if let (false, Some(ws)) = (ends.is_empty(), cx.extensions.get::<Workspace>()) {
            // Not flushed: the call's last step made no intent after them. A crash before
            // they land reports those calls as `outcome_unknown` (whether they took effect
            // is then unknown to the session's record too), never runs them again.
            let session = cx.runtime.session_id.clone();
            if let Err(e) = self
                .write(ws, &session, &ends, AppendOptions::atomic())
                .await
            {
                tracing::warn!(session = %session, error = %e, "marking tool call intents done failed");
            }
        }
        out
    }

    async fn append(
        &self,
        cx: &mut CallCtx<'_>,
        message: Message,
        next: AppendNext<'_>,
    ) -> Result<()> {
        let ws = cx.extensions.get::<Workspace>().cloned();
        let (Some(ws), Role::User, None) = (ws, message.role, &cx.state.pending) else {
            return next.run(cx, message).await;
        };
        let session = cx.runtime.session_id.clone();
        let unknown = match self.read(&ws, &session).await {
            Ok((records, size)) => {
                let open = unresolved(&records);
                // Everything in it is resolved: a file past its bound is dropped (the
                // session lease keeps this call alone in the session, so no tool call of
                // it is writing).
                if open.is_empty()
                    && size > MAX_RESOLVED_BYTES
                    && let Ok(path) = self.path(&session)
                    && let Err(e) = ws
                        .records()
                        .delete(&path, hame_fs::DeleteOptions::default())
                        .await
                {
                    tracing::debug!(session = %session, error = %e, "dropping resolved intents failed");
                }
                open
            }
            Err(e) => {
                tracing::warn!(session = %session, error = %e, "reading the tool call intents failed");
                Vec::new()
            }
        };
        next.run(cx, message).await?;
        if unknown.is_empty() {
            return Ok(());
        }
        tracing::warn!(session = %session, calls = unknown.len(), "tool calls whose process died: reported as outcome_unknown, not run again");
        for m in outcome_unknown_messages(&unknown) {
            next.run(cx, m).await?;
        }
        // In the conversation (and its log) first, then marked: a crash in between reports
        // them once more rather than never.
        let ends: Vec<IntentRecord> = unknown
            .iter()
            .map(|r| IntentRecord {
                call_id: r.call_id.clone(),
                tool: None,
                args: None,
                key: None,
                end: Some(OUTCOME_UNKNOWN.to_owned()),
            })
            .collect();
        if let Err(e) = self
            .write(&ws, &session, &ends, AppendOptions::atomic())
            .await
        {
            tracing::warn!(session = %session, error = %e, "marking tool call intents failed");
        }
        Ok(())
    }

    async fn tool(&self, cx: &ToolCtx<'_>, call: ToolCall, next: ToolNext<'_>) -> ToolOutcome {
        let ws = cx.tool.extensions.get::<Workspace>().cloned();
        let Some(ws) = ws.filter(|_| !is_idempotent(&call.name)) else {
            return next.run(cx, call).await;
        };
        let session = cx.tool.runtime.session_id.clone();
        let intent = IntentRecord {
            call_id: call.id.clone(),
            tool: Some(call.name.clone()),
            args: Some(call.arguments.clone()),
            key: Some(cx.tool.idempotency_key()),
            end: None,
        };
        // Durable before the call acts; the ends of the call's earlier tool calls go with it
        // (before it in the file, so a reader sees them resolved in order).
        let pending = cx.tool.extensions.get_arc::<PendingEnds>();
        let mut records = pending.as_ref().map(|p| p.take()).unwrap_or_default();
        records.push(intent);
        if let Err(e) = self
            .write(&ws, &session, &records, AppendOptions::default())
            .await
        {
            tracing::warn!(session = %session, error = %e, "writing the tool call intent failed; running the call anyway");
        }
        let call_id = call.id.clone();
        let out = next.run(cx, call).await;
        let end = IntentRecord {
            call_id,
            tool: None,
            args: None,
            key: None,
            end: Some("done".to_owned()),
        };
        match pending {
            // Written with the call's next intent or at its end.
            Some(p) => p.push(end),
            None => {
                if let Err(e) = self
                    .write(&ws, &session, &[end], AppendOptions::atomic())
                    .await
                {
                    tracing::warn!(session = %session, error = %e, "marking the tool call intent done failed");
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(id: &str) -> IntentRecord {
        IntentRecord {
            call_id: id.into(),
            tool: Some("execute".into()),
            args: Some("{\"command\":\"x\"}".into()),
            key: Some("k".into()),
            end: None,
        }
    }

    fn end(id: &str, how: &str) -> IntentRecord {
        IntentRecord {
            call_id: id.into(),
            tool: None,
            args: None,
            key: None,
            end: Some(how.into()),
        }
    }

    #[test]
    fn only_intents_without_an_end_are_unresolved() {
        let records = vec![
            intent("a"),
            end("a", "done"),
            intent("b"),
            intent("c"),
            end("c", OUTCOME_UNKNOWN),
            intent("b"),
        ];
        assert_eq!(unresolved(&records), vec![intent("b")]);
        assert!(unresolved(&[]).is_empty());
    }

    #[test]
    fn the_model_is_told_the_call_and_that_its_outcome_is_unknown() {
        let [call, result] = outcome_unknown_messages(&[intent("c1")]);
        assert_eq!(call.role, Role::Assistant);
        assert_eq!(call.tool_calls().count(), 1);
        let r = result
            .tool_results_iter()
            .next()
            .unwrap_or_else(|| panic!("no result"));
        assert_eq!(r.id, "c1");
        assert_eq!(r.code.as_deref(), Some(OUTCOME_UNKNOWN));
        assert!(r.content.contains("NOT run again"), "{}", r.content);
        assert!(r.content.contains("{\"command\":\"x\"}"), "{}", r.content);
    }

    #[test]
    fn read_only_tools_are_idempotent() {
        assert!(is_idempotent("read_file"));
        assert!(!is_idempotent("execute"));
        assert!(!is_idempotent("my_custom_tool"));
    }
}
