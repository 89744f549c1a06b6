//! Tenant isolation: [`Scope`], the one namespace function [`Namespace::derive`], and
//! [`tenant_fs`], which gives a tenant its view of the storage.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::path::FsPath;
use crate::wrappers::{OverlayFs, PrefixFs, ReadOnlyFs};

/// Longest allowed id (agent, user, session), in bytes.
pub const MAX_ID_BYTES: usize = hame_id::MAX_ID_LEN;

/// Which runtime data shares a bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// One bucket per (agent, user, session).
    Session,
    /// One bucket per (agent, user); the default.
    #[default]
    User,
    /// One bucket per agent, shared by all its users.
    Agent,
    /// One bucket for everything.
    Global,
}

/// Checks an id with the one rule of [`hame_id::validate`]: 1..=[`MAX_ID_BYTES`] bytes of
/// `[A-Za-z0-9._@-]`, not starting with `.`, without `..`. So an id is never a separator
/// (`/`, `:`), never `.`/`..`, and never empty.
pub fn validate_id(kind: &'static str, id: &str) -> Result<()> {
    hame_id::validate(kind, id).map_err(|e| Error::InvalidPath {
        path: e.id,
        reason: format!("invalid {kind} id: {}", e.reason),
    })
}

/// Where one tenant's runtime data lives: a list of validated segments, rendered as a path
/// prefix on disk and in object storage ([`Namespace::path`]) and as a key prefix in Redis
/// ([`Namespace::key`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Namespace {
    segments: Vec<String>,
}

impl Namespace {
    /// The one namespace function. Every backend, cache key and throttle slot uses it.
    ///
    /// | scope | user known | namespace |
    /// |---|---|---|
    /// | `Session` | yes | `agents/<agent>/users/<user>/sessions/<session>` |
    /// | `Session` | no | `agents/<agent>/anonymous/sessions/<session>` |
    /// | `User` | yes | `agents/<agent>/users/<user>/home` |
    /// | `User` | no | falls back to `Session`: `agents/<agent>/anonymous/sessions/<session>` |
    /// | `Agent` | – | `agents/<agent>/shared` |
    /// | `Global` | – | `global` |
    ///
    /// All ids are checked with [`validate_id`]; the session id is checked even when the
    /// scope does not use it, so a malformed context fails the same way in every scope.
    /// `anonymous`, `users`, `home`, `sessions` and `shared` are fixed segments in
    /// positions no id can take, so no id choice reaches another tenant's namespace.
    pub fn derive(agent: &str, user: Option<&str>, session: &str, scope: Scope) -> Result<Self> {
        validate_id("agent", agent)?;
        validate_id("session", session)?;
        if let Some(u) = user {
            validate_id("user", u)?;
        }
        let s = |v: &[&str]| Namespace {
            segments: v.iter().map(|x| (*x).to_owned()).collect(),
        };
        Ok(match (scope, user) {
            (Scope::Global, _) => s(&["global"]),
            (Scope::Agent, _) => s(&["agents", agent, "shared"]),
            (Scope::User, Some(u)) => s(&["agents", agent, "users", u, "home"]),
            (Scope::Session, Some(u)) => s(&["agents", agent, "users", u, "sessions", session]),
            (Scope::User | Scope::Session, None) => {
                s(&["agents", agent, "anonymous", "sessions", session])
            }
        })
    }

    /// The segments.
    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// As a path prefix (`agents/a/users/u/home`).
    pub fn path(&self) -> FsPath {
        // Every segment passed validate_id or is a fixed word, so this cannot fail; fall back
        // to an unreachable-by-ids name rather than panicking.
        FsPath::parse(&self.segments.join("/"))
            .unwrap_or_else(|_| FsPath::parse("invalid-namespace").unwrap_or_default())
    }

    /// As a key prefix joined with `sep` (`agents:a:users:u:home` for `':'`).
    pub fn key(&self, sep: char) -> String {
        self.segments.join(&sep.to_string())
    }
}

/// A tenant's view of shared storage: `store` below the namespace prefix, over the
/// read-only `template` when there is one (reads fall through, writes go to the tenant).
pub fn tenant_fs(
    store: Arc<dyn Filesystem>,
    namespace: &Namespace,
    template: Option<Arc<dyn Filesystem>>,
) -> Arc<dyn Filesystem> {
    let upper: Arc<dyn Filesystem> = Arc::new(PrefixFs::new(store, namespace.path()));
    match template {
        Some(t) => Arc::new(OverlayFs::new(upper, Arc::new(ReadOnlyFs::new(t)))),
        None => upper,
    }
}

/// How a caller's view of shared storage is chosen: per call, the namespace is derived from
/// the agent id, the caller's user and session ([`Namespace::derive`]) and the caller sees only
/// [`tenant_fs`] of it. The file tools (`hame-tools`) do this for every call.
#[derive(Debug, Clone)]
pub struct Isolation {
    /// The agent id (validated per call).
    pub agent_id: String,
    /// The scope; [`Scope::User`] by default.
    pub scope: Scope,
    /// The shared read-only template (`AGENTS.md`, `knowledge/`, `skills/`), if any.
    pub template: Option<Arc<dyn Filesystem>>,
}

impl Isolation {
    /// User scope, no template.
    pub fn new(agent_id: impl Into<String>) -> Self {
        Isolation {
            agent_id: agent_id.into(),
            scope: Scope::default(),
            template: None,
        }
    }

    /// The filesystem the caller `(user, session)` sees: [`tenant_fs`] of
    /// `Namespace::derive(agent_id, user, session, scope)` over `store`, with the template.
    pub fn fs_for(
        &self,
        store: &Arc<dyn Filesystem>,
        user: Option<&str>,
        session: &str,
    ) -> Result<Arc<dyn Filesystem>> {
        let ns = Namespace::derive(&self.agent_id, user, session, self.scope)?;
        Ok(tenant_fs(store.clone(), &ns, self.template.clone()))
    }
}

#[cfg(test)]
#[path = "namespace_tests.rs"]
mod tests;
