//! Read-only inspection of a caller's session logs and memory, for tools outside the loop
//! (`hame sessions`, `hame memory`): the same files and the same search index the
//! session and memory tools use, through the caller's workspace handle.

use hame_memory::SearchOptions;
use hame_session::{LogRecord, SessionEntry, SessionLog};

use hame_core::RuntimeContext;

use crate::{Error, HarnessAgent, Result};

/// One hit of [`HarnessAgent::search_sessions`].
#[derive(Debug, Clone, PartialEq)]
pub struct SessionHit {
    /// The session id.
    pub session: String,
    /// The record's sequence number in the session log, when known.
    pub seq: Option<u64>,
    /// The matching record (or a window of it), matches wrapped in `**`.
    pub snippet: String,
    /// Relevance, larger is better.
    pub score: f64,
}

impl HarnessAgent {
    fn session_log(&self, ctx: &RuntimeContext) -> Result<SessionLog> {
        let ws = self.workspace_for(ctx)?;
        SessionLog::new(ws.records().clone(), self.name())
            .map_err(|e| Error::storage("cannot open the session log", e))
    }

    /// The caller's sessions (agent and user of `ctx`) from the session index, most
    /// recently updated first.
    pub async fn sessions(&self, ctx: &RuntimeContext) -> Result<Vec<SessionEntry>> {
        let mut entries = self
            .session_log(ctx)?
            .list_sessions()
            .await
            .map_err(|e| Error::storage("cannot read the session index", e))?;
        entries.sort_by_key(|e| std::cmp::Reverse(e.updated));
        Ok(entries)
    }

    /// Every record of the caller's session `session_id`, in order; `None` when the
    /// session has no log.
    pub async fn session_records(
        &self,
        ctx: &RuntimeContext,
        session_id: &str,
    ) -> Result<Option<Vec<LogRecord>>> {
        crate::validate_id("session id", session_id)?;
        match self.session_log(ctx)?.read(session_id, ..).await {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.code() == hame_session::codes::SESSION_NOT_FOUND => Ok(None),
            Err(e) => Err(Error::storage("cannot read the session log", e)),
        }
    }

    /// The observations of the caller's session `session_id` (one per tool call and per
    /// check run), in the order they were written; empty when there are none.
    pub async fn session_observations(
        &self,
        ctx: &RuntimeContext,
        session_id: &str,
    ) -> Result<Vec<hame_core::Observation>> {
        crate::validate_id("session id", session_id)?;
        self.session_log(ctx)?
            .read_observations(session_id)
            .await
            .map_err(|e| Error::storage("cannot read the observations", e))
    }

    /// The current evidence of each check of the caller's session `session_id` (the newest
    /// of each check), `stale` when a covered file changed since.
    pub async fn session_evidence(
        &self,
        ctx: &RuntimeContext,
        session_id: &str,
    ) -> Result<Vec<hame_core::Evidence>> {
        crate::validate_id("session id", session_id)?;
        let mut ctx = ctx.clone();
        ctx.session_id = session_id.to_owned();
        let ws = self.workspace_for(&ctx)?;
        self.inner
            .evidence
            .current(&ctx, &ws)
            .await
            .map_err(Error::Call)
    }

    /// The names of the declared checks.
    pub fn verifier_names(&self) -> Vec<String> {
        self.inner.evidence.verifier_names()
    }

    /// Searches the caller's memory (`MEMORY.md`, `memory/*.md`) like `memory_search`;
    /// at most `limit` hits (1..=[`MAX_HITS`](crate::memory::MAX_HITS)). A configuration
    /// error when memory is off.
    pub async fn search_memory(
        &self,
        ctx: &RuntimeContext,
        query: &str,
        limit: usize,
    ) -> Result<Vec<hame_memory::Hit>> {
        let layer = self.memory_layer()?;
        let ws = self.workspace_for(ctx)?;
        let (index, tenant) = layer
            .sync_memory(&ws)
            .await
            .map_err(|e| Error::storage("cannot index the memory files", e))?;
        index
            .search(&tenant, query, &SearchOptions::limit(clamp(limit)))
            .await
            .map_err(|e| Error::storage("memory search failed", e))
    }

    /// Searches the caller's session logs like `session_search`.
    pub async fn search_sessions(
        &self,
        ctx: &RuntimeContext,
        query: &str,
        limit: usize,
    ) -> Result<Vec<SessionHit>> {
        let layer = self.memory_layer()?;
        let ws = self.workspace_for(ctx)?;
        let (index, tenant, docs) = layer
            .sync_sessions(&ws)
            .await
            .map_err(|e| Error::storage("cannot index the session logs", e))?;
        let hits = index
            .search(&tenant, query, &SearchOptions::limit(clamp(limit)))
            .await
            .map_err(|e| Error::storage("session search failed", e))?;
        Ok(hits
            .into_iter()
            .map(|h| {
                let seq = docs
                    .get(&h.path)
                    .and_then(|lines| lines.get((h.line as usize).saturating_sub(1)))
                    .and_then(|l| l.strip_prefix('#'))
                    .and_then(|l| l.split_once(' '))
                    .and_then(|(n, _)| n.parse().ok());
                // The indexed line starts with `#<seq> `: the seq is a field of its own.
                let snippet = match seq {
                    Some(n) => h
                        .snippet
                        .strip_prefix(&format!("#{n} "))
                        .map_or_else(|| h.snippet.clone(), str::to_owned),
                    None => h.snippet.clone(),
                };
                SessionHit {
                    session: h.path,
                    seq,
                    snippet,
                    score: h.score,
                }
            })
            .collect())
    }

    /// The caller's memory files: `MEMORY.md` (when it exists), then the daily logs
    /// `memory/YYYY-MM-DD.md`, oldest first, as (path, content). A configuration error
    /// when memory is off.
    pub async fn memory_files(&self, ctx: &RuntimeContext) -> Result<Vec<(String, String)>> {
        use hame_memory::MemoryFiles;
        use hame_memory::daily::{MEMORY_DIR, MEMORY_FILE, parse_daily_log_path};
        let layer = self.memory_layer()?;
        let ws = self.workspace_for(ctx)?;
        let files = layer.files(&ws);
        let read_err = |e| Error::storage("cannot read the memory files", e);
        let mut out = Vec::new();
        if let Some(text) = files.read(MEMORY_FILE).await.map_err(read_err)? {
            out.push((MEMORY_FILE.to_owned(), text));
        }
        let mut daily: Vec<String> = files
            .list(MEMORY_DIR)
            .await
            .map_err(read_err)?
            .into_iter()
            .filter(|p| parse_daily_log_path(p).is_some())
            .collect();
        daily.sort();
        for path in daily {
            if let Some(text) = files.read(&path).await.map_err(read_err)? {
                out.push((path, text));
            }
        }
        Ok(out)
    }

    fn memory_layer(&self) -> Result<&std::sync::Arc<crate::memory::MemoryLayer>> {
        self.inner
            .memory
            .as_ref()
            .ok_or_else(|| Error::Config("memory is switched off (--no-memory)".into()))
    }
}

fn clamp(limit: usize) -> usize {
    limit.clamp(1, crate::memory::MAX_HITS)
}
