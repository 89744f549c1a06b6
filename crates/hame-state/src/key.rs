//! [`StateKey`]: the validated address of one session's state.

use std::fmt;

use crate::error::{Error, Result};

/// Longest accepted agent, user or session id, in bytes.
pub const MAX_ID_LEN: usize = hame_id::MAX_ID_LEN;

/// The address of one session's state: `(agent, user, session)`.
///
/// Every part is validated on construction, so a key can be used as a file name, a Redis key
/// segment or a SQL value without escaping, and can never address another tenant's data:
///
/// - 1 to [`MAX_ID_LEN`] bytes;
/// - only ASCII letters, digits and `_ - . @`;
/// - not starting with `.` (so never `.` or `..`, never a hidden file) and never containing `..`.
///
/// `user: None` is the anonymous tenant; it is a namespace of its own and never sees the
/// sessions of any named user (and the other way round).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateKey {
    agent: String,
    user: Option<String>,
    session: String,
}

impl StateKey {
    /// Builds a key, validating every id.
    pub fn new(
        agent: impl Into<String>,
        user: Option<impl Into<String>>,
        session: impl Into<String>,
    ) -> Result<Self> {
        let agent = agent.into();
        let user = user.map(Into::into);
        let session = session.into();
        validate_id("agent", &agent)?;
        if let Some(u) = &user {
            validate_id("user", u)?;
        }
        validate_id("session", &session)?;
        Ok(Self {
            agent,
            user,
            session,
        })
    }

    /// The agent id.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The user id; `None` for the anonymous tenant.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The session id.
    pub fn session(&self) -> &str {
        &self.session
    }
}

impl fmt::Display for StateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.user {
            Some(u) => write!(f, "{}/user:{}/{}", self.agent, u, self.session),
            None => write!(f, "{}/anonymous/{}", self.agent, self.session),
        }
    }
}

/// Checks one id with the one rule of [`hame_id::validate`].
pub fn validate_id(field: &'static str, value: &str) -> Result<()> {
    hame_id::validate(field, value).map_err(|e| Error::InvalidId {
        field,
        value: e.id,
        reason: e.reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_traversal_and_separators() {
        for bad in [
            "", ".", "..", "a/b", "a\\b", "../x", "x..y", ".hidden", "a b", "a:b", "é", "a\0",
        ] {
            assert!(
                StateKey::new("agent", None::<String>, bad).is_err(),
                "{bad:?} accepted"
            );
            assert!(
                StateKey::new(bad, None::<String>, "s").is_err(),
                "{bad:?} accepted"
            );
            assert!(
                StateKey::new("a", Some(bad), "s").is_err(),
                "{bad:?} accepted"
            );
        }
        assert!(StateKey::new("a", None::<String>, "x".repeat(MAX_ID_LEN + 1)).is_err());
    }

    #[test]
    fn accepts_documented_charset() -> Result<()> {
        let key = StateKey::new("my-agent_1", Some("alice@example.com"), "s.2024-01")?;
        assert_eq!(key.agent(), "my-agent_1");
        assert_eq!(key.user(), Some("alice@example.com"));
        assert_eq!(key.session(), "s.2024-01");
        assert_eq!(
            key.to_string(),
            "my-agent_1/user:alice@example.com/s.2024-01"
        );
        StateKey::new("a", None::<String>, "x".repeat(MAX_ID_LEN))?;
        Ok(())
    }

    proptest! {
        #[test]
        fn valid_ids_are_single_safe_path_segments(id in "\\PC{0,140}") {
            if validate_id("session", &id).is_ok() {
                prop_assert!(!id.is_empty() && id.len() <= MAX_ID_LEN);
                prop_assert!(!id.contains('/') && !id.contains('\\') && !id.contains(':'));
                prop_assert!(!id.contains("..") && !id.starts_with('.'));
                let p = std::path::Path::new(&id);
                prop_assert_eq!(p.components().count(), 1);
                prop_assert!(matches!(p.components().next(), Some(std::path::Component::Normal(_))));
            }
        }

        #[test]
        fn charset_ids_are_accepted(id in "[A-Za-z0-9_@-][A-Za-z0-9_@-]{0,127}") {
            prop_assert!(validate_id("session", &id).is_ok());
        }
    }
}
