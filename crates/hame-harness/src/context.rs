//! The workspace-context middleware: rebuilds the system prompt before every model request.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use hame_core::{CallCtx, Middleware, ModelRequest};

use crate::prompt::{BudgetedText, PromptParts, SessionInfo, keep_newest, render};

/// Default token budget of `MEMORY.md` in the system prompt.
pub const DEFAULT_MEMORY_BUDGET_TOKENS: usize = 8000;

/// Read access to workspace files as the current tenant sees them.
#[async_trait]
pub trait WorkspaceReader: Send + Sync + fmt::Debug + 'static {
    /// The text of a workspace file for this tenant; `None` when it does not exist.
    async fn read_text(&self, runtime: &hame_core::RuntimeContext, path: &str) -> Option<String>;
    /// Workspace-relative paths of all files under `dir`, recursively, sorted.
    async fn list_files(&self, runtime: &hame_core::RuntimeContext, dir: &str) -> Vec<String>;
}

/// Settings of the workspace-context middleware.
#[derive(Debug, Clone)]
pub struct ContextOptions {
    /// Agent name shown in the session section.
    pub agent: String,
    /// Token budget for `MEMORY.md`. Default [`DEFAULT_MEMORY_BUDGET_TOKENS`].
    pub memory_budget_tokens: usize,
    /// Extra files injected after the knowledge section, in order.
    pub additional_context_files: Vec<String>,
}

/// Rebuilds the system prompt from the workspace before every model request, so edits to
/// `AGENTS.md`, `MEMORY.md` or `knowledge/` take effect on the next step.
#[derive(Debug)]
pub struct WorkspaceContext {
    reader: Arc<dyn WorkspaceReader>,
    options: ContextOptions,
    counter: TokenCount,
    /// `MEMORY.md` cut to its budget, by content hash: counting tokens is the costly part of
    /// a step's prompt assembly and the file rarely changes between steps.
    budgeted: std::sync::Mutex<std::collections::HashMap<u64, BudgetedText>>,
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
    /// A middleware reading through `reader`; `counter` estimates tokens of a text.
    pub fn new(
        reader: Arc<dyn WorkspaceReader>,
        options: ContextOptions,
        counter: TokenCount,
    ) -> Self {
        Self {
            reader,
            options,
            counter,
            budgeted: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
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
    pub async fn parts(&self, base: &str, runtime: &hame_core::RuntimeContext) -> PromptParts {
        let r = &self.reader;
        // The reads are independent: run them concurrently.
        let (agents_md, memory, knowledge_md, knowledge_files) = tokio::join!(
            r.read_text(runtime, "AGENTS.md"),
            r.read_text(runtime, "MEMORY.md"),
            r.read_text(runtime, "knowledge/KNOWLEDGE.md"),
            r.list_files(runtime, "knowledge"),
        );
        let memory = memory
            .filter(|m| !m.trim().is_empty())
            .map(|m| self.budget_memory(&m));
        let knowledge_files = knowledge_files
            .into_iter()
            .filter(|p| p != "knowledge/KNOWLEDGE.md")
            .collect();
        let mut additional = Vec::new();
        for path in &self.options.additional_context_files {
            if let Some(text) = r.read_text(runtime, path).await {
                additional.push((path.clone(), text));
            }
        }
        let now = chrono::Local::now();
        PromptParts {
            base: base.to_owned(),
            agents_md,
            knowledge_md,
            knowledge_files,
            additional,
            memory,
            session: SessionInfo {
                agent: self.options.agent.clone(),
                date: now.format("%Y-%m-%d (%A)").to_string(),
                session_id: runtime.session_id.clone(),
                user_id: runtime.user_id.clone(),
            },
        }
    }
}

#[async_trait]
impl Middleware for WorkspaceContext {
    fn name(&self) -> &str {
        "workspace-context"
    }

    async fn on_model_request(
        &self,
        cx: &mut CallCtx<'_>,
        request: &mut ModelRequest,
    ) -> Result<(), hame_core::Error> {
        let parts = self.parts(&request.system, cx.runtime).await;
        request.system = render(&parts);
        Ok(())
    }
}
