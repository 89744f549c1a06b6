//! The error of this crate.

/// Why a memory operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller passed something unusable (an empty tenant, an out-of-range plan).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The search index failed (I/O, SQL, a poisoned connection).
    #[error("search index error: {message}")]
    Index {
        /// What was being done.
        message: String,
        /// The backend's cause.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The index file exists but is not a hame search index (not a SQLite database, or a
    /// SQLite database without hame's application id). It was left unchanged.
    #[error(
        "`{}` is not a hame search index ({reason}); hame will not overwrite it: move it away \
         or configure another index path",
        path.display()
    )]
    NotAnIndex {
        /// The file.
        path: std::path::PathBuf,
        /// What the file is instead.
        reason: String,
    },
    /// The index file was written by a newer hame (a newer format than this build reads).
    /// It was left unchanged.
    #[error(
        "search index `{}` has format {found}, newer than format {supported} of this build; \
         it is left unchanged (upgrade hame, or configure another index path)",
        path.display()
    )]
    IndexTooNew {
        /// The file.
        path: std::path::PathBuf,
        /// Its format.
        found: i64,
        /// The newest format this build reads.
        supported: i64,
    },
    /// A model call made by this crate (summary, flush, consolidation) failed.
    #[error("model call for {purpose} failed: {source}")]
    Model {
        /// What the call was for (`compaction`, `memory flush`, `consolidation`).
        purpose: &'static str,
        /// The model's error.
        #[source]
        source: hame_core::ModelError,
    },
    /// The model answered, but the answer cannot be used (empty, over budget, no header).
    /// Nothing was changed.
    #[error("unusable model output for {purpose}: {reason}")]
    UnusableOutput {
        /// What the call was for.
        purpose: &'static str,
        /// Why the output was refused.
        reason: String,
    },
    /// Reading or writing a memory file (through [`MemoryFiles`](crate::MemoryFiles) or a
    /// [`ResultSink`](crate::ResultSink)) failed.
    #[error("memory file `{path}`: {message}")]
    Files {
        /// Workspace-relative path.
        path: String,
        /// What went wrong.
        message: String,
        /// The cause.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A sub-state in `AgentState.extensions` could not be written.
    #[error("state extension `{key}` could not be stored: {source}")]
    State {
        /// The extension key.
        key: &'static str,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn index(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Index {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// An error for a [`MemoryFiles`](crate::MemoryFiles) or
    /// [`ResultSink`](crate::ResultSink) implementation to return.
    pub fn files(path: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Files {
            path: path.into(),
            message: message.into(),
            source: None,
        }
    }

    /// Like [`Error::files`], with a cause.
    pub fn files_with(
        path: impl Into<String>,
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Files {
            path: path.into(),
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Whether trying again later may succeed (a transient model or backend failure).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Model { source, .. } => source.is_retryable(),
            Error::Index { .. } | Error::Files { .. } => true,
            _ => false,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
