//! Which filesystem a call sees: the filesystem mode, the isolation scope and the template.

use std::sync::Arc;

use hame_core::RuntimeContext;
use hame_fs::{
    Execute, Filesystem, FsPath, Isolation, Links, NameCase, Namespace, PrefixFs, Scope,
};
use hame_tools::{Identity, Workspace, WorkspaceMode};

use crate::guard::{GuardFs, GuardRules};
use crate::template::TemplateFs;
use crate::users::UserRegistry;

/// Where workspace files physically live (the table of modes is in `docs/filesystem.md`).
#[derive(Debug, Clone)]
pub enum FilesystemMode {
    /// Local mode, for one trusted user on their own machine: the file tools (and the
    /// `execute` shell tool, when `shell` is true) work on the workspace itself. Runtime
    /// data sits at the reference layout in the workspace (`agents/<agent>/sessions/`,
    /// `memory/`, `MEMORY.md`), under `<userId>/` for a caller with a user id. The shell is
    /// not a boundary: it can read every file of the host user. The default, with the shell.
    Local {
        /// Register the `execute` tool (runs `sh -c` in the workspace; not a sandbox).
        shell: bool,
    },
    /// Isolated local mode, for many tenants on one machine: each tenant sees only its
    /// namespace on local disk (`<workspace>/agents/<agent>/users/<user>/home/...`) over the
    /// read-only workspace template. No shell tool.
    IsolatedLocal,
    /// Shared-store mode for many replicas: tenant data lives in `store` (Redis, object
    /// storage) under namespace prefixes; the local workspace is the read-only template
    /// below it (reads fall through, writes go to the store). No shell tool.
    SharedStore {
        /// The shared store.
        store: Arc<dyn Filesystem>,
    },
    /// Sandbox mode: the file tools and `execute` work inside a container per isolation
    /// scope, on `/workspace`; the host workspace's static assets are projected in at the
    /// start of each call and nothing is written into the host workspace. Session logs and
    /// memory stay on the host, under the state home (see `docs/sandbox.md`).
    Sandbox {
        /// The sandboxes (one container per scope key).
        sandboxes: Arc<dyn hame_sandbox::Sandboxes>,
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
            FilesystemMode::Local { .. } => WorkspaceMode::TrustedLocal,
            FilesystemMode::IsolatedLocal => WorkspaceMode::IsolatedLocal,
            FilesystemMode::SharedStore { .. } => WorkspaceMode::SharedStore,
            FilesystemMode::Sandbox { .. } => WorkspaceMode::Sandbox,
        }
    }

    /// The sandboxes of sandbox mode.
    pub fn sandboxes(&self) -> Option<&Arc<dyn hame_sandbox::Sandboxes>> {
        match self {
            FilesystemMode::Sandbox { sandboxes } => Some(sandboxes),
            _ => None,
        }
    }
}

/// The resolved filesystems of an agent, and the one place that makes a caller's
/// [`Workspace`] handle: every layer, tool and background task reaches a caller's files
/// through the handle [`Tenancy::workspace`] made, and through nothing else.
#[derive(Debug)]
pub struct Tenancy {
    /// Where tenant data is written (in local mode: the workspace, files created private).
    pub store: Arc<dyn Filesystem>,
    /// The shared read-only template (runtime roots hidden).
    pub template: Arc<dyn Filesystem>,
    /// Agent id, scope and template.
    pub isolation: Isolation,
    workspace: Arc<dyn Filesystem>,
    mode: WorkspaceMode,
    exec: Option<Arc<dyn Execute>>,
    hidden: Vec<FsPath>,
    sandboxes: Option<Arc<dyn hame_sandbox::Sandboxes>>,
    users: Arc<UserRegistry>,
    links: Option<Arc<dyn Links>>,
    name_case: NameCase,
}

impl Tenancy {
    /// Builds the tenancy over a local workspace filesystem; `exec` is the shell handed to
    /// callers (local mode with the shell on). In [`WorkspaceMode::TrustedLocal`] `store`
    /// is the workspace opened for runtime data (the same directory as `workspace`).
    pub fn new(
        store: Arc<dyn Filesystem>,
        workspace: Arc<dyn Filesystem>,
        agent: &str,
        scope: Scope,
        mode: WorkspaceMode,
        exec: Option<Arc<dyn Execute>>,
    ) -> Self {
        let template: Arc<dyn Filesystem> = Arc::new(TemplateFs::new(workspace.clone()));
        let users = Arc::new(UserRegistry::new(store.clone(), workspace.clone()));
        let mut isolation = Isolation::new(agent);
        isolation.scope = scope;
        isolation.template = Some(template.clone());
        Self {
            store,
            template,
            isolation,
            workspace,
            mode,
            exec,
            hidden: Vec::new(),
            sandboxes: None,
            users,
            links: None,
            name_case: NameCase::Sensitive,
        }
    }

    /// User ids whose `<userId>/` folders are theirs before their first call (the
    /// registry's declared ids; see [`UserRegistry`]).
    pub fn with_declared_users(mut self, users: impl IntoIterator<Item = String>) -> Self {
        self.users = Arc::new(
            UserRegistry::new(self.store.clone(), self.workspace.clone()).with_declared(users),
        );
        self
    }

    /// Says where the workspace's paths lead (its symbolic links): every view then checks
    /// paths as resolved too, and walks skip links.
    pub fn with_links(mut self, links: Arc<dyn Links>) -> Self {
        self.links = Some(links);
        self
    }

    /// Whether the workspace's filesystem folds case (policy checks compare paths so).
    pub fn with_name_case(mut self, case: NameCase) -> Self {
        self.name_case = case;
        self
    }

    /// The registered user ids (see [`UserRegistry`]).
    pub fn users(&self) -> &Arc<UserRegistry> {
        &self.users
    }

    /// Registers a caller's user id before its call touches a file, so its `<userId>/`
    /// folder is its own from then on (once per process and user).
    pub async fn register_user(&self, user: Option<&str>) -> hame_fs::Result<()> {
        match user {
            Some(u) if self.mode != WorkspaceMode::Sandbox => self.users.register(u).await,
            _ => Ok(()),
        }
    }

    /// A guard over `inner` (a view of the workspace's own paths) with the registry and
    /// the workspace's links.
    fn guard(&self, inner: Arc<dyn Filesystem>, rules: GuardRules) -> GuardFs {
        let guard = GuardFs::new(inner, rules).with_users(self.users.clone());
        match &self.links {
            Some(l) => guard.with_links(l.clone()),
            None => guard,
        }
    }

    /// Sandbox mode: callers' files and shell are their scope's sandbox.
    pub fn with_sandboxes(mut self, sandboxes: Arc<dyn hame_sandbox::Sandboxes>) -> Self {
        self.sandboxes = Some(sandboxes);
        self
    }

    /// The key of a caller's sandbox: the path of its isolation namespace (the one key
    /// function of hame, [`Namespace::derive`]).
    pub fn sandbox_key(&self, identity: &Identity) -> hame_fs::Result<String> {
        let ns = Namespace::derive(
            &identity.agent,
            identity.user.as_deref(),
            &identity.session,
            self.isolation.scope,
        )?;
        Ok(ns.path().as_str().to_owned())
    }

    /// The sandboxes of sandbox mode.
    pub fn sandboxes(&self) -> Option<&Arc<dyn hame_sandbox::Sandboxes>> {
        self.sandboxes.as_ref()
    }

    /// Paths of the workspace no caller sees (a state home inside the workspace).
    pub fn with_hidden(mut self, hidden: Vec<FsPath>) -> Self {
        self.hidden = hidden;
        self
    }

    /// The caller's workspace handle, the one place that knows the modes:
    ///
    /// * local mode ([`WorkspaceMode::TrustedLocal`]): the files are the workspace itself;
    ///   records and home are the workspace (no user id) or its `<userId>/` folder;
    /// * isolated modes: the files are the caller's namespace in the store over the
    ///   template; the records are the per-(agent, user) log namespace (per session for
    ///   anonymous callers, whatever the scope, so two users never share a log).
    ///
    /// In every mode the files go through [`GuardFs`]: other users' override folders and
    /// other tenants' runtime data are hidden, the caller's runtime roots (session logs,
    /// task records, the memory index, offloaded results) are skipped by walks and never
    /// written by the file tools.
    pub fn workspace(&self, runtime: &RuntimeContext) -> hame_fs::Result<Workspace> {
        let agent = &self.isolation.agent_id;
        let user = runtime.user_id.as_deref();
        let session = runtime.session_id.as_str();
        let identity = Identity::new(agent.clone(), user, session);
        let offload = hame_memory::offload::DEFAULT_OFFLOAD_DIR;
        if let (WorkspaceMode::Sandbox, Some(sandboxes)) = (self.mode, &self.sandboxes) {
            // Files and shell: the scope's container. Runtime data: the caller's namespace
            // in the host store (under the state home), never in the host workspace.
            let ns = Namespace::derive(agent, user, session, self.isolation.scope)?;
            let sandbox = sandboxes.scope(ns.path().as_str());
            let files: Arc<dyn Filesystem> = sandbox.clone();
            let exec: Arc<dyn Execute> = sandbox;
            let home = hame_fs::tenant_fs(self.store.clone(), &ns, None);
            let log_ns = Namespace::derive(agent, user, session, Scope::User)?;
            let records = hame_fs::tenant_fs(self.store.clone(), &log_ns, None);
            let mut ws = Workspace::new(identity, self.mode, files, records)
                .with_home(home, FsPath::root())
                .with_exec(exec)
                .with_operator_files(self.template.clone());
            // The caller's `<userId>/` overrides of the host template (projected into the
            // sandbox with the template's assets, theirs winning).
            if let Some(u) = user {
                let prefix = FsPath::parse(u)?;
                ws = ws.with_overrides(Arc::new(PrefixFs::new(self.template.clone(), prefix)));
            }
            return Ok(ws);
        }
        let mut ws = if self.mode == WorkspaceMode::TrustedLocal {
            // Validates the ids (the namespace itself is not used in local mode).
            Namespace::derive(agent, user, session, Scope::User)?;
            let (home_in_files, home): (FsPath, Arc<dyn Filesystem>) = match user {
                Some(u) => {
                    let prefix = FsPath::parse(u)?;
                    let home = Arc::new(PrefixFs::new(self.store.clone(), prefix.clone()));
                    (prefix, home)
                }
                None => (FsPath::root(), self.store.clone()),
            };
            let mut rules = GuardRules {
                hidden: self.hidden.clone(),
                runtime: vec![home_in_files.join("agents")?, home_in_files.join(offload)?],
                read_only: Vec::new(),
                user_folders: None,
            };
            if user.is_some() {
                // The anonymous owner's runtime data is not a user's.
                for root in ["agents", "global", offload, "memory", "MEMORY.md"] {
                    rules.hidden.push(FsPath::parse(root)?);
                }
                rules.user_folders = Some(user.map(str::to_owned));
            }
            let files: Arc<dyn Filesystem> = Arc::new(self.guard(self.workspace.clone(), rules));
            Workspace::new(identity, self.mode, files, home.clone()).with_home(home, home_in_files)
        } else {
            let ns = Namespace::derive(agent, user, session, self.isolation.scope)?;
            // Other users' override folders of the template are not this caller's.
            // The runtime roots are named too: a link of the template into them is hidden
            // like the roots themselves.
            let mut hidden = self.hidden.clone();
            for root in crate::template::RUNTIME_ROOTS {
                hidden.push(FsPath::parse(root)?);
            }
            let template: Arc<dyn Filesystem> = Arc::new(self.guard(
                self.template.clone(),
                GuardRules {
                    hidden,
                    runtime: Vec::new(),
                    read_only: Vec::new(),
                    user_folders: Some(user.map(str::to_owned)),
                },
            ));
            let home = hame_fs::tenant_fs(self.store.clone(), &ns, Some(template));
            let log_ns = Namespace::derive(agent, user, session, Scope::User)?;
            let records = hame_fs::tenant_fs(self.store.clone(), &log_ns, None);
            // A tenant's tools cannot write its `tools.json`: it could start host commands
            // (stdio MCP servers) or lift a deny (ADR 0006).
            let rules = GuardRules {
                hidden: Vec::new(),
                runtime: vec![FsPath::parse("agents")?, FsPath::parse(offload)?],
                read_only: vec![FsPath::parse(crate::tools_config::TOOLS_JSON)?],
                user_folders: None,
            };
            let files: Arc<dyn Filesystem> = Arc::new(GuardFs::new(home.clone(), rules));
            Workspace::new(identity, self.mode, files, records)
                .with_home(home, FsPath::root())
                .with_operator_files(self.template.clone())
        };
        if let Some(u) = user {
            let prefix = FsPath::parse(u)?;
            ws = ws.with_overrides(Arc::new(PrefixFs::new(self.template.clone(), prefix)));
        }
        if let Some(exec) = &self.exec {
            ws = ws.with_exec(exec.clone());
        }
        Ok(ws.with_name_case(self.name_case))
    }
}
