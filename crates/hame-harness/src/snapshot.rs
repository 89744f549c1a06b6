//! The `workspace-snapshot` layer: one immutable snapshot of the caller's workspace
//! configuration per step (issue #34, ADR 0028; the snapshot itself is
//! [`hame_tools::snapshot`]).

use std::sync::Arc;

use async_trait::async_trait;
use hame_core::{CallCtx, Layer, ModelNext, ModelRequest, ModelResponse};
use hame_tools::Workspace;

pub use hame_tools::snapshot::{
    DEFAULT_CACHE_BYTES, FileStamp, MAX_SNAPSHOT_FILE_BYTES, MAX_SNAPSHOT_FOLDER_FILES,
    RACY_WINDOW, SNAPSHOT_FOLDERS, SNAPSHOT_TOP_FILES, SnapshotCache, SnapshotFile, SnapshotRoot,
    StepSnapshot, WorkspaceSnapshot, config_view,
};

/// Takes the caller's [`WorkspaceSnapshot`] before each model request and puts it in the
/// call's [`StepSnapshot`] (an extension of every call): the layers inside it (subagents,
/// workspace context, permissions, tools-config) and the tools of the step read the
/// workspace's `AGENTS.md`, `MEMORY.md`, `knowledge/`, skills, subagent specs and
/// `tools.json` from it. Outermost of the built-ins, so every layer's request of a step
/// sees one snapshot.
#[derive(Debug)]
pub struct SnapshotLayer {
    cache: Arc<SnapshotCache>,
    scope: hame_fs::Scope,
    /// Sandbox mode: the host's template, whose top level (`tools.json`) each sandboxed
    /// caller's snapshot holds as well ([`WorkspaceSnapshot::with_host`]).
    host: Option<Arc<dyn hame_fs::Filesystem>>,
}

impl SnapshotLayer {
    /// A layer whose snapshots share `cache` (one per agent); `scope` is the agent's
    /// isolation scope: callers of one namespace (and user) share what was read.
    pub fn new(cache: Arc<SnapshotCache>, scope: hame_fs::Scope) -> Self {
        Self {
            cache,
            scope,
            host: None,
        }
    }

    /// Sandbox mode: the snapshots of sandboxed callers hold the top level of the host's
    /// `template` too (where `tools.json` is read, ADR 0006).
    pub fn with_sandbox_host(mut self, template: Option<Arc<dyn hame_fs::Filesystem>>) -> Self {
        self.host = template;
        self
    }

    /// The cache key of a caller: its namespace and user id (its override folder).
    fn key(&self, ws: &Workspace) -> String {
        let id = ws.identity();
        let user = id.user.as_deref();
        match hame_fs::Namespace::derive(&id.agent, user, &id.session, self.scope) {
            Ok(ns) => format!("{}\n{}", ns.path().as_str(), user.unwrap_or_default()),
            Err(_) => format!("{}\n{}\n{}", id.agent, user.unwrap_or_default(), id.session),
        }
    }
}

#[async_trait]
impl Layer for SnapshotLayer {
    fn name(&self) -> &str {
        "workspace-snapshot"
    }

    async fn model(
        &self,
        cx: &mut CallCtx<'_>,
        request: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse, hame_core::Error> {
        if let (Some(ws), Some(slot)) = (
            cx.extensions.get::<Workspace>(),
            cx.extensions.get::<Arc<StepSnapshot>>(),
        ) && slot.get(cx.iteration).is_none()
        {
            let key = self.key(ws);
            let mut snap = WorkspaceSnapshot::take_keyed(ws, &self.cache, cx.iteration, &key).await;
            if let (Some(host), hame_tools::WorkspaceMode::Sandbox) = (&self.host, ws.mode()) {
                snap = snap.with_host(host, &self.cache, &key).await;
            }
            tracing::trace!(
                step = cx.iteration,
                probes = snap.probes(),
                reads = snap.reads(),
                "workspace snapshot"
            );
            slot.set(Arc::new(snap));
        }
        next.run(cx, request).await
    }
}
