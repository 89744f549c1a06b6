//! The memory tools: `memory_search`, `memory_get`, `memory_save`, `session_search`.

use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use hame_core::{Tool, ToolContext, ToolError, ToolOutput, TypedTool, typed};
use hame_memory::daily::{MEMORY_DIR, MEMORY_FILE, daily_log_path, new_facts};
use hame_memory::{MemoryFiles, SearchOptions};
use hame_tools::WorkspaceExt;
use schemars::JsonSchema;
use serde::Deserialize;

use super::layer::MemoryLayer;
use super::{INDEXED_RECORD_CHARS, MAX_INDEXED_SESSIONS};

/// Default hits of the search tools.
pub const DEFAULT_HITS: usize = 8;
/// Most hits of the search tools.
pub const MAX_HITS: usize = 50;
/// Default and most lines returned by `memory_get`.
pub const GET_LINES: (usize, usize) = (50, 500);
/// Longest fact `memory_save` accepts (characters).
pub const MAX_SAVED_FACT_CHARS: usize = 500;

const UNAVAILABLE: &str = "memory_unavailable";
const NOT_FOUND: &str = "file_not_found";
const INVALID: &str = "invalid_arguments";

/// The four memory tools over one layer.
pub(crate) fn memory_tools(layer: &Arc<MemoryLayer>) -> Vec<Arc<dyn Tool>> {
    vec![
        typed(MemorySearch(layer.clone())),
        typed(MemoryGet(layer.clone())),
        typed(MemorySave(layer.clone())),
        typed(SessionSearch(layer.clone())),
    ]
}

/// One search of the tenant's documents with the tool's limit.
async fn search(
    index: &dyn hame_memory::SearchIndex,
    tenant: &str,
    args: &SearchArgs,
) -> Result<Vec<hame_memory::Hit>, ToolError> {
    index
        .search(
            tenant,
            &args.query,
            &SearchOptions::limit(limit(args.limit)),
        )
        .await
        .map_err(unavailable)
}

fn unavailable(e: impl std::fmt::Display) -> ToolError {
    ToolError::new(UNAVAILABLE, format!("memory is unavailable right now: {e}"))
}

fn limit(n: Option<usize>) -> usize {
    n.unwrap_or(DEFAULT_HITS).clamp(1, MAX_HITS)
}

/// Arguments of `memory_search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SearchArgs {
    /// Words (all must match, else any); `word*` is a prefix.
    query: String,
    /// Most hits (default 8).
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Debug)]
struct MemorySearch(Arc<MemoryLayer>);

#[async_trait]
impl TypedTool for MemorySearch {
    type Args = SearchArgs;

    fn name(&self) -> &str {
        "memory_search"
    }

    fn description(&self) -> String {
        "Search long-term memory (MEMORY.md, memory/) for facts and preferences; returns ranked path:line hits.".into()
    }

    async fn run(&self, args: SearchArgs, ctx: &ToolContext) -> ToolOutput {
        let (index, tenant) = self
            .0
            .sync_memory(ctx.workspace()?)
            .await
            .map_err(unavailable)?;
        let hits = search(index.as_ref(), &tenant, &args).await?;
        if hits.is_empty() {
            return Ok(format!("No memory matches {:?}.", args.query));
        }
        let mut out = format!("{} hits for {:?}:\n", hits.len(), args.query);
        for h in hits {
            let _ = writeln!(out, "{}:{}: {}", h.path, h.line, h.snippet);
        }
        Ok(out)
    }
}

/// Arguments of `memory_get`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GetArgs {
    /// `MEMORY.md` or a file under `memory/` (as shown by memory_search).
    path: String,
    /// First line to show, 1-based (default 1).
    #[serde(default)]
    from: Option<usize>,
    /// How many lines (default 50, at most 500).
    #[serde(default)]
    lines: Option<usize>,
}

#[derive(Debug)]
struct MemoryGet(Arc<MemoryLayer>);

#[async_trait]
impl TypedTool for MemoryGet {
    type Args = GetArgs;

    fn name(&self) -> &str {
        "memory_get"
    }

    fn description(&self) -> String {
        "Read lines of a memory file (MEMORY.md or memory/...), e.g. around a memory_search \
         hit. Lines are numbered from 1."
            .into()
    }

    async fn run(&self, args: GetArgs, ctx: &ToolContext) -> ToolOutput {
        let path = args.path.trim().trim_start_matches('/').to_owned();
        let allowed = path == MEMORY_FILE
            || path
                .strip_prefix(MEMORY_DIR)
                .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1);
        if !allowed || path.split('/').any(|s| s == "..") {
            return Err(ToolError::new(
                INVALID,
                format!("{path:?} is not a memory file: use MEMORY.md or a path under memory/"),
            ));
        }
        let files = self.0.files(ctx.workspace()?);
        let Some(text) = files.read(&path).await.map_err(unavailable)? else {
            return Err(ToolError::new(
                NOT_FOUND,
                format!("{path} does not exist yet"),
            ));
        };
        let from = args.from.unwrap_or(1).max(1);
        let n = args.lines.unwrap_or(GET_LINES.0).clamp(1, GET_LINES.1);
        let total = text.lines().count();
        if from > total.max(1) {
            return Ok(format!("{path} has {total} lines; nothing at line {from}."));
        }
        let mut out = String::new();
        for (i, line) in text.lines().enumerate().skip(from - 1).take(n) {
            let _ = writeln!(out, "{:>5}\t{line}", i + 1);
        }
        let last = (from - 1 + n).min(total);
        if last < total {
            let _ = writeln!(
                out,
                "[lines {from}-{last} of {total}; continue with from={}]",
                last + 1
            );
        }
        Ok(out)
    }
}

/// Arguments of `memory_save`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SaveArgs {
    /// One durable, self-contained fact (a preference, decision, deadline...).
    fact: String,
}

#[derive(Debug)]
struct MemorySave(Arc<MemoryLayer>);

#[async_trait]
impl TypedTool for MemorySave {
    type Args = SaveArgs;

    fn name(&self) -> &str {
        "memory_save"
    }

    fn description(&self) -> String {
        "Save one durable fact to today's memory log now (e.g. when asked to remember \
         something); duplicates are skipped."
            .into()
    }

    async fn run(&self, args: SaveArgs, ctx: &ToolContext) -> ToolOutput {
        let fact = args.fact.split_whitespace().collect::<Vec<_>>().join(" ");
        if fact.is_empty() {
            return Err(ToolError::new(INVALID, "the fact is empty"));
        }
        if fact.chars().count() > MAX_SAVED_FACT_CHARS {
            return Err(ToolError::new(
                INVALID,
                format!("a fact is at most {MAX_SAVED_FACT_CHARS} characters; split it"),
            ));
        }
        let files = self.0.files(ctx.workspace()?);
        let now = Utc::now();
        let path = daily_log_path(now.date_naive());
        let memory = files
            .read(MEMORY_FILE)
            .await
            .map_err(unavailable)?
            .unwrap_or_default();
        let today = files
            .read(&path)
            .await
            .map_err(unavailable)?
            .unwrap_or_default();
        if new_facts([memory.as_str(), today.as_str()], vec![fact.clone()]).is_empty() {
            return Ok(format!("Already in memory: {fact}"));
        }
        let section = format!(
            "\n## {} UTC · session {} · saved by the agent\n- {fact}\n",
            now.format("%H:%M"),
            ctx.runtime.session_id
        );
        files.append(&path, &section).await.map_err(unavailable)?;
        Ok(format!("Saved to {path}: {fact}"))
    }
}

#[derive(Debug)]
struct SessionSearch(Arc<MemoryLayer>);

#[async_trait]
impl TypedTool for SessionSearch {
    type Args = SearchArgs;

    fn name(&self) -> &str {
        "session_search"
    }

    fn description(&self) -> String {
        format!(
            "Search the logs of your {MAX_INDEXED_SESSIONS} most recently updated sessions \
             (and this one) for words; a record longer than {INDEXED_RECORD_CHARS} characters \
             is searched by its beginning and end only. Hits as session, #seq and snippet (read \
             the whole record with session_history)."
        )
    }

    async fn run(&self, args: SearchArgs, ctx: &ToolContext) -> ToolOutput {
        let (index, tenant, docs) = self
            .0
            .sync_sessions(ctx.workspace()?)
            .await
            .map_err(unavailable)?;
        let hits = search(index.as_ref(), &tenant, &args).await?;
        if hits.is_empty() {
            return Ok(format!("No session record matches {:?}.", args.query));
        }
        let mut out = format!("{} hits for {:?}:\n", hits.len(), args.query);
        for h in hits {
            let seq = docs
                .get(&h.path)
                .and_then(|lines| lines.get((h.line as usize).saturating_sub(1)))
                .and_then(|l| l.strip_prefix('#'))
                .and_then(|l| l.split_once(' '))
                .map(|(n, _)| n.to_owned())
                .unwrap_or_else(|| "?".into());
            let _ = writeln!(out, "session {} · #{seq}: {}", h.path, h.snippet);
        }
        Ok(out)
    }
}
