//! # hame-tools
//!
//! The bridge between storage (`hame-fs`) and the agent core (`hame-core`):
//!
//! - [`Workspace`], the **one tenant workspace handle**: the caller's identity, the files its
//!   tools see, where its runtime records live, its per-user override folder and, when the
//!   mode has one, its shell. The harness puts one in every call's
//!   [`Extensions`](hame_core::Extensions); every tool ([`WorkspaceExt::workspace`] on a
//!   [`ToolContext`](hame_core::ToolContext)) and every layer (`cx.extensions`) reaches the
//!   caller's data through it, and through nothing else.
//!
//! Depend on it to write a tool that reads or writes the caller's files.
//!
//! ```
//! use std::sync::Arc;
//! use hame_core::{Extensions, RuntimeContext, ToolContext};
//! use hame_fs::InMemoryFs;
//! use hame_tools::{Identity, Workspace, WorkspaceExt, WorkspaceMode};
//!
//! let files = Arc::new(InMemoryFs::new());
//! let ws = Workspace::new(Identity::new("hame", Some("alice"), "s1"), WorkspaceMode::TrustedLocal, files.clone(), files);
//! let mut ext = Extensions::new();
//! ext.insert(ws);
//! let ctx = ToolContext::new(RuntimeContext::new("s1"), "call-1").with_extensions(ext);
//! assert_eq!(ctx.workspace().map(|w| w.identity().user.clone()).ok().flatten().as_deref(), Some("alice"));
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod workspace;

pub use workspace::{Identity, Workspace, WorkspaceExt, WorkspaceMode};
