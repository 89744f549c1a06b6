//! # hame-memory
//!
//! The memory and context engine of the hame agent harness, as pure, tested building
//! blocks with no filesystem and no harness: the harness wires them to the workspace.
//!
//! - [`index`]: full-text search over workspace files ([`SearchIndex`]): SQLite FTS5 with
//!   BM25, snippets, prefix queries, safe query parsing and CJK substring search
//!   ([`SqliteIndex`]), PostgreSQL full-text search for replicas sharing one index
//!   (`PgIndex`, feature `postgres`), and a naive [`InMemoryIndex`]; all pass one
//!   conformance suite.
//! - [`tokens`]: [`TokenCounter`], exact for OpenAI families (tiktoken) and a calibrated
//!   estimate for the rest; token totals of messages, system prompt and tool specs.
//! - [`compaction`]: plans and applies the summary of older messages with property-tested
//!   invariants; [`Compactor`] calls the model atomically (map-reduce when the input is too
//!   large); [`CompactionLayer`] triggers it by count/tokens and on context overflow.
//! - [`offload`]: [`Offloader`] moves oversized tool results to
//!   `large_tool_results/<call_id>-<content hash>.txt` through a [`ResultSink`] and leaves a
//!   preview.
//! - [`daily`]: the `memory/YYYY-MM-DD.md` daily logs and the incremental [`MemoryFlusher`];
//!   [`consolidate`]: the validated, throttled [`Consolidator`] into `MEMORY.md`. File access
//!   goes through [`MemoryFiles`].
//!
//! Depend on it from the harness, or to run the conformance suite on another
//! [`SearchIndex`]. Applications use the `hame` facade.
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sqlite` | yes | [`SqliteIndex`] (rusqlite, bundled SQLite with FTS5) |
//! | `postgres` | no | `PgIndex`: PostgreSQL `tsvector` + GIN, `ts_rank_cd`, `ts_headline`, `pg_trgm` for CJK (sqlx) |
//! | `tiktoken` | yes | `TiktokenCounter`: exact o200k / cl100k counts (tiktoken-rs) |
//! | `conformance` | no | [`index::conformance`], the `SearchIndex` suite for other backends |
//!
//! Limits and defaults are listed in `docs/memory.md`.
//!
//! ```
//! use std::sync::Arc;
//! use hame_memory::{InMemoryIndex, SearchIndex, SearchOptions, compaction, tokens};
//! use hame_core::Message;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), hame_memory::Error> {
//! // Search: the index is a cache of the files, scoped by tenant.
//! let index: Arc<dyn SearchIndex> = Arc::new(InMemoryIndex::new());
//! index.upsert_document("alice", "memory/2026-03-14.md", "- Prefers Rust\n- 喜欢喝咖啡\n").await?;
//! let hits = index.search("alice", "rust", &SearchOptions::default()).await?;
//! assert_eq!((hits[0].path.as_str(), hits[0].line), ("memory/2026-03-14.md", 1));
//! assert_eq!(index.search("alice", "咖啡", &SearchOptions::default()).await?[0].line, 2);
//! assert!(index.search("bob", "rust", &SearchOptions::default()).await?.is_empty());
//!
//! // Compaction planning is pure.
//! let messages: Vec<Message> = (0..210)
//!     .map(|i| if i % 2 == 0 { Message::user(format!("q{i}")) } else { Message::assistant("a") })
//!     .collect();
//! let counter = tokens::counter_for_model("gpt-4o");
//! let plan = compaction::plan_compaction(&messages, &Default::default(), counter.as_ref())
//!     .expect("210 messages exceed the default backstop of 200");
//! assert_eq!(plan.range, 0..190); // the 20 most recent messages stay verbatim
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod compaction;
pub mod consolidate;
pub mod daily;
mod error;
pub mod index;
pub mod ledger;
pub mod offload;
#[cfg(test)]
mod test_support;
pub mod tokens;

pub use compaction::{
    BeforeCompaction, COMPACT_NOW_EXTRA, CompactionDraft, CompactionLayer, CompactionPlan,
    CompactionPolicy, CompactionReport, CompactionState, Compactor, CompactorConfig, FactsPlan,
    FactsRequest, SeqSpan, apply, plan_compaction, plan_forced,
};
pub use consolidate::{ConsolidationOptions, ConsolidationOutcome, Consolidator, ThrottlePolicy};
pub use daily::{
    FlushOptions, FlushReport, InMemoryFiles, MemoryFiles, MemoryFlusher, MemoryState,
};
pub use error::{Error, Result};
#[cfg(feature = "sqlite")]
pub use index::SqliteIndex;
pub use index::{
    Document, DocumentInfo, Hit, InMemoryIndex, SearchIndex, SearchOptions, UpsertOutcome,
    content_hash,
};
#[cfg(feature = "postgres")]
pub use index::{PgIndex, PgIndexOptions};
pub use ledger::TokenLedger;
pub use offload::{OffloadPolicy, Offloader, ResultSink};
#[cfg(feature = "tiktoken")]
pub use tokens::{Encoding, TiktokenCounter};
pub use tokens::{EstimateCounter, TokenCounter, counter_for_model};
