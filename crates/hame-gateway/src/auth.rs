//! Bearer tokens: `{"tokens": {"<token>": {"user": "<userId>"}}}`; the token decides the user.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::{Error, Result};

/// The tokens the gateway accepts, each with the user it speaks for.
#[derive(Clone)]
pub struct Auth {
    tokens: Vec<(Vec<u8>, String)>,
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
struct Entry {
    user: String,
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

    /// Parses `{"tokens": {"<token>": {"user": "<userId>"}}}`; every user id must be a valid
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
            tokens.push((token.into_bytes(), entry.user));
        }
        Ok(Self { tokens })
    }

    /// The user of `token`, if it is one of ours. Every token is compared in full, so the
    /// time taken does not tell how much of a guess matched.
    pub fn user_of(&self, token: &str) -> Option<&str> {
        let given = token.as_bytes();
        let mut found = None;
        for (t, user) in &self.tokens {
            if constant_time_eq(t, given) {
                found = Some(user.as_str());
            }
        }
        found
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
    }
}
