//! Workspace reads through the filesystem layer, as the calling tenant sees them.

use std::sync::Arc;

use async_trait::async_trait;
use hame_core::RuntimeContext;
use hame_fs::{Filesystem, FsPath};

/// Most files listed from one directory tree (e.g. `knowledge/`) in the prompt.
pub const MAX_LISTED_FILES: usize = 500;

use crate::context::WorkspaceReader;
use crate::tenancy::Tenancy;

/// Reads workspace files through the tenant's view (its namespace over the template), so
/// in shared-store mode an override written to the store reaches every replica on its next
/// step. `<userId>/<path>` in the template overrides `<path>` for that user.
#[derive(Debug, Clone)]
pub struct FsWorkspaceReader {
    tenancy: Arc<Tenancy>,
}

impl FsWorkspaceReader {
    /// A reader over the tenancy's filesystems.
    pub fn new(tenancy: Arc<Tenancy>) -> Self {
        Self { tenancy }
    }
}

async fn read_string(fs: &dyn Filesystem, path: &str) -> Option<String> {
    let path = FsPath::parse(path).ok()?;
    let bytes = fs.read_bytes(&path).await.ok()?;
    String::from_utf8(bytes).ok()
}

#[async_trait]
impl WorkspaceReader for FsWorkspaceReader {
    async fn read_text(&self, runtime: &RuntimeContext, path: &str) -> Option<String> {
        if let Some(user) = &runtime.user_id
            && let Some(text) =
                read_string(&*self.tenancy.template, &format!("{user}/{path}")).await
        {
            return Some(text);
        }
        let fs = self.tenancy.fs_for(runtime).ok()?;
        read_string(&*fs, path).await
    }

    async fn list_files(&self, runtime: &RuntimeContext, dir: &str) -> Vec<String> {
        let Ok(fs) = self.tenancy.fs_for(runtime) else {
            return Vec::new();
        };
        let Ok(base) = FsPath::parse(dir) else {
            return Vec::new();
        };
        // A breadth-first walk with `list` (cheaper per step than compiling a glob).
        let mut files = Vec::new();
        let mut dirs = vec![base];
        while let Some(d) = dirs.pop() {
            let Ok(entries) = fs.list(&d).await else {
                continue;
            };
            for e in entries {
                if e.is_dir() {
                    dirs.push(e.path);
                } else if files.len() < MAX_LISTED_FILES {
                    files.push(e.path.as_str().to_owned());
                }
            }
            if files.len() >= MAX_LISTED_FILES {
                break;
            }
        }
        files.sort();
        files
    }
}
