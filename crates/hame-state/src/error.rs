//! The one error type of this crate.

use std::time::Duration;

/// Why a state-store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An agent, user or session id is not acceptable (see [`crate::StateKey`]).
    #[error("invalid {field} id {value:?}: {reason}")]
    InvalidId {
        /// Which part of the key: `agent`, `user` or `session`.
        field: &'static str,
        /// The rejected value (truncated to 64 characters).
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A compare-and-set save lost: the stored version is not the expected one.
    ///
    /// Reload, re-apply the change and save again with the new version.
    #[error(
        "state of {key} changed concurrently: expected {}, found {}",
        version_text(*expected),
        version_text(*found)
    )]
    Conflict {
        /// The key, as text.
        key: String,
        /// The version the caller based its change on (`None` = must not exist).
        expected: Option<u64>,
        /// The version found in the store (`None` = absent), when the backend knows it.
        found: Option<u64>,
    },
    /// Another holder has the session's lease and did not release it within the wait.
    #[error("session {key} is busy: another holder kept its lease for {waited:?}")]
    SessionBusy {
        /// The key, as text.
        key: String,
        /// How long this caller waited.
        waited: Duration,
    },
    /// A lease could not be renewed or released because it expired and may be held by someone else.
    #[error("the lease on {key} was lost (it expired or was taken over)")]
    LeaseLost {
        /// The key, as text.
        key: String,
    },
    /// A state document cannot be used: a stored one is corrupt, or it (or the state to be
    /// saved) has a schema version newer than this build's (`StateFormatError::TooNew`, see
    /// [`Error::is_too_new`]). A too-new stored document is never overwritten.
    #[error("state of {key} cannot be used: {source}")]
    Format {
        /// The key, as text.
        key: String,
        /// The cause.
        #[source]
        source: hame_core::StateFormatError,
    },
    /// A stored document is in a storage format newer than this build's (`format:
    /// hame-state/99` in a JSON state file, the format field of a Redis document): it was
    /// written by a newer hame, is refused by `load` before anything else is read from it,
    /// and is never overwritten. [`Error::is_too_new`] is true.
    #[error(
        "state of {key} is in format {found}, newer than this build reads ({supported}); upgrade hame to use it"
    )]
    NewerFormat {
        /// The key, as text.
        key: String,
        /// The format found, e.g. `hame-state/99`.
        found: String,
        /// The newest format this build reads ([`crate::STATE_FORMAT`]).
        supported: &'static str,
    },
    /// The state could not be serialised.
    #[error("state cannot be serialised: {0}")]
    Serialize(#[source] serde_json::Error),
    /// The URL names a backend whose cargo feature is not compiled in.
    #[error("state store URL scheme `{scheme}` needs the `{feature}` feature of hame-state")]
    FeatureDisabled {
        /// The URL scheme.
        scheme: String,
        /// The cargo feature to enable.
        feature: &'static str,
    },
    /// The store URL or options are invalid.
    #[error("invalid state store configuration: {0}")]
    Config(String),
    /// What a caller handed over is not acceptable (a run's message too long, an
    /// idempotency key out of its alphabet): the text says what is allowed.
    #[error("{0}")]
    InvalidInput(String),
    /// A file operation of the JSON store failed.
    #[error("state file {path}: {source}")]
    Io {
        /// The path involved.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The backend (Redis, PostgreSQL, MySQL) failed: connection, timeout or server error.
    #[error("{backend} state store failed: {source}")]
    Backend {
        /// `redis`, `postgres` or `mysql`.
        backend: &'static str,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn version_text(v: Option<u64>) -> String {
    v.map_or_else(|| "no document".to_owned(), |v| format!("version {v}"))
}

impl Error {
    /// Whether trying again may succeed: after a reload for [`Error::Conflict`], after a
    /// pause for [`Error::SessionBusy`] and transient backend or I/O failures.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Conflict { .. }
                | Error::SessionBusy { .. }
                | Error::Backend { .. }
                | Error::Io { .. }
        )
    }

    /// Whether a state document was written by a newer hame (upgrade to use it): its
    /// schema version ([`Error::Format`] with `StateFormatError::TooNew`) or its storage
    /// format ([`Error::NewerFormat`]) is newer than this build's.
    pub fn is_too_new(&self) -> bool {
        matches!(
            self,
            Error::Format {
                source: hame_core::StateFormatError::TooNew { .. },
                ..
            } | Error::NewerFormat { .. }
        )
    }

    /// Whether this is a compare-and-set conflict.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Conflict { .. })
    }

    #[allow(dead_code)] // unused when no network backend is compiled in
    pub(crate) fn backend(
        backend: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Backend {
            backend,
            source: source.into(),
        }
    }

    /// A document (or state) of schema version `found`, newer than this build's.
    pub(crate) fn too_new(key: impl std::fmt::Display, found: u64) -> Self {
        Error::Format {
            key: key.to_string(),
            source: hame_core::StateFormatError::TooNew {
                found: u32::try_from(found).unwrap_or(u32::MAX),
                supported: hame_core::STATE_SCHEMA_VERSION,
            },
        }
    }

    /// The schema version of a state about to be saved, refused if newer than this build's
    /// (such a state would be written under the wrong version).
    #[allow(dead_code)] // unused when only the memory store is compiled in
    pub(crate) fn writable_schema(
        key: impl std::fmt::Display,
        state: &hame_core::AgentState,
    ) -> Result<u64> {
        let v = u64::from(state.schema_version);
        if v > MAX_SCHEMA {
            return Err(Self::too_new(key, v));
        }
        Ok(v)
    }

    /// A state about to be saved, as JSON text, and its schema version (refused if newer
    /// than this build's).
    #[allow(dead_code)] // unused when only the memory store is compiled in
    pub(crate) fn encode(
        key: impl std::fmt::Display,
        state: &hame_core::AgentState,
    ) -> Result<(String, u64)> {
        let schema = Self::writable_schema(key, state)?;
        let json = serde_json::to_string(state).map_err(Error::Serialize)?;
        Ok((json, schema))
    }

    /// A stored document of storage format `found` (a version number), newer than
    /// [`FORMAT_VERSION`].
    #[allow(dead_code)] // unused when only the memory store is compiled in
    pub(crate) fn newer_format(key: impl std::fmt::Display, found: u64) -> Self {
        Error::NewerFormat {
            key: key.to_string(),
            found: format!("{FORMAT_PREFIX}{found}"),
            supported: crate::STATE_FORMAT,
        }
    }

    pub(crate) fn lease_lost(key: impl std::fmt::Display) -> Self {
        Error::LeaseLost {
            key: key.to_string(),
        }
    }

    /// `Ok` if a compare-token update of a lease took effect (`held`), else `LeaseLost`.
    #[allow(dead_code)] // unused when the json feature is off and no shared store is on
    pub(crate) fn lease_held(held: bool, key: impl std::fmt::Display) -> Result<()> {
        if held {
            Ok(())
        } else {
            Err(Self::lease_lost(key))
        }
    }

    /// The version a compare-and-set save writes when it finds `found`: `found + 1` (1 for
    /// none) if that is what the caller `expected`, else `Conflict`.
    #[allow(dead_code)] // unused when the json feature is off and no shared store is on
    pub(crate) fn next_version(
        key: impl std::fmt::Display,
        expected: Option<u64>,
        found: Option<u64>,
    ) -> Result<u64> {
        if found == expected {
            Ok(found.map_or(1, |v| v + 1))
        } else {
            Err(Error::Conflict {
                key: key.to_string(),
                expected,
                found,
            })
        }
    }

    /// A failure to connect to `url`, scrubbed of the URL's password (see
    /// [`crate::redact_url`]).
    #[allow(dead_code)] // unused when no network backend is compiled in
    pub(crate) fn backend_at(
        backend: &'static str,
        source: &(dyn std::error::Error + 'static),
        url: &str,
    ) -> Self {
        Error::Backend {
            backend,
            source: Box::new(crate::redact::Scrubbed::new(source, url)),
        }
    }

    #[allow(dead_code)] // unused when the json feature is off
    pub(crate) fn io(path: impl Into<std::path::PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

/// The prefix of a storage format name: `hame-state/<version>`.
pub(crate) const FORMAT_PREFIX: &str = "hame-state/";

/// The storage format version this build reads and writes ([`crate::STATE_FORMAT`]).
#[allow(dead_code)] // unused when only the memory store is compiled in
pub(crate) const FORMAT_VERSION: u64 = 1;

/// The newest state schema this build reads and writes.
pub(crate) const MAX_SCHEMA: u64 = hame_core::STATE_SCHEMA_VERSION as u64;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
