//! The `sandbox` layer of sandbox mode (ADR 0009): around each call it acquires the
//! caller's scope sandbox (warm, or started with its snapshot restored), projects the host
//! workspace's static assets into it, runs the call, and snapshots `/workspace` after it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use hame_core::{CallCtx, CallInput, CallNext, CallOutput, Layer};
use hame_fs::{Filesystem, FilesystemExt, FsPath, GlobRequest};
use hame_sandbox::{Asset, PROJECTION_ROOTS};
use hame_tools::Workspace;

use crate::tenancy::Tenancy;

/// Files of one projection root at most (a larger `skills/` is cut, with a warning).
const MAX_PROJECTED_FILES: usize = 10_000;

/// See the module docs. One per agent; per-call data lives in the call.
#[derive(Debug)]
pub(crate) struct SandboxLayer {
    tenancy: Arc<Tenancy>,
    /// Calls of one scope run one after the other in this process (AGENT and GLOBAL scopes
    /// are shared by sessions that the session lease does not serialise).
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl SandboxLayer {
    pub(crate) fn new(tenancy: Arc<Tenancy>) -> Self {
        Self {
            tenancy,
            locks: Mutex::new(HashMap::new()),
        }
    }

    fn lock_for(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = match self.locks.lock() {
            Ok(l) => l,
            Err(poisoned) => poisoned.into_inner(),
        };
        if locks.len() > 65_536 {
            locks.retain(|_, m| Arc::strong_count(m) > 1);
        }
        locks.entry(key.to_owned()).or_default().clone()
    }
}

/// The host's static assets as the caller sees them: the template's projection roots, the
/// caller's `<userId>/` overrides winning.
pub(crate) async fn collect_assets(
    template: &dyn Filesystem,
    overrides: Option<&dyn Filesystem>,
) -> Vec<Asset> {
    let mut by_path = std::collections::BTreeMap::new();
    for fs in std::iter::once(template).chain(overrides) {
        for root in PROJECTION_ROOTS {
            let Ok(root) = FsPath::parse(root) else {
                continue;
            };
            let Ok(info) = fs.stat(&root).await else {
                continue;
            };
            let paths: Vec<FsPath> = if info.is_dir() {
                let request = GlobRequest {
                    path: root.clone(),
                    max_results: MAX_PROJECTED_FILES,
                    ..GlobRequest::new("**")
                };
                match fs.glob(&request).await {
                    Ok(found) => {
                        if found.truncated {
                            tracing::warn!(root = %root, "more than {MAX_PROJECTED_FILES} files to project; the rest is left out");
                        }
                        found
                            .files
                            .into_iter()
                            .filter(|f| !f.is_dir())
                            .map(|f| f.path)
                            .collect()
                    }
                    Err(_) => continue,
                }
            } else {
                vec![root]
            };
            let contents = fs.download(&paths).await;
            for (path, bytes) in paths.into_iter().zip(contents) {
                if let Ok(bytes) = bytes {
                    by_path.insert(path.clone(), Asset { path, bytes });
                }
            }
        }
    }
    by_path.into_values().collect()
}

#[async_trait]
impl Layer for SandboxLayer {
    fn name(&self) -> &str {
        "sandbox"
    }

    async fn call(
        &self,
        cx: &mut CallCtx<'_>,
        input: CallInput,
        next: CallNext<'_>,
    ) -> hame_core::Result<CallOutput> {
        let (Some(ws), Some(sandboxes)) = (
            cx.extensions.get::<Workspace>().cloned(),
            self.tenancy.sandboxes().cloned(),
        ) else {
            return next.run(cx, input).await;
        };
        // A subagent's call shares its parent's handle, so its parent's sandbox: the
        // parent's call projected it and snapshots it (waiting for the parent's scope lock
        // here would deadlock a synchronous child).
        if cx.runtime.extras.contains_key(hame_subagent::TASK_EXTRA) {
            return next.run(cx, input).await;
        }
        let key = self
            .tenancy
            .sandbox_key(ws.identity())
            .map_err(|e| hame_core::Error::layer("sandbox", e))?;
        let lock = self.lock_for(&key);
        let _serial = lock.lock().await;
        let sandbox = sandboxes.scope(&key);
        let assets = collect_assets(
            self.tenancy.template.as_ref(),
            ws.overrides().map(|o| o.as_ref() as &dyn Filesystem),
        )
        .await;
        let began = sandbox
            .begin(assets)
            .await
            .map_err(|e| hame_core::Error::layer("sandbox", e))?;
        tracing::debug!(scope = %key, ?began, "sandbox ready");
        let out = next.run(cx, input).await;
        // Snapshot whatever the call did, also when it failed part-way.
        match sandbox.end().await {
            Ok(report) => tracing::debug!(scope = %key, ?report, "sandbox snapshot"),
            Err(e) => {
                tracing::warn!(scope = %key, error = %e, "snapshotting the sandbox failed");
                if out.is_ok() {
                    return Err(hame_core::Error::layer("sandbox", e));
                }
            }
        }
        out
    }
}
