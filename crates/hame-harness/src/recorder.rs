//! The session-log layer: every message of every call goes to the never-compacted log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hame_core::{
    AppendNext, CallCtx, CallInput, CallNext, CallOutput, Layer, Message, Role, RuntimeContext,
};
use hame_fs::{AppendOptions, Durability};
use hame_session::{IndexUpdate, SessionLog, SessionLogOptions, TailCheck};
use hame_tools::Workspace;

pub use hame_core::CALL_ID_EXTRA;

/// Cached session logs kept per tenant before the cache is cleared.
const MAX_CACHED_LOGS: usize = 4096;

/// Appends each message to `agents/<agent>/sessions/<session>.log.jsonl` in the caller's
/// records ([`Workspace::records`]) before it joins the conversation, so the log is never
/// behind the state. Outermost of the built-in layers: it records messages as the model
/// and the user made them (a tool result before offloading shortens it).
#[derive(Debug)]
pub struct SessionRecorder {
    agent: String,
    logs: Mutex<HashMap<String, Arc<SessionLog>>>,
}

/// What one call has for the log: messages not yet written, the title candidate, the end
/// of the sequence range written and whether the last append was flushed. It lives in the
/// call's extensions (put there by the layer's `call`), so it ends with the call: no table
/// of calls to bound, nothing left behind by a call whose future was dropped.
#[derive(Debug, Default)]
struct CallRecord {
    title: Option<String>,
    pending: Vec<Message>,
    /// The end of the sequence range written by this call, for the index update.
    end: u64,
    /// A message of this call reached the layer.
    appended: bool,
    /// The call's last append to the log was not flushed (a tool result): the log is
    /// synced before the call ends, so before its state is saved.
    unsynced: bool,
    /// An append of this call checked the log's tail (a `stat`); under the session's lease
    /// the later ones trust it ([`TailCheck::TrustWhileLeased`]).
    tail_checked: bool,
}

/// The call's [`CallRecord`] in its extensions.
type CallCell = Mutex<CallRecord>;

fn lock(cell: &CallCell) -> std::sync::MutexGuard<'_, CallRecord> {
    // Nothing is left half-updated under this lock: a poisoned one is still consistent.
    cell.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SessionRecorder {
    /// A recorder for `agent`.
    pub fn new(agent: impl Into<String>) -> Self {
        Self {
            agent: agent.into(),
            logs: Mutex::new(HashMap::new()),
        }
    }

    /// The session log of the caller (cached, so sequence numbers are recovered once).
    pub fn log_for(
        &self,
        runtime: &RuntimeContext,
        ws: &Workspace,
    ) -> Result<Arc<SessionLog>, hame_core::Error> {
        let key = tenant_key(runtime);
        let mut logs = self
            .logs
            .lock()
            .map_err(|_| hame_core::Error::other("session log cache poisoned"))?;
        if let Some(log) = logs.get(&key) {
            return Ok(log.clone());
        }
        let fs = ws.records().clone();
        // The index is updated once per call (in on_call_end), not once per message.
        let options = SessionLogOptions {
            update_index: false,
            ..SessionLogOptions::default()
        };
        let log = Arc::new(
            SessionLog::with_options(fs, &self.agent, options)
                .map_err(|e| hame_core::Error::layer("session-log", e))?,
        );
        if logs.len() >= MAX_CACHED_LOGS {
            logs.clear();
        }
        logs.insert(key, log.clone());
        Ok(log)
    }
}

impl SessionRecorder {
    async fn write(
        &self,
        runtime: &RuntimeContext,
        ws: &Workspace,
        call_id: &str,
        messages: &[Message],
        (options, check): (AppendOptions, TailCheck),
    ) -> Result<u64, hame_core::Error> {
        let log = self.log_for(runtime, ws)?;
        let written = log
            .append_messages_checked(&runtime.session_id, call_id, messages, options, check)
            .await
            .map_err(|e| hame_core::Error::layer("session-log", e))?;
        Ok(written.end)
    }
}

fn handle<'a>(cx: &'a CallCtx<'_>) -> Result<&'a Workspace, hame_core::Error> {
    cx.extensions
        .get::<Workspace>()
        .ok_or_else(|| hame_core::Error::layer("session-log", "the call has no workspace handle"))
}

/// How an append of the call learns the log's end: a `stat` for its first append, or when
/// the call holds no session lease; after that, under the lease, the tail this process left
/// (no other writer can have appended: the lease keeps them out).
fn tail_check(cx: &CallCtx<'_>, checked: bool) -> TailCheck {
    if checked && cx.extensions.get::<hame_state::Lease>().is_some() {
        TailCheck::TrustWhileLeased
    } else {
        TailCheck::Stat
    }
}

/// Fails when the call's session lease is lost: nothing more is written for this call.
fn check_lease(cx: &CallCtx<'_>) -> Result<(), hame_core::Error> {
    match cx.extensions.get::<hame_state::Lease>() {
        Some(lease) => lease
            .check()
            .map_err(|e| hame_core::Error::layer("session-log", e)),
        None => Ok(()),
    }
}

impl SessionRecorder {
    /// Writes what the call left pending (or flushes what it left unflushed) and updates the
    /// session index once.
    async fn finish(&self, cx: &CallCtx<'_>, cell: &CallCell) -> Result<(), hame_core::Error> {
        let mut call = std::mem::take(&mut *lock(cell));
        if !call.appended {
            // Nothing of this call reached the conversation.
            return Ok(());
        }
        let call_id = call_id(cx.runtime);
        let ws = handle(cx)?;
        if !call.pending.is_empty() {
            check_lease(cx)?;
            // A call that failed or was suspended mid-step: what joined the state is logged
            // (and flushed, with any unflushed tool results) before the state is saved.
            let end = self
                .write(
                    cx.runtime,
                    ws,
                    &call_id,
                    &call.pending,
                    (AppendOptions::default(), tail_check(cx, call.tail_checked)),
                )
                .await?;
            call.end = call.end.max(end);
        } else if call.unsynced {
            // The call ended after a tool result (failed, cancelled, out of steps): its
            // records are flushed before the state that holds them is saved.
            check_lease(cx)?;
            self.log_for(cx.runtime, ws)?
                .sync(&cx.runtime.session_id)
                .await
                .map_err(|e| hame_core::Error::layer("session-log", e))?;
        }
        // Once the session's entry has its title, later calls leave it: what they change
        // (the count and the time of the last record) is read from the log by listings
        // whenever the log is newer than the entry (ADR 0017). A rewrite per call made a new
        // file per call (the index is replaced atomically), which was most of a short
        // turn's cost on disk.
        let log = self.log_for(cx.runtime, ws)?;
        let mut update = IndexUpdate::new().with_message_count_at_least(call.end);
        if let Some(t) = call.title {
            update = update.with_title_if_unset(t);
        }
        // The log is the truth and already durable; a lagging index is repaired by the next
        // update or by `SessionLog::rebuild_index`, so a failure here does not fail the call.
        match log.update_index_once(&cx.runtime.session_id, &update).await {
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(session = %cx.runtime.session_id, error = %e, "session index update failed; the log is intact");
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Layer for SessionRecorder {
    fn name(&self) -> &str {
        "session-log"
    }

    async fn call(
        &self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
        next: CallNext<'_>,
    ) -> Result<CallOutput, hame_core::Error> {
        // This call's record, for the appends below and the end of the call.
        let (out, cell) = next.run_collecting::<CallCell>(cx, input).await;
        let end = self.finish(cx, &cell).await;
        match (out, end) {
            (Ok(o), Ok(())) => Ok(o),
            // The first failure is the one the caller needs to see.
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        }
    }

    async fn append(
        &self,
        cx: &mut CallCtx<'_>,
        message: Message,
        next: AppendNext<'_>,
    ) -> Result<(), hame_core::Error> {
        let call_id = call_id(cx.runtime);
        // A tool-call message and the user's input wait for the step's next message so that a
        // step costs one append; the final reply and tool results are written at once.
        // Nothing waits past the end of the call, and the state is only saved after.
        // Tool results are appended without a flush: another step follows, and its synced
        // append (or the sync at the call's end) flushes them with it, so a call with tools
        // pays one `fdatasync` for its log, not one per step. A process crash loses nothing
        // (the bytes are in the OS's page cache); a machine crash can lose the unflushed
        // steps of the call it interrupted, whose state was not saved either.
        let cell = cx.extensions.get_arc::<CallCell>();
        // Outside a call of this layer (not done by the harness) nothing would flush later.
        let options = if message.role == Role::Tool && cell.is_some() {
            AppendOptions::atomic()
        } else {
            AppendOptions::default()
        };
        let mut checked = false;
        let pending = match &cell {
            Some(cell) => {
                let mut record = lock(cell);
                checked = record.tail_checked;
                record.appended = true;
                if record.title.is_none() && message.role == Role::User {
                    record.title = Some(message.text_content());
                }
                record.pending.push(message.clone());
                let defer = message.role == Role::User || message.has_tool_calls();
                if defer {
                    None
                } else {
                    Some(std::mem::take(&mut record.pending))
                }
            }
            None => Some(vec![message.clone()]),
        };
        if let Some(pending) = pending {
            check_lease(cx)?;
            let check = tail_check(cx, checked);
            let end = self
                .write(
                    cx.runtime,
                    handle(cx)?,
                    &call_id,
                    &pending,
                    (options, check),
                )
                .await?;
            if let Some(cell) = &cell {
                let mut record = lock(cell);
                record.tail_checked = true;
                record.end = record.end.max(end);
                record.unsynced = options.durability != Durability::Synced;
            }
        }
        next.run(cx, message).await
    }
}

/// The key of the caller's tenant in the recorder's caches.
fn tenant_key(runtime: &RuntimeContext) -> String {
    runtime
        .user_id
        .clone()
        .unwrap_or_else(|| format!("anonymous/{}", runtime.session_id))
}

fn call_id(runtime: &RuntimeContext) -> String {
    runtime.call_id().unwrap_or("unknown").to_owned()
}
