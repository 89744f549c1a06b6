//! The `sandbox` layer of sandbox mode (ADR 0009): around each call it acquires the
//! caller's scope sandbox (warm, or started with its snapshot restored), projects the host
//! workspace's static assets into it, runs the call, and snapshots `/workspace` after it.
//!
//! Calls of one scope never overlap: in this process a lock per scope key orders them, and
//! across processes and replicas (USER, AGENT and GLOBAL scopes are shared by sessions the
//! session lease does not serialise) a **sandbox lease** does: a [`StateStore`] lease on
//! the reserved session [`SANDBOX_LEASE_SESSION`]`-<32 hex of SHA-256(scope key)>` of the
//! reserved agent [`SANDBOX_LEASE_SESSION`] (one key for GLOBAL scope whatever the agent).
//! SESSION scope needs none: the session lease already orders its calls.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use hame_core::{CallCtx, CallInput, CallNext, CallOutput, Layer};
use hame_fs::{Filesystem, FilesystemExt, FsPath, GlobRequest, Scope};
use hame_sandbox::{Asset, PROJECTION_ROOTS};
use hame_state::{LeaseOptions, StateKey, StateStore};
use hame_tools::Workspace;

use crate::tenancy::Tenancy;

/// Files of one projection root at most (a larger `skills/` is cut, with a warning).
const MAX_PROJECTED_FILES: usize = 10_000;

/// The reserved id (agent and session prefix) of sandbox leases; ids starting with it are
/// refused from callers (`hame_id::RESERVED_PREFIXES`).
pub const SANDBOX_LEASE_SESSION: &str = "_sandbox";

/// The runtime extra naming the sandbox of a subagent with `sandbox: own` (its scope key,
/// the child session's namespace), set by the subagent runner.
pub const SANDBOX_KEY_EXTRA: &str = "hame.sandbox_key";

/// How long a call waits for the sandbox of its scope while a call of another process
/// holds it, before it fails: a whole call of the other process (model turns and tools)
/// runs under the lease, so this is much longer than the session lease's wait.
pub const DEFAULT_SANDBOX_LEASE_WAIT: Duration = Duration::from_secs(300);

/// The default options of the sandbox lease: the session lease's TTL (10 s, renewed every
/// third of it during the call), [`DEFAULT_SANDBOX_LEASE_WAIT`].
pub fn default_sandbox_lease() -> LeaseOptions {
    LeaseOptions::new(hame_state::DEFAULT_LEASE_TTL, DEFAULT_SANDBOX_LEASE_WAIT)
}

/// The lease key that orders the calls of one sandbox scope across processes.
pub fn sandbox_lease_key(scope_key: &str) -> hame_state::Result<StateKey> {
    let hash = hame_memory::content_hash(scope_key);
    StateKey::new(
        SANDBOX_LEASE_SESSION,
        None::<String>,
        format!("{SANDBOX_LEASE_SESSION}-{}", &hash[..32]),
    )
}

/// See the module docs. One per agent; per-call data lives in the call.
#[derive(Debug)]
pub(crate) struct SandboxLayer {
    tenancy: Arc<Tenancy>,
    store: Arc<dyn StateStore>,
    lease: LeaseOptions,
    /// Calls of one scope run one after the other in this process.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl SandboxLayer {
    pub(crate) fn new(
        tenancy: Arc<Tenancy>,
        store: Arc<dyn StateStore>,
        lease: LeaseOptions,
    ) -> Self {
        Self {
            tenancy,
            store,
            lease,
            locks: Mutex::new(HashMap::new()),
        }
    }

    /// Takes the scope's sandbox lease (not for SESSION scope, which the session lease
    /// orders). Waits up to the lease options' `wait`, polling with backoff.
    async fn lease(&self, key: &str) -> hame_core::Result<Option<hame_state::Lease>> {
        if self.tenancy.isolation.scope == Scope::Session {
            return Ok(None);
        }
        let lease_key =
            sandbox_lease_key(key).map_err(|e| hame_core::Error::layer("sandbox", e))?;
        match self.store.acquire(&lease_key, self.lease).await {
            Ok(lease) => Ok(Some(lease)),
            Err(hame_state::Error::SessionBusy { waited, .. }) => Err(hame_core::Error::layer(
                "sandbox",
                format!(
                    "the sandbox of scope {key} is in use by a call of another process \
                     (waited {:.0} s for its lease {lease_key}); try again later",
                    waited.as_secs_f64()
                ),
            )),
            Err(e) => Err(hame_core::Error::layer(
                "sandbox",
                format!("taking the sandbox lease of scope {key} failed: {e}"),
            )),
        }
    }

    /// Holds the sandbox of scope `key` for one call or one request of the caller's own
    /// (the gateway's file routes): this process's lock of the scope (waiting up to the
    /// lease options' `wait`), then the lease that orders the scope across processes —
    /// `held` when the caller already holds the one that orders it (the session lease in
    /// SESSION scope, taken *before* the lock, as a call takes it), none with `unleased`
    /// (a subagent's own sandbox), else the sandbox lease of a shared scope — and begins
    /// the sandbox with the caller's projected assets. [`ScopeHold::exit`] snapshots it.
    pub(crate) async fn enter(
        &self,
        key: &str,
        unleased: bool,
        held: Option<hame_state::Lease>,
        ws: &Workspace,
    ) -> hame_core::Result<ScopeHold> {
        let lock = self.lock_for(key);
        let serial = match tokio::time::timeout(self.lease.wait, lock.lock_owned()).await {
            Ok(guard) => guard,
            Err(_) => {
                return Err(hame_core::Error::layer(
                    "sandbox",
                    format!(
                        "the sandbox of scope {key} is in use by another call of this process \
                         (waited {:.0} s); try again later",
                        self.lease.wait.as_secs_f64()
                    ),
                ));
            }
        };
        // Across processes: held (and renewed) until the snapshot is stored; a dropped call
        // (Ctrl-C) releases it when the lease drops, a killed process's lease lapses after
        // its TTL (the JSON store's OS lock goes with the process at once).
        let lease = match (held, unleased) {
            (Some(held), _) => Some(held),
            (None, true) => None,
            (None, false) => self.lease(key).await?,
        };
        let alive = lease.as_ref().map(|l| l.keep_alive());
        let sandboxes = self.tenancy.sandboxes().ok_or_else(|| {
            hame_core::Error::layer("sandbox", "the agent has no sandboxes".to_owned())
        })?;
        let sandbox = sandboxes.scope(key);
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
        Ok(ScopeHold(Some(Held {
            key: key.to_owned(),
            sandbox,
            lease,
            alive,
            _serial: serial,
        })))
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

/// One scope's sandbox held by one call or request ([`SandboxLayer::enter`]). Dropped
/// without [`exit`](Self::exit) (a cancelled call, a download cut short), it exits in a
/// task of its own, still holding the scope until the snapshot is stored.
#[derive(Debug)]
pub(crate) struct ScopeHold(Option<Held>);

#[derive(Debug)]
struct Held {
    key: String,
    sandbox: Arc<dyn hame_sandbox::ScopeSandbox>,
    lease: Option<hame_state::Lease>,
    alive: Option<hame_state::KeepAlive>,
    _serial: tokio::sync::OwnedMutexGuard<()>,
}

impl ScopeHold {
    /// The files of the held sandbox.
    pub(crate) fn files(&self) -> Option<Arc<dyn Filesystem>> {
        self.0
            .as_ref()
            .map(|h| h.sandbox.clone() as Arc<dyn Filesystem>)
    }

    /// See [`Held::exit`].
    pub(crate) async fn exit(mut self) -> hame_core::Result<()> {
        match self.0.take() {
            Some(held) => held.exit().await,
            None => Ok(()),
        }
    }
}

impl Drop for ScopeHold {
    fn drop(&mut self) {
        if let Some(held) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                if let Err(e) = held.exit().await {
                    tracing::warn!(error = %e, "ending a dropped sandbox hold failed");
                }
            });
        }
    }
}

impl Held {
    /// Snapshots `/workspace` (whatever the call did, also when it failed part-way) and
    /// lets the scope go; `Err` when the lease was lost meanwhile (the changes are
    /// discarded: another process may be using the scope now, and a snapshot of ours
    /// would overwrite its) or the snapshot failed.
    async fn exit(self) -> hame_core::Result<()> {
        let Self {
            key,
            sandbox,
            lease,
            alive,
            _serial,
        } = self;
        if let Some(lost) = lease.as_ref().and_then(|l| l.check().err()) {
            sandbox.discard().await;
            tracing::warn!(scope = %key, "the sandbox lease was lost during the call; its changes are not snapshotted");
            return Err(hame_core::Error::layer(
                "sandbox",
                format!(
                    "the sandbox lease of scope {key} was lost during the call ({lost}); the call's changes to /workspace were not saved"
                ),
            ));
        }
        let ended = sandbox.end().await;
        drop(alive);
        if let Some(lease) = lease
            && let Err(e) = lease.release().await
        {
            tracing::warn!(scope = %key, error = %e, "releasing the sandbox lease failed; it expires by itself");
        }
        match ended {
            Ok(report) => {
                tracing::debug!(scope = %key, ?report, "sandbox snapshot");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(scope = %key, error = %e, "snapshotting the sandbox failed");
                Err(hame_core::Error::layer("sandbox", e))
            }
        }
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
        let Some(ws) = cx
            .extensions
            .get::<Workspace>()
            .filter(|_| self.tenancy.sandboxes().is_some())
            .cloned()
        else {
            return next.run(cx, input).await;
        };
        // A subagent with `sandbox: own` has the sandbox of its own session, begun and
        // snapshotted here; it is that session's alone (no lease).
        let own = cx
            .runtime
            .extras
            .get(SANDBOX_KEY_EXTRA)
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        // Any other subagent's call shares its parent's handle, so its parent's sandbox:
        // the parent's call projected it and snapshots it (waiting for the parent's scope
        // lock here would deadlock a synchronous child).
        if own.is_none() && cx.runtime.extras.contains_key(hame_subagent::TASK_EXTRA) {
            return next.run(cx, input).await;
        }
        let key = match &own {
            Some(key) => key.clone(),
            None => self
                .tenancy
                .sandbox_key(ws.identity())
                .map_err(|e| hame_core::Error::layer("sandbox", e))?,
        };
        // A subagent with its own sandbox takes no lease: its session is its own.
        let hold = self.enter(&key, own.is_some(), None, &ws).await?;
        let out = next.run(cx, input).await;
        match (out, hold.exit().await) {
            (Ok(out), Ok(())) => Ok(out),
            (Ok(_), Err(e)) | (Err(e), _) => Err(e),
        }
    }
}
