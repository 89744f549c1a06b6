//! # hame-tools
//!
//! The bridge between storage (`hame-fs`) and the agent core (`hame-core`); the only crate
//! that knows both, so the storage crates stand alone.
//!
//! - [`Workspace`], the **one tenant workspace handle**: the caller's identity, the files its
//!   tools see, where its runtime records live, its per-user override folder and, when the
//!   mode has one, its shell. The harness puts one in every call's
//!   [`Extensions`](hame_core::Extensions); every tool ([`WorkspaceExt::workspace`] on a
//!   [`ToolContext`](hame_core::ToolContext)) and every layer (`cx.extensions`) reaches the
//!   caller's data through it, and through nothing else.
//! - The file tools the model calls (`read_file`, `write_file`, `edit_file`, `grep_files`,
//!   `glob_files`, `list_files`) and `execute`: [`workspace_tools`] over the caller's handle
//!   (what the harness registers), or [`fs_tools`] over one filesystem for standalone use.
//! - [`ToToolError`]: `hame_fs::Error` → `hame_core::ToolError`, keeping the stable code.
//!
//! Depend on it to write a tool that reads or writes the caller's files. This crate has no
//! features.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use hame_core::{Extensions, RuntimeContext, ToolContext};
//! use hame_fs::{Filesystem, InMemoryFs};
//! use hame_tools::{FsToolOptions, Identity, Workspace, WorkspaceExt, WorkspaceMode, workspace_tools};
//!
//! let files: Arc<dyn Filesystem> = Arc::new(InMemoryFs::new());
//! let ws = Workspace::new(Identity::new("hame", Some("alice"), "s1"), WorkspaceMode::TrustedLocal, files.clone(), files);
//! let mut ext = Extensions::new();
//! ext.insert(ws);
//! let ctx = ToolContext::new(RuntimeContext::new("s1"), "call-1").with_extensions(ext);
//! assert_eq!(ctx.workspace()?.identity().user.as_deref(), Some("alice"));
//!
//! let tools = workspace_tools(FsToolOptions::default(), false);
//! let write = tools.iter().find(|t| t.spec().name == "write_file").ok_or("no write_file")?;
//! let out = write
//!     .call(serde_json::json!({"file_path": "/notes.md", "content": "hi"}), &ctx)
//!     .await?;
//! assert_eq!(out, "Wrote 2 bytes to /notes.md.");
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod error;
pub mod front_matter;
pub mod memo;
pub mod snapshot;
mod tools;
mod workspace;

pub use error::ToToolError;
pub use tools::{FsToolOptions, fs_tools, fs_tools_with_execute, workspace_tools};
pub use workspace::{Identity, Workspace, WorkspaceExt, WorkspaceMode};
