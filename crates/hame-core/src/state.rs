//! [`AgentState`]: the serde document that is the resume snapshot of a session.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::message::{Message, Usage};

/// Current schema version of [`AgentState`].
///
/// - 1: messages, usage, extensions.
/// - 2: adds `pending` (a suspended step). A build that knows only version 1 refuses a
///   version 2 document instead of dropping the pending step.
pub const STATE_SCHEMA_VERSION: u32 = 2;

/// Everything needed to resume a session: the conversation as the model sees it (possibly
/// compacted) and the sub-states of harness capabilities, keyed by capability name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentState {
    /// Schema version of this document; see [`AgentState::from_json`].
    pub schema_version: u32,
    /// The conversation sent to the model (no system prompt: it is rebuilt every step).
    #[serde(default)]
    pub messages: Vec<Message>,
    /// Usage summed over the session's life.
    #[serde(default)]
    pub usage: Usage,
    /// A step whose tool calls wait for decisions (human approval, ...); see
    /// [`AgentLoop::run_env`](crate::AgentLoop::run_env).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<crate::PendingStep>,
    /// Capability sub-states (`memory`, `compaction`, `subagents`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extensions: BTreeMap<String, serde_json::Value>,
}

impl Default for AgentState {
    fn default() -> Self {
        Self {
            schema_version: STATE_SCHEMA_VERSION,
            messages: Vec::new(),
            usage: Usage::default(),
            pending: None,
            extensions: BTreeMap::new(),
        }
    }
}

/// A state document that cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateFormatError {
    /// The document was written by a newer hame.
    #[error("state schema version {found} is newer than this build supports ({supported})")]
    TooNew {
        /// Version in the document.
        found: u32,
        /// Newest version this build reads.
        supported: u32,
    },
    /// The document is not a valid state.
    #[error("invalid state document: {0}")]
    Invalid(#[from] serde_json::Error),
}

impl AgentState {
    /// Reads a state document of any known version, migrating it forward.
    ///
    /// Version 0 is the pre-release shape `{"messages": [...]}` with no version field.
    pub fn from_json(mut value: serde_json::Value) -> Result<Self, StateFormatError> {
        let version = value
            .get("schema_version")
            .and_then(serde_json::Value::as_u64)
            .map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX));
        if version > STATE_SCHEMA_VERSION {
            return Err(StateFormatError::TooNew {
                found: version,
                supported: STATE_SCHEMA_VERSION,
            });
        }
        // 0 -> 1 adds the version field; 1 -> 2 adds the optional `pending` step.
        if let (0 | 1, Some(obj)) = (version, value.as_object_mut()) {
            obj.insert(
                "schema_version".into(),
                serde_json::json!(STATE_SCHEMA_VERSION),
            );
        }
        Ok(serde_json::from_value(value)?)
    }

    /// Reads a state document from bytes.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, StateFormatError> {
        Self::from_json(serde_json::from_slice(bytes)?)
    }

    /// The sub-state of a capability, deserialised; `None` when absent or unreadable.
    pub fn extension<T: serde::de::DeserializeOwned>(&self, key: &str) -> Option<T> {
        // Deserialised from the borrowed tree: `from_value` would deep-copy it first (the
        // permission decisions and the token ledger are read this way every step).
        self.extensions
            .get(key)
            .and_then(|v| T::deserialize(v).ok())
    }

    /// Stores the sub-state of a capability.
    pub fn set_extension<T: Serialize>(
        &mut self,
        key: &str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        self.extensions
            .insert(key.to_owned(), serde_json::to_value(value)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn migrates_v0() -> Result<(), StateFormatError> {
        let v0 = serde_json::json!({"messages": [{"role":"user","content":[{"type":"text","text":"hi"}]}]});
        let s = AgentState::from_json(v0)?;
        assert_eq!(s.schema_version, STATE_SCHEMA_VERSION);
        assert_eq!(s.messages, vec![Message::user("hi")]);
        Ok(())
    }

    #[test]
    fn refuses_newer() {
        let r = AgentState::from_json(serde_json::json!({"schema_version": 99}));
        assert!(matches!(r, Err(StateFormatError::TooNew { found: 99, .. })));
    }

    #[test]
    fn round_trip_with_extensions() -> Result<(), Box<dyn std::error::Error>> {
        let mut s = AgentState::default();
        s.messages.push(Message::user("x"));
        s.set_extension("memory", &serde_json::json!({"watermark": 3}))?;
        let bytes = serde_json::to_vec(&s)?;
        let back = AgentState::from_slice(&bytes)?;
        assert_eq!(s, back);
        assert_eq!(
            back.extension::<serde_json::Value>("memory"),
            Some(serde_json::json!({"watermark": 3}))
        );
        Ok(())
    }
}
