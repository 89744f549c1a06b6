//! Wrappers: [`PrefixFs`] (isolation), [`ReadOnlyFs`], [`CompositeFs`] (routing) and
//! [`OverlayFs`] (template below, writable store above). Each implements every method of
//! [`Filesystem`] through [`forward_filesystem!`](crate::forward_filesystem).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fs::{
    AppendOptions, DeleteOptions, EditOutcome, EditRequest, FileInfo, Filesystem, GlobOutput,
    GlobRequest, GrepOutput, GrepRequest, ListRequest, Listing, RenameOptions, Version, WriteMode,
    WriteOptions,
};
use crate::generic;
use crate::path::FsPath;

fn strip_error(prefix: &FsPath) -> impl Fn(&str) -> String + '_ {
    move |s: &str| match FsPath::parse(s) {
        Ok(p) => p
            .strip_prefix(prefix)
            .map(|r| r.to_string())
            .unwrap_or_else(|| s.to_owned()),
        Err(_) => s.to_owned(),
    }
}

/// Serves a subtree of another filesystem as its root: `/x` here is `<prefix>/x` below.
/// Paths cannot leave the prefix because [`FsPath`] has no `..`. This is the isolation
/// wrapper: a tenant gets `PrefixFs::new(store, namespace.path())`.
#[derive(Debug, Clone)]
pub struct PrefixFs<F> {
    inner: F,
    prefix: FsPath,
}

impl<F: Filesystem> PrefixFs<F> {
    /// Wraps `inner`, rooted at `prefix`.
    pub fn new(inner: F, prefix: FsPath) -> Self {
        PrefixFs { inner, prefix }
    }

    /// The prefix.
    pub fn prefix(&self) -> &FsPath {
        &self.prefix
    }

    fn full(&self, p: &FsPath) -> FsPath {
        self.prefix.join_path(p)
    }

    fn strip(&self, p: FsPath) -> FsPath {
        p.strip_prefix(&self.prefix).unwrap_or(p)
    }

    fn err(&self, e: Error) -> Error {
        e.map_path(strip_error(&self.prefix))
    }

    fn info(&self, mut f: FileInfo) -> FileInfo {
        f.path = self.strip(f.path);
        f
    }

    /// The inner answer to a search from `base`, errors mapped. A tenant root that does not
    /// exist yet (nothing written) is an empty answer, once `check` accepts the request.
    fn searched<T: Default>(
        &self,
        base: &FsPath,
        answer: Result<T>,
        check: impl FnOnce() -> Result<()>,
    ) -> Result<T> {
        match answer {
            Err(Error::NotFound { .. }) if base.is_root() => check().map(|()| T::default()),
            other => other.map_err(|e| self.err(e)),
        }
    }
}

crate::forward_filesystem! {
    impl[F: Filesystem] Filesystem for PrefixFs<F> {
        async fn stat(&self, path: &FsPath) -> Result<FileInfo> {
            match self.inner.stat(&self.full(path)).await {
                Ok(i) => Ok(self.info(i)),
                // The tenant's root exists even before the first write.
                Err(Error::NotFound { .. }) if path.is_root() => Ok(FileInfo::dir(FsPath::root())),
                Err(e) => Err(self.err(e)),
            }
        }
        async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
            match self.inner.list(&self.full(path)).await {
                Ok(v) => Ok(v.into_iter().map(|f| self.info(f)).collect()),
                Err(Error::NotFound { .. }) if path.is_root() => Ok(Vec::new()),
                Err(e) => Err(self.err(e)),
            }
        }
        async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
            self.inner
                .read_bytes(&self.full(path))
                .await
                .map_err(|e| self.err(e))
        }
        async fn write(&self, path: &FsPath, data: Vec<u8>, opts: WriteOptions) -> Result<Version> {
            if path.is_root() {
                return Err(Error::IsDirectory {
                    path: path.to_string(),
                });
            }
            self.inner
                .write(&self.full(path), data, opts)
                .await
                .map_err(|e| self.err(e))
        }
        async fn delete(&self, path: &FsPath, options: DeleteOptions) -> Result<()> {
            if path.is_root() {
                return Err(Error::PermissionDenied {
                    path: path.to_string(),
                    reason: "the root cannot be deleted".into(),
                });
            }
            self.inner
                .delete(&self.full(path), options)
                .await
                .map_err(|e| self.err(e))
        }
        async fn rename(&self, from: &FsPath, to: &FsPath, options: RenameOptions) -> Result<()> {
            if from.is_root() || to.is_root() {
                return Err(Error::PermissionDenied {
                    path: from.to_string(),
                    reason: "the root cannot be moved or replaced".into(),
                });
            }
            self.inner
                .rename(&self.full(from), &self.full(to), options)
                .await
                .map_err(|e| self.err(e))
        }
        async fn exists(&self, path: &FsPath) -> Result<bool> {
            if path.is_root() {
                return Ok(true);
            }
            self.inner
                .exists(&self.full(path))
                .await
                .map_err(|e| self.err(e))
        }
        async fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
            self.inner
                .read_range(&self.full(path), offset, len)
                .await
                .map_err(|e| self.err(e))
        }
        async fn append(&self, path: &FsPath, data: Vec<u8>, options: AppendOptions) -> Result<()> {
            self.inner
                .append(&self.full(path), data, options)
                .await
                .map_err(|e| self.err(e))
        }
        async fn edit(&self, path: &FsPath, request: &EditRequest) -> Result<EditOutcome> {
            self.inner
                .edit(&self.full(path), request)
                .await
                .map_err(|e| self.err(e))
        }
        async fn grep(&self, request: &GrepRequest) -> Result<GrepOutput> {
            let req = GrepRequest {
                path: self.full(&request.path),
                ..request.clone()
            };
            let answer = self.inner.grep(&req).await;
            let check = || generic::GrepSearch::new(request).map(drop);
            let mut out = self.searched(&request.path, answer, check)?;
            for m in &mut out.matches {
                m.path = self.strip(std::mem::take(&mut m.path));
            }
            Ok(out)
        }
        async fn glob(&self, request: &GlobRequest) -> Result<GlobOutput> {
            let req = GlobRequest {
                path: self.full(&request.path),
                ..request.clone()
            };
            let answer = self.inner.glob(&req).await;
            let check = || generic::compile_glob(&request.pattern).map(drop);
            let mut out = self.searched(&request.path, answer, check)?;
            out.files = out.files.into_iter().map(|f| self.info(f)).collect();
            Ok(out)
        }
        async fn list_many(&self, requests: &[ListRequest]) -> Result<Vec<Result<Listing>>> {
            let inner: Vec<ListRequest> = requests
                .iter()
                .map(|r| ListRequest {
                    path: self.full(&r.path),
                    ..r.clone()
                })
                .collect();
            let answers = self.inner.list_many(&inner).await.map_err(|e| self.err(e))?;
            Ok(requests
                .iter()
                .zip(answers)
                .map(|(r, answer)| {
                    let mut l = self.searched(&r.path, answer, || Ok(()))?;
                    l.entries = l.entries.into_iter().map(|f| self.info(f)).collect();
                    Ok(l)
                })
                .collect())
        }
    }
}

/// Refuses every change with `permission_denied`; reads are forwarded.
#[derive(Debug, Clone)]
pub struct ReadOnlyFs<F> {
    inner: F,
}

impl<F: Filesystem> ReadOnlyFs<F> {
    /// Wraps `inner`.
    pub fn new(inner: F) -> Self {
        ReadOnlyFs { inner }
    }
}

fn read_only(path: &FsPath) -> Error {
    Error::PermissionDenied {
        path: path.to_string(),
        reason: "this location is read-only".into(),
    }
}

crate::forward_filesystem! {
    impl[F: Filesystem] Filesystem for ReadOnlyFs<F> {
        inner = |s| &s.inner;
        forward = [stat, list, read_bytes, exists, read_range, grep, glob, list_many];
        async fn write(&self, path: &FsPath, _: Vec<u8>, _: WriteOptions) -> Result<Version> {
            Err(read_only(path))
        }
        async fn delete(&self, path: &FsPath, _: DeleteOptions) -> Result<()> {
            Err(read_only(path))
        }
        async fn rename(&self, from: &FsPath, _: &FsPath, _: RenameOptions) -> Result<()> {
            Err(read_only(from))
        }
        async fn append(&self, path: &FsPath, _: Vec<u8>, _: AppendOptions) -> Result<()> {
            Err(read_only(path))
        }
        async fn edit(&self, path: &FsPath, _: &EditRequest) -> Result<EditOutcome> {
            Err(read_only(path))
        }
    }
}

/// Routes each path to the backend mounted at its longest matching prefix, or to the
/// default backend. Listings of directories above mount points show the mount points;
/// `grep`/`glob` whose base contains a mount point walk across backends (merged, sorted);
/// moves across backends copy then delete (files only: a directory across backends is
/// `not_supported`).
#[derive(Debug, Clone)]
pub struct CompositeFs {
    default: Arc<dyn Filesystem>,
    /// Sorted by prefix length, longest first.
    routes: Vec<(FsPath, Arc<dyn Filesystem>)>,
}

impl CompositeFs {
    /// A composite with only a default backend.
    pub fn new(default: Arc<dyn Filesystem>) -> Self {
        CompositeFs {
            default,
            routes: Vec::new(),
        }
    }

    /// Mounts `fs` at `prefix` (replacing an existing mount there).
    pub fn mount(mut self, prefix: FsPath, fs: Arc<dyn Filesystem>) -> Self {
        self.routes.retain(|(p, _)| *p != prefix);
        self.routes.push((prefix, fs));
        self.routes
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.as_str().len()));
        self
    }

    fn route(&self, path: &FsPath) -> (&Arc<dyn Filesystem>, FsPath, FsPath) {
        for (prefix, fs) in &self.routes {
            if let Some(inner) = path.strip_prefix(prefix) {
                return (fs, inner, prefix.clone());
            }
        }
        (&self.default, path.clone(), FsPath::root())
    }

    /// Where a search from `base` goes: the backend, the base inside it and the mount's
    /// prefix; `None` when a mount point lies below `base`, so the search must walk across
    /// backends.
    fn search_route(&self, base: &FsPath) -> Option<(&Arc<dyn Filesystem>, FsPath, FsPath)> {
        match self.mounts_below(base).next() {
            Some(_) => None,
            None => Some(self.route(base)),
        }
    }

    /// Mount points strictly below `path`.
    fn mounts_below<'a>(&'a self, path: &'a FsPath) -> impl Iterator<Item = &'a FsPath> + 'a {
        self.routes
            .iter()
            .map(|(p, _)| p)
            .filter(move |p| p.starts_with(path) && *p != path)
    }

    /// The listing of `path` (`inner` in the backend mounted at `prefix`) from the
    /// backend's `answer`, with the mount points below `path` shown as directories.
    fn children(
        &self,
        path: &FsPath,
        inner: &FsPath,
        prefix: &FsPath,
        answer: Result<Vec<FileInfo>>,
    ) -> Result<Vec<FileInfo>> {
        let mut out = match answer {
            Ok(v) => v.into_iter().map(|f| Self::out(prefix, f)).collect(),
            Err(Error::NotFound { .. })
                if self.mounts_below(path).next().is_some()
                    || (inner.is_root() && !prefix.is_root()) =>
            {
                Vec::new()
            }
            Err(e) => return Err(Self::err(prefix, e)),
        };
        for m in self.mounts_below(path) {
            if let Some(first) = m
                .strip_prefix(path)
                .and_then(|r| r.segments().next().map(str::to_owned))
            {
                let child = path.join_path(&FsPath::parse(&first)?);
                out.retain(|f: &FileInfo| f.path != child);
                out.push(FileInfo::dir(child));
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out.dedup_by(|a, b| a.path == b.path);
        Ok(out)
    }

    fn out(prefix: &FsPath, mut f: FileInfo) -> FileInfo {
        f.path = prefix.join_path(&f.path);
        f
    }

    fn err(prefix: &FsPath, e: Error) -> Error {
        if prefix.is_root() {
            return e;
        }
        e.map_path(|s| match FsPath::parse(s) {
            Ok(p) => prefix.join_path(&p).to_string(),
            Err(_) => s.to_owned(),
        })
    }
}

crate::forward_filesystem! {
    impl Filesystem for CompositeFs {
        async fn stat(&self, path: &FsPath) -> Result<FileInfo> {
            let (fs, inner, prefix) = self.route(path);
            match fs.stat(&inner).await {
                Ok(i) => Ok(Self::out(&prefix, i)),
                Err(Error::NotFound { .. })
                    if self.mounts_below(path).next().is_some()
                        || (inner.is_root() && !prefix.is_root()) =>
                {
                    Ok(FileInfo::dir(path.clone()))
                }
                Err(e) => Err(Self::err(&prefix, e)),
            }
        }
        async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
            let (fs, inner, prefix) = self.route(path);
            self.children(path, &inner, &prefix, fs.list(&inner).await)
        }
        async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
            let (fs, inner, prefix) = self.route(path);
            fs.read_bytes(&inner)
                .await
                .map_err(|e| Self::err(&prefix, e))
        }
        async fn write(&self, path: &FsPath, data: Vec<u8>, opts: WriteOptions) -> Result<Version> {
            if self.mounts_below(path).next().is_some() || path.is_root() {
                return Err(Error::IsDirectory {
                    path: path.to_string(),
                });
            }
            let (fs, inner, prefix) = self.route(path);
            if inner.is_root() {
                return Err(Error::IsDirectory {
                    path: path.to_string(),
                });
            }
            fs.write(&inner, data, opts)
                .await
                .map_err(|e| Self::err(&prefix, e))
        }
        async fn delete(&self, path: &FsPath, options: DeleteOptions) -> Result<()> {
            let (fs, inner, prefix) = self.route(path);
            if inner.is_root() || self.mounts_below(path).next().is_some() {
                return Err(Error::not_supported(
                    "delete",
                    format!("{path} contains a mount point"),
                ));
            }
            fs.delete(&inner, options)
                .await
                .map_err(|e| Self::err(&prefix, e))
        }
        async fn rename(&self, from: &FsPath, to: &FsPath, options: RenameOptions) -> Result<()> {
            let (ffs, finner, fprefix) = self.route(from);
            let (tfs, tinner, tprefix) = self.route(to);
            if finner.is_root() || tinner.is_root() || self.mounts_below(from).next().is_some() {
                return Err(Error::not_supported(
                    "rename",
                    "mount points cannot be moved",
                ));
            }
            if fprefix == tprefix {
                return ffs
                    .rename(&finner, &tinner, options)
                    .await
                    .map_err(|e| Self::err(&fprefix, e));
            }
            let info = ffs
                .stat(&finner)
                .await
                .map_err(|e| Self::err(&fprefix, e))?;
            if info.is_dir() {
                return Err(Error::not_supported(
                    "rename",
                    "moving a directory across backends",
                ));
            }
            let data = ffs
                .read_bytes(&finner)
                .await
                .map_err(|e| Self::err(&fprefix, e))?;
            let opts = if options.overwrite {
                WriteOptions::default()
            } else {
                WriteOptions::create_new()
            };
            tfs.write(&tinner, data, opts)
                .await
                .map_err(|e| Self::err(&tprefix, e))?;
            ffs.delete(&finner, DeleteOptions::default())
                .await
                .map_err(|e| Self::err(&fprefix, e))
        }
        async fn exists(&self, path: &FsPath) -> Result<bool> {
            generic::exists(self, path).await
        }
        async fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
            let (fs, inner, prefix) = self.route(path);
            fs.read_range(&inner, offset, len)
                .await
                .map_err(|e| Self::err(&prefix, e))
        }
        async fn append(&self, path: &FsPath, data: Vec<u8>, options: AppendOptions) -> Result<()> {
            let (fs, inner, prefix) = self.route(path);
            if inner.is_root() || self.mounts_below(path).next().is_some() {
                return Err(Error::IsDirectory {
                    path: path.to_string(),
                });
            }
            fs.append(&inner, data, options)
                .await
                .map_err(|e| Self::err(&prefix, e))
        }
        async fn edit(&self, path: &FsPath, request: &EditRequest) -> Result<EditOutcome> {
            let (fs, inner, prefix) = self.route(path);
            fs.edit(&inner, request)
                .await
                .map_err(|e| Self::err(&prefix, e))
        }
        async fn grep(&self, request: &GrepRequest) -> Result<GrepOutput> {
            let Some((fs, path, prefix)) = self.search_route(&request.path) else {
                return generic::grep_via_walk(self, request).await;
            };
            let req = GrepRequest { path, ..request.clone() };
            let mut out = fs.grep(&req).await.map_err(|e| Self::err(&prefix, e))?;
            for m in &mut out.matches {
                m.path = prefix.join_path(&m.path);
            }
            Ok(out)
        }
        async fn glob(&self, request: &GlobRequest) -> Result<GlobOutput> {
            let Some((fs, path, prefix)) = self.search_route(&request.path) else {
                return generic::glob_via_walk(self, request).await;
            };
            let req = GlobRequest { path, ..request.clone() };
            let mut out = fs.glob(&req).await.map_err(|e| Self::err(&prefix, e))?;
            out.files = out.files.into_iter().map(|f| Self::out(&prefix, f)).collect();
            Ok(out)
        }
        /// One batch per mounted backend, the mount points below a listed folder added as
        /// `list` adds them; a recursive listing of a folder that holds a mount point (it
        /// spans backends) walks through this composite's `list`.
        async fn list_many(&self, requests: &[ListRequest]) -> Result<Vec<Result<Listing>>> {
            let mut out: Vec<Option<Result<Listing>>> = requests.iter().map(|_| None).collect();
            type Batch<'a> = (FsPath, &'a Arc<dyn Filesystem>, Vec<(usize, ListRequest)>);
            let mut batches: Vec<Batch<'_>> = Vec::new();
            for (i, r) in requests.iter().enumerate() {
                if r.recursive && self.search_route(&r.path).is_none() {
                    out[i] = Some(generic::list_one(self, r).await);
                    continue;
                }
                let (fs, path, prefix) = self.route(&r.path);
                let req = (i, ListRequest { path, ..r.clone() });
                match batches.iter_mut().find(|b| b.0 == prefix) {
                    Some(b) => b.2.push(req),
                    None => batches.push((prefix, fs, vec![req])),
                }
            }
            for (prefix, fs, batch) in batches {
                let inner: Vec<ListRequest> = batch.iter().map(|(_, r)| r.clone()).collect();
                let answers = fs.list_many(&inner).await.map_err(|e| Self::err(&prefix, e))?;
                for ((i, r), answer) in batch.into_iter().zip(answers) {
                    let path = &requests[i].path;
                    out[i] = Some(if r.recursive {
                        answer
                            .map(|mut l| {
                                l.entries =
                                    l.entries.into_iter().map(|f| Self::out(&prefix, f)).collect();
                                l
                            })
                            .map_err(|e| Self::err(&prefix, e))
                    } else {
                        let truncated = answer.as_ref().is_ok_and(|l| l.truncated);
                        self.children(path, &r.path, &prefix, answer.map(|l| l.entries))
                            .map(|entries| {
                                let mut l = r.answer(entries);
                                l.truncated |= truncated;
                                l
                            })
                    });
                }
            }
            Ok(out
                .into_iter()
                .map(|o| {
                    o.unwrap_or_else(|| {
                        Err(Error::Backend {
                            message: "a mounted backend gave fewer listings than asked".into(),
                            source: None,
                        })
                    })
                })
                .collect())
        }
    }
}

/// A writable `upper` filesystem over a read-only `lower` template.
///
/// Reads fall through to `lower` when `upper` lacks the path; writes, appends and edits go
/// to `upper` (a template file is copied up first, so the template itself never changes);
/// listings, `grep` and `glob` are merged with `upper` winning. Deleting or moving a path
/// that exists only in `lower` is `not_supported` (no tombstones: the template is shared,
/// so hiding it per tenant would make it silently disappear); deleting a path present in
/// `upper` removes the upper copy, so an overridden template file reverts to the template.
#[derive(Debug, Clone)]
pub struct OverlayFs {
    upper: Arc<dyn Filesystem>,
    lower: Arc<dyn Filesystem>,
}

impl OverlayFs {
    /// `upper` over `lower`. `lower` is never written.
    pub fn new(upper: Arc<dyn Filesystem>, lower: Arc<dyn Filesystem>) -> Self {
        OverlayFs { upper, lower }
    }

    async fn lower_has(&self, path: &FsPath) -> Result<bool> {
        self.lower.exists(path).await
    }
}

fn or_not_found<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

crate::forward_filesystem! {
    impl Filesystem for OverlayFs {
        async fn stat(&self, path: &FsPath) -> Result<FileInfo> {
            match self.upper.stat(path).await {
                Err(Error::NotFound { .. }) => self.lower.stat(path).await,
                other => other,
            }
        }
        async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
            let whole = |r: Result<Vec<FileInfo>>| r.map(|e| Listing::capped(e, usize::MAX));
            let up = whole(self.upper.list(path).await);
            let low = whole(self.lower.list(path).await);
            merged(path, up, low, usize::MAX).map(|l| l.entries)
        }
        async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
            match self.upper.read_bytes(path).await {
                Err(Error::NotFound { .. }) => self.lower.read_bytes(path).await,
                other => other,
            }
        }
        async fn write(&self, path: &FsPath, data: Vec<u8>, opts: WriteOptions) -> Result<Version> {
            if let Ok(info) = self.lower.stat(path).await
                && info.is_dir()
            {
                return Err(Error::IsDirectory {
                    path: path.to_string(),
                });
            }
            let upper_has = self.upper.exists(path).await?;
            match &opts.mode {
                WriteMode::CreateNew if !upper_has && self.lower_has(path).await? => {
                    Err(Error::AlreadyExists {
                        path: path.to_string(),
                    })
                }
                WriteMode::IfMatch(v) if !upper_has => {
                    match or_not_found(self.lower.read_bytes(path).await)? {
                        Some(cur) if Version::of(&cur) == *v => self
                            .upper
                            .write(path, data, WriteOptions::create_new())
                            .await
                            .map_err(|e| match e {
                                Error::AlreadyExists { path } => Error::Conflict {
                                    path,
                                    reason: "written concurrently".into(),
                                },
                                e => e,
                            }),
                        Some(_) => Err(Error::Conflict {
                            path: path.to_string(),
                            reason: "the content is not the expected version".into(),
                        }),
                        None => Err(Error::Conflict {
                            path: path.to_string(),
                            reason: "the file no longer exists".into(),
                        }),
                    }
                }
                _ => self.upper.write(path, data, opts).await,
            }
        }
        async fn delete(&self, path: &FsPath, options: DeleteOptions) -> Result<()> {
            if self.upper.exists(path).await? {
                return self.upper.delete(path, options).await;
            }
            if self.lower_has(path).await? {
                return Err(Error::not_supported(
                    "delete",
                    format!("{path} belongs to the shared read-only template"),
                ));
            }
            Err(Error::NotFound {
                path: path.to_string(),
            })
        }
        async fn rename(&self, from: &FsPath, to: &FsPath, options: RenameOptions) -> Result<()> {
            if !self.upper.exists(from).await? {
                if self.lower_has(from).await? {
                    return Err(Error::not_supported(
                        "rename",
                        format!("{from} belongs to the shared read-only template"),
                    ));
                }
                return Err(Error::NotFound {
                    path: from.to_string(),
                });
            }
            if from != to && !options.overwrite && self.lower_has(to).await? {
                return Err(Error::AlreadyExists {
                    path: to.to_string(),
                });
            }
            self.upper.rename(from, to, options).await
        }
        async fn exists(&self, path: &FsPath) -> Result<bool> {
            Ok(self.upper.exists(path).await? || self.lower.exists(path).await?)
        }
        async fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
            match self.upper.read_range(path, offset, len).await {
                Err(Error::NotFound { .. }) => self.lower.read_range(path, offset, len).await,
                other => other,
            }
        }
        async fn append(&self, path: &FsPath, data: Vec<u8>, options: AppendOptions) -> Result<()> {
            if !self.upper.exists(path).await?
                && let Some(mut cur) = or_not_found(self.lower.read_bytes(path).await)?
            {
                cur.extend_from_slice(&data);
                return match self
                    .upper
                    .write(
                        path,
                        cur,
                        WriteOptions {
                            durability: options.durability,
                            ..WriteOptions::create_new()
                        },
                    )
                    .await
                {
                    Ok(_) => Ok(()),
                    // Copied up concurrently: append to the copy.
                    Err(Error::AlreadyExists { .. }) => {
                        self.upper.append(path, data, options).await
                    }
                    Err(e) => Err(e),
                };
            }
            self.upper.append(path, data, options).await
        }
        async fn edit(&self, path: &FsPath, request: &EditRequest) -> Result<EditOutcome> {
            if self.upper.exists(path).await? {
                return self.upper.edit(path, request).await;
            }
            generic::edit_via_cas(self, path, request).await
        }
        async fn grep(&self, request: &GrepRequest) -> Result<GrepOutput> {
            generic::grep_via_walk(self, request).await
        }
        async fn glob(&self, request: &GlobRequest) -> Result<GlobOutput> {
            // Each side's own search, merged with `upper` winning: one search of each
            // (a Redis range read, not one listing per folder).
            generic::compile_glob(&request.pattern)?;
            let listing = |r: Result<GlobOutput>| {
                r.map(|o| Listing {
                    entries: o.files,
                    truncated: o.truncated,
                })
            };
            let up = listing(self.upper.glob(request).await);
            let low = listing(self.lower.glob(request).await);
            merged(&request.path, up, low, request.max_results).map(|l| GlobOutput {
                files: l.entries,
                truncated: l.truncated,
            })
        }
        /// One batch of each side, side by side, merged listing by listing as `list` and
        /// `glob` merge: the per-step probe of the workspace snapshot (ADR 0028, 0042).
        async fn list_many(&self, requests: &[ListRequest]) -> Result<Vec<Result<Listing>>> {
            let (up, low) = futures::join!(
                self.upper.list_many(requests),
                self.lower.list_many(requests)
            );
            Ok(requests
                .iter()
                .zip(up?.into_iter().zip(low?))
                .map(|(r, (up, low))| merged(&r.path, up, low, r.max_results))
                .collect())
        }
    }
}

/// The overlay's view of one listing of `path` from each side: `upper`'s entries and those
/// of `lower` that `upper` does not shadow (the same path, or a path below one of `upper`'s
/// files), sorted, cut at `max_results`. `file_not_found` when neither side has `path`.
fn merged(
    path: &FsPath,
    up: Result<Listing>,
    low: Result<Listing>,
    max_results: usize,
) -> Result<Listing> {
    let up = or_not_found(up)?;
    let low = match low {
        Ok(v) => Some(v),
        Err(Error::NotFound { .. }) => None,
        Err(Error::NotADirectory { .. }) if up.is_some() => None,
        Err(e) => return Err(e),
    };
    let (up, low) = match (up, low) {
        (None, None) => {
            return Err(Error::NotFound {
                path: path.to_string(),
            });
        }
        (up, low) => (up.unwrap_or_default(), low.unwrap_or_default()),
    };
    let upper: std::collections::BTreeSet<FsPath> =
        up.entries.iter().map(|f| f.path.clone()).collect();
    let mut entries = up.entries;
    for f in low.entries {
        let shadowed = upper.contains(&f.path)
            || std::iter::successors(f.path.parent(), FsPath::parent).any(|a| upper.contains(&a));
        if !shadowed {
            entries.push(f);
        }
    }
    let mut out = Listing::capped(entries, max_results);
    // Each side's first `max_results` hold the merge's first `max_results`.
    out.truncated |= up.truncated || low.truncated;
    Ok(out)
}

#[cfg(test)]
#[path = "wrappers_tests.rs"]
mod tests;
