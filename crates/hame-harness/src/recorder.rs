//! The session-log middleware: every message of every call goes to the never-compacted log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hame_core::{CallCtx, Message, Middleware, RuntimeContext};
use hame_session::SessionLog;

use crate::tenancy::Tenancy;

/// Key in [`RuntimeContext::extras`] holding the id of the current call.
pub const CALL_ID_EXTRA: &str = "hame.call_id";

/// Cached session logs kept per tenant before the cache is cleared.
const MAX_CACHED_LOGS: usize = 4096;

/// Appends each message to `agents/<agent>/sessions/<session>.log.jsonl` in the caller's
/// namespace as soon as it joins the conversation, so the log is never behind the state.
#[derive(Debug)]
pub struct SessionRecorder {
    tenancy: Arc<Tenancy>,
    agent: String,
    logs: Mutex<HashMap<String, Arc<SessionLog>>>,
}

impl SessionRecorder {
    /// A recorder for `agent` over the tenancy's store.
    pub fn new(tenancy: Arc<Tenancy>, agent: impl Into<String>) -> Self {
        Self {
            tenancy,
            agent: agent.into(),
            logs: Mutex::new(HashMap::new()),
        }
    }

    /// The session log of the caller (cached, so sequence numbers are recovered once).
    pub fn log_for(&self, runtime: &RuntimeContext) -> Result<Arc<SessionLog>, hame_core::Error> {
        let key = runtime
            .user_id
            .clone()
            .unwrap_or_else(|| format!("anonymous/{}", runtime.session_id));
        let mut logs = self
            .logs
            .lock()
            .map_err(|_| hame_core::Error::other("session log cache poisoned"))?;
        if let Some(log) = logs.get(&key) {
            return Ok(log.clone());
        }
        let fs = self
            .tenancy
            .session_fs(runtime)
            .map_err(|e| hame_core::Error::middleware("session-log", e))?;
        let log = Arc::new(
            SessionLog::new(fs, &self.agent)
                .map_err(|e| hame_core::Error::middleware("session-log", e))?,
        );
        if logs.len() >= MAX_CACHED_LOGS {
            logs.clear();
        }
        logs.insert(key, log.clone());
        Ok(log)
    }
}

#[async_trait]
impl Middleware for SessionRecorder {
    fn name(&self) -> &str {
        "session-log"
    }

    async fn on_message_appended(
        &self,
        cx: &mut CallCtx<'_>,
        message: &Message,
    ) -> Result<(), hame_core::Error> {
        let log = self.log_for(cx.runtime)?;
        let call_id = cx
            .runtime
            .extras
            .get(CALL_ID_EXTRA)
            .and_then(|v| v.as_str())
            .unwrap_or("unknown")
            .to_owned();
        match log
            .append_messages(
                &cx.runtime.session_id,
                &call_id,
                std::slice::from_ref(message),
            )
            .await
        {
            Ok(_) => Ok(()),
            // The record is durable; only the index lagged. It is repaired by the next update.
            Err(hame_session::Error::IndexNotUpdated { .. }) => {
                tracing::warn!(session = %cx.runtime.session_id, "session index update failed; the log is intact");
                Ok(())
            }
            Err(e) => Err(hame_core::Error::middleware("session-log", e)),
        }
    }
}
