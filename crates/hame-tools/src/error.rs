//! `hame_fs::Error` as a model-facing [`ToolError`].

use hame_core::ToolError;

/// Turns a storage error into the [`ToolError`] the model sees, keeping its stable code
/// ([`hame_fs::Error::code`]). A `backend_error` shows only its summary: the backend's
/// cause (which may name host paths or servers) stays out of the model's context.
///
/// A trait rather than `From`, because neither type belongs to this crate.
pub trait ToToolError {
    /// The tool error for `self`.
    fn to_tool_error(&self) -> ToolError;
}

impl ToToolError for hame_fs::Error {
    fn to_tool_error(&self) -> ToolError {
        let message = match self {
            hame_fs::Error::Backend { message, .. } => format!("storage error: {message}"),
            other => other.to_string(),
        };
        ToolError::new(self.code(), message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn codes_are_kept_and_backend_causes_hidden() {
        let e = hame_fs::Error::backend("cannot reach the store", std::io::Error::other("/srv/x"));
        assert_eq!(
            e.to_tool_error(),
            ToolError::new("backend_error", "storage error: cannot reach the store")
        );
        let e = hame_fs::Error::NotFound { path: "/a".into() };
        assert_eq!(
            e.to_tool_error(),
            ToolError::new("file_not_found", "/a: no such file or directory")
        );
    }

    #[test]
    fn invalid_arguments_is_the_core_code() {
        // hame-fs spells the code itself (it does not depend on hame-core); both must agree.
        assert_eq!(
            hame_fs::codes::INVALID_ARGUMENTS,
            hame_core::codes::INVALID_ARGUMENTS
        );
        assert_eq!(
            hame_fs::Error::invalid_argument("x").to_tool_error().code,
            hame_core::codes::INVALID_ARGUMENTS
        );
    }
}
