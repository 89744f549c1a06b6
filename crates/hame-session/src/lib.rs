//! # hame-session
//!
//! Never-compacted session logs for the hame agent harness. Every message of every call —
//! full tool arguments and full tool results, never truncated — is appended as one JSON line
//! to `agents/<agentId>/sessions/<sessionId>.log.jsonl` on a [`hame_fs::Filesystem`], and an
//! index (one small file per session, `index/<sessionId>.json` next to the logs) lists the sessions with a title, times and a
//! message count. Context compaction may drop messages from the model's window; the log
//! keeps them, and the [`session_list`](SessionListTool) and
//! [`session_history`](SessionHistoryTool) tools let the model read them back.
//!
//! Depend on it to record conversations (the harness does) or to give an agent the session
//! tools. The filesystem decides where the files land: local disk, memory, or Redis with
//! native appends in shared-store mode. Pass a filesystem already scoped to the tenant.
//!
//! | feature | what it adds |
//! |---|---|
//! | (none) | everything; backends are chosen by the [`Filesystem`](hame_fs::Filesystem) you pass |
//!
//! Formats, guarantees, defaults and limits: `docs/sessions.md`.
//!
//! ```
//! # async fn demo() -> hame_session::Result<()> {
//! use std::sync::Arc;
//! use hame_core::Message;
//! use hame_session::SessionLog;
//!
//! let log = SessionLog::new(Arc::new(hame_fs::InMemoryFs::new()), "main")?;
//! let seqs = log
//!     .append_messages("s-1", "call-1", &[Message::user("hi"), Message::assistant("hello")])
//!     .await?;
//! assert_eq!(seqs, 0..2);
//! let records = log.read("s-1", ..).await?;
//! assert_eq!(records[1].message.text_content(), "hello");
//! let sessions = log.list_sessions().await?;
//! assert_eq!((sessions[0].title.as_str(), sessions[0].message_count), ("hi", 2));
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod error;
mod id;
mod index;
mod log;
mod record;
mod side;
mod tools;

pub use error::{Error, Result, codes};
pub use id::{MAX_ID_LEN, validate_id};
pub use index::{
    INDEX_CAS_ATTEMPTS, INDEX_FORMAT_VERSION, IndexUpdate, SessionEntry, TITLE_MAX_CHARS,
    make_title,
};
pub use log::{
    INDEX_DIR, INDEX_FILE, LEGACY_INDEX_FILE, LOG_SUFFIX, LogPage, MAX_CACHED_WRITERS, SessionLog,
    SessionLogOptions, TailCheck,
};
pub use record::{LogRecord, RECORD_FORMAT_VERSION};
pub use side::{CONTEXT_SUFFIX, EVIDENCE_SUFFIX, OBSERVATIONS_SUFFIX};
pub use tools::{
    DEFAULT_HISTORY_LIMIT, DEFAULT_LIST_LIMIT, DEFAULT_RECORD_CHARS, MAX_HISTORY_LIMIT,
    MAX_LIST_LIMIT, MAX_RECORD_CHARS, SessionHistoryArgs, SessionHistoryTool, SessionListArgs,
    SessionListTool, SessionToolOptions, session_tools,
};
