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

use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use futures::FutureExt;
use hame_core::{
    AppendNext, CallCtx, CallInput, CallNext, CallOutput, ContentBlock, IdempotencyKey, Layer,
    Message, Observation, ObservationOutcome, Reconciled, Result, Role, ToolCall, ToolContext,
    ToolCtx, ToolFacts, ToolNext, ToolOutcome, ToolOutput, ToolResult, ToolRunOptions, ToolSet,
    to_tool_result,
};
use hame_fs::{AppendOptions, FsPath};
use hame_tools::Workspace;
use serde::{Deserialize, Serialize};

use crate::evidence::EvidenceStore;
use crate::permissions::Effect;
use crate::permissions::decide::effect_of;
use crate::tools_config::Idempotent;
use crate::tools_layer::ToolsConfigLayer;

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
            content: unknown_text(r),
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

/// What the model is told about a call whose outcome is unknown.
fn unknown_text(r: &IntentRecord) -> String {
    format!(
        "outcome_unknown: the process running this call of `{}` stopped before it \
         returned, so whether it took effect is unknown. It was NOT run again. Check \
         its effect before deciding to call it again (call id {}, arguments {}).",
        r.tool.as_deref().unwrap_or(""),
        r.call_id,
        r.args.as_deref().unwrap_or("{}")
    )
}

/// The records of an intents file and its size (none: no file). A line cut by a crash
/// mid-append is skipped.
async fn read_intents(
    ws: &Workspace,
    path: &FsPath,
) -> std::result::Result<(Vec<IntentRecord>, usize), hame_fs::Error> {
    let bytes = match ws.records().read_bytes(path).await {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let records = bytes
        .split(|b| *b == b'\n')
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect();
    Ok((records, bytes.len()))
}

/// Whether a call of `name` may simply be asked for again and needs no intent: the built-in
/// read-only tools.
pub fn is_idempotent(name: &str) -> bool {
    effect_of(name, None) == Effect::ReadOnly
}

/// How a cut call was settled on resumption.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// The tool's [`Tool::reconcile`](hame_core::Tool::reconcile) found its outcome.
    Reconciled(ToolOutput),
    /// The tool is [`idempotent`](hame_core::Tool::idempotent): it ran again, with the same
    /// call id and key.
    Rerun(ToolOutput),
    /// Nothing is known: the model is told `outcome_unknown`.
    Unknown,
}

impl Settled {
    /// The intent's end: `reconciled`, `done` (run again) or `outcome_unknown`.
    pub fn end(&self) -> &'static str {
        match self {
            Self::Reconciled(_) => "reconciled",
            Self::Rerun(_) => "done",
            Self::Unknown => OUTCOME_UNKNOWN,
        }
    }
}

/// The messages that put the cut calls back in the conversation: the calls, as the
/// assistant made them, and one result each — the reconciled or re-run output, or
/// `outcome_unknown` ([`outcome_unknown_messages`]).
pub fn settled_messages(settled: &[(IntentRecord, Settled)]) -> [Message; 2] {
    let unknown: Vec<IntentRecord> = settled.iter().map(|(r, _)| r.clone()).collect();
    let [calls, unknown_results] = outcome_unknown_messages(&unknown);
    let results = settled
        .iter()
        .zip(unknown_results.tool_results_iter())
        .map(|((r, how), told)| match how {
            Settled::Reconciled(out) | Settled::Rerun(out) => {
                to_tool_result(&r.call_id, out.clone())
            }
            Settled::Unknown => told.clone(),
        })
        .collect();
    [calls, Message::tool_results(results)]
}

/// The calls whose outcome was reported unknown and that the model has not called again:
/// `(tool, args, key)`. A new call of the same tool with the same arguments is the same
/// operation and carries that key (module docs).
pub fn unknown_keys(records: &[IntentRecord]) -> Vec<(String, String, String)> {
    let unknown: std::collections::BTreeSet<&str> = records
        .iter()
        .filter(|r| r.end.as_deref() == Some(OUTCOME_UNKNOWN))
        .map(|r| r.call_id.as_str())
        .collect();
    let mut out: Vec<(String, String, String)> = Vec::new();
    for r in records {
        let (Some(t), Some(a), Some(k), None) = (&r.tool, &r.args, &r.key, &r.end) else {
            continue;
        };
        // A later call carrying the key: the model called it again (and that call, if
        // cut too, is listed again below).
        out.retain(|(_, _, key)| key != k);
        if unknown.contains(r.call_id.as_str()) {
            out.push((t.clone(), a.clone(), k.clone()));
        }
    }
    out
}

/// Same tool and same arguments (as JSON values, so spacing and key order do not matter).
fn same_call(tool: &str, args: &str, other_tool: &str, other_args: &str) -> bool {
    if tool != other_tool {
        return false;
    }
    let parse = |a: &str| serde_json::from_str::<serde_json::Value>(a).ok();
    match (parse(args), parse(other_args)) {
        (Some(a), Some(b)) => a == b,
        _ => args == other_args,
    }
}

/// The keys of calls reported `outcome_unknown` in this session, for the calls of this
/// call (handed from [`IntentLayer`] to [`IntentToolLayer`] in the extensions).
#[derive(Debug, Default)]
struct UnknownKeys(std::sync::Mutex<Vec<(String, String, String)>>);

impl UnknownKeys {
    fn set(&self, keys: Vec<(String, String, String)>) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = keys;
    }

    /// The key of an unknown call the same as this one, taken (used once).
    fn take(&self, tool: &str, args: &str) -> Option<String> {
        let mut keys = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let i = keys
            .iter()
            .position(|(t, a, _)| same_call(tool, args, t, a))?;
        Some(keys.remove(i).2)
    }
}

/// The `done` records of a call's returned tool calls not yet written: they go out with
/// the call's next intent (one append per step, not two) or at the end of the call. Lives
/// in the call's extensions.
#[derive(Debug, Default)]
struct PendingEnds(std::sync::Mutex<Vec<IntentRecord>>);

impl PendingEnds {
    fn take(&self) -> Vec<IntentRecord> {
        std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Whether the end of `call_id` is waiting here (its call returned in this call).
    fn holds(&self, call_id: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .any(|r| r.call_id == call_id)
    }

    fn push(&self, record: IntentRecord) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(record);
    }
}

/// The intents file of `session` of `agent`.
fn intents_path(agent: &str, session: &str) -> std::result::Result<FsPath, hame_fs::Error> {
    FsPath::parse(&format!("agents/{agent}/sessions/{session}.intents.jsonl"))
}

async fn write_records(
    ws: &Workspace,
    path: &FsPath,
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
    ws.records().append(path, bytes, options).await
}

fn end_record(call_id: &str, end: &str) -> IntentRecord {
    IntentRecord {
        call_id: call_id.to_owned(),
        tool: None,
        args: None,
        key: None,
        end: Some(end.to_owned()),
    }
}

/// Turns a dead call's intent into its result on the session's next call — reconciled,
/// run again, or `outcome_unknown` (module docs) — and hands the unknown calls' keys to
/// [`IntentToolLayer`]. Sits outside the session log, so what it adds to the conversation
/// is recorded.
#[derive(Debug)]
pub(crate) struct IntentLayer {
    agent: String,
    /// The agent's own tools: the ones that can reconcile or be run again.
    tools: ToolSet,
    evidence: EvidenceStore,
    /// What each session's intents file held when a call last read it.
    seen: SeenIntents,
}

/// The intents files as calls last read them, by user and session.
#[derive(Debug, Default)]
struct SeenIntents(std::sync::Mutex<std::collections::HashMap<(Option<String>, String), Seen>>);

impl SeenIntents {
    fn key(user: Option<&str>, session: &str) -> (Option<String>, String) {
        (user.map(str::to_owned), session.to_owned())
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<(Option<String>, String), Seen>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Drops the session's last reading: its file was deleted (a file made again in its
    /// place could have the same size and, on a store with coarse times, the same time).
    fn forget(&self, user: Option<&str>, session: &str) {
        self.lock().remove(&Self::key(user, session));
    }

    /// The session's intents without an end, the keys of the calls reported unknown, and
    /// the file's size. A file whose size and modification time are those of this layer's
    /// last reading is not read again (a `stat` instead of a read and a parse of every
    /// record).
    async fn read(
        &self,
        ws: &Workspace,
        user: Option<&str>,
        session: &str,
        path: &FsPath,
    ) -> std::result::Result<(Vec<IntentRecord>, Vec<(String, String, String)>, u64), hame_fs::Error>
    {
        let key = Self::key(user, session);
        // Looked at before the read: a record appended in between makes the reading
        // newer than the stamp, so the next call reads again.
        let stamp = match ws.records().stat(path).await {
            Ok(info) => info.modified.map(|m| (info.size, m)),
            Err(e) if e.is_not_found() => {
                self.lock().remove(&key);
                return Ok((Vec::new(), Vec::new(), 0));
            }
            Err(e) => return Err(e),
        };
        if let Some((size, modified)) = stamp
            && let Some(seen) = self.lock().get(&key)
            && seen.size == size
            && seen.modified == modified
        {
            return Ok((seen.open.clone(), seen.keys.clone(), size));
        }
        let (records, size) = read_intents(ws, path).await?;
        let (open, keys) = (unresolved(&records), unknown_keys(&records));
        let size = size as u64;
        let mut seen = self.lock();
        match stamp {
            Some((stamped, modified)) if stamped == size => {
                if seen.len() >= SEEN_SESSIONS {
                    seen.clear();
                }
                seen.insert(
                    key,
                    Seen {
                        size,
                        modified,
                        open: open.clone(),
                        keys: keys.clone(),
                    },
                );
            }
            _ => {
                seen.remove(&key);
            }
        }
        Ok((open, keys, size))
    }
}

/// Sessions whose last reading [`IntentLayer`] keeps before it starts over.
const SEEN_SESSIONS: usize = 10_000;

/// An intents file as last read: its size and modification time, and what a call needs of
/// its records. The file is only appended to (or deleted), so an unchanged size and time
/// say it holds the same records; the records are then not read and parsed again.
#[derive(Debug, Clone)]
struct Seen {
    size: u64,
    modified: chrono::DateTime<Utc>,
    /// [`unresolved`] of the records.
    open: Vec<IntentRecord>,
    /// [`unknown_keys`] of the records.
    keys: Vec<(String, String, String)>,
}

impl IntentLayer {
    pub(crate) fn new(agent: impl Into<String>, tools: ToolSet, evidence: EvidenceStore) -> Self {
        Self {
            agent: agent.into(),
            tools,
            evidence,
            seen: SeenIntents::default(),
        }
    }

    fn path(&self, session: &str) -> std::result::Result<FsPath, hame_fs::Error> {
        intents_path(&self.agent, session)
    }

    /// Appends ends to the session's intents file, unflushed (module docs); a failure is
    /// logged as `what` failing.
    async fn write_ends(&self, ws: &Workspace, session: &str, ends: &[IntentRecord], what: &str) {
        let written = match self.path(session) {
            Ok(path) => write_records(ws, &path, ends, AppendOptions::atomic()).await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::warn!(session = %session, error = %e, "{what} failed");
        }
    }

    /// Asks the call's tool: its recorded outcome ([`Tool::reconcile`]), else a new run
    /// when it is idempotent, else unknown. Returns the settlement and the facts the tool
    /// reported.
    async fn settle(
        &self,
        cx: &CallCtx<'_>,
        r: &IntentRecord,
    ) -> (Settled, serde_json::Map<String, serde_json::Value>) {
        let (Some(name), Some(key)) = (r.tool.as_deref(), r.key.as_deref()) else {
            return (Settled::Unknown, serde_json::Map::new());
        };
        let Some(tool) = self.tools.get(name) else {
            return (Settled::Unknown, serde_json::Map::new());
        };
        let mut extensions = cx.extensions.clone();
        extensions.insert(IdempotencyKey(key.to_owned()));
        let ctx = ToolContext {
            runtime: cx.runtime.clone(),
            call_id: r.call_id.clone(),
            cancel: cx.cancel.child_token(),
            extensions,
            facts: ToolFacts::default(),
        };
        let timeout = ToolRunOptions::default().timeout;
        // A panicking or hanging reconcile leaves the call unknown.
        let lookup = std::panic::AssertUnwindSafe(tool.reconcile(key, &ctx)).catch_unwind();
        let looked = tokio::time::timeout(timeout, lookup).await;
        let settled = match looked {
            Ok(Ok(Reconciled::Known(out))) => Settled::Reconciled(out),
            Ok(Ok(Reconciled::Unknown)) if tool.idempotent() => {
                let call = ToolCall {
                    id: r.call_id.clone(),
                    name: name.to_owned(),
                    arguments: r.args.clone().unwrap_or_default(),
                };
                Settled::Rerun(self.tools.run_one(&call, &ctx, timeout).await)
            }
            Ok(Ok(Reconciled::Unknown)) => Settled::Unknown,
            Ok(Err(_)) => {
                tracing::error!(tool = %name, call_id = %r.call_id, "reconcile panicked: outcome_unknown");
                Settled::Unknown
            }
            Err(_) => {
                tracing::warn!(tool = %name, call_id = %r.call_id, "reconcile did not answer in time: outcome_unknown");
                Settled::Unknown
            }
        };
        (settled, ctx.facts.snapshot())
    }

    /// The observations of the settled calls (ADR 0035), linked to their intents by call id
    /// and key.
    async fn observe(
        &self,
        cx: &CallCtx<'_>,
        ws: &Workspace,
        settled: &[(
            IntentRecord,
            Settled,
            serde_json::Map<String, serde_json::Value>,
        )],
    ) {
        for (r, how, facts) in settled {
            let now = Utc::now();
            let mut facts = facts.clone();
            let (outcome, code) = match how {
                Settled::Reconciled(out) | Settled::Rerun(out) => {
                    let code = out.as_ref().err().map(|e| e.code.clone());
                    (ObservationOutcome::of(code.as_deref()), code)
                }
                Settled::Unknown => (
                    ObservationOutcome::OutcomeUnknown,
                    Some(OUTCOME_UNKNOWN.to_owned()),
                ),
            };
            match how {
                Settled::Reconciled(_) => facts.insert("reconciled".into(), true.into()),
                Settled::Rerun(_) => facts.insert("rerun".into(), true.into()),
                Settled::Unknown => facts.insert("rerun".into(), false.into()),
            };
            let obs = Observation {
                id: crate::evidence::new_id("ob"),
                call_id: r.call_id.clone(),
                attempt: 2,
                tool: r.tool.clone().unwrap_or_default(),
                args_hash: crate::evidence::args_hash(r.args.as_deref().unwrap_or("")),
                step: cx.iteration,
                started: now,
                ended: now,
                duration_ms: 0,
                outcome,
                code,
                idempotency_key: r.key.clone(),
                facts,
            };
            if let Err(e) = self.evidence.write_observation(cx.runtime, ws, &obs).await {
                tracing::warn!(error = %e, call_id = %r.call_id, "the observation of a cut tool call could not be written");
            }
        }
    }
}

impl IntentLayer {
    /// The session's intents without an end, except those of this call (`pending`: it ran
    /// them and holds their ends) and those whose result the conversation's last turn
    /// holds (a turn a takeover adopted from the log: those calls returned, and their ends
    /// were lost with the process), whose `done` ends are written now; and the keys of the
    /// calls reported unknown. A file holding only resolved records past its bound is
    /// dropped.
    async fn open_intents(
        &self,
        cx: &CallCtx<'_>,
        ws: &Workspace,
        pending: Option<&PendingEnds>,
    ) -> (Vec<IntentRecord>, Vec<(String, String, String)>) {
        let session = &cx.runtime.session_id;
        let read = match self.path(session) {
            Ok(path) => {
                self.seen
                    .read(ws, cx.runtime.user_id.as_deref(), session, &path)
                    .await
            }
            Err(e) => Err(e),
        };
        let (mut open, keys, size) = match read {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(session = %session, error = %e, "reading the tool call intents failed");
                return (Vec::new(), Vec::new());
            }
        };
        if let Some(p) = pending {
            open.retain(|r| !p.holds(&r.call_id));
        }
        let answered = answered_in_last_turn(&cx.state.messages);
        let (returned, open): (Vec<IntentRecord>, Vec<IntentRecord>) = open
            .into_iter()
            .partition(|r| answered.contains(r.call_id.as_str()));
        if !returned.is_empty() {
            let ends: Vec<IntentRecord> = returned
                .iter()
                .map(|r| end_record(&r.call_id, "done"))
                .collect();
            self.write_ends(ws, session, &ends, "marking adopted tool calls done")
                .await;
        }
        // Everything in it is resolved: a file past its bound is dropped (the session lease
        // keeps this call alone in the session, so no tool call of it is writing).
        if open.is_empty()
            && returned.is_empty()
            && size > MAX_RESOLVED_BYTES as u64
            && let Ok(path) = self.path(session)
        {
            let dropped = ws
                .records()
                .delete(&path, hame_fs::DeleteOptions::default())
                .await;
            self.seen.forget(cx.runtime.user_id.as_deref(), session);
            if let Err(e) = dropped {
                tracing::debug!(session = %session, error = %e, "dropping resolved intents failed");
            }
        }
        (open, keys)
    }

    /// Settles the `open` calls — reconciled, run again or `outcome_unknown` — puts them
    /// back in the conversation through `next` (so the log records them), marks their ends,
    /// and hands the keys of the calls reported unknown to the call's tools (`unknown`).
    async fn settle_open(
        &self,
        cx: &mut CallCtx<'_>,
        ws: &Workspace,
        (open, mut keys): (Vec<IntentRecord>, Vec<(String, String, String)>),
        next: AppendNext<'_>,
        unknown: Option<&UnknownKeys>,
    ) -> Result<()> {
        if open.is_empty() {
            if let Some(k) = unknown {
                k.set(keys);
            }
            return Ok(());
        }
        let session = cx.runtime.session_id.clone();
        let mut settled = Vec::with_capacity(open.len());
        for r in open {
            let (how, facts) = self.settle(cx, &r).await;
            if how == Settled::Unknown
                && let (Some(t), Some(a), Some(k)) = (&r.tool, &r.args, &r.key)
            {
                keys.push((t.clone(), a.clone(), k.clone()));
            }
            settled.push((r, how, facts));
        }
        if let Some(k) = unknown {
            k.set(keys);
        }
        tracing::warn!(session = %session, calls = settled.len(), "tool calls whose process died: reconciled, run again or reported as outcome_unknown");
        let pairs: Vec<(IntentRecord, Settled)> = settled
            .iter()
            .map(|(r, how, _)| (r.clone(), how.clone()))
            .collect();
        for m in settled_messages(&pairs) {
            next.run(cx, m).await?;
        }
        self.observe(cx, ws, &settled).await;
        // In the conversation (and its log) first, then marked: a crash in between reports
        // them once more rather than never.
        let ends: Vec<IntentRecord> = pairs
            .iter()
            .map(|(r, how)| end_record(&r.call_id, how.end()))
            .collect();
        self.write_ends(ws, &session, &ends, "marking tool call intents")
            .await;
        Ok(())
    }
}

/// The ids of the tool calls answered by a result since the conversation's last user
/// message.
fn answered_in_last_turn(messages: &[Message]) -> std::collections::BTreeSet<&str> {
    let start = messages
        .iter()
        .rposition(|m| m.role == Role::User)
        .map_or(0, |i| i + 1);
    messages[start..]
        .iter()
        .flat_map(Message::tool_results_iter)
        .map(|r| r.id.as_str())
        .collect()
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
        let mut extensions = cx.extensions.clone();
        let unknown = Arc::new(UnknownKeys::default());
        extensions.insert_arc(unknown.clone());
        let pending = Arc::new(PendingEnds::default());
        extensions.insert_arc(pending.clone());
        // A turn taken over from a process that died goes on without a new message: the
        // calls that process left cut are settled here, before the model is asked again
        // (a new message settles them in `append`).
        if let (CallInput::Continue { .. }, None, Some(ws)) = (
            &input,
            &cx.state.pending,
            cx.extensions.get::<Workspace>().cloned(),
        ) {
            let open = self.open_intents(cx, &ws, None).await;
            self.settle_open(cx, &ws, open, next.appender(), Some(&unknown))
                .await?;
        }
        let out = next.run_with(cx, &extensions, input).await;
        let ends = pending.take();
        if let (false, Some(ws)) = (ends.is_empty(), cx.extensions.get::<Workspace>()) {
            // Not flushed: the call's last step made no intent after them. A crash before
            // they land reports those calls as `outcome_unknown` (whether they took effect
            // is then unknown to the session's record too), never runs them again.
            let session = &cx.runtime.session_id;
            self.write_ends(ws, session, &ends, "marking tool call intents done")
                .await;
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
        // A user message in the middle of the call (a subagent's result delivered between
        // steps): the calls this call ran have returned, their ends are waiting here.
        let pending = cx.extensions.get_arc::<PendingEnds>();
        let open = self.open_intents(cx, &ws, pending.as_deref()).await;
        next.run(cx, message).await?;
        let unknown = cx.extensions.get_arc::<UnknownKeys>();
        self.settle_open(cx, &ws, open, next, unknown.as_deref())
            .await
    }
}

/// Writes an intent, durably, right before a tool call that is not a built-in read-only
/// one acts (inside permissions: a denied or suspended call never acts), and its end when
/// the call returns. A call of the same tool with the same arguments as a call reported
/// `outcome_unknown` carries that call's idempotency key ([`IdempotencyKey`]).
#[derive(Debug)]
pub(crate) struct IntentToolLayer {
    agent: String,
    /// `tools.json`, for the MCP tools it declares idempotent.
    tools_config: Option<Arc<ToolsConfigLayer>>,
}

impl IntentToolLayer {
    pub(crate) fn new(
        agent: impl Into<String>,
        tools_config: Option<Arc<ToolsConfigLayer>>,
    ) -> Self {
        Self {
            agent: agent.into(),
            tools_config,
        }
    }

    /// Whether the call needs no intent: a built-in read-only tool, or an MCP tool that
    /// `tools.json` declares idempotent (the step's reading of it, shared with the other
    /// layers: no store operation of its own).
    async fn needs_no_intent(&self, cx: &ToolCtx<'_>, call: &ToolCall) -> bool {
        if is_idempotent(&call.name) {
            return true;
        }
        let (true, Some(layer), Some(ws)) = (
            call.name.starts_with("mcp__"),
            &self.tools_config,
            hame_tools::snapshot::config_view(&cx.tool.extensions, cx.iteration),
        ) else {
            return false;
        };
        let Ok(config) = layer
            .load_step(
                &ws,
                &cx.tool.extensions,
                cx.tool.runtime.call_id(),
                cx.iteration,
            )
            .await
        else {
            return false;
        };
        if config
            .mcp_servers
            .values()
            .all(|s| s.idempotent == Idempotent::None)
        {
            return false;
        }
        let tools = layer.mcp_tools(&config, cx.events).await;
        tools
            .iter()
            .find(|t| t.qualified == call.name)
            .and_then(|t| {
                config
                    .mcp_servers
                    .get(&t.server)
                    .map(|s| s.idempotent.covers(&t.name))
            })
            .unwrap_or(false)
    }
}

#[async_trait]
impl Layer for IntentToolLayer {
    fn name(&self) -> &str {
        "intent-records"
    }

    async fn tool(&self, cx: &ToolCtx<'_>, call: ToolCall, next: ToolNext<'_>) -> ToolOutcome {
        let ws = cx.tool.extensions.get::<Workspace>().cloned();
        let Some(ws) = ws else {
            return next.run(cx, call).await;
        };
        if self.needs_no_intent(cx, &call).await {
            return next.run(cx, call).await;
        }
        let session = cx.tool.runtime.session_id.clone();
        let path = match intents_path(&self.agent, &session) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(session = %session, error = %e, "no intents file for this session; running the call without an intent");
                return next.run(cx, call).await;
            }
        };
        // A call resumed by a decision whose intent is already there without an end started
        // in a process that died before it saved the step (a decided run taken over by
        // another worker): whether it took effect is unknown, and it is not run again.
        if cx.resume.is_some() {
            let open = match read_intents(&ws, &path).await {
                Ok((records, _)) => unresolved(&records)
                    .into_iter()
                    .find(|r| r.call_id == call.id),
                Err(e) => {
                    tracing::warn!(session = %session, error = %e, "reading the tool call intents failed");
                    None
                }
            };
            if let Some(open) = open {
                tracing::warn!(session = %session, call_id = %call.id, "a resumed call started in a process that died: outcome_unknown, not run again");
                let end = end_record(&call.id, OUTCOME_UNKNOWN);
                if let Err(e) = write_records(&ws, &path, &[end], AppendOptions::atomic()).await {
                    tracing::warn!(session = %session, error = %e, "marking the tool call intent outcome_unknown failed");
                }
                return ToolOutcome::Done(Err(hame_core::ToolError::new(
                    OUTCOME_UNKNOWN,
                    unknown_text(&open),
                )));
            }
        }
        // The same operation as a call whose outcome is unknown: the same key.
        let again = cx
            .tool
            .extensions
            .get::<UnknownKeys>()
            .and_then(|k| k.take(&call.name, &call.arguments));
        let keyed = again.map(|key| {
            let mut tool = cx.tool.clone();
            tool.extensions.insert(IdempotencyKey(key));
            tool
        });
        let tool_cx = keyed.as_ref().unwrap_or(cx.tool);
        let intent = IntentRecord {
            call_id: call.id.clone(),
            tool: Some(call.name.clone()),
            args: Some(call.arguments.clone()),
            key: Some(tool_cx.idempotency_key()),
            end: None,
        };
        // Durable before the call acts; the ends of the call's earlier tool calls go with it
        // (before it in the file, so a reader sees them resolved in order).
        let pending = cx.tool.extensions.get_arc::<PendingEnds>();
        let mut records = pending.as_ref().map(|p| p.take()).unwrap_or_default();
        records.push(intent);
        if let Err(e) = write_records(&ws, &path, &records, AppendOptions::default()).await {
            tracing::warn!(session = %session, error = %e, "writing the tool call intent failed; running the call anyway");
        }
        let call_id = call.id.clone();
        let inner = ToolCtx {
            tool: tool_cx,
            state: cx.state,
            events: cx.events,
            iteration: cx.iteration,
            resume: cx.resume,
        };
        let out = next.run(&inner, call).await;
        let end = end_record(&call_id, "done");
        match pending {
            // Written with the call's next intent or at its end.
            Some(p) => p.push(end),
            None => {
                if let Err(e) = write_records(&ws, &path, &[end], AppendOptions::atomic()).await {
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

    /// A call reads the intents file once: while its size and time stay, the next calls
    /// `stat` it and read nothing; a record another process appends is read at the next
    /// call; a deleted file holds nothing.
    #[tokio::test]
    async fn an_intents_file_is_read_again_only_when_it_changed()
    -> std::result::Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let local: Arc<dyn hame_fs::Filesystem> = Arc::new(hame_fs::LocalFs::new(dir.path())?);
        let counting = hame_fs::CountingFs::new(local);
        let records: Arc<dyn hame_fs::Filesystem> = Arc::new(counting.clone());
        let ws = Workspace::new(
            hame_tools::Identity::new("a", Some("ada"), "s1"),
            hame_tools::WorkspaceMode::TrustedLocal,
            records.clone(),
            records.clone(),
        );
        let path = intents_path("a", "s1")?;
        let seen = SeenIntents::default();
        let reads = || counting.counts().of("read_bytes");
        // No file: nothing, and nothing read.
        let (open, keys, size) = seen.read(&ws, Some("ada"), "s1", &path).await?;
        assert!(open.is_empty() && keys.is_empty() && size == 0);
        assert_eq!(reads(), 0);
        write_records(
            &ws,
            &path,
            &[intent("a"), end("a", "done"), intent("b")],
            AppendOptions::default(),
        )
        .await?;
        let first = seen.read(&ws, Some("ada"), "s1", &path).await?;
        assert_eq!(first.0, vec![intent("b")]);
        assert_eq!(reads(), 1);
        for _ in 0..3 {
            let again = seen.read(&ws, Some("ada"), "s1", &path).await?;
            assert_eq!((again.0, again.2), (vec![intent("b")], first.2));
        }
        assert_eq!(reads(), 1, "an unchanged file is not read again");
        // Another user's session of the same name is another file.
        let other = seen.read(&ws, Some("bob"), "s1", &path).await?;
        assert_eq!(other.0, vec![intent("b")]);
        assert_eq!(reads(), 2);
        // Another process settles b and leaves c unknown: read at the next call.
        write_records(
            &ws,
            &path,
            &[end("b", "done"), intent("c"), end("c", OUTCOME_UNKNOWN)],
            AppendOptions::default(),
        )
        .await?;
        let after = seen.read(&ws, Some("ada"), "s1", &path).await?;
        assert!(after.0.is_empty());
        assert_eq!(
            after.1,
            vec![(
                "execute".to_owned(),
                "{\"command\":\"x\"}".to_owned(),
                "k".to_owned()
            )]
        );
        assert!(after.2 > first.2);
        assert_eq!(reads(), 3);
        // Deleted: nothing.
        records
            .delete(&path, hame_fs::DeleteOptions::default())
            .await?;
        let gone = seen.read(&ws, Some("ada"), "s1", &path).await?;
        assert!(gone.0.is_empty() && gone.1.is_empty() && gone.2 == 0);
        assert_eq!(reads(), 3);
        // A reading this layer forgot (it deleted the file) is not used again, even for a
        // file of the same size and time.
        write_records(&ws, &path, &[intent("d")], AppendOptions::default()).await?;
        assert_eq!(
            seen.read(&ws, Some("ada"), "s1", &path).await?.0,
            vec![intent("d")]
        );
        assert_eq!(reads(), 4);
        seen.forget(Some("ada"), "s1");
        assert_eq!(
            seen.read(&ws, Some("ada"), "s1", &path).await?.0,
            vec![intent("d")]
        );
        assert_eq!(reads(), 5);
        Ok(())
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
    fn a_reconciled_or_rerun_call_gets_its_output_and_an_unknown_one_is_told() {
        let settled = vec![
            (
                intent("a"),
                Settled::Reconciled(Ok("order 7 placed".into())),
            ),
            (intent("b"), Settled::Unknown),
            (
                intent("c"),
                Settled::Rerun(Err(hame_core::ToolError::new("tool_failed", "no"))),
            ),
        ];
        let [call, results] = settled_messages(&settled);
        assert_eq!(call.tool_calls().count(), 3);
        let r: Vec<&ToolResult> = results.tool_results_iter().collect();
        assert_eq!(
            (r[0].id.as_str(), r[0].content.as_str(), r[0].is_error),
            ("a", "order 7 placed", false)
        );
        assert_eq!(r[1].code.as_deref(), Some(OUTCOME_UNKNOWN));
        assert_eq!(r[2].code.as_deref(), Some("tool_failed"));
        assert_eq!(
            settled.iter().map(|(_, s)| s.end()).collect::<Vec<_>>(),
            ["reconciled", OUTCOME_UNKNOWN, "done"]
        );
    }

    #[test]
    fn an_unknown_call_keeps_its_key_until_the_model_calls_it_again() {
        let mut again = intent("d");
        again.key = Some("k".into());
        let mut other = intent("e");
        other.key = Some("k2".into());
        other.args = Some("{\"command\":\"y\"}".into());
        // c1 cut and reported: its key is offered for the same call.
        let records = vec![intent("c1"), end("c1", OUTCOME_UNKNOWN)];
        let want = vec![(
            "execute".to_owned(),
            "{\"command\":\"x\"}".to_owned(),
            "k".to_owned(),
        )];
        assert_eq!(unknown_keys(&records), want);
        // Another call with another key changes nothing; a call that carried it uses it up.
        let mut more = records.clone();
        more.extend([other, end("e", "done")]);
        assert_eq!(unknown_keys(&more), want);
        more.extend([again, end("d", "done")]);
        assert!(unknown_keys(&more).is_empty());
        // A finished call offers nothing.
        assert!(unknown_keys(&[intent("a"), end("a", "done")]).is_empty());
    }

    #[test]
    fn the_same_call_is_the_same_tool_with_equal_arguments() {
        let keys = UnknownKeys::default();
        keys.set(vec![("pay".into(), "{\"a\":1,\"b\":2}".into(), "k".into())]);
        assert_eq!(keys.take("pay", "{\"a\":2,\"b\":2}"), None);
        assert_eq!(keys.take("refund", "{\"b\":2,\"a\":1}"), None);
        assert_eq!(keys.take("pay", "{ \"b\": 2, \"a\": 1 }"), Some("k".into()));
        // Used once.
        assert_eq!(keys.take("pay", "{\"a\":1,\"b\":2}"), None);
    }

    #[test]
    fn read_only_tools_are_idempotent() {
        assert!(is_idempotent("read_file"));
        assert!(!is_idempotent("execute"));
        assert!(!is_idempotent("my_custom_tool"));
    }
}
