//! Validation of the ids that become file names.

use crate::error::{Error, Result};

/// Longest accepted agent or session id, in bytes.
pub const MAX_ID_LEN: usize = hame_id::MAX_ID_LEN;

/// Checks that `id` can be used as one file-name segment: the one rule of
/// [`hame_id::validate`] (1–[`MAX_ID_LEN`] bytes of `A-Z a-z 0-9 . _ - @`, not starting with
/// `.`, without `..` anywhere).
pub fn validate_id(what: &'static str, id: &str) -> Result<()> {
    hame_id::validate(what, id).map_err(|e| Error::InvalidId {
        what,
        id: e.id,
        reason: e.reason,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use hame_fs::FsPath;
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// An accepted id is always exactly one plain path segment.
        #[test]
        fn accepted_ids_are_one_segment(id in "[A-Za-z0-9._@/\\\\-]{0,20}|\\PC{0,140}") {
            if validate_id("session id", &id).is_ok() {
                let name = format!("{id}.log.jsonl");
                let path = FsPath::parse(&format!("agents/main/sessions/{name}")).unwrap();
                prop_assert_eq!(path.file_name(), name.as_str());
                prop_assert_eq!(path.segments().count(), 4);
                prop_assert!(!id.starts_with('.') && !id.contains('/'));
            }
        }

        #[test]
        fn ids_with_separators_or_dotdot_are_refused(a in "[a-z]{0,5}", b in "[a-z]{0,5}", sep in prop::sample::select(vec!["/", "\\\\", "..", "\0", "\n", " "])) {
            let id = format!("{a}{sep}{b}");
            prop_assert!(validate_id("session id", &id).is_err());
        }
    }
}
