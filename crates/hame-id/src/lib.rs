//! # hame-id
//!
//! The one id rule of hame. Agent, user and session ids end up in file names, object keys,
//! Redis keys and SQL rows; every crate (filesystem namespaces, state keys, session logs,
//! the harness, the CLI) checks them with [`validate`], so an id one layer accepts is
//! accepted by all of them, and none can name a parent directory, a separator or another
//! tenant.
//!
//! The rule: 1 to [`MAX_ID_LEN`] bytes of `A-Z a-z 0-9 . _ - @`, not starting with `.`, and
//! without `..` anywhere. Ids that callers pass in from outside (a session id from the CLI
//! or an HTTP request) are also checked with [`validate_external`], which refuses the
//! prefixes [`RESERVED_PREFIXES`] that hame keeps for its own sessions (memory and sandbox
//! leases).
//!
//! It depends on nothing but `thiserror`, so storage crates can use it without the agent
//! core.
//!
//! ```
//! assert!(hame_id::validate("session id", "s-1").is_ok());
//! assert!(hame_id::validate("session id", "a..b").is_err());
//! assert!(hame_id::validate("user id", "alice@example.com").is_ok());
//! assert!(hame_id::validate_external("session id", "_memory").is_err());
//! assert!(hame_id::validate_external("session id", "_sandbox-1f2e").is_err());
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

/// Longest accepted id, in bytes.
pub const MAX_ID_LEN: usize = 128;

/// Ids starting with this are reserved for hame's own records (e.g. the `_memory`
/// consolidation lease); [`validate_external`] refuses them. The first of
/// [`RESERVED_PREFIXES`].
pub const RESERVED_PREFIX: &str = "_memory";

/// Every prefix reserved for hame's own records: `_memory` (the memory consolidation
/// lease) and `_sandbox` (the cross-process lease of a shared sandbox scope).
/// [`validate_external`] refuses ids starting with any of them.
pub const RESERVED_PREFIXES: [&str; 2] = [RESERVED_PREFIX, "_sandbox"];

/// An id that breaks the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {id:?}: {reason}")]
#[non_exhaustive]
pub struct IdError {
    /// What the id is (`"session id"`, `"user id"`, ...).
    pub what: &'static str,
    /// The id, cut to 64 characters.
    pub id: String,
    /// Why it was refused.
    pub reason: &'static str,
}

/// Checks `id` against the one rule (see the [crate docs](crate)).
pub fn validate(what: &'static str, id: &str) -> Result<(), IdError> {
    let bad = |reason: &'static str| IdError {
        what,
        id: id.chars().take(64).collect(),
        reason,
    };
    if id.is_empty() {
        return Err(bad("it is empty"));
    }
    if id.len() > MAX_ID_LEN {
        return Err(bad("it is longer than 128 bytes"));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'))
    {
        return Err(bad("only A-Z a-z 0-9 . _ - @ are allowed"));
    }
    if id.starts_with('.') {
        return Err(bad("it must not start with `.`"));
    }
    if id.contains("..") {
        return Err(bad("it must not contain `..`"));
    }
    Ok(())
}

/// [`validate`], and refuses ids hame reserves for itself ([`RESERVED_PREFIXES`]). Use it for
/// ids that come from outside (CLI flags, HTTP paths, library callers).
pub fn validate_external(what: &'static str, id: &str) -> Result<(), IdError> {
    validate(what, id)?;
    if RESERVED_PREFIXES.iter().any(|p| id.starts_with(p)) {
        return Err(IdError {
            what,
            id: id.chars().take(64).collect(),
            reason: "ids starting with `_memory` or `_sandbox` are reserved for hame",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hostile_ids_are_refused() {
        let long = "x".repeat(129);
        for bad in [
            "", ".", "..", "a/b", "a\\b", "../x", "x..y", ".hidden", "a b", "a:b", "é", "a\0b",
            "ü", &long,
        ] {
            assert!(validate("id", bad).is_err(), "{bad:?} accepted");
        }
        for good in [
            "alice",
            "s-1",
            "user@example.com",
            "a.b_c",
            "_x",
            &"x".repeat(128),
        ] {
            assert!(validate("id", good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn reserved_ids_are_refused_from_outside() {
        assert!(validate("session id", "_memory-ab").is_ok());
        let e = validate_external("session id", "_memory-ab").err();
        assert_eq!(
            e.map(|e| e.reason),
            Some("ids starting with `_memory` or `_sandbox` are reserved for hame")
        );
        assert!(validate_external("user id", "_sandbox").is_err());
        assert!(validate_external("session id", "_sandbox-0123abcd").is_err());
        assert!(validate_external("session id", "memory").is_ok());
        assert!(validate_external("session id", "sandbox").is_ok());
    }

    proptest! {
        /// An accepted id is one plain path segment: no separator, never `.` or `..`, and
        /// joining it to a prefix never climbs out of it.
        #[test]
        fn accepted_ids_are_one_plain_segment(id in "[A-Za-z0-9._@/\\\\:-]{0,20}|\\PC{0,140}") {
            if validate("id", &id).is_ok() {
                prop_assert!(!id.contains('/') && !id.contains('\\') && !id.contains(':'));
                prop_assert!(id != "." && id != ".." && !id.contains(".."));
                prop_assert!(id.len() <= MAX_ID_LEN && !id.is_empty());
            }
        }
    }
}
