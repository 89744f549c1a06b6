//! The model-facing tools `session_list` and `session_history`.

use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use hame_core::{ContentBlock, Tool, ToolContext, ToolError, ToolOutput, TypedTool};
use hame_tools::WorkspaceExt;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::error::Error;
use crate::id::validate_id;
use crate::log::{LogPage, SessionLog};
use crate::record::{LogRecord, fmt_time};

/// Default number of sessions `session_list` shows.
pub const DEFAULT_LIST_LIMIT: usize = 20;
/// Most sessions `session_list` shows in one call.
pub const MAX_LIST_LIMIT: usize = 100;
/// Default number of records `session_history` shows.
pub const DEFAULT_HISTORY_LIMIT: usize = 20;
/// Most records `session_history` shows in one call.
pub const MAX_HISTORY_LIMIT: usize = 100;
/// Default cap on the characters shown per record by `session_history`.
pub const DEFAULT_RECORD_CHARS: usize = 2_000;
/// Highest per-record cap a model may ask `session_history` for.
pub const MAX_RECORD_CHARS: usize = 20_000;

/// Limits of the session tools. The defaults are the constants of this module.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionToolOptions {
    /// Sessions `session_list` shows when the model gives no limit.
    pub default_list_limit: usize,
    /// Most sessions `session_list` shows.
    pub max_list_limit: usize,
    /// Records `session_history` shows when the model gives no limit.
    pub default_history_limit: usize,
    /// Most records `session_history` shows.
    pub max_history_limit: usize,
    /// Characters shown per record when the model gives no `max_chars`.
    pub default_record_chars: usize,
    /// Largest `max_chars` honoured.
    pub max_record_chars: usize,
}

impl Default for SessionToolOptions {
    fn default() -> Self {
        SessionToolOptions {
            default_list_limit: DEFAULT_LIST_LIMIT,
            max_list_limit: MAX_LIST_LIMIT,
            default_history_limit: DEFAULT_HISTORY_LIMIT,
            max_history_limit: MAX_HISTORY_LIMIT,
            default_record_chars: DEFAULT_RECORD_CHARS,
            max_record_chars: MAX_RECORD_CHARS,
        }
    }
}

/// `session_list` and `session_history` for the agent `agent_id`. One instance serves every
/// tenant: each call reads the logs in [`Workspace::records`](hame_tools::Workspace::records)
/// of the caller's workspace handle.
pub fn session_tools(
    agent_id: &str,
    options: SessionToolOptions,
) -> crate::Result<Vec<Arc<dyn Tool>>> {
    Ok(vec![
        hame_core::typed(SessionListTool::new(agent_id, options.clone())?),
        hame_core::typed(SessionHistoryTool::new(agent_id, options)?),
    ])
}

fn open_log(agent_id: &str, ctx: &ToolContext) -> Result<SessionLog, ToolError> {
    let fs = ctx.workspace()?.records().clone();
    Ok(SessionLog::new(fs, agent_id)?)
}

/// Arguments of the session_list tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionListArgs {
    /// How many sessions to show, newest first (default 20, at most 100).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// Lists this agent's sessions, newest first.
#[derive(Debug)]
pub struct SessionListTool {
    agent_id: String,
    options: SessionToolOptions,
}

impl SessionListTool {
    /// The tool for `agent_id`.
    pub fn new(agent_id: &str, options: SessionToolOptions) -> crate::Result<Self> {
        validate_id("agent id", agent_id)?;
        Ok(SessionListTool {
            agent_id: agent_id.to_owned(),
            options,
        })
    }
}

#[async_trait]
impl TypedTool for SessionListTool {
    type Args = SessionListArgs;

    fn name(&self) -> &str {
        "session_list"
    }

    fn description(&self) -> String {
        format!(
            "List your past sessions, newest first (id, title, last update, message count; \
             {} by default, at most {}).",
            self.options.default_list_limit, self.options.max_list_limit
        )
    }

    async fn run(&self, args: SessionListArgs, ctx: &ToolContext) -> ToolOutput {
        let log = open_log(&self.agent_id, ctx)?;
        let limit = args
            .limit
            .unwrap_or(self.options.default_list_limit)
            .clamp(1, self.options.max_list_limit.max(1));
        let sessions = log.list_sessions().await?;
        Ok(render_list(
            &sessions,
            limit,
            &ctx.runtime.session_id,
            self.options.max_list_limit,
        ))
    }
}

fn render_list(
    sessions: &[crate::SessionEntry],
    limit: usize,
    current: &str,
    max_limit: usize,
) -> String {
    if sessions.is_empty() {
        return "No sessions have been recorded yet.".to_owned();
    }
    let shown = sessions.len().min(limit);
    let mut out = format!("{} of {} sessions, newest first:\n", shown, sessions.len());
    for s in &sessions[..shown] {
        let title = if s.title.is_empty() {
            "(no user message)".to_owned()
        } else {
            format!("{:?}", s.title)
        };
        let _ = write!(
            out,
            "- {} · {} · {} · updated {}",
            s.id,
            title,
            plural(s.message_count as usize, "message"),
            fmt_time(&s.updated)
        );
        if s.id == current {
            out.push_str(" · current session");
        }
        out.push('\n');
    }
    if shown < sessions.len() {
        if limit < max_limit {
            let _ = writeln!(
                out,
                "{} not shown; call session_list with a larger limit (at most {max_limit}).",
                plural(sessions.len() - shown, "older session")
            );
        } else {
            let _ = writeln!(
                out,
                "{} not shown (at most {max_limit} are listed).",
                plural(sessions.len() - shown, "older session")
            );
        }
    }
    out
}

/// Arguments of the session_history tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionHistoryArgs {
    /// The session to read (from session_list). Default: the current session.
    #[serde(default)]
    pub session_id: Option<String>,
    /// First record number to show (records are numbered from 0). Default 0.
    #[serde(default)]
    pub from_seq: Option<u64>,
    /// How many records to show (default 20, at most 100).
    #[serde(default)]
    pub limit: Option<usize>,
    /// Characters shown per record before it is cut (default 2000, at most 20000).
    #[serde(default)]
    pub max_chars: Option<usize>,
}

/// Reads a session's full, never-compacted log, page by page.
#[derive(Debug)]
pub struct SessionHistoryTool {
    agent_id: String,
    options: SessionToolOptions,
}

impl SessionHistoryTool {
    /// The tool for `agent_id`.
    pub fn new(agent_id: &str, options: SessionToolOptions) -> crate::Result<Self> {
        validate_id("agent id", agent_id)?;
        Ok(SessionHistoryTool {
            agent_id: agent_id.to_owned(),
            options,
        })
    }
}

#[async_trait]
impl TypedTool for SessionHistoryTool {
    type Args = SessionHistoryArgs;

    fn name(&self) -> &str {
        "session_history"
    }

    fn description(&self) -> String {
        format!(
            "Read a session's complete log (default: this one), including what is no longer \
             in your context. Records from #0; page with from_seq/limit (default {}, max {}); \
             each cut at max_chars (default {}, max {}).",
            self.options.default_history_limit,
            self.options.max_history_limit,
            self.options.default_record_chars,
            self.options.max_record_chars
        )
    }

    async fn run(&self, args: SessionHistoryArgs, ctx: &ToolContext) -> ToolOutput {
        let explicit = args.session_id.is_some();
        let session_id = args
            .session_id
            .unwrap_or_else(|| ctx.runtime.session_id.clone());
        validate_id("session id", &session_id)?;
        let log = open_log(&self.agent_id, ctx)?;
        let limit = args
            .limit
            .unwrap_or(self.options.default_history_limit)
            .clamp(1, self.options.max_history_limit.max(1));
        let max_chars = args
            .max_chars
            .unwrap_or(self.options.default_record_chars)
            .clamp(100, self.options.max_record_chars.max(100));
        let from = args.from_seq.unwrap_or(0);
        let page = match log.read_page(&session_id, from, limit).await {
            Ok(page) => page,
            Err(Error::SessionNotFound { .. }) if !explicit => {
                return Ok(format!(
                    "Session {session_id} (the current session) has no recorded messages yet."
                ));
            }
            Err(Error::SessionNotFound { .. }) => {
                return Err(ToolError::new(
                    crate::codes::SESSION_NOT_FOUND,
                    format!(
                        "there is no session {session_id:?}; call session_list to see the sessions"
                    ),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        Ok(render_history(
            &session_id,
            from,
            &page,
            &HistoryLimits {
                max_chars,
                max_record_chars: self.options.max_record_chars,
            },
        ))
    }
}

struct HistoryLimits {
    max_chars: usize,
    max_record_chars: usize,
}

fn render_history(session_id: &str, from: u64, page: &LogPage, limits: &HistoryLimits) -> String {
    let Some(last) = page.last_seq else {
        return format!("Session {session_id} has no records.");
    };
    let mut out = String::new();
    match (page.records.first(), page.records.last()) {
        (Some(first), Some(end)) => {
            let shown = if first.seq == end.seq {
                format!("record #{}", first.seq)
            } else {
                format!("records #{}–#{}", first.seq, end.seq)
            };
            let _ = writeln!(
                out,
                "Session {session_id}: {shown} (the log has {}, numbered #0–#{last}).",
                plural(page.total_records, "record")
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "Session {session_id}: no records from #{from} on (the log has {}, numbered #0–#{last}).",
                plural(page.total_records, "record")
            );
            return out;
        }
    }
    for record in &page.records {
        out.push('\n');
        render_record(&mut out, session_id, record, limits);
    }
    out.push('\n');
    match page.next_seq {
        Some(next) => {
            let _ = writeln!(
                out,
                "More records follow: call session_history with session_id=\"{session_id}\", from_seq={next}."
            );
        }
        None => out.push_str("End of session.\n"),
    }
    if page.skipped_lines > 0 {
        let _ = writeln!(
            out,
            "({} skipped.)",
            plural(page.skipped_lines, "damaged log line")
        );
    }
    out
}

fn render_record(out: &mut String, session_id: &str, record: &LogRecord, limits: &HistoryLimits) {
    let role = match record.role {
        hame_core::Role::System => "system",
        hame_core::Role::User => "user",
        hame_core::Role::Assistant => "assistant",
        hame_core::Role::Tool => "tool",
    };
    let _ = writeln!(
        out,
        "#{} · {} · {} · call {}",
        record.seq,
        fmt_time(&record.time),
        role,
        record.call_id
    );
    let mut body = String::new();
    for block in &record.message.content {
        if !body.is_empty() && !body.ends_with('\n') {
            body.push('\n');
        }
        match block {
            ContentBlock::Text { text } => body.push_str(text),
            ContentBlock::Reasoning { text, .. } => {
                let _ = write!(body, "[reasoning] {text}");
            }
            ContentBlock::ToolCall(call) => {
                let _ = write!(
                    body,
                    "[tool call {} id={}] {}",
                    call.name, call.id, call.arguments
                );
            }
            ContentBlock::ToolResult(result) => {
                let status = match (&result.code, result.is_error) {
                    (Some(code), _) => format!(" error={code}"),
                    (None, true) => " error".to_owned(),
                    (None, false) => String::new(),
                };
                let _ = write!(
                    body,
                    "[tool result id={}{status}] {}",
                    result.id, result.content
                );
            }
            ContentBlock::Image(image) => body.push_str(&image.describe()),
        }
    }
    let total = body.chars().count();
    if total <= limits.max_chars {
        out.push_str(&body);
        if !body.ends_with('\n') {
            out.push('\n');
        }
        return;
    }
    let cut: String = body.chars().take(limits.max_chars).collect();
    out.push_str(&cut);
    if !cut.ends_with('\n') {
        out.push('\n');
    }
    if limits.max_chars < limits.max_record_chars {
        let _ = writeln!(
            out,
            "[record cut: {} of {total} characters shown; call session_history with session_id=\"{session_id}\", from_seq={}, limit=1, max_chars={} to see more]",
            limits.max_chars, record.seq, limits.max_record_chars
        );
    } else {
        let _ = writeln!(
            out,
            "[record cut: {} of {total} characters shown; this is the most the tool shows, the full record is kept in the session log]",
            limits.max_chars
        );
    }
}

fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
