//! Compaction: replacing the older part of a conversation with a model-written summary.
//!
//! The planning ([`plan_compaction`], [`plan_forced`]) and the rewrite ([`apply`]) are pure
//! functions over `&[Message]`; [`Compactor`] adds the model call and the bookkeeping in
//! `AgentState.extensions["compaction"]`, and [`CompactionLayer`] triggers it from the
//! loop.
//!
//! # Invariants (property-tested)
//! - A tool call and its result are never separated: both are summarised or both are kept.
//! - A tool call without a result yet (in flight) is never summarised, nor is anything
//!   after it.
//! - The latest user request survives verbatim: if it falls in the summarised range it is
//!   re-inserted, unchanged, right after the summary, so it stays the last user message.
//! - System messages are never summarised: those in the range are kept verbatim, in order,
//!   before the summary.
//! - The summary is one user message starting with `[summary of messages #a..#b]`, where
//!   `a..b` are session sequence numbers (see [`CompactionState`]), so the never-compacted
//!   session log can be consulted for the details.
//! - Atomic: if the model call fails or its text is unusable, the state is left exactly as
//!   it was and an error is returned; no error text ever stands in for history.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hame_core::{
    AgentEvent, AgentState, CallCtx, ContentBlock, Layer, Message, Model, ModelNext, ModelParams,
    ModelRequest, ModelResponse, Role, StopReason,
};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ledger::TokenLedger;
use crate::tokens::{TokenCounter, message_tokens, request_tokens};

/// Default: compact when the conversation has more than this many messages (a backstop for
/// sessions of many short turns; the token trigger relative to the window is the usual one).
pub const DEFAULT_MAX_MESSAGES: usize = 200;
/// Default: the derived token trigger is at least this share of the window (in percent).
pub const DEFAULT_TRIGGER_PERCENT: u64 = 80;
/// Default: keep at most this many recent messages verbatim.
pub const DEFAULT_KEEP_RECENT_MESSAGES: usize = 20;
/// Default tokens left free below the context window when the token trigger is derived
/// from the window (room for the answer and the next tool results).
pub const DEFAULT_RESERVE_TOKENS: u64 = 20_000;
/// Bounds of the derived recent-tail token budget: `(window − reserve) / 4`, clamped.
pub const DEFAULT_KEEP_TOKENS_BOUNDS: (u64, u64) = (2_000, 8_000);
/// Default: tool results over this many characters outside the recent tail are cleared
/// before a token-triggered summary ([`CompactionPolicy::clear_results_over`]).
pub const DEFAULT_CLEAR_RESULT_CHARS: usize = 1_000;
/// How a cleared tool result starts.
pub const CLEARED_PREFIX: &str = "[tool result cleared to save context:";
/// Default share of the window (percent) one summary call may use, prompts and output
/// included. A compaction at the token trigger (80 % of the window, less the kept tail) fits
/// in one call; at 50 % a conversation of plain text took two parts and a merge.
pub const DEFAULT_SUMMARY_INPUT_PERCENT: u64 = 85;
/// The smallest transcript budget of one summary call (tokens).
pub const MIN_SUMMARY_INPUT_TOKENS: u64 = 1_000;
/// Default output budget of one summary call.
pub const DEFAULT_SUMMARY_MAX_TOKENS: u32 = 4_096;
/// Default cap on one tool result's text in the summariser's transcript (head and tail).
pub const DEFAULT_TRANSCRIPT_RESULT_CHARS: usize = 2_000;
/// Default cap on one tool call's arguments in the summariser's transcript.
pub const DEFAULT_TRANSCRIPT_ARGS_CHARS: usize = 1_000;
/// The key of [`CompactionState`] in `AgentState.extensions`.
pub const EXTENSION_KEY: &str = "compaction";
/// How many [`CompactionRecord`]s the state keeps.
pub const MAX_HISTORY: usize = 100;
/// Most rounds of merging partial summaries in a map-reduce summary.
pub const MAX_REDUCE_ROUNDS: usize = 4;
/// A [`RuntimeContext`](hame_core::RuntimeContext) extra: when present, the
/// [`CompactionLayer`] compacts before the call's first model request, whatever the
/// triggers say (nothing happens when there is nothing to summarise).
pub const COMPACT_NOW_EXTRA: &str = "hame.compact_now";

const MARKER_PREFIX: &str = "[summary of messages #";
const SUMMARY_NOTE: &str = "The earlier part of this conversation was summarised to save \
context. The complete messages are kept in the session log under these sequence numbers \
(read them with session_history and from_seq when details matter).";

/// The system prompt of summary calls.
pub const SUMMARY_SYSTEM_PROMPT: &str = "You write the working summary of an agent's \
conversation. The summary replaces the messages it covers, so keep everything needed to \
continue the work without redoing it, and nothing else.";

/// The instructions of a summary call; the transcript follows them.
pub const SUMMARY_PROMPT: &str = "Summarise the conversation below. Use these sections \
(write \"None\" when a section is empty):\n\
## Intent\nWhat the user wants overall, and the latest request.\n\
## Progress\nWhat was done and found, decisions and their reasons, options rejected.\n\
## Artifacts\nFiles, commands, URLs and identifiers touched, with what changed.\n\
## Next steps\nWhat remains, in order.\n\
Quote exact values (paths, numbers, names) rather than paraphrasing them. Answer with the \
summary only.";

/// The instructions for merging partial summaries of consecutive parts.
pub const MERGE_PROMPT: &str = "Below are summaries of consecutive parts of one \
conversation, oldest first. Merge them into one summary with the same sections (Intent, \
Progress, Artifacts, Next steps); later parts override earlier ones where they conflict. \
Answer with the summary only.";

/// When to compact and how much to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionPolicy {
    /// Compact when there are more messages than this. Default [`DEFAULT_MAX_MESSAGES`].
    pub max_messages: usize,
    /// Keep at most this many recent messages verbatim. Default
    /// [`DEFAULT_KEEP_RECENT_MESSAGES`].
    pub keep_recent_messages: usize,
    /// Keep at most this many tokens of recent messages verbatim (the smaller tail of this
    /// and `keep_recent_messages` wins). `None` (default): derived by [`Compactor`] from the
    /// model's window, `(window − reserve) / 4` clamped to [`DEFAULT_KEEP_TOKENS_BOUNDS`];
    /// no token bound in the pure planner.
    pub keep_recent_tokens: Option<u64>,
    /// Compact when the prompt reaches this many tokens. `None` (default): derived by
    /// [`Compactor`] from the window, `window − reserve_tokens`, at least
    /// [`DEFAULT_TRIGGER_PERCENT`] of the window; no token trigger in the pure planner.
    pub trigger_tokens: Option<u64>,
    /// Tokens kept free below the window by the derived trigger. Default
    /// [`DEFAULT_RESERVE_TOKENS`].
    pub reserve_tokens: u64,
    /// Before a token-triggered summary, clear tool results longer than this many
    /// characters outside the recent tail (each becomes a pointer to its record in the
    /// session log, which keeps it whole); the summary runs only if the prompt is still
    /// over the trigger. No model call. `None`: never clear. Default
    /// [`DEFAULT_CLEAR_RESULT_CHARS`].
    pub clear_results_over: Option<usize>,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        Self {
            max_messages: DEFAULT_MAX_MESSAGES,
            keep_recent_messages: DEFAULT_KEEP_RECENT_MESSAGES,
            keep_recent_tokens: None,
            trigger_tokens: None,
            reserve_tokens: DEFAULT_RESERVE_TOKENS,
            clear_results_over: Some(DEFAULT_CLEAR_RESULT_CHARS),
        }
    }
}

impl CompactionPolicy {
    /// This policy with `None` budgets filled in from a context window.
    pub fn resolved_for_window(&self, context_window: u64) -> Self {
        let mut p = self.clone();
        if p.trigger_tokens.is_none() && context_window > 0 {
            p.trigger_tokens = Some(
                context_window
                    .saturating_sub(p.reserve_tokens)
                    .max(context_window * DEFAULT_TRIGGER_PERCENT / 100),
            );
        }
        if p.keep_recent_tokens.is_none() && context_window > 0 {
            let (lo, hi) = DEFAULT_KEEP_TOKENS_BOUNDS;
            p.keep_recent_tokens =
                Some((context_window.saturating_sub(p.reserve_tokens) / 4).clamp(lo, hi));
        }
        p
    }

    /// Whether a conversation of `messages` messages and `tokens` prompt tokens must be
    /// compacted.
    pub fn triggers(&self, messages: usize, tokens: u64) -> bool {
        messages > self.max_messages || self.trigger_tokens.is_some_and(|t| tokens >= t)
    }
}

/// What to compact: computed by [`plan_compaction`], carried out by [`apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionPlan {
    /// Indices of the messages replaced by the summary (always starts at 0).
    pub range: Range<usize>,
    /// System messages inside `range`, kept verbatim before the summary.
    pub keep_system: Vec<usize>,
    /// The latest user request, when inside `range`: kept verbatim after the summary.
    pub keep_request: Option<usize>,
    /// Tokens of all messages before compaction.
    pub before_tokens: u64,
    /// Tokens of the messages that will be summarised.
    pub summarised_tokens: u64,
}

impl CompactionPlan {
    /// Indices of the messages the summary replaces (the range minus kept messages).
    pub fn summarised(&self) -> impl Iterator<Item = usize> + '_ {
        self.range
            .clone()
            .filter(|i| !self.keep_system.contains(i) && self.keep_request != Some(*i))
    }
}

/// An inclusive range of session sequence numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqSpan {
    /// First sequence number.
    pub from: u64,
    /// Last sequence number (inclusive).
    pub to: u64,
}

impl SeqSpan {
    /// A span of one message.
    pub fn one(seq: u64) -> Self {
        Self { from: seq, to: seq }
    }
}

/// The text that starts every summary message.
pub fn summary_marker(span: SeqSpan) -> String {
    format!("{MARKER_PREFIX}{}..#{}]", span.from, span.to)
}

/// The sequence span a summary message replaced, if `message` is one.
pub fn summary_span(message: &Message) -> Option<SeqSpan> {
    if message.role != Role::User {
        return None;
    }
    let ContentBlock::Text { text } = message.content.first()? else {
        return None;
    };
    let rest = text.strip_prefix(MARKER_PREFIX)?;
    let (range, _) = rest.split_once(']')?;
    let (a, b) = range.split_once("..#")?;
    Some(SeqSpan {
        from: a.parse().ok()?,
        to: b.parse().ok()?,
    })
}

/// Whether `message` is a summary written by compaction.
pub fn is_summary(message: &Message) -> bool {
    summary_span(message).is_some()
}

/// The summary message for `span`.
pub fn summary_message(span: SeqSpan, summary: &str) -> Message {
    Message::user(format!(
        "{}\n{SUMMARY_NOTE}\n\n{}",
        summary_marker(span),
        summary.trim()
    ))
}

/// Index of the latest user request: the last user message that is not a summary.
pub fn latest_request(messages: &[Message]) -> Option<usize> {
    messages
        .iter()
        .rposition(|m| m.role == Role::User && !is_summary(m))
}

/// Where the replaced range must end at the latest: before the first call still in flight
/// and before the latest step (the last assistant message when it called tools: its
/// results are fresh until the model answers them, and summarising or clearing them makes
/// the model call again).
fn cut_limit(messages: &[Message]) -> usize {
    let mut limit = messages.len();
    if let Some(last) = messages.iter().rposition(|m| m.role == Role::Assistant)
        && messages[last].tool_calls().next().is_some()
    {
        limit = last;
    }
    let answered: std::collections::HashSet<&str> = messages
        .iter()
        .flat_map(|m| m.tool_results_iter().map(|r| r.id.as_str()))
        .collect();
    if let Some(open) = messages
        .iter()
        .position(|m| m.tool_calls().any(|c| !answered.contains(c.id.as_str())))
    {
        limit = limit.min(open);
    }
    limit
}

/// The first message of the recent tail the budgets keep verbatim (the smaller tail of
/// `keep_recent_messages` and `keep_recent_tokens` wins); `tokens` per message.
fn tail_start(tokens: &[u64], policy: &CompactionPolicy) -> usize {
    tail_start_by(tokens.len(), policy, |i| tokens[i])
}

/// [`tail_start`] of `n` messages whose counts `tokens(i)` gives: only the messages of the
/// token-budget tail and the one after it are counted.
fn tail_start_by(
    n: usize,
    policy: &CompactionPolicy,
    mut tokens: impl FnMut(usize) -> u64,
) -> usize {
    let mut start = n.saturating_sub(policy.keep_recent_messages);
    if let Some(budget) = policy.keep_recent_tokens {
        let mut suffix = 0u64;
        let mut c = n;
        while c > 0 {
            let t = tokens(c - 1);
            if suffix + t > budget {
                break;
            }
            suffix += t;
            c -= 1;
        }
        start = start.max(c);
    }
    start
}

/// The first message neither a compaction nor clearing may touch. Counts only the recent
/// tail's messages (clearing runs on steps over the token trigger, so every such step
/// would otherwise count the whole conversation).
fn protected_from(
    messages: &[Message],
    policy: &CompactionPolicy,
    counter: &dyn TokenCounter,
) -> usize {
    tail_start_by(messages.len(), policy, |i| {
        message_tokens(counter, &messages[i])
    })
    .min(cut_limit(messages))
}

/// Which messages hold tool results to clear: results longer than
/// [`CompactionPolicy::clear_results_over`] characters, not cleared yet, before the
/// protected tail. Pure; see [`clear_results`].
pub fn plan_clearing(
    messages: &[Message],
    policy: &CompactionPolicy,
    counter: &dyn TokenCounter,
) -> Vec<usize> {
    let Some(over) = policy.clear_results_over else {
        return Vec::new();
    };
    let end = protected_from(messages, policy, counter);
    (0..end)
        .filter(|&i| {
            messages[i]
                .tool_results_iter()
                .any(|r| r.content.len() > over && !r.content.starts_with(CLEARED_PREFIX))
        })
        .collect()
}

/// Clears the tool results of `indices` (from [`plan_clearing`]) in `state`: each becomes a
/// pointer to its record in the session log. Returns the characters removed.
pub fn clear_results(state: &mut AgentState, indices: &[usize], over: usize) -> usize {
    let seqs = CompactionState::load(state);
    let mut removed = 0;
    for &i in indices {
        let seq = seqs.span_of(i).from;
        let Some(message) = state.messages.get_mut(i) else {
            continue;
        };
        for block in message.content.iter_mut() {
            if let ContentBlock::ToolResult(r) = block
                && r.content.len() > over
                && !r.content.starts_with(CLEARED_PREFIX)
            {
                let n = r.content.len();
                removed += n;
                r.content = format!(
                    "{CLEARED_PREFIX} {n} characters; the whole result is record #{seq} of the \
                     session log (session_history from_seq={seq} limit=1)]"
                );
            }
        }
    }
    removed
}

/// Plans a compaction if the policy triggers (message count, or `trigger_tokens` when set).
pub fn plan_compaction(
    messages: &[Message],
    policy: &CompactionPolicy,
    counter: &dyn TokenCounter,
) -> Option<CompactionPlan> {
    let tokens: u64 = messages.iter().map(|m| message_tokens(counter, m)).sum();
    if !policy.triggers(messages.len(), tokens) {
        return None;
    }
    plan_forced(messages, policy, counter)
}

/// Plans a compaction whatever the triggers say (e.g. after a context overflow). `None`
/// when nothing can be summarised.
pub fn plan_forced(
    messages: &[Message],
    policy: &CompactionPolicy,
    counter: &dyn TokenCounter,
) -> Option<CompactionPlan> {
    let n = messages.len();
    if n == 0 {
        return None;
    }
    let tokens: Vec<u64> = messages
        .iter()
        .map(|m| message_tokens(counter, m))
        .collect();

    // Where each call and result is.
    let mut calls: HashMap<&str, usize> = HashMap::new();
    let mut results: HashMap<&str, usize> = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        for c in m.tool_calls() {
            calls.entry(c.id.as_str()).or_insert(i);
        }
        for r in m.tool_results_iter() {
            results.insert(r.id.as_str(), i);
        }
    }
    let limit = cut_limit(messages);
    // forbidden[c]: cutting before message c separates a call from its result.
    let mut forbidden = vec![0i64; n + 2];
    // (A call without a result is in flight: `cut_limit` stops before it.)
    for (id, &ci) in &calls {
        if let Some(&ri) = results.get(id)
            && ri > ci
        {
            forbidden[ci + 1] += 1;
            forbidden[ri + 1] -= 1;
        }
    }
    // Results whose call comes later (malformed logs): never separate either.
    for (id, &ri) in &results {
        if let Some(&ci) = calls.get(id)
            && ci > ri
        {
            forbidden[ri + 1] += 1;
            forbidden[ci + 1] -= 1;
        }
    }
    let mut depth = 0i64;
    let valid: Vec<bool> = (0..=n)
        .map(|c| {
            depth += forbidden[c];
            depth == 0
        })
        .collect();

    // The desired cut: the smaller tail of the message and token budgets.
    let desired = tail_start(&tokens, policy);
    let desired = desired.min(limit);
    let cut = (1..=desired)
        .rev()
        .find(|&c| valid[c])
        .or_else(|| ((desired + 1)..=limit).find(|&c| valid[c]))?;

    let keep_system: Vec<usize> = (0..cut)
        .filter(|&i| messages[i].role == Role::System)
        .collect();
    let keep_request = latest_request(messages).filter(|&u| u < cut);
    let summarised: Vec<usize> = (0..cut)
        .filter(|i| !keep_system.contains(i) && keep_request != Some(*i))
        .collect();
    match summarised.as_slice() {
        [] => return None,
        [only] if is_summary(&messages[*only]) => return None,
        _ => {}
    }
    Some(CompactionPlan {
        range: 0..cut,
        summarised_tokens: summarised.iter().map(|&i| tokens[i]).sum(),
        keep_system,
        keep_request,
        before_tokens: tokens.iter().sum(),
    })
}

/// Rewrites `messages` by `plan`: kept system messages, the summary (recording `span`),
/// the latest request if it was in the range, then the kept tail.
pub fn apply(
    messages: &[Message],
    plan: &CompactionPlan,
    summary: &str,
    span: SeqSpan,
) -> Result<Vec<Message>> {
    if plan.range.end > messages.len() || plan.range.start != 0 {
        return Err(Error::InvalidInput(format!(
            "plan range {:?} does not fit {} messages",
            plan.range,
            messages.len()
        )));
    }
    if summary.trim().is_empty() {
        return Err(Error::UnusableOutput {
            purpose: "compaction",
            reason: "the summary is empty".into(),
        });
    }
    let mut out = Vec::with_capacity(messages.len() - plan.range.end + plan.keep_system.len() + 2);
    out.extend(plan.keep_system.iter().map(|&i| messages[i].clone()));
    out.push(summary_message(span, summary));
    if let Some(u) = plan.keep_request {
        out.push(messages[u].clone());
    }
    out.extend_from_slice(&messages[plan.range.end..]);
    Ok(out)
}

/// One compaction, as recorded in [`CompactionState::history`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionRecord {
    /// First sequence number replaced.
    pub from_seq: u64,
    /// Last sequence number replaced.
    pub to_seq: u64,
    /// Message tokens before.
    pub before_tokens: u64,
    /// Message tokens after.
    pub after_tokens: u64,
    /// Model calls made for the summary (more than one when summarised in chunks).
    pub model_calls: u32,
    /// When.
    pub at: DateTime<Utc>,
}

/// The compaction sub-state in `AgentState.extensions["compaction"]`: how the messages in
/// the state map to session sequence numbers, and the history of compactions.
///
/// Sequence numbers count the messages appended to `AgentState.messages` over the life of
/// the session, from 0 (the harness's session log numbers its entries the same way). Before
/// any compaction message `i` has number `i`. After one, the first `head.len()` messages
/// (kept system messages, the summary, the kept request) have the spans in `head`, and the
/// messages after them are numbered consecutively from `tail_seq`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionState {
    /// Spans of the first messages.
    #[serde(default)]
    pub head: Vec<SeqSpan>,
    /// Sequence number of message `head.len()`.
    #[serde(default)]
    pub tail_seq: u64,
    /// Past compactions, oldest first (at most [`MAX_HISTORY`]).
    #[serde(default)]
    pub history: Vec<CompactionRecord>,
}

impl CompactionState {
    /// Reads the sub-state (default when absent or unreadable).
    pub fn load(state: &AgentState) -> Self {
        state.extension(EXTENSION_KEY).unwrap_or_default()
    }

    /// Stores the sub-state.
    pub fn store(&self, state: &mut AgentState) -> Result<()> {
        state
            .set_extension(EXTENSION_KEY, self)
            .map_err(|source| Error::State {
                key: EXTENSION_KEY,
                source,
            })
    }

    /// The sequence span of message `index`.
    pub fn span_of(&self, index: usize) -> SeqSpan {
        match self.head.get(index) {
            Some(s) => *s,
            None => SeqSpan::one(self.tail_seq + (index - self.head.len()) as u64),
        }
    }

    /// The sequence span covered by `range` (non-empty).
    pub fn range_span(&self, range: &Range<usize>) -> SeqSpan {
        let end = range.end.max(range.start + 1) - 1;
        SeqSpan {
            from: self.span_of(range.start).from,
            to: self.span_of(end).to,
        }
    }

    /// The sequence number the next appended message will get.
    pub fn next_seq(&self, messages: usize) -> u64 {
        self.tail_seq + messages.saturating_sub(self.head.len()) as u64
    }

    /// The state after applying `plan` to `messages` (message count `n`).
    pub fn after(&self, plan: &CompactionPlan, n: usize, span: SeqSpan) -> Self {
        let mut spans: Vec<SeqSpan> = plan.keep_system.iter().map(|&i| self.span_of(i)).collect();
        spans.push(span);
        if let Some(u) = plan.keep_request {
            spans.push(self.span_of(u));
        }
        spans.extend((plan.range.end..n).map(|i| self.span_of(i)));
        let next = self.next_seq(n);
        // The head ends where the rest is singletons numbered consecutively to the end.
        let mut k = spans.len();
        while k > 0 {
            let s = spans[k - 1];
            let expected = if k == spans.len() {
                next - 1
            } else {
                spans[k].from - 1
            };
            if s.from == s.to && s.from == expected {
                k -= 1;
            } else {
                break;
            }
        }
        let tail_seq = spans.get(k).map_or(next, |s| s.from);
        spans.truncate(k);
        Self {
            head: spans,
            tail_seq,
            history: self.history.clone(),
        }
    }
}

/// Settings of a [`Compactor`].
#[derive(Debug, Clone, PartialEq)]
pub struct CompactorConfig {
    /// Triggers and tail sizes.
    pub policy: CompactionPolicy,
    /// Output budget of each summary call. Default [`DEFAULT_SUMMARY_MAX_TOKENS`].
    pub summary_max_tokens: u32,
    /// Largest transcript (tokens) sent in one summary call; longer ones are summarised in
    /// chunks and merged; the summary prompts and output budget come out of it. `None`
    /// (default): [`DEFAULT_SUMMARY_INPUT_PERCENT`] of the window. A call the provider
    /// refuses as over its window (the token estimate fell short) is made again in parts of
    /// half the budget, down to [`MIN_SUMMARY_INPUT_TOKENS`].
    pub summary_input_tokens: Option<u64>,
    /// Cap on one tool result in the transcript (characters, head and tail kept).
    pub transcript_result_chars: usize,
    /// Cap on one tool call's arguments in the transcript (characters).
    pub transcript_args_chars: usize,
    /// Instructions of a summary call. Default [`SUMMARY_PROMPT`].
    pub summary_prompt: String,
    /// Instructions of a merge call. Default [`MERGE_PROMPT`].
    pub merge_prompt: String,
    /// The context window the budgets follow. `None` (default): the summary model's
    /// (`Model::info().context_window`); set it when the deployment declares its own.
    pub context_window: Option<u64>,
}

impl Default for CompactorConfig {
    fn default() -> Self {
        Self {
            policy: CompactionPolicy::default(),
            summary_max_tokens: DEFAULT_SUMMARY_MAX_TOKENS,
            summary_input_tokens: None,
            transcript_result_chars: DEFAULT_TRANSCRIPT_RESULT_CHARS,
            transcript_args_chars: DEFAULT_TRANSCRIPT_ARGS_CHARS,
            summary_prompt: SUMMARY_PROMPT.to_owned(),
            merge_prompt: MERGE_PROMPT.to_owned(),
            context_window: None,
        }
    }
}

/// What a compaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionReport {
    /// First sequence number replaced.
    pub from_seq: u64,
    /// Last sequence number replaced.
    pub to_seq: u64,
    /// Message tokens before.
    pub before_tokens: u64,
    /// Message tokens after.
    pub after_tokens: u64,
    /// Messages replaced by the summary.
    pub summarised_messages: usize,
    /// Model calls made (1, or more for a chunked summary).
    pub model_calls: u32,
}

/// The heading of the last section a summary call is asked to end with when the facts of
/// the summarised messages are asked of it ([`FactsRequest`]).
pub const FACTS_HEADING: &str = "## Facts for long-term memory";

/// Facts for long-term memory asked of the summary call itself, instead of a call of their
/// own before it (see [`BeforeCompaction::plan_facts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FactsRequest {
    /// The messages the facts are asked from (those of the summarised range not yet
    /// recorded).
    pub span: SeqSpan,
    /// Added after the summary prompt: what to extract, from which messages, what is
    /// already recorded, and that the answer ends with a section headed [`FACTS_HEADING`].
    pub instructions: String,
    /// Output tokens added to the summary call's budget for the section.
    pub max_tokens: u32,
}

/// What [`BeforeCompaction::plan_facts`] wants done for the facts of the messages about to
/// be summarised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FactsPlan {
    /// Nothing: they are all recorded already.
    Nothing,
    /// [`BeforeCompaction::before_compaction`] runs first (a call of its own).
    Separate,
    /// The summary call is asked for them too. When its answer has no facts section (or the
    /// summary needs several calls), `before_compaction` runs after the summary and before
    /// it replaces the messages, so no fact is lost to it.
    Ask(FactsRequest),
}

/// A summary written and checked but not applied: [`Compactor::draft`], then
/// [`Compactor::commit`].
#[derive(Debug, Clone)]
pub struct CompactionDraft {
    plan: CompactionPlan,
    span: SeqSpan,
    /// Messages of the state the draft was made from.
    messages: usize,
    summary: String,
    calls: u32,
    /// The bullets of the answer's facts section, when facts were asked and the answer had
    /// the section (empty when it said there were none).
    pub facts: Option<Vec<String>>,
}

impl CompactionDraft {
    /// The sequence numbers the summary replaces.
    pub fn span(&self) -> SeqSpan {
        self.span
    }

    /// The summary text (without the facts section).
    pub fn summary(&self) -> &str {
        &self.summary
    }
}

/// Splits a summary answer at its last line that is a heading naming the facts section
/// (`## Facts for long-term memory`, any level and case): the summary before it, the
/// bullets under it (up to the next heading, whose text goes back to the summary). `None`
/// when the answer has no such heading.
pub fn split_facts(answer: &str) -> (String, Option<Vec<String>>) {
    let wanted = FACTS_HEADING.trim_start_matches('#').trim().to_lowercase();
    let lines: Vec<&str> = answer.lines().collect();
    let heading = lines.iter().rposition(|l| {
        let t = l.trim();
        t.starts_with('#') && t.trim_start_matches('#').trim().to_lowercase() == wanted
    });
    let Some(at) = heading else {
        return (answer.trim().to_owned(), None);
    };
    let end = lines[at + 1..]
        .iter()
        .position(|l| l.trim_start().starts_with('#'))
        .map_or(lines.len(), |n| at + 1 + n);
    let facts = crate::daily::parse_bullets(&lines[at + 1..end].join("\n"));
    let mut summary = lines[..at].join("\n");
    if end < lines.len() {
        summary.push('\n');
        summary.push_str(&lines[end..].join("\n"));
    }
    (summary.trim().to_owned(), Some(facts))
}

/// Summarises and rewrites an [`AgentState`]'s conversation. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Compactor {
    config: CompactorConfig,
    counter: Arc<dyn TokenCounter>,
}

/// Keeps the head and tail of `text` within `max` characters, with a line saying how many
/// were left out between them.
pub fn clip_middle(text: &str, max: usize) -> String {
    clip_middle_with(text, max, "\n…[", "]…\n")
}

/// [`clip_middle`] on one line: `head … [n characters omitted] … tail`.
pub fn clip_middle_inline(text: &str, max: usize) -> String {
    clip_middle_with(text, max, " … [", "] … ")
}

fn clip_middle_with(text: &str, max: usize, open: &str, close: &str) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_owned();
    }
    let head: String = text.chars().take(max / 2).collect();
    let tail: String = text.chars().skip(n - max / 2).collect();
    format!("{head}{open}{} characters omitted{close}{tail}", n - max)
}

impl Compactor {
    /// A compactor counting tokens with `counter`.
    pub fn new(config: CompactorConfig, counter: Arc<dyn TokenCounter>) -> Self {
        Self { config, counter }
    }

    /// The settings.
    pub fn config(&self) -> &CompactorConfig {
        &self.config
    }

    /// The token counter.
    pub fn counter(&self) -> &Arc<dyn TokenCounter> {
        &self.counter
    }

    /// The policy resolved for a model's context window.
    pub fn policy_for(&self, model: &dyn Model) -> CompactionPolicy {
        self.config.policy.resolved_for_window(self.window(model))
    }

    /// The declared window ([`CompactorConfig::context_window`]) or the model's.
    fn window(&self, model: &dyn Model) -> u64 {
        self.config
            .context_window
            .unwrap_or_else(|| model.info().context_window)
    }

    /// Renders messages as the summariser's transcript, one entry per message.
    pub fn transcript(&self, messages: &[Message], seqs: &CompactionState) -> Vec<String> {
        messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let span = seqs.span_of(i);
                if let Some(s) = summary_span(m) {
                    return format!(
                        "#{}..#{} earlier summary:\n{}",
                        s.from,
                        s.to,
                        m.text_content()
                    );
                }
                let who = match m.role {
                    Role::System => "system",
                    Role::User => "user",
                    Role::Assistant => "assistant",
                    Role::Tool => "tool",
                };
                let mut parts = Vec::new();
                for b in &m.content {
                    match b {
                        ContentBlock::Text { text } => parts.push(text.clone()),
                        ContentBlock::Reasoning { .. } => {}
                        ContentBlock::ToolCall(c) => parts.push(format!(
                            "[call {} {}({})]",
                            c.id,
                            c.name,
                            clip_middle(&c.arguments, self.config.transcript_args_chars)
                        )),
                        ContentBlock::ToolResult(r) => parts.push(format!(
                            "[result of {}{}]\n{}",
                            r.id,
                            if r.is_error { " (error)" } else { "" },
                            clip_middle(&r.content, self.config.transcript_result_chars)
                        )),
                        // The summary request names the image; its bytes stay out of the
                        // summary prompt (and so out of the summary).
                        ContentBlock::Image(i) => parts.push(i.describe()),
                    }
                }
                format!("#{} {who}: {}", span.from, parts.join("\n"))
            })
            .collect()
    }

    /// Compacts `state` now (as after a context overflow), ignoring the triggers.
    /// (Through the layer: set [`COMPACT_NOW_EXTRA`] on the call's context.)
    /// `Ok(None)` when there is nothing to summarise. On error the state is unchanged.
    pub async fn compact(
        &self,
        state: &mut AgentState,
        model: &Arc<dyn Model>,
    ) -> Result<Option<CompactionReport>> {
        let policy = self.policy_for(model.as_ref());
        match plan_forced(&state.messages, &policy, self.counter.as_ref()) {
            Some(plan) => self.run(state, model, plan).await.map(Some),
            None => Ok(None),
        }
    }

    /// Compacts `state` if the policy triggers on its messages.
    pub async fn compact_if_needed(
        &self,
        state: &mut AgentState,
        model: &Arc<dyn Model>,
    ) -> Result<Option<CompactionReport>> {
        let policy = self.policy_for(model.as_ref());
        match plan_compaction(&state.messages, &policy, self.counter.as_ref()) {
            Some(plan) => self.run(state, model, plan).await.map(Some),
            None => Ok(None),
        }
    }

    /// Carries out a plan: summary call(s), then the rewrite. Atomic.
    pub async fn run(
        &self,
        state: &mut AgentState,
        model: &Arc<dyn Model>,
        plan: CompactionPlan,
    ) -> Result<CompactionReport> {
        let draft = self.draft(state, model, plan, None).await?;
        self.commit(state, draft)
    }

    /// The first half of [`run`](Self::run): the summary call(s) for `plan`, checked, with
    /// the state untouched. With `facts`, a summary made in one call is also asked for the
    /// facts section ([`FactsRequest`]); [`CompactionDraft::facts`] holds its bullets when
    /// the answer had one. [`commit`](Self::commit) applies the draft.
    pub async fn draft(
        &self,
        state: &AgentState,
        model: &Arc<dyn Model>,
        plan: CompactionPlan,
        facts: Option<&FactsRequest>,
    ) -> Result<CompactionDraft> {
        let seqs = CompactionState::load(state);
        let span = seqs.range_span(&plan.range);
        let transcript = self.transcript(&state.messages[plan.range.clone()], &seqs);
        let entries: Vec<String> = plan
            .range
            .clone()
            .zip(transcript)
            .filter(|(i, _)| !plan.keep_system.contains(i))
            .map(|(i, t)| {
                if plan.keep_request == Some(i) {
                    format!(
                        "{t}\n(this is the latest request; it stays verbatim after the summary)"
                    )
                } else {
                    t
                }
            })
            .collect();
        let (summary, calls, facts) = self.summarise(model, entries, facts).await?;
        let summary_tokens = self.counter.count(&summary);
        if summary_tokens >= plan.summarised_tokens.max(1) && plan.summarised_tokens > 200 {
            return Err(Error::UnusableOutput {
                purpose: "compaction",
                reason: format!(
                    "the summary ({summary_tokens} tokens) is not shorter than what it replaces ({} tokens)",
                    plan.summarised_tokens
                ),
            });
        }
        Ok(CompactionDraft {
            plan,
            span,
            messages: state.messages.len(),
            summary,
            calls,
            facts,
        })
    }

    /// The second half of [`run`](Self::run): replaces the summarised messages of `state`
    /// (the state the draft was made from; only its extensions may have changed since) and
    /// records the compaction. Atomic: on error the state is unchanged.
    pub fn commit(
        &self,
        state: &mut AgentState,
        draft: CompactionDraft,
    ) -> Result<CompactionReport> {
        let CompactionDraft {
            plan,
            span,
            messages: before,
            summary,
            calls,
            facts: _,
        } = draft;
        if state.messages.len() != before {
            return Err(Error::InvalidInput(format!(
                "the conversation changed between the summary ({before} messages) and its commit ({})",
                state.messages.len()
            )));
        }
        let seqs = CompactionState::load(state);
        let messages = apply(&state.messages, &plan, &summary, span)?;
        let after_tokens: u64 = messages
            .iter()
            .map(|m| message_tokens(self.counter.as_ref(), m))
            .sum();
        let mut next = seqs.after(&plan, state.messages.len(), span);
        next.history.push(CompactionRecord {
            from_seq: span.from,
            to_seq: span.to,
            before_tokens: plan.before_tokens,
            after_tokens,
            model_calls: calls,
            at: Utc::now(),
        });
        if next.history.len() > MAX_HISTORY {
            let extra = next.history.len() - MAX_HISTORY;
            next.history.drain(..extra);
        }
        // Store the bookkeeping first: if that fails nothing has changed.
        next.store(state)?;
        state.messages = messages;
        tracing::info!(
            from_seq = span.from,
            to_seq = span.to,
            before_tokens = plan.before_tokens,
            after_tokens,
            model_calls = calls,
            "conversation compacted"
        );
        Ok(CompactionReport {
            from_seq: span.from,
            to_seq: span.to,
            before_tokens: plan.before_tokens,
            after_tokens,
            summarised_messages: plan.summarised().count(),
            model_calls: calls,
        })
    }

    fn input_budget(&self, model: &dyn Model) -> u64 {
        let window = self.window(model);
        let budget = self
            .config
            .summary_input_tokens
            .unwrap_or(window * DEFAULT_SUMMARY_INPUT_PERCENT / 100);
        let overhead = self.counter.count(SUMMARY_SYSTEM_PROMPT)
            + self.counter.count(&self.config.summary_prompt)
            + u64::from(self.config.summary_max_tokens);
        budget
            .saturating_sub(overhead)
            .max(MIN_SUMMARY_INPUT_TOKENS)
    }

    /// Summarises transcript entries, in chunks when they exceed the input budget, and
    /// merges partial summaries. Returns the summary and the number of model calls.
    /// With `facts`, a summary made in one call also answers the facts section; a chunked
    /// one does not (the facts are then `None`).
    async fn summarise(
        &self,
        model: &Arc<dyn Model>,
        entries: Vec<String>,
        facts: Option<&FactsRequest>,
    ) -> Result<(String, u32, Option<Vec<String>>)> {
        let mut budget = self.input_budget(model.as_ref());
        if let Some(f) = facts {
            // The facts' instructions and answer take room from the transcript, so that
            // asking for them never makes a request larger than a summary alone would be.
            let room = self.counter.count(&f.instructions) + u64::from(f.max_tokens);
            budget = budget.saturating_sub(room).max(MIN_SUMMARY_INPUT_TOKENS);
        }
        let mut calls = 0u32;
        loop {
            match self
                .summarise_within(model, entries.clone(), facts, budget, &mut calls)
                .await
            {
                // The estimate was short of the provider's count: smaller chunks.
                Err(Error::Model { source, .. })
                    if source.is_context_overflow() && budget > MIN_SUMMARY_INPUT_TOKENS =>
                {
                    budget = (budget / 2).max(MIN_SUMMARY_INPUT_TOKENS);
                    tracing::warn!(
                        budget,
                        "a summary call overflowed the context window; summarising in smaller parts"
                    );
                }
                Ok((summary, facts)) => return Ok((summary, calls, facts)),
                Err(e) => return Err(e),
            }
        }
    }

    /// [`summarise`](Self::summarise) with a transcript budget of `budget` tokens per call;
    /// counts the calls made (also those that failed) in `calls`.
    async fn summarise_within(
        &self,
        model: &Arc<dyn Model>,
        entries: Vec<String>,
        facts: Option<&FactsRequest>,
        budget: u64,
        calls: &mut u32,
    ) -> Result<(String, Option<Vec<String>>)> {
        let max_tokens = self.config.summary_max_tokens;
        let chunks = self.pack(entries, budget);
        if chunks.len() == 1 {
            let text = chunks.concat();
            return Ok(match facts {
                Some(f) => {
                    let prompt = format!("{}\n\n{}", self.config.summary_prompt, f.instructions);
                    let max = max_tokens.saturating_add(f.max_tokens);
                    *calls += 1;
                    let answer = self.call(model, &prompt, &text, max).await?;
                    let (summary, facts) = split_facts(&answer);
                    if summary.is_empty() {
                        return Err(Error::UnusableOutput {
                            purpose: "compaction",
                            reason: "the summary is empty".into(),
                        });
                    }
                    (summary, facts)
                }
                None => {
                    *calls += 1;
                    let prompt = &self.config.summary_prompt;
                    (self.call(model, prompt, &text, max_tokens).await?, None)
                }
            });
        }
        let total = chunks.len();
        let mut partials = Vec::with_capacity(total);
        for (i, chunk) in chunks.into_iter().enumerate() {
            let prompt = format!(
                "{}\n\nThis is part {} of {total} of the conversation.",
                self.config.summary_prompt,
                i + 1
            );
            *calls += 1;
            partials.push(self.call(model, &prompt, &chunk, max_tokens).await?);
        }
        for _ in 0..MAX_REDUCE_ROUNDS {
            let labelled: Vec<String> = partials
                .iter()
                .enumerate()
                .map(|(i, p)| format!("### Part {}\n{p}\n\n", i + 1))
                .collect();
            let groups = self.pack(labelled, budget);
            let mut merged = Vec::with_capacity(groups.len());
            for g in &groups {
                *calls += 1;
                merged.push(
                    self.call(model, &self.config.merge_prompt, g, max_tokens)
                        .await?,
                );
            }
            if merged.len() == 1 {
                return Ok((merged.concat(), None));
            }
            partials = merged;
        }
        Err(Error::UnusableOutput {
            purpose: "compaction",
            reason: format!(
                "partial summaries still exceed the input budget after {MAX_REDUCE_ROUNDS} merge rounds"
            ),
        })
    }

    /// Packs entries into chunks of at most `budget` tokens; an entry larger than the
    /// budget is clipped to fit.
    fn pack(&self, entries: Vec<String>, budget: u64) -> Vec<String> {
        let mut chunks = Vec::new();
        let mut cur = String::new();
        let mut cur_tokens = 0u64;
        for mut e in entries {
            let mut t = self.counter.count(&e) + 1;
            if t > budget {
                // Shrink by the ratio until it fits (at most a few rounds).
                for _ in 0..8 {
                    let chars = e.chars().count();
                    #[allow(
                        clippy::cast_possible_truncation,
                        clippy::cast_sign_loss,
                        clippy::cast_precision_loss
                    )]
                    let keep = ((chars as f64) * (budget as f64 / t as f64) * 0.9) as usize;
                    e = clip_middle(&e, keep.max(100));
                    t = self.counter.count(&e) + 1;
                    if t <= budget {
                        break;
                    }
                }
            }
            if cur_tokens + t > budget && !cur.is_empty() {
                chunks.push(std::mem::take(&mut cur));
                cur_tokens = 0;
            }
            cur.push_str(&e);
            cur.push_str("\n\n");
            cur_tokens += t;
        }
        if !cur.is_empty() || chunks.is_empty() {
            chunks.push(cur);
        }
        chunks
    }

    async fn call(
        &self,
        model: &Arc<dyn Model>,
        prompt: &str,
        transcript: &str,
        max_tokens: u32,
    ) -> Result<String> {
        let request = ModelRequest {
            system: SUMMARY_SYSTEM_PROMPT.to_owned(),
            messages: vec![Message::user(format!("{prompt}\n\n---\n\n{transcript}"))],
            tools: Vec::new(),
            params: ModelParams {
                temperature: None,
                max_tokens: Some(max_tokens),
            },
            cache_key: None,
        };
        let response = model
            .complete(request)
            .await
            .map_err(|source| Error::Model {
                purpose: "compaction",
                source,
            })?;
        if response.stop_reason == Some(StopReason::MaxTokens) {
            return Err(Error::UnusableOutput {
                purpose: "compaction",
                reason: "the summary was cut off at the output limit".into(),
            });
        }
        if response.message.has_tool_calls() {
            return Err(Error::UnusableOutput {
                purpose: "compaction",
                reason: "the model called a tool instead of writing a summary".into(),
            });
        }
        let text = response.message.text_content().trim().to_owned();
        if text.is_empty() {
            return Err(Error::UnusableOutput {
                purpose: "compaction",
                reason: "the summary is empty".into(),
            });
        }
        Ok(text)
    }
}

/// Runs around every compaction of [`CompactionLayer`]; the harness records the facts of
/// the messages about to be summarised in the daily memory log here, so no fact is lost to
/// a summary. Failures are the hook's to report: compaction goes ahead.
///
/// Order: [`plan_facts`](Self::plan_facts) with the span about to be summarised; on
/// [`FactsPlan::Separate`], [`before_compaction`](Self::before_compaction); the summary
/// call(s); on [`FactsPlan::Ask`], [`record_facts`](Self::record_facts) with the answer's
/// facts, or `before_compaction` when it had none; then the summary replaces the messages.
#[async_trait]
pub trait BeforeCompaction: Send + Sync + fmt::Debug + 'static {
    /// Records the facts of the messages about to be summarised with a call of its own
    /// (the messages are still in `cx.state`).
    async fn before_compaction(&self, cx: &mut CallCtx<'_>);

    /// How the facts of the messages `span` (about to be summarised) are recorded. Default
    /// [`FactsPlan::Separate`].
    async fn plan_facts(&self, cx: &mut CallCtx<'_>, span: SeqSpan) -> FactsPlan {
        let _ = (cx, span);
        FactsPlan::Separate
    }

    /// The facts the summary call answered for `request` (empty: it found none). Called
    /// before the summary replaces the messages. Default: nothing.
    async fn record_facts(&self, cx: &mut CallCtx<'_>, request: &FactsRequest, facts: Vec<String>) {
        let _ = (cx, request, facts);
    }
}

/// The compaction layer: wraps each model request.
///
/// - **Before** the request, when the policy triggers (by message count, or by the
///   request's estimated tokens from the incremental [`TokenLedger`]), it compacts the
///   conversation and sends the compacted request.
/// - **On a context overflow** it compacts harder (half the usual tail) and retries, at most
///   [`DEFAULT_MAX_MODEL_RETRIES`](hame_core::DEFAULT_MAX_MODEL_RETRIES) times
///   ([`with_max_retries`](Self::with_max_retries)); then the overflow surfaces.
/// - **After** the response it records the provider's reported prompt tokens in the ledger.
///
/// Emits [`AgentEvent::Compaction`] with estimated tokens before and after, and
/// [`AgentEvent::ModelRetry`] before a retry. A failed summary before a request is logged,
/// reported as a `compaction.failed` custom event, and the request goes ahead uncompacted.
///
/// Messages that layers outside this one appended to the request after the conversation
/// are kept when the request is rebuilt; layers that rewrite the conversation itself
/// belong inside it.
pub struct CompactionLayer {
    compactor: Arc<Compactor>,
    model: Arc<dyn Model>,
    context_window: u64,
    max_retries: usize,
    before: Option<Arc<dyn BeforeCompaction>>,
    /// Tokens of the system prompts + tools seen lately, by a hash of their text (one
    /// entry per distinct prompt: sessions and users whose prompts differ each keep
    /// theirs; emptied when [`FIXED_CACHE_ENTRIES`] is reached).
    fixed: std::sync::Mutex<std::collections::HashMap<u64, u64>>,
}

impl fmt::Debug for CompactionLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompactionLayer")
            .field("compactor", &self.compactor)
            .field("model", &self.model.info().model)
            .field("context_window", &self.context_window)
            .field("max_retries", &self.max_retries)
            .finish()
    }
}

impl CompactionLayer {
    /// A layer summarising with `model` (usually the agent's own model, or a cheaper one
    /// with a window at least as large); budgets follow `model`'s context window.
    pub fn new(compactor: Arc<Compactor>, model: Arc<dyn Model>) -> Self {
        let context_window = model.info().context_window;
        Self {
            compactor,
            model,
            context_window,
            max_retries: hame_core::DEFAULT_MAX_MODEL_RETRIES,
            before: None,
            fixed: std::sync::Mutex::default(),
        }
    }

    /// Budgets for this context window instead of the model's.
    pub fn with_context_window(mut self, tokens: u64) -> Self {
        self.context_window = tokens;
        self
    }

    /// At most this many retries after context overflows per request.
    pub fn with_max_retries(mut self, n: usize) -> Self {
        self.max_retries = n;
        self
    }

    /// Runs `hook` before every compaction.
    pub fn with_before_compaction(mut self, hook: Arc<dyn BeforeCompaction>) -> Self {
        self.before = Some(hook);
        self
    }

    /// The policy with token budgets derived from the window.
    pub fn policy(&self) -> CompactionPolicy {
        self.compactor
            .config()
            .policy
            .resolved_for_window(self.context_window)
    }

    /// The policy after a context overflow: half the usual tail, so a retry fits.
    pub fn overflow_policy(&self) -> CompactionPolicy {
        let mut p = self.policy();
        p.keep_recent_messages = (p.keep_recent_messages / 2).max(2);
        p.keep_recent_tokens = p.keep_recent_tokens.map(|t| (t / 2).max(500));
        p
    }

    /// Tokens of the system prompt and tools, counted once per distinct text.
    fn fixed_tokens(&self, request: &ModelRequest) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        request.system.hash(&mut h);
        for t in &request.tools {
            t.name.hash(&mut h);
            t.description.hash(&mut h);
        }
        let key = h.finish();
        if let Ok(g) = self.fixed.lock()
            && let Some(v) = g.get(&key)
        {
            return *v;
        }
        let v = request_tokens(
            self.compactor.counter().as_ref(),
            &request.system,
            &[],
            &request.tools,
        );
        if let Ok(mut g) = self.fixed.lock() {
            if g.len() >= FIXED_CACHE_ENTRIES {
                g.clear();
            }
            g.insert(key, v);
        }
        v
    }

    /// Compacts by `policy`, with the hook around the summary (see [`BeforeCompaction`]).
    /// `Ok(None)` when there was nothing to do.
    async fn compact(
        &self,
        cx: &mut CallCtx<'_>,
        policy: &CompactionPolicy,
    ) -> Result<Option<CompactionReport>> {
        let counter = self.compactor.counter().as_ref();
        let Some(plan) = plan_forced(&cx.state.messages, policy, counter) else {
            return Ok(None);
        };
        let Some(hook) = &self.before else {
            return self
                .compactor
                .run(cx.state, &self.model, plan)
                .await
                .map(Some);
        };
        let span = CompactionState::load(cx.state).range_span(&plan.range);
        let asked = match hook.plan_facts(cx, span).await {
            FactsPlan::Nothing => None,
            FactsPlan::Separate => {
                hook.before_compaction(cx).await;
                None
            }
            FactsPlan::Ask(request) => Some(request),
        };
        let mut draft = self
            .compactor
            .draft(cx.state, &self.model, plan, asked.as_ref())
            .await?;
        if let Some(request) = &asked {
            match draft.facts.take() {
                Some(facts) => hook.record_facts(cx, request, facts).await,
                // The model left the section out: the messages are still here to be read.
                None => hook.before_compaction(cx).await,
            }
        }
        self.compactor.commit(cx.state, draft).map(Some)
    }

    fn report(cx: &CallCtx<'_>, r: &CompactionReport, before: u64, after: u64) {
        cx.events.emit(AgentEvent::Compaction {
            before_tokens: before,
            after_tokens: after,
            from_seq: r.from_seq,
            to_seq: r.to_seq,
        });
    }
}

/// The parts of a request that are not the conversation, to rebuild it after compaction.
struct Frame {
    system: String,
    tools: Vec<hame_core::ToolSpec>,
    params: ModelParams,
    extra: Vec<Message>,
}

impl Frame {
    fn of(request: &ModelRequest, conversation: usize) -> Self {
        Self {
            system: request.system.clone(),
            tools: request.tools.clone(),
            params: request.params.clone(),
            extra: request
                .messages
                .get(conversation..)
                .map(<[Message]>::to_vec)
                .unwrap_or_default(),
        }
    }

    fn rebuild(&self, state: &AgentState) -> ModelRequest {
        let mut messages = state.messages.clone();
        messages.extend(self.extra.iter().cloned());
        ModelRequest {
            system: self.system.clone(),
            messages,
            tools: self.tools.clone(),
            params: self.params.clone(),
            cache_key: None,
        }
    }
}

/// Distinct system prompts + tool sets whose token counts [`CompactionLayer`] keeps.
const FIXED_CACHE_ENTRIES: usize = 1024;

#[async_trait]
impl Layer for CompactionLayer {
    fn name(&self) -> &str {
        "compaction"
    }

    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        mut request: ModelRequest,
        next: ModelNext<'_>,
    ) -> std::result::Result<ModelResponse, hame_core::Error> {
        let counter = self.compactor.counter().clone();
        let policy = self.policy();
        let mut ledger = TokenLedger::load(cx.state);
        let fixed = self.fixed_tokens(&request);
        let before = ledger.estimate(counter.as_ref(), &request.messages, fixed);
        let frame = Frame::of(&request, cx.state.messages.len());
        // A caller asked for a compaction now (`hame chat`'s /compact): before the first
        // request of the call only.
        let forced = cx.iteration <= 1 && cx.runtime.extras.contains_key(COMPACT_NOW_EXTRA);
        let mut before = before;
        if !forced
            && cx.state.messages.len() <= policy.max_messages
            && policy.triggers(cx.state.messages.len(), before)
        {
            // Over the token trigger only: clearing old tool results costs no model call.
            let plan = plan_clearing(&cx.state.messages, &policy, counter.as_ref());
            if !plan.is_empty() {
                let over = policy.clear_results_over.unwrap_or(usize::MAX);
                let chars = clear_results(cx.state, &plan, over);
                request = frame.rebuild(cx.state);
                ledger = TokenLedger::load(cx.state);
                let after = ledger.estimate(counter.as_ref(), &request.messages, fixed);
                tracing::debug!(
                    results = plan.len(),
                    chars,
                    before,
                    after,
                    "old tool results cleared"
                );
                cx.events.emit(AgentEvent::Custom {
                    kind: "compaction.cleared".into(),
                    data: serde_json::json!({
                        "messages": plan.len(), "chars": chars,
                        "before_tokens": before, "after_tokens": after,
                    }),
                });
                before = after;
            }
        }
        if forced || policy.triggers(cx.state.messages.len(), before) {
            match self.compact(cx, &policy).await {
                Ok(Some(report)) => {
                    request = frame.rebuild(cx.state);
                    ledger = TokenLedger::load(cx.state);
                    let after = ledger.estimate(counter.as_ref(), &request.messages, fixed);
                    Self::report(cx, &report, before, after);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "compaction failed; continuing uncompacted");
                    cx.events.emit(AgentEvent::Custom {
                        kind: "compaction.failed".into(),
                        data: serde_json::json!({ "error": e.to_string() }),
                    });
                }
            }
        }
        let mut retries = 0;
        loop {
            let sent = request.messages.len().min(cx.state.messages.len());
            let error = match next.run(cx, request).await {
                Ok(response) => {
                    if let Some(u) = response.usage {
                        ledger.record_usage(&cx.state.messages[..sent], u.input_tokens);
                    }
                    ledger.messages_tokens(counter.as_ref(), &cx.state.messages);
                    ledger.store(cx.state);
                    return Ok(response);
                }
                Err(hame_core::Error::Model(e)) if e.is_context_overflow() => e,
                Err(other) => {
                    ledger.store(cx.state);
                    return Err(other);
                }
            };
            if retries >= self.max_retries {
                return Err(error.into());
            }
            let before = crate::tokens::messages_tokens(counter.as_ref(), &cx.state.messages);
            match self.compact(cx, &self.overflow_policy()).await {
                Ok(Some(report)) => {
                    let after =
                        crate::tokens::messages_tokens(counter.as_ref(), &cx.state.messages);
                    Self::report(cx, &report, before, after);
                }
                Ok(None) => {
                    tracing::warn!("context overflow and nothing left to compact");
                    return Err(error.into());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "compaction after a context overflow failed");
                    cx.events.emit(AgentEvent::Custom {
                        kind: "compaction.failed".into(),
                        data: serde_json::json!({ "error": e.to_string() }),
                    });
                    return Err(error.into());
                }
            }
            retries += 1;
            cx.events.emit(AgentEvent::ModelRetry {
                reason: error.to_string(),
            });
            ledger = TokenLedger::load(cx.state);
            request = frame.rebuild(cx.state);
        }
    }
}

#[cfg(test)]
#[path = "compaction_tests.rs"]
mod tests;
