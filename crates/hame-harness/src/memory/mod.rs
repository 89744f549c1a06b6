//! Memory and context management in the harness: the building blocks of `hame-memory`
//! wired to the caller's workspace, the state store and the loop.
//!
//! - **Compaction** before a model request when the conversation has more than
//!   [`CompactionPolicy::max_messages`] messages or the request's tokens reach the window
//!   minus the reserve, and after a context overflow (then the loop retries). The
//!   summary call also records the facts of the messages it replaces in the daily log
//!   (one call for both; a flush call of its own when the answer has no facts section),
//!   so no fact is lost to a summary.
//! - **Offloading** of tool results over the threshold to `large_tool_results/<call_id>-<12 hex of its SHA-256>.txt`
//!   in the caller's filesystem. The offload layer sits inside the session-log layer, so
//!   the log records the full result and the state keeps the preview.
//! - **Daily logs** (`memory/YYYY-MM-DD.md`): written at compaction, and after a call
//!   (in the background, once the reply is durable) when enough messages are unflushed.
//!   The watermark lives in `AgentState.extensions["memory"]`.
//! - **`MEMORY.md`** rewritten by the throttled consolidator in the background, one
//!   replica per tenant at a time (a lease on the reserved session id [`MEMORY_LEASE_SESSION`]).
//! - **Search**: a per-replica SQLite index ([`MemoryOptions::index_path`]) fed lazily
//!   before each search; tools `memory_search`, `memory_get`, `memory_save`,
//!   `session_search`.
//!
//! Defaults and limits: `docs/memory-wiring.md`.

mod background;
mod files;
mod layer;
mod layers;
mod tools;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use hame_memory::{
    CompactionPolicy, ConsolidationOptions, FlushOptions, OffloadPolicy, ThrottlePolicy,
};

pub(crate) use background::{spawn_after_call, unflushed};
pub(crate) use layer::MemoryLayer;
pub(crate) use layers::{FlushBeforeCompaction, OffloadLayer};
pub(crate) use tools::memory_tools;
pub use tools::{DEFAULT_HITS, GET_LINES, MAX_HITS, MAX_SAVED_FACT_CHARS};

/// The session id reserved for the consolidation lease of a tenant's memory: the lease key
/// is `(agent, user, "_memory")` for a user's own memory (scope `user`), else
/// `(agent, anonymous, "_memory-<16 hex of the namespace>")`. Do not use session ids that
/// start with `_memory`.
pub const MEMORY_LEASE_SESSION: &str = "_memory";

/// Default: flush after a call when at least this many messages are unflushed.
pub const DEFAULT_FLUSH_MIN_NEW_MESSAGES: usize = 80;
/// Default longest wait of [`HarnessAgent::wait_background`](crate::HarnessAgent::wait_background)
/// in the CLI.
pub const DEFAULT_BACKGROUND_WAIT: Duration = Duration::from_secs(30);
/// Most flush rounds before one compaction (each round sends at most
/// [`FlushOptions::max_transcript_chars`]).
pub const MAX_FLUSH_ROUNDS: usize = 4;
/// Time-to-live of the consolidation lease.
pub const CONSOLIDATION_LEASE_TTL: Duration = Duration::from_secs(120);
/// Most sessions indexed for `session_search` (the most recently updated ones, plus the
/// current one).
pub const MAX_INDEXED_SESSIONS: usize = 100;
/// Characters of one session-log record indexed for `session_search` (head and tail).
pub const INDEXED_RECORD_CHARS: usize = 2_000;

/// When to flush the daily log after a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushPolicy {
    /// Flush after calls at all (the facts of summarised messages are always recorded at
    /// compaction). Default true.
    pub after_call: bool,
    /// Flush after a call only when at least this many messages are unflushed. Default
    /// [`DEFAULT_FLUSH_MIN_NEW_MESSAGES`].
    pub min_new_messages: usize,
}

impl Default for FlushPolicy {
    fn default() -> Self {
        Self {
            after_call: true,
            min_new_messages: DEFAULT_FLUSH_MIN_NEW_MESSAGES,
        }
    }
}

/// Memory and context management settings of a [`HarnessAgent`](crate::HarnessAgent).
#[derive(Debug, Clone)]
pub struct MemoryOptions {
    /// Turn the whole memory layer on (default) or off.
    pub enabled: bool,
    /// When to compact and how much to keep.
    pub compaction: CompactionPolicy,
    /// When tool results are offloaded.
    pub offload: OffloadPolicy,
    /// Limits of one flush call.
    pub flush: FlushOptions,
    /// When to flush after calls.
    pub flush_policy: FlushPolicy,
    /// `MEMORY.md` budget and throttle.
    pub consolidation: ConsolidationOptions,
    /// The search index file. Default `<workspace>/agents/<agent>/.memory-index.sqlite`:
    /// per replica, outside every tenant namespace, hidden from the workspace template.
    pub index_path: Option<PathBuf>,
    /// A search index to use instead of the SQLite file, e.g. a shared
    /// `hame_memory::PgIndex` for replicas on PostgreSQL. Default `None`.
    pub index: Option<Arc<dyn hame_memory::SearchIndex>>,
    /// Overrides the model's context window (tokens) for every budget. Default: the
    /// model's own.
    pub context_window: Option<u64>,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        Self {
            enabled: true,
            compaction: CompactionPolicy::default(),
            offload: OffloadPolicy::default(),
            flush: FlushOptions::default(),
            flush_policy: FlushPolicy::default(),
            consolidation: ConsolidationOptions::default(),
            index_path: None,
            index: None,
            context_window: None,
        }
    }
}

impl MemoryOptions {
    /// Memory management switched off: no compaction, offloading, flush or memory tools.
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
