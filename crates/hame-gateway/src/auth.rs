//! Bearer tokens: `{"tokens": {"<token>": {"user": "<userId>", "agents": ["<agentId>", ...]}}}`;
//! the token decides the user and, with `agents`, the served agents it may use (without
//! it: every one).

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::{Error, Result};

/// The tokens the gateway accepts, each with the user it speaks for.
#[derive(Clone)]
pub struct Auth {
    tokens: Vec<(Vec<u8>, Grant)>,
}

/// What one token speaks for: a user, and the agents it may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The user id.
    pub user: String,
    /// The agent ids the token may use (`None`: every served agent).
    pub agents: Option<Vec<String>>,
}

impl Grant {
    /// Whether the token may use the agent `name`.
    pub fn may_use(&self, name: &str) -> bool {
        self.agents
            .as_ref()
            .is_none_or(|a| a.iter().any(|n| n == name))
    }
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens themselves.
        f.debug_struct("Auth")
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tokens: HashMap<String, Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    user: String,
    #[serde(default)]
    agents: Option<Vec<String>>,
}

impl Auth {
    /// Reads an auth file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Auth {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_json(&text).map_err(|e| match e {
            Error::Auth { message, .. } => Error::Auth {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    /// Parses `{"tokens": {"<token>": {"user": "<userId>", "agents": ["<agentId>"]}}}`
    /// (`agents` optional; when given, not empty); every user and agent id must be a valid
    /// id and every token non-empty.
    pub fn from_json(text: &str) -> Result<Self> {
        let bad = |message: String| Error::Auth {
            path: "-".into(),
            message,
        };
        let file: File = serde_json::from_str(text).map_err(|e| {
            bad(format!(
                "{e} (expected {{\"tokens\": {{\"<token>\": {{\"user\": \"<userId>\"}}}}}})"
            ))
        })?;
        if file.tokens.is_empty() {
            return Err(bad("no tokens".into()));
        }
        let mut tokens = Vec::new();
        for (token, entry) in file.tokens {
            if token.trim().is_empty() {
                return Err(bad("an empty token".into()));
            }
            hame::harness::validate_id("user id", &entry.user)
                .map_err(|e| bad(format!("user of a token: {e}")))?;
            if let Some(agents) = &entry.agents {
                if agents.is_empty() {
                    return Err(bad(format!(
                        "the token of user {} has an empty `agents` list (leave it out for every agent)",
                        entry.user
                    )));
                }
                for a in agents {
                    hame::harness::validate_id("agent id", a)
                        .map_err(|e| bad(format!("agents of a token: {e}")))?;
                }
            }
            tokens.push((
                token.into_bytes(),
                Grant {
                    user: entry.user,
                    agents: entry.agents,
                },
            ));
        }
        Ok(Self { tokens })
    }

    /// The user of `token`, if it is one of ours. Every token is compared in full, so the
    /// time taken does not tell how much of a guess matched.
    pub fn user_of(&self, token: &str) -> Option<&str> {
        self.grant_of(token).map(|g| g.user.as_str())
    }

    /// What `token` speaks for, if it is one of ours (compared like [`user_of`](Self::user_of)).
    pub fn grant_of(&self, token: &str) -> Option<&Grant> {
        let given = token.as_bytes();
        let mut found = None;
        for (t, grant) in &self.tokens {
            if constant_time_eq(t, given) {
                found = Some(grant);
            }
        }
        found
    }

    /// Every agent id some token is limited to (the gateway refuses ids it does not serve).
    pub fn agent_ids(&self) -> impl Iterator<Item = &str> {
        self.tokens
            .iter()
            .filter_map(|(_, g)| g.agents.as_ref())
            .flatten()
            .map(String::as_str)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_decide_the_user() -> Result<()> {
        let auth =
            Auth::from_json(r#"{"tokens": {"t1": {"user": "alice"}, "t2": {"user": "bob"}}}"#)?;
        assert_eq!(auth.user_of("t1"), Some("alice"));
        assert_eq!(auth.user_of("t2"), Some("bob"));
        assert_eq!(auth.user_of("t3"), None);
        assert_eq!(auth.user_of(""), None);
        Ok(())
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(Auth::from_json("{}").is_err());
        assert!(Auth::from_json(r#"{"tokens": {}}"#).is_err());
        assert!(Auth::from_json(r#"{"tokens": {"t": {"user": "../x"}}}"#).is_err());
        assert!(Auth::from_json(r#"{"tokens": {"t": {}}}"#).is_err());
        assert!(Auth::from_json(r#"{"tokens": {"t": {"user": "a", "agents": []}}}"#).is_err());
        assert!(
            Auth::from_json(r#"{"tokens": {"t": {"user": "a", "agents": ["../x"]}}}"#).is_err()
        );
        assert!(Auth::from_json(r#"{"tokens": {"t": {"user": "a", "agent": ["x"]}}}"#).is_err());
    }

    #[test]
    fn tokens_may_be_limited_to_agents() -> Result<()> {
        let auth = Auth::from_json(
            r#"{"tokens": {"t1": {"user": "alice", "agents": ["support"]}, "t2": {"user": "bob"}}}"#,
        )?;
        let alice = auth.grant_of("t1").cloned();
        assert_eq!(
            alice,
            Some(Grant {
                user: "alice".into(),
                agents: Some(vec!["support".into()])
            })
        );
        assert!(alice.as_ref().is_some_and(|g| g.may_use("support")));
        assert!(!alice.as_ref().is_some_and(|g| g.may_use("sales")));
        assert!(auth.grant_of("t2").is_some_and(|g| g.may_use("sales")));
        assert_eq!(auth.agent_ids().collect::<Vec<_>>(), vec!["support"]);
        Ok(())
    }
}
