//! The memory crate's file traits over the caller's workspace filesystem.

use std::sync::Arc;

use async_trait::async_trait;
use hame_fs::{FileKind, Filesystem, FsPath, WriteOptions};
use hame_memory::{MemoryFiles, ResultSink};

/// [`MemoryFiles`] and [`ResultSink`] over one tenant's filesystem (the view a call gets
/// from `Tenancy::fs_for`), so memory files and offloaded results land where the caller's
/// other files do: on local disk in local mode, in the shared store otherwise.
#[derive(Debug, Clone)]
pub(crate) struct FsFiles {
    fs: Arc<dyn Filesystem>,
}

impl FsFiles {
    pub(crate) fn new(fs: Arc<dyn Filesystem>) -> Self {
        Self { fs }
    }
}

fn path(p: &str) -> hame_memory::Result<FsPath> {
    FsPath::parse(p).map_err(|e| hame_memory::Error::files_with(p, "invalid path", e))
}

fn files_err(p: &str, what: &str, e: hame_fs::Error) -> hame_memory::Error {
    hame_memory::Error::files_with(p, what.to_owned(), e)
}

#[async_trait]
impl MemoryFiles for FsFiles {
    async fn read(&self, p: &str) -> hame_memory::Result<Option<String>> {
        match self.fs.read_bytes(&path(p)?).await {
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(files_err(p, "read failed", e)),
        }
    }

    async fn write_atomic(&self, p: &str, content: &str) -> hame_memory::Result<()> {
        self.fs
            .write(
                &path(p)?,
                content.as_bytes().to_vec(),
                WriteOptions::default(),
            )
            .await
            .map(|_| ())
            .map_err(|e| files_err(p, "write failed", e))
    }

    async fn append(&self, p: &str, content: &str) -> hame_memory::Result<()> {
        self.fs
            .append(
                &path(p)?,
                content.as_bytes().to_vec(),
                hame_fs::AppendOptions::default(),
            )
            .await
            .map_err(|e| files_err(p, "append failed", e))
    }

    async fn list(&self, dir: &str) -> hame_memory::Result<Vec<String>> {
        match self.fs.list(&path(dir)?).await {
            Ok(entries) => Ok(entries
                .into_iter()
                .filter(|e| e.kind == FileKind::File)
                .map(|e| e.path.as_str().to_owned())
                .collect()),
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            Err(e) => Err(files_err(dir, "list failed", e)),
        }
    }
}

#[async_trait]
impl ResultSink for FsFiles {
    async fn write(&self, p: &str, content: &str) -> hame_memory::Result<()> {
        self.write_atomic(p, content).await
    }
}
