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
    /// A spending limit is reached: no further model request is made. What joined the
    /// conversation is kept; the session takes calls again once the limit allows.
    #[error("{0}")]
    BudgetExceeded(BudgetExceeded),
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

/// The limit a call reached ([`Error::BudgetExceeded`]) and what was spent under it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BudgetExceeded {
    /// Whose spending: `run` (this call), `session` or `user_day` (the caller's user, this
    /// UTC day).
    pub scope: String,
    /// What is limited: `usd`, `tokens`, `input_tokens` or `output_tokens`.
    pub limit: String,
    /// The limit.
    pub max: f64,
    /// What the scope has spent of it.
    pub spent: f64,
    /// The tokens the scope spent.
    pub usage: crate::Usage,
    /// What the scope spent, in US dollars (from the price table).
    pub usd: f64,
}

impl std::fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let then = match self.scope.as_str() {
            "run" => "",
            "session" => ", or start a new session",
            _ => ", or wait for the next UTC day",
        };
        let amount = |v: f64| {
            if self.limit == "usd" {
                format!("${v:.4}")
            } else {
                format!("{v:.0}")
            }
        };
        write!(
            f,
            "budget exceeded: {} {} spent {} of {} (the conversation so far is saved; \
             raise it with --budget {}.{}=N{then})",
            self.scope,
            self.limit,
            amount(self.spent),
            amount(self.max),
            self.scope,
            self.limit
        )
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
