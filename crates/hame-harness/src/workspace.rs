//! Where the workspace is, and how the harness reads it.

use std::path::{Path, PathBuf};

/// Environment variable naming the workspace directory.
pub const WORKSPACE_ENV: &str = "HAME_WORKSPACE";
/// Workspace used when neither the builder nor the environment names one.
pub const DEFAULT_WORKSPACE: &str = ".hame/workspace";

/// Resolves the workspace: the builder's value, else `HAME_WORKSPACE`, else
/// `./.hame/workspace`. Blank values count as unset. `env` looks up environment variables
/// (pass `|k| std::env::var(k).ok()`), so callers and tests need not touch the process env.
pub fn resolve_workspace(explicit: Option<&Path>, env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(p) =
        explicit.filter(|p| !p.as_os_str().is_empty() && !p.to_string_lossy().trim().is_empty())
    {
        return p.to_path_buf();
    }
    if let Some(v) = env(WORKSPACE_ENV).filter(|v| !v.trim().is_empty()) {
        return PathBuf::from(v);
    }
    PathBuf::from(DEFAULT_WORKSPACE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn resolution_order() {
        let none = |_: &str| None;
        let set = |k: &str| (k == WORKSPACE_ENV).then(|| "/env/ws".to_owned());
        let blank = |_: &str| Some("  ".to_owned());
        assert_eq!(
            resolve_workspace(Some(Path::new("/b")), &set),
            PathBuf::from("/b")
        );
        assert_eq!(
            resolve_workspace(Some(Path::new(" ")), &set),
            PathBuf::from("/env/ws")
        );
        assert_eq!(resolve_workspace(None, &set), PathBuf::from("/env/ws"));
        assert_eq!(
            resolve_workspace(None, &blank),
            PathBuf::from(DEFAULT_WORKSPACE)
        );
        assert_eq!(
            resolve_workspace(None, &none),
            PathBuf::from(DEFAULT_WORKSPACE)
        );
    }
}
