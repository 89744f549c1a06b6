//! The shared memory layer of one agent: settings, the token counter, the compactor, the
//! lazily opened search index and the background tasks.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::Utc;
use hame_core::{AgentState, Model, Role};
use hame_fs::{Namespace, Scope};
use hame_memory::daily::{MEMORY_DIR, MEMORY_FILE, parse_daily_log_path};
use hame_memory::{
    Compactor, CompactorConfig, MemoryFiles, MemoryFlusher, SearchIndex, SqliteIndex, TokenCounter,
};
use hame_session::SessionLog;
use hame_tools::Workspace;
use tokio::task::JoinHandle;

use super::files::FsFiles;
use super::{INDEXED_RECORD_CHARS, MAX_FLUSH_ROUNDS, MAX_INDEXED_SESSIONS, MemoryOptions};

/// One agent's memory layer, shared by its layers, tools and background tasks.
#[derive(Debug)]
pub(crate) struct MemoryLayer {
    pub(crate) options: MemoryOptions,
    pub(crate) scope: Scope,
    pub(crate) agent: String,
    pub(crate) model: Arc<dyn Model>,
    pub(crate) counter: Arc<dyn TokenCounter>,
    pub(crate) compactor: Arc<Compactor>,
    pub(crate) context_window: u64,
    index_path: PathBuf,
    index: tokio::sync::OnceCell<Arc<dyn SearchIndex>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Sessions with an after-call flush started and not finished (at most one each).
    flushing: Mutex<HashSet<hame_state::StateKey>>,
}

/// A session's after-call flush in flight ([`MemoryLayer::claim_flush`]); released when
/// dropped, also when its task fails or is aborted.
#[derive(Debug)]
pub(crate) struct FlushClaim {
    layer: Arc<MemoryLayer>,
    key: hame_state::StateKey,
}

impl Drop for FlushClaim {
    fn drop(&mut self) {
        self.layer
            .flushing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

/// What one flush (possibly several rounds) did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flushed {
    pub(crate) rounds: usize,
    pub(crate) facts: usize,
}

impl MemoryLayer {
    pub(crate) fn new(
        options: MemoryOptions,
        scope: Scope,
        agent: &str,
        model: Arc<dyn Model>,
        counter: Arc<dyn TokenCounter>,
        workspace: &std::path::Path,
    ) -> Self {
        let context_window = options
            .context_window
            .unwrap_or_else(|| model.info().context_window);
        let compactor = Arc::new(Compactor::new(
            CompactorConfig {
                policy: options.compaction.clone(),
                context_window: Some(context_window),
                ..CompactorConfig::default()
            },
            counter.clone(),
        ));
        let index_path = options.index_path.clone().unwrap_or_else(|| {
            workspace
                .join("agents")
                .join(agent)
                .join(".memory-index.sqlite")
        });
        let index = tokio::sync::OnceCell::new();
        if let Some(given) = &options.index {
            // A freshly created cell cannot be full: `set` only fails when it is.
            let _ = index.set(given.clone());
        }
        Self {
            options,
            scope,
            agent: agent.to_owned(),
            model,
            counter,
            compactor,
            context_window,
            index_path,
            index,
            tasks: Mutex::new(Vec::new()),
            flushing: Mutex::new(HashSet::new()),
        }
    }

    /// The caller's memory files (the home of its workspace handle: `memory/`, `MEMORY.md`,
    /// offloaded results).
    pub(crate) fn files(&self, ws: &Workspace) -> FsFiles {
        FsFiles::new(ws.home().clone())
    }

    /// The flusher of the caller's memory files.
    pub(crate) fn flusher(&self, ws: &Workspace) -> MemoryFlusher {
        let files: Arc<dyn MemoryFiles> = Arc::new(self.files(ws));
        MemoryFlusher::new(files, self.model.clone(), self.options.flush.clone())
    }

    /// Flushes the messages after the watermark into today's log, in rounds until nothing
    /// is pending (at most [`MAX_FLUSH_ROUNDS`]). Advances the watermark in `state`.
    pub(crate) async fn flush(
        &self,
        state: &mut AgentState,
        ws: &Workspace,
    ) -> hame_memory::Result<Flushed> {
        let flusher = self.flusher(ws);
        let mut done = Flushed::default();
        for _ in 0..MAX_FLUSH_ROUNDS {
            let report = flusher
                .flush(state, &ws.identity().session, Utc::now())
                .await?;
            if report.span.is_none() {
                break;
            }
            done.rounds += 1;
            done.facts += report.appended;
            if !report.more {
                break;
            }
        }
        Ok(done)
    }

    /// The search index, opened on first use.
    pub(crate) async fn index(&self) -> hame_memory::Result<Arc<dyn SearchIndex>> {
        self.index
            .get_or_try_init(|| async {
                let index = SqliteIndex::open(&self.index_path).await?;
                tracing::debug!(path = %self.index_path.display(), rebuilt = index.was_rebuilt(), "memory index opened");
                Ok(Arc::new(index) as Arc<dyn SearchIndex>)
            })
            .await
            .cloned()
    }

    /// The index tenant of the caller's memory files: its namespace key.
    pub(crate) fn memory_tenant(&self, ws: &Workspace) -> hame_memory::Result<String> {
        let id = ws.identity();
        let ns = Namespace::derive(&self.agent, id.user.as_deref(), &id.session, self.scope)
            .map_err(invalid)?;
        Ok(ns.key('/'))
    }

    /// The index tenant of the caller's session logs (never equal to a memory tenant).
    pub(crate) fn session_tenant(&self, ws: &Workspace) -> hame_memory::Result<String> {
        let id = ws.identity();
        let ns = Namespace::derive(&self.agent, id.user.as_deref(), &id.session, Scope::User)
            .map_err(invalid)?;
        Ok(format!("{}#sessions", ns.key('/')))
    }

    /// Brings the index in step with the caller's memory files (`MEMORY.md` and
    /// `memory/*.md`): unchanged files are skipped by hash, deleted ones removed.
    pub(crate) async fn sync_memory(
        &self,
        ws: &Workspace,
    ) -> hame_memory::Result<(Arc<dyn SearchIndex>, String)> {
        let index = self.index().await?;
        let tenant = self.memory_tenant(ws)?;
        let files = self.files(ws);
        let mut paths = vec![MEMORY_FILE.to_owned()];
        paths.extend(
            files
                .list(MEMORY_DIR)
                .await?
                .into_iter()
                .filter(|p| parse_daily_log_path(p).is_some()),
        );
        let mut present = HashSet::new();
        for p in paths {
            if let Some(text) = files.read(&p).await? {
                index.upsert_document(&tenant, &p, &text).await?;
                present.insert(p);
            }
        }
        for doc in index.documents(&tenant).await? {
            if !present.contains(&doc.path) {
                index.remove_document(&tenant, &doc.path).await?;
            }
        }
        Ok((index, tenant))
    }

    /// Brings the index in step with the caller's session logs: one document per session
    /// (path = session id), one line per record, `#<seq> <role>: <text>`. Returns the
    /// lines of each document so hits can be mapped back to sequence numbers.
    pub(crate) async fn sync_sessions(
        &self,
        ws: &Workspace,
    ) -> hame_memory::Result<(Arc<dyn SearchIndex>, String, BTreeMap<String, Vec<String>>)> {
        let index = self.index().await?;
        let tenant = self.session_tenant(ws)?;
        let session = ws.identity().session.clone();
        let log = SessionLog::new(ws.records().clone(), &self.agent).map_err(|e| {
            hame_memory::Error::files_with("agents", "cannot open the session log", e)
        })?;
        let mut ids: Vec<String> = match log.list_sessions().await {
            Ok(entries) => entries.into_iter().map(|e| e.id).collect(),
            Err(e) => {
                tracing::debug!(error = %e, "no session index yet");
                Vec::new()
            }
        };
        ids.truncate(MAX_INDEXED_SESSIONS);
        if !ids.contains(&session) {
            ids.push(session);
        }
        let mut docs = BTreeMap::new();
        for id in ids {
            let records = match log.read(&id, ..).await {
                Ok(r) => r,
                Err(e) if e.code() == hame_session::codes::SESSION_NOT_FOUND => continue,
                Err(e) => {
                    return Err(hame_memory::Error::files_with(
                        id.as_str(),
                        "cannot read the session log",
                        e,
                    ));
                }
            };
            let lines: Vec<String> = records
                .iter()
                .map(|r| {
                    let text = r.message.text_content();
                    let results: Vec<&str> = r
                        .message
                        .tool_results_iter()
                        .map(|t| t.content.as_str())
                        .collect();
                    let calls: Vec<String> = r
                        .message
                        .tool_calls()
                        .map(|c| format!("{}({})", c.name, c.arguments))
                        .collect();
                    let body = [text, results.join(" "), calls.join(" ")]
                        .into_iter()
                        .filter(|s| !s.trim().is_empty())
                        .collect::<Vec<_>>()
                        .join(" ");
                    let flat = body.split_whitespace().collect::<Vec<_>>().join(" ");
                    let role = match r.role {
                        Role::System => "system",
                        Role::User => "user",
                        Role::Assistant => "assistant",
                        Role::Tool => "tool",
                    };
                    format!(
                        "#{} {role}: {}",
                        r.seq,
                        hame_memory::compaction::clip_middle_inline(&flat, INDEXED_RECORD_CHARS)
                            .replace('\n', " ")
                    )
                })
                .collect();
            index
                .upsert_document(&tenant, &id, &lines.join("\n"))
                .await?;
            docs.insert(id, lines);
        }
        Ok((index, tenant, docs))
    }

    /// Keeps a background task so [`wait_background`](Self::wait_background) can wait for it.
    /// Claims the after-call flush of `key`: `None` while another one of the session is
    /// started and not finished (it loads the state when it gets the lease, so it flushes
    /// what later calls added too).
    pub(crate) fn claim_flush(self: &Arc<Self>, key: &hame_state::StateKey) -> Option<FlushClaim> {
        let mut flushing = self.flushing.lock().unwrap_or_else(PoisonError::into_inner);
        flushing.insert(key.clone()).then(|| FlushClaim {
            layer: self.clone(),
            key: key.clone(),
        })
    }

    /// Background tasks started and not finished.
    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        let tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        tasks.iter().filter(|t| !t.is_finished()).count()
    }

    pub(crate) fn track(&self, task: JoinHandle<()>) {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    /// Waits up to `timeout` for the background tasks started so far; returns whether
    /// they all finished.
    pub(crate) async fn wait_background(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let tasks: Vec<JoinHandle<()>> = {
                let mut t = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
                std::mem::take(&mut *t)
            };
            if tasks.is_empty() {
                return true;
            }
            for t in tasks {
                if tokio::time::timeout_at(deadline, t).await.is_err() {
                    tracing::warn!("background memory work still running at the deadline");
                    return false;
                }
            }
        }
    }
}

fn invalid(e: hame_fs::Error) -> hame_memory::Error {
    hame_memory::Error::InvalidInput(e.to_string())
}
