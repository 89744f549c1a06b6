//! # hame-skills
//!
//! Skills for hame agents: packaged instructions (`skills/<name>/SKILL.md`, YAML front
//! matter with `description` and an optional `name`, then the body; other files of the
//! folder are the skill's resources) that the model sees by name and description and
//! loads on demand.
//!
//! - [`Skills::catalog`] reads the caller's layers through its [`Workspace`]
//!   handle, lowest first: the global directory ([`SkillsOptions::global_dir`]), the
//!   workspace `skills/`, the caller's `<userId>/skills/`. The highest layer wins a name;
//!   unique names stack. A `SKILL.md` with invalid front matter is skipped and reported
//!   once ([`INVALID_EVENT`]).
//! - [`prompt_block`] renders the `<available_skills>` list (names and descriptions only).
//! - [`skill_tools`]: `load_skill(name, path?)` and `propose_skill(name, description,
//!   body)` (drafts under `skills/_drafts/` of the caller's home, listed to nobody until
//!   [`Skills::promote`]).
//! - [`curate`]: agent-created skills unused for 30 days are stale, for 90 days archived
//!   (never deleted); a plain function over [`Usage`].
//!
//! - [`SkillRepository`]: skills from outside the workspace (ADR 0030), the lowest layers
//!   in declared order (user > workspace > global directory > repositories), each fetched
//!   at most once per [`SkillsOptions::refresh`] (default 300 s; a failed fetch keeps the
//!   last snapshot and is reported once as [`REPOSITORY_FAILED_EVENT`]); `load_skill`
//!   names a repository skill's source and version (its commit) in its result, so the
//!   session log pins the run to it. Names held by several layers are in
//!   [`Catalog::shadowed`] and reported once ([`SHADOWED_EVENT`]).
//!
//! The harness wires it (the prompt block in the workspace-context layer, the tools in
//! the tool set); depend on it directly to list or promote skills outside an agent.
//!
//! | feature | what it adds |
//! |---|---|
//! | `git` | `GitRepository`: a Git URL and ref, cloned with `gix` into a cache |
//! | `sql` | `SqlRepository`: a PostgreSQL or MySQL/MariaDB table, through sqlx |
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use hame_fs::{Filesystem, FsPath, InMemoryFs, WriteOptions};
//! use hame_skills::{Skills, SkillsOptions, prompt_block};
//! use hame_tools::{Identity, Workspace, WorkspaceMode};
//!
//! let files: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
//! let text = "---\ndescription: Review a patch.\n---\nRead the diff first.";
//! files.write(&FsPath::parse("skills/review/SKILL.md")?, text.into(), WriteOptions::default()).await?;
//! let ws = Workspace::new(Identity::new("hame", None, "s1"), WorkspaceMode::TrustedLocal, files.clone(), files);
//! let skills = Skills::new(SkillsOptions::default())?;
//! let catalog = skills.catalog(&ws, None).await;
//! assert_eq!(prompt_block(&catalog.visible()).unwrap_or_default(),
//!     "Skills are packaged instructions for particular tasks. When a task matches a skill's description, \
//! call load_skill(name) first and follow its instructions.\n- review: Review a patch.\n");
//! assert!(skills.load(&ws, "review", None).await?.contains("Read the diff first."));
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! [`Workspace`]: hame_tools::Workspace
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod catalog;
#[cfg(feature = "git")]
mod git;
mod repository;
mod skill;
#[cfg(feature = "sql")]
mod sql;
mod tools;

pub use catalog::{
    Catalog, DRAFTS_DIR, INVALID_EVENT, Invalid, MAX_RESOURCES, MAX_SKILL_BYTES,
    MAX_SKILLS_PER_LAYER, REPOSITORY_FAILED_EVENT, RepositoryError, SHADOWED_EVENT, Shadowed,
    Skill, Skills, SkillsOptions, USAGE_FILE, prompt_block,
};
#[cfg(feature = "git")]
pub use git::GitRepository;
pub use repository::{DEFAULT_REFRESH, SkillRepository, Snapshot};
pub use skill::{
    ARCHIVE_AFTER_DAYS, FrontMatter, MAX_DESCRIPTION_CHARS, MAX_NAME_LEN, STALE_AFTER_DAYS,
    SkillDoc, SkillLayer, SkillState, Usage, curate, merge, parse_skill, render_skill, valid_name,
};
#[cfg(feature = "sql")]
pub use sql::{DEFAULT_TABLE, SqlRepository};
pub use tools::skill_tools;

/// Why a skills operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is wrong (the global directory).
    #[error("configuration error: {0}")]
    Config(String),
    /// No such skill (the message lists the available ones).
    #[error("{0}")]
    NotFound(String),
    /// A name, description or file is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// Reading or writing the caller's files failed.
    #[error("{message}: {source}")]
    Storage {
        /// What failed.
        message: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    fn storage(message: &str, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Storage {
            message: message.to_owned(),
            source: source.into(),
        }
    }
}

/// `Result` with the skills [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
