//! The workspace-context layer: rebuilds the system prompt before every model request.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use hame_core::{AgentEvent, CallCtx, EventSink, Layer, ModelNext, ModelRequest, ModelResponse};
use hame_fs::FsPath;
use hame_tools::Workspace;

use crate::prompt::{BudgetedText, PromptParts, SessionInfo, keep_newest, render};

/// Default token budget of `MEMORY.md` in the system prompt.
pub const DEFAULT_MEMORY_BUDGET_TOKENS: usize = 8000;
/// Largest part of one workspace file (`AGENTS.md`, `knowledge/KNOWLEDGE.md`, additional
/// context files) put into the system prompt, in bytes; the rest is cut with a note.
pub const MAX_CONTEXT_FILE_BYTES: usize = 64 * 1024;
/// Most files listed from one directory tree (e.g. `knowledge/`) in the prompt.
pub const MAX_LISTED_FILES: usize = 500;

/// Settings of the workspace-context layer.
#[derive(Debug, Clone)]
pub struct ContextOptions {
    /// Agent name shown in the session section.
    pub agent: String,
    /// Token budget for `MEMORY.md`. Default [`DEFAULT_MEMORY_BUDGET_TOKENS`].
    pub memory_budget_tokens: usize,
    /// Extra files injected after the knowledge section, in order.
    pub additional_context_files: Vec<String>,
}

/// Rebuilds the system prompt from the caller's [`Workspace`] before every model request,
/// so edits to `AGENTS.md`, `MEMORY.md` or `knowledge/` take effect on the next step.
///
/// A file that cannot be read (other than "not found") or is not valid UTF-8 is not
/// dropped silently: the prompt gets what could be read (invalid bytes replaced), and a
/// `workspace.read_failed` / `workspace.invalid_utf8` custom event names the file.
#[derive(Debug)]
pub struct WorkspaceContext {
    options: ContextOptions,
    counter: TokenCount,
    /// `MEMORY.md` cut to its budget, by content hash: counting tokens is the costly part of
    /// a step's prompt assembly and the file rarely changes between steps.
    budgeted: std::sync::Mutex<std::collections::HashMap<u64, BudgetedText>>,
    skills: Option<Arc<hame_skills::Skills>>,
}

/// Budgeted `MEMORY.md` versions remembered before the cache is cleared.
const MAX_BUDGET_CACHE: usize = 1024;

/// Estimates the tokens of a text.
#[derive(Clone)]
pub struct TokenCount(pub Arc<dyn Fn(&str) -> usize + Send + Sync>);

impl fmt::Debug for TokenCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenCount")
    }
}

impl TokenCount {
    /// A calibrated estimate with no tokenizer: about 4 characters per token for
    /// alphabetic scripts and one token per CJK character.
    pub fn estimate() -> Self {
        Self(Arc::new(|s: &str| {
            let (mut ascii, mut wide) = (0usize, 0usize);
            for c in s.chars() {
                if (c as u32) < 0x2E80 {
                    ascii += 1;
                } else {
                    wide += 1;
                }
            }
            ascii.div_ceil(4) + wide
        }))
    }
}

impl WorkspaceContext {
    /// A layer; `counter` estimates tokens of a text.
    pub fn new(options: ContextOptions, counter: TokenCount) -> Self {
        Self {
            options,
            counter,
            budgeted: std::sync::Mutex::new(std::collections::HashMap::new()),
            skills: None,
        }
    }

    /// Lists the caller's visible skills (`<available_skills>`, names and descriptions)
    /// in every prompt; skipped skills are reported once on the call's events.
    pub fn with_skills(mut self, skills: Arc<hame_skills::Skills>) -> Self {
        self.skills = Some(skills);
        self
    }

    async fn skills_block(&self, ws: &Workspace, events: &EventSink) -> Option<String> {
        let skills = self.skills.as_ref()?;
        let catalog = skills.catalog(ws, Some(events)).await;
        hame_skills::prompt_block(&catalog.visible())
    }

    fn budget_memory(&self, text: &str) -> BudgetedText {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        let key = h.finish();
        if let Some(hit) = self.budgeted.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return hit;
        }
        let cut = keep_newest(text, self.options.memory_budget_tokens, &*self.counter.0);
        if let Ok(mut cache) = self.budgeted.lock() {
            if cache.len() >= MAX_BUDGET_CACHE {
                cache.clear();
            }
            cache.insert(key, cut.clone());
        }
        cut
    }

    /// Reads the workspace and assembles the prompt parts for this tenant.
    pub async fn parts(&self, base: &str, ws: &Workspace, events: &EventSink) -> PromptParts {
        let r = Reader { ws, events };
        // The reads are independent: run them concurrently.
        let (agents_md, memory, knowledge_md, knowledge_files, skills) = tokio::join!(
            r.read_text("AGENTS.md", true),
            r.read_home("MEMORY.md"),
            r.read_text("knowledge/KNOWLEDGE.md", true),
            r.list_files("knowledge", "knowledge/KNOWLEDGE.md"),
            self.skills_block(ws, events),
        );
        let memory = memory
            .filter(|m| !m.trim().is_empty())
            .map(|m| self.budget_memory(&m));
        let (knowledge_files, knowledge_more) = knowledge_files;
        let mut additional = Vec::new();
        for path in &self.options.additional_context_files {
            if let Some(text) = r.read_text(path, true).await {
                additional.push((path.clone(), text));
            }
        }
        let now = chrono::Local::now();
        let id = ws.identity();
        PromptParts {
            base: base.to_owned(),
            agents_md,
            knowledge_md,
            knowledge_files,
            knowledge_more,
            additional,
            skills,
            memory,
            session: SessionInfo {
                agent: self.options.agent.clone(),
                date: now.format("%Y-%m-%d (%A)").to_string(),
                session_id: id.session.clone(),
                user_id: id.user.clone(),
            },
            sandboxed: ws.mode() == hame_tools::WorkspaceMode::Sandbox,
        }
    }
}

/// Reads workspace files as the caller sees them: `<userId>/<path>` (the override folder)
/// first, then its files.
struct Reader<'a> {
    ws: &'a Workspace,
    events: &'a EventSink,
}

impl Reader<'_> {
    fn warn(&self, kind: &str, path: &str, error: String) {
        tracing::warn!(path, error = %error, "{kind}");
        self.events.emit(AgentEvent::Custom {
            kind: kind.to_owned(),
            data: serde_json::json!({ "path": path, "error": error }),
        });
    }

    async fn read_in(&self, fs: &dyn hame_fs::Filesystem, path: &str, cap: bool) -> Option<String> {
        let p = FsPath::parse(path).ok()?;
        let bytes = match fs.read_bytes(&p).await {
            Ok(b) => b,
            Err(e) if e.is_not_found() => return None,
            Err(e) => {
                self.warn("workspace.read_failed", path, e.to_string());
                return None;
            }
        };
        let cut = cap && bytes.len() > MAX_CONTEXT_FILE_BYTES;
        let slice = if cut {
            &bytes[..MAX_CONTEXT_FILE_BYTES]
        } else {
            &bytes[..]
        };
        let mut text = match std::str::from_utf8(slice) {
            Ok(t) => t.to_owned(),
            // A cut in the middle of a character is not an encoding error.
            Err(e) if cut && e.error_len().is_none() => {
                String::from_utf8_lossy(&slice[..e.valid_up_to()]).into_owned()
            }
            Err(_) => {
                self.warn(
                    "workspace.invalid_utf8",
                    path,
                    "not valid UTF-8; invalid bytes were replaced".into(),
                );
                String::from_utf8_lossy(slice).into_owned()
            }
        };
        if cut {
            text.push_str(&format!(
                "\n[… {path} is {} bytes; only the first {MAX_CONTEXT_FILE_BYTES} are shown. Read the rest with read_file.]",
                bytes.len()
            ));
        }
        Some(text)
    }

    /// A file of the caller's home (its runtime data: `MEMORY.md`).
    async fn read_home(&self, path: &str) -> Option<String> {
        self.read_in(self.ws.home().as_ref(), path, false).await
    }

    async fn read_text(&self, path: &str, cap: bool) -> Option<String> {
        if let Some(o) = self.ws.overrides()
            && let Some(text) = self.read_in(o.as_ref(), path, cap).await
        {
            return Some(text);
        }
        self.read_in(self.ws.files().as_ref(), path, cap).await
    }

    /// The files below `dir` but `skip` (at most [`MAX_LISTED_FILES`], sorted), and whether
    /// there are more.
    async fn list_files(&self, dir: &str, skip: &str) -> (Vec<String>, bool) {
        let Ok(base) = FsPath::parse(dir) else {
            return (Vec::new(), false);
        };
        let fs = self.ws.files();
        // A walk with `list` (cheaper per step than compiling a glob). Once the list is
        // full it goes on only until it meets one more file.
        let mut files = Vec::new();
        let mut more = false;
        let mut dirs = vec![base];
        while let Some(d) = dirs.pop() {
            let Ok(entries) = fs.list(&d).await else {
                continue;
            };
            for e in entries {
                if e.is_dir() {
                    dirs.push(e.path);
                } else if e.path.as_str() != skip {
                    if files.len() < MAX_LISTED_FILES {
                        files.push(e.path.as_str().to_owned());
                    } else {
                        more = true;
                    }
                }
            }
            if more {
                break;
            }
        }
        files.sort();
        (files, more)
    }
}

#[async_trait]
impl Layer for WorkspaceContext {
    fn name(&self) -> &str {
        "workspace-context"
    }

    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        mut request: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse, hame_core::Error> {
        // The step's snapshot (ADR 0028): no store read when nothing changed.
        if let Some(ws) = hame_tools::snapshot::config_view(cx.extensions, cx.iteration) {
            let parts = self.parts(&request.system, &ws, cx.events).await;
            request.system = render(&parts);
        } else {
            tracing::debug!("no workspace handle in this call; system prompt left as is");
        }
        next.run(cx, request).await
    }
}
