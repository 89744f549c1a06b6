//! A workspace reader over local disk (temporary until the filesystem layer is wired).

use std::path::PathBuf;

use async_trait::async_trait;
use hame_core::RuntimeContext;

use crate::context::WorkspaceReader;

/// Reads workspace files from a local directory; `<user>/AGENTS.md` overrides `AGENTS.md`.
#[derive(Debug, Clone)]
pub struct LocalWorkspaceReader {
    root: PathBuf,
}

impl LocalWorkspaceReader {
    /// A reader rooted at `root`.
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }
}

#[async_trait]
impl WorkspaceReader for LocalWorkspaceReader {
    async fn read_text(&self, runtime: &RuntimeContext, path: &str) -> Option<String> {
        if let Some(user) = &runtime.user_id {
            if let Ok(t) = tokio::fs::read_to_string(self.root.join(user).join(path)).await {
                return Some(t);
            }
        }
        tokio::fs::read_to_string(self.root.join(path)).await.ok()
    }

    async fn list_files(&self, _runtime: &RuntimeContext, dir: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_owned()];
        while let Some(d) = stack.pop() {
            let Ok(mut rd) = tokio::fs::read_dir(self.root.join(&d)).await else {
                continue;
            };
            while let Ok(Some(e)) = rd.next_entry().await {
                let rel = format!("{d}/{}", e.file_name().to_string_lossy());
                match e.file_type().await {
                    Ok(t) if t.is_dir() => stack.push(rel),
                    Ok(t) if t.is_file() => out.push(rel),
                    _ => {}
                }
            }
        }
        out.sort();
        out
    }
}
