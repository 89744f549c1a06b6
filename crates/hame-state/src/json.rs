//! [`JsonStore`]: one JSON file per session under a root directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hame_core::AgentState;
use serde::{Deserialize, Serialize};

use crate::error::{Error, FORMAT_VERSION, MAX_SCHEMA, Result};
use crate::holder::Holder;
use crate::json_journal::{Doc, DocCache, FileId, ReplayError, replay};
use crate::key::{StateKey, validate_id};
use crate::store::Save;
use crate::store::{Lease, LeaseGrant, LeaseHandle, SessionSummary, StateStore, Stored};

/// Value of the `format` field of every state file ([`crate::STATE_FORMAT`]).
pub const JSON_FORMAT: &str = crate::STATE_FORMAT;

/// A single-machine store with one JSON document per session.
///
/// Layout under the root given to [`JsonStore::open`]:
///
/// ```text
/// <root>/<agent>/anonymous/<session>.json        state of an anonymous session
/// <root>/<agent>/users/<user>/<session>.json     state of a user's session (the base)
///                            <session>.journal    the saves since the base, one line each
///                            <session>.lock       held while a save compares and writes
///                            <session>.lease      held (OS lock) by the session's lease holder;
///                                                 holds {"fence":N,"token":…,"holder":{…}}
///                            .<session>.<uuid>.tmp   a save in progress
/// ```
///
/// A save that changes little (new messages, a few replaced ones, an extensions patch)
/// appends one line to the journal (its messages packed, [`JsonStore::with_packed_journal`])
/// and `fdatasync`s it; any other writes a temp file,
/// `fsync`s it, renames it over the document and `fsync`s the directory, starting a new
/// journal. Both happen under an exclusive lock of `<session>.lock`, so a crash leaves the
/// old or the new state and two processes never interleave a compare-and-set. The store
/// keeps the last state of recent sessions in memory, used only while the files are
/// unchanged (another process's write is noticed). Format: `docs/state.md`.
/// Leases are advisory OS locks (`File::try_lock`) on `<session>.lease`: they last until
/// released or until the holding process dies (the OS drops them); their TTL is ignored.
/// The holder writes its fence (the previous one plus one) and token into the file, and
/// `save_fenced` compares them under the write lock.
#[derive(Clone)]
pub struct JsonStore {
    root: PathBuf,
    /// The last state read or written per document, checked against the files' identity
    /// before use (another process may have written since).
    cache: Arc<Mutex<DocCache>>,
    /// Journal lines hold their messages packed (ADR 0021).
    pack_journal: bool,
}

impl std::fmt::Debug for JsonStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonStore")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct EnvelopeHead<'a> {
    format: &'static str,
    version: u64,
    /// Names this base document; journal lines apply only to the base they name.
    gen_id: &'a str,
    updated_at: DateTime<Utc>,
    agent: &'a str,
    user: Option<&'a str>,
    session: &'a str,
}

/// The document bytes: the envelope fields followed by the already serialised state.
fn envelope(head: &EnvelopeHead<'_>, state_json: &[u8]) -> Result<Vec<u8>> {
    let mut out = serde_json::to_vec(head).map_err(Error::Serialize)?;
    out.pop(); // the closing `}` of the head object
    out.reserve(state_json.len() + 10);
    out.extend_from_slice(b",\"state\":");
    out.extend_from_slice(state_json);
    out.push(b'}');
    Ok(out)
}

#[derive(Deserialize)]
struct EnvelopeIn {
    #[serde(default)]
    format: Option<String>,
    version: u64,
    #[serde(default)]
    gen_id: Option<String>,
    agent: String,
    user: Option<String>,
    session: String,
    state: serde_json::Value,
}

/// What a save reads of the document it replaces.
#[derive(Deserialize)]
struct Header {
    #[serde(default)]
    format: Option<String>,
    version: u64,
    #[serde(default)]
    gen_id: Option<String>,
    #[serde(default)]
    state: StateHeader,
}

#[derive(Default, Deserialize)]
struct StateHeader {
    /// Absent in version-0 documents.
    #[serde(default)]
    schema_version: u64,
}

/// The `format` field alone, read when a document does not parse as this build's envelope
/// (a newer format may have changed more than the field).
#[derive(Deserialize)]
struct FormatOnly {
    #[serde(default)]
    format: Option<String>,
}

/// Refuses a document whose `format` this build does not read: a newer `hame-state/N` is
/// [`Error::NewerFormat`], a name not of that form is refused as unknown. A document
/// without the field (written by hand) is read as format 1.
fn check_format(key: &StateKey, format: Option<&str>) -> Result<()> {
    let Some(name) = format else {
        return Ok(());
    };
    match crate::format_version(name) {
        Some(v) if v <= FORMAT_VERSION => Ok(()),
        Some(v) => Err(Error::newer_format(key, v)),
        None => Err(Error::Config(format!(
            "state of {key} is in an unknown format {name:?} (this build reads {})",
            crate::STATE_FORMAT
        ))),
    }
}

/// A state file parsed as `T` (the envelope, or what a save reads of it), after its
/// `format` is checked: a document this build cannot read is refused naming its format,
/// also when the rest of it no longer parses.
fn parse_document<T: serde::de::DeserializeOwned>(
    key: &StateKey,
    bytes: &[u8],
    format_of: impl FnOnce(&T) -> Option<&str>,
) -> Result<T> {
    match serde_json::from_slice::<T>(bytes) {
        Ok(doc) => {
            check_format(key, format_of(&doc))?;
            Ok(doc)
        }
        Err(e) => {
            if let Ok(head) = serde_json::from_slice::<FormatOnly>(bytes) {
                check_format(key, head.format.as_deref())?;
            }
            Err(Error::Format {
                key: key.to_string(),
                source: hame_core::StateFormatError::Invalid(e),
            })
        }
    }
}

/// The content of `<session>.lease`: the last holder's fence and token (empty once
/// released). Only the holder of the file's OS lock writes it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct LeaseFile {
    fence: u64,
    token: String,
    #[serde(default)]
    holder: Option<Holder>,
}

impl LeaseFile {
    fn read(path: &Path) -> Result<Self> {
        Ok(read_opt(path)?
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default())
    }

    /// Replaces the content of the (locked) lease file: written over from offset 0 and
    /// padded with spaces (JSON's trailing whitespace) to the old length, so the file is
    /// never truncated. A truncation to zero followed by a write makes ext4 flush the
    /// file's data at close (`auto_da_alloc`): it cost more than the rest of the lease.
    fn write(&self, file: &File, path: &Path) -> Result<()> {
        use std::os::unix::fs::FileExt as _;
        let mut bytes = serde_json::to_vec(self).map_err(Error::Serialize)?;
        let old = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if let Ok(old) = usize::try_from(old)
            && old > bytes.len()
        {
            bytes.resize(old, b' ');
        }
        file.write_all_at(&bytes, 0).map_err(|e| Error::io(path, e))
    }
}

impl JsonStore {
    /// Opens (creating it if needed) a store rooted at `root`.
    ///
    /// The harness passes `$HAME_STATE_HOME`, else `~/.hame/state`; the store adds the
    /// `<agent>/` level itself.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        create_private_dirs(&root).map_err(|e| Error::io(&root, e))?;
        Ok(Self {
            root,
            cache: Arc::default(),
            pack_journal: true,
        })
    }

    /// Whether journal lines hold their messages packed (zstd, then base64; the default)
    /// or as plain JSON, e.g. to read a journal with `jq` while debugging. Lines of either
    /// kind load whatever this is set to. ADR 0021, `docs/state.md`.
    #[must_use]
    pub fn with_packed_journal(mut self, pack: bool) -> Self {
        self.pack_journal = pack;
        self
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn dir(&self, agent: &str, user: Option<&str>) -> PathBuf {
        let base = self.root.join(agent);
        match user {
            Some(u) => base.join("users").join(u),
            None => base.join("anonymous"),
        }
    }

    fn doc_path(&self, key: &StateKey) -> PathBuf {
        self.dir(key.agent(), key.user())
            .join(format!("{}.json", key.session()))
    }

    /// Runs `f` on the caller's thread: for the operations that neither `fsync` nor wait
    /// for a lock (a load, a lease's try-lock and release). They take microseconds from
    /// the page cache, less than a hand-off to the blocking pool and back.
    fn inline<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
        f()
    }

    /// Runs `f` on tokio's blocking pool: for the operations that `fsync` or wait for the
    /// session's write lock (saves, deletes, listings).
    async fn blocking<T: Send + 'static>(
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| Error::Io {
                path: PathBuf::new(),
                source: io::Error::other(e),
            })?
    }

    /// The compare-and-set of `save`; with `fence` (token, fence) only while the session's
    /// lease file names that lease. A save that [`Doc::change`] finds small is one journal
    /// line (`fdatasync`); any other is a full rewrite of the document (temp file,
    /// `fsync`, rename, directory `fsync`) that starts a new journal.
    async fn write(
        &self,
        key: &StateKey,
        state: &AgentState,
        expected: Option<u64>,
        fence: Option<(String, u64)>,
    ) -> Result<u64> {
        let dir = self.dir(key.agent(), key.user());
        Error::writable_schema(key, state)?;
        let path = dir.join(format!("{}.json", key.session()));
        // Taken out while the save runs (so the cached state can be extended in place);
        // put back, or replaced, when it succeeds.
        let cached = lock(&self.cache).take(&path);
        if let Some(mut doc) = cached
            && let Some(change) = doc.change(state)
        {
            // Serialise before taking the lock, to keep the critical section short.
            let gen_id = doc.gen_id.clone().unwrap_or_default();
            let line = change
                .encode(&gen_id, state, self.pack_journal)
                .map_err(Error::Serialize)?;
            let (key2, dir2, fence2) = (key.clone(), dir.clone(), fence.clone());
            let seen = (doc.version, doc.base, doc.journal);
            let appended = Self::blocking(move || {
                with_write_lock(&dir2, key2.session(), || {
                    check_fence(&dir2, &key2, fence2.as_ref())?;
                    append_line(&dir2, &key2, expected, seen, line)
                })
            })
            .await?;
            if let Some((version, journal)) = appended {
                change.apply_to(Arc::make_mut(&mut doc.state), state);
                doc.version = version;
                doc.journal = Some(journal);
                lock(&self.cache).put(path, doc);
                return Ok(version);
            }
            // The files changed under the cache (another process wrote): a full save.
        }
        let (state_json, _) = Error::encode(key, state)?;
        let snapshot = Arc::new(state.clone());
        let key = key.clone();
        let doc = Self::blocking(move || {
            create_private_dirs(&dir).map_err(|e| Error::io(&dir, e))?;
            with_write_lock(&dir, key.session(), || {
                check_fence(&dir, &key, fence.as_ref())?;
                let path = dir.join(format!("{}.json", key.session()));
                let found = match read_opt(&path)? {
                    None => None,
                    Some(bytes) => Some(read_current(&dir, &key, &bytes)?),
                };
                let version = Error::next_version(&key, expected, found.as_ref().map(|h| h.0))?;
                // Never overwrite a document of a newer hame.
                if let Some((_, schema)) = found.filter(|h| h.1 > MAX_SCHEMA) {
                    return Err(Error::too_new(&key, schema));
                }
                let gen_id = uuid::Uuid::new_v4().simple().to_string();
                let head = EnvelopeHead {
                    format: JSON_FORMAT,
                    version,
                    gen_id: &gen_id,
                    updated_at: Utc::now(),
                    agent: key.agent(),
                    user: key.user(),
                    session: key.session(),
                };
                let bytes = envelope(&head, state_json.as_bytes())?;
                write_atomic(&dir, key.session(), &bytes)?;
                // The old journal names the old base: never applied to this one, only dead
                // weight, so failing to remove it does not fail the save (it is written).
                let journal = journal_path(&dir, key.session());
                if let Err(e) = fs::remove_file(&journal)
                    && e.kind() != io::ErrorKind::NotFound
                {
                    tracing::warn!(path = %journal.display(), error = %e, "could not remove an old state journal");
                }
                let base = FileId::stat(&path)
                    .map_err(|e| Error::io(&path, e))?
                    .ok_or_else(|| Error::io(&path, io::ErrorKind::NotFound.into()))?;
                let journal = FileId::stat(&journal).map_err(|e| Error::io(&journal, e))?;
                Ok(Doc {
                    state: snapshot,
                    version,
                    gen_id: Some(gen_id),
                    base,
                    clean_tail: journal.is_none(),
                    journal,
                })
            })
        })
        .await;
        match doc {
            Ok(doc) => {
                let version = doc.version;
                lock(&self.cache).put(path, doc);
                Ok(version)
            }
            Err(e) => {
                lock(&self.cache).remove(&path);
                Err(e)
            }
        }
    }

    #[cfg(any(test, feature = "conformance"))]
    fn put_raw_blocking(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
        let dir = self.dir(key.agent(), key.user());
        create_private_dirs(&dir).map_err(|e| Error::io(&dir, e))?;
        let doc = serde_json::json!({
            "format": JSON_FORMAT, "version": 1, "updated_at": Utc::now(),
            "agent": key.agent(), "user": key.user(), "session": key.session(), "state": state,
        });
        let bytes = serde_json::to_vec(&doc).map_err(Error::Serialize)?;
        lock(&self.cache).remove(&self.doc_path(key));
        let _ = fs::remove_file(journal_path(&dir, key.session()));
        write_atomic(&dir, key.session(), &bytes)
    }
}

fn lock(cache: &Mutex<DocCache>) -> std::sync::MutexGuard<'_, DocCache> {
    cache
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn journal_path(dir: &Path, session: &str) -> PathBuf {
    dir.join(format!("{session}.journal"))
}

/// `Err(LeaseLost)` unless the session's lease file names the lease `fence` (token, fence).
fn check_fence(dir: &Path, key: &StateKey, fence: Option<&(String, u64)>) -> Result<()> {
    if let Some((token, fence)) = fence {
        let held = LeaseFile::read(&dir.join(format!("{}.lease", key.session())))?;
        if held.token != *token || held.fence != *fence {
            return Err(Error::lease_lost(key));
        }
    }
    Ok(())
}

/// Appends the journal `line` (its version still to be set) on top of the document `seen`
/// (its version, base and journal ids), if the files are still those (checked under the
/// write lock). `None` when they are not (another process wrote): the caller does a full
/// save instead.
fn append_line(
    dir: &Path,
    key: &StateKey,
    expected: Option<u64>,
    seen: (u64, FileId, Option<FileId>),
    mut line: Vec<u8>,
) -> Result<Option<(u64, FileId)>> {
    let base_path = dir.join(format!("{}.json", key.session()));
    let journal = journal_path(dir, key.session());
    let base = FileId::stat(&base_path).map_err(|e| Error::io(&base_path, e))?;
    let current = FileId::stat(&journal).map_err(|e| Error::io(&journal, e))?;
    if base != Some(seen.1) || current != seen.2 {
        return Ok(None);
    }
    let version = Error::next_version(key, expected, Some(seen.0))?;
    // `"version":0` was serialised as a placeholder: the version is known only now.
    let placeholder = b"\"version\":0,";
    let at = line
        .windows(placeholder.len())
        .position(|w| w == placeholder)
        .ok_or_else(|| Error::Config("journal line without a version field".into()))?;
    let real = format!("\"version\":{version},");
    line.splice(at..at + placeholder.len(), real.into_bytes());
    line.push(b'\n');
    let write = || -> io::Result<FileId> {
        let mut f = private(&mut OpenOptions::new())
            .append(true)
            .create(true)
            .open(&journal)?;
        f.write_all(&line)?;
        f.sync_data()?;
        Ok(FileId::of(&f.metadata()?))
    };
    let id = write().map_err(|e| Error::io(&journal, e))?;
    if current.is_none() {
        // A new file: its directory entry must be durable too.
        sync_dir(dir)?;
    }
    Ok(Some((version, id)))
}

/// The version and schema version of the stored document (`bytes`, its base, plus its
/// journal).
fn read_current(dir: &Path, key: &StateKey, bytes: &[u8]) -> Result<(u64, u64)> {
    let head: Header = parse_document(key, bytes, |h: &Header| h.format.as_deref())?;
    let Some(gen_id) = head.gen_id else {
        return Ok((head.version, head.state.schema_version));
    };
    let journal = journal_path(dir, key.session());
    let Some(lines) = read_opt(&journal)? else {
        return Ok((head.version, head.state.schema_version));
    };
    // Only the version sequence matters here.
    match replay(None, head.version, &gen_id, &lines) {
        Ok(r) if r.version == head.version => Ok((r.version, head.state.schema_version)),
        Ok(r) => Ok((r.version, u64::from(r.schema_version))),
        Err(ReplayError::TooNew(schema)) => Ok((head.version, u64::from(schema))),
        Err(ReplayError::Corrupt(reason)) => {
            Err(Error::Config(format!("{}: {reason}", journal.display())))
        }
    }
}

/// The content of `path` and the identity of the file it was read from (`None` when it
/// does not exist). Bytes appended after the `fstat` are not returned, so the two match.
fn read_with_id(path: &Path) -> Result<Option<(Vec<u8>, FileId)>> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let id = FileId::of(&f.metadata().map_err(|e| Error::io(path, e))?);
    let mut bytes = Vec::with_capacity(usize::try_from(id.len()).unwrap_or(0));
    (&mut f)
        .take(id.len())
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    Ok(Some((bytes, id)))
}

fn read_opt(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Directories the store creates are `0700` (new ones only; existing ones keep their mode).
fn create_private_dirs(dir: &Path) -> io::Result<()> {
    let mut b = fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

/// Files the store creates (state documents, lease and lock files) are `0600`.
fn private(o: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(o, 0o600);
    o
}

fn open_lock_file(path: &Path) -> Result<File> {
    private(&mut OpenOptions::new())
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| Error::io(path, e))
}

fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

fn write_atomic(dir: &Path, session: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!(".{session}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let target = dir.join(format!("{session}.json"));
    let write = || -> io::Result<()> {
        let mut f = private(&mut OpenOptions::new())
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io(&tmp, e));
    }
    if let Err(e) = fs::rename(&tmp, &target) {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io(&target, e));
    }
    sync_dir(dir)
}

/// Runs `f` while holding the exclusive write lock of a session.
fn with_write_lock<T>(dir: &Path, session: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let path = dir.join(format!("{session}.lock"));
    let file = open_lock_file(&path)?;
    file.lock().map_err(|e| Error::io(&path, e))?;
    let out = f();
    // Closing the file releases the lock as well; unlock explicitly to release it early.
    let _ = file.unlock();
    out
}

/// The most of a lease file that is read (one holds a fence, a token and a holder).
const MAX_LEASE_FILE_BYTES: u64 = 64 * 1024;

#[async_trait]
impl StateStore for JsonStore {
    async fn load(&self, key: &StateKey) -> Result<Option<Stored>> {
        let path = self.doc_path(key);
        let cache = &self.cache;
        Self::inline(|| {
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            let journal = journal_path(&dir, key.session());
            let cached = lock(cache).get(&path);
            if let Some(doc) = cached {
                let base = FileId::stat(&path).map_err(|e| Error::io(&path, e))?;
                let current = FileId::stat(&journal).map_err(|e| Error::io(&journal, e))?;
                if doc.is_current(base, current) {
                    return Ok(Some(Stored {
                        state: (*doc.state).clone(),
                        version: doc.version,
                    }));
                }
            }
            let Some((bytes, base)) = read_with_id(&path)? else {
                return Ok(None);
            };
            let format = |source| Error::Format {
                key: key.to_string(),
                source,
            };
            // The format first: a newer one is refused before anything else is read.
            let env: EnvelopeIn =
                parse_document(key, &bytes, |e: &EnvelopeIn| e.format.as_deref())?;
            if env.agent != key.agent()
                || env.user.as_deref() != key.user()
                || env.session != key.session()
            {
                return Err(Error::Config(format!(
                    "{} holds the state of another key ({}/{:?}/{})",
                    path.display(),
                    env.agent,
                    env.user,
                    env.session
                )));
            }
            let mut state = AgentState::from_json(env.state).map_err(format)?;
            let mut version = env.version;
            let (mut journal_id, mut clean_tail) = (None, true);
            if env.gen_id.is_none() {
                // Never appended to; only its identity matters for the cache.
                journal_id = FileId::stat(&journal).map_err(|e| Error::io(&journal, e))?;
            } else if let Some(gen_id) = &env.gen_id
                && let Some((lines, id)) = read_with_id(&journal)?
            {
                let replayed =
                    replay(Some(&mut state), version, gen_id, &lines).map_err(|e| match e {
                        ReplayError::TooNew(schema) => Error::too_new(key, u64::from(schema)),
                        ReplayError::Corrupt(reason) => {
                            Error::Config(format!("{}: {reason}", journal.display()))
                        }
                    })?;
                version = replayed.version;
                clean_tail = replayed.clean_tail;
                journal_id = Some(id);
            }
            let doc = Doc {
                state: Arc::new(state.clone()),
                version,
                gen_id: env.gen_id,
                base,
                journal: journal_id,
                clean_tail,
            };
            lock(cache).put(path, doc);
            Ok(Some(Stored { state, version }))
        })
    }

    async fn put(&self, key: &StateKey, save: Save<'_>) -> Result<u64> {
        let fence = save.lease.map(|l| (l.token().to_owned(), l.fence()));
        self.write(key, save.state, save.expected, fence).await
    }

    async fn delete(&self, key: &StateKey) -> Result<bool> {
        let dir = self.dir(key.agent(), key.user());
        let session = key.session().to_owned();
        let cache = self.cache.clone();
        Self::blocking(move || {
            if !dir.exists() {
                return Ok(false);
            }
            with_write_lock(&dir, &session, || {
                let path = dir.join(format!("{session}.json"));
                lock(&cache).remove(&path);
                let existed = match fs::remove_file(&path) {
                    Ok(()) => {
                        sync_dir(&dir)?;
                        true
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                    Err(e) => return Err(Error::io(&path, e)),
                };
                // After the document: a journal left by a crash in between names a base
                // that no longer exists, so it never applies to a new one.
                let journal = journal_path(&dir, &session);
                match fs::remove_file(&journal) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(&journal, e)),
                }
                Ok(existed)
            })
        })
        .await
    }

    async fn list_sessions(&self, agent: &str, user: Option<&str>) -> Result<Vec<SessionSummary>> {
        crate::validate_scope(agent, user)?;
        let dir = self.dir(agent, user);
        Self::blocking(move || {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(Error::io(&dir, e)),
            };
            let mut out = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(&dir, e))?;
                let name = entry.file_name();
                let Some(session) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                    continue;
                };
                if validate_id("session", session).is_err() {
                    continue;
                }
                let modified = match entry.metadata().and_then(|m| m.modified()) {
                    Ok(m) => m,
                    // Deleted between read_dir and stat.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(Error::io(entry.path(), e)),
                };
                // A save that appended to the journal left the document itself as it was.
                let modified =
                    match fs::metadata(journal_path(&dir, session)).and_then(|m| m.modified()) {
                        Ok(j) => j.max(modified),
                        Err(_) => modified,
                    };
                out.push(SessionSummary {
                    session: session.to_owned(),
                    updated_at: DateTime::<Utc>::from(modified),
                });
            }
            crate::sort_summaries(&mut out);
            Ok(out)
        })
        .await
    }

    async fn try_acquire(&self, key: &StateKey, ttl: Duration) -> Result<Option<Lease>> {
        let dir = self.dir(key.agent(), key.user());
        let path = dir.join(format!("{}.lease", key.session()));
        let token = uuid::Uuid::new_v4().to_string();
        let requested_at = std::time::Instant::now();
        let held = {
            let token = token.clone();
            Self::inline(|| {
                // The user's directory exists but for a first session: made only then.
                let mut file = match open_lock_file(&path) {
                    Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                        create_private_dirs(&dir).map_err(|e| Error::io(&dir, e))?;
                        open_lock_file(&path)?
                    }
                    other => other?,
                };
                match file.try_lock() {
                    Ok(()) => {}
                    Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
                    Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
                }
                // Sized for a lease file (~200 bytes) so it is one read and the end-of-file
                // probe, not a read per doubling of an empty buffer.
                let mut text = Vec::with_capacity(512);
                // Through `take`: `File::read_to_end` would `statx` and `lseek` first.
                (&mut file)
                    .take(MAX_LEASE_FILE_BYTES)
                    .read_to_end(&mut text)
                    .map_err(|e| Error::io(&path, e))?;
                let old: LeaseFile = serde_json::from_slice(&text).unwrap_or_default();
                let fence = old.fence + 1;
                let new = LeaseFile {
                    fence,
                    token,
                    holder: Some(Holder::current().clone()),
                };
                new.write(&file, &path)?;
                Ok(Some((file, fence)))
            })?
        };
        Ok(held.map(|(file, fence)| {
            let handle = FileLease {
                file: Mutex::new(Some(file)),
                key: key.to_string(),
                path,
                fence,
            };
            let grant = LeaseGrant::new(token, fence, ttl, requested_at);
            Lease::new(key.clone(), grant, Arc::new(handle))
        }))
    }

    fn is_shared(&self) -> bool {
        false
    }
}

/// An OS lock on `<session>.lease`; closing the file releases it.
#[derive(Debug)]
struct FileLease {
    file: Mutex<Option<File>>,
    key: String,
    path: PathBuf,
    fence: u64,
}

#[async_trait]
impl LeaseHandle for FileLease {
    async fn renew(&self, _ttl: Duration) -> Result<()> {
        // The OS lock does not expire; renewing only checks that it was not released.
        let held = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some();
        Error::lease_held(held, &self.key)
    }

    async fn release(&self) -> Result<()> {
        let file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let Some(file) = file else { return Ok(()) };
        let (path, fence) = (&self.path, self.fence);
        JsonStore::inline(|| {
            // Blank the token (the fence stays) so that no copy of this lease can write.
            let blank = LeaseFile {
                fence,
                token: String::new(),
                holder: None,
            };
            let written = blank.write(&file, path);
            let _ = file.unlock();
            written
        })
    }

    fn expires(&self) -> bool {
        false
    }
}

#[cfg(any(test, feature = "conformance"))]
#[async_trait]
impl crate::conformance::RawAccess for JsonStore {
    async fn put_raw(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
        let store = self.clone();
        let key = key.clone();
        Self::blocking(move || store.put_raw_blocking(&key, state)).await
    }

    async fn set_raw_format(&self, key: &StateKey, format: u64) -> Result<bool> {
        let path = self.doc_path(key);
        let bytes = fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let mut doc: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| Error::Format {
                key: key.to_string(),
                source: hame_core::StateFormatError::Invalid(e),
            })?;
        doc["format"] = format!("{}{format}", crate::error::FORMAT_PREFIX).into();
        let bytes = serde_json::to_vec(&doc).map_err(Error::Serialize)?;
        lock(&self.cache).remove(&path);
        write_atomic(&self.dir(key.agent(), key.user()), key.session(), &bytes)?;
        Ok(true)
    }

    fn ttl_expires_live_holders(&self) -> bool {
        false
    }
}
