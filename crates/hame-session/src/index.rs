//! The session index: one small file per session, `agents/<agentId>/sessions/index/<sessionId>.json`,
//! updated by compare-and-set and merged on read (with the whole-tenant `sessions.json` of
//! earlier builds, when there is one).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hame_core::{Message, Role};
use hame_fs::{Filesystem, FsPath, Version, WriteOptions};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The version of the index format written by this crate.
pub const INDEX_FORMAT_VERSION: u32 = 1;
/// Longest title kept in the index, in characters.
pub const TITLE_MAX_CHARS: usize = 80;
/// How many times an index update is attempted before giving up with `conflict`.
pub const INDEX_CAS_ATTEMPTS: usize = 64;

/// One session in the index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEntry {
    /// The session id.
    pub id: String,
    /// The first user message, whitespace-collapsed and cut to [`TITLE_MAX_CHARS`]
    /// characters (empty until the session has a user message).
    #[serde(default)]
    pub title: String,
    /// When the first record was logged.
    #[serde(with = "time_fmt")]
    pub created: DateTime<Utc>,
    /// When the last record was logged. The stored file may lag the log (a writer may
    /// update the index once per session); [`SessionLog::list_sessions`](crate::SessionLog::list_sessions)
    /// and [`SessionLog::session`](crate::SessionLog::session) take it from the log then.
    #[serde(with = "time_fmt")]
    pub updated: DateTime<Utc>,
    /// How many records the log holds: the next sequence number to be written (read from
    /// the log, like `updated`, when the stored file lags).
    pub message_count: u64,
}

/// A change to one index entry (see [`SessionLog::update_index`](crate::SessionLog::update_index)).
///
/// Every field merges, so applying an update twice, or two updates in either order, gives
/// the same entry: counts only grow, `updated` only moves forward, a title given as
/// `title_if_unset` never replaces one that is already there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IndexUpdate {
    /// Sets the title (trimmed to [`TITLE_MAX_CHARS`]), replacing any existing one.
    pub title: Option<String>,
    /// Sets the title only when the entry has none yet.
    pub title_if_unset: Option<String>,
    /// Raises `message_count` to at least this.
    pub message_count_at_least: Option<u64>,
    /// The time of the change (`created` for a new entry; `updated` moves to it if later).
    pub at: Option<DateTime<Utc>>,
}

impl IndexUpdate {
    /// An update that only touches the entry (creating it if needed).
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the title.
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// Sets the title if the entry has none.
    pub fn with_title_if_unset(mut self, title: impl Into<String>) -> Self {
        self.title_if_unset = Some(title.into());
        self
    }

    /// Raises the message count.
    pub fn with_message_count_at_least(mut self, count: u64) -> Self {
        self.message_count_at_least = Some(count);
        self
    }

    /// Sets the time of the change.
    pub fn at(mut self, at: DateTime<Utc>) -> Self {
        self.at = Some(at);
        self
    }

    pub(crate) fn apply(
        &self,
        id: &str,
        entry: Option<SessionEntry>,
        now: DateTime<Utc>,
    ) -> SessionEntry {
        let at = self.at.unwrap_or(now);
        let mut entry = entry.unwrap_or_else(|| SessionEntry {
            id: id.to_owned(),
            title: String::new(),
            created: at,
            updated: at,
            message_count: 0,
        });
        if let Some(title) = &self.title {
            entry.title = make_title(title);
        } else if entry.title.is_empty()
            && let Some(title) = &self.title_if_unset
        {
            entry.title = make_title(title);
        }
        if let Some(n) = self.message_count_at_least {
            entry.message_count = entry.message_count.max(n);
        }
        entry.updated = entry.updated.max(at);
        entry.created = entry.created.min(at);
        entry
    }
}

/// Collapses whitespace and cuts to [`TITLE_MAX_CHARS`] characters (with `…` when cut).
pub fn make_title(text: &str) -> String {
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.chars().count() <= TITLE_MAX_CHARS {
        return collapsed;
    }
    let mut out: String = collapsed.chars().take(TITLE_MAX_CHARS - 1).collect();
    out.truncate(out.trim_end().len());
    out.push('…');
    out
}

/// The title candidate of a batch of messages: the first non-empty user text.
pub(crate) fn title_candidate(messages: &[Message]) -> Option<String> {
    messages
        .iter()
        .filter(|m| m.role == Role::User)
        .map(Message::text_content)
        .find(|t| !t.trim().is_empty())
}

/// The index document of earlier builds (`sessions.json`, before that `index.json`): every
/// session of the tenant in one file. Read (never written) to carry its entries over.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IndexFile {
    #[serde(default = "default_version")]
    pub version: u32,
    #[serde(default)]
    pub sessions: BTreeMap<String, SessionEntry>,
}

fn default_version() -> u32 {
    INDEX_FORMAT_VERSION
}

/// One session's index file, `sessions/index/<sessionId>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EntryFile {
    #[serde(default = "default_version")]
    pub version: u32,
    pub session: SessionEntry,
}

/// Parses one session's index file.
pub(crate) fn parse_entry(path: &FsPath, bytes: &[u8]) -> Result<SessionEntry> {
    serde_json::from_slice::<EntryFile>(bytes)
        .map(|f| f.session)
        .map_err(|e| Error::Corrupt {
            path: path.to_string(),
            reason: e.to_string(),
        })
}

/// Encodes one session's index file.
pub(crate) fn encode_entry(path: &FsPath, entry: &SessionEntry) -> Result<Vec<u8>> {
    let file = EntryFile {
        version: INDEX_FORMAT_VERSION,
        session: entry.clone(),
    };
    let mut bytes = serde_json::to_vec(&file).map_err(|e| Error::Corrupt {
        path: path.to_string(),
        reason: format!("cannot encode: {e}"),
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Reads one session's index file: `None` when it does not exist.
pub(crate) async fn read_entry(
    fs: &dyn Filesystem,
    path: &FsPath,
) -> Result<Option<(SessionEntry, Version)>> {
    match fs.read_bytes(path).await {
        Ok(bytes) => Ok(Some((parse_entry(path, &bytes)?, Version::of(&bytes)))),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The whole-tenant index of an earlier build: `sessions.json`, else `index.json`, in
/// `dir`. Missing is empty; an unreadable one is logged and counts as empty (the logs
/// repair what it would have said).
pub(crate) async fn read_legacy_index(fs: &dyn Filesystem, dir: &FsPath) -> IndexFile {
    for name in [crate::log::INDEX_FILE, crate::log::LEGACY_INDEX_FILE] {
        let Ok(path) = dir.join(name) else { continue };
        match fs.read_bytes(&path).await {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(index) => return index,
                Err(e) => {
                    tracing::warn!(path = %path, error = %e, "old session index unreadable; ignored");
                    return IndexFile::default();
                }
            },
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::warn!(path = %path, error = %e, "old session index unreadable; ignored");
                return IndexFile::default();
            }
        }
    }
    IndexFile::default()
}

/// Read → modify → write-if-match of one session's index file, retried on `conflict` up to
/// [`INDEX_CAS_ATTEMPTS`] times with a short growing, jittered pause. Never overwrites
/// blindly. A session without a file yet starts from its entry in the old whole-tenant
/// index of `legacy_dir`, if any (read only then). The write is atomic but not fsynced: the index is
/// derived from the logs, which are, and a listing repairs entries the logs imply.
pub(crate) async fn update_entry_cas<F>(
    fs: &dyn Filesystem,
    legacy_dir: &FsPath,
    session_id: &str,
    path: &FsPath,
    mut modify: F,
) -> Result<SessionEntry>
where
    F: FnMut(Option<SessionEntry>) -> SessionEntry + Send,
{
    let mut seed_read = false;
    let mut seeded: Option<SessionEntry> = None;
    for attempt in 0..INDEX_CAS_ATTEMPTS {
        let (entry, options) = match read_entry(fs, path).await? {
            Some((entry, version)) => (modify(Some(entry)), WriteOptions::if_match(version)),
            None => {
                if !seed_read {
                    seed_read = true;
                    seeded = read_legacy_index(fs, legacy_dir)
                        .await
                        .sessions
                        .remove(session_id);
                }
                (modify(seeded.clone()), WriteOptions::create_new())
            }
        };
        let bytes = encode_entry(path, &entry)?;
        let options = WriteOptions {
            durability: hame_fs::Durability::Atomic,
            ..options
        };
        match fs.write(path, bytes, options).await {
            Ok(_) => return Ok(entry),
            Err(hame_fs::Error::Conflict { .. } | hame_fs::Error::AlreadyExists { .. }) => {
                tracing::debug!(path = %path, attempt, "session index entry changed concurrently; retrying");
                tokio::time::sleep(backoff(attempt)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Conflict {
        path: path.to_string(),
        attempts: INDEX_CAS_ATTEMPTS,
    })
}

/// 0–1 ms for the first retries, growing to at most ~20 ms, with jitter so that racing
/// replicas spread out.
fn backoff(attempt: usize) -> Duration {
    let cap_us = (1000u64 << attempt.min(4)).min(20_000);
    Duration::from_micros(jitter() % cap_us)
}

fn jitter() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::BuildHasher;
    RandomState::new().hash_one(std::time::SystemTime::now())
}

mod time_fmt {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::record::fmt_time(t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let s = std::borrow::Cow::<str>::deserialize(d)?;
        DateTime::parse_from_rfc3339(&s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn titles_are_short_single_lines(text in "\\PC*|[ \\t\\n]*") {
            let title = make_title(&text);
            prop_assert!(title.chars().count() <= TITLE_MAX_CHARS);
            prop_assert!(!title.contains('\n') && !title.starts_with(' ') && !title.ends_with(' '));
            prop_assert_eq!(make_title(&title), title.clone());
        }

        /// Applying updates in any order gives the same entry (replicas converge).
        #[test]
        fn updates_commute(counts in proptest::collection::vec((0u64..100, 0i64..1000), 1..8)) {
            use chrono::TimeZone;
            let base = Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).single().unwrap_or_default();
            let updates: Vec<IndexUpdate> = counts
                .iter()
                .map(|(n, s)| IndexUpdate::new().with_message_count_at_least(*n).at(base + chrono::Duration::seconds(*s)))
                .collect();
            let fold = |order: &mut dyn Iterator<Item = &IndexUpdate>| {
                order.fold(None, |entry, u| Some(u.apply("s", entry, base)))
            };
            let forward = fold(&mut updates.iter());
            let backward = fold(&mut updates.iter().rev());
            prop_assert_eq!(forward, backward);
        }
    }
}
