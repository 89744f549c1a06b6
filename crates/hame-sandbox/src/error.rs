//! The crate's one error type.

/// What went wrong with a sandbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The container engine does not answer (not running, no permission on its socket).
    #[error("the Docker engine is not reachable ({message}); start it or check DOCKER_HOST")]
    Unavailable {
        /// What the client said.
        message: String,
    },
    /// The sandbox image is missing or could not be built.
    #[error("sandbox image: {0}")]
    Image(String),
    /// A setting is not valid.
    #[error("{0}")]
    Config(String),
    /// The snapshot store failed.
    #[error("sandbox snapshot: {message}")]
    Snapshot {
        /// What failed.
        message: String,
        /// The store's error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The engine refused or failed an operation.
    #[error("sandbox: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// The engine's error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A backend error with its cause.
    pub fn backend(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Whether the error is a configuration problem the user fixes (engine down, image
    /// missing, bad setting): the CLI exits with code 2.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. } | Error::Image(_) | Error::Config(_)
        )
    }
}

impl From<Error> for hame_fs::Error {
    fn from(e: Error) -> Self {
        hame_fs::Error::backend(e.to_string(), e)
    }
}

impl From<hame_fs::Error> for Error {
    fn from(e: hame_fs::Error) -> Self {
        Error::Snapshot {
            message: e.to_string(),
            source: Some(Box::new(e)),
        }
    }
}
