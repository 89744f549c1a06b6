//! The shared memory layer of one agent: settings, the token counter, the compactor, the
//! lazily opened search index and the background tasks.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::Utc;
use hame_core::{AgentState, Model, Role, RuntimeContext};
use hame_fs::{Namespace, Scope};
use hame_memory::daily::{MEMORY_DIR, MEMORY_FILE, parse_daily_log_path};
use hame_memory::{
    CompactionPolicy, Compactor, CompactorConfig, MemoryFiles, MemoryFlusher, SearchIndex,
    SqliteIndex, TokenCounter,
};
use hame_session::SessionLog;
use hame_tools::NamespaceExt;
use tokio::task::JoinHandle;

use super::files::FsFiles;
use super::{INDEXED_RECORD_CHARS, MAX_FLUSH_ROUNDS, MAX_INDEXED_SESSIONS, MemoryOptions};
use crate::tenancy::Tenancy;

/// One agent's memory layer, shared by its middleware, tools and background tasks.
#[derive(Debug)]
pub(crate) struct MemoryLayer {
    pub(crate) options: MemoryOptions,
    pub(crate) tenancy: Arc<Tenancy>,
    pub(crate) agent: String,
    pub(crate) model: Arc<dyn Model>,
    pub(crate) counter: Arc<dyn TokenCounter>,
    pub(crate) compactor: Arc<Compactor>,
    pub(crate) context_window: u64,
    index_path: PathBuf,
    index: tokio::sync::OnceCell<Arc<dyn SearchIndex>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
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
        tenancy: Arc<Tenancy>,
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
            tenancy,
            agent: agent.to_owned(),
            model,
            counter,
            compactor,
            context_window,
            index_path,
            index,
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// The compaction policy with token budgets derived from the window.
    pub(crate) fn policy(&self) -> CompactionPolicy {
        self.options
            .compaction
            .resolved_for_window(self.context_window)
    }

    /// The policy after a context overflow: half the usual tail, so a retry fits.
    pub(crate) fn overflow_policy(&self) -> CompactionPolicy {
        let mut p = self.policy();
        p.keep_recent_messages = (p.keep_recent_messages / 2).max(2);
        p.keep_recent_tokens = p.keep_recent_tokens.map(|t| (t / 2).max(500));
        p
    }

    /// The caller's memory files (its namespace over the template).
    pub(crate) fn files(&self, runtime: &RuntimeContext) -> Result<FsFiles, hame_core::Error> {
        let fs = self
            .tenancy
            .fs_for(runtime)
            .map_err(|e| hame_core::Error::middleware("memory", e))?;
        Ok(FsFiles::new(fs))
    }

    /// Flushes the messages after the watermark into today's log, in rounds until nothing
    /// is pending (at most [`MAX_FLUSH_ROUNDS`]). Advances the watermark in `state`.
    pub(crate) async fn flush(
        &self,
        state: &mut AgentState,
        runtime: &RuntimeContext,
    ) -> Result<Flushed, hame_core::Error> {
        let files: Arc<dyn MemoryFiles> = Arc::new(self.files(runtime)?);
        let flusher = MemoryFlusher::new(files, self.model.clone(), self.options.flush.clone());
        let mut done = Flushed::default();
        for _ in 0..MAX_FLUSH_ROUNDS {
            let report = flusher
                .flush(state, &runtime.session_id, Utc::now())
                .await
                .map_err(|e| hame_core::Error::middleware("memory-flush", e))?;
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
    pub(crate) fn memory_tenant(&self, runtime: &RuntimeContext) -> hame_fs::Result<String> {
        let ns = Namespace::for_context(&self.agent, runtime, self.tenancy.isolation.scope)?;
        Ok(ns.key('/'))
    }

    /// The index tenant of the caller's session logs (never equal to a memory tenant).
    pub(crate) fn session_tenant(&self, runtime: &RuntimeContext) -> hame_fs::Result<String> {
        let ns = Namespace::for_context(&self.agent, runtime, Scope::User)?;
        Ok(format!("{}#sessions", ns.key('/')))
    }

    /// Brings the index in step with the caller's memory files (`MEMORY.md` and
    /// `memory/*.md`): unchanged files are skipped by hash, deleted ones removed.
    pub(crate) async fn sync_memory(
        &self,
        runtime: &RuntimeContext,
    ) -> Result<(Arc<dyn SearchIndex>, String), String> {
        let index = self.index().await.map_err(|e| e.to_string())?;
        let tenant = self.memory_tenant(runtime).map_err(|e| e.to_string())?;
        let files = self.files(runtime).map_err(|e| e.to_string())?;
        let mut paths = vec![MEMORY_FILE.to_owned()];
        paths.extend(
            files
                .list(MEMORY_DIR)
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|p| parse_daily_log_path(p).is_some()),
        );
        let mut present = HashSet::new();
        for p in paths {
            if let Some(text) = files.read(&p).await.map_err(|e| e.to_string())? {
                index
                    .upsert_document(&tenant, &p, &text)
                    .await
                    .map_err(|e| e.to_string())?;
                present.insert(p);
            }
        }
        for doc in index.documents(&tenant).await.map_err(|e| e.to_string())? {
            if !present.contains(&doc.path) {
                index
                    .remove_document(&tenant, &doc.path)
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok((index, tenant))
    }

    /// Brings the index in step with the caller's session logs: one document per session
    /// (path = session id), one line per record, `#<seq> <role>: <text>`. Returns the
    /// lines of each document so hits can be mapped back to sequence numbers.
    pub(crate) async fn sync_sessions(
        &self,
        runtime: &RuntimeContext,
    ) -> Result<(Arc<dyn SearchIndex>, String, BTreeMap<String, Vec<String>>), String> {
        let index = self.index().await.map_err(|e| e.to_string())?;
        let tenant = self.session_tenant(runtime).map_err(|e| e.to_string())?;
        let fs = self
            .tenancy
            .session_fs(runtime)
            .map_err(|e| e.to_string())?;
        let log = SessionLog::new(fs, &self.agent).map_err(|e| e.to_string())?;
        let mut ids: Vec<String> = match log.list_sessions().await {
            Ok(entries) => entries.into_iter().map(|e| e.id).collect(),
            Err(e) => {
                tracing::debug!(error = %e, "no session index yet");
                Vec::new()
            }
        };
        ids.truncate(MAX_INDEXED_SESSIONS);
        if !ids.contains(&runtime.session_id) {
            ids.push(runtime.session_id.clone());
        }
        let mut docs = BTreeMap::new();
        for id in ids {
            let records = match log.read(&id, ..).await {
                Ok(r) => r,
                Err(e) if e.code() == hame_session::codes::SESSION_NOT_FOUND => continue,
                Err(e) => return Err(e.to_string()),
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
                        clip_middle(&flat, INDEXED_RECORD_CHARS).replace('\n', " ")
                    )
                })
                .collect();
            index
                .upsert_document(&tenant, &id, &lines.join("\n"))
                .await
                .map_err(|e| e.to_string())?;
            docs.insert(id, lines);
        }
        Ok((index, tenant, docs))
    }

    /// Keeps a background task so [`wait_background`](Self::wait_background) can wait for it.
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

/// Keeps the head and tail of `text` within about `max` characters.
pub(crate) fn clip_middle(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_owned();
    }
    let head: String = text.chars().take(max / 2).collect();
    let tail: String = text.chars().skip(n - max / 2).collect();
    format!("{head} … [{} characters omitted] … {tail}", n - max)
}
