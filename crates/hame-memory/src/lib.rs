//! # hame-memory
//!
//! WIP
#![deny(missing_docs)]

mod error;
pub mod index;
pub mod tokens;

pub use error::{Error, Result};
#[cfg(feature = "sqlite")]
pub use index::SqliteIndex;
pub use index::{
    DocumentInfo, Hit, InMemoryIndex, SearchIndex, SearchOptions, UpsertOutcome, content_hash,
};
pub use tokens::{EstimateCounter, TokenCounter, counter_for_model};
pub mod compaction;
pub mod offload;
pub mod daily;
pub mod consolidate;
