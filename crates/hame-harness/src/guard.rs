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
//! * **user folders** (when set): a top-level folder whose name is a registered user id
//!   ([`UserRegistry`]: ids hame served a call for, ids the application declares, and the
//!   folders an earlier hame protected) is that user's; every user folder but the caller's
//!   own is hidden. The registry is read once per view (a view is made per call), at its
//!   first file operation: no probe per operation.
//!
//! Over a backend with symbolic links ([`GuardFs::with_links`]: the local workspace) every
//! path is checked as named *and* as resolved, so a link cannot lead into what is hidden or
//! protected: operations through it say `not_found` (or `permission_denied` for a write
//! into a runtime root), listings leave it out, and walks never follow links.
//!
//! It implements every `Filesystem` method through `hame_fs::forward_filesystem!`.

use std::collections::BTreeSet;
use std::sync::Arc;

use hame_fs::{
    AppendOptions, DeleteOptions, EditOutcome, EditRequest, Error, FileInfo, Filesystem, FsPath,
    GlobOutput, GlobRequest, GrepOutput, GrepRequest, Links, ListRequest, Listing, RenameOptions,
    Result, Version, WriteOptions, generic,
};

use crate::users::UserRegistry;

/// The names the migration from marker files looked for (an earlier hame took a top-level
/// folder holding one of them for a user's folder; now only the registry decides,
/// [`UserRegistry`]).
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

/// Whether a top-level name is one of the workspace's own (never a user's folder, even if a
/// user id is spelled so).
pub fn is_workspace_name(name: &str) -> bool {
    USER_FOLDER_MARKERS.contains(&name)
        || crate::template::RUNTIME_ROOTS.contains(&name)
        || name == hame_memory::offload::DEFAULT_OFFLOAD_DIR
}

/// What a [`GuardFs`] hides and protects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuardRules {
    /// Paths that do not exist for the caller.
    pub hidden: Vec<FsPath>,
    /// The caller's runtime roots: skipped by walks, never written by the file tools.
    pub runtime: Vec<FsPath>,
    /// Files the caller reads but its file tools never change: the operator's configuration
    /// (an isolated tenant's `tools.json`, which could lift a deny or start a host command:
    /// ADR 0006). Listed and walked like any file.
    pub read_only: Vec<FsPath>,
    /// Hide the folders of registered users ([`GuardFs::with_users`]) except this caller's
    /// own (`Some(None)`: hide every user folder; `None`: no user-folder rule).
    pub user_folders: Option<Option<String>>,
}

/// The registered users as one view read them (once).
#[derive(Debug)]
struct UserView {
    registry: Arc<UserRegistry>,
    loaded: tokio::sync::OnceCell<BTreeSet<String>>,
}

/// A view of `inner` under [`GuardRules`].
#[derive(Debug, Clone)]
pub struct GuardFs {
    inner: Arc<dyn Filesystem>,
    rules: Arc<GuardRules>,
    users: Option<Arc<UserView>>,
    links: Option<Arc<dyn Links>>,
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
            users: None,
            links: None,
        }
    }

    /// The registry that says which top-level folders are users' (read once, at the first
    /// operation that needs it).
    pub fn with_users(mut self, registry: Arc<UserRegistry>) -> Self {
        self.users = Some(Arc::new(UserView {
            registry,
            loaded: tokio::sync::OnceCell::new(),
        }));
        self
    }

    /// Says where `inner`'s paths lead (the same path space as `inner`): every path is then
    /// checked as resolved too, and walks skip links.
    pub fn with_links(mut self, links: Arc<dyn Links>) -> Self {
        self.links = Some(links);
        self
    }

    fn not_found(path: &FsPath) -> Error {
        Error::NotFound {
            path: path.as_str().to_owned(),
        }
    }

    /// The registered users (empty without a user-folder rule).
    async fn users(&self) -> Result<Option<&BTreeSet<String>>> {
        match (&self.rules.user_folders, &self.users) {
            (Some(_), Some(view)) => view
                .loaded
                .get_or_try_init(|| view.registry.users())
                .await
                .map(Some),
            _ => Ok(None),
        }
    }

    /// Whether `path`, as named, does not exist for the caller.
    fn hidden_as_named(&self, path: &FsPath, users: Option<&BTreeSet<String>>) -> bool {
        if self.rules.hidden.iter().any(|h| under(path, h)) {
            return true;
        }
        let (Some(own), Some(users), Some(first)) =
            (&self.rules.user_folders, users, path.segments().next())
        else {
            return false;
        };
        own.as_deref() != Some(first) && users.contains(first) && !is_workspace_name(first)
    }

    /// Where `path` leads, when it leads elsewhere than it is named.
    fn resolved(&self, path: &FsPath) -> Option<FsPath> {
        let links = self.links.as_ref()?;
        links.resolve(path).ok().filter(|r| r != path)
    }

    /// Whether `path` does not exist for the caller: as named, or where its links lead.
    async fn is_hidden(&self, path: &FsPath) -> Result<bool> {
        let users = self.users().await?;
        if self.hidden_as_named(path, users) {
            return Ok(true);
        }
        Ok(self
            .resolved(path)
            .is_some_and(|r| self.hidden_as_named(&r, users)))
    }

    async fn check(&self, path: &FsPath) -> Result<()> {
        if self.is_hidden(path).await? {
            return Err(Self::not_found(path));
        }
        Ok(())
    }

    fn check_runtime(&self, path: &FsPath, named: &FsPath) -> Result<()> {
        if let Some(root) = self.rules.runtime.iter().find(|r| under(path, r)) {
            return Err(Error::PermissionDenied {
                path: named.as_str().to_owned(),
                reason: format!(
                    "{} holds hame's runtime data (session logs are append-only); the file tools \
                     never change it: read the history with session_history",
                    root.as_str()
                ),
            });
        }
        if let Some(file) = self.rules.read_only.iter().find(|r| under(path, r)) {
            return Err(Error::PermissionDenied {
                path: named.as_str().to_owned(),
                reason: format!(
                    "{} is the operator's configuration; the file tools read it but never \
                     change it",
                    file.as_str()
                ),
            });
        }
        // Moving or deleting a folder that holds a runtime root would move that data too.
        if !path.is_root()
            && (self.rules.runtime.iter())
                .chain(&self.rules.read_only)
                .any(|r| under(r, path))
        {
            return Err(Error::PermissionDenied {
                path: named.as_str().to_owned(),
                reason: "the folder holds hame's runtime data (session logs); the file tools \
                         never change it"
                    .into(),
            });
        }
        Ok(())
    }

    async fn check_write(&self, path: &FsPath) -> Result<()> {
        self.check(path).await?;
        self.check_runtime(path, path)?;
        if let Some(r) = self.resolved(path) {
            self.check_runtime(&r, path)?;
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

    /// The entries of a listing of `dir` this view shows (as named, and where they lead).
    /// `some`: the listing is of a few named entries (their links are looked up one by one,
    /// not by reading the directory).
    fn shown(
        &self,
        dir: &FsPath,
        entries: Vec<FileInfo>,
        users: Option<&BTreeSet<String>>,
        some: bool,
    ) -> Vec<FileInfo> {
        // Where the folder itself leads, and which entries are links.
        let real_dir = self.resolved(dir);
        let links = match &self.links {
            Some(l) if some => {
                let names: Vec<&str> = entries.iter().map(|e| e.path.file_name()).collect();
                l.links_among(dir, &names).unwrap_or_default()
            }
            Some(l) => l.links_in(dir).unwrap_or_default(),
            None => Vec::new(),
        };
        let mut shown = Vec::with_capacity(entries.len());
        for e in entries {
            if !self.shows(dir, &e.path, users) {
                continue;
            }
            let name = e.path.file_name();
            let real = if links.iter().any(|n| n == name) {
                self.resolved(&e.path)
            } else {
                real_dir.as_ref().and_then(|d| d.join(name).ok())
            };
            if real.is_some_and(|r| !self.shows(real_dir.as_ref().unwrap_or(dir), &r, users)) {
                continue;
            }
            shown.push(e);
        }
        shown
    }

    /// Whether a listing of `dir` shows `entry` (as named; links are checked by `list`).
    fn shows(&self, dir: &FsPath, entry: &FsPath, users: Option<&BTreeSet<String>>) -> bool {
        let in_runtime = self.rules.runtime.iter().any(|r| under(dir, r));
        if !in_runtime && self.rules.runtime.iter().any(|r| under(entry, r)) {
            return false;
        }
        !self.hidden_as_named(entry, users)
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
            let users = self.users().await?;
            Ok(self.shown(path, entries, users, false))
        }

        async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
            self.check(path).await?;
            self.inner.read_bytes(path).await
        }

        async fn exists(&self, path: &FsPath) -> Result<bool> {
            if self.is_hidden(path).await? {
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
            match self.walk_through_view(&request.path) {
                Walk::Native => self.inner.grep(request).await,
                Walk::Listed(None) => generic::grep_via_walk(self, request).await,
                Walk::Listed(Some(links)) => {
                    generic::grep_via_walk_without_links(self, request, links.as_ref()).await
                }
            }
        }

        async fn glob(&self, request: &GlobRequest) -> Result<GlobOutput> {
            self.check(&request.path).await?;
            match self.walk_through_view(&request.path) {
                Walk::Native => self.inner.glob(request).await,
                Walk::Listed(None) => generic::glob_via_walk(self, request).await,
                Walk::Listed(Some(links)) => {
                    generic::glob_via_walk_without_links(self, request, links.as_ref()).await
                }
            }
        }

        /// One batch of the backend for the listings it answers as this view does (child
        /// listings, filtered as `list` filters them; recursive ones whose walk is the
        /// backend's own, as for `glob`); the others walk this view.
        async fn list_many(&self, requests: &[ListRequest]) -> Result<Vec<Result<Listing>>> {
            let users = self.users().await?;
            let mut parts = generic::ListParts::new(requests.len());
            // Recursive listings sent to the backend's own walk before their links are
            // looked up (below, once the backend has found the folder).
            let mut sent_walks = vec![false; requests.len()];
            for (i, r) in requests.iter().enumerate() {
                if r.recursive && !self.walk_filtered(&r.path) {
                    if self.hidden_as_named(&r.path, users) {
                        parts.answer(i, Err(Self::not_found(&r.path)));
                    } else {
                        sent_walks[i] = true;
                        parts.send(i, r.clone());
                    }
                } else if let Err(e) = self.check(&r.path).await {
                    parts.answer(i, Err(e));
                } else if !r.recursive {
                    // Capped after the hidden entries are left out.
                    parts.send(i, r.uncapped());
                } else {
                    parts.answer(i, generic::list_one(self, r).await);
                }
            }
            let mut out = parts
                .finish(self.inner.as_ref(), |i, answer| {
                    let r = &requests[i];
                    match answer {
                        Ok(l) if !r.recursive => {
                            let some = r.names.is_some();
                            Ok(r.answer(self.shown(&r.path, l.entries, users, some)))
                        }
                        other => other,
                    }
                })
                .await?;
            // A folder that is not there leads nowhere: no look-up of its links (a probe's
            // missing `skills/` costs nothing more). One reached through a link leads where
            // the names below it do not say: listed again through this view's `glob`.
            for (i, r) in requests.iter().enumerate() {
                let Some(answer) = out.get_mut(i) else { break };
                if !sent_walks[i] || answer.as_ref().is_err_and(|e| e.is_not_found()) {
                    continue;
                }
                if self.resolved(&r.path).is_some() {
                    // This view's `glob`: its check (where the link leads) and its walk.
                    *answer = generic::list_one(self, r).await;
                }
            }
            Ok(out)
        }
    }
}

/// How a walk of a [`GuardFs`] runs.
enum Walk<'a> {
    /// The backend's own search: nothing below the base is hidden, and it follows no link.
    Native,
    /// Over the view's filtered listing (skipping links when the backend has them).
    Listed(Option<&'a Arc<dyn Links>>),
}

impl GuardFs {
    fn walk_through_view(&self, base: &FsPath) -> Walk<'_> {
        // A base reached through a link leads where the names below it do not say.
        if self.walk_filtered(base) || self.resolved(base).is_some() {
            Walk::Listed(self.links.as_ref())
        } else {
            Walk::Native
        }
    }
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
