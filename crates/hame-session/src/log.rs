//! [`SessionLog`]: append, read and index the logs of one agent.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::{Range, RangeBounds};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use hame_core::Message;
use hame_fs::{AppendOptions, FileInfo, Filesystem, FsPath, WriteOptions};

use crate::error::{Error, Result};
use crate::id::validate_id;
use crate::index::{
    IndexUpdate, SessionEntry, encode_entry, parse_entry, read_entry, read_legacy_index,
    title_candidate, update_entry_cas,
};
use crate::record::{LogRecord, LogRecordRef, last_record, parse_log};

/// Directory of the per-session index files inside the sessions directory
/// (`index/<sessionId>.json`).
pub const INDEX_DIR: &str = "index";
/// The whole-tenant index of earlier builds (every session in one file, rewritten on every
/// update). Read, never written: its entries seed the per-session files and are listed
/// until then.
pub const INDEX_FILE: &str = "sessions.json";
/// The whole-tenant index name of still earlier builds, read when [`INDEX_FILE`] does not
/// exist.
pub const LEGACY_INDEX_FILE: &str = "index.json";

/// How many index files [`SessionLog::list_sessions`] reads at once.
const LIST_READ_CONCURRENCY: usize = 16;
/// Suffix of a session's log file (`<sessionId>.log.jsonl`).
pub const LOG_SUFFIX: &str = ".log.jsonl";

/// How many sessions' writer state (next sequence number, known size) one [`SessionLog`]
/// keeps before forgetting the idle ones.
pub const MAX_CACHED_WRITERS: usize = 4096;

/// Options of a [`SessionLog`].
#[derive(Clone)]
pub struct SessionLogOptions {
    /// Update the index after every [`SessionLog::append_messages`]. Default `true`.
    pub update_index: bool,
    /// The clock used for record times and index times. Default [`Utc::now`]; tests pass a
    /// fixed clock.
    pub clock: Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>,
}

impl Default for SessionLogOptions {
    fn default() -> Self {
        SessionLogOptions {
            update_index: true,
            clock: Arc::new(Utc::now),
        }
    }
}

impl SessionLogOptions {
    /// Uses `clock` for record and index times.
    pub fn with_clock(mut self, clock: impl Fn() -> DateTime<Utc> + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }
}

impl fmt::Debug for SessionLogOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionLogOptions")
            .field("update_index", &self.update_index)
            .finish_non_exhaustive()
    }
}

/// A page of a session log (see [`SessionLog::read_page`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPage {
    /// The records, ordered by sequence number (file order among equal numbers).
    pub records: Vec<LogRecord>,
    /// Where the next page starts, when there are more records.
    pub next_seq: Option<u64>,
    /// The highest sequence number in the log (`None` for an empty log).
    pub last_seq: Option<u64>,
    /// How many valid records the log holds in all.
    pub total_records: usize,
    /// Lines that could not be parsed and were skipped (a torn last line is not counted).
    pub skipped_lines: usize,
}

/// How [`SessionLog::append_messages_checked`] learns where the log ends before it appends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TailCheck {
    /// One `stat` of the log: the size this writer left it at proves nobody else appended
    /// since; any other size makes it read the tail again. The default, and what a writer
    /// that does not hold the session's lease needs.
    #[default]
    Stat,
    /// Trust the tail this writer left, without a `stat`, when it has one (else as
    /// [`Stat`](Self::Stat)). Only for a caller that has made a [`Stat`](Self::Stat)
    /// append (or [`sync`](SessionLog::sync)) of the session since it took the session's
    /// lease and still holds the lease: the lease keeps every other writer out, so the log
    /// still ends where this writer left it. The session-log layer uses it for every append
    /// of a call after the first, which saves a store round trip per step.
    TrustWhileLeased,
}

/// What the writer knows about a log it appended to: valid while the file still has the
/// size this writer left it at.
#[derive(Debug, Clone, Copy)]
struct Tail {
    next_seq: u64,
    size: u64,
}

/// What this [`SessionLog`] knows about one session it writes.
#[derive(Debug, Default)]
struct Writer {
    /// The log's tail as this writer left it.
    tail: Option<Tail>,
    /// This writer wrote the session's index entry with a title
    /// ([`SessionLog::update_index_once`]).
    titled: bool,
}

type WriterSlot = Arc<tokio::sync::Mutex<Writer>>;

/// The append-only, never-compacted logs of one agent's sessions, and their index.
///
/// Layout, below the filesystem it is given (already scoped to the tenant):
///
/// ```text
/// agents/<agentId>/sessions/<sessionId>.log.jsonl   one LogRecord per line
/// agents/<agentId>/sessions/index/<sessionId>.json  that session's SessionEntry
/// agents/<agentId>/sessions/sessions.json           (earlier builds) every SessionEntry; read only
/// ```
///
/// # Guarantees
///
/// * Every [`append_messages`](Self::append_messages) is exactly one
///   [`Filesystem::append`] of whole lines; a record is never split across appends.
/// * Sequence numbers are unique and gap-free per session as long as one writer appends at a
///   time: appends to one session through one `SessionLog` are serialised here, and the
///   harness's per-session call lease serialises replicas. Two replicas racing without the
///   lease may write a duplicate number; readers tolerate duplicates and gaps.
/// * A torn last line (a crash mid-append) is skipped on read, and the next append starts
///   with a newline so it never glues onto it.
/// * The index is changed by compare-and-set only, so concurrent updates are never lost; an
///   update writes the one small file of its session, so the cost of an update does not
///   grow with the number of sessions.
#[derive(Clone)]
pub struct SessionLog {
    fs: Arc<dyn Filesystem>,
    agent_id: String,
    dir: FsPath,
    index_dir: FsPath,
    options: SessionLogOptions,
    writers: Arc<Mutex<HashMap<String, WriterSlot>>>,
}

impl fmt::Debug for SessionLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionLog")
            .field("fs", &self.fs)
            .field("agent_id", &self.agent_id)
            .field("dir", &self.dir)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl SessionLog {
    /// The logs of `agent_id` on `fs` (a filesystem already scoped to the tenant).
    pub fn new(fs: Arc<dyn Filesystem>, agent_id: &str) -> Result<Self> {
        Self::with_options(fs, agent_id, SessionLogOptions::default())
    }

    /// Like [`new`](Self::new), with options.
    pub fn with_options(
        fs: Arc<dyn Filesystem>,
        agent_id: &str,
        options: SessionLogOptions,
    ) -> Result<Self> {
        validate_id("agent id", agent_id)?;
        let dir = FsPath::parse(&format!("agents/{agent_id}/sessions"))?;
        let index_dir = dir.join(INDEX_DIR)?;
        Ok(SessionLog {
            fs,
            agent_id: agent_id.to_owned(),
            dir,
            index_dir,
            options,
            writers: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// The filesystem the logs are on.
    pub(crate) fn fs(&self) -> &std::sync::Arc<dyn Filesystem> {
        &self.fs
    }

    /// The agent id.
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// The directory holding the logs and the index.
    pub fn dir(&self) -> &FsPath {
        &self.dir
    }

    /// The path of a session's log (after validating the id).
    pub fn log_path(&self, session_id: &str) -> Result<FsPath> {
        validate_id("session id", session_id)?;
        Ok(self.dir.join(&format!("{session_id}{LOG_SUFFIX}"))?)
    }

    /// The directory of the per-session index files.
    pub fn index_dir(&self) -> &FsPath {
        &self.index_dir
    }

    /// The path of one session's index file (after validating the id).
    pub fn index_path(&self, session_id: &str) -> Result<FsPath> {
        validate_id("session id", session_id)?;
        Ok(self.index_dir.join(&format!("{session_id}.json"))?)
    }

    fn now(&self) -> DateTime<Utc> {
        (self.options.clock)()
    }

    fn writer(&self, session_id: &str) -> WriterSlot {
        let mut map = match self.writers.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if map.len() >= MAX_CACHED_WRITERS && !map.contains_key(session_id) {
            // Forget the tails of sessions nobody is appending to right now; they are
            // recovered from the log if the session is written again.
            map.retain(|_, slot| Arc::strong_count(slot) > 1);
        }
        map.entry(session_id.to_owned()).or_default().clone()
    }

    /// Appends `messages` of call `call_id` to the session's log as one append of whole
    /// lines, and (by default) updates the index. Returns the sequence numbers written.
    ///
    /// Cost: one `stat` per call; the log is read (whole, as [`Filesystem`] has no byte-range
    /// read) only the first time this `SessionLog` appends to the session, or when someone
    /// else appended since.
    ///
    /// If the log append succeeded and only the index update failed, the error is
    /// [`Error::IndexNotUpdated`] carrying the range written: do not append again.
    pub async fn append_messages(
        &self,
        session_id: &str,
        call_id: &str,
        messages: &[Message],
    ) -> Result<Range<u64>> {
        self.append_messages_with(session_id, call_id, messages, AppendOptions::default())
            .await
    }

    /// [`append_messages`](Self::append_messages) with the append's durability: with
    /// [`AppendOptions::atomic`] the records are not flushed to the device before this
    /// returns (on local disk), and the caller makes them durable with a later synced
    /// append or [`sync`](Self::sync) of the same session before anything depends on them
    /// (the session-log layer does so before the call's state is saved).
    pub async fn append_messages_with(
        &self,
        session_id: &str,
        call_id: &str,
        messages: &[Message],
        options: AppendOptions,
    ) -> Result<Range<u64>> {
        self.append_messages_checked(session_id, call_id, messages, options, TailCheck::Stat)
            .await
    }

    /// [`append_messages_with`](Self::append_messages_with) with the way the writer learns
    /// the log's end ([`TailCheck`]): with [`TailCheck::TrustWhileLeased`] and a tail this
    /// writer left, the append is the only store operation.
    pub async fn append_messages_checked(
        &self,
        session_id: &str,
        call_id: &str,
        messages: &[Message],
        options: AppendOptions,
        check: TailCheck,
    ) -> Result<Range<u64>> {
        let path = self.log_path(session_id)?;
        let slot = self.writer(session_id);
        let written = {
            // Serialises the writers of this session in this process; an async mutex, so it
            // may be held across the appends it exists to order.
            let mut writer = slot.lock().await;
            let tail = &mut writer.tail;
            let size = match (check, *tail) {
                (TailCheck::TrustWhileLeased, Some(t)) => Some(t.size),
                _ => match self.fs.stat(&path).await {
                    Ok(info) => Some(info.size),
                    Err(e) if e.is_not_found() => None,
                    Err(e) => return Err(e.into()),
                },
            };
            let (next_seq, needs_newline) = match (*tail, size) {
                (Some(t), Some(size)) if t.size == size => (t.next_seq, false),
                (_, None) => (0, false),
                (_, Some(size)) => self.recover(&path, size).await?,
            };
            if messages.is_empty() {
                // A cached tail means "ends with a newline"; a torn tail is not cached.
                *tail = size
                    .filter(|_| !needs_newline)
                    .map(|size| Tail { next_seq, size });
                return Ok(next_seq..next_seq);
            }
            let now = self.now();
            let mut chunk = Vec::with_capacity(256 * messages.len());
            if needs_newline {
                chunk.push(b'\n');
            }
            for (i, message) in messages.iter().enumerate() {
                let record = LogRecordRef::new(next_seq + i as u64, now, call_id, message);
                serde_json::to_writer(&mut chunk, &record).map_err(|e| Error::Corrupt {
                    path: path.to_string(),
                    reason: format!("cannot encode record: {e}"),
                })?;
                chunk.push(b'\n');
            }
            let added = chunk.len() as u64;
            if let Err(e) = self.fs.append(&path, chunk, options).await {
                // The append may or may not have landed: learn the truth next time.
                *tail = None;
                return Err(e.into());
            }
            let end = next_seq + messages.len() as u64;
            *tail = Some(Tail {
                next_seq: end,
                size: size.unwrap_or(0) + added,
            });
            next_seq..end
        };
        if self.options.update_index {
            let mut update = IndexUpdate::new()
                .with_message_count_at_least(written.end)
                .at(self.now());
            if let Some(title) = title_candidate(messages) {
                update = update.with_title_if_unset(title);
            }
            if let Err(e) = self.update_index(session_id, &update).await {
                return Err(Error::IndexNotUpdated {
                    written,
                    source: Box::new(e),
                });
            }
        }
        Ok(written)
    }

    /// Flushes the session's log to the device: what earlier appends with
    /// [`AppendOptions::atomic`] left unflushed survives a crash of the machine once this
    /// returns (an empty synced append; local disk: one `fdatasync`). A session without a
    /// log is left without one.
    pub async fn sync(&self, session_id: &str) -> Result<()> {
        let path = self.log_path(session_id)?;
        let slot = self.writer(session_id);
        // Ordered with this process's appends to the session, as they are with each other.
        let _writer = slot.lock().await;
        match self.fs.stat(&path).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        self.fs
            .append(&path, Vec::new(), AppendOptions::default())
            .await
            .map_err(Into::into)
    }

    /// Reads the log's tail to find the next sequence number and whether the file ends
    /// mid-line (see [`tail_of`](Self::tail_of)).
    async fn recover(&self, path: &FsPath, size: u64) -> Result<(u64, bool)> {
        let Some((last, torn)) = self.tail_of(path, size).await? else {
            return Ok((0, false));
        };
        if torn {
            tracing::warn!(path = %path, "session log ends with a torn line; it will be skipped");
        }
        Ok((last.map_or(0, |r| r.seq + 1), torn))
    }

    /// The last valid record of the log at `path`, `size` bytes long, and whether the file
    /// ends mid-line; `None` when there is no log. Only the last [`TAIL_READ_BYTES`] are
    /// read (`Filesystem::read_range`: a ranged read on every backend), unless they hold no
    /// whole record; then the whole log is.
    async fn tail_of(&self, path: &FsPath, size: u64) -> Result<Option<(Option<LogRecord>, bool)>> {
        let torn = |data: &[u8]| data.last().is_some_and(|b| *b != b'\n');
        if size > TAIL_READ_BYTES {
            match self
                .fs
                .read_range(path, size - TAIL_READ_BYTES, TAIL_READ_BYTES)
                .await
            {
                // The first line of the range is usually cut: it does not parse and is
                // skipped, as a torn line is.
                Ok(tail) => {
                    if let Some(last) = last_record(&tail) {
                        return Ok(Some((Some(last), torn(&tail))));
                    }
                }
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
        match self.fs.read_bytes(path).await {
            Ok(data) => Ok(Some((last_record(&data), torn(&data)))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The records whose sequence numbers fall in `range`, ordered by sequence number.
    /// `session_not_found` when the session has no log.
    pub async fn read(
        &self,
        session_id: &str,
        range: impl RangeBounds<u64>,
    ) -> Result<Vec<LogRecord>> {
        let parsed = self.load(session_id).await?;
        let mut records: Vec<LogRecord> = parsed
            .records
            .into_iter()
            .filter(|r| range.contains(&r.seq))
            .collect();
        records.sort_by_key(|r| r.seq);
        Ok(records)
    }

    /// Up to `limit` records with `seq >= from_seq`, ordered by sequence number. A page
    /// never splits records that share a number (possible only after a replica race), so
    /// paging with [`LogPage::next_seq`] visits every record exactly once.
    pub async fn read_page(
        &self,
        session_id: &str,
        from_seq: u64,
        limit: usize,
    ) -> Result<LogPage> {
        let parsed = self.load(session_id).await?;
        let total_records = parsed.records.len();
        let last_seq = parsed.records.iter().map(|r| r.seq).max();
        let mut records: Vec<LogRecord> = parsed
            .records
            .into_iter()
            .filter(|r| r.seq >= from_seq)
            .collect();
        records.sort_by_key(|r| r.seq);
        let mut take = limit.max(1).min(records.len());
        if let Some(boundary) = take.checked_sub(1).map(|i| records[i].seq) {
            while take < records.len() && records[take].seq == boundary {
                take += 1;
            }
        }
        let next_seq = records.get(take).map(|r| r.seq);
        records.truncate(take);
        Ok(LogPage {
            records,
            next_seq,
            last_seq,
            total_records,
            skipped_lines: parsed.skipped_lines,
        })
    }

    async fn load(&self, session_id: &str) -> Result<crate::record::ParsedLog> {
        let path = self.log_path(session_id)?;
        let data = match self.fs.read_bytes(&path).await {
            Ok(data) => data,
            Err(e) if e.is_not_found() => {
                return Err(Error::SessionNotFound {
                    session_id: session_id.to_owned(),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let parsed = parse_log(&data);
        if parsed.skipped_lines > 0 {
            tracing::warn!(path = %path, skipped = parsed.skipped_lines, "skipped unparsable session log lines");
        }
        Ok(parsed)
    }

    /// Whether the session has a log.
    pub async fn exists(&self, session_id: &str) -> Result<bool> {
        let path = self.log_path(session_id)?;
        Ok(self.fs.exists(&path).await?)
    }

    /// Every session, newest first (by `updated`, then id): the per-session index files,
    /// merged with the old whole-tenant index (`sessions.json`) for sessions that have no
    /// file yet. A log that neither lists (an update lost to a crash, or to a store without
    /// cross-process compare-and-set) is read and its entry written, so the index repairs
    /// itself from the logs. An index file that cannot be parsed is left alone (see
    /// [`rebuild_index`](Self::rebuild_index)); its session is listed from its log.
    pub async fn list_sessions(&self) -> Result<Vec<SessionEntry>> {
        use futures::StreamExt as _;
        let mut entries: BTreeMap<String, SessionEntry> = BTreeMap::new();
        let mut corrupt = Vec::new();
        let files = match self.fs.list(&self.index_dir).await {
            Ok(files) => files,
            Err(e) if e.is_not_found() => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let ids: Vec<String> = files
            .iter()
            .filter(|f| !f.is_dir())
            .filter_map(|f| f.path.file_name().strip_suffix(".json").map(str::to_owned))
            .filter(|id| validate_id("session id", id).is_ok())
            .collect();
        let mut reads = futures::stream::iter(ids.into_iter().map(|id| async move {
            let path = self.index_path(&id)?;
            let found = read_entry(self.fs.as_ref(), &path).await;
            Ok::<_, Error>((id, found))
        }))
        .buffer_unordered(LIST_READ_CONCURRENCY);
        while let Some(read) = reads.next().await {
            let (id, found) = read?;
            match found {
                Ok(Some((entry, _))) => {
                    entries.insert(id, entry);
                }
                // Deleted since the listing.
                Ok(None) => {}
                Err(Error::Corrupt { path, reason }) => {
                    tracing::warn!(path = %path, reason = %reason, "session index file unreadable; listing the session from its log");
                    corrupt.push(id);
                }
                Err(e) => return Err(e),
            }
        }
        drop(reads);
        let legacy = read_legacy_index(self.fs.as_ref(), &self.dir).await;
        for (id, entry) in legacy.sessions {
            if !corrupt.contains(&id) && validate_id("session id", &id).is_ok() {
                entries.entry(id).or_insert(entry);
            }
        }
        let logs = self.logged_sessions().await?;
        let missing: Vec<String> = logs
            .keys()
            .filter(|id| !entries.contains_key(*id))
            .cloned()
            .collect();
        // Entries whose log changed after them: their count and time come from the log's
        // last record (a long-running writer updates the index once per session, not per
        // call; see `SessionLog::refresh`).
        let stale: Vec<(String, FileInfo)> = logs
            .into_iter()
            .filter(|(id, log)| entries.get(id).is_some_and(|e| log_is_newer(log, e)))
            .collect();
        let mut refreshed = futures::stream::iter(stale.into_iter().map(|(id, log)| async move {
            let last = self.last_logged(&id, log.size).await?;
            Ok::<_, Error>((id, last))
        }))
        .buffer_unordered(LIST_READ_CONCURRENCY);
        while let Some(read) = refreshed.next().await {
            let (id, last) = read?;
            if let (Some(entry), Some(last)) = (entries.get_mut(&id), last) {
                refresh(entry, &last);
            }
        }
        drop(refreshed);
        let mut repaired = 0usize;
        for id in &missing {
            let Some(entry) = self.entry_from_log(id).await? else {
                continue;
            };
            if !corrupt.contains(id) {
                let path = self.index_path(id)?;
                let bytes = encode_entry(&path, &entry)?;
                match self
                    .fs
                    .write(&path, bytes, WriteOptions::create_new())
                    .await
                {
                    Ok(_) => repaired += 1,
                    // Written meanwhile by an update: that one is at least as new.
                    Err(hame_fs::Error::AlreadyExists { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            entries.insert(id.clone(), entry);
        }
        if repaired > 0 {
            tracing::info!(repaired, "session index missed logs; repaired from them");
        }
        let mut entries: Vec<SessionEntry> = entries.into_values().collect();
        entries.sort_by(|a, b| b.updated.cmp(&a.updated).then_with(|| a.id.cmp(&b.id)));
        Ok(entries)
    }

    /// The index entry of one session (its index file, else its entry in the old
    /// whole-tenant index).
    pub async fn session(&self, session_id: &str) -> Result<Option<SessionEntry>> {
        let path = self.index_path(session_id)?;
        let mut entry = match read_entry(self.fs.as_ref(), &path).await? {
            Some((entry, _)) => entry,
            None => match read_legacy_index(self.fs.as_ref(), &self.dir)
                .await
                .sessions
                .remove(session_id)
            {
                Some(entry) => entry,
                None => return Ok(None),
            },
        };
        match self.fs.stat(&self.log_path(session_id)?).await {
            Ok(log) if log_is_newer(&log, &entry) => {
                if let Some(last) = self.last_logged(session_id, log.size).await? {
                    refresh(&mut entry, &last);
                }
            }
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Some(entry))
    }

    /// The last valid record of a session's log (`None` when it has none): only the log's
    /// last [`TAIL_READ_BYTES`] are read, unless that holds no whole record.
    async fn last_logged(&self, session_id: &str, size: u64) -> Result<Option<LogRecord>> {
        let path = self.log_path(session_id)?;
        Ok(self.tail_of(&path, size).await?.and_then(|(last, _)| last))
    }

    /// Applies `update` to the session's index entry (creating it) by compare-and-set of
    /// its index file: read → modify → write-if-match, retried on conflict up to
    /// [`INDEX_CAS_ATTEMPTS`](crate::INDEX_CAS_ATTEMPTS) times. Returns the new entry. A
    /// session that has no index file yet starts from its entry in the old whole-tenant
    /// index, if any.
    pub async fn update_index(
        &self,
        session_id: &str,
        update: &IndexUpdate,
    ) -> Result<SessionEntry> {
        let path = self.index_path(session_id)?;
        let now = self.now();
        update_entry_cas(self.fs.as_ref(), &self.dir, session_id, &path, |entry| {
            update.apply(session_id, entry, now)
        })
        .await
    }

    /// [`update_index`](Self::update_index) until this `SessionLog` has written the
    /// session's entry with a title; after that, nothing (`Ok(None)`). What later updates
    /// would change — the message count and the time of the last record — is read from the
    /// log by [`list_sessions`](Self::list_sessions) and [`session`](Self::session) whenever
    /// the log is newer than the entry (ADR 0017), so a long-running writer replaces the
    /// index file once per session instead of once per call. Remembered per session with
    /// the writer state, within the same bound ([`MAX_CACHED_WRITERS`]): a forgotten
    /// session costs one more update.
    pub async fn update_index_once(
        &self,
        session_id: &str,
        update: &IndexUpdate,
    ) -> Result<Option<SessionEntry>> {
        let slot = self.writer(session_id);
        if slot.lock().await.titled {
            return Ok(None);
        }
        let entry = self.update_index(session_id, update).await?;
        if !entry.title.is_empty() {
            slot.lock().await.titled = true;
        }
        Ok(Some(entry))
    }

    /// The session ids that have a log file, with the log's size and time.
    async fn logged_sessions(&self) -> Result<BTreeMap<String, FileInfo>> {
        match self.fs.list(&self.dir).await {
            Ok(files) => Ok(files
                .into_iter()
                .filter_map(|f| session_of(&f).map(|id| (id, f)))
                .collect()),
            Err(e) if e.is_not_found() => Ok(BTreeMap::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// The index entry a session's log implies (`None` for an empty log).
    async fn entry_from_log(&self, session_id: &str) -> Result<Option<SessionEntry>> {
        let parsed = self.load(session_id).await?;
        let Some(first) = parsed.records.iter().map(|r| r.time).min() else {
            return Ok(None);
        };
        let last = parsed.records.iter().map(|r| r.time).max().unwrap_or(first);
        let next = parsed.records.iter().map(|r| r.seq + 1).max().unwrap_or(0);
        let messages: Vec<Message> = parsed.records.into_iter().map(|r| r.message).collect();
        let mut update = IndexUpdate::new()
            .with_message_count_at_least(next)
            .at(first);
        if let Some(title) = title_candidate(&messages) {
            update = update.with_title_if_unset(title);
        }
        let entry = update.apply(session_id, None, first);
        Ok(Some(IndexUpdate::new().at(last).apply(
            session_id,
            Some(entry),
            last,
        )))
    }

    /// Rebuilds the index from the logs themselves (every `*.log.jsonl` in the directory is
    /// read whole): repairs index files that are corrupt or missed updates. Existing titles
    /// are kept (from the session's index file, else the old whole-tenant index). Each
    /// session's index file is replaced by compare-and-set against the bytes read.
    pub async fn rebuild_index(&self) -> Result<Vec<SessionEntry>> {
        let files = match self.fs.list(&self.dir).await {
            Ok(files) => files,
            Err(e) if e.is_not_found() => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let legacy = read_legacy_index(self.fs.as_ref(), &self.dir).await;
        for session_id in sessions_in(&files) {
            let Some(mut entry) = self.entry_from_log(&session_id).await? else {
                continue;
            };
            let path = self.index_path(&session_id)?;
            // A corrupt file is replaced (that is the point of a rebuild), by
            // compare-and-set against the bytes seen.
            let current = match self.fs.read_bytes(&path).await {
                Ok(bytes) => Some(bytes),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e.into()),
            };
            let old_title = current
                .as_deref()
                .and_then(|b| parse_entry(&path, b).ok())
                .or_else(|| legacy.sessions.get(&session_id).cloned())
                .map(|e| e.title)
                .filter(|t| !t.is_empty());
            if let Some(title) = old_title {
                entry.title = title;
            }
            let bytes = encode_entry(&path, &entry)?;
            let options = match &current {
                Some(old) => WriteOptions::if_match(hame_fs::Version::of(old)),
                None => WriteOptions::create_new(),
            };
            self.fs.write(&path, bytes, options).await?;
        }
        self.list_sessions().await
    }
}

/// The session ids of the `*.log.jsonl` files in a directory listing.
fn sessions_in(files: &[FileInfo]) -> Vec<String> {
    files.iter().filter_map(session_of).collect()
}

/// The session whose log `file` is, if it is one.
fn session_of(file: &FileInfo) -> Option<String> {
    if file.is_dir() {
        return None;
    }
    let id = file.path.file_name().strip_suffix(LOG_SUFFIX)?;
    validate_id("session id", id).ok()?;
    Some(id.to_owned())
}

/// How much of a log's end [`SessionLog`] reads to find its last record.
const TAIL_READ_BYTES: u64 = 64 * 1024;

/// How long before an entry's time a log must have been last modified for a listing to
/// trust the entry without reading the log: modification times come from the backend's
/// clock, possibly in whole seconds (S3), the entry's from the writer's.
const MODIFIED_SLACK: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// Whether the log may hold records the index entry does not count: it was modified after,
/// or less than [`MODIFIED_SLACK`] before, the entry's time, or the backend does not say
/// when it was modified. Reading the tail when it was not needed only costs the read: the
/// refresh never lowers a count or a time.
fn log_is_newer(log: &FileInfo, entry: &SessionEntry) -> bool {
    log.modified
        .is_none_or(|m| m + MODIFIED_SLACK > entry.updated)
}

/// Raises the entry's count and time to the log's last record (both only grow).
fn refresh(entry: &mut SessionEntry, last: &LogRecord) {
    entry.message_count = entry.message_count.max(last.seq + 1);
    entry.updated = entry.updated.max(last.time);
}
