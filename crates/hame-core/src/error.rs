//! The error of a call.

use crate::model::ModelError;

/// Why a call failed. Tool failures are never here: they are results the model sees.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The model request failed and no layer recovered.
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
    /// A layer failed.
    #[error("layer `{name}` failed: {source}")]
    Layer {
        /// The layer's name.
        name: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A layer suspended tool calls: the step is saved in the state's `pending`, waiting
    /// for decisions ([`CallInput::Resume`](crate::CallInput::Resume)).
    #[error("{0}")]
    Suspended(crate::Suspended),
    /// A resume was asked for, but no step is suspended.
    #[error("nothing is pending in this session")]
    NothingPending,
    /// A resume named a suspension that is not pending.
    #[error(transparent)]
    UnknownResolution(crate::decide::UnknownResolution),
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
    /// Wraps any error raised inside a layer.
    pub fn layer(name: &str, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Error::Layer {
            name: name.to_owned(),
            source: source.into(),
        }
    }

    /// Whether the call is suspended (not failed).
    pub fn is_suspended(&self) -> bool {
        matches!(self, Error::Suspended(_))
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
