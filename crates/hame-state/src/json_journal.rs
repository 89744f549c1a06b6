//! The JSON store's journal: a save that changes little of the state it replaces writes
//! one line to `<session>.journal` instead of rewriting `<session>.json`, so a save costs
//! O(what changed), not O(conversation).
//!
//! A journal line applies to the base document whose `gen_id` it names, on top of the
//! version just before its own: the first `keep` messages stay, those listed in `set`
//! (index, message) are replaced, `messages` are appended; `usage`, `pending` and
//! `schema_version` are replaced, and `ext` patches the extensions (see [`diff`]). A line
//! for another base (left by a crash between a full rewrite and the removal of the old
//! journal), a line out of sequence, or a torn last line is ignored.
//!
//! `set` and `messages` of at least [`PACK_MIN_BYTES`] of JSON are written packed (ADR
//! 0021): one field `packed`, the base64 of a zstd frame of `{"set":…,"messages":…}`, when
//! that is at least a tenth smaller. The messages a turn adds are in the session log too;
//! packed, the journal repeats them in a third to a tenth of the bytes.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use hame_core::{AgentState, Message, PendingStep, Usage};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A full rewrite replaces the journal once it is larger than this many times the base
/// document, plus [`JOURNAL_SLACK`], so that a cold load never replays much more than it
/// would have read anyway.
pub(crate) const JOURNAL_FACTOR: u64 = 8;
/// See [`JOURNAL_FACTOR`].
pub(crate) const JOURNAL_SLACK: u64 = 1024 * 1024;
/// How many sessions' last state one store keeps in memory (to skip parsing on load and to
/// find what a save changes without reading the document).
pub(crate) const MAX_CACHED_STATES: usize = 128;
/// The most the cached states may weigh, counted as the size of their files: the least
/// recently used are dropped first.
pub(crate) const MAX_CACHED_BYTES: u64 = 32 * 1024 * 1024;
/// How many elements an array patch may drop from the front (a sliding window) before the
/// array is written whole instead.
const MAX_ARRAY_DROP: usize = 64;
/// A line's `set` and `messages` are packed from this many bytes of JSON on (smaller ones
/// stay readable and would gain little).
pub(crate) const PACK_MIN_BYTES: usize = 1024;
/// zstd's level for packed lines. On 10 KB of Rust source as JSON (release build, this
/// repository's benchmark VM): level 1 packs it to 4,199 bytes in 58 µs, level 3 to 4,077
/// in 65 µs, level −1 to 5,295 in 44 µs.
const PACK_LEVEL: i32 = 1;
/// The most a packed field may unpack to; a line claiming more is corrupt.
pub(crate) const MAX_UNPACKED_BYTES: u64 = 256 * 1024 * 1024;

/// The fields of a journal line besides its messages.
#[derive(Serialize)]
struct LineHead<'a> {
    gen_id: &'a str,
    version: u64,
    updated_at: DateTime<Utc>,
    schema_version: u32,
    keep: usize,
    usage: &'a Usage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pending: &'a Option<PendingStep>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    ext: &'a Map<String, Value>,
}

/// The messages of a journal line: written as fields of the line, or packed.
#[derive(Serialize)]
struct Bulk<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    set: Vec<(usize, &'a Message)>,
    messages: &'a [Message],
}

#[derive(Deserialize)]
struct BulkIn {
    #[serde(default)]
    set: Vec<(usize, Message)>,
    #[serde(default)]
    messages: Vec<Message>,
}

#[derive(Deserialize)]
pub(crate) struct LineIn {
    pub gen_id: String,
    pub version: u64,
    pub schema_version: u32,
    pub keep: usize,
    #[serde(default)]
    pub set: Vec<(usize, Message)>,
    #[serde(default)]
    pub messages: Vec<Message>,
    /// `set` and `messages`, packed ([`pack`]).
    #[serde(default)]
    pub packed: Option<String>,
    pub usage: Usage,
    #[serde(default)]
    pub pending: Option<PendingStep>,
    #[serde(default)]
    pub ext: Map<String, Value>,
}

/// `json` (a [`Bulk`]) packed: base64 of a zstd frame, when that is at least a tenth
/// smaller; `None` otherwise (the line then holds the JSON as it is).
fn pack(json: &[u8]) -> Option<String> {
    if json.len() < PACK_MIN_BYTES {
        return None;
    }
    thread_local! {
        // A compression context per thread: making one per line (what `zstd::bulk::compress`
        // does) took longer than compressing the line.
        static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    // A failure to compress only costs the bytes it would have saved.
    let frame = COMPRESSOR.with(|cell| {
        let mut cell = cell.try_borrow_mut().ok()?;
        if cell.is_none() {
            *cell = zstd::bulk::Compressor::new(PACK_LEVEL).ok();
        }
        cell.as_mut()?.compress(json).ok()
    })?;
    let packed = BASE64.encode(frame);
    (packed.len() <= json.len() - json.len() / 10).then_some(packed)
}

/// The [`BulkIn`] a `packed` field holds.
fn unpack(packed: &str) -> Result<BulkIn, String> {
    let frame = BASE64
        .decode(packed)
        .map_err(|e| format!("its packed messages are not base64: {e}"))?;
    let size = match zstd::zstd_safe::get_frame_content_size(&frame) {
        Ok(Some(size)) if size <= MAX_UNPACKED_BYTES => size,
        Ok(Some(size)) => {
            return Err(format!(
                "its packed messages claim {size} bytes, over the limit of {MAX_UNPACKED_BYTES}"
            ));
        }
        Ok(None) | Err(_) => {
            return Err("its packed messages are not a zstd frame of known size".into());
        }
    };
    let capacity = usize::try_from(size).map_err(|e| e.to_string())?;
    let json = zstd::bulk::decompress(&frame, capacity)
        .map_err(|e| format!("its packed messages do not unpack: {e}"))?;
    serde_json::from_slice(&json).map_err(|e| format!("its packed messages are not valid: {e}"))
}

/// What a save changes, found by comparing with the stored state.
#[derive(Debug)]
pub(crate) struct Change {
    /// Stored messages kept (before replacements and appends).
    pub keep: usize,
    /// Indexes (below `keep`) of messages replaced.
    pub set: Vec<usize>,
    /// The extensions patch ([`diff_map`]).
    pub ext: Map<String, Value>,
}

impl Change {
    /// The journal line of this change to `state` (without its newline), its messages
    /// packed when `pack_messages` and [`pack`] finds it worth it (see the module docs). The version is
    /// a placeholder, `"version":0,`, set when the line is appended.
    pub(crate) fn encode(
        &self,
        gen_id: &str,
        state: &AgentState,
        pack_messages: bool,
    ) -> serde_json::Result<Vec<u8>> {
        let head = LineHead {
            gen_id,
            version: 0,
            updated_at: Utc::now(),
            schema_version: state.schema_version,
            keep: self.keep,
            usage: &state.usage,
            pending: &state.pending,
            ext: &self.ext,
        };
        let bulk = serde_json::to_vec(&Bulk {
            set: self.set.iter().map(|i| (*i, &state.messages[*i])).collect(),
            messages: &state.messages[self.keep..],
        })?;
        let mut line = serde_json::to_vec(&head)?;
        line.pop(); // the closing `}` of the head
        match pack_messages.then(|| pack(&bulk)).flatten() {
            Some(packed) => {
                line.reserve(packed.len() + 14);
                line.extend_from_slice(b",\"packed\":\"");
                line.extend_from_slice(packed.as_bytes());
                line.extend_from_slice(b"\"}");
            }
            None => {
                // The bulk's fields join the head's: `{"a":1` + `,` + `"messages":[…]}`.
                line.push(b',');
                line.extend_from_slice(bulk.get(1..).unwrap_or_default());
            }
        }
        Ok(line)
    }

    /// Brings `stored` to `state` (what replaying the line does, without the copy): the
    /// new messages are copied, the extensions patched (a list that grew by one entry
    /// gets that entry, not a copy of the list).
    pub(crate) fn apply_to(self, stored: &mut AgentState, state: &AgentState) {
        stored.messages.truncate(self.keep);
        for i in &self.set {
            stored.messages[*i] = state.messages[*i].clone();
        }
        stored
            .messages
            .extend_from_slice(&state.messages[self.keep..]);
        stored.usage = state.usage;
        stored.pending.clone_from(&state.pending);
        // The patch was made from this very copy, so it fits; if it ever did not, take
        // the new extensions whole.
        if !apply_map(&mut stored.extensions, self.ext) {
            stored.extensions.clone_from(&state.extensions);
        }
        stored.schema_version = state.schema_version;
    }
}

/// What identifies one version of a file: a rewrite (rename) changes the inode, an append
/// the length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl FileId {
    pub(crate) fn of(md: &fs::Metadata) -> Self {
        #[cfg(unix)]
        let ino = std::os::unix::fs::MetadataExt::ino(md);
        #[cfg(not(unix))]
        let ino = 0;
        let mtime_ns = md
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX));
        FileId {
            ino,
            len: md.len(),
            mtime_ns,
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The id of `path` now, `None` when it does not exist.
    pub(crate) fn stat(path: &Path) -> io::Result<Option<Self>> {
        match fs::metadata(path) {
            Ok(md) => Ok(Some(Self::of(&md))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The state of a document as this store last read or wrote it.
#[derive(Debug, Clone)]
pub(crate) struct Doc {
    pub state: Arc<AgentState>,
    pub version: u64,
    /// The base document's generation; `None` for a document without one (written by an
    /// earlier build or planted raw): never appended to.
    pub gen_id: Option<String>,
    pub base: FileId,
    pub journal: Option<FileId>,
    /// Whether the journal ends with a whole line (appending is safe).
    pub clean_tail: bool,
}

impl Doc {
    /// What a save of `state` changes, when it can be a journal line on top of this
    /// document: same base, a clean journal not yet too long, and at most half of the kept
    /// messages replaced (a compaction that shifts every message is a full rewrite).
    pub(crate) fn change(&self, state: &AgentState) -> Option<Change> {
        let journal = self.journal.map_or(0, |j| j.len());
        if self.gen_id.is_none()
            || !self.clean_tail
            || journal > JOURNAL_FACTOR * self.base.len() + JOURNAL_SLACK
        {
            return None;
        }
        let old = &self.state.messages;
        let keep = old.len().min(state.messages.len());
        let mut set = Vec::new();
        for (i, (a, b)) in old.iter().zip(&state.messages).enumerate() {
            if a != b {
                set.push(i);
                if set.len() * 2 > keep {
                    return None;
                }
            }
        }
        let ext = diff_map(&self.state.extensions, &state.extensions);
        Some(Change { keep, set, ext })
    }

    /// What keeping it in memory costs, roughly: the size of its files.
    pub(crate) fn weight(&self) -> u64 {
        self.base.len() + self.journal.map_or(0, |j| j.len())
    }

    /// Whether the files are still what this document was read from.
    pub(crate) fn is_current(&self, base: Option<FileId>, journal: Option<FileId>) -> bool {
        base == Some(self.base) && journal == self.journal
    }
}

/// Where [`replay`] got to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replayed {
    /// The version of the last line applied (the base's when none).
    pub version: u64,
    /// The schema version of the last line applied (0 when none).
    pub schema_version: u32,
    /// Whether the journal ends with a whole line (appending is safe).
    pub clean_tail: bool,
}

/// Why a journal cannot be replayed.
#[derive(Debug)]
pub(crate) enum ReplayError {
    /// A line of a newer hame (its schema version).
    TooNew(u32),
    /// A line in sequence that does not fit the state it applies to.
    Corrupt(String),
}

/// Applies the journal `bytes` to `state` (at `version`, base generation `gen_id`); with
/// no state, only follows the version sequence.
pub(crate) fn replay(
    mut state: Option<&mut AgentState>,
    mut version: u64,
    gen_id: &str,
    bytes: &[u8],
) -> Result<Replayed, ReplayError> {
    let clean_tail = bytes.last().is_none_or(|b| *b == b'\n');
    let mut schema_version = 0;
    for line in bytes.split(|b| *b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let Ok(line) = serde_json::from_slice::<LineIn>(line) else {
            // A torn last line (a crash mid-append); anything else unreadable is skipped too.
            continue;
        };
        if line.gen_id != gen_id || line.version != version + 1 {
            continue;
        }
        if line.schema_version > hame_core::STATE_SCHEMA_VERSION {
            return Err(ReplayError::TooNew(line.schema_version));
        }
        if let Some(state) = state.as_deref_mut() {
            let corrupt = |what: &str| {
                ReplayError::Corrupt(format!("journal line of version {}: {what}", line.version))
            };
            if line.keep > state.messages.len() {
                return Err(corrupt("keeps more messages than there are"));
            }
            let (set, messages) = match &line.packed {
                Some(packed) => {
                    let bulk = unpack(packed).map_err(|e| corrupt(&e))?;
                    (bulk.set, bulk.messages)
                }
                None => (line.set, line.messages),
            };
            state.messages.truncate(line.keep);
            for (i, m) in set {
                *state
                    .messages
                    .get_mut(i)
                    .ok_or_else(|| corrupt("replaces a message that is not there"))? = m;
            }
            state.messages.extend(messages);
            state.usage = line.usage;
            state.pending = line.pending;
            if !apply_map(&mut state.extensions, line.ext) {
                return Err(corrupt("its extensions patch does not fit"));
            }
            state.schema_version = line.schema_version;
        }
        schema_version = line.schema_version;
        version = line.version;
    }
    Ok(Replayed {
        version,
        schema_version,
        clean_tail,
    })
}

/// The patch from `old` to `new` extensions: per changed key, [`diff`]'s patch of its value;
/// a removed key maps to `null`. Empty when nothing changed.
pub(crate) fn diff_map(
    old: &BTreeMap<String, Value>,
    new: &BTreeMap<String, Value>,
) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in new {
        match old.get(k) {
            Some(o) if o == v => {}
            Some(o) => {
                out.insert(k.clone(), diff(o, v));
            }
            None => {
                out.insert(k.clone(), replace(v));
            }
        }
    }
    for k in old.keys() {
        if !new.contains_key(k) {
            out.insert(k.clone(), Value::Null);
        }
    }
    out
}

/// Applies [`diff_map`]'s patch; `false` if it does not fit.
pub(crate) fn apply_map(target: &mut BTreeMap<String, Value>, patch: Map<String, Value>) -> bool {
    for (k, p) in patch {
        if p.is_null() {
            target.remove(&k);
            continue;
        }
        let slot = target.entry(k).or_insert(Value::Null);
        if !apply(slot, p) {
            return false;
        }
    }
    true
}

fn replace(v: &Value) -> Value {
    let mut m = Map::new();
    m.insert("=".into(), v.clone());
    Value::Object(m)
}

/// The patch that turns `old` into `new` (which differ):
///
/// - `{"=": value}` replaces the value;
/// - `{"o": {key: patch, …}, "-": [key, …]}` patches an object's changed keys and removes
///   others;
/// - `{"d": n, "+": [value, …]}` drops `n` elements from the front of an array and appends
///   others (a list that grows, or a sliding window of recent entries).
pub(crate) fn diff(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut set = Map::new();
            for (k, v) in n {
                match o.get(k) {
                    Some(ov) if ov == v => {}
                    Some(ov) => {
                        set.insert(k.clone(), diff(ov, v));
                    }
                    None => {
                        set.insert(k.clone(), replace(v));
                    }
                }
            }
            let removed: Vec<Value> = o
                .keys()
                .filter(|k| !n.contains_key(*k))
                .map(|k| Value::String(k.clone()))
                .collect();
            let mut m = Map::new();
            m.insert("o".into(), Value::Object(set));
            if !removed.is_empty() {
                m.insert("-".into(), Value::Array(removed));
            }
            Value::Object(m)
        }
        (Value::Array(o), Value::Array(n)) => match array_drop(o, n) {
            Some(d) => {
                let pushed = n[o.len() - d..].to_vec();
                let mut m = Map::new();
                m.insert("d".into(), Value::from(d));
                m.insert("+".into(), Value::Array(pushed));
                Value::Object(m)
            }
            None => replace(new),
        },
        _ => replace(new),
    }
}

/// The smallest `d` with `old[d..]` a prefix of `new`, if any is at most [`MAX_ARRAY_DROP`].
fn array_drop(old: &[Value], new: &[Value]) -> Option<usize> {
    (0..=old.len().min(MAX_ARRAY_DROP)).find(|&d| {
        let rest = &old[d..];
        rest.len() <= new.len() && new[..rest.len()] == *rest
    })
}

/// Applies [`diff`]'s patch to `target`; `false` if it does not fit.
pub(crate) fn apply(target: &mut Value, patch: Value) -> bool {
    let Value::Object(mut p) = patch else {
        return false;
    };
    if let Some(v) = p.remove("=") {
        *target = v;
        return true;
    }
    if let Some(Value::Object(set)) = p.remove("o") {
        let Value::Object(t) = target else {
            return false;
        };
        for (k, sub) in set {
            let slot = t.entry(k).or_insert(Value::Null);
            if !apply(slot, sub) {
                return false;
            }
        }
        if let Some(Value::Array(removed)) = p.remove("-") {
            for k in removed {
                if let Value::String(k) = k {
                    t.remove(&k);
                }
            }
        }
        return true;
    }
    if let (Some(d), Some(Value::Array(pushed))) = (p.remove("d"), p.remove("+")) {
        let (Value::Array(t), Some(d)) = (target, d.as_u64()) else {
            return false;
        };
        let Ok(d) = usize::try_from(d) else {
            return false;
        };
        if d > t.len() {
            return false;
        }
        t.drain(..d);
        t.extend(pushed);
        return true;
    }
    false
}

/// A bounded map from document path to [`Doc`]; the least recently used goes first.
#[derive(Debug, Default)]
pub(crate) struct DocCache {
    docs: HashMap<PathBuf, (u64, Doc)>,
    tick: u64,
}

impl DocCache {
    pub(crate) fn get(&mut self, path: &Path) -> Option<Doc> {
        self.tick += 1;
        let tick = self.tick;
        self.docs.get_mut(path).map(|(t, doc)| {
            *t = tick;
            doc.clone()
        })
    }

    pub(crate) fn put(&mut self, path: PathBuf, doc: Doc) {
        self.tick += 1;
        self.docs.remove(&path);
        let weight = doc.weight();
        if weight > MAX_CACHED_BYTES {
            return;
        }
        while !self.docs.is_empty()
            && (self.docs.len() >= MAX_CACHED_STATES
                || self.docs.values().map(|(_, d)| d.weight()).sum::<u64>() + weight
                    > MAX_CACHED_BYTES)
        {
            let Some(oldest) = self
                .docs
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(p, _)| p.clone())
            else {
                break;
            };
            self.docs.remove(&oldest);
        }
        self.docs.insert(path, (self.tick, doc));
    }

    /// Removes and returns the entry (a save extends it in place, then puts it back).
    pub(crate) fn take(&mut self, path: &Path) -> Option<Doc> {
        self.docs.remove(path).map(|(_, doc)| doc)
    }

    pub(crate) fn remove(&mut self, path: &Path) {
        self.docs.remove(path);
    }
}

#[cfg(test)]
#[path = "json_journal_tests.rs"]
mod tests;
