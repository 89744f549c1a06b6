//! Validation of the ids that become file names.

use crate::error::{Error, Result};

/// Longest accepted agent or session id, in bytes.
pub const MAX_ID_LEN: usize = 128;

/// Checks that `id` can be used as one file-name segment: 1–[`MAX_ID_LEN`] bytes of
/// `A-Z a-z 0-9 . _ - @`, not starting with `.`, and without `..` anywhere. The character set
/// is the harness's id rule; the two extra rules keep ids from ever looking like a parent
/// directory or a hidden file.
pub fn validate_id(what: &'static str, id: &str) -> Result<()> {
    let bad = |reason: &'static str| Error::InvalidId {
        what,
        id: id.chars().take(200).collect(),
        reason,
    };
    if id.is_empty() {
        return Err(bad("it is empty"));
    }
    if id.len() > MAX_ID_LEN {
        return Err(bad("it is longer than 128 bytes"));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
    {
        return Err(bad("only A-Z a-z 0-9 . _ - @ are allowed (no `/`)"));
    }
    if id.starts_with('.') || id.contains("..") {
        return Err(bad("it must not start with `.` or contain `..`"));
    }
    Ok(())
}
