//! The typed event stream of one call.

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::message::{Message, Usage};

/// Something that happened during a call, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentEvent {
    /// A reasoning step (one model request) begins.
    StepStarted {
        /// 1-based step number within the call.
        iteration: usize,
    },
    /// A piece of answer text.
    TextDelta {
        /// The text.
        text: String,
    },
    /// A piece of reasoning text.
    ReasoningDelta {
        /// The text.
        text: String,
    },
    /// A tool call starts.
    ToolStarted {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments as the model sent them.
        arguments: String,
    },
    /// A tool call finished.
    ToolFinished {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// Wall time in milliseconds.
        duration_ms: u64,
        /// Whether the result is an error.
        is_error: bool,
        /// The error code, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
    /// A model request was answered (its whole stream read), after `duration_ms`.
    ModelResponded {
        /// Wall time of the request, in milliseconds.
        duration_ms: u64,
    },
    /// Usage of one model request.
    Usage {
        /// Token counts.
        usage: Usage,
    },
    /// The model request failed and is retried after a layer acted (e.g. compaction).
    ModelRetry {
        /// Why.
        reason: String,
    },
    /// History was compacted.
    Compaction {
        /// Estimated prompt tokens before.
        before_tokens: u64,
        /// Estimated prompt tokens after.
        after_tokens: u64,
        /// First sequence number replaced by the summary.
        from_seq: u64,
        /// Last sequence number replaced by the summary.
        to_seq: u64,
    },
    /// An event from a harness capability (memory, subagents, ...).
    Custom {
        /// Event kind, e.g. `memory.flush`.
        kind: String,
        /// Details.
        data: serde_json::Value,
    },
    /// An event of a subagent's run (its step, text, tool calls, end), tagged with its task
    /// and its declaration id.
    Subagent {
        /// The task id (`task-…`).
        task_id: String,
        /// The subagent's declaration id.
        agent_id: String,
        /// The child's event.
        event: Box<AgentEvent>,
    },
    /// A layer suspended a tool call; it waits for a decision.
    ToolSuspended {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// Why, with the id to resume it by.
        suspension: crate::Suspension,
    },
    /// The call stopped because tool calls wait for decisions (last event).
    Suspended {
        /// The waiting calls.
        calls: Vec<crate::SuspendedCall>,
    },
    /// The call finished with this reply.
    Finished {
        /// The final assistant message.
        reply: Message,
        /// Usage summed over the call.
        usage: Usage,
    },
    /// The call failed.
    Failed {
        /// What went wrong.
        message: String,
    },
}

/// Where events of a call go. Cheap to clone; a sink without a receiver drops events.
#[derive(Debug, Clone, Default)]
pub struct EventSink {
    tx: Option<mpsc::UnboundedSender<AgentEvent>>,
}

impl EventSink {
    /// A sink that discards everything.
    pub fn none() -> Self {
        Self { tx: None }
    }

    /// A sink and the receiver of its events.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<AgentEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx: Some(tx) }, rx)
    }

    /// Emits an event; a closed receiver is ignored.
    pub fn emit(&self, event: AgentEvent) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(event);
        }
    }

    /// Whether anyone listens.
    pub fn is_active(&self) -> bool {
        self.tx.as_ref().is_some_and(|t| !t.is_closed())
    }
}
