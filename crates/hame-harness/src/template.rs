//! The shared template view of the workspace: everything but the runtime data roots.
//!
//! In local mode the workspace directory holds both the template (`AGENTS.md`,
//! `knowledge/`, `skills/`, ...) and every tenant's runtime data (under `agents/` and
//! `global/`, see `hame_fs::Namespace`). Tenants read the template through an overlay, so
//! the template must not show the runtime roots, or one tenant could read another's files
//! through it. This wrapper hides them: paths under a hidden root do not exist, listings and
//! searches leave them out. It is read-only. It implements every `Filesystem` method
//! (through `hame_fs::forward_filesystem!`) and runs the read-only conformance suite.

use std::sync::Arc;

use hame_fs::{
    AppendOptions, DeleteOptions, EditOutcome, EditRequest, Error, FileInfo, Filesystem, FsPath,
    GlobOutput, GlobRequest, GrepOutput, GrepRequest, ListRequest, Listing, RenameOptions, Result,
    Version, WriteOptions, generic,
};

/// Top-level directories that hold runtime data and never appear in the template.
pub const RUNTIME_ROOTS: &[&str] = &["agents", "global"];

/// A read-only view of `inner` without the [`RUNTIME_ROOTS`].
#[derive(Debug, Clone)]
pub struct TemplateFs {
    inner: Arc<dyn Filesystem>,
}

impl TemplateFs {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Filesystem>) -> Self {
        Self { inner }
    }

    fn hidden(path: &FsPath) -> bool {
        path.segments()
            .next()
            .is_some_and(|first| RUNTIME_ROOTS.contains(&first))
    }

    fn check(path: &FsPath) -> Result<()> {
        if Self::hidden(path) {
            return Err(Error::NotFound {
                path: path.as_str().to_owned(),
            });
        }
        Ok(())
    }

    fn read_only(path: &FsPath) -> Error {
        Error::PermissionDenied {
            path: path.as_str().to_owned(),
            reason: "the workspace template is read-only".into(),
        }
    }
}

// Every method is written out (none forwarded blindly): each one applies the hiding rule.
// `forward_filesystem!` refuses to compile if one is missing.
hame_fs::forward_filesystem! {
    impl Filesystem for TemplateFs {
        async fn stat(&self, path: &FsPath) -> Result<FileInfo> {
            Self::check(path)?;
            self.inner.stat(path).await
        }

        async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
            Self::check(path)?;
            let mut entries = self.inner.list(path).await?;
            entries.retain(|e| !Self::hidden(&e.path));
            Ok(entries)
        }

        async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
            Self::check(path)?;
            self.inner.read_bytes(path).await
        }

        async fn exists(&self, path: &FsPath) -> Result<bool> {
            if Self::hidden(path) {
                return Ok(false);
            }
            self.inner.exists(path).await
        }

        async fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
            Self::check(path)?;
            self.inner.read_range(path, offset, len).await
        }

        async fn write(
            &self,
            path: &FsPath,
            _data: Vec<u8>,
            _options: WriteOptions,
        ) -> Result<Version> {
            Err(Self::read_only(path))
        }

        async fn delete(&self, path: &FsPath, _options: DeleteOptions) -> Result<()> {
            Err(Self::read_only(path))
        }

        async fn rename(&self, from: &FsPath, _to: &FsPath, _options: RenameOptions) -> Result<()> {
            Err(Self::read_only(from))
        }

        async fn append(&self, path: &FsPath, _data: Vec<u8>, _: AppendOptions) -> Result<()> {
            Err(Self::read_only(path))
        }

        async fn edit(&self, path: &FsPath, _request: &EditRequest) -> Result<EditOutcome> {
            Err(Self::read_only(path))
        }

        async fn grep(&self, request: &GrepRequest) -> Result<GrepOutput> {
            Self::check(&request.path)?;
            if request.path.is_root() {
                // Only a search from the root can reach a hidden root: walk our own
                // (filtered) listing. Below the root, the inner backend's native search sees
                // exactly what we show.
                return generic::grep_via_walk(self, request).await;
            }
            self.inner.grep(request).await
        }

        async fn glob(&self, request: &GlobRequest) -> Result<GlobOutput> {
            Self::check(&request.path)?;
            if request.path.is_root() {
                return generic::glob_via_walk(self, request).await;
            }
            self.inner.glob(request).await
        }

        /// One batch of the inner filesystem, the runtime roots left out of listings of
        /// the root; a recursive listing from the root walks this view, as `glob` does.
        async fn list_many(&self, requests: &[ListRequest]) -> Result<Vec<Result<Listing>>> {
            let mut parts = generic::ListParts::new(requests.len());
            for (i, r) in requests.iter().enumerate() {
                if let Err(e) = Self::check(&r.path) {
                    parts.answer(i, Err(e));
                } else if r.recursive && r.path.is_root() {
                    parts.answer(i, generic::list_one(self, r).await);
                } else if r.recursive {
                    parts.send(i, r.clone());
                } else {
                    // Capped after the hidden entries are left out.
                    parts.send(i, r.uncapped());
                }
            }
            parts
                .finish(self.inner.as_ref(), |i, answer| {
                    let r = &requests[i];
                    match answer {
                        Ok(mut l) if !r.recursive => {
                            l.entries.retain(|e| !Self::hidden(&e.path));
                            Ok(r.answer(l.entries))
                        }
                        other => other,
                    }
                })
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hame_fs::InMemoryFs;

    #[tokio::test]
    async fn conformance_read_only() {
        let mem = Arc::new(InMemoryFs::new());
        hame_fs::conformance::run_read_only(&*mem, &TemplateFs::new(mem.clone())).await;
    }

    #[tokio::test]
    async fn conformance_read_only_on_disk() -> std::result::Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let local: Arc<dyn Filesystem> = Arc::new(hame_fs::LocalFs::new(dir.path())?);
        hame_fs::conformance::run_read_only(&*local, &TemplateFs::new(local.clone())).await;
        Ok(())
    }

    #[tokio::test]
    async fn runtime_roots_are_invisible() -> Result<()> {
        let mem = Arc::new(InMemoryFs::new());
        let secret = FsPath::parse("agents/hame/users/bob/home/secret.md")?;
        mem.write(&secret, b"bob's secret".to_vec(), WriteOptions::default())
            .await?;
        mem.write(
            &FsPath::parse("AGENTS.md")?,
            b"persona".to_vec(),
            WriteOptions::default(),
        )
        .await?;
        let t = TemplateFs::new(mem);
        assert!(t.read_bytes(&secret).await.is_err_and(|e| e.is_not_found()));
        let names: Vec<String> = t
            .list(&FsPath::root())
            .await?
            .into_iter()
            .map(|e| e.path.as_str().to_owned())
            .collect();
        assert_eq!(names, vec!["AGENTS.md".to_owned()]);
        let mut g = GrepRequest::new("secret");
        g.literal = true;
        assert!(t.grep(&g).await?.matches.is_empty());
        let all = t.glob(&GlobRequest::new("**/*")).await?;
        assert_eq!(all.files.len(), 1);
        assert!(
            t.write(&FsPath::parse("x")?, vec![], WriteOptions::default())
                .await
                .is_err()
        );
        Ok(())
    }
}
