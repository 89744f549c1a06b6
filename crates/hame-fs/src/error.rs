//! The one error type of the crate, with stable model-facing codes.

/// Stable, model-facing error codes. They never change meaning; new ones may be added.
pub mod codes {
    /// The path does not exist.
    pub const FILE_NOT_FOUND: &str = "file_not_found";
    /// A file operation was aimed at a directory.
    pub const IS_DIRECTORY: &str = "is_directory";
    /// A directory operation was aimed at a file, or a parent of the path is a file.
    pub const NOT_A_DIRECTORY: &str = "not_a_directory";
    /// The policy (read-only layer, escaping symlink, device file, hard link) refused it.
    pub const PERMISSION_DENIED: &str = "permission_denied";
    /// The path is malformed (`..`, NUL, over-long, control characters).
    pub const INVALID_PATH: &str = "invalid_path";
    /// The target exists and the operation does not overwrite.
    pub const ALREADY_EXISTS: &str = "already_exists";
    /// The content changed since it was read (compare-and-set failed).
    pub const CONFLICT: &str = "conflict";
    /// The backend or wrapper cannot do this.
    pub const NOT_SUPPORTED: &str = "not_supported";
    /// The file is not UTF-8 text.
    pub const BINARY_FILE: &str = "binary_file";
    /// `edit` did not find `old_string`.
    pub const NO_MATCH: &str = "no_match";
    /// `edit` found `old_string` more than once and `replace_all` was not set.
    pub const AMBIGUOUS_MATCH: &str = "ambiguous_match";
    /// An argument (regex, glob, edit strings) is invalid. The same string as the agent
    /// core's `invalid_arguments` (checked by a test in `hame-tools`).
    pub const INVALID_ARGUMENTS: &str = "invalid_arguments";
    /// The file is larger than a configured limit.
    pub const TOO_LARGE: &str = "too_large";
    /// The storage failed (I/O error, network, server).
    pub const BACKEND_ERROR: &str = "backend_error";
}

/// Why a filesystem operation failed. Paths in messages are the virtual paths the caller
/// used (never host paths).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The path does not exist.
    #[error("{path}: no such file or directory")]
    NotFound {
        /// The virtual path.
        path: String,
    },
    /// A file operation was aimed at a directory.
    #[error("{path} is a directory")]
    IsDirectory {
        /// The virtual path.
        path: String,
    },
    /// A directory operation was aimed at a file, or a parent of the path is a file.
    #[error("{path} is not a directory")]
    NotADirectory {
        /// The virtual path.
        path: String,
    },
    /// The policy refused the operation.
    #[error("{path}: permission denied ({reason})")]
    PermissionDenied {
        /// The virtual path.
        path: String,
        /// Which rule refused it.
        reason: String,
    },
    /// The path is malformed.
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// The target exists and the operation does not overwrite.
    #[error("{path} already exists")]
    AlreadyExists {
        /// The virtual path.
        path: String,
    },
    /// A compare-and-set failed: the content is not the version the caller expected.
    #[error("{path} was changed by someone else ({reason}); read it again and retry")]
    Conflict {
        /// The virtual path.
        path: String,
        /// What differed.
        reason: String,
    },
    /// The backend or wrapper cannot do this.
    #[error("{operation} is not supported here: {reason}")]
    NotSupported {
        /// The operation.
        operation: String,
        /// Why.
        reason: String,
    },
    /// The file is not UTF-8 text.
    #[error("{path} is a binary file ({size} bytes) and cannot be shown as text")]
    Binary {
        /// The virtual path.
        path: String,
        /// Its size in bytes.
        size: u64,
    },
    /// `edit` did not find the text to replace.
    #[error("the text to replace was not found in {path}; read the file and copy the text exactly")]
    NoMatch {
        /// The virtual path.
        path: String,
    },
    /// `edit` found the text more than once and `replace_all` was not set.
    #[error(
        "the text to replace occurs {count} times in {path}; add surrounding lines to make it unique or set replace_all"
    )]
    AmbiguousMatch {
        /// The virtual path.
        path: String,
        /// How many times it occurs.
        count: usize,
    },
    /// An argument is invalid.
    #[error("{message}")]
    InvalidArgument {
        /// What is wrong.
        message: String,
    },
    /// The file is larger than a configured limit.
    #[error("{path} is {size} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        /// The virtual path.
        path: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The storage failed.
    #[error("storage error: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// The backend's own error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The stable model-facing code, see [`codes`].
    pub fn code(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => codes::FILE_NOT_FOUND,
            Error::IsDirectory { .. } => codes::IS_DIRECTORY,
            Error::NotADirectory { .. } => codes::NOT_A_DIRECTORY,
            Error::PermissionDenied { .. } => codes::PERMISSION_DENIED,
            Error::InvalidPath { .. } => codes::INVALID_PATH,
            Error::AlreadyExists { .. } => codes::ALREADY_EXISTS,
            Error::Conflict { .. } => codes::CONFLICT,
            Error::NotSupported { .. } => codes::NOT_SUPPORTED,
            Error::Binary { .. } => codes::BINARY_FILE,
            Error::NoMatch { .. } => codes::NO_MATCH,
            Error::AmbiguousMatch { .. } => codes::AMBIGUOUS_MATCH,
            Error::InvalidArgument { .. } => codes::INVALID_ARGUMENTS,
            Error::TooLarge { .. } => codes::TOO_LARGE,
            Error::Backend { .. } => codes::BACKEND_ERROR,
        }
    }

    /// A backend failure wrapping its cause.
    pub fn backend(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A `not_supported` error.
    pub fn not_supported(operation: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::NotSupported {
            operation: operation.into(),
            reason: reason.into(),
        }
    }

    /// An `invalid_arguments` error.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            message: message.into(),
        }
    }

    /// Whether this is `file_not_found`.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// Rewrites the virtual paths inside the error (used by wrappers that map paths, so the
    /// caller sees the path it used).
    pub fn map_path(self, f: impl Fn(&str) -> String) -> Self {
        match self {
            Error::NotFound { path } => Error::NotFound { path: f(&path) },
            Error::IsDirectory { path } => Error::IsDirectory { path: f(&path) },
            Error::NotADirectory { path } => Error::NotADirectory { path: f(&path) },
            Error::PermissionDenied { path, reason } => Error::PermissionDenied {
                path: f(&path),
                reason,
            },
            Error::AlreadyExists { path } => Error::AlreadyExists { path: f(&path) },
            Error::Conflict { path, reason } => Error::Conflict {
                path: f(&path),
                reason,
            },
            Error::Binary { path, size } => Error::Binary {
                path: f(&path),
                size,
            },
            Error::NoMatch { path } => Error::NoMatch { path: f(&path) },
            Error::AmbiguousMatch { path, count } => Error::AmbiguousMatch {
                path: f(&path),
                count,
            },
            Error::TooLarge { path, size, limit } => Error::TooLarge {
                path: f(&path),
                size,
                limit,
            },
            other => other,
        }
    }
}
