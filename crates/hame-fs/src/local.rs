//! [`LocalFs`]: a directory on the local disk, reached only through a `cap-std` capability.

use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use cap_std::fs::{Dir, MetadataExt, OpenOptions, OpenOptionsExt};
use chrono::{DateTime, Utc};
use rustix::io::Errno;

use crate::error::{Error, Result};
use crate::fs::{
    AppendOptions, DeleteOptions, EditOutcome, EditRequest, FileInfo, FileKind, Filesystem,
    GlobOutput, GlobRequest, GrepOutput, GrepRequest, Links, ListRequest, Listing, RenameOptions,
    Version, WriteMode, WriteOptions,
};
use crate::generic::{self, GrepSearch};
use crate::path::{FsPath, NameCase};

/// Options of [`LocalFs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalFsOptions {
    /// Refuse to read or append to a regular file with more than one hard link (a hard link
    /// can name a file outside the root). Default `true`.
    pub refuse_hard_links: bool,
    /// Largest file `read_bytes`/`read` will load. Default 256 MiB.
    pub max_file_bytes: u64,
    /// Create new files `0600` and new directories `0700` (runtime data: session logs,
    /// indexes, offloaded results, memory). Default `false` (the process umask decides).
    pub private: bool,
}

impl Default for LocalFsOptions {
    fn default() -> Self {
        LocalFsOptions {
            refuse_hard_links: true,
            max_file_bytes: 256 * 1024 * 1024,
            private: false,
        }
    }
}

const LOCK_STRIPES: usize = 64;

/// What [`Inner::write`] did.
#[derive(Debug)]
struct Written {
    version: Version,
    /// The file that was replaced, still open, when the write ran on the caller's thread:
    /// closing it may free its blocks, which must happen where waiting is allowed. On the
    /// blocking pool it is closed by the write itself (`None`).
    replaced: Option<cap_std::fs::File>,
}

#[derive(Debug)]
struct Inner {
    root: Dir,
    root_path: PathBuf,
    options: LocalFsOptions,
    locks: Vec<Mutex<()>>,
    tmp_counter: AtomicU64,
    name_case: std::sync::OnceLock<NameCase>,
}

/// A filesystem rooted at a local directory.
///
/// Every operation goes through a [`cap_std::fs::Dir`] capability opened once on the root,
/// so resolution happens in the kernel (`openat2(RESOLVE_BENEATH)` where available) at the
/// moment a file is opened: `..`, absolute symlinks and relative symlinks that climb out are
/// refused with `permission_denied`, with no check-then-open window. In addition:
///
/// * files are opened `O_NONBLOCK | O_NOCTTY` and refused unless they are regular files
///   (devices, FIFOs, sockets: `permission_denied`);
/// * a regular file with more than one hard link is refused for reading and appending
///   ([`LocalFsOptions::refuse_hard_links`]); writes replace the name, never the inode;
/// * writes go to a temp file in the same directory, are fsynced, renamed over the target
///   and the directory is fsynced; `CreateNew` uses `renameat2(RENAME_NOREPLACE)`, so it is
///   race-free across processes; `IfMatch` holds an exclusive `flock` on the current file
///   from the check to the rename, so compare-and-set is atomic across processes too;
///   `append` is serialised per path within the process (striped locks);
/// * symlinks whose target leaves the root are invisible in `list`; `grep` and `glob`
///   skip every symlink (walks do not follow links); [`Links`] says where a path leads.
#[derive(Debug, Clone)]
pub struct LocalFs {
    inner: Arc<Inner>,
}

fn errno_of(e: &io::Error) -> Option<Errno> {
    e.raw_os_error().map(Errno::from_raw_os_error)
}

fn map_io(path: &FsPath, e: io::Error) -> Error {
    let p = path.to_string();
    let refused = match errno_of(&e) {
        Some(Errno::NOENT) => return Error::NotFound { path: p },
        Some(Errno::NOTDIR) => return Error::NotADirectory { path: p },
        Some(Errno::ISDIR) => return Error::IsDirectory { path: p },
        Some(Errno::EXIST) => return Error::AlreadyExists { path: p },
        Some(Errno::NOTEMPTY) => return Error::AlreadyExists { path: p },
        Some(Errno::NAMETOOLONG) => {
            return Error::InvalidPath {
                path: p,
                reason: "name too long for this filesystem".into(),
            };
        }
        Some(Errno::LOOP) => Some("too many levels of symbolic links"),
        Some(Errno::ACCESS | Errno::PERM | Errno::ROFS) => {
            Some("the operating system refused access")
        }
        Some(Errno::NXIO | Errno::NODEV) => Some("not a regular file (device, FIFO or socket)"),
        Some(Errno::XDEV) => Some("the path crosses a mount point"),
        _ => None,
    };
    if let Some(reason) = refused {
        return Error::PermissionDenied {
            path: p,
            reason: reason.into(),
        };
    }
    match e.kind() {
        io::ErrorKind::NotFound => Error::NotFound { path: p },
        io::ErrorKind::PermissionDenied => Error::PermissionDenied {
            path: p,
            reason: "the path leads outside the workspace root".into(),
        },
        io::ErrorKind::AlreadyExists => Error::AlreadyExists { path: p },
        _ => Error::backend(format!("I/O error on {p}"), e),
    }
}

/// Why an operation tried on the caller's thread did not finish there: it would have to
/// wait (a lock held, a large file), so it runs again on the blocking pool; or it failed.
#[derive(Debug)]
enum Busy {
    Wait,
    Failed(Error),
}

type Attempt<T> = std::result::Result<T, Busy>;

impl From<Error> for Busy {
    fn from(e: Error) -> Self {
        Busy::Failed(e)
    }
}

impl Busy {
    /// The error of an attempt that was allowed to wait (so `Wait` cannot happen).
    fn into_error(self) -> Error {
        match self {
            Busy::Failed(e) => e,
            Busy::Wait => Error::backend(
                "a filesystem operation that may wait reported that it would block",
                io::Error::from(io::ErrorKind::WouldBlock),
            ),
        }
    }
}

fn rel(path: &FsPath) -> &Path {
    if path.is_root() {
        Path::new(".")
    } else {
        Path::new(path.as_str())
    }
}

fn modified(md: &cap_std::fs::Metadata) -> Option<DateTime<Utc>> {
    md.modified()
        .ok()
        .map(|t| DateTime::<Utc>::from(t.into_std()))
}

fn file_info(path: &FsPath, md: &cap_std::fs::Metadata) -> Option<FileInfo> {
    let kind = if md.is_dir() {
        FileKind::Dir
    } else if md.is_file() {
        FileKind::File
    } else {
        return None;
    };
    Some(FileInfo {
        path: path.clone(),
        kind,
        size: if kind == FileKind::File { md.len() } else { 0 },
        modified: modified(md),
    })
}

impl Inner {
    fn lock_for(&self, path: &FsPath) -> std::sync::MutexGuard<'_, ()> {
        // The guarded value is `()`: a poisoned lock carries no broken state.
        self.stripe(path).lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The stripe lock of `path` for a write or an append: waited for, or (`wait` false)
    /// `Busy::Wait` when another writer holds it. The root is a directory: never written.
    fn lock_to_change(&self, path: &FsPath, wait: bool) -> Attempt<std::sync::MutexGuard<'_, ()>> {
        if path.is_root() {
            return Err(Busy::Failed(Error::IsDirectory {
                path: path.to_string(),
            }));
        }
        if wait {
            Ok(self.lock_for(path))
        } else {
            self.try_lock_for(path)
        }
    }

    /// The stripe lock of `path` if it is free now (`Busy` otherwise): for the calls made
    /// on the caller's thread, which must not wait.
    fn try_lock_for(&self, path: &FsPath) -> Attempt<std::sync::MutexGuard<'_, ()>> {
        match self.stripe(path).try_lock() {
            Ok(g) => Ok(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Err(Busy::Wait),
        }
    }

    fn stripe(&self, path: &FsPath) -> &Mutex<()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        path.hash(&mut h);
        &self.locks[(h.finish() as usize) % LOCK_STRIPES]
    }

    fn stat(&self, path: &FsPath) -> Result<FileInfo> {
        let md = self.root.metadata(rel(path)).map_err(|e| map_io(path, e))?;
        file_info(path, &md).ok_or_else(|| Error::PermissionDenied {
            path: path.to_string(),
            reason: "not a regular file or directory (device, FIFO or socket)".into(),
        })
    }

    /// Opens a regular file for reading, refusing devices, FIFOs and hard links.
    fn open_regular(
        &self,
        path: &FsPath,
        append: bool,
    ) -> Result<(cap_std::fs::File, cap_std::fs::Metadata)> {
        let mut oo = OpenOptions::new();
        if append {
            oo.append(true).create(true);
            if self.options.private {
                oo.mode(0o600);
            }
        } else {
            oo.read(true);
        }
        let flags = rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY;
        oo.custom_flags(flags.bits() as i32);
        let f = self
            .root
            .open_with(rel(path), &oo)
            .map_err(|e| map_io(path, e))?;
        let md = f.metadata().map_err(|e| map_io(path, e))?;
        if md.is_dir() {
            return Err(Error::IsDirectory {
                path: path.to_string(),
            });
        }
        if !md.is_file() {
            return Err(Error::PermissionDenied {
                path: path.to_string(),
                reason: "not a regular file (device, FIFO or socket)".into(),
            });
        }
        if self.options.refuse_hard_links && md.nlink() > 1 {
            return Err(Error::PermissionDenied {
                path: path.to_string(),
                reason: "the file has several hard links and may live outside the workspace".into(),
            });
        }
        Ok((f, md))
    }

    fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
        self.read_bytes_upto(path, u64::MAX)
            .map_err(Busy::into_error)
    }

    /// `read_bytes` of a file of at most `inline_max` bytes (`Busy` for a larger one).
    fn read_bytes_upto(&self, path: &FsPath, inline_max: u64) -> Attempt<Vec<u8>> {
        if path.is_root() {
            return Err(Busy::Failed(Error::IsDirectory {
                path: path.to_string(),
            }));
        }
        let (f, md) = self.open_regular(path, false)?;
        let size = md.len();
        if size > self.options.max_file_bytes {
            return Err(Busy::Failed(Error::TooLarge {
                path: path.to_string(),
                size,
                limit: self.options.max_file_bytes,
            }));
        }
        if size > inline_max {
            return Err(Busy::Wait);
        }
        // One byte more than the size seen, so a file that grew since is read to its end;
        // through `take` because `File::read_to_end` asks the kernel for the size and the
        // position again (`statx` + `lseek`) to size its buffer.
        let mut buf = Vec::with_capacity(size as usize + 1);
        f.into_std()
            .take(self.options.max_file_bytes)
            .read_to_end(&mut buf)
            .map_err(|e| map_io(path, e))?;
        Ok(buf)
    }

    /// Creates the parents of `path`; a file among them is `not_a_directory`.
    fn ensure_parents(&self, path: &FsPath) -> Result<()> {
        let Some(parent) = path.parent() else {
            return Ok(());
        };
        let mut cur = FsPath::root();
        for seg in parent.segments() {
            cur = cur.join_path(&FsPath::parse(seg)?);
            match self.root.metadata(rel(&cur)) {
                Ok(md) if md.is_dir() => continue,
                Ok(_) => {
                    return Err(Error::NotADirectory {
                        path: cur.to_string(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let made = if self.options.private {
                        let mut b = cap_std::fs::DirBuilder::new();
                        cap_std::fs::DirBuilderExt::mode(&mut b, 0o700);
                        self.root.create_dir_with(rel(&cur), &b)
                    } else {
                        self.root.create_dir(rel(&cur))
                    };
                    match made {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(map_io(&cur, e)),
                    }
                }
                Err(e) => return Err(map_io(&cur, e)),
            }
        }
        Ok(())
    }

    /// An exclusive `flock` on the file now at `path`, taken by every compare-and-set
    /// writer of this path in any process. A writer that locked an inode another writer
    /// has just renamed away sees a different inode at `path` and locks again, so exactly
    /// one writer at a time checks and replaces the current content.
    fn lock_current(&self, path: &FsPath, wait: bool) -> Attempt<cap_std::fs::File> {
        use rustix::fs::{AtFlags, FlockOperation, flock, fstat, statat};
        for _ in 0..64 {
            let (f, _) = self.open_regular(path, false)?;
            let op = if wait {
                FlockOperation::LockExclusive
            } else {
                FlockOperation::NonBlockingLockExclusive
            };
            match flock(&f, op) {
                Ok(()) => {}
                Err(Errno::WOULDBLOCK) if !wait => return Err(Busy::Wait),
                Err(e) => return Err(Busy::Failed(map_io(path, e.into()))),
            }
            let held = fstat(&f).map_err(|e| map_io(path, e.into()))?;
            let dir = self.parent_dir(path)?;
            match statat(&dir, path.file_name(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(now) if now.st_ino == held.st_ino && now.st_dev == held.st_dev => {
                    return Ok(f);
                }
                Ok(_) => continue,
                Err(rustix::io::Errno::NOENT) => {
                    return Err(Busy::Failed(Error::Conflict {
                        path: path.to_string(),
                        reason: "the file no longer exists".into(),
                    }));
                }
                Err(e) => return Err(Busy::Failed(map_io(path, e.into()))),
            }
        }
        Err(Busy::Failed(Error::Conflict {
            path: path.to_string(),
            reason: "the file kept changing while waiting for its lock".into(),
        }))
    }

    /// The directory `path` is in, created (with its parents) if missing.
    fn parent_dir_created(&self, path: &FsPath) -> Result<Dir> {
        match self.parent_dir(path) {
            Err(Error::NotFound { .. }) => {
                self.ensure_parents(path)?;
                self.parent_dir(path)
            }
            other => other,
        }
    }

    fn parent_dir(&self, path: &FsPath) -> Result<Dir> {
        let parent = path.parent().unwrap_or_default();
        self.root
            .open_dir(rel(&parent))
            .map_err(|e| map_io(&parent, e))
    }

    /// A positioned read of at most `len` bytes from `offset`: only the range is read, so
    /// paging a large log costs the page, not the file. The range (not the file) is held
    /// to `max_file_bytes`.
    fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
        if path.is_root() {
            return Err(Error::IsDirectory {
                path: path.to_string(),
            });
        }
        let (f, md) = self.open_regular(path, false)?;
        let size = md.len();
        let want = len.min(size.saturating_sub(offset));
        if want > self.options.max_file_bytes {
            return Err(Error::TooLarge {
                path: path.to_string(),
                size: want,
                limit: self.options.max_file_bytes,
            });
        }
        let mut buf = Vec::with_capacity(usize::try_from(want).unwrap_or(0));
        if want > 0 {
            let mut f = f.into_std();
            f.seek(io::SeekFrom::Start(offset))
                .map_err(|e| map_io(path, e))?;
            f.take(want)
                .read_to_end(&mut buf)
                .map_err(|e| map_io(path, e))?;
        }
        Ok(buf)
    }

    /// Writes `data` to `path` (temp file, rename); with `wait` false it gives up with
    /// `Busy` instead of waiting for a lock another writer holds.
    fn write(
        &self,
        path: &FsPath,
        data: &[u8],
        mode: &WriteMode,
        synced: bool,
        wait: bool,
    ) -> Attempt<Written> {
        let _guard = self.lock_to_change(path, wait)?;
        let mut _cas_lock: Option<cap_std::fs::File> = None;
        let dir = self.parent_dir_created(path)?;
        let existing = match self.root.metadata(rel(path)) {
            Ok(md) => Some(md),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(map_io(path, e).into()),
        };
        if existing.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(Busy::Failed(Error::IsDirectory {
                path: path.to_string(),
            }));
        }
        match (mode, &existing) {
            (WriteMode::CreateNew, Some(_)) => {
                return Err(Busy::Failed(Error::AlreadyExists {
                    path: path.to_string(),
                }));
            }
            (WriteMode::IfMatch(_), None) => {
                return Err(Busy::Failed(Error::Conflict {
                    path: path.to_string(),
                    reason: "the file no longer exists".into(),
                }));
            }
            (WriteMode::IfMatch(v), Some(_)) => {
                // Held until the rename below: the compare-and-set is atomic across
                // processes, not only within this one. The locked file is the current one.
                let mut current_file = self.lock_current(path, wait)?;
                let mut current = Vec::new();
                (&mut current_file)
                    .take(self.options.max_file_bytes)
                    .read_to_end(&mut current)
                    .map_err(|e| map_io(path, e))?;
                if Version::of(&current) != *v {
                    return Err(Busy::Failed(Error::Conflict {
                        path: path.to_string(),
                        reason: "the content is not the expected version".into(),
                    }));
                }
                _cas_lock = Some(current_file);
            }
            (_, Some(_)) if !wait => {
                // Hold the file being replaced open across the rename, so that its blocks
                // are not freed here (see `Written::replaced`). Gone meanwhile: nothing to
                // free.
                _cas_lock = self.root.open(rel(path)).ok();
            }
            _ => {}
        }
        let name = path.file_name();
        let tmp = format!(
            ".hame-tmp-{}-{}",
            std::process::id(),
            self.tmp_counter.fetch_add(1, Ordering::Relaxed)
        );
        let result = (|| -> Result<()> {
            let mut oo = OpenOptions::new();
            oo.write(true).create_new(true);
            if self.options.private {
                oo.mode(0o600);
            }
            let mut f = dir.open_with(&tmp, &oo).map_err(|e| map_io(path, e))?;
            f.write_all(data).map_err(|e| map_io(path, e))?;
            if let Some(md) = &existing {
                // Keep the mode of the file being replaced.
                let _ = f.set_permissions(md.permissions());
            }
            if synced {
                f.sync_all().map_err(|e| map_io(path, e))?;
            }
            let flags = if matches!(mode, WriteMode::CreateNew) {
                rustix::fs::RenameFlags::NOREPLACE
            } else {
                rustix::fs::RenameFlags::empty()
            };
            rustix::fs::renameat_with(&dir, tmp.as_str(), &dir, name, flags)
                .map_err(|e| map_io(path, io::Error::from(e)))?;
            Ok(())
        })();
        if let Err(e) = result {
            let _ = dir.remove_file(&tmp);
            return Err(e.into());
        }
        if synced {
            sync_dir(&dir);
        }
        Ok(Written {
            version: Version::of(data),
            // On the blocking pool the replaced file is closed here, with the lock guard.
            replaced: if wait { None } else { _cas_lock },
        })
    }

    /// Appends `data`; `fdatasync`s the file when `synced` (which also flushes what earlier
    /// unsynced appends left). Off the blocking pool (`wait` false) it gives up with
    /// `Busy::Wait` when the path's stripe lock is taken.
    fn append(&self, path: &FsPath, data: &[u8], synced: bool, wait: bool) -> Attempt<()> {
        let _guard = self.lock_to_change(path, wait)?;
        // The parents exist nearly always (the log of a session being continued): they
        // are created only when the open finds them missing.
        let (mut f, _) = match self.open_regular(path, true) {
            Err(Error::NotFound { .. }) => {
                self.ensure_parents(path)?;
                self.open_regular(path, true)?
            }
            other => other?,
        };
        if !data.is_empty() {
            f.write_all(data).map_err(|e| map_io(path, e))?;
        }
        if synced {
            f.sync_data().map_err(|e| map_io(path, e))?;
        }
        Ok(())
    }

    fn probe_name_case(&self) -> NameCase {
        let lower = format!(
            ".hame-tmp-{}-{}-case",
            std::process::id(),
            self.tmp_counter.fetch_add(1, Ordering::Relaxed)
        );
        if self.root.create(&lower).is_ok() {
            let folded = self.root.symlink_metadata(lower.to_uppercase()).is_ok();
            let _ = self.root.remove_file(&lower);
            return if folded {
                NameCase::Insensitive
            } else {
                NameCase::Sensitive
            };
        }
        let Ok(entries) = self.root.entries() else {
            return NameCase::Sensitive;
        };
        let names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .collect();
        for name in &names {
            let other: String = name
                .chars()
                .map(|c| {
                    if c.is_ascii_lowercase() {
                        c.to_ascii_uppercase()
                    } else {
                        c.to_ascii_lowercase()
                    }
                })
                .collect();
            if other == *name || names.contains(&other) {
                continue;
            }
            let (Ok(a), Ok(b)) = (
                self.root.symlink_metadata(name),
                self.root.symlink_metadata(&other),
            ) else {
                return NameCase::Sensitive;
            };
            return if a.ino() == b.ino() && a.dev() == b.dev() {
                NameCase::Insensitive
            } else {
                NameCase::Sensitive
            };
        }
        NameCase::Sensitive
    }

    /// Whether `base` names itself, asked with one `openat2(RESOLVE_NO_SYMLINKS)` and no
    /// read of `/proc` (what `canonicalize` costs: two `readlink`s): `Some(true)`, it exists
    /// and no component is a link; `Some(false)`, a component is missing and none before
    /// it is a link (so `canonicalize` would say `not found` too); `None`, a link is on the
    /// way (or the kernel has no `openat2`): ask `canonicalize`.
    fn names_itself(&self, base: &FsPath) -> Option<bool> {
        use rustix::fs::{Mode, OFlags, ResolveFlags};
        match rustix::fs::openat2(
            &self.root,
            rel(base),
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
        ) {
            Ok(_) => Some(true),
            Err(Errno::NOENT) => Some(false),
            Err(_) => None,
        }
    }

    fn resolve(&self, path: &FsPath) -> Result<FsPath> {
        let mut rest: Vec<String> = Vec::new();
        let mut base = path.clone();
        loop {
            if base.is_root() {
                return Ok(path.clone());
            }
            match self.names_itself(&base) {
                // No link up to `base`: `path` is where it leads.
                Some(true) => return Ok(path.clone()),
                Some(false) => {
                    rest.push(base.file_name().to_owned());
                    base = base.parent().unwrap_or_default();
                    continue;
                }
                None => {}
            }
            match self.root.canonicalize(rel(&base)) {
                Ok(real) => {
                    let real = real.to_str().ok_or_else(|| Error::PermissionDenied {
                        path: path.to_string(),
                        reason: "a link leads to a name that is not UTF-8".into(),
                    })?;
                    let mut out = FsPath::parse(real)?;
                    for seg in rest.iter().rev() {
                        out = out.join(seg)?;
                    }
                    return Ok(out);
                }
                Err(e)
                    if errno_of(&e) == Some(Errno::NOENT)
                        || e.kind() == io::ErrorKind::NotFound =>
                {
                    rest.push(base.file_name().to_owned());
                    base = base.parent().unwrap_or_default();
                }
                Err(e) => return Err(map_io(path, e)),
            }
        }
    }

    fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
        let md = self.root.metadata(rel(path)).map_err(|e| map_io(path, e))?;
        if !md.is_dir() {
            return Err(Error::NotADirectory {
                path: path.to_string(),
            });
        }
        let mut out = Vec::new();
        for entry in self.root.read_dir(rel(path)).map_err(|e| map_io(path, e))? {
            let entry = entry.map_err(|e| map_io(path, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue; // not UTF-8: not addressable by FsPath
            };
            if name.starts_with(".hame-tmp-") {
                continue;
            }
            let Ok(child) = path.join(name) else { continue };
            // A symlink leading out of the root fails and is skipped.
            let Ok(md) = self.entry_metadata(&entry, &child) else {
                continue;
            };
            if let Some(info) = file_info(&child, &md) {
                out.push(info);
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// The metadata of directory entry `entry` (at `child`): its own, one `fstatat` beside
    /// the open directory, or for a symlink its target's, resolved from the root (so one
    /// leading out fails). Resolving every entry from the root cost three syscalls each: a
    /// 500-file `knowledge/`, listed at every step, took ~2 ms.
    fn entry_metadata(
        &self,
        entry: &cap_std::fs::DirEntry,
        child: &FsPath,
    ) -> io::Result<cap_std::fs::Metadata> {
        if entry.file_type()?.is_symlink() {
            self.root.metadata(rel(child))
        } else {
            entry.metadata()
        }
    }

    /// Every regular file below `base`, sorted. Symbolic links are skipped, to files and
    /// to directories alike (ripgrep's default): a walk never leads elsewhere than the tree
    /// it names, so a view that hides parts of the tree by path sees every file a walk
    /// returns under the path it has.
    fn walk(&self, base: &FsPath) -> Result<Vec<FileInfo>> {
        let info = self.stat(base)?;
        if !info.is_dir() {
            return Ok(vec![info]);
        }
        let mut out = Vec::new();
        let mut stack = vec![base.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = self.root.read_dir(rel(&dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.starts_with(".hame-tmp-") {
                    continue;
                }
                let Ok(child) = dir.join(name) else { continue };
                let Ok(ft) = entry.file_type() else { continue };
                if ft.is_dir() {
                    stack.push(child);
                } else if ft.is_file()
                    && let Ok(md) = entry.metadata()
                {
                    out.push(FileInfo {
                        path: child,
                        kind: FileKind::File,
                        size: md.len(),
                        modified: modified(&md),
                    });
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// One listing of `list_many`: `list`, the named children (`by_name`: one `stat` per
    /// name, not per entry; only where names are case-sensitive, so that each entry is
    /// named as `list` names it), or the walk of a directory.
    fn listing(&self, request: &ListRequest, by_name: bool) -> Result<Listing> {
        let entries = match &request.names {
            _ if request.recursive => {
                if !self.stat(&request.path)?.is_dir() {
                    return Err(Error::NotADirectory {
                        path: request.path.to_string(),
                    });
                }
                self.walk(&request.path)?
            }
            Some(names) if by_name => self.named(&request.path, names)?,
            _ => self.list(&request.path)?,
        };
        Ok(request.answer(entries))
    }

    /// The children of `path` named one of `names`, as [`list`](Self::list) gives them.
    fn named(&self, path: &FsPath, names: &[String]) -> Result<Vec<FileInfo>> {
        // The root is a directory (the filesystem opened it as one): no `stat` of it.
        if !path.is_root() {
            let md = self.root.metadata(rel(path)).map_err(|e| map_io(path, e))?;
            if !md.is_dir() {
                return Err(Error::NotADirectory {
                    path: path.to_string(),
                });
            }
        }
        let mut out: Vec<FileInfo> = Vec::with_capacity(names.len());
        for (name, child) in children_named(path, names.iter().map(String::as_str)) {
            if name.starts_with(".hame-tmp-") {
                continue;
            }
            let Ok(own) = self.root.symlink_metadata(rel(&child)) else {
                continue;
            };
            // A symlink shows its target's metadata, resolved from the root; one leading
            // out of the root fails and is skipped (as `list` does).
            let md = if own.is_symlink() {
                match self.root.metadata(rel(&child)) {
                    Ok(md) => md,
                    Err(_) => continue,
                }
            } else {
                own
            };
            if let Some(info) = file_info(&child, &md) {
                out.push(info);
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// The shared grep engine over the blocking walk, one file at a time.
    fn grep(&self, request: &GrepRequest) -> Result<GrepOutput> {
        let mut search = GrepSearch::new(request)?;
        for f in self.walk(&request.path)? {
            if search.wants(&f) && !search.feed(&f.path, self.read_bytes(&f.path))? {
                break;
            }
        }
        Ok(search.finish())
    }

    fn delete(&self, path: &FsPath, options: DeleteOptions) -> Result<()> {
        if path.is_root() {
            return Err(Error::PermissionDenied {
                path: path.to_string(),
                reason: "the root cannot be deleted".into(),
            });
        }
        let _guard = self.lock_for(path);
        let md = self
            .root
            .symlink_metadata(rel(path))
            .map_err(|e| map_io(path, e))?;
        if md.is_dir() {
            if !options.recursive {
                return Err(Error::IsDirectory {
                    path: path.to_string(),
                });
            }
            self.root
                .remove_dir_all(rel(path))
                .map_err(|e| map_io(path, e))
        } else {
            self.root
                .remove_file(rel(path))
                .map_err(|e| map_io(path, e))
        }
    }

    fn rename(&self, from: &FsPath, to: &FsPath, options: RenameOptions) -> Result<()> {
        if from.is_root() || to.is_root() {
            return Err(Error::PermissionDenied {
                path: from.to_string(),
                reason: "the root cannot be moved or replaced".into(),
            });
        }
        let src = self
            .root
            .symlink_metadata(rel(from))
            .map_err(|e| map_io(from, e))?;
        if from == to {
            return Ok(());
        }
        if src.is_dir() && to.starts_with(from) {
            return Err(Error::invalid_argument(format!(
                "cannot move {from} into itself ({to})"
            )));
        }
        let _guard = self.lock_for(to);
        self.ensure_parents(to)?;
        let mut flags = rustix::fs::RenameFlags::NOREPLACE;
        match self.root.symlink_metadata(rel(to)) {
            Ok(dst) if dst.is_dir() => {
                return Err(if src.is_dir() {
                    Error::AlreadyExists {
                        path: to.to_string(),
                    }
                } else {
                    Error::IsDirectory {
                        path: to.to_string(),
                    }
                });
            }
            Ok(_) if options.overwrite && !src.is_dir() => flags = rustix::fs::RenameFlags::empty(),
            Ok(_) => {
                return Err(Error::AlreadyExists {
                    path: to.to_string(),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(map_io(to, e)),
        }
        let from_dir = self.parent_dir(from)?;
        let to_dir = self.parent_dir(to)?;
        rustix::fs::renameat_with(&from_dir, from.file_name(), &to_dir, to.file_name(), flags)
            .map_err(|e| map_io(to, io::Error::from(e)))
    }
}

impl LocalFs {
    /// Opens `root` (which must exist and be a directory) with default options.
    pub fn new(root: impl AsRef<Path>) -> Result<Self> {
        Self::with_options(root, LocalFsOptions::default())
    }

    /// Opens `root` with options.
    pub fn with_options(root: impl AsRef<Path>, options: LocalFsOptions) -> Result<Self> {
        let root_path = root.as_ref().to_path_buf();
        let dir = Dir::open_ambient_dir(&root_path, cap_std::ambient_authority()).map_err(|e| {
            Error::backend(
                format!("cannot open the workspace root {}", root_path.display()),
                e,
            )
        })?;
        Ok(LocalFs {
            inner: Arc::new(Inner {
                root: dir,
                root_path,
                options,
                locks: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
                tmp_counter: AtomicU64::new(0),
                name_case: std::sync::OnceLock::new(),
            }),
        })
    }

    /// The host directory this filesystem is rooted at.
    pub fn root_path(&self) -> &Path {
        &self.inner.root_path
    }

    /// Whether the filesystem under the root folds case (`A` and `a` one file), found once
    /// and remembered: a temporary `.hame-tmp-…-case` file is created in the root and
    /// looked up in upper case, then removed; where the root is not writable, an entry of
    /// the root with a letter is looked up in the other case (same inode: folding). Without
    /// evidence: [`NameCase::Sensitive`]. A folder below the root with its own setting
    /// (ext4's per-directory casefold attribute) is not seen.
    pub fn name_case(&self) -> NameCase {
        *self
            .inner
            .name_case
            .get_or_init(|| self.inner.probe_name_case())
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| Error::backend("a blocking filesystem task failed", e))?
    }

    /// Runs `f` on the caller's thread; if it would wait (a lock held, a large file),
    /// runs it again on the blocking pool allowed to wait (see [`INLINE_READ_MAX`]).
    async fn inline_or_blocking<T: Send + 'static>(
        &self,
        f: impl Fn(&Inner, bool) -> Attempt<T> + Send + 'static,
    ) -> Result<T> {
        match f(&self.inner, false) {
            Ok(v) => Ok(v),
            Err(Busy::Failed(e)) => Err(e),
            Err(Busy::Wait) => {
                self.blocking(move |i| f(i, true).map_err(Busy::into_error))
                    .await
            }
        }
    }
}

/// The largest file `read_bytes` reads on the caller's thread; a larger one is read on
/// tokio's blocking pool (1 MiB: about a millisecond from the page cache).
///
/// Operations that do not wait for the disk — `stat`, `list`, `exists`, reads of files up
/// to this size, ranges up to this size, and writes that are not `Synced` when their
/// locks are free — run on the calling task's thread: on a local disk they complete from
/// the page cache in microseconds, less than a hand-off to the blocking pool (a thread
/// wake-up each way); so do appends that are not `Synced`. Everything that `fsync`s
/// (`Synced` writes and appends), walks a tree
/// (`grep`, `glob`), deletes or renames, or would wait for a lock runs on the blocking
/// pool. On a slow or remote mount (NFS, FUSE) the inline calls stall the runtime's
/// worker for their duration.
pub const INLINE_READ_MAX: u64 = 1024 * 1024;

impl Links for LocalFs {
    fn resolve(&self, path: &FsPath) -> Result<FsPath> {
        self.inner.resolve(path)
    }

    fn links_in(&self, dir: &FsPath) -> Result<Vec<String>> {
        let entries = self
            .inner
            .root
            .read_dir(rel(dir))
            .map_err(|e| map_io(dir, e))?;
        Ok(entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .collect())
    }

    /// One `lstat` per name, not a read of the directory.
    fn links_among(&self, dir: &FsPath, names: &[&str]) -> Result<Vec<String>> {
        let mut links = Vec::new();
        for (name, child) in children_named(dir, names.iter().copied()) {
            if self
                .inner
                .root
                .symlink_metadata(rel(&child))
                .is_ok_and(|md| md.is_symlink())
            {
                links.push(name.to_owned());
            }
        }
        Ok(links)
    }
}

#[async_trait]
impl Filesystem for LocalFs {
    async fn stat(&self, path: &FsPath) -> Result<FileInfo> {
        self.inner.stat(path)
    }

    async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
        self.inner.list(path)
    }

    async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
        let path = path.clone();
        self.inline_or_blocking(move |i, wait| {
            i.read_bytes_upto(&path, if wait { u64::MAX } else { INLINE_READ_MAX })
        })
        .await
    }

    async fn write(&self, path: &FsPath, data: Vec<u8>, options: WriteOptions) -> Result<Version> {
        let path = path.clone();
        if options.durability == crate::fs::Durability::Synced {
            return self
                .blocking(move |i| {
                    i.write(&path, &data, &options.mode, true, true)
                        .map(|w| w.version)
                        .map_err(Busy::into_error)
                })
                .await;
        }
        let written = self
            .inline_or_blocking(move |i, wait| i.write(&path, &data, &options.mode, false, wait))
            .await?;
        if let Some(file) = written.replaced {
            // The last close of a replaced file frees its blocks, which waits for the
            // device on a filesystem mounted with online `discard` (0.3-1 ms a file on a
            // virtual disk): never on the runtime's thread. Nothing waits for it; the
            // file's lock, if it was a compare-and-set's, is no longer looked at.
            drop(tokio::task::spawn_blocking(move || drop(file)));
        }
        Ok(written.version)
    }

    async fn delete(&self, path: &FsPath, options: DeleteOptions) -> Result<()> {
        let path = path.clone();
        self.blocking(move |i| i.delete(&path, options)).await
    }

    async fn rename(&self, from: &FsPath, to: &FsPath, options: RenameOptions) -> Result<()> {
        let (from, to) = (from.clone(), to.clone());
        self.blocking(move |i| i.rename(&from, &to, options)).await
    }

    async fn exists(&self, path: &FsPath) -> Result<bool> {
        generic::exists(self, path).await
    }

    async fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
        if len <= INLINE_READ_MAX {
            return self.inner.read_range(path, offset, len);
        }
        let path = path.clone();
        self.blocking(move |i| i.read_range(&path, offset, len))
            .await
    }

    async fn append(&self, path: &FsPath, data: Vec<u8>, options: AppendOptions) -> Result<()> {
        let path = path.clone();
        if options.durability == crate::fs::Durability::Synced {
            return self
                .blocking(move |i| i.append(&path, &data, true, true).map_err(Busy::into_error))
                .await;
        }
        // Not flushed: a write into the page cache, on the caller's thread unless its lock
        // is taken (ADR 0016).
        self.inline_or_blocking(move |i, wait| i.append(&path, &data, false, wait))
            .await
    }

    async fn edit(&self, path: &FsPath, request: &EditRequest) -> Result<EditOutcome> {
        generic::edit_via_cas(self, path, request).await
    }

    async fn grep(&self, request: &GrepRequest) -> Result<GrepOutput> {
        let request = request.clone();
        self.blocking(move |i| i.grep(&request)).await
    }

    async fn glob(&self, request: &GlobRequest) -> Result<GlobOutput> {
        generic::compile_glob(&request.pattern)?;
        let request = request.clone();
        self.blocking(move |i| {
            let files = i.walk(&request.path)?;
            generic::glob_filter(&request, files)
        })
        .await
    }

    /// Listings of children, and the `stat` that finds a recursive listing's folder
    /// missing, run on the caller's thread as `list` and `stat` do; the walks of the
    /// folders that exist run on the blocking pool, all of them in one hand-off. A
    /// recursive listing that the batch's child listings settle ([`generic::settled`]: a
    /// probe of the root's names that found no `skills/`) costs no call at all, on a
    /// filesystem that compares names exactly.
    async fn list_many(&self, requests: &[ListRequest]) -> Result<Vec<Result<Listing>>> {
        let mut parts = generic::ListParts::new(requests.len());
        let exact = self.name_case() == NameCase::Sensitive;
        let mut children: Vec<(&ListRequest, Listing)> = Vec::new();
        for (i, r) in requests.iter().enumerate().filter(|(_, r)| !r.recursive) {
            let answer = self.inner.listing(r, exact && r.names.is_some());
            if exact && let Ok(l) = &answer {
                children.push((r, l.clone()));
            }
            parts.answer(i, answer);
        }
        let mut walks = Vec::new();
        for (i, r) in requests.iter().enumerate().filter(|(_, r)| r.recursive) {
            if let Some(answer) = generic::settled(r, &children) {
                parts.answer(i, answer);
                continue;
            }
            match self.inner.stat(&r.path) {
                Ok(info) if info.is_dir() => walks.push((i, r.clone())),
                Ok(_) => parts.answer(
                    i,
                    Err(Error::NotADirectory {
                        path: r.path.to_string(),
                    }),
                ),
                Err(e) => parts.answer(i, Err(e)),
            }
        }
        if !walks.is_empty() {
            let walked = self
                .blocking(move |inner| {
                    Ok(walks
                        .into_iter()
                        .map(|(i, r)| (i, inner.listing(&r, false)))
                        .collect::<Vec<_>>())
                })
                .await?;
            for (i, answer) in walked {
                parts.answer(i, answer);
            }
        }
        parts.finish(self, |_, answer| answer).await
    }
}

/// The direct children of `dir` that `names` name, each once, in order: only a name that is
/// exactly one segment names one (`a/b`, `..`, `.`, `a/`, `./a` and the empty name none, as
/// `list` filtered by name gives none for them).
fn children_named<'a>(
    dir: &FsPath,
    names: impl IntoIterator<Item = &'a str>,
) -> Vec<(&'a str, FsPath)> {
    let mut out: Vec<(&'a str, FsPath)> = Vec::new();
    for name in names {
        let Ok(child) = dir.join(name) else { continue };
        if child.file_name() == name
            && child.parent().as_ref() == Some(dir)
            && !out.iter().any(|(_, c)| *c == child)
        {
            out.push((name, child));
        }
    }
    out
}

/// `fsync`s the directory `dir`, so that a rename in it survives a crash of the machine. A
/// [`Dir`] of cap-std is an `O_PATH` handle, which `fsync` refuses (`EBADF`): the directory
/// itself is opened for it. A failure is logged, not returned: the rename it follows has
/// happened.
fn sync_dir(dir: &Dir) {
    use rustix::fs::{Mode, OFlags};
    let synced = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .and_then(|d| rustix::fs::fsync(&d));
    if let Err(e) = synced {
        tracing::warn!(error = %e, "syncing a directory after a rename failed");
    }
}

#[cfg(test)]
#[path = "local_tests.rs"]
mod tests;
