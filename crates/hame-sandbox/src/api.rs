//! The backend-free contract: [`Sandboxes`] (one per agent) hands out a [`ScopeSandbox`]
//! per isolation-scope key.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hame_fs::{Execute, Filesystem, FsPath};

use crate::error::Result;

/// The folder of the sandbox that holds the workspace (the root of a [`ScopeSandbox`] as a
/// [`Filesystem`], and the working directory of its commands).
pub const SANDBOX_WORKSPACE: &str = "/workspace";

/// The host workspace's static assets projected into every sandbox at the start of a call
/// (files, or folders whose files are all projected). They belong to the host: snapshots
/// leave them out and the next projection restores the host's version.
pub const PROJECTION_ROOTS: [&str; 5] = [
    "AGENTS.md",
    "skills",
    "subagents",
    "knowledge",
    "tools.json",
];

/// Whether `path` is one of the [`PROJECTION_ROOTS`] or lies below one.
pub fn is_projected(path: &FsPath) -> bool {
    PROJECTION_ROOTS
        .iter()
        .any(|root| path.segments().next() == Some(root))
}

/// One host file projected into the sandbox.
#[derive(Clone, PartialEq, Eq)]
pub struct Asset {
    /// Its path in the workspace (one of the [`PROJECTION_ROOTS`] or below one).
    pub path: FsPath,
    /// Its content.
    pub bytes: Vec<u8>,
}

impl fmt::Debug for Asset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Asset")
            .field("path", &self.path)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// What [`ScopeSandbox::begin`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BeginReport {
    /// A new container was started for this call (none was warm).
    pub started: bool,
    /// No container of this process was warm, and an idle one left by another process
    /// (found by its labels, its last snapshot the stored one) was taken over instead of
    /// starting a new one.
    pub adopted: bool,
    /// The warm container was stale (another process stored a newer snapshot of the scope
    /// since this one's last call) and was replaced by a new one with that snapshot.
    pub refreshed: bool,
    /// Files restored from the scope's snapshot (only when `started`).
    pub restored_files: usize,
    /// Projected files uploaded (new or changed on the host).
    pub projected: usize,
    /// Projected files removed (deleted on the host).
    pub unprojected: usize,
    /// Time spent.
    pub elapsed: Duration,
}

/// What [`ScopeSandbox::end`] stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotReport {
    /// Files in the snapshot.
    pub files: usize,
    /// Files whose content was uploaded (new or changed since the last snapshot).
    pub uploaded: usize,
    /// Files removed from the snapshot since the last one.
    pub removed: usize,
    /// Bytes uploaded.
    pub bytes_uploaded: u64,
    /// A new snapshot was stored (something changed since the last one).
    pub stored: bool,
    /// Older snapshots of the scope dropped from its history (it keeps the last few; their
    /// blobs that no kept snapshot references are collected by the next sweep of the store).
    pub pruned: usize,
    /// Time spent.
    pub elapsed: Duration,
}

/// The sandbox of one isolation scope: a [`Filesystem`] rooted at [`SANDBOX_WORKSPACE`]
/// inside the container and an [`Execute`] that runs commands there. The container starts
/// lazily, on the first operation or [`begin`](Self::begin); when it starts, the scope's
/// last snapshot is restored into it.
#[async_trait]
pub trait ScopeSandbox: Filesystem + Execute {
    /// The key of the scope (the isolation namespace of the caller).
    fn key(&self) -> &str;

    /// Called at the start of a call: makes sure the container runs (restoring the
    /// snapshot into a new one) and projects `assets`: files whose SHA-256 differs from the
    /// sandbox's copy are uploaded, projected files that are not in `assets` any more are
    /// deleted.
    async fn begin(&self, assets: Vec<Asset>) -> Result<BeginReport>;

    /// Called at the end of a call: snapshots `/workspace` (only what changed since the
    /// last snapshot is uploaded) and marks the container idle (its TTL starts).
    async fn end(&self) -> Result<SnapshotReport>;

    /// Ends a call without a snapshot (instead of [`end`](Self::end)), when the caller may
    /// no longer store one (its lease on the scope was lost): the container is removed, so
    /// its changes since the last snapshot are dropped and the next [`begin`](Self::begin)
    /// restores the stored snapshot.
    async fn discard(&self);
}

/// The sandboxes of one agent: one [`ScopeSandbox`] per scope key, never shared between
/// keys. Containers are kept warm between calls for an idle TTL and all removed by
/// [`shutdown`](Self::shutdown).
#[async_trait]
pub trait Sandboxes: Send + Sync + fmt::Debug + 'static {
    /// The sandbox of a scope (cheap: nothing starts before it is used).
    fn scope(&self, key: &str) -> Arc<dyn ScopeSandbox>;

    /// A one-line description for the system prompt and logs (image, network).
    fn describe(&self) -> String;

    /// Removes every container started by this value. Idempotent.
    async fn shutdown(&self);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn projected_paths() {
        let yes = [
            "AGENTS.md",
            "skills/a/SKILL.md",
            "knowledge",
            "tools.json",
            "subagents/x.md",
        ];
        for p in yes {
            assert!(is_projected(&FsPath::parse(p).unwrap()), "{p}");
        }
        for p in ["notes.md", "skillsx/a", "src/AGENTS.md", ""] {
            assert!(!is_projected(&FsPath::parse(p).unwrap()), "{p}");
        }
    }
}
