//! The one error type of the crate.

use std::ops::Range;

use hame_core::ToolError;

/// Stable, model-facing error codes of the session tools.
pub mod codes {
    /// A session or agent id is malformed (`/`, `..`, too long, odd characters).
    pub const INVALID_ID: &str = "invalid_session_id";
    /// No log exists for this session.
    pub const SESSION_NOT_FOUND: &str = "session_not_found";
    /// The index kept changing under us (compare-and-set retries exhausted).
    pub const CONFLICT: &str = "conflict";
    /// A stored file is not what this crate writes.
    pub const CORRUPT: &str = "corrupt_session_data";
    /// The storage failed.
    pub const STORAGE: &str = "storage_error";
}

/// Why a session-log operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An agent or session id is not acceptable as a file name.
    #[error("invalid {what} {id:?}: {reason}")]
    InvalidId {
        /// `"session id"` or `"agent id"`.
        what: &'static str,
        /// The id as given (cut to 200 characters).
        id: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// The session has no log.
    #[error("session {session_id:?} has no log")]
    SessionNotFound {
        /// The session id.
        session_id: String,
    },
    /// The index compare-and-set lost too many races in a row.
    #[error("{path}: gave up after {attempts} conflicting concurrent updates")]
    Conflict {
        /// Virtual path of the index.
        path: String,
        /// How many attempts were made.
        attempts: usize,
    },
    /// A stored file (the index) cannot be parsed; it is left untouched.
    #[error("{path} is not a valid session file: {reason}")]
    Corrupt {
        /// Virtual path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The log append succeeded but the index update failed afterwards. The records are
    /// durable (do not append them again); the index can be repaired with
    /// [`SessionLog::rebuild_index`](crate::SessionLog::rebuild_index).
    #[error("records {}..{} were logged but the session index was not updated: {source}", written.start, written.end)]
    IndexNotUpdated {
        /// The sequence numbers that were written.
        written: Range<u64>,
        /// Why the index update failed.
        #[source]
        source: Box<Error>,
    },
    /// The filesystem failed.
    #[error("session storage error: {0}")]
    Storage(#[from] hame_fs::Error),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The stable model-facing code, see [`codes`].
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidId { .. } => codes::INVALID_ID,
            Error::SessionNotFound { .. } => codes::SESSION_NOT_FOUND,
            Error::Conflict { .. } => codes::CONFLICT,
            Error::Corrupt { .. } => codes::CORRUPT,
            Error::IndexNotUpdated { source, .. } => source.code(),
            Error::Storage(_) => codes::STORAGE,
        }
    }

    /// Whether retrying the same operation later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Conflict { .. } => true,
            Error::Storage(e) => matches!(
                e.code(),
                hame_fs::codes::CONFLICT | hame_fs::codes::BACKEND_ERROR
            ),
            _ => false,
        }
    }
}

impl From<Error> for ToolError {
    fn from(e: Error) -> Self {
        let message = match &e {
            // The backend's cause may carry host details; the model gets the summary only.
            Error::Storage(hame_fs::Error::Backend { message, .. }) => {
                format!("session storage error: {message}")
            }
            other => other.to_string(),
        };
        ToolError::new(e.code(), message)
    }
}
