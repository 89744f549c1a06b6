//! [`CountingFs`]: a wrapper that counts the operations made through it and the bytes it
//! read, for tests and benchmarks that hold a layer to a number of file operations (each
//! one is a Redis or S3 round trip in store mode).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::{
    AppendOptions, DeleteOptions, EditOutcome, EditRequest, FileInfo, Filesystem, FsPath,
    GlobOutput, GlobRequest, GrepOutput, GrepRequest, ListRequest, Listing, RenameOptions, Result,
    Version, WriteOptions,
};

/// What went through a [`CountingFs`]: operations by method name, and the bytes returned
/// by `read_bytes` and `read_range`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsCounts {
    /// Calls per method (`stat`, `read_bytes`, `read_range`, ...).
    pub ops: BTreeMap<&'static str, u64>,
    /// Bytes returned by `read_bytes` and `read_range`.
    pub bytes_read: u64,
}

impl FsCounts {
    /// Calls of `method`.
    pub fn of(&self, method: &str) -> u64 {
        self.ops.get(method).copied().unwrap_or(0)
    }

    /// Calls of every method.
    pub fn total(&self) -> u64 {
        self.ops.values().sum()
    }
}

/// Counts every operation made through it, then forwards it unchanged to `inner`.
///
/// ```
/// # async fn demo() -> hame_fs::Result<()> {
/// use std::sync::Arc;
/// use hame_fs::{CountingFs, Filesystem, FsPath, InMemoryFs, WriteOptions};
/// let fs = CountingFs::new(Arc::new(InMemoryFs::new()));
/// let path = FsPath::parse("a.txt")?;
/// fs.write(&path, b"hello".to_vec(), WriteOptions::default()).await?;
/// fs.read_bytes(&path).await?;
/// let counts = fs.counts();
/// assert_eq!((counts.of("write"), counts.of("read_bytes"), counts.bytes_read), (1, 1, 5));
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct CountingFs {
    inner: Arc<dyn Filesystem>,
    ops: Arc<Mutex<BTreeMap<&'static str, u64>>>,
    bytes_read: Arc<AtomicU64>,
}

impl CountingFs {
    /// Wraps `inner`, with every count at zero.
    pub fn new(inner: Arc<dyn Filesystem>) -> Self {
        Self {
            inner,
            ops: Arc::default(),
            bytes_read: Arc::default(),
        }
    }

    /// What was counted so far (clones share their counts).
    pub fn counts(&self) -> FsCounts {
        FsCounts {
            ops: self.ops.lock().map(|o| o.clone()).unwrap_or_default(),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
        }
    }

    /// Sets every count back to zero.
    pub fn reset(&self) {
        if let Ok(mut ops) = self.ops.lock() {
            ops.clear();
        }
        self.bytes_read.store(0, Ordering::Relaxed);
    }

    fn count(&self, method: &'static str) {
        if let Ok(mut ops) = self.ops.lock() {
            *ops.entry(method).or_default() += 1;
        }
    }

    fn read(&self, data: Result<Vec<u8>>) -> Result<Vec<u8>> {
        if let Ok(d) = &data {
            self.bytes_read.fetch_add(d.len() as u64, Ordering::Relaxed);
        }
        data
    }
}

crate::forward_filesystem! {
    impl Filesystem for CountingFs {
        async fn stat(&self, path: &FsPath) -> Result<FileInfo> {
            self.count("stat");
            self.inner.stat(path).await
        }

        async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
            self.count("list");
            self.inner.list(path).await
        }

        async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
            self.count("read_bytes");
            self.read(self.inner.read_bytes(path).await)
        }

        async fn exists(&self, path: &FsPath) -> Result<bool> {
            self.count("exists");
            self.inner.exists(path).await
        }

        async fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
            self.count("read_range");
            self.read(self.inner.read_range(path, offset, len).await)
        }

        async fn write(&self, path: &FsPath, data: Vec<u8>, options: WriteOptions) -> Result<Version> {
            self.count("write");
            self.inner.write(path, data, options).await
        }

        async fn delete(&self, path: &FsPath, options: DeleteOptions) -> Result<()> {
            self.count("delete");
            self.inner.delete(path, options).await
        }

        async fn rename(&self, from: &FsPath, to: &FsPath, options: RenameOptions) -> Result<()> {
            self.count("rename");
            self.inner.rename(from, to, options).await
        }

        async fn append(&self, path: &FsPath, data: Vec<u8>, options: AppendOptions) -> Result<()> {
            self.count("append");
            self.inner.append(path, data, options).await
        }

        async fn edit(&self, path: &FsPath, request: &EditRequest) -> Result<EditOutcome> {
            self.count("edit");
            self.inner.edit(path, request).await
        }

        async fn grep(&self, request: &GrepRequest) -> Result<GrepOutput> {
            self.count("grep");
            self.inner.grep(request).await
        }

        async fn glob(&self, request: &GlobRequest) -> Result<GlobOutput> {
            self.count("glob");
            self.inner.glob(request).await
        }

        async fn list_many(&self, requests: &[ListRequest]) -> Result<Vec<Result<Listing>>> {
            self.count("list_many");
            self.inner.list_many(requests).await
        }
    }
}
