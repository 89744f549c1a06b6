//! The runtime context of one call: who is calling, in which session.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// Key in [`RuntimeContext::extras`] holding the id of the current call (set by the
/// harness for every call; the session log records it on every line).
pub const CALL_ID_EXTRA: &str = "hame.call_id";

/// Who is calling and in which session. Reaches every layer and every tool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RuntimeContext {
    /// Session id; the same id resumes the same conversation.
    pub session_id: String,
    /// User id, when the caller has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// Free-form values for layers and tools.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extras: BTreeMap<String, serde_json::Value>,
}

impl RuntimeContext {
    /// A context for `session_id` with no user.
    pub fn new(session_id: impl Into<String>) -> Self {
        Self {
            session_id: session_id.into(),
            user_id: None,
            extras: BTreeMap::new(),
        }
    }

    /// Sets the user id.
    pub fn with_user(mut self, user_id: impl Into<String>) -> Self {
        self.user_id = Some(user_id.into());
        self
    }

    /// The id of the current call ([`CALL_ID_EXTRA`]), when the harness set one.
    pub fn call_id(&self) -> Option<&str> {
        self.extras.get(CALL_ID_EXTRA).and_then(|v| v.as_str())
    }

    /// Adds an extra value.
    pub fn with_extra(mut self, key: impl Into<String>, value: serde_json::Value) -> Self {
        self.extras.insert(key.into(), value);
        self
    }
}

/// What a tool sees of the call it runs in.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The call's runtime context.
    pub runtime: RuntimeContext,
    /// The id of the tool call being served.
    pub call_id: String,
    /// Cancelled when the call is cancelled or the tool times out; long tools should watch it.
    pub cancel: CancellationToken,
    /// Typed values of the call: in the harness, the caller's tenant workspace handle
    /// (its files, state and identity).
    pub extensions: crate::Extensions,
    /// Structured facts about this call for its observation (see [`ToolFacts`]); the
    /// model-facing text is the tool's output, unchanged.
    ///
    /// [`ToolFacts`]: crate::ToolFacts
    pub facts: crate::ToolFacts,
}

/// The idempotency key a tool call carries instead of its own (see
/// [`ToolContext::idempotency_key`]), in the call's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(pub String);

impl ToolContext {
    /// A context for a tool call outside a loop (tests, direct use).
    pub fn new(runtime: RuntimeContext, call_id: impl Into<String>) -> Self {
        Self {
            runtime,
            call_id: call_id.into(),
            cancel: CancellationToken::new(),
            extensions: crate::Extensions::new(),
            facts: crate::ToolFacts::default(),
        }
    }

    /// The structured facts of this call (shared by every clone of the context).
    pub fn facts(&self) -> &crate::ToolFacts {
        &self.facts
    }

    /// Sets the extensions.
    pub fn with_extensions(mut self, extensions: crate::Extensions) -> Self {
        self.extensions = extensions;
        self
    }

    /// A key naming this tool call for the outside world: the same for the same user,
    /// session and call id, whichever process runs the call and however often (a retry,
    /// a resumption after a crash), different for any other call. A tool that changes
    /// something elsewhere passes it to that system (an `Idempotency-Key` header, a
    /// unique column) so that a second run of the same call is recognised there.
    /// `hame-` and 32 hex digits (two FNV-1a 64 hashes).
    ///
    /// The harness may hand a call another call's key through an [`IdempotencyKey`] in the
    /// extensions: the model's new call of a tool with the same arguments as a call whose
    /// outcome is unknown is the same operation, so it carries that call's key.
    pub fn idempotency_key(&self) -> String {
        if let Some(IdempotencyKey(key)) = self.extensions.get::<IdempotencyKey>() {
            return key.clone();
        }
        let user = self.runtime.user_id.as_deref().unwrap_or("");
        let parts = [
            user,
            self.runtime.session_id.as_str(),
            self.call_id.as_str(),
        ];
        let hash = |seed: u64| {
            let mut h = seed;
            for part in parts {
                for b in part.bytes().chain([0xff]) {
                    h ^= u64::from(b);
                    h = h.wrapping_mul(0x0000_0100_0000_01b3);
                }
            }
            h
        };
        format!(
            "hame-{:016x}{:016x}",
            hash(0xcbf2_9ce4_8422_2325),
            hash(0x6c62_272e_07bb_0142)
        )
    }
}
