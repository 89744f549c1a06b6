//! The [`Filesystem`] trait, its conveniences ([`FilesystemExt`]), its option and result
//! types, and the [`Execute`] capability.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::error::Result;
use crate::generic;
use crate::path::FsPath;

/// Default number of lines [`ReadWindow`] returns when no limit is given.
pub const DEFAULT_READ_LINES: usize = 2000;
/// Files larger than this are skipped by the generic `grep` (they are not searched).
pub const GREP_MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;
/// How many leading bytes are inspected for a NUL byte to decide a file is binary.
pub const BINARY_SNIFF_BYTES: usize = 8192;

/// Kind of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
}

/// An optional ability (like [`Execute`]): a filesystem with symbolic links says where a
/// path leads. Views that hide parts of a tree by path (the harness's `GuardFs`) check the
/// resolved path as well as the named one, so a link cannot lead into what they hide.
/// Backends without links (memory, Redis, object storage) do not implement it.
pub trait Links: Send + Sync + std::fmt::Debug {
    /// Where `path` leads once its links are followed, as a path of this filesystem: the
    /// longest existing prefix resolved (a link that leaves the root: `permission_denied`),
    /// the rest appended as given. A path without links resolves to itself.
    fn resolve(&self, path: &FsPath) -> Result<FsPath>;

    /// The names of the symbolic links directly in the directory `dir`.
    fn links_in(&self, dir: &FsPath) -> Result<Vec<String>>;

    /// Those of `names` (entries of the directory `dir`) that are symbolic links:
    /// [`links_in`](Self::links_in) of a few known entries, which a backend can answer
    /// without reading the whole directory.
    fn links_among(&self, dir: &FsPath, names: &[&str]) -> Result<Vec<String>> {
        let mut links = self.links_in(dir)?;
        links.retain(|n| names.contains(&n.as_str()));
        Ok(links)
    }
}

/// Metadata of one entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// The virtual path.
    pub path: FsPath,
    /// File or directory.
    pub kind: FileKind,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// Last modification time, when the backend knows it.
    pub modified: Option<DateTime<Utc>>,
}

impl FileInfo {
    /// A file entry.
    pub fn file(path: FsPath, size: u64) -> Self {
        FileInfo {
            path,
            kind: FileKind::File,
            size,
            modified: None,
        }
    }

    /// A directory entry.
    pub fn dir(path: FsPath) -> Self {
        FileInfo {
            path,
            kind: FileKind::Dir,
            size: 0,
            modified: None,
        }
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Dir
    }
}

/// The version of a file's content: the hex SHA-256 of its bytes. Every backend computes it
/// the same way, so versions compare across backends and layers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Version(String);

impl Version {
    /// The version of `content`.
    pub fn of(content: &[u8]) -> Self {
        Version(hex::encode(sha2::Sha256::digest(content)))
    }

    /// The hex digest.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How [`Filesystem::write`] treats an existing file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WriteMode {
    /// Replace whatever is there (the default).
    #[default]
    Overwrite,
    /// Fail with `already_exists` if the path exists.
    CreateNew,
    /// Write only if the current content has this version; otherwise `conflict` (also when
    /// the file does not exist).
    IfMatch(Version),
}

/// How hard [`Filesystem::write`] works to keep a write through a crash.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Durability {
    /// Survives a crash of the machine (local disk: the file and its directory are
    /// fsynced). The default.
    #[default]
    Synced,
    /// Atomic (readers see the old or the new content, never a mix) and survives a crash of
    /// the process, not necessarily of the machine (local disk: no fsync). For records
    /// rewritten often whose loss on power failure is repaired (task heartbeats).
    Atomic,
}

/// Options of [`Filesystem::write`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// Overwrite, create-only or compare-and-set.
    pub mode: WriteMode,
    /// Synced (default) or atomic only; backends without the distinction treat both alike.
    pub durability: Durability,
}

impl WriteOptions {
    /// Create-only.
    pub fn create_new() -> Self {
        WriteOptions {
            mode: WriteMode::CreateNew,
            ..WriteOptions::default()
        }
    }

    /// Compare-and-set against `version`.
    pub fn if_match(version: Version) -> Self {
        WriteOptions {
            mode: WriteMode::IfMatch(version),
            ..WriteOptions::default()
        }
    }

    /// An overwrite that is atomic but not fsynced ([`Durability::Atomic`]).
    pub fn atomic() -> Self {
        WriteOptions {
            durability: Durability::Atomic,
            ..WriteOptions::default()
        }
    }
}

/// Options of [`Filesystem::append`].
///
/// [`Durability::Synced`] (the default) makes the appended bytes survive a crash of the
/// machine before `append` returns (local disk: `fdatasync`). [`Durability::Atomic`] lands
/// them as one piece at the end of the file, visible to every reader and kept through a
/// crash of the process, but not flushed: a later synced append to the same file flushes
/// them too (local disk: `fdatasync` writes all of a file's dirty data), which is how the
/// session log pays one flush per call instead of one per step. Backends without the
/// distinction (Redis, object storage, the sandbox) treat both alike.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppendOptions {
    /// Synced (default) or atomic only.
    pub durability: Durability,
}

impl AppendOptions {
    /// An append that is not flushed to the device ([`Durability::Atomic`]).
    pub fn atomic() -> Self {
        AppendOptions {
            durability: Durability::Atomic,
        }
    }
}

/// Options of [`Filesystem::delete`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    /// Delete a directory and everything below it. Without it, deleting a directory is
    /// `is_directory`.
    pub recursive: bool,
}

/// Options of [`Filesystem::rename`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameOptions {
    /// Replace an existing destination file. Without it, an existing destination is
    /// `already_exists`.
    pub overwrite: bool,
}

/// A window of lines for [`FilesystemExt::read`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadWindow {
    /// First line to return, 0-based.
    pub offset: usize,
    /// How many lines at most; `None` means [`DEFAULT_READ_LINES`].
    pub limit: Option<usize>,
}

impl ReadWindow {
    /// Every line (no limit).
    pub fn all() -> Self {
        ReadWindow {
            offset: 0,
            limit: Some(usize::MAX),
        }
    }
}

/// The lines returned by [`FilesystemExt::read`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextWindow {
    /// The lines, byte-exact, each with its own line ending (`\n`, `\r\n` or none at EOF).
    pub text: String,
    /// 0-based index of the first line returned.
    pub offset: usize,
    /// How many lines were returned.
    pub lines: usize,
    /// How many lines the file has (a final line without `\n` counts).
    pub total_lines: usize,
    /// Version of the whole file.
    pub version: Version,
    /// Size of the whole file in bytes.
    pub size: u64,
}

/// An exact-replacement edit for [`Filesystem::edit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditRequest {
    /// Text to find; must not be empty.
    pub old: String,
    /// Replacement; must differ from `old`.
    pub new: String,
    /// Replace every occurrence; without it `old` must occur exactly once.
    pub replace_all: bool,
}

/// What [`Filesystem::edit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditOutcome {
    /// How many occurrences were replaced.
    pub replacements: usize,
    /// The new version.
    pub version: Version,
}

/// A content search for [`Filesystem::grep`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrepRequest {
    /// A regular expression (Rust `regex` syntax), or a literal string with `literal`.
    pub pattern: String,
    /// Treat `pattern` as a literal string.
    pub literal: bool,
    /// Ignore case.
    pub case_insensitive: bool,
    /// Directory (or single file) to search; the root by default.
    pub path: FsPath,
    /// Only files whose path matches this glob. A glob without `/` matches the file name at
    /// any depth (`*.rs`); with `/` it matches the path relative to `path`.
    pub glob: Option<String>,
    /// Stop after this many matches (the output then says `truncated`).
    pub max_matches: usize,
}

impl GrepRequest {
    /// A regex search of the whole filesystem with a cap of 1000 matches.
    pub fn new(pattern: impl Into<String>) -> Self {
        GrepRequest {
            pattern: pattern.into(),
            literal: false,
            case_insensitive: false,
            path: FsPath::root(),
            glob: None,
            max_matches: 1000,
        }
    }
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepMatch {
    /// File.
    pub path: FsPath,
    /// 1-based line number.
    pub line: usize,
    /// The line without its line ending (invalid UTF-8 replaced).
    pub text: String,
}

/// Result of [`Filesystem::grep`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrepOutput {
    /// Matches sorted by path, then line.
    pub matches: Vec<GrepMatch>,
    /// Whether more matches exist beyond `max_matches`.
    pub truncated: bool,
}

/// A file-name search for [`Filesystem::glob`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobRequest {
    /// Glob matched against the path relative to `path`: `*` and `?` stay inside one segment,
    /// `**` crosses segments, `{a,b}` and `[ab]` work.
    pub pattern: String,
    /// Directory to search; the root by default.
    pub path: FsPath,
    /// Stop after this many files (the output then says `truncated`).
    pub max_results: usize,
}

impl GlobRequest {
    /// A glob from the root with a cap of 1000 files.
    pub fn new(pattern: impl Into<String>) -> Self {
        GlobRequest {
            pattern: pattern.into(),
            path: FsPath::root(),
            max_results: 1000,
        }
    }
}

/// Result of [`Filesystem::glob`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GlobOutput {
    /// Matching files, sorted by path.
    pub files: Vec<FileInfo>,
    /// Whether more files matched beyond `max_results`.
    pub truncated: bool,
}

/// One listing of a [`Filesystem::list_many`] batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListRequest {
    /// The directory listed (the root always exists).
    pub path: FsPath,
    /// Every file below `path` at any depth, as [`glob`](Filesystem::glob) of `**` finds
    /// them (files only, no directory entries); without it, `path`'s direct children as
    /// [`list`](Filesystem::list) gives them (files and directories).
    pub recursive: bool,
    /// Stop after this many entries (the listing then says `truncated`).
    pub max_results: usize,
    /// Of a child listing, only the children with these names (those that exist), as
    /// [`list`](Filesystem::list) gives them: a probe of a few known names in a large folder
    /// need not learn every entry's metadata (the local disk stats only these names).
    /// `None`: every child. Ignored by a recursive listing.
    pub names: Option<Vec<String>>,
}

impl ListRequest {
    /// The direct children of `path`, without a cap.
    pub fn children(path: FsPath) -> Self {
        ListRequest {
            path,
            recursive: false,
            max_results: usize::MAX,
            names: None,
        }
    }

    /// The direct children of `path` named one of `names` (those that exist), without a
    /// cap.
    pub fn named<S: Into<String>>(path: FsPath, names: impl IntoIterator<Item = S>) -> Self {
        ListRequest {
            names: Some(names.into_iter().map(Into::into).collect()),
            ..Self::children(path)
        }
    }

    /// Every file below `path`, without a cap.
    pub fn recursive(path: FsPath) -> Self {
        ListRequest {
            path,
            recursive: true,
            max_results: usize::MAX,
            names: None,
        }
    }

    /// The same listing, cut after `max_results` entries.
    pub fn max_results(self, max_results: usize) -> Self {
        ListRequest {
            max_results,
            ..self
        }
    }

    /// Whether this listing shows an entry named `name` (its [`names`](Self::names)).
    pub fn wants(&self, name: &str) -> bool {
        self.recursive
            || self
                .names
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| n == name))
    }

    /// Whether this listing's answer says whether `path` exists: a child listing of
    /// `path`'s parent that asks for `path`'s name (every child, or names that include it).
    pub fn settles(&self, path: &FsPath) -> bool {
        !self.recursive
            && !path.is_root()
            && path.parent().as_ref() == Some(&self.path)
            && self.wants(path.file_name())
    }

    /// This listing's answer from `entries` (the directory's children, or the files below
    /// it): the [`names`](Self::names) asked for, sorted, capped at `max_results`.
    pub fn answer(&self, mut entries: Vec<FileInfo>) -> Listing {
        if !self.recursive && self.names.is_some() {
            entries.retain(|e| self.wants(e.path.file_name()));
        }
        Listing::capped(entries, self.max_results)
    }

    /// The same listing without a cap: what a wrapper asks of its backend when it filters
    /// the answer before capping it.
    pub fn uncapped(&self) -> Self {
        ListRequest {
            max_results: usize::MAX,
            ..self.clone()
        }
    }
}

/// One listing of [`Filesystem::list_many`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// The entries, sorted by path.
    pub entries: Vec<FileInfo>,
    /// Whether more entries exist beyond the request's `max_results`.
    pub truncated: bool,
}

impl Listing {
    /// The first `max_results` of `entries` (sorted by path), `truncated` when there were
    /// more.
    pub fn capped(mut entries: Vec<FileInfo>, max_results: usize) -> Self {
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        let truncated = entries.len() > max_results;
        entries.truncate(max_results);
        Listing { entries, truncated }
    }
}

/// A pluggable filesystem: local disk, memory, Redis, object storage, a sandbox.
///
/// # Methods
///
/// * **Six required methods** hold the data: [`stat`](Filesystem::stat),
///   [`list`](Filesystem::list), [`read_bytes`](Filesystem::read_bytes),
///   [`write`](Filesystem::write), [`delete`](Filesystem::delete) and
///   [`rename`](Filesystem::rename). A backend implements these and is complete.
/// * **Seven specialisable methods** have a correct generic fallback built on the others
///   ([`generic`]): [`exists`](Filesystem::exists), [`read_range`](Filesystem::read_range),
///   [`append`](Filesystem::append), [`edit`](Filesystem::edit), [`grep`](Filesystem::grep),
///   [`glob`](Filesystem::glob) and [`list_many`](Filesystem::list_many). A backend
///   overrides one when it can do better (a positioned read, a native `APPEND`, a
///   server-side search, several listings in one round trip).
/// * **Conveniences** live in [`FilesystemExt`], implemented for every filesystem and not
///   overridable: [`read`](FilesystemExt::read) (a line window),
///   [`upload`](FilesystemExt::upload) and [`download`](FilesystemExt::download) (batches).
/// * **Optional abilities** are their own traits: [`Execute`].
///
/// # Contract
///
/// **Paths.** Every path is an [`FsPath`]: virtual, rooted at the filesystem's root,
/// already free of `..`, NUL and over-long names. A backend maps it under its own root and
/// must not let storage-level indirection (symlinks, hard links, key prefixes) reach outside
/// that root. Errors name the virtual path, never a host path.
///
/// **Directories** exist implicitly: writing `a/b/c.txt` creates `a` and `a/b` when needed;
/// a key-value backend may have no directory objects at all, so a directory "exists" when a
/// file lies below it, and empty directories may vanish. The root always exists. A path is
/// never both a file and a directory: writing below a file is `not_a_directory`, writing a
/// file over a directory is `is_directory`.
///
/// **Atomicity.** `write` is all-or-nothing: a reader sees the old or the new content, never
/// a mix (local: temp file + fsync + rename + fsync dir). `write` with
/// [`WriteMode::CreateNew`] and [`WriteMode::IfMatch`] is a compare-and-set: exactly one of
/// two racing writers wins on a backend shared between processes when the backend says so in
/// its docs, and at least within one process everywhere. `append` adds bytes at the end
/// without losing concurrent appends. `edit` is read + [`WriteMode::IfMatch`]: it fails with
/// `conflict` rather than lose a concurrent change. `rename` of a file is atomic on one
/// backend; across backends (composite) it is copy-then-delete.
///
/// **Byte ranges.** [`read_range`](Filesystem::read_range) returns the bytes
/// `[offset, offset + len)` of a file, cut at its end: an `offset` at or past the end gives
/// an empty vector, never an error, so a caller can poll a growing log from the size it last
/// saw. A missing path is `file_not_found` and a directory is `is_directory`, as for
/// `read_bytes`. The bytes are those of one version of the file when the backend reads
/// whole objects; a backend with positioned reads (local disk) may return a range that a
/// concurrent `append` is extending, but never bytes that were not written.
///
/// **Ordering.** `list`, `glob`, `grep` and each listing of `list_many` return entries
/// sorted by path (then line).
///
/// **Batched listings.** [`list_many`](Filesystem::list_many) answers each of its requests
/// exactly as `list` of the directory (direct children) or `glob` of `**` from it (every
/// file below) would, cut at the request's `max_results`, in one operation: one round trip
/// (or one set of concurrent requests) on a remote store, one hand-off to the blocking pool
/// on disk. A missing directory is `file_not_found` and a file `not_a_directory`, for that
/// request only; the batch as a whole fails only when the store does not answer.
///
/// **Text.** [`read`](FilesystemExt::read) and `edit` treat a file as binary when it has a
/// NUL byte in its first [`BINARY_SNIFF_BYTES`] bytes or is not UTF-8, and fail with
/// `binary_file`. `grep` skips a file with a NUL byte in its first [`BINARY_SNIFF_BYTES`]
/// bytes (and files over [`GREP_MAX_FILE_BYTES`]); other bytes are searched as they are.
///
/// **Edits** replace exact text. If `old` is not found, the file uses CRLF line endings and
/// `old` contains bare `\n`, the match is retried with `\n` → `\r\n` in both `old` and `new`,
/// so CRLF files stay CRLF. Nothing else in the file is touched (see [`apply_edit`]).
///
/// **Wrappers** (prefix, read-only, composite, overlay, and any wrapper outside this crate)
/// implement *every* method of this trait, the specialisable ones included, so a backend's
/// native `append`, `grep` or `edit` is never replaced by the generic fallback and a
/// wrapper's policy (a prefix, a hidden path, a refusal) applies to every method. They do it
/// with [`forward_filesystem!`](crate::forward_filesystem), which generates the forwarding
/// methods and fails to compile when a method is neither forwarded nor overridden.
///
/// The [`conformance`](crate::conformance) suite checks all of this; every backend and
/// wrapper runs it (read-only wrappers run its read-only part).
///
/// [`apply_edit`]: crate::generic::apply_edit
#[async_trait]
pub trait Filesystem: Send + Sync + fmt::Debug + 'static {
    /// Metadata of a file or directory; `file_not_found` if absent.
    async fn stat(&self, path: &FsPath) -> Result<FileInfo>;

    /// The direct children of a directory, sorted by path. `not_a_directory` on a file.
    async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>>;

    /// The whole content of a file.
    async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>>;

    /// Writes a whole file atomically, creating parent directories; returns the new version.
    async fn write(&self, path: &FsPath, data: Vec<u8>, options: WriteOptions) -> Result<Version>;

    /// Deletes a file, or a directory with [`DeleteOptions::recursive`].
    async fn delete(&self, path: &FsPath, options: DeleteOptions) -> Result<()>;

    /// Moves a file or directory, creating the destination's parents.
    async fn rename(&self, from: &FsPath, to: &FsPath, options: RenameOptions) -> Result<()>;

    /// Whether the path exists (file or directory). Fallback: `stat`
    /// ([`generic::exists`]).
    async fn exists(&self, path: &FsPath) -> Result<bool> {
        generic::exists(self, path).await
    }

    /// At most `len` bytes of a file starting at byte `offset`; fewer at the end of the
    /// file, none when `offset` is at or past the end (see the `# Contract`). Fallback: the
    /// whole file, sliced ([`generic::read_range_via_read`]); backends with positioned reads
    /// override it.
    async fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
        generic::read_range_via_read(self, path, offset, len).await
    }

    /// Appends bytes, creating the file if absent; `options` says whether they are flushed
    /// before it returns ([`AppendOptions`]). An empty synced append flushes what earlier
    /// atomic appends left unflushed. Fallback: read + compare-and-set write, retried
    /// ([`generic::append_via_cas`]).
    async fn append(&self, path: &FsPath, data: Vec<u8>, options: AppendOptions) -> Result<()> {
        generic::append_via_cas(self, path, data, options).await
    }

    /// Replaces exact text in a file. Fallback: read + [`generic::apply_edit`] +
    /// compare-and-set write, re-applied on a race ([`generic::edit_via_cas`]).
    async fn edit(&self, path: &FsPath, request: &EditRequest) -> Result<EditOutcome> {
        generic::edit_via_cas(self, path, request).await
    }

    /// Searches file contents. Fallback: walk with `list`, read every candidate
    /// ([`generic::grep_via_walk`]).
    async fn grep(&self, request: &GrepRequest) -> Result<GrepOutput> {
        generic::grep_via_walk(self, request).await
    }

    /// Finds files by name. Fallback: walk with `list` ([`generic::glob_via_walk`]).
    async fn glob(&self, request: &GlobRequest) -> Result<GlobOutput> {
        generic::glob_via_walk(self, request).await
    }

    /// Several listings in one operation (see `Batched listings` in the `# Contract`): one
    /// result per request, in order. The outer error is the batch's (the store did not
    /// answer); each listing has its own (`file_not_found`, `not_a_directory`). Fallback:
    /// `list` or `glob` of `**` per request, one after the other
    /// ([`generic::list_many_each`]).
    async fn list_many(&self, requests: &[ListRequest]) -> Result<Vec<Result<Listing>>> {
        generic::list_many_each(self, requests).await
    }
}

/// How many reads [`FilesystemExt::download`] keeps in flight.
pub const DOWNLOAD_CONCURRENCY: usize = 8;

/// Conveniences built on [`Filesystem`], for every filesystem (`dyn Filesystem`, `Arc<_>`,
/// any backend or wrapper). Nothing here can be overridden, so a wrapper cannot get them
/// wrong: they go through the wrapper's own [`Filesystem`] methods.
#[async_trait]
pub trait FilesystemExt: Filesystem {
    /// A window of lines of a text file: [`read_bytes`](Filesystem::read_bytes) then
    /// [`generic::text_window`]. `binary_file` for binary content, `is_directory` and
    /// `file_not_found` as for `read_bytes`.
    async fn read(&self, path: &FsPath, window: ReadWindow) -> Result<TextWindow> {
        generic::read_window(self, path, window).await
    }

    /// Writes many files (overwriting), one after the other; one result per file, in order.
    async fn upload(&self, files: Vec<(FsPath, Vec<u8>)>) -> Vec<Result<()>> {
        let mut out = Vec::with_capacity(files.len());
        for (path, data) in files {
            out.push(
                self.write(&path, data, WriteOptions::default())
                    .await
                    .map(|_| ()),
            );
        }
        out
    }

    /// Reads many files, [`DOWNLOAD_CONCURRENCY`] at a time; one result per path, in order.
    async fn download(&self, paths: &[FsPath]) -> Vec<Result<Vec<u8>>> {
        // Collected first: a closure mapping paths to futures inside the stream would need a
        // higher-ranked `Send` bound that async_trait cannot express.
        let reads: Vec<_> = paths.iter().map(|path| self.read_bytes(path)).collect();
        futures::stream::iter(reads)
            .buffered(DOWNLOAD_CONCURRENCY)
            .collect()
            .await
    }
}

impl<T: Filesystem + ?Sized> FilesystemExt for T {}

/// Smart pointers forward every method to what they point to.
macro_rules! forward_to_pointee {
    ($($ptr:ident),*) => {$(
        crate::forward_filesystem! {
            impl[T: Filesystem + ?Sized] Filesystem for $ptr<T> {
                inner = |s| &**s;
                forward = [
                    stat, list, read_bytes, write, delete, rename,
                    exists, read_range, append, edit, grep, glob, list_many,
                ];
            }
        }
    )*};
}

forward_to_pointee!(Arc, Box);

/// A command for [`Execute::execute`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// Shell command line (run with `sh -c`).
    pub command: String,
    /// Timeout; `None` uses the executor's default. Clamped to the executor's maximum.
    pub timeout: Option<Duration>,
}

/// What a command produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Combined output (stdout, then stderr lines prefixed `[stderr] `), capped.
    pub output: String,
    /// Exit code; `None` when killed by a signal or on timeout.
    pub exit_code: Option<i32>,
    /// Whether the output was cut at the cap.
    pub truncated: bool,
    /// Whether the command was killed because it ran past its timeout.
    pub timed_out: bool,
    /// The signal that ended the command, when one did (`None` on a sandbox whose command
    /// server does not report it).
    pub signal: Option<i32>,
    /// Bytes the command printed on stdout (kept or dropped).
    pub stdout_bytes: u64,
    /// Bytes the command printed on stderr (kept or dropped).
    pub stderr_bytes: u64,
    /// stdout was cut at the cap.
    pub stdout_truncated: bool,
    /// stderr was cut at the cap.
    pub stderr_truncated: bool,
}

/// The ability to run commands next to a filesystem. A filesystem that can execute
/// implements this trait as well; one that cannot simply does not (no `not_supported`
/// method). The `execute` tool is registered only for an [`Execute`] implementation.
#[async_trait]
pub trait Execute: Send + Sync + fmt::Debug + 'static {
    /// Runs a command in the filesystem's root.
    async fn execute(&self, request: ExecRequest) -> Result<ExecOutput>;
}

#[async_trait]
impl<T: Execute + ?Sized> Execute for Arc<T> {
    async fn execute(&self, request: ExecRequest) -> Result<ExecOutput> {
        (**self).execute(request).await
    }
}
