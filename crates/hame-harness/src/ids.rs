//! Validation of ids that end up in paths and keys.

use crate::error::{Error, Result};

/// Longest accepted id, in bytes (the namespace rule of `hame-fs`).
pub const MAX_ID_LEN: usize = hame_fs::MAX_ID_BYTES;

/// Checks an id with the one rule every layer shares, [`hame_fs::validate_id`]:
/// `[A-Za-z0-9._@-]{1,128}`, not starting with `.`. So an id can never name a parent
/// directory or another tenant's namespace, and an id the harness accepts is accepted by
/// the namespace, the state key and the session log alike.
pub fn validate_id(what: &str, id: &str) -> Result<()> {
    hame_fs::validate_id(what, id).map_err(|e| Error::InvalidId(format!("{what} {id:?}: {e}")))
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
            &"x".repeat(129),
        ] {
            assert!(validate_id("id", bad).is_err(), "{bad:?} accepted");
        }
        for good in ["alice", "s-1", "user@example.com", "a.b_c"] {
            assert!(validate_id("id", good).is_ok(), "{good:?} refused");
        }
    }
}
