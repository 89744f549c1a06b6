//! The session-log layer: every message of every call goes to the never-compacted log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hame_core::{
    AppendNext, CallCtx, CallInput, CallNext, CallOutput, Layer, Message, Observation, Role,
    RuntimeContext,
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
    /// The call's observations, handed over by the `observations` layer
    /// ([`SessionRecorder::defer_observations`]): appended, synced, at the end of the call
    /// at the same time as the log's last append or flush (ADR 0043).
    observations: Vec<Observation>,
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
        let observations = std::mem::take(&mut call.observations);
        if !call.appended && observations.is_empty() {
            // Nothing of this call reached the conversation.
            return Ok(());
        }
        let call_id = call_id(cx.runtime);
        let ws = handle(cx)?;
        // What the call left to write or to flush: the messages still waiting (the reply;
        // those of a call that failed or was suspended mid-step) with one synced append, or
        // a flush of unflushed tool results (a call that ended after one). Both before the
        // state that holds them is saved; the observations' synced append at the same time,
        // each on its own blocking thread on a local disk, so that the file system commits
        // them together instead of one after the other (ADR 0043).
        let log_end = async {
            let end: Result<Option<u64>, hame_core::Error> = if !call.pending.is_empty() {
                check_lease(cx)?;
                let end = self
                    .write(
                        cx.runtime,
                        ws,
                        &call_id,
                        &call.pending,
                        (AppendOptions::default(), tail_check(cx, call.tail_checked)),
                    )
                    .await?;
                Ok(Some(end))
            } else if call.unsynced {
                check_lease(cx)?;
                self.log_for(cx.runtime, ws)?
                    .sync(&cx.runtime.session_id)
                    .await
                    .map_err(|e| hame_core::Error::layer("session-log", e))?;
                Ok(None)
            } else {
                Ok(None)
            };
            end
        };
        let observed = async {
            if observations.is_empty() {
                return Ok(());
            }
            self.log_for(cx.runtime, ws)?
                .append_observations(
                    &cx.runtime.session_id,
                    &observations,
                    AppendOptions::default(),
                )
                .await
                .map_err(|e| hame_core::Error::layer("observations", e))
        };
        let (logged, observed) = futures::future::join(log_end, observed).await;
        if let Err(e) = observed {
            // As when the observations layer wrote them itself: reported, not the call's
            // failure.
            tracing::warn!(error = %e, "the observations of the call could not be written");
        }
        if let Some(end) = logged? {
            call.end = call.end.max(end);
        }
        if !call.appended {
            return Ok(());
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

impl SessionRecorder {
    /// Takes the call's observations, to append them (synced) at the end of the call
    /// together with the log's last append, before the state is saved (ADR 0043). Outside
    /// a call of this layer they are handed back: the caller writes them itself.
    pub(crate) fn defer_observations(
        cx: &CallCtx<'_>,
        observations: Vec<Observation>,
    ) -> Result<(), Vec<Observation>> {
        match cx.extensions.get_arc::<CallCell>() {
            Some(cell) => {
                lock(&cell).observations.extend(observations);
                Ok(())
            }
            None => Err(observations),
        }
    }

    /// Takes back the observations handed over so far (none outside a call of this layer):
    /// for a layer that writes observations of its own in the middle of the call and keeps
    /// the file in the order of the calls (the `verify` layer's checks).
    pub(crate) fn take_observations(cx: &CallCtx<'_>) -> Vec<Observation> {
        cx.extensions
            .get_arc::<CallCell>()
            .map(|cell| std::mem::take(&mut lock(&cell).observations))
            .unwrap_or_default()
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
        // step costs one append; tool results are written at once. The reply (a message that
        // closes the turn) waits for the end of the call, where it is written, synced, at the
        // same time as the call's observations (ADR 0043). Nothing waits past the end of the
        // call, and the state is only saved after.
        // Tool results are appended without a flush: another step follows, and its synced
        // append (or the sync at the call's end) flushes them with it, so a call with tools
        // pays one `fdatasync` for its log, not one per step. A process crash loses nothing
        // that was appended (the bytes are in the OS's page cache); a machine crash can lose
        // the unflushed steps of the call it interrupted, whose state was not saved either.
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
                let defer = message.role != Role::Tool;
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
