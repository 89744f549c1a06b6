//! [`GuardFs`]: the rules every caller's file tools go through, applied by
//! `Tenancy::workspace` to [`Workspace::files`](hame_tools::Workspace::files).
//!
//! Three kinds of paths:
//!
//! * **hidden**: do not exist for this caller (another tenant's runtime data, a state
//!   home inside the workspace). Reads say `not_found`, listings and searches leave them out.
//! * **runtime roots**: the caller's own runtime data (session logs and their index, task
//!   records, the memory index, offloaded results). Readable when named; walks (`grep`,
//!   `glob`, `list` of a parent) skip them unless the walk starts inside one; writes, edits,
//!   moves and deletes are refused with `permission_denied` (only hame writes them, and the
//!   session logs are append-only).
//! * **user folders** (when set): a top-level folder that holds one of the workspace's own
//!   names ([`USER_FOLDER_MARKERS`]: `AGENTS.md`, `MEMORY.md`, `agents/`, `memory/`,
//!   `skills/`, ...) is some user's override folder; every user folder but the caller's own
//!   is hidden.
//!
//! It implements every `Filesystem` method through `hame_fs::forward_filesystem!`.

use std::sync::Arc;

use hame_fs::{
    AppendOptions, DeleteOptions, EditOutcome, EditRequest, Error, FileInfo, Filesystem, FsPath,
    GlobOutput, GlobRequest, GrepOutput, GrepRequest, RenameOptions, Result, Version, WriteOptions,
    generic,
};

/// Names whose presence at the top of a folder makes it a per-user override folder.
pub const USER_FOLDER_MARKERS: &[&str] = &[
    "AGENTS.md",
    "MEMORY.md",
    "agents",
    "memory",
    "skills",
    "subagents",
    "knowledge",
    "tools.json",
];

/// What a [`GuardFs`] hides and protects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuardRules {
    /// Paths that do not exist for the caller.
    pub hidden: Vec<FsPath>,
    /// The caller's runtime roots: skipped by walks, never written by the file tools.
    pub runtime: Vec<FsPath>,
    /// Hide top-level user folders ([`USER_FOLDER_MARKERS`]) except this caller's own
    /// (`Some(None)`: hide every user folder; `None`: no user-folder rule).
    pub user_folders: Option<Option<String>>,
}

/// A view of `inner` under [`GuardRules`].
#[derive(Debug, Clone)]
pub struct GuardFs {
    inner: Arc<dyn Filesystem>,
    rules: Arc<GuardRules>,
}

fn under(path: &FsPath, root: &FsPath) -> bool {
    path.starts_with(root)
}

impl GuardFs {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Filesystem>, rules: GuardRules) -> Self {
        Self {
            inner,
            rules: Arc::new(rules),
        }
    }

    fn not_found(path: &FsPath) -> Error {
        Error::NotFound {
            path: path.as_str().to_owned(),
        }
    }

    /// Whether the top-level folder `name` is another user's override folder.
    async fn foreign_user_folder(&self, name: &str) -> bool {
        let Some(own) = &self.rules.user_folders else {
            return false;
        };
        // A folder named like one of the workspace's own names is never a user folder.
        if own.as_deref() == Some(name)
            || USER_FOLDER_MARKERS.contains(&name)
            || crate::template::RUNTIME_ROOTS.contains(&name)
            || name == hame_memory::offload::DEFAULT_OFFLOAD_DIR
        {
            return false;
        }
        let Ok(dir) = FsPath::parse(name) else {
            return false;
        };
        if !matches!(self.inner.stat(&dir).await, Ok(info) if info.is_dir()) {
            return false;
        }
        for marker in USER_FOLDER_MARKERS {
            if let Ok(p) = dir.join(marker)
                && matches!(self.inner.exists(&p).await, Ok(true))
            {
                return true;
            }
        }
        false
    }

    /// Whether `path` does not exist for the caller.
    async fn is_hidden(&self, path: &FsPath) -> bool {
        if self.rules.hidden.iter().any(|h| under(path, h)) {
            return true;
        }
        match path.segments().next() {
            Some(first) => self.foreign_user_folder(first).await,
            None => false,
        }
    }

    async fn check(&self, path: &FsPath) -> Result<()> {
        if self.is_hidden(path).await {
            return Err(Self::not_found(path));
        }
        Ok(())
    }

    async fn check_write(&self, path: &FsPath) -> Result<()> {
        self.check(path).await?;
        if let Some(root) = self.rules.runtime.iter().find(|r| under(path, r)) {
            return Err(Error::PermissionDenied {
                path: path.as_str().to_owned(),
                reason: format!(
                    "{} holds hame's runtime data (session logs are append-only); the file tools \
                     never change it: read the history with session_history",
                    root.as_str()
                ),
            });
        }
        // Moving or deleting a folder that holds a runtime root would move that data too.
        if !path.is_root() && self.rules.runtime.iter().any(|r| under(r, path)) {
            return Err(Error::PermissionDenied {
                path: path.as_str().to_owned(),
                reason: "the folder holds hame's runtime data (session logs); the file tools \
                         never change it"
                    .into(),
            });
        }
        Ok(())
    }

    /// Whether a walk starting at `base` must go through the filtered listing (something
    /// under `base` is hidden or a runtime root), rather than the backend's own search.
    fn walk_filtered(&self, base: &FsPath) -> bool {
        if self.rules.runtime.iter().any(|r| under(base, r)) {
            // A walk that starts inside a runtime root names it.
            return self.rules.hidden.iter().any(|h| under(h, base));
        }
        (base.is_root() && self.rules.user_folders.is_some())
            || self
                .rules
                .hidden
                .iter()
                .chain(self.rules.runtime.iter())
                .any(|h| under(h, base))
    }

    /// Whether a listing of `dir` shows `entry`.
    async fn shows(&self, dir: &FsPath, entry: &FsPath) -> bool {
        let in_runtime = self.rules.runtime.iter().any(|r| under(dir, r));
        if !in_runtime && self.rules.runtime.iter().any(|r| under(entry, r)) {
            return false;
        }
        !self.is_hidden(entry).await
    }
}

hame_fs::forward_filesystem! {
    impl Filesystem for GuardFs {
        async fn stat(&self, path: &FsPath) -> Result<FileInfo> {
            self.check(path).await?;
            self.inner.stat(path).await
        }

        async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
            self.check(path).await?;
            let entries = self.inner.list(path).await?;
            let mut shown = Vec::with_capacity(entries.len());
            for e in entries {
                if self.shows(path, &e.path).await {
                    shown.push(e);
                }
            }
            Ok(shown)
        }

        async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
            self.check(path).await?;
            self.inner.read_bytes(path).await
        }

        async fn exists(&self, path: &FsPath) -> Result<bool> {
            if self.is_hidden(path).await {
                return Ok(false);
            }
            self.inner.exists(path).await
        }

        async fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
            self.check(path).await?;
            self.inner.read_range(path, offset, len).await
        }

        async fn write(&self, path: &FsPath, data: Vec<u8>, options: WriteOptions) -> Result<Version> {
            self.check_write(path).await?;
            self.inner.write(path, data, options).await
        }

        async fn delete(&self, path: &FsPath, options: DeleteOptions) -> Result<()> {
            self.check_write(path).await?;
            self.inner.delete(path, options).await
        }

        async fn rename(&self, from: &FsPath, to: &FsPath, options: RenameOptions) -> Result<()> {
            self.check_write(from).await?;
            self.check_write(to).await?;
            self.inner.rename(from, to, options).await
        }

        async fn append(&self, path: &FsPath, data: Vec<u8>, options: AppendOptions) -> Result<()> {
            self.check_write(path).await?;
            self.inner.append(path, data, options).await
        }

        async fn edit(&self, path: &FsPath, request: &EditRequest) -> Result<EditOutcome> {
            self.check_write(path).await?;
            self.inner.edit(path, request).await
        }

        async fn grep(&self, request: &GrepRequest) -> Result<GrepOutput> {
            self.check(&request.path).await?;
            if self.walk_filtered(&request.path) {
                return generic::grep_via_walk(self, request).await;
            }
            self.inner.grep(request).await
        }

        async fn glob(&self, request: &GlobRequest) -> Result<GlobOutput> {
            self.check(&request.path).await?;
            if self.walk_filtered(&request.path) {
                return generic::glob_via_walk(self, request).await;
            }
            self.inner.glob(request).await
        }
    }
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
