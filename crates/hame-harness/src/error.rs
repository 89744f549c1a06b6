//! The harness error.

/// Why building or calling a [`HarnessAgent`](crate::HarnessAgent) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The builder is missing something or holds a contradiction; the message says what to set.
    #[error("configuration error: {0}")]
    Config(String),
    /// An id in the runtime context is not acceptable.
    // The message names the id already ("invalid session id \"a b\": ..."): not repeated.
    #[error("{0}")]
    InvalidId(String),
    /// The loop failed.
    #[error(transparent)]
    Call(#[from] hame_core::Error),
    /// Another call holds the session and did not release it in time.
    #[error("session `{0}` is busy with another call")]
    SessionBusy(String),
    /// Reading or writing state, logs or workspace files failed.
    #[error("storage error: {message}")]
    Storage {
        /// What failed.
        message: String,
        /// The cause.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl Error {
    /// A storage error from any cause.
    pub fn storage(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Storage {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Whether the error is the caller's configuration (exit code 2 in the CLI).
    pub fn is_config(&self) -> bool {
        matches!(self, Error::Config(_) | Error::InvalidId(_))
    }

    /// Whether the session's stored state was written by a newer hame (its storage format
    /// or its schema version is newer than this build's, see
    /// [`hame_state::Error::is_too_new`]): the call refused it before writing anything
    /// (exit code 2 in the CLI).
    pub fn is_too_new(&self) -> bool {
        match self {
            Error::Storage {
                source: Some(source),
                ..
            } => source
                .downcast_ref::<hame_state::Error>()
                .is_some_and(hame_state::Error::is_too_new),
            _ => false,
        }
    }
}

/// `Result` with the harness [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
