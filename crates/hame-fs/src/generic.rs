//! The one home of the pieces every backend and wrapper shares, so the semantics are
//! identical everywhere: correct fallbacks for the specialisable [`Filesystem`] methods,
//! written on top of the six required ones (`*_via_*`, [`list_many_each`]), the grep engine ([`GrepSearch`],
//! [`grep_files`]) and the listing step of walk-based searches ([`files_at`]), the checks
//! of `rename` ([`rename_is_noop`], [`check_directory_move`]), and the pure helpers (edit,
//! text sniffing, ranges, matchers).

use std::future::Future;
use std::time::Duration;

use futures::{StreamExt, stream};
use globset::{GlobBuilder, GlobMatcher};
use regex::bytes::{Regex, RegexBuilder};

use crate::error::{Error, Result};
use crate::fs::{
    AppendOptions, BINARY_SNIFF_BYTES, DEFAULT_READ_LINES, EditOutcome, EditRequest, FileInfo,
    Filesystem, GREP_MAX_FILE_BYTES, GlobOutput, GlobRequest, GrepMatch, GrepOutput, GrepRequest,
    Links, ListRequest, Listing, ReadWindow, TextWindow, Version, WriteMode, WriteOptions,
};
use crate::path::FsPath;

/// How many attempts `append_via_cas` and `edit_via_cas` make before giving up with
/// `conflict`. Every attempt after the first waits a jittered, exponentially growing pause
/// ([`cas_backoff`]), so 64 attempts wait under three seconds in all at worst (half that on average): enough for
/// dozens of writers racing on one file of a shared backend, short enough that a caller
/// stuck behind a hot file hears about it.
pub const CAS_RETRIES: usize = 64;

/// Upper bound of the pause before the first retry.
pub const CAS_BACKOFF_BASE: Duration = Duration::from_millis(1);
/// Upper bound of any one pause between retries.
pub const CAS_BACKOFF_MAX: Duration = Duration::from_millis(50);

/// The pause before attempt `attempt` (0-based) of a compare-and-set loop: none before the
/// first attempt, then "full jitter" (a uniformly random pause between zero and
/// `min(CAS_BACKOFF_MAX, CAS_BACKOFF_BASE * 2^(attempt-1))`), so writers that collided once
/// do not collide again in lock step.
pub fn cas_backoff_delay(attempt: usize) -> Duration {
    if attempt == 0 {
        return Duration::ZERO;
    }
    let exp = u32::try_from(attempt - 1).unwrap_or(u32::MAX).min(16);
    let ceiling = CAS_BACKOFF_BASE
        .saturating_mul(1u32 << exp)
        .min(CAS_BACKOFF_MAX);
    let ceiling_us = u64::try_from(ceiling.as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    Duration::from_micros(jitter() % (ceiling_us + 1))
}

/// Sleeps for [`cas_backoff_delay`]`(attempt)` (needs a Tokio runtime with timers enabled
/// when `attempt > 0`; nothing happens before the first attempt).
pub async fn cas_backoff(attempt: usize) {
    let delay = cas_backoff_delay(attempt);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

/// A cheap random number: std's per-hasher random keys plus a counter. Not cryptographic;
/// only used to spread retries apart.
fn jitter() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// `stat` mapped to a boolean.
pub async fn exists<F: Filesystem + ?Sized>(fs: &F, path: &FsPath) -> Result<bool> {
    match fs.stat(path).await {
        Ok(_) => Ok(true),
        Err(Error::NotFound { .. }) => Ok(false),
        Err(Error::NotADirectory { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether bytes look binary: a NUL in the first [`BINARY_SNIFF_BYTES`] or invalid UTF-8.
pub fn is_binary(data: &[u8]) -> bool {
    data[..data.len().min(BINARY_SNIFF_BYTES)].contains(&0) || std::str::from_utf8(data).is_err()
}

/// The bytes `[offset, offset + len)` of `data`, cut at its end (see
/// [`Filesystem::read_range`]).
pub fn slice_range(data: &[u8], offset: u64, len: u64) -> &[u8] {
    let (start, end) = range_bounds(data.len(), offset, len);
    &data[start..end]
}

/// `[offset, offset + len)` clamped to `0..size`, as indices.
fn range_bounds(size: usize, offset: u64, len: u64) -> (usize, usize) {
    let size64 = size as u64;
    let start = offset.min(size64);
    let end = offset.saturating_add(len).min(size64);
    // Both bounds are at most `size`, so they fit in `usize`.
    (start as usize, end as usize)
}

/// [`Filesystem::read_range`] via `read_bytes` and [`slice_range`].
pub async fn read_range_via_read<F: Filesystem + ?Sized>(
    fs: &F,
    path: &FsPath,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>> {
    let mut data = fs.read_bytes(path).await?;
    let (start, end) = range_bounds(data.len(), offset, len);
    data.truncate(end);
    data.drain(..start);
    Ok(data)
}

/// A window of lines of `data` (see [`FilesystemExt::read`](crate::FilesystemExt::read)).
pub fn text_window(path: &FsPath, data: &[u8], window: ReadWindow) -> Result<TextWindow> {
    if is_binary(data) {
        return Err(Error::Binary {
            path: path.to_string(),
            size: data.len() as u64,
        });
    }
    let text = String::from_utf8_lossy(data);
    let limit = window.limit.unwrap_or(DEFAULT_READ_LINES);
    let mut total = 0usize;
    let mut out = String::new();
    let mut returned = 0usize;
    for line in text.split_inclusive('\n') {
        if total >= window.offset && returned < limit {
            out.push_str(line);
            returned += 1;
        }
        total += 1;
    }
    Ok(TextWindow {
        text: out,
        offset: window.offset,
        lines: returned,
        total_lines: total,
        version: Version::of(data),
        size: data.len() as u64,
    })
}

/// [`FilesystemExt::read`](crate::FilesystemExt::read) via `read_bytes`.
pub async fn read_window<F: Filesystem + ?Sized>(
    fs: &F,
    path: &FsPath,
    window: ReadWindow,
) -> Result<TextWindow> {
    let data = fs.read_bytes(path).await?;
    text_window(path, &data, window)
}

/// [`Filesystem::append`] via read + compare-and-set write, retried on `conflict`.
/// O(size) per append: backends with a native append (local `O_APPEND`, Redis `APPEND`)
/// override it.
pub async fn append_via_cas<F: Filesystem + ?Sized>(
    fs: &F,
    path: &FsPath,
    data: Vec<u8>,
    options: AppendOptions,
) -> Result<()> {
    let mut last = None;
    for attempt in 0..CAS_RETRIES {
        cas_backoff(attempt).await;
        let (mut current, mode) = match fs.read_bytes(path).await {
            Ok(bytes) => {
                let v = Version::of(&bytes);
                (bytes, WriteMode::IfMatch(v))
            }
            Err(Error::NotFound { .. }) => (Vec::new(), WriteMode::CreateNew),
            Err(e) => return Err(e),
        };
        current.extend_from_slice(&data);
        match fs
            .write(
                path,
                current,
                WriteOptions {
                    mode,
                    durability: options.durability,
                },
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e @ (Error::Conflict { .. } | Error::AlreadyExists { .. })) => {
                tracing::debug!(%path, attempt, "append raced another writer; retrying");
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(exhausted(path, "append", last))
}

/// The `conflict` returned when every compare-and-set attempt lost a race.
fn exhausted(path: &FsPath, what: &str, last: Option<Error>) -> Error {
    let why = match last {
        Some(Error::Conflict { reason, .. }) => format!("; last: {reason}"),
        Some(Error::AlreadyExists { .. }) => "; last: created concurrently".to_owned(),
        _ => String::new(),
    };
    Error::Conflict {
        path: path.to_string(),
        reason: format!("{CAS_RETRIES} {what} attempts raced other writers{why}"),
    }
}

/// Checks an edit's arguments: `old` not empty and different from `new`.
pub fn validate_edit(request: &EditRequest) -> Result<()> {
    if request.old.is_empty() {
        return Err(Error::invalid_argument(
            "old_string is empty; to create or replace a whole file use write_file",
        ));
    }
    if request.old == request.new {
        return Err(Error::invalid_argument(
            "old_string and new_string are identical; nothing to change",
        ));
    }
    Ok(())
}

/// Applies an exact-replacement edit to `content` and returns the new content and the
/// number of replacements. Only the matched text changes; if `old` is absent, the content
/// has CRLF line endings and `old` has bare `\n`, the edit is retried with CRLF.
pub fn apply_edit(path: &FsPath, content: &str, request: &EditRequest) -> Result<(String, usize)> {
    validate_edit(request)?;
    let try_one = |old: &str, new: &str| -> Result<Option<(String, usize)>> {
        let count = content.matches(old).count();
        match count {
            0 => Ok(None),
            1 => Ok(Some((content.replacen(old, new, 1), 1))),
            n if request.replace_all => Ok(Some((content.replace(old, new), n))),
            n => Err(Error::AmbiguousMatch {
                path: path.to_string(),
                count: n,
            }),
        }
    };
    if let Some(done) = try_one(&request.old, &request.new)? {
        return Ok(done);
    }
    if content.contains("\r\n") && request.old.contains('\n') && !request.old.contains("\r\n") {
        let old = request.old.replace('\n', "\r\n");
        let new = request.new.replace("\r\n", "\n").replace('\n', "\r\n");
        if let Some(done) = try_one(&old, &new)? {
            return Ok(done);
        }
    }
    Err(Error::NoMatch {
        path: path.to_string(),
    })
}

/// The content of a file after an edit, and how many replacements were made:
/// `binary_file` for binary content (see [`is_binary`]), else [`apply_edit`] on the text.
/// Every backend's `edit` goes through it.
pub fn edited(path: &FsPath, data: &[u8], request: &EditRequest) -> Result<(Vec<u8>, usize)> {
    if is_binary(data) {
        return Err(Error::Binary {
            path: path.to_string(),
            size: data.len() as u64,
        });
    }
    let text = String::from_utf8_lossy(data);
    let (new_text, replacements) = apply_edit(path, &text, request)?;
    Ok((new_text.into_bytes(), replacements))
}

/// [`Filesystem::edit`] via read + [`apply_edit`] + compare-and-set write. When the write
/// loses a race, the edit is re-applied to the new content (so it fails with `no_match` or
/// `ambiguous_match` if the concurrent change removed or duplicated the text), up to
/// [`CAS_RETRIES`] attempts; a concurrent change is never overwritten.
pub async fn edit_via_cas<F: Filesystem + ?Sized>(
    fs: &F,
    path: &FsPath,
    request: &EditRequest,
) -> Result<EditOutcome> {
    validate_edit(request)?;
    let mut last = None;
    for attempt in 0..CAS_RETRIES {
        cas_backoff(attempt).await;
        let data = fs.read_bytes(path).await?;
        let (new_data, replacements) = edited(path, &data, request)?;
        match fs
            .write(path, new_data, WriteOptions::if_match(Version::of(&data)))
            .await
        {
            Ok(version) => {
                return Ok(EditOutcome {
                    replacements,
                    version,
                });
            }
            Err(e @ Error::Conflict { .. }) => {
                tracing::debug!(%path, attempt, "edit raced another writer; re-applying");
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(exhausted(path, "edit", last))
}

/// The cases of `rename` that move nothing, which every backend decides the same way:
/// moving the root is `permission_denied`; moving a path onto itself is `Ok(true)` (done)
/// when it exists and `file_not_found` when it does not. `Ok(false)`: a real move follows.
pub async fn rename_is_noop<F: Filesystem + ?Sized>(
    fs: &F,
    from: &FsPath,
    to: &FsPath,
) -> Result<bool> {
    if from.is_root() {
        return Err(Error::PermissionDenied {
            path: from.to_string(),
            reason: "the root cannot be moved".into(),
        });
    }
    if from != to {
        return Ok(false);
    }
    if fs.exists(from).await? {
        Ok(true)
    } else {
        Err(Error::NotFound {
            path: from.to_string(),
        })
    }
}

/// The checks before a directory `from` is moved to `to` on a backend that moves file by
/// file: not into itself (`invalid_arguments`), not onto anything that exists
/// (`already_exists`).
pub async fn check_directory_move<F: Filesystem + ?Sized>(
    fs: &F,
    from: &FsPath,
    to: &FsPath,
) -> Result<()> {
    if to.starts_with(from) {
        return Err(Error::invalid_argument(format!(
            "cannot move {from} into itself ({to})"
        )));
    }
    if fs.exists(to).await? {
        return Err(Error::AlreadyExists {
            path: to.to_string(),
        });
    }
    Ok(())
}

/// The files a search from `base` covers: `base` itself when it is a file, else what
/// `below` yields (every file strictly below the directory, sorted by path, however the
/// backend lists it); `file_not_found` when `base` does not exist. `below` is only awaited
/// for a directory.
///
/// This is the shared start of every walk-based `grep` and `glob`: [`walk_files`] uses it
/// with a walk over `list`, a backend with a recursive listing (an object store's prefix
/// listing) with that.
pub async fn files_at<F: Filesystem + ?Sized>(
    fs: &F,
    base: &FsPath,
    below: impl Future<Output = Result<Vec<FileInfo>>>,
) -> Result<Vec<FileInfo>> {
    let info = fs.stat(base).await?;
    if info.is_dir() {
        below.await
    } else {
        Ok(vec![info])
    }
}

/// Every file at or below `base`, sorted by path (a file `base` yields itself), found by
/// walking with `list`.
pub async fn walk_files<F: Filesystem + ?Sized>(fs: &F, base: &FsPath) -> Result<Vec<FileInfo>> {
    files_at(fs, base, walk_below(fs, base, None)).await
}

/// [`walk_files`] that neither returns nor descends the symbolic links `links` names (a
/// view over a backend with links: a walk never leads out of the tree it names, and never
/// loops).
pub async fn walk_files_without_links<F: Filesystem + ?Sized>(
    fs: &F,
    base: &FsPath,
    links: &dyn Links,
) -> Result<Vec<FileInfo>> {
    files_at(fs, base, walk_below(fs, base, Some(links))).await
}

/// Every file strictly below the directory `base`, sorted, by walking with `list`
/// (skipping the entries that are `links`).
async fn walk_below<F: Filesystem + ?Sized>(
    fs: &F,
    base: &FsPath,
    links: Option<&dyn Links>,
) -> Result<Vec<FileInfo>> {
    let mut out = Vec::new();
    let mut stack = vec![base.clone()];
    while let Some(dir) = stack.pop() {
        let entries = match fs.list(&dir).await {
            Ok(e) => e,
            // Deleted concurrently: skip.
            Err(Error::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        let skip = match links {
            Some(l) => l.links_in(&dir).unwrap_or_default(),
            None => Vec::new(),
        };
        for e in entries {
            if skip.iter().any(|n| n == e.path.file_name()) {
                continue;
            }
            if e.is_dir() {
                stack.push(e.path);
            } else {
                out.push(e);
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The compiled form of a [`GrepRequest`] pattern.
#[derive(Debug, Clone)]
pub struct LineMatcher {
    re: Regex,
}

impl LineMatcher {
    /// Compiles the request's pattern (escaped when `literal`).
    pub fn new(request: &GrepRequest) -> Result<Self> {
        if request.pattern.is_empty() {
            return Err(Error::invalid_argument("the search pattern is empty"));
        }
        let pat = if request.literal {
            regex::escape(&request.pattern)
        } else {
            request.pattern.clone()
        };
        let re = RegexBuilder::new(&pat)
            .case_insensitive(request.case_insensitive)
            .multi_line(true)
            .size_limit(10 * 1024 * 1024)
            .build()
            .map_err(|e| {
                Error::invalid_argument(format!(
                    "invalid regular expression ({e}); set literal=true to search for the text as is"
                ))
            })?;
        Ok(LineMatcher { re })
    }

    /// Appends the matching lines of `data` (a file at `path`), up to `limit` in total.
    /// Returns `false` when the limit was reached with more matches left.
    pub fn search(
        &self,
        path: &FsPath,
        data: &[u8],
        out: &mut Vec<GrepMatch>,
        limit: usize,
    ) -> bool {
        if !self.re.is_match(data) {
            return true;
        }
        for (i, line) in data.split(|b| *b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if self.re.is_match(line) {
                if out.len() >= limit {
                    return false;
                }
                out.push(GrepMatch {
                    path: path.clone(),
                    line: i + 1,
                    text: String::from_utf8_lossy(line).into_owned(),
                });
            }
        }
        true
    }
}

/// Compiles a glob with `*` confined to one segment.
pub fn compile_glob(pattern: &str) -> Result<GlobMatcher> {
    let pattern = pattern.trim_start_matches('/');
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| Error::invalid_argument(format!("invalid glob pattern: {e}")))
}

/// The file filter of [`GrepRequest::glob`]: name match when the glob has no `/`.
#[derive(Debug, Clone)]
pub struct FileFilter {
    matcher: Option<(GlobMatcher, bool)>,
}

impl FileFilter {
    /// Compiles the filter.
    pub fn new(glob: Option<&str>) -> Result<Self> {
        Ok(FileFilter {
            matcher: match glob {
                Some(g) if !g.is_empty() => Some((compile_glob(g)?, !g.contains('/'))),
                _ => None,
            },
        })
    }

    /// Whether `path` (below `base`) passes.
    pub fn matches(&self, base: &FsPath, path: &FsPath) -> bool {
        match &self.matcher {
            None => true,
            Some((m, true)) => m.is_match(path.file_name()),
            Some((m, false)) => path
                .strip_prefix(base)
                .is_some_and(|rel| m.is_match(rel.as_str())),
        }
    }
}

/// One [`GrepRequest`] being answered: the grep loop every backend shares. Feed it the
/// candidate files in path order; it applies the glob filter and the size cap
/// ([`wants`](GrepSearch::wants)), skips binary files and files that vanished or were
/// refused while the search ran, and stops at the match cap
/// ([`feed`](GrepSearch::feed) returns `false`). A backend decides only how files are
/// listed and read: [`grep_files`] does it with a read function and some reads in flight,
/// [`grep_via_walk`] with `list` and `read_bytes`, and a backend with batch reads (Redis
/// `MGET`) or a blocking walk (local disk) feeds it itself.
#[derive(Debug)]
pub struct GrepSearch {
    matcher: LineMatcher,
    filter: FileFilter,
    base: FsPath,
    max_matches: usize,
    matches: Vec<GrepMatch>,
    truncated: bool,
}

impl GrepSearch {
    /// Compiles the request's pattern and glob (`invalid_arguments` when either is bad).
    pub fn new(request: &GrepRequest) -> Result<Self> {
        Ok(GrepSearch {
            matcher: LineMatcher::new(request)?,
            filter: FileFilter::new(request.glob.as_deref())?,
            base: request.path.clone(),
            max_matches: request.max_matches,
            matches: Vec::new(),
            truncated: false,
        })
    }

    /// Whether a file at `path` passes the request's glob (before its size is known).
    pub fn matches_glob(&self, path: &FsPath) -> bool {
        self.filter.matches(&self.base, path)
    }

    /// Whether the file should be read: it passes the glob and is at most
    /// [`GREP_MAX_FILE_BYTES`] long.
    pub fn wants(&self, file: &FileInfo) -> bool {
        file.size <= GREP_MAX_FILE_BYTES && self.matches_glob(&file.path)
    }

    /// Searches one file's content, or skips it: a file that vanished, was refused, grew
    /// too large or became a directory since it was listed (`file_not_found`,
    /// `permission_denied`, `too_large`, `is_directory`) and a binary file (a NUL in its
    /// first [`BINARY_SNIFF_BYTES`] bytes) are skipped; any other error ends the search.
    /// Returns `Ok(false)` once the match cap is reached with more matches left: stop
    /// feeding and [`finish`](GrepSearch::finish).
    pub fn feed(&mut self, path: &FsPath, content: Result<Vec<u8>>) -> Result<bool> {
        let data = match content {
            Ok(d) => d,
            Err(
                Error::NotFound { .. }
                | Error::PermissionDenied { .. }
                | Error::TooLarge { .. }
                | Error::IsDirectory { .. },
            ) => return Ok(true),
            Err(e) => return Err(e),
        };
        if data[..data.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
            return Ok(true);
        }
        if !self
            .matcher
            .search(path, &data, &mut self.matches, self.max_matches)
        {
            self.truncated = true;
        }
        Ok(!self.truncated)
    }

    /// The matches, sorted as fed (by path, then line).
    pub fn finish(self) -> GrepOutput {
        GrepOutput {
            matches: self.matches,
            truncated: self.truncated,
        }
    }
}

/// Runs `search` over a listing: the wanted `files` (sorted by path) are read with `read`,
/// up to `concurrency` reads in flight, and fed in order.
pub async fn grep_files<R, Fut>(
    mut search: GrepSearch,
    files: Vec<FileInfo>,
    concurrency: usize,
    read: R,
) -> Result<GrepOutput>
where
    R: Fn(FsPath) -> Fut,
    Fut: Future<Output = Result<Vec<u8>>>,
{
    let wanted: Vec<FsPath> = files
        .into_iter()
        .filter(|f| search.wants(f))
        .map(|f| f.path)
        .collect();
    let mut contents = stream::iter(wanted)
        .map(|path| {
            let content = read(path.clone());
            async move { (path, content.await) }
        })
        .buffered(concurrency.max(1));
    while let Some((path, content)) = contents.next().await {
        if !search.feed(&path, content)? {
            break;
        }
    }
    Ok(search.finish())
}

/// [`Filesystem::grep`] by walking with `list` and reading every candidate with
/// `read_bytes`, one at a time.
pub async fn grep_via_walk<F: Filesystem + ?Sized>(
    fs: &F,
    request: &GrepRequest,
) -> Result<GrepOutput> {
    grep_via_walk_of(fs, request, None).await
}

/// [`grep_via_walk`] that skips symbolic links ([`walk_files_without_links`]).
pub async fn grep_via_walk_without_links<F: Filesystem + ?Sized>(
    fs: &F,
    request: &GrepRequest,
    links: &dyn Links,
) -> Result<GrepOutput> {
    grep_via_walk_of(fs, request, Some(links)).await
}

async fn grep_via_walk_of<F: Filesystem + ?Sized>(
    fs: &F,
    request: &GrepRequest,
    links: Option<&dyn Links>,
) -> Result<GrepOutput> {
    let search = GrepSearch::new(request)?;
    let files = files_at(fs, &request.path, walk_below(fs, &request.path, links)).await?;
    grep_files(search, files, 1, |path| async move {
        fs.read_bytes(&path).await
    })
    .await
}

/// Applies a glob to a sorted list of files below `base`.
pub fn glob_filter(
    request: &GlobRequest,
    files: impl IntoIterator<Item = FileInfo>,
) -> Result<GlobOutput> {
    let m = compile_glob(&request.pattern)?;
    let mut out = Vec::new();
    for f in files {
        let Some(rel) = f.path.strip_prefix(&request.path) else {
            continue;
        };
        if m.is_match(rel.as_str()) {
            if out.len() >= request.max_results {
                return Ok(GlobOutput {
                    files: out,
                    truncated: true,
                });
            }
            out.push(f);
        }
    }
    Ok(GlobOutput {
        files: out,
        truncated: false,
    })
}

/// [`Filesystem::glob`] by walking.
pub async fn glob_via_walk<F: Filesystem + ?Sized>(
    fs: &F,
    request: &GlobRequest,
) -> Result<GlobOutput> {
    compile_glob(&request.pattern)?;
    let files = walk_files(fs, &request.path).await?;
    glob_filter(request, files)
}

/// [`glob_via_walk`] that skips symbolic links ([`walk_files_without_links`]).
pub async fn glob_via_walk_without_links<F: Filesystem + ?Sized>(
    fs: &F,
    request: &GlobRequest,
    links: &dyn Links,
) -> Result<GlobOutput> {
    compile_glob(&request.pattern)?;
    let files = walk_files_without_links(fs, &request.path, links).await?;
    glob_filter(request, files)
}

/// [`Filesystem::list_many`] one request at a time ([`list_one`]): the child listings
/// first, then the recursive ones — except that a recursive listing the batch's child
/// listings already settle ([`settled`]) is answered from them without a call of its own.
pub async fn list_many_each<F: Filesystem + ?Sized>(
    fs: &F,
    requests: &[ListRequest],
) -> Result<Vec<Result<Listing>>> {
    let mut parts = ListParts::new(requests.len());
    let mut children: Vec<(&ListRequest, Listing)> = Vec::new();
    for (i, r) in requests.iter().enumerate().filter(|(_, r)| !r.recursive) {
        let answer = list_one(fs, r).await;
        if let Ok(l) = &answer {
            children.push((r, l.clone()));
        }
        parts.answer(i, answer);
    }
    for (i, r) in requests.iter().enumerate().filter(|(_, r)| r.recursive) {
        let answer = match settled(r, &children) {
            Some(answer) => answer,
            None => list_one(fs, r).await,
        };
        parts.answer(i, answer);
    }
    parts.finish(fs, |_, answer| answer).await
}

/// What a batch's answered child listings (`children`, each with its request) already say
/// of the recursive listing `request`: `file_not_found` when a listing that settles its
/// folder ([`ListRequest::settles`]: its parent's, asking for its name, not truncated)
/// lacks it, `not_a_directory` when it shows a file there; `None` when none settles it or
/// it is a folder (then it must be walked). Only for a backend whose names are compared
/// exactly (on a case-insensitive one a listing lacking `Docs` says nothing of `docs`).
pub fn settled<L: std::borrow::Borrow<Listing>>(
    request: &ListRequest,
    children: &[(&ListRequest, L)],
) -> Option<Result<Listing>> {
    if !request.recursive {
        return None;
    }
    let (_, listing) = children
        .iter()
        .find(|(c, l)| !l.borrow().truncated && c.settles(&request.path))?;
    match listing
        .borrow()
        .entries
        .iter()
        .find(|e| e.path == request.path)
    {
        None => Some(Err(Error::NotFound {
            path: request.path.to_string(),
        })),
        Some(e) if !e.is_dir() => Some(Err(Error::NotADirectory {
            path: request.path.to_string(),
        })),
        Some(_) => None,
    }
}

/// A [`Filesystem::list_many`] batch of a wrapper answered in two parts: the listings the
/// wrapper answers itself ([`answer`](Self::answer): a refusal, or a listing through its own
/// `list` or `glob`), and those it sends on ([`send`](Self::send)) in one batch of the
/// filesystem below ([`finish`](Self::finish)), so a policy wrapper keeps a batch one
/// operation of its backend.
#[derive(Debug)]
pub struct ListParts {
    out: Vec<Option<Result<Listing>>>,
    sent: Vec<(usize, ListRequest)>,
}

impl ListParts {
    /// A batch of `n` listings, none answered yet.
    pub fn new(n: usize) -> Self {
        ListParts {
            out: (0..n).map(|_| None).collect(),
            sent: Vec::new(),
        }
    }

    /// Listing `i` is `answer`.
    pub fn answer(&mut self, i: usize, answer: Result<Listing>) {
        if let Some(slot) = self.out.get_mut(i) {
            *slot = Some(answer);
        }
    }

    /// Listing `i` is `request` of the filesystem below (its answer goes through `finish`'s
    /// `map`).
    pub fn send(&mut self, i: usize, request: ListRequest) {
        self.sent.push((i, request));
    }

    /// Sends what was sent on to `inner` in one batch (none when nothing was) and gives
    /// each answer to `map` with its index; one result per listing, in order.
    pub async fn finish<F: Filesystem + ?Sized>(
        mut self,
        inner: &F,
        mut map: impl FnMut(usize, Result<Listing>) -> Result<Listing> + Send,
    ) -> Result<Vec<Result<Listing>>> {
        if !self.sent.is_empty() {
            let requests: Vec<ListRequest> = self.sent.iter().map(|(_, r)| r.clone()).collect();
            let answers = inner.list_many(&requests).await?;
            let sent = std::mem::take(&mut self.sent);
            for ((i, _), answer) in sent.into_iter().zip(answers) {
                let answer = map(i, answer);
                self.answer(i, answer);
            }
        }
        Ok(self
            .out
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(Error::Backend {
                        message: "a filesystem gave fewer listings than asked".into(),
                        source: None,
                    })
                })
            })
            .collect())
    }
}

/// One listing of [`Filesystem::list_many`] through `fs`'s own methods: `list` of the
/// directory, or `glob` of `**` from it (and, when that finds nothing, a `stat` to tell an
/// empty directory from a file).
pub async fn list_one<F: Filesystem + ?Sized>(fs: &F, request: &ListRequest) -> Result<Listing> {
    let path = &request.path;
    if !request.recursive {
        return fs.list(path).await.map(|entries| request.answer(entries));
    }
    let out = fs
        .glob(&GlobRequest {
            pattern: "**".into(),
            path: path.clone(),
            max_results: request.max_results,
        })
        .await?;
    // A glob from a file finds the file itself; a listing is of a directory.
    let the_base = matches!(out.files.as_slice(), [f] if f.path == *path);
    if the_base || (out.files.is_empty() && !path.is_root() && !fs.stat(path).await?.is_dir()) {
        return Err(Error::NotADirectory {
            path: path.to_string(),
        });
    }
    Ok(Listing {
        entries: out.files,
        truncated: out.truncated,
    })
}

#[cfg(test)]
#[path = "generic_tests.rs"]
mod tests;
