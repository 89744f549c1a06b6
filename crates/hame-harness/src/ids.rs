//! Validation of ids that end up in paths and keys.

use crate::error::{Error, Result};

/// Longest accepted id, in bytes (the namespace rule of `hame-fs`).
pub const MAX_ID_LEN: usize = hame_id::MAX_ID_LEN;

/// Checks an id that comes from a caller with the one rule every layer shares
/// ([`hame_id::validate_external`]): `[A-Za-z0-9._@-]{1,128}`, not starting with `.`,
/// without `..`, and not starting with the reserved `_memory` or `_sandbox`. So an id can never name a
/// parent directory or another tenant's namespace, and an id the harness accepts is
/// accepted by the namespace, the state key and the session log alike.
pub fn validate_id(what: &'static str, id: &str) -> Result<()> {
    hame_id::validate_external(what, id).map_err(|e| Error::InvalidId(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_hostile_ids() {
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a\\b",
            "../x",
            "a\0b",
            "ü",
            "a..b",
            "_memory",
            "_sandbox-00ff",
            &"x".repeat(129),
        ] {
            assert!(validate_id("id", bad).is_err(), "{bad:?} accepted");
        }
        for good in ["alice", "s-1", "user@example.com", "a.b_c"] {
            assert!(validate_id("id", good).is_ok(), "{good:?} refused");
        }
    }
}
