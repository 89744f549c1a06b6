//! Durable suspension of tool calls: a layer answers a call "not now" (a human must approve
//! it, a sandbox must run it elsewhere); the step is saved with the state and a later
//! process resumes it with a decision.

use serde::{Deserialize, Serialize};

use crate::message::{ToolCall, ToolResult, Usage};

/// Why a layer suspended a tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suspension {
    /// Id of the pending decision, unique within the session (what `hame approve ID` names).
    /// Assigned by the loop; a layer leaves it empty.
    #[serde(default)]
    pub id: String,
    /// The layer that suspended the call; on resume, the decision is addressed to it.
    pub layer: String,
    /// Why, in words for the person who decides.
    pub reason: String,
    /// The layer's own data (e.g. the matched rule).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub data: serde_json::Value,
}

impl Suspension {
    /// A suspension by `layer` for `reason`.
    pub fn new(layer: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            id: String::new(),
            layer: layer.into(),
            reason: reason.into(),
            data: serde_json::Value::Null,
        }
    }

    /// Attaches the layer's data.
    pub fn with_data(mut self, data: serde_json::Value) -> Self {
        self.data = data;
        self
    }
}

/// One tool call of a suspended step: either finished (its result is kept) or waiting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    /// The call as the model made it.
    pub call: ToolCall,
    /// Its result, when it ran (or was answered) before the step was suspended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ToolResult>,
    /// Why it waits, when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspension: Option<Suspension>,
}

/// A step whose tool calls wait for decisions. Saved in [`AgentState::pending`](crate::AgentState::pending):
/// the assistant message with the calls is the last message of the conversation, and the
/// results join it when every call is decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingStep {
    /// Reasoning steps the call had taken, so the step limit holds across the pause.
    pub iteration: usize,
    /// Usage of the call so far.
    #[serde(default)]
    pub usage: Usage,
    /// The step's calls, in the model's order.
    pub calls: Vec<PendingCall>,
}

impl PendingStep {
    /// The calls still waiting, with their suspensions.
    pub fn waiting(&self) -> impl Iterator<Item = (&ToolCall, &Suspension)> {
        self.calls
            .iter()
            .filter_map(|c| c.suspension.as_ref().map(|s| (&c.call, s)))
    }

    /// What callers see of it.
    pub fn to_suspended(&self) -> Suspended {
        Suspended {
            calls: self
                .waiting()
                .map(|(call, s)| SuspendedCall {
                    call: call.clone(),
                    suspension: s.clone(),
                })
                .collect(),
        }
    }
}

/// A decision for a suspended call, addressed by [`Suspension::id`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resolution {
    /// The suspension id.
    pub id: String,
    /// The decision, in the suspending layer's terms (e.g. `{"approve": true}`).
    pub value: serde_json::Value,
}

impl Resolution {
    /// A decision for suspension `id`.
    pub fn new(id: impl Into<String>, value: serde_json::Value) -> Self {
        Self {
            id: id.into(),
            value,
        }
    }
}

/// A call that is suspended, waiting for decisions (returned as
/// [`Error::Suspended`](crate::Error::Suspended)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suspended {
    /// The waiting tool calls.
    pub calls: Vec<SuspendedCall>,
}

/// One waiting tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuspendedCall {
    /// The call.
    pub call: ToolCall,
    /// Why it waits.
    pub suspension: Suspension,
}

impl std::fmt::Display for Suspended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the call is suspended, waiting for ")?;
        for (i, c) in self.calls.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(
                f,
                "{} ({} by {}: {})",
                c.suspension.id, c.call.name, c.suspension.layer, c.suspension.reason
            )?;
        }
        Ok(())
    }
}

/// A short id for a suspension, stable for the same call at the same place in the session:
/// 12 hex digits of a hash of the conversation length, the call id and the tool name.
pub(crate) fn suspension_id(position: usize, call: &ToolCall) -> String {
    // FNV-1a: tiny, stable across builds and platforms (unlike `DefaultHasher`).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{position}\u{0}{}\u{0}{}", call.id, call.name).bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("ap-{:012x}", h & 0xffff_ffff_ffff)
}
