//! The JSON store's journal: a save that only appends messages to the state it replaces
//! writes one line to `<session>.journal` instead of rewriting `<session>.json`, so a save
//! costs O(new messages), not O(conversation).
//!
//! A journal line applies to the base document whose `gen` it names, on top of the version
//! just before its own: `keep` messages of that state stay, `messages` are appended, and
//! `usage`, `pending`, `extensions` and `schema_version` are replaced. A line for another
//! base (left by a crash between a full rewrite and the removal of the old journal), a line
//! out of sequence, or a torn last line is ignored.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use hame_core::{AgentState, Message, PendingStep, Usage};
use serde::{Deserialize, Serialize};

/// A full rewrite replaces the journal once it is larger than this many times the base
/// document, plus [`JOURNAL_SLACK`], so that a cold load never replays much more than it
/// would have read anyway.
pub(crate) const JOURNAL_FACTOR: u64 = 4;
/// See [`JOURNAL_FACTOR`].
pub(crate) const JOURNAL_SLACK: u64 = 256 * 1024;
/// How many sessions' last state one store keeps in memory (to skip parsing on load and to
/// find what a save adds without reading the document).
pub(crate) const MAX_CACHED_STATES: usize = 128;

#[derive(Serialize)]
pub(crate) struct LineOut<'a> {
    pub gen_id: &'a str,
    pub version: u64,
    pub updated_at: DateTime<Utc>,
    pub schema_version: u32,
    pub keep: usize,
    pub messages: &'a [Message],
    pub usage: &'a Usage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: &'a Option<PendingStep>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extensions: &'a BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
pub(crate) struct LineIn {
    pub gen_id: String,
    pub version: u64,
    pub schema_version: u32,
    pub keep: usize,
    pub messages: Vec<Message>,
    pub usage: Usage,
    #[serde(default)]
    pub pending: Option<PendingStep>,
    #[serde(default)]
    pub extensions: BTreeMap<String, serde_json::Value>,
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
    /// Whether a save of `state` can be a journal line on top of this document: same base,
    /// a clean journal not yet too long, and the stored messages a prefix of the new ones.
    pub(crate) fn appendable(&self, state: &AgentState) -> bool {
        let kept = self.state.messages.len();
        let journal = self.journal.map_or(0, |j| j.len());
        self.gen_id.is_some()
            && self.clean_tail
            && journal <= JOURNAL_FACTOR * self.base.len() + JOURNAL_SLACK
            && state.messages.len() >= kept
            && state.messages[..kept] == self.state.messages[..]
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

/// Applies the journal `bytes` to `state` (at `version`, base generation `gen_id`); with
/// no state, only follows the version sequence. `Err(schema)` for a line of a newer hame.
pub(crate) fn replay(
    mut state: Option<&mut AgentState>,
    mut version: u64,
    gen_id: &str,
    bytes: &[u8],
) -> std::result::Result<Replayed, u32> {
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
            return Err(line.schema_version);
        }
        if let Some(state) = state.as_deref_mut() {
            state.messages.truncate(line.keep);
            state.messages.extend(line.messages);
            state.usage = line.usage;
            state.pending = line.pending;
            state.extensions = line.extensions;
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
        if self.docs.len() >= MAX_CACHED_STATES
            && !self.docs.contains_key(&path)
            && let Some(oldest) = self
                .docs
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(p, _)| p.clone())
        {
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
