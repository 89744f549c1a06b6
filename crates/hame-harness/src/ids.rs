//! Validation of ids that end up in paths and keys.

use crate::error::{Error, Result};

/// Longest accepted id, in bytes.
pub const MAX_ID_LEN: usize = 128;

/// Accepts `[A-Za-z0-9._@-]{1,128}` that is not `.` or `..`: an id can never name a
/// parent directory or another tenant's namespace.
pub fn validate_id(what: &str, id: &str) -> Result<()> {
    let ok_chars = id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
    if id.is_empty() || id.len() > MAX_ID_LEN || !ok_chars || id == "." || id == ".." {
        return Err(Error::InvalidId(format!(
            "{what} {id:?} must be 1-{MAX_ID_LEN} characters of A-Z a-z 0-9 . _ - @ and not `.` or `..`"
        )));
    }
    Ok(())
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
