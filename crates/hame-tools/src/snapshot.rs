//! One immutable snapshot of a caller's workspace configuration per step (issue #34, ADR
//! 0028).
//!
//! The files every step reads — `AGENTS.md`, `MEMORY.md`, `tools.json`, the `knowledge/`
//! listing and `knowledge/KNOWLEDGE.md`, the skills (`skills/*/SKILL.md`, the drafts and
//! `skills/.usage.json`) and the subagent specs (`subagents/*`) — are taken once per step
//! into a [`WorkspaceSnapshot`]. Layers and tools read them through
//! [`WorkspaceSnapshot::workspace`], a read view of the caller's [`Workspace`] that answers
//! `stat`, `list`, `exists` and `read_bytes` of those paths from the snapshot and passes
//! everything else to the caller's filesystems.
//!
//! # What a step costs
//!
//! Taking a snapshot *probes* each of the caller's roots (its files, its home, its
//! `<userId>/` override folder) with one [`Filesystem::list_many`]: the root's children and
//! every file below `knowledge/`, `skills/` and `subagents/`, in one store operation (one
//! round trip on Redis, whatever the number of skills and specs; ADR 0042). A probe gives
//! each file's size and modification time; a file whose size and time match what an earlier step read
//! is not read again ([`SnapshotCache`], shared by every call of an agent). Where a root's
//! files are the same as another's (the isolated modes: the tool view is the home behind a
//! guard) it is probed once.
//!
//! A file modified less than [`RACY_WINDOW`] before it was read is read again at the next
//! step even when its stamp is unchanged: a second edit within a backend's time resolution
//! (one second on object storage) with the same size would otherwise go unseen. A time with
//! digits below the millisecond comes from a filesystem that keeps nanoseconds (ext4, XFS,
//! btrfs, tmpfs, APFS), whose clock moves in steps of a scheduler tick (1–10 ms): there the
//! window is [`RACY_WINDOW_FINE`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use hame_fs::{Error, FileInfo, FileKind, Filesystem, FsPath, ListRequest, Result, Version};

use crate::{Workspace, WorkspaceMode};

/// The folders a snapshot holds whole (their listing, and the files the layers read).
pub const SNAPSHOT_FOLDERS: [&str; 3] = ["knowledge", "skills", "subagents"];
/// Top-level files whose content a snapshot holds.
pub const SNAPSHOT_TOP_FILES: [&str; 3] = ["AGENTS.md", "MEMORY.md", "tools.json"];
/// Most files one folder's probe lists; a folder with more is not held (its reads go to the
/// store, as without a snapshot).
pub const MAX_SNAPSHOT_FOLDER_FILES: usize = 10_000;
/// Largest file whose content a snapshot holds; a larger one is read from the store.
pub const MAX_SNAPSHOT_FILE_BYTES: u64 = 1024 * 1024;
/// A file modified this little before it was read is read again at the next step.
pub const RACY_WINDOW: Duration = Duration::from_secs(2);
/// [`RACY_WINDOW`] for a file whose time has digits below the millisecond (a filesystem
/// that keeps nanoseconds, and whose clock steps by a scheduler tick, at most 10 ms).
pub const RACY_WINDOW_FINE: Duration = Duration::from_millis(50);

/// How long after `modified` a read of the file must have been made for an equal stamp
/// to say the same content: [`RACY_WINDOW_FINE`] when the time has digits below the
/// millisecond (the filesystem keeps nanoseconds), else [`RACY_WINDOW`] (seconds on object
/// storage, two seconds on FAT, milliseconds where a store dates its own writes; a fine
/// time that falls on a whole millisecond, one in a million, gets the long window too).
fn racy_window(modified: DateTime<Utc>) -> Duration {
    if !modified.timestamp_subsec_nanos().is_multiple_of(1_000_000) {
        RACY_WINDOW_FINE
    } else {
        RACY_WINDOW
    }
}

/// Bytes of content a [`SnapshotCache`] keeps by default; past this it starts over.
pub const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Which of the caller's filesystems a snapshot entry comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SnapshotRoot {
    /// [`Workspace::files`]: what the caller's tools see.
    Files,
    /// [`Workspace::home`]: the caller's runtime data (`MEMORY.md`, skill drafts).
    Home,
    /// [`Workspace::overrides`]: the caller's `<userId>/` folder of the template.
    Overrides,
    /// Sandbox mode: the host's template, where `tools.json` is read (never from the
    /// sandbox, whose copy the agent's commands can rewrite). Its top level only.
    Host,
}

impl SnapshotRoot {
    /// `files`, `home` or `overrides`.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotRoot::Files => "files",
            SnapshotRoot::Home => "home",
            SnapshotRoot::Overrides => "overrides",
            SnapshotRoot::Host => "host",
        }
    }
}

/// What a probe says of a file: its size and modification time (when the backend keeps
/// one). Two equal stamps are taken for the same content (see [`RACY_WINDOW`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamp {
    /// Size in bytes.
    pub size: u64,
    /// Last modification, when the backend knows it.
    pub modified: Option<DateTime<Utc>>,
}

/// One file of a snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    /// Its stamp as probed at this step.
    pub stamp: FileStamp,
    /// Its content, when the snapshot holds it (the files the layers read, up to
    /// [`MAX_SNAPSHOT_FILE_BYTES`]).
    pub content: Option<Arc<[u8]>>,
    /// The SHA-256 version of `content`.
    pub version: Option<Version>,
}

impl SnapshotFile {
    /// A file the snapshot knows by its stamp only: its reads go to the store.
    fn unread(stamp: FileStamp) -> Self {
        SnapshotFile {
            stamp,
            content: None,
            version: None,
        }
    }
}

/// One root as probed: its top-level entries of the held names ([`SNAPSHOT_TOP_FILES`] and
/// the folders) and, per held folder, its files (`None`: the folder could not be held and
/// is read from the store). A listing of the root itself goes to the store.
#[derive(Debug, Default)]
struct RootView {
    top: Vec<FileInfo>,
    /// Whether the probe asked for [`SNAPSHOT_FOLDERS`] (not for the sandbox host's root).
    folders_probed: bool,
    folders: BTreeMap<String, Option<()>>,
    files: BTreeMap<FsPath, SnapshotFile>,
}

impl RootView {
    /// Whether the snapshot answers for `path` (else the store does): the root, the
    /// top-level files, the held folders, and the snapshot's names the root does not have.
    fn covers(&self, path: &FsPath) -> bool {
        let mut segs = path.segments();
        let Some(first) = segs.next() else {
            return true;
        };
        let depth1 = segs.next().is_none();
        if let Some(held) = self.folders.get(first) {
            return held.is_some();
        }
        match self.top.iter().find(|e| e.path.as_str() == first) {
            Some(e) => depth1 && !e.is_dir(),
            // A held name the root does not have: the snapshot says it is not there.
            None => {
                (self.folders_probed && SNAPSHOT_FOLDERS.contains(&first))
                    || (depth1 && SNAPSHOT_TOP_FILES.contains(&first))
            }
        }
    }

    fn is_dir(&self, path: &FsPath) -> bool {
        if path.is_root() {
            return true;
        }
        if path.parent().is_some_and(|p| p.is_root()) {
            return self.top.iter().any(|e| e.path == *path && e.is_dir());
        }
        self.files.keys().any(|p| p != path && p.starts_with(path))
    }

    fn info(&self, path: &FsPath) -> Option<FileInfo> {
        if path.parent().is_some_and(|p| p.is_root()) {
            return self.top.iter().find(|e| e.path == *path).cloned();
        }
        if let Some(f) = self.files.get(path) {
            return Some(FileInfo {
                path: path.clone(),
                kind: FileKind::File,
                size: f.stamp.size,
                modified: f.stamp.modified,
            });
        }
        self.is_dir(path).then(|| FileInfo::dir(path.clone()))
    }

    fn list(&self, dir: &FsPath) -> Option<Vec<FileInfo>> {
        if !self.is_dir(dir) {
            return None;
        }
        let mut out: Vec<FileInfo> = Vec::new();
        let mut dirs: BTreeSet<FsPath> = BTreeSet::new();
        for (p, f) in &self.files {
            let Some(rel) = p.strip_prefix(dir) else {
                continue;
            };
            let mut segs = rel.segments();
            let (Some(first), more) = (segs.next(), segs.next().is_some()) else {
                continue;
            };
            let Ok(child) = dir.join(first) else {
                continue;
            };
            if more {
                dirs.insert(child);
            } else {
                out.push(FileInfo {
                    path: child,
                    kind: FileKind::File,
                    size: f.stamp.size,
                    modified: f.stamp.modified,
                });
            }
        }
        out.extend(dirs.into_iter().map(FileInfo::dir));
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Some(out)
    }
}

/// Whether the snapshot holds the content of `path` (a file the layers read each step).
fn held(path: &FsPath) -> bool {
    let segs: Vec<&str> = path.segments().collect();
    match segs.as_slice() {
        [top] => SNAPSHOT_TOP_FILES.contains(top),
        ["knowledge", "KNOWLEDGE.md"] => true,
        ["skills", ".usage.json"] => true,
        ["skills", _, "SKILL.md"] => true,
        ["skills", drafts, _, "SKILL.md"] => drafts.starts_with('_'),
        ["subagents", _] => true,
        _ => false,
    }
}

/// One immutable snapshot of a caller's workspace configuration, taken at the start of a
/// step (see the [module docs](self)). Cheap to clone.
#[derive(Debug, Clone)]
pub struct WorkspaceSnapshot {
    step: usize,
    taken_at: DateTime<Utc>,
    roots: BTreeMap<SnapshotRoot, Arc<RootView>>,
    workspace: Workspace,
    /// The read view of the host's template ([`SnapshotRoot::Host`]), when taken.
    host: Option<Arc<dyn Filesystem>>,
    probes: usize,
    reads: usize,
}

impl WorkspaceSnapshot {
    /// Adds the top level of the sandbox host's template `host` ([`SnapshotRoot::Host`]:
    /// one `list_many` of its root; `tools.json` read only when its stamp changed), read through
    /// [`host`](Self::host). `key` as for [`take_keyed`](Self::take_keyed).
    pub async fn with_host(
        mut self,
        host: &Arc<dyn Filesystem>,
        cache: &SnapshotCache,
        key: &str,
    ) -> Self {
        let probe = Probe {
            key,
            cache,
            now: self.taken_at,
        };
        let (view, probes, reads) = probe.root(host.as_ref(), SnapshotRoot::Host, &[]).await;
        self.probes += probes;
        self.reads += reads;
        self.host = Some(match view {
            Some(v) => {
                let v = Arc::new(v);
                self.roots.insert(SnapshotRoot::Host, v.clone());
                Arc::new(SnapshotFs {
                    view: v,
                    inner: host.clone(),
                })
            }
            None => host.clone(),
        });
        self
    }

    /// The read view of the sandbox host's template, when the snapshot was taken
    /// [`with_host`](Self::with_host).
    pub fn host(&self) -> Option<&Arc<dyn Filesystem>> {
        self.host.as_ref()
    }

    /// The step it was taken for.
    pub fn step(&self) -> usize {
        self.step
    }

    /// When it was taken.
    pub fn taken_at(&self) -> DateTime<Utc> {
        self.taken_at
    }

    /// The read view of the caller's workspace over the snapshot: its `files()`, `home()`
    /// and `overrides()` answer the snapshot's paths from it and pass the rest (and every
    /// write) to the caller's filesystems.
    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// Store operations the probe made (one `list_many` per probed root).
    pub fn probes(&self) -> usize {
        self.probes
    }

    /// Files read from the store for this snapshot (new or changed since an earlier one).
    pub fn reads(&self) -> usize {
        self.reads
    }

    /// Every file of the snapshot, by root and path (a root shared by two views is listed
    /// under each).
    pub fn files(&self) -> impl Iterator<Item = (SnapshotRoot, &FsPath, &SnapshotFile)> {
        self.roots
            .iter()
            .flat_map(|(root, view)| view.files.iter().map(move |(p, f)| (*root, p, f)))
    }

    /// One file of the snapshot (top-level files as well as those of the held folders).
    pub fn file(&self, root: SnapshotRoot, path: &str) -> Option<&SnapshotFile> {
        let path = FsPath::parse(path).ok()?;
        self.roots.get(&root)?.files.get(&path)
    }

    /// Takes the snapshot of `ws` for `step`, reading only what `cache` does not hold
    /// at the probed stamps.
    ///
    /// The cache is keyed by the caller's agent, user and session;
    /// [`take_keyed`](Self::take_keyed) shares it more widely.
    pub async fn take(ws: &Workspace, cache: &SnapshotCache, step: usize) -> Self {
        let id = ws.identity();
        let key = format!(
            "{}\n{}\n{}",
            id.agent,
            id.user.as_deref().unwrap_or_default(),
            id.session
        );
        Self::take_keyed(ws, cache, step, &key).await
    }

    /// [`take`](Self::take) with the cache keyed by `key`: callers with the same key must
    /// see the same files at the same paths (the harness uses the caller's isolation
    /// namespace and user id, so the sessions of one user share what they read).
    pub async fn take_keyed(ws: &Workspace, cache: &SnapshotCache, step: usize, key: &str) -> Self {
        let taken_at = Utc::now();
        let mut probes = 0usize;
        let mut reads = 0usize;
        let mut roots = BTreeMap::new();
        // In the isolated modes the tool view is the home behind a guard that hides no path
        // from reads: one probe of the home serves both.
        let shared_home = matches!(
            ws.mode(),
            WorkspaceMode::IsolatedLocal | WorkspaceMode::SharedStore
        ) && ws.home_in_files().is_root();
        let mut tally = |(view, p, r): (Option<RootView>, usize, usize)| {
            probes += p;
            reads += r;
            view.map(Arc::new)
        };
        let probe = Probe {
            key,
            cache,
            now: taken_at,
        };
        let folders = &SNAPSHOT_FOLDERS;
        let home = tally(
            probe
                .root(ws.home().as_ref(), SnapshotRoot::Home, folders)
                .await,
        );
        let files = if shared_home {
            home.clone()
        } else {
            tally(
                probe
                    .root(ws.files().as_ref(), SnapshotRoot::Files, folders)
                    .await,
            )
        };
        let overrides = match ws.overrides() {
            Some(o) => tally(
                probe
                    .root(o.as_ref(), SnapshotRoot::Overrides, folders)
                    .await,
            ),
            None => None,
        };
        let view =
            |root: &Option<Arc<RootView>>, inner: &Arc<dyn Filesystem>| -> Arc<dyn Filesystem> {
                match root {
                    Some(r) => Arc::new(SnapshotFs {
                        view: r.clone(),
                        inner: inner.clone(),
                    }),
                    None => inner.clone(),
                }
            };
        let workspace = ws.with_views(
            view(&files, ws.files()),
            view(&home, ws.home()),
            ws.overrides().map(|o| view(&overrides, o)),
        );
        for (root, v) in [
            (SnapshotRoot::Files, files),
            (SnapshotRoot::Home, home),
            (SnapshotRoot::Overrides, overrides),
        ] {
            if let Some(v) = v {
                roots.insert(root, v);
            }
        }
        WorkspaceSnapshot {
            step,
            taken_at,
            roots,
            workspace,
            host: None,
            probes,
            reads,
        }
    }
}

/// What every root of one snapshot is probed with: the cache's key (see
/// [`WorkspaceSnapshot::take_keyed`]), the cache, and the snapshot's time.
struct Probe<'a> {
    key: &'a str,
    cache: &'a SnapshotCache,
    now: DateTime<Utc>,
}

impl Probe<'_> {
    /// Probes one root (its listing and every file below each of `folders`, in one
    /// `list_many`) and reads what the cache lacks: the view (`None` when the root cannot
    /// be listed: everything is then read from the store), the probes made and files read.
    async fn root(
        &self,
        fs: &dyn Filesystem,
        root: SnapshotRoot,
        folders: &[&str],
    ) -> (Option<RootView>, usize, usize) {
        let Probe { key, cache, now } = *self;
        let probes = 1;
        // Of the root only the names the snapshot holds: a root of many files (a workspace's
        // notes) costs a look-up per held name, not a `stat` per entry.
        let mut requests = vec![ListRequest::named(
            FsPath::root(),
            SNAPSHOT_TOP_FILES.iter().chain(folders.iter()).copied(),
        )];
        let mut names = Vec::with_capacity(folders.len());
        for &name in folders {
            if let Ok(base) = FsPath::parse(name) {
                requests.push(ListRequest::recursive(base).max_results(MAX_SNAPSHOT_FOLDER_FILES));
                names.push(name);
            }
        }
        let listings = match fs.list_many(&requests).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(root = root.as_str(), error = %e, "workspace snapshot: root not probed");
                return (None, probes, 0);
            }
        };
        let mut listings = listings.into_iter();
        let top = match listings.next() {
            Some(Ok(t)) => t.entries,
            Some(Err(e)) if e.is_not_found() => Vec::new(),
            Some(Err(e)) => {
                tracing::debug!(root = root.as_str(), error = %e, "workspace snapshot: root not listed");
                return (None, probes, 0);
            }
            None => return (None, probes, 0),
        };
        let mut view = RootView {
            top,
            folders_probed: !names.is_empty(),
            ..RootView::default()
        };
        let mut stamps: Vec<(FsPath, FileStamp)> = view
            .top
            .iter()
            .filter(|e| !e.is_dir())
            .map(|e| (e.path.clone(), stamp(e)))
            .collect();
        for (name, listing) in names.into_iter().zip(listings) {
            // A folder the root's listing does not show as one is not held (none of its
            // files can be), as before the batch: its reads say what the store says.
            if !view
                .top
                .iter()
                .any(|e| e.is_dir() && e.path.as_str() == name)
            {
                continue;
            }
            match listing {
                Ok(out) if !out.truncated => {
                    view.folders.insert(name.to_owned(), Some(()));
                    stamps.extend(
                        out.entries
                            .iter()
                            .filter(|f| !f.is_dir())
                            .map(|f| (f.path.clone(), stamp(f))),
                    );
                }
                Ok(_) | Err(_) => {
                    view.folders.insert(name.to_owned(), None);
                }
            }
        }
        let mut reads = 0;
        for (path, stamp) in stamps {
            if !held(&path) || stamp.size > MAX_SNAPSHOT_FILE_BYTES {
                view.files.insert(path, SnapshotFile::unread(stamp));
                continue;
            }
            let ckey = (key.to_owned(), root, path.clone());
            if let Some(hit) = cache.get(&ckey, &stamp) {
                view.files.insert(path, hit);
                continue;
            }
            reads += 1;
            match fs.read_bytes(&path).await {
                Ok(bytes) => {
                    let file = SnapshotFile {
                        version: Some(Version::of(&bytes)),
                        content: Some(Arc::from(bytes)),
                        stamp: stamp.clone(),
                    };
                    cache.put(ckey, &file, now);
                    view.files.insert(path, file);
                }
                // Gone since the probe: the snapshot says so.
                Err(e) if e.is_not_found() => {
                    view.top.retain(|t| t.path != path);
                }
                // Read from the store when asked, so the reader sees the error.
                Err(_) => {
                    view.files.insert(path, SnapshotFile::unread(stamp));
                }
            }
        }
        (Some(view), probes, reads)
    }
}

fn stamp(info: &FileInfo) -> FileStamp {
    FileStamp {
        size: info.size,
        modified: info.modified,
    }
}

#[derive(Debug)]
struct Cached {
    file: SnapshotFile,
    read_at: DateTime<Utc>,
}

type CacheKey = (String, SnapshotRoot, FsPath);

/// The contents earlier snapshots read, by caller, root, path and stamp: what lets an
/// unchanged step cost only its probes. One per agent; bounded by bytes (past the bound it
/// starts over).
#[derive(Debug)]
pub struct SnapshotCache {
    max_bytes: usize,
    inner: Mutex<(HashMap<CacheKey, Cached>, usize)>,
}

impl Default for SnapshotCache {
    fn default() -> Self {
        Self::new(DEFAULT_CACHE_BYTES)
    }
}

impl SnapshotCache {
    /// A cache holding at most about `max_bytes` of content.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            inner: Mutex::new((HashMap::new(), 0)),
        }
    }

    /// The content read for `key` when its stamp is `stamp`, it has a modification time,
    /// and that time was at least [`RACY_WINDOW`] before the read.
    fn get(&self, key: &CacheKey, stamp: &FileStamp) -> Option<SnapshotFile> {
        let guard = self.inner.lock().ok()?;
        let hit = guard.0.get(key)?;
        let modified = stamp.modified?;
        let racy = chrono::Duration::from_std(racy_window(modified)).ok()?;
        (hit.file.stamp == *stamp && modified + racy <= hit.read_at).then(|| hit.file.clone())
    }

    fn put(&self, key: CacheKey, file: &SnapshotFile, read_at: DateTime<Utc>) {
        let Ok(mut guard) = self.inner.lock() else {
            return;
        };
        let size = file.content.as_ref().map_or(0, |c| c.len());
        if guard.1 + size > self.max_bytes {
            guard.0.clear();
            guard.1 = 0;
        }
        let old = guard.0.insert(
            key,
            Cached {
                file: file.clone(),
                read_at,
            },
        );
        let freed = old
            .and_then(|o| o.file.content.map(|c| c.len()))
            .unwrap_or(0);
        guard.1 = guard.1.saturating_sub(freed) + size;
    }
}

/// The snapshot of the running step, held in the call's extensions: the harness sets it
/// when a step starts; layers and tools of that step read it with [`StepSnapshot::get`].
#[derive(Debug, Default)]
pub struct StepSnapshot {
    current: Mutex<Option<Arc<WorkspaceSnapshot>>>,
}

impl StepSnapshot {
    /// An empty slot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes `snapshot` the one of its step.
    pub fn set(&self, snapshot: Arc<WorkspaceSnapshot>) {
        if let Ok(mut c) = self.current.lock() {
            *c = Some(snapshot);
        }
    }

    /// The snapshot of `step`, when one was taken for it.
    pub fn get(&self, step: usize) -> Option<Arc<WorkspaceSnapshot>> {
        let c = self.current.lock().ok()?;
        c.as_ref().filter(|s| s.step == step).cloned()
    }

    /// The latest snapshot, whatever its step.
    pub fn latest(&self) -> Option<Arc<WorkspaceSnapshot>> {
        self.current.lock().ok()?.clone()
    }
}

/// The workspace a reader of step `step` reads its configuration through: the step's
/// snapshot view when the call has one, else the caller's handle itself.
pub fn config_view(extensions: &hame_core::Extensions, step: usize) -> Option<Workspace> {
    view_of(extensions, |slot| slot.get(step))
}

/// [`config_view`] for a reader that does not know its step (a tool): the call's latest
/// snapshot.
pub fn latest_view(extensions: &hame_core::Extensions) -> Option<Workspace> {
    view_of(extensions, StepSnapshot::latest)
}

fn view_of(
    extensions: &hame_core::Extensions,
    pick: impl FnOnce(&StepSnapshot) -> Option<Arc<WorkspaceSnapshot>>,
) -> Option<Workspace> {
    let ws = extensions.get::<Workspace>()?;
    match extensions.get::<Arc<StepSnapshot>>().and_then(|s| pick(s)) {
        // Only a snapshot of this caller's handle (a child call never reads its parent's).
        Some(s)
            if s.workspace().identity() == ws.identity() && s.workspace().mode() == ws.mode() =>
        {
            Some(s.workspace().clone())
        }
        _ => Some(ws.clone()),
    }
}

/// The read view of one root (see [`WorkspaceSnapshot::workspace`]).
#[derive(Debug)]
struct SnapshotFs {
    view: Arc<RootView>,
    inner: Arc<dyn Filesystem>,
}

impl SnapshotFs {
    fn not_found(path: &FsPath) -> Error {
        Error::NotFound {
            path: path.to_string(),
        }
    }
}

hame_fs::forward_filesystem! {
    impl Filesystem for SnapshotFs {
        inner = |s| &s.inner;
        // `list_many` goes to the store: the probe's own call, and no reader of the
        // snapshot's paths batches its listings.
        forward = [write, delete, rename, append, edit, grep, glob, list_many];
        async fn stat(&self, path: &FsPath) -> Result<FileInfo> {
            if !self.view.covers(path) {
                return self.inner.stat(path).await;
            }
            if path.is_root() {
                return Ok(FileInfo::dir(FsPath::root()));
            }
            self.view.info(path).ok_or_else(|| Self::not_found(path))
        }
        async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
            // The snapshot knows the root's held names only, not all of its entries.
            if path.is_root() || !self.view.covers(path) {
                return self.inner.list(path).await;
            }
            match self.view.list(path) {
                Some(l) => Ok(l),
                None if self.view.info(path).is_some() => Err(Error::NotADirectory {
                    path: path.to_string(),
                }),
                None => Err(Self::not_found(path)),
            }
        }
        async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
            if !self.view.covers(path) {
                return self.inner.read_bytes(path).await;
            }
            match self.view.files.get(path) {
                Some(SnapshotFile { content: Some(c), .. }) => Ok(c.to_vec()),
                Some(_) => self.inner.read_bytes(path).await,
                None if self.view.info(path).is_some() => {
                    // A top-level file the snapshot does not hold, or a folder.
                    self.inner.read_bytes(path).await
                }
                None => Err(Self::not_found(path)),
            }
        }
        async fn exists(&self, path: &FsPath) -> Result<bool> {
            if !self.view.covers(path) {
                return self.inner.exists(path).await;
            }
            Ok(path.is_root() || self.view.info(path).is_some())
        }
        async fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
            if self.view.covers(path)
                && let Some(SnapshotFile { content: Some(c), .. }) = self.view.files.get(path)
            {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(c.len());
                let end = start.saturating_add(usize::try_from(len).unwrap_or(usize::MAX)).min(c.len());
                return Ok(c[start..end].to_vec());
            }
            self.inner.read_range(path, offset, len).await
        }
    }
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
