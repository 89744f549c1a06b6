//! Action observations: one structured record per tool call, kept apart from the chat
//! messages (issue #33, ADR 0035).
//!
//! A tool reports structured facts about what it did (an exit code, a content hash before
//! and after a write, an MCP `isError`) through [`ToolContext::facts`](crate::ToolContext::facts);
//! the text the model sees stays as the tool returns it. The harness turns each finished
//! call into an [`Observation`] and appends it to the session's observations file.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Structured facts a tool reports about one call, beside its model-facing text.
///
/// Shared by the clones of one [`ToolContext`](crate::ToolContext): a layer that makes a new
/// context for the rest of the chain with `..cx.tool.clone()` keeps the same facts.
#[derive(Debug, Clone, Default)]
pub struct ToolFacts(Arc<Mutex<serde_json::Map<String, serde_json::Value>>>);

impl ToolFacts {
    /// Sets one fact (a later value of the same key replaces the earlier one).
    pub fn set(&self, key: impl Into<String>, value: impl Into<serde_json::Value>) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.insert(key.into(), value.into());
    }

    /// The facts so far.
    pub fn snapshot(&self) -> serde_json::Map<String, serde_json::Value> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether no fact was set.
    pub fn is_empty(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_empty()
    }
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObservationOutcome {
    /// The tool returned a result.
    Ok,
    /// The tool (or a layer, a policy) returned an error.
    Error,
    /// The call ran past its timeout.
    Timeout,
    /// The call was cancelled.
    Cancelled,
    /// The process ended during the call: whether it had its effect is not known.
    OutcomeUnknown,
}

impl ObservationOutcome {
    /// The outcome of a finished call whose error code (if any) is `code`.
    pub fn of(code: Option<&str>) -> Self {
        match code {
            None => Self::Ok,
            Some(crate::tool::codes::TIMEOUT) => Self::Timeout,
            Some(crate::tool::codes::CANCELLED) => Self::Cancelled,
            Some(_) => Self::Error,
        }
    }

    /// The wire name (`ok`, `error`, `timeout`, `cancelled`, `outcome_unknown`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::OutcomeUnknown => "outcome_unknown",
        }
    }
}

/// One tool call as it happened: one line of `<session>.observations.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Unique id of the observation (`ob-` and 16 hex digits).
    pub id: String,
    /// The tool call id the model gave.
    pub call_id: String,
    /// 1 for the first run of the call, 2 for its run after a resumption, ...
    pub attempt: u32,
    /// The tool's name.
    pub tool: String,
    /// Hex SHA-256 of the arguments' JSON (keys sorted).
    pub args_hash: String,
    /// The step of the call (1-based).
    #[serde(default)]
    pub step: usize,
    /// When the call started.
    pub started: DateTime<Utc>,
    /// When it ended.
    pub ended: DateTime<Utc>,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
    /// How it ended.
    pub outcome: ObservationOutcome,
    /// The error code, when the outcome is not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The [`ToolContext::idempotency_key`](crate::ToolContext::idempotency_key) of a call
    /// the harness recorded an intent for, when the observation was made from that intent
    /// on resumption (`outcome_unknown`, reconciled, run again): with `call_id` it names
    /// the intent record in `<session>.intents.jsonl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The producer's structured facts (`exit_code`, `stdout_truncated`, `path`,
    /// `hash_before`, `is_error`, ...).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub facts: serde_json::Map<String, serde_json::Value>,
}

/// How a verifier's check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckOutcome {
    /// The check passed.
    Passed,
    /// The check ran and failed (wrong exit code, the file does not match its schema, the
    /// file does not exist).
    Failed,
    /// The check could not run (no shell, an unreadable schema, a timeout).
    Error,
}

/// What a check recorded: the evidence a run's completion rests on. One line of
/// `<session>.evidence.jsonl`; the newest line of a check is its current evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// Unique id (`ev-` and 16 hex digits).
    pub id: String,
    /// The check's name (`tests`, `report`).
    pub check: String,
    /// How it ended.
    pub outcome: CheckOutcome,
    /// The command's exit code, for a command check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The observation of the check's run.
    pub observation_id: String,
    /// The version of what it checked: a hex SHA-256 over the paths and content hashes
    /// of the covered files.
    pub version: String,
    /// How many files the version covers.
    pub files: usize,
    /// The globs of the covered files (`!` excludes), as the version was computed.
    #[serde(default)]
    pub covers: Vec<String>,
    /// When the check ended.
    pub at: DateTime<Utc>,
    /// Wall time of the check in milliseconds.
    pub duration_ms: u64,
    /// What failed, for the model and the user (the tail of the output, the schema
    /// error); empty when it passed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// Whether a covered file changed since (computed when the evidence is read; never
    /// stored as `true`).
    #[serde(default)]
    pub stale: bool,
}

/// Whether a call's completion is backed by evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerificationStatus {
    /// Every required check passed on the files as the reply left them.
    Verified,
    /// A required check still failed after the extra steps (`--verify-attempts`).
    Unverified,
}

/// The completion gate's verdict on a call with required checks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verification {
    /// Verified or not.
    pub status: VerificationStatus,
    /// The current evidence of each required check.
    pub evidence: Vec<Evidence>,
    /// How many extra steps the gate gave the model.
    pub extra_steps: u32,
}
