//! The tenant workspace handle.

use std::fmt;
use std::sync::Arc;

use hame_core::{Extensions, ToolContext, ToolError, codes};
use hame_fs::{Execute, Filesystem, FsPath, NameCase};

/// Who is calling: the ids every path and key of the caller is derived from (checked by
/// `hame_id` before a handle is made).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The agent id.
    pub agent: String,
    /// The user id, when the caller has one.
    pub user: Option<String>,
    /// The session id.
    pub session: String,
}

impl Identity {
    /// An identity.
    pub fn new(agent: impl Into<String>, user: Option<&str>, session: impl Into<String>) -> Self {
        Self {
            agent: agent.into(),
            user: user.map(str::to_owned),
            session: session.into(),
        }
    }
}

/// How the caller's files are laid out (see `docs/filesystem.md` for the table of modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WorkspaceMode {
    /// One trusted user on their own machine: the file tools and the shell work on the
    /// workspace itself.
    TrustedLocal,
    /// Each tenant sees its namespace on local disk over the read-only workspace template;
    /// no host shell.
    IsolatedLocal,
    /// Each tenant sees its namespace in a shared store (Redis, object storage) over the
    /// read-only workspace template; no host shell.
    SharedStore,
    /// Files and commands inside a container.
    Sandbox,
}

/// One caller's view of its workspace. Cheap to clone.
#[derive(Clone)]
pub struct Workspace {
    identity: Identity,
    mode: WorkspaceMode,
    files: Arc<dyn Filesystem>,
    records: Arc<dyn Filesystem>,
    home: Arc<dyn Filesystem>,
    home_in_files: FsPath,
    overrides: Option<Arc<dyn Filesystem>>,
    operator: Option<Arc<dyn Filesystem>>,
    exec: Option<Arc<dyn Execute>>,
    name_case: NameCase,
}

impl fmt::Debug for Workspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workspace")
            .field("identity", &self.identity)
            .field("mode", &self.mode)
            .field("home_in_files", &self.home_in_files)
            .field("overrides", &self.overrides.is_some())
            .field("operator", &self.operator.is_some())
            .field("exec", &self.exec.is_some())
            .field("name_case", &self.name_case)
            .finish()
    }
}

impl Workspace {
    /// A handle: `files` is what the caller's tools see, `records` where its session logs
    /// and task records live. Its [`home`](Self::home) is `files` until
    /// [`with_home`](Self::with_home) sets another.
    pub fn new(
        identity: Identity,
        mode: WorkspaceMode,
        files: Arc<dyn Filesystem>,
        records: Arc<dyn Filesystem>,
    ) -> Self {
        Self {
            identity,
            mode,
            home: files.clone(),
            home_in_files: FsPath::root(),
            files,
            records,
            overrides: None,
            operator: None,
            exec: None,
            name_case: NameCase::Sensitive,
        }
    }

    /// The same handle with its [`files`](Self::files), [`home`](Self::home) and
    /// [`overrides`](Self::overrides) replaced (read views over them, such as a step's
    /// [`WorkspaceSnapshot`](crate::snapshot::WorkspaceSnapshot)); identity, records,
    /// shell and the rest are kept.
    pub fn with_views(
        &self,
        files: Arc<dyn Filesystem>,
        home: Arc<dyn Filesystem>,
        overrides: Option<Arc<dyn Filesystem>>,
    ) -> Self {
        Self {
            files,
            home,
            overrides,
            ..self.clone()
        }
    }

    /// Says whether the backend of [`files`](Self::files) folds case (default
    /// [`NameCase::Sensitive`]); policy checks compare paths accordingly
    /// ([`FsPath::match_key`]).
    pub fn with_name_case(mut self, case: NameCase) -> Self {
        self.name_case = case;
        self
    }

    /// Whether the caller's files fold case.
    pub fn name_case(&self) -> NameCase {
        self.name_case
    }

    /// Sets where the caller's runtime data lives (memory files, `MEMORY.md`, offloaded
    /// results) and the path at which that folder appears in [`files`](Self::files)
    /// (`<userId>` in local mode with a user id, the root otherwise), so a path written in
    /// the home can be shown to the model as a path its file tools can read.
    pub fn with_home(mut self, home: Arc<dyn Filesystem>, in_files: FsPath) -> Self {
        self.home = home;
        self.home_in_files = in_files;
        self
    }

    /// Sets the caller's per-user override folder (`<userId>/` of the workspace, read-only).
    pub fn with_overrides(mut self, overrides: Arc<dyn Filesystem>) -> Self {
        self.overrides = Some(overrides);
        self
    }

    /// Sets the operator's own files (the workspace template) in a mode where the caller's
    /// tools can write [`files`](Self::files) (isolated, store and sandbox modes): a setting
    /// that spends the operator's credentials (a remote subagent's `a2a_auth_env`) is
    /// honoured only when its file is the operator's, not one the tenant wrote.
    pub fn with_operator_files(mut self, operator: Arc<dyn Filesystem>) -> Self {
        self.operator = Some(operator);
        self
    }

    /// Sets the shell that runs commands on the caller's files.
    pub fn with_exec(mut self, exec: Arc<dyn Execute>) -> Self {
        self.exec = Some(exec);
        self
    }

    /// The same handle for another session of the same tenant (a subagent's child session):
    /// the same files, records, home, overrides and shell; only the identity's session
    /// changes.
    pub fn for_session(&self, session: impl Into<String>) -> Self {
        let mut ws = self.clone();
        ws.identity.session = session.into();
        ws
    }

    /// Who is calling.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The mode.
    pub fn mode(&self) -> WorkspaceMode {
        self.mode
    }

    /// The files the caller's tools see.
    pub fn files(&self) -> &Arc<dyn Filesystem> {
        &self.files
    }

    /// Where the caller's session logs and task records live.
    pub fn records(&self) -> &Arc<dyn Filesystem> {
        &self.records
    }

    /// Where the caller's runtime data lives: memory files (`memory/YYYY-MM-DD.md`,
    /// `MEMORY.md`) and offloaded tool results. Not guarded like [`files`](Self::files):
    /// only hame writes here.
    pub fn home(&self) -> &Arc<dyn Filesystem> {
        &self.home
    }

    /// The path of [`home`](Self::home) inside [`files`](Self::files) (the root, or
    /// `<userId>` in local mode with a user id).
    pub fn home_in_files(&self) -> &FsPath {
        &self.home_in_files
    }

    /// The caller's per-user override folder, when it has a user id.
    pub fn overrides(&self) -> Option<&Arc<dyn Filesystem>> {
        self.overrides.as_ref()
    }

    /// The operator's own files, in a mode where the caller's tools can write
    /// [`files`](Self::files) ([`with_operator_files`](Self::with_operator_files)); `None`
    /// in local mode, where the files are the operator's.
    pub fn operator_files(&self) -> Option<&Arc<dyn Filesystem>> {
        self.operator.as_ref()
    }

    /// The shell, when the mode has one.
    pub fn exec(&self) -> Option<&Arc<dyn Execute>> {
        self.exec.as_ref()
    }
}

/// Reaches the [`Workspace`] of a call.
pub trait WorkspaceExt {
    /// The caller's workspace handle; an error result the model sees when the call has none
    /// (a tool used outside the harness without one).
    fn workspace(&self) -> Result<&Workspace, ToolError>;

    /// The caller's workspace as the step's snapshot shows it
    /// ([`crate::snapshot::latest_view`]): for a tool that reads the configuration the
    /// layers read (a skill, a subagent spec), so it sees what the step's prompt was built
    /// from without a store round trip. Without a snapshot, the handle itself. Not for
    /// reading what the step's own tools may have written: that is the store's.
    fn config_workspace(&self) -> Result<Workspace, ToolError>;
}

impl WorkspaceExt for Extensions {
    fn workspace(&self) -> Result<&Workspace, ToolError> {
        self.get::<Workspace>().ok_or_else(|| {
            ToolError::new(
                codes::FAILED,
                "this tool needs the caller's workspace, and the call has none",
            )
        })
    }

    fn config_workspace(&self) -> Result<Workspace, ToolError> {
        self.workspace()?;
        crate::snapshot::latest_view(self).ok_or_else(|| {
            ToolError::new(
                codes::FAILED,
                "this tool needs the caller's workspace, and the call has none",
            )
        })
    }
}

impl WorkspaceExt for ToolContext {
    fn workspace(&self) -> Result<&Workspace, ToolError> {
        self.extensions.workspace()
    }

    fn config_workspace(&self) -> Result<Workspace, ToolError> {
        self.extensions.config_workspace()
    }
}
