//! # hame-state
//!
//! Durable, versioned storage of [`hame_core::AgentState`] per session, with per-session
//! leases, so an agent can resume a conversation and two workers never run the same
//! session's turn at once.
//!
//! The contract is the [`StateStore`] trait: `load` / compare-and-set `save` / `delete` /
//! `list_sessions` keyed by a validated [`StateKey`] `(agent, user, session)`, plus
//! `acquire` for a [`Lease`] and `save_fenced`, which writes only while that lease is the
//! key's current one. A lease knows its [`Holder`] (a dead holder on the same machine is
//! taken over at once), carries a fencing token and notices when it lapses
//! ([`Lease::check`]). [`open`] picks a backend from a URL; [`redact_url`] shows one without
//! its password. The harness depends on this crate; tools and models do not.
//!
//! | feature | backend | URL | shared |
//! |---|---|---|---|
//! | (always) | [`InMemoryStore`] | `memory://` | no |
//! | `json` (default) | `JsonStore`: one JSON file per session | a path or `file:///path` | no |
//! | `redis` | `RedisStore`: hashes + sorted-set index, Lua compare-and-set | `redis://`, `rediss://` | yes |
//! | `postgres` | `PostgresStore` (`SqlStore<Postgres>`): JSONB rows, lease rows | `postgres://`, `postgresql://` | yes |
//! | `mysql` | `MySqlStore` (`SqlStore<MySql>`): LONGTEXT rows, lease rows (MySQL, MariaDB) | `mysql://`, `mariadb://` | yes |
//! | `conformance` | `conformance`: the suite every backend runs | | |
//!
//! [`runs`] is the durable run queue on the same backends ([`runs::open_queue`] takes the
//! same URL): runs of agent work that any replica claims, heartbeats and, when its owner
//! dies, reclaims.
//!
//! ```
//! # async fn demo() -> hame_state::Result<()> {
//! use hame_state::{LeaseOptions, StateKey, open};
//! use hame_core::{AgentState, Message};
//!
//! let store = open("memory://").await?;
//! let key = StateKey::new("coder", Some("alice"), "s1")?;
//! let lease = store.acquire(&key, LeaseOptions::default()).await?;
//! let (mut state, version) = match store.load(&key).await? {
//!     Some(stored) => (stored.state, Some(stored.version)),
//!     None => (AgentState::default(), None),
//! };
//! state.messages.push(Message::user("hi"));
//! // Err(Conflict) if someone else saved; Err(LeaseLost) if the lease lapsed or was taken over.
//! let version = store.save_fenced(&key, &state, version, &lease).await?;
//! assert_eq!(version, 1);
//! lease.release().await?;
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().map_err(|e| hame_state::Error::Config(e.to_string()))?.block_on(demo())?;
//! # Ok::<(), hame_state::Error>(())
//! ```
#![deny(missing_docs)]

mod error;
pub mod events;
mod holder;
mod key;
mod memory;
mod redact;
pub mod runs;
mod store;

#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
mod shared_lease;

#[cfg(feature = "json")]
mod json;
#[cfg(feature = "json")]
mod json_journal;
#[cfg(feature = "redis")]
mod redis_store;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sql;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use error::{Error, Result};
pub use hame_core::secrets::redact_url;
pub use holder::Holder;
pub use key::{MAX_ID_LEN, StateKey, validate_id};
pub use memory::InMemoryStore;
pub use store::{
    DEFAULT_LEASE_TTL, DEFAULT_LEASE_WAIT, KeepAlive, LEASE_POLL_MAX, LEASE_POLL_MIN, Lease,
    LeaseGrant, LeaseHandle, LeaseOptions, Save, SessionSummary, StateStore, Stored,
};

/// The storage format this build reads and writes: the `format` field of a JSON state file,
/// the format field `f` of a Redis document (`docs/state.md`, *Format versions*). A
/// document in a newer format is refused ([`Error::NewerFormat`]) and never overwritten.
pub const STATE_FORMAT: &str = "hame-state/1";

/// The version number of a storage format name (`hame-state/7` → 7); `None` when the name
/// is not of that form.
#[allow(dead_code)] // unused when only the memory store is compiled in
pub(crate) fn format_version(name: &str) -> Option<u64> {
    let n = name.strip_prefix(error::FORMAT_PREFIX)?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || n.starts_with('0') {
        return None;
    }
    n.parse().ok()
}

#[cfg(feature = "json")]
pub use json::{JSON_FORMAT, JsonStore};
#[cfg(feature = "redis")]
pub use redis_store::{RedisOptions, RedisStore};
#[cfg(feature = "mysql")]
pub use sql::{MySql, MySqlStore};
#[cfg(feature = "postgres")]
pub use sql::{Postgres, PostgresStore};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use sql::{SqlDialect, SqlOptions, SqlStore};

/// Opens a store from a URL or path.
///
/// | input | store |
/// |---|---|
/// | `memory://` | a new, empty [`InMemoryStore`] |
/// | `file:///abs/path`, or anything without `://` (a path) | `JsonStore` (feature `json`) |
/// | `redis://…`, `rediss://…` | `RedisStore` (feature `redis`) |
/// | `postgres://…`, `postgresql://…` | `PostgresStore` (feature `postgres`), migrations applied |
/// | `mysql://…`, `mariadb://…` | `MySqlStore` (feature `mysql`), migrations applied |
///
/// A URL whose backend is not compiled in is [`Error::FeatureDisabled`], naming the feature.
pub async fn open(url: &str) -> Result<Arc<dyn StateStore>> {
    // Its password is a secret of this process from now on (`hame_core::secrets`).
    hame_core::secrets::add_url(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return open_path(url);
    };
    let scheme = scheme.to_ascii_lowercase();
    match scheme.as_str() {
        "memory" => Ok(Arc::new(InMemoryStore::new())),
        "file" => open_path(rest),
        "redis" | "rediss" => {
            #[cfg(feature = "redis")]
            {
                Ok(Arc::new(
                    RedisStore::connect(url, RedisOptions::default()).await?,
                ))
            }
            #[cfg(not(feature = "redis"))]
            Err(Error::FeatureDisabled {
                scheme,
                feature: "redis",
            })
        }
        "postgres" | "postgresql" => {
            #[cfg(feature = "postgres")]
            {
                Ok(Arc::new(
                    PostgresStore::connect(url, SqlOptions::default()).await?,
                ))
            }
            #[cfg(not(feature = "postgres"))]
            Err(Error::FeatureDisabled {
                scheme,
                feature: "postgres",
            })
        }
        "mysql" | "mariadb" => {
            #[cfg(feature = "mysql")]
            {
                let url = format!("mysql://{rest}");
                Ok(Arc::new(
                    MySqlStore::connect(&url, SqlOptions::default()).await?,
                ))
            }
            #[cfg(not(feature = "mysql"))]
            Err(Error::FeatureDisabled {
                scheme,
                feature: "mysql",
            })
        }
        other => Err(Error::Config(format!(
            "unknown state store URL scheme `{other}` (expected memory, file, redis, rediss, postgres, postgresql, mysql or mariadb)"
        ))),
    }
}

fn open_path(path: &str) -> Result<Arc<dyn StateStore>> {
    if path.is_empty() {
        return Err(Error::Config("empty state store path".into()));
    }
    #[cfg(feature = "json")]
    {
        Ok(Arc::new(JsonStore::open(path)?))
    }
    #[cfg(not(feature = "json"))]
    Err(Error::FeatureDisabled {
        scheme: "file".into(),
        feature: "json",
    })
}

/// Most recently updated first; ties by session id.
pub(crate) fn sort_summaries(list: &mut [SessionSummary]) {
    list.sort_by(|a, b| {
        b.updated_at
            .cmp(&a.updated_at)
            .then_with(|| a.session.cmp(&b.session))
    });
}

/// Validates the scope of [`StateStore::list_sessions`].
#[allow(dead_code)] // unused when only the always-on stores are compiled in
pub(crate) fn validate_scope(agent: &str, user: Option<&str>) -> Result<()> {
    validate_id("agent", agent)?;
    if let Some(u) = user {
        validate_id("user", u)?;
    }
    Ok(())
}
