//! The error of a call.

use crate::model::ModelError;

/// Why a call failed. Tool failures are never here: they are results the model sees.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The model request failed and no middleware recovered.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The loop reached its step limit without a final answer.
    #[error(
        "no final answer after {limit} reasoning steps (raise max_iterations or simplify the task)"
    )]
    MaxIterations {
        /// The limit.
        limit: usize,
    },
    /// The call was cancelled.
    #[error("the call was cancelled")]
    Cancelled,
    /// A middleware failed.
    #[error("middleware `{name}` failed: {source}")]
    Middleware {
        /// The middleware's name.
        name: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Anything else (configuration, storage) reported by a higher layer.
    #[error("{message}")]
    Other {
        /// What happened.
        message: String,
        /// The cause.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl Error {
    /// Wraps any error raised inside a middleware.
    pub fn middleware(
        name: &str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Middleware {
            name: name.to_owned(),
            source: source.into(),
        }
    }

    /// An error with a message only.
    pub fn other(message: impl Into<String>) -> Self {
        Error::Other {
            message: message.into(),
            source: None,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
