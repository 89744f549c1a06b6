//! Which filesystem a call sees: the filesystem mode, the isolation scope and the template.

use std::sync::Arc;

use hame_core::RuntimeContext;
use hame_fs::{Execute, Filesystem, FsPath, Isolation, Namespace, PrefixFs, Scope};
use hame_tools::{Identity, Workspace, WorkspaceMode};

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

    /// The layout callers' handles report.
    pub fn workspace_mode(&self) -> WorkspaceMode {
        match self {
            FilesystemMode::Local { shell: true } => WorkspaceMode::TrustedLocal,
            FilesystemMode::Local { shell: false } => WorkspaceMode::IsolatedLocal,
            FilesystemMode::SharedStore { .. } => WorkspaceMode::SharedStore,
        }
    }
}

/// The resolved filesystems of an agent, and the one place that makes a caller's
/// [`Workspace`] handle: every layer, tool and background task reaches a caller's files
/// through the handle [`Tenancy::workspace`] made, and through nothing else.
#[derive(Debug)]
pub struct Tenancy {
    /// Where tenant data is written.
    pub store: Arc<dyn Filesystem>,
    /// The shared read-only template (runtime roots hidden).
    pub template: Arc<dyn Filesystem>,
    /// Agent id, scope and template.
    pub isolation: Isolation,
    mode: WorkspaceMode,
    exec: Option<Arc<dyn Execute>>,
}

impl Tenancy {
    /// Builds the tenancy over a local workspace filesystem; `exec` is the shell handed to
    /// callers (local mode with the shell on).
    pub fn new(
        store: Arc<dyn Filesystem>,
        workspace: Arc<dyn Filesystem>,
        agent: &str,
        scope: Scope,
        mode: WorkspaceMode,
        exec: Option<Arc<dyn Execute>>,
    ) -> Self {
        let template: Arc<dyn Filesystem> = Arc::new(TemplateFs::new(workspace));
        let mut isolation = Isolation::new(agent);
        isolation.scope = scope;
        isolation.template = Some(template.clone());
        Self {
            store,
            template,
            isolation,
            mode,
            exec,
        }
    }

    /// The caller's workspace handle: its namespace in the store over the template (the
    /// files its tools see), its session-log area (always per (agent, user) — or per
    /// session for anonymous callers — whatever the scope, so two users never share a
    /// log), its per-user override folder `<userId>/` of the template, and the shell when
    /// the mode has one.
    pub fn workspace(&self, runtime: &RuntimeContext) -> hame_fs::Result<Workspace> {
        let agent = &self.isolation.agent_id;
        let user = runtime.user_id.as_deref();
        let session = runtime.session_id.as_str();
        let ns = Namespace::derive(agent, user, session, self.isolation.scope)?;
        let files = hame_fs::tenant_fs(self.store.clone(), &ns, Some(self.template.clone()));
        let log_ns = Namespace::derive(agent, user, session, Scope::User)?;
        let records = hame_fs::tenant_fs(self.store.clone(), &log_ns, None);
        let mut ws = Workspace::new(
            Identity::new(agent.clone(), user, session),
            self.mode,
            files,
            records,
        );
        if let Some(u) = user {
            let prefix = FsPath::parse(u)?;
            ws = ws.with_overrides(Arc::new(PrefixFs::new(self.template.clone(), prefix)));
        }
        if let Some(exec) = &self.exec {
            ws = ws.with_exec(exec.clone());
        }
        Ok(ws)
    }
}
