//! Which filesystem a call sees: the filesystem mode, the isolation scope and the template.

use std::sync::Arc;

use hame_core::RuntimeContext;
use hame_fs::{Filesystem, Isolation, Scope};
use hame_tools::{IsolationExt, NamespaceExt};

use crate::template::TemplateFs;

/// Where workspace files physically live.
#[derive(Debug, Clone)]
pub enum FilesystemMode {
    /// The workspace on local disk. Tenant data lives under namespace prefixes inside it
    /// (`agents/<agent>/users/<user>/home/...`); the `execute` shell tool is registered
    /// when `shell` is true. The default, with the shell.
    Local {
        /// Register the `execute` tool (runs `sh -c` in the workspace; not a sandbox).
        shell: bool,
    },
    /// Shared-store mode for many replicas: tenant data lives in `store` (Redis, object
    /// storage) under namespace prefixes; the local workspace is the read-only template
    /// below it (reads fall through, writes go to the store). No shell tool.
    SharedStore {
        /// The shared store.
        store: Arc<dyn Filesystem>,
    },
}

impl Default for FilesystemMode {
    fn default() -> Self {
        FilesystemMode::Local { shell: true }
    }
}

impl FilesystemMode {
    /// Whether the mode stores runtime data off this machine.
    pub fn is_shared(&self) -> bool {
        matches!(self, FilesystemMode::SharedStore { .. })
    }
}

/// The resolved filesystems of an agent: the store tenants write to, the template they
/// read through, and the isolation that maps a call to its namespace.
#[derive(Debug)]
pub struct Tenancy {
    /// Where tenant data is written.
    pub store: Arc<dyn Filesystem>,
    /// The shared read-only template (runtime roots hidden).
    pub template: Arc<dyn Filesystem>,
    /// Agent id, scope and template.
    pub isolation: Isolation,
}

impl Tenancy {
    /// Builds the tenancy over a local workspace filesystem.
    pub fn new(
        store: Arc<dyn Filesystem>,
        workspace: Arc<dyn Filesystem>,
        agent: &str,
        scope: Scope,
    ) -> Self {
        let template: Arc<dyn Filesystem> = Arc::new(TemplateFs::new(workspace));
        let mut isolation = Isolation::new(agent);
        isolation.scope = scope;
        isolation.template = Some(template.clone());
        Self {
            store,
            template,
            isolation,
        }
    }

    /// The filesystem a call sees: its namespace in the store over the template.
    pub fn fs_for(&self, runtime: &RuntimeContext) -> hame_fs::Result<Arc<dyn Filesystem>> {
        self.isolation.fs_for_context(&self.store, runtime)
    }

    /// The filesystem holding a user's session logs: always per (agent, user) — or per
    /// session for anonymous callers — whatever the configured scope, so two users never
    /// share a log.
    pub fn session_fs(&self, runtime: &RuntimeContext) -> hame_fs::Result<Arc<dyn Filesystem>> {
        let ns = hame_fs::Namespace::for_context(&self.isolation.agent_id, runtime, Scope::User)?;
        Ok(hame_fs::tenant_fs(self.store.clone(), &ns, None))
    }
}
