//! Daily logs: `memory/YYYY-MM-DD.md`, append-only bullet facts extracted from the
//! conversation by a "flush" model call, deduplicated against what is already recorded.
//!
//! File access goes through [`MemoryFiles`], which the harness implements over the
//! tenant's workspace filesystem; [`InMemoryFiles`] serves tests.
//!
//! The flush is incremental: `AgentState.extensions["memory"]` ([`MemoryState`]) holds the
//! sequence number of the last message flushed (a watermark), and only later messages are
//! sent to the model. Sequence numbers survive compaction (see
//! [`CompactionState`]).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use hame_core::{AgentState, ContentBlock, Message, Model, ModelParams, ModelRequest, Role};
use serde::{Deserialize, Serialize};

use crate::compaction::{
    CompactionState, FACTS_HEADING, FactsRequest, SeqSpan, clip_middle, summary_span,
};
use crate::error::{Error, Result};

/// Directory of the daily logs.
pub const MEMORY_DIR: &str = "memory";
/// The curated long-term memory file.
pub const MEMORY_FILE: &str = "MEMORY.md";
/// The key of [`MemoryState`] in `AgentState.extensions`.
pub const EXTENSION_KEY: &str = "memory";
/// What the flush model answers when there is nothing new.
pub const NO_REPLY: &str = "NO_REPLY";
/// Default cap on the transcript of one flush call (characters); later messages wait for
/// the next flush.
pub const DEFAULT_FLUSH_TRANSCRIPT_CHARS: usize = 60_000;
/// Default cap on `MEMORY.md` and today's log shown to the flush call (characters each,
/// head and tail kept).
pub const DEFAULT_FLUSH_CONTEXT_CHARS: usize = 16_000;
/// Default cap on one tool result in the flush transcript.
pub const DEFAULT_FLUSH_RESULT_CHARS: usize = 1_000;
/// Default cap on one tool call's arguments in the flush transcript.
pub const DEFAULT_FLUSH_ARGS_CHARS: usize = 500;
/// Default output budget of a flush call.
pub const DEFAULT_FLUSH_MAX_TOKENS: u32 = 1_500;
/// Longest fact kept (characters); longer bullets are cut.
pub const MAX_FACT_CHARS: usize = 500;

/// What a durable fact is, shared by the flush call and the facts section of a summary.
macro_rules! fact_criteria {
    () => {
        "one concise, self-contained fact per bullet: the user's preferences and personal \
details they shared, project and technical decisions with their reasons, commitments and \
deadlines, who works on what, and lessons learned. Ignore greetings, tool noise, transient \
status and anything already recorded. Write facts in the language of the conversation."
    };
}

/// The system prompt of flush calls.
pub const FLUSH_SYSTEM_PROMPT: &str = concat!(
    "You extract durable facts from an agent's conversation for its long-term memory. Output \
only a Markdown bullet list, ",
    fact_criteria!(),
    " If there is nothing new, answer exactly NO_REPLY."
);

/// The facts part of a summary call that records them too ([`MemoryFlusher::facts_request`]);
/// `{heading}` is [`FACTS_HEADING`], `{from}` and `{to}` the messages' sequence numbers.
pub const FACTS_INSTRUCTIONS: &str = concat!(
    "Besides the summary, end your answer with one more section, headed exactly `{heading}`, \
listing as Markdown bullets the NEW durable facts of messages #{from}..#{to} for the agent's \
long-term memory, ",
    fact_criteria!(),
    " Write None under the heading when there are none."
);

/// Workspace file access for memory, implemented by the harness over the tenant's
/// filesystem. Paths are workspace-relative (`memory/2026-03-14.md`, `MEMORY.md`).
#[async_trait]
pub trait MemoryFiles: Send + Sync + fmt::Debug + 'static {
    /// The file's text; `None` when it does not exist.
    async fn read(&self, path: &str) -> Result<Option<String>>;
    /// Replaces the file's text atomically (readers see the old or the new text).
    async fn write_atomic(&self, path: &str, content: &str) -> Result<()>;
    /// Appends text, creating the file when missing.
    async fn append(&self, path: &str, content: &str) -> Result<()>;
    /// Paths of the files directly in `dir` (not in subdirectories), any order.
    async fn list(&self, dir: &str) -> Result<Vec<String>>;
}

#[async_trait]
impl<T: MemoryFiles + ?Sized> MemoryFiles for Arc<T> {
    async fn read(&self, path: &str) -> Result<Option<String>> {
        (**self).read(path).await
    }
    async fn write_atomic(&self, path: &str, content: &str) -> Result<()> {
        (**self).write_atomic(path, content).await
    }
    async fn append(&self, path: &str, content: &str) -> Result<()> {
        (**self).append(path, content).await
    }
    async fn list(&self, dir: &str) -> Result<Vec<String>> {
        (**self).list(dir).await
    }
}

/// [`MemoryFiles`] in a map, for tests and ephemeral agents.
#[derive(Debug, Default)]
pub struct InMemoryFiles {
    files: Mutex<BTreeMap<String, String>>,
}

impl InMemoryFiles {
    /// No files.
    pub fn new() -> Self {
        Self::default()
    }

    /// A snapshot of every file.
    pub fn snapshot(&self) -> BTreeMap<String, String> {
        self.files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[async_trait]
impl MemoryFiles for InMemoryFiles {
    async fn read(&self, path: &str) -> Result<Option<String>> {
        let f = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(f.get(path).cloned())
    }
    async fn write_atomic(&self, path: &str, content: &str) -> Result<()> {
        let mut f = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        f.insert(path.to_owned(), content.to_owned());
        Ok(())
    }
    async fn append(&self, path: &str, content: &str) -> Result<()> {
        let mut f = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        f.entry(path.to_owned()).or_default().push_str(content);
        Ok(())
    }
    async fn list(&self, dir: &str) -> Result<Vec<String>> {
        let prefix = format!("{}/", dir.trim_end_matches('/'));
        let f = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(f.keys()
            .filter(|k| {
                k.strip_prefix(&prefix)
                    .is_some_and(|rest| !rest.contains('/'))
            })
            .cloned()
            .collect())
    }
}

/// The path of the daily log of `date`: `memory/YYYY-MM-DD.md`.
pub fn daily_log_path(date: NaiveDate) -> String {
    format!("{MEMORY_DIR}/{}.md", date.format("%Y-%m-%d"))
}

/// The date of a daily log path, `None` for any other path (archives, `MEMORY.md`, ...).
pub fn parse_daily_log_path(path: &str) -> Option<NaiveDate> {
    let name = path.strip_prefix(MEMORY_DIR)?.strip_prefix('/')?;
    let stem = name.strip_suffix(".md")?;
    if stem.len() != 10 {
        return None;
    }
    NaiveDate::parse_from_str(stem, "%Y-%m-%d").ok()
}

/// Parses a model's answer into facts: Markdown bullets (`-`, `*`, `+`, `•`, `1.`) with
/// indented continuation lines joined. `NO_REPLY`, headings, code fences and prose outside
/// bullets are ignored. Facts are trimmed and cut to [`MAX_FACT_CHARS`].
pub fn parse_bullets(answer: &str) -> Vec<String> {
    let trimmed = answer.trim();
    if trimmed.is_empty()
        || trimmed.trim_matches(|c: char| !c.is_alphanumeric() && c != '_') == NO_REPLY
    {
        return Vec::new();
    }
    let mut facts: Vec<String> = Vec::new();
    let mut open = false;
    for line in answer.lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with("```") || t.starts_with('#') || t == NO_REPLY {
            open = false;
            continue;
        }
        if let Some(body) = bullet_body(t) {
            if !body.is_empty() {
                facts.push(body.to_owned());
                open = true;
            }
            continue;
        }
        let indented = line.starts_with(' ') || line.starts_with('\t');
        if open && indented {
            if let Some(last) = facts.last_mut() {
                last.push(' ');
                last.push_str(t);
            }
        } else {
            open = false;
        }
    }
    facts
        .into_iter()
        .map(|f| {
            let f = f.split_whitespace().collect::<Vec<_>>().join(" ");
            if f.chars().count() > MAX_FACT_CHARS {
                let mut cut: String = f.chars().take(MAX_FACT_CHARS - 1).collect();
                cut.push('…');
                cut
            } else {
                f
            }
        })
        .filter(|f| !f.is_empty())
        .collect()
}

fn bullet_body(t: &str) -> Option<&str> {
    for p in ["- [ ] ", "- [x] ", "- ", "* ", "+ ", "• "] {
        if let Some(b) = t.strip_prefix(p) {
            return Some(b.trim());
        }
    }
    if t == "-" || t == "*" {
        return Some("");
    }
    let digits = t.chars().take_while(char::is_ascii_digit).count();
    if digits > 0 && digits <= 3 {
        let rest = &t[digits..];
        if let Some(b) = rest.strip_prefix(". ").or_else(|| rest.strip_prefix(") ")) {
            return Some(b.trim());
        }
    }
    None
}

/// The form facts are compared in: lower case, words only, single spaces.
pub fn normalize_fact(fact: &str) -> String {
    fact.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The candidates not already present as bullets in `existing` (any number of log or
/// memory texts), nor repeated among themselves; order kept.
pub fn new_facts<'a>(
    existing: impl IntoIterator<Item = &'a str>,
    candidates: Vec<String>,
) -> Vec<String> {
    let mut seen: HashSet<String> = existing
        .into_iter()
        .flat_map(parse_bullets)
        .map(|f| normalize_fact(&f))
        .collect();
    candidates
        .into_iter()
        .filter(|c| {
            let n = normalize_fact(c);
            !n.is_empty() && seen.insert(n)
        })
        .collect()
}

/// The section appended to a daily log for one flush:
/// `## HH:MM UTC · session <id> · messages #a..#b` followed by the bullets.
pub fn render_flush_section(
    at: DateTime<Utc>,
    session_id: &str,
    span: SeqSpan,
    facts: &[String],
) -> String {
    let mut s = format!(
        "\n## {} UTC · session {} · messages #{}..#{}\n",
        at.format("%H:%M"),
        session_id,
        span.from,
        span.to
    );
    for f in facts {
        s.push_str("- ");
        s.push_str(f);
        s.push('\n');
    }
    s
}

/// The memory sub-state in `AgentState.extensions["memory"]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryState {
    /// Sequence number of the last message already flushed; `None` before the first flush.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flushed_through: Option<u64>,
    /// When the last flush ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_flush: Option<DateTime<Utc>>,
}

impl MemoryState {
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

    /// The first sequence number not yet flushed.
    pub fn watermark(&self) -> u64 {
        self.flushed_through.map_or(0, |s| s + 1)
    }
}

/// Limits of a flush.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushOptions {
    /// Cap on the transcript of one call. Default [`DEFAULT_FLUSH_TRANSCRIPT_CHARS`].
    pub max_transcript_chars: usize,
    /// Cap on `MEMORY.md` and on today's log shown. Default [`DEFAULT_FLUSH_CONTEXT_CHARS`].
    pub max_context_chars: usize,
    /// Cap on one tool result. Default [`DEFAULT_FLUSH_RESULT_CHARS`].
    pub max_result_chars: usize,
    /// Cap on one tool call's arguments. Default [`DEFAULT_FLUSH_ARGS_CHARS`].
    pub max_args_chars: usize,
    /// Output budget. Default [`DEFAULT_FLUSH_MAX_TOKENS`].
    pub max_tokens: u32,
}

impl Default for FlushOptions {
    fn default() -> Self {
        Self {
            max_transcript_chars: DEFAULT_FLUSH_TRANSCRIPT_CHARS,
            max_context_chars: DEFAULT_FLUSH_CONTEXT_CHARS,
            max_result_chars: DEFAULT_FLUSH_RESULT_CHARS,
            max_args_chars: DEFAULT_FLUSH_ARGS_CHARS,
            max_tokens: DEFAULT_FLUSH_MAX_TOKENS,
        }
    }
}

/// The messages not yet flushed, rendered for the flush call: `(transcript, span)`, or
/// `None` when there are none. Stops before the transcript would exceed the cap (at least
/// one message is included); the span says how far it got. System messages are skipped; a
/// compaction summary is included when it covers unflushed messages (it is all that is
/// left of them).
pub fn pending_transcript(state: &AgentState, options: &FlushOptions) -> Option<(String, SeqSpan)> {
    let seqs = CompactionState::load(state);
    let mark = MemoryState::load(state).watermark();
    let mut out = String::new();
    let mut span: Option<SeqSpan> = None;
    for (i, m) in state.messages.iter().enumerate() {
        let s = seqs.span_of(i);
        if s.to < mark || m.role == Role::System {
            continue;
        }
        let entry = render_for_flush(m, s, options);
        if span.is_some() && out.len() + entry.len() > options.max_transcript_chars {
            break;
        }
        out.push_str(&entry);
        out.push_str("\n\n");
        span = Some(match span {
            None => SeqSpan {
                from: s.from.max(mark),
                to: s.to,
            },
            Some(sp) => SeqSpan {
                from: sp.from,
                to: sp.to.max(s.to),
            },
        });
    }
    span.map(|s| (out, s))
}

fn render_for_flush(m: &Message, s: SeqSpan, o: &FlushOptions) -> String {
    if summary_span(m).is_some() {
        return format!(
            "#{}..#{} summary of earlier messages:\n{}",
            s.from,
            s.to,
            clip_middle(&m.text_content(), o.max_transcript_chars / 2)
        );
    }
    let who = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let parts: Vec<String> = m
        .content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.clone()),
            ContentBlock::Reasoning { .. } => None,
            ContentBlock::ToolCall(c) => Some(format!(
                "[tool_call {}({})]",
                c.name,
                clip_middle(&c.arguments, o.max_args_chars)
            )),
            ContentBlock::ToolResult(r) => Some(format!(
                "[tool_result{}] {}",
                if r.is_error { " error" } else { "" },
                clip_middle(&r.content, o.max_result_chars)
            )),
            // Never the base64: a daily note is text the model reads back later.
            ContentBlock::Image(i) => Some(i.describe()),
        })
        .collect();
    format!("#{} {who}: {}", s.from, parts.join("\n"))
}

/// The flush request: instructions, the read-only context (`MEMORY.md`, today's log) and
/// the new messages.
pub fn build_flush_request(
    transcript: &str,
    span: SeqSpan,
    memory_md: &str,
    today_log: &str,
    options: &FlushOptions,
) -> ModelRequest {
    let mut prompt = recorded_context(memory_md, today_log, options);
    prompt.push_str(&format!(
        "New conversation messages #{}..#{}:\n<<<\n{}\n>>>\n\nList the NEW durable facts \
         from these messages as bullets, or answer NO_REPLY.",
        span.from,
        span.to,
        transcript.trim_end()
    ));
    ModelRequest {
        system: FLUSH_SYSTEM_PROMPT.to_owned(),
        messages: vec![Message::user(prompt)],
        tools: Vec::new(),
        params: ModelParams {
            temperature: None,
            max_tokens: Some(options.max_tokens),
        },
        cache_key: None,
    }
}

/// What is already recorded, shown read-only to a flush call and to a summary asked for
/// facts: `MEMORY.md` and today's log, each clipped to [`FlushOptions::max_context_chars`].
fn recorded_context(memory_md: &str, today_log: &str, options: &FlushOptions) -> String {
    let section = |title: &str, body: &str| {
        let body = clip_middle(body.trim(), options.max_context_chars);
        format!(
            "{title}\n<<<\n{}\n>>>\n\n",
            if body.is_empty() { "(empty)" } else { &body }
        )
    };
    let mut out = section(
        "Long-term memory (MEMORY.md) — read-only, do not repeat these facts:",
        memory_md,
    );
    out.push_str(&section(
        "Already recorded today — your bullets are appended after these; do not repeat them:",
        today_log,
    ));
    out
}

/// What a flush did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushReport {
    /// The messages read (`None` when nothing was pending and no call was made).
    pub span: Option<SeqSpan>,
    /// The daily log appended to, if any facts were new.
    pub path: Option<String>,
    /// Facts appended.
    pub appended: usize,
    /// Whether unflushed messages remain (the transcript cap was reached).
    pub more: bool,
}

/// Extracts new facts since the watermark into today's log.
#[derive(Debug, Clone)]
pub struct MemoryFlusher {
    files: Arc<dyn MemoryFiles>,
    model: Arc<dyn Model>,
    options: FlushOptions,
}

impl MemoryFlusher {
    /// A flusher writing through `files` and asking `model`.
    pub fn new(files: Arc<dyn MemoryFiles>, model: Arc<dyn Model>, options: FlushOptions) -> Self {
        Self {
            files,
            model,
            options,
        }
    }

    /// Flushes the messages after the watermark: one model call, new facts appended to
    /// `memory/<today>.md`, then the watermark advanced. If the model call or the append
    /// fails, the watermark stays and the error is returned (the next flush retries).
    pub async fn flush(
        &self,
        state: &mut AgentState,
        session_id: &str,
        now: DateTime<Utc>,
    ) -> Result<FlushReport> {
        let Some((transcript, span)) = pending_transcript(state, &self.options) else {
            return Ok(FlushReport {
                span: None,
                path: None,
                appended: 0,
                more: false,
            });
        };
        let seqs = CompactionState::load(state);
        let more = seqs.next_seq(state.messages.len()) > span.to + 1;
        let path = daily_log_path(now.date_naive());
        let memory_md = self.files.read(MEMORY_FILE).await?.unwrap_or_default();
        let today = self.files.read(&path).await?.unwrap_or_default();
        let request = build_flush_request(&transcript, span, &memory_md, &today, &self.options);
        let response = self
            .model
            .complete(request)
            .await
            .map_err(|source| Error::Model {
                purpose: "memory flush",
                source,
            })?;
        let candidates = parse_bullets(&response.message.text_content());
        let mut report = self
            .record(
                state,
                session_id,
                now,
                span,
                candidates,
                [&memory_md, &today],
            )
            .await?;
        report.more = more;
        Ok(report)
    }

    /// The facts of the messages `span` (about to be summarised) asked of the summary call:
    /// `None` when they are all recorded already (the watermark is past them). The request
    /// covers those after the watermark and shows what is recorded (`MEMORY.md`, today's
    /// log), as a flush call does.
    pub async fn facts_request(
        &self,
        state: &AgentState,
        span: SeqSpan,
        now: DateTime<Utc>,
    ) -> Result<Option<FactsRequest>> {
        let mark = MemoryState::load(state).watermark();
        if mark > span.to {
            return Ok(None);
        }
        let span = SeqSpan {
            from: mark.max(span.from),
            to: span.to,
        };
        let memory_md = self.files.read(MEMORY_FILE).await?.unwrap_or_default();
        let today = self
            .files
            .read(&daily_log_path(now.date_naive()))
            .await?
            .unwrap_or_default();
        let mut instructions = FACTS_INSTRUCTIONS
            .replace("{heading}", FACTS_HEADING)
            .replace("{from}", &span.from.to_string())
            .replace("{to}", &span.to.to_string());
        instructions.push_str("\n\n");
        instructions.push_str(&recorded_context(&memory_md, &today, &self.options));
        Ok(Some(FactsRequest {
            span,
            instructions: instructions.trim_end().to_owned(),
            max_tokens: self.options.max_tokens,
        }))
    }

    /// Records the facts a summary call answered for `request` (see
    /// [`facts_request`](Self::facts_request)) as a flush does: the new ones appended to
    /// `memory/<today>.md`, then the watermark advanced to the end of `request.span` (never
    /// moved back). On error the watermark stays.
    pub async fn record_facts(
        &self,
        state: &mut AgentState,
        session_id: &str,
        now: DateTime<Utc>,
        request: &FactsRequest,
        facts: Vec<String>,
    ) -> Result<FlushReport> {
        let memory_md = self.files.read(MEMORY_FILE).await?.unwrap_or_default();
        let path = daily_log_path(now.date_naive());
        let today = self.files.read(&path).await?.unwrap_or_default();
        self.record(
            state,
            session_id,
            now,
            request.span,
            facts,
            [&memory_md, &today],
        )
        .await
    }

    /// Appends the candidates not in `recorded` (`MEMORY.md` and today's log as read) to
    /// today's log and advances the watermark to `span.to`.
    async fn record(
        &self,
        state: &mut AgentState,
        session_id: &str,
        now: DateTime<Utc>,
        span: SeqSpan,
        candidates: Vec<String>,
        recorded: [&str; 2],
    ) -> Result<FlushReport> {
        let path = daily_log_path(now.date_naive());
        let facts = new_facts(recorded, candidates);
        let appended = facts.len();
        let written = if facts.is_empty() {
            None
        } else {
            self.files
                .append(&path, &render_flush_section(now, session_id, span, &facts))
                .await?;
            Some(path)
        };
        let mut ms = MemoryState::load(state);
        ms.flushed_through = Some(ms.flushed_through.map_or(span.to, |f| f.max(span.to)));
        ms.last_flush = Some(now);
        ms.store(state)?;
        Ok(FlushReport {
            span: Some(span),
            path: written,
            appended,
            more: false,
        })
    }
}

#[cfg(test)]
#[path = "daily_tests.rs"]
mod tests;
