//! Tenant isolation keyed by a [`RuntimeContext`]: the conveniences `hame-fs` cannot offer
//! because it does not know the agent core.

use std::sync::Arc;

use hame_core::RuntimeContext;
use hame_fs::{Filesystem, Isolation, Namespace, Scope};

/// [`Namespace::derive`] with the user and session of a [`RuntimeContext`].
pub trait NamespaceExt: Sized {
    /// `Namespace::derive(agent, runtime.user_id, runtime.session_id, scope)`.
    fn for_context(agent: &str, runtime: &RuntimeContext, scope: Scope) -> hame_fs::Result<Self>;
}

impl NamespaceExt for Namespace {
    fn for_context(agent: &str, runtime: &RuntimeContext, scope: Scope) -> hame_fs::Result<Self> {
        Namespace::derive(
            agent,
            runtime.user_id.as_deref(),
            &runtime.session_id,
            scope,
        )
    }
}

/// [`Isolation::fs_for`] with the user and session of a [`RuntimeContext`].
pub trait IsolationExt {
    /// The filesystem a call with this runtime context sees.
    fn fs_for_context(
        &self,
        store: &Arc<dyn Filesystem>,
        runtime: &RuntimeContext,
    ) -> hame_fs::Result<Arc<dyn Filesystem>>;
}

impl IsolationExt for Isolation {
    fn fs_for_context(
        &self,
        store: &Arc<dyn Filesystem>,
        runtime: &RuntimeContext,
    ) -> hame_fs::Result<Arc<dyn Filesystem>> {
        self.fs_for(store, runtime.user_id.as_deref(), &runtime.session_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_context_gives_the_same_namespace_as_its_ids() -> hame_fs::Result<()> {
        let rt = RuntimeContext::new("s1").with_user("alice");
        for scope in [Scope::Session, Scope::User, Scope::Agent, Scope::Global] {
            assert_eq!(
                Namespace::for_context("coder", &rt, scope)?,
                Namespace::derive("coder", Some("alice"), "s1", scope)?
            );
        }
        let anon = RuntimeContext::new("s2");
        assert_eq!(
            Namespace::for_context("coder", &anon, Scope::User)?,
            Namespace::derive("coder", None, "s2", Scope::User)?
        );
        Ok(())
    }
}
