//! The crate's error.

/// What can go wrong with subagents. The tools turn these into error results the model can
/// act on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No declaration with this id is visible to the caller.
    #[error("no subagent `{id}`; available: {available}")]
    UnknownSubagent {
        /// The id asked for.
        id: String,
        /// The ids the caller may spawn.
        available: String,
    },
    /// No task with this id in the caller's session.
    #[error("no task `{0}` in this session (task ids look like task-0123456789ab; see task_list)")]
    UnknownTask(String),
    /// The caller is at the maximum depth.
    #[error("subagents cannot spawn subagents here: depth {depth} is the maximum ({max})")]
    DepthExceeded {
        /// The caller's depth.
        depth: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The operation does not fit the task's status.
    #[error("{0}")]
    InvalidState(String),
    /// Configuration error.
    #[error("{0}")]
    Config(String),
    /// The task records could not be read or written.
    #[error("task storage: {0}")]
    Storage(String),
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
