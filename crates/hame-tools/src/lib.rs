//! # hame-tools
//!
//! The bridge between storage and the agent core: the file tools the model calls
//! (`read_file`, `write_file`, `edit_file`, `grep_files`, `glob_files`, `list_files`) and the
//! `execute` tool, built over a [`hame_fs::Filesystem`] (and an [`hame_fs::Execute`]
//! capability). It is the only crate that knows both `hame-core` (tools, tool errors,
//! runtime contexts) and `hame-fs` (storage), so the storage crates stand alone.
//!
//! Depend on it to give an agent file tools; depend on `hame-fs` alone to write a storage
//! backend or to use the filesystem without an agent.
//!
//! | item | what it is |
//! |---|---|
//! | [`fs_tools`], [`fs_tools_with_execute`], [`FsToolOptions`] | the tools and their limits |
//! | [`ToToolError`] | `hame_fs::Error` → `hame_core::ToolError`, keeping the stable code |
//! | [`NamespaceExt::for_context`], [`IsolationExt::fs_for_context`] | tenant isolation keyed by a [`hame_core::RuntimeContext`] |
//!
//! This crate has no features.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use hame_core::{CancellationToken, RuntimeContext, ToolContext};
//! use hame_fs::{Filesystem, InMemoryFs};
//! use hame_tools::{FsToolOptions, fs_tools};
//!
//! let fs: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
//! let tools = fs_tools(fs, FsToolOptions::default());
//! let write = tools.iter().find(|t| t.spec().name == "write_file").ok_or("no write_file")?;
//! let ctx = ToolContext {
//!     runtime: RuntimeContext::new("s1"),
//!     call_id: "c1".into(),
//!     cancel: CancellationToken::new(),
//! };
//! let out = write
//!     .call(serde_json::json!({"file_path": "/notes.md", "content": "hi"}), &ctx)
//!     .await?;
//! assert_eq!(out, "Wrote 2 bytes to /notes.md.");
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod context;
mod error;
mod tools;

pub use context::{IsolationExt, NamespaceExt};
pub use error::ToToolError;
pub use tools::{FsToolOptions, fs_tools, fs_tools_with_execute};
