//! # hame-fs
//!
//! The pluggable filesystem of the hame agent harness: one async [`Filesystem`] trait with a
//! `# Contract`, backends (local disk, memory), wrappers (prefix, read-only, composite,
//! overlay), tenant isolation ([`Namespace`]) and the [`Execute`] capability (`LocalShell`
//! with the `local` feature).
//!
//! Depend on it to give a program or an agent files, or to write a storage backend (run
//! [`conformance::run_all`] from its tests). It knows nothing of agents: no `hame-core`
//! types appear here (a `deps` rule of `cargo xtask ci` keeps it so). The file tools the
//! model calls, and the conversion of [`Error`] into a tool error, live in `hame-tools`.
//!
//! The trait has six required methods (what a backend must store and return) and seven
//! specialisable ones with correct generic fallbacks ([`generic`]); conveniences (`read` a
//! line window, `upload`, `download`) are in the blanket [`FilesystemExt`]. Wrappers
//! implement the trait with [`forward_filesystem!`], which does not compile while a method
//! is neither forwarded nor overridden.
//!
//! | feature | what it adds |
//! |---|---|
//! | `local` (default) | `LocalFs` (a `cap-std` directory capability) and `LocalShell` (`execute`) |
//! | `conformance` | the [`conformance`] suite, for backends in other crates |
//!
//! ```
//! # async fn demo() -> hame_fs::Result<()> {
//! use hame_fs::{
//!     AppendOptions, Filesystem, FilesystemExt, FsPath, InMemoryFs, ReadWindow, WriteOptions,
//! };
//! let fs = InMemoryFs::new();
//! let path = FsPath::parse("/notes/today.md")?;
//! fs.write(&path, b"# Today\n".to_vec(), WriteOptions::default()).await?;
//! fs.append(&path, b"- shipped\n".to_vec(), AppendOptions::default()).await?;
//! assert_eq!(fs.read_bytes(&path).await?, b"# Today\n- shipped\n");
//! let second = ReadWindow { offset: 1, limit: Some(1) };
//! assert_eq!(fs.read(&path, second).await?.text, "- shipped\n");
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo()).unwrap();
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod counting;
mod error;
mod forward;
mod fs;
pub mod generic;
#[cfg(feature = "local")]
mod local;
mod memory;
mod namespace;
mod output;
mod path;
#[cfg(feature = "local")]
mod shell;
mod wrappers;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use counting::{CountingFs, FsCounts};
pub use error::{Error, Result, codes};
#[doc(hidden)]
pub use forward::__private;
pub use fs::{
    AppendOptions, BINARY_SNIFF_BYTES, DEFAULT_READ_LINES, DOWNLOAD_CONCURRENCY, DeleteOptions,
    Durability, EditOutcome, EditRequest, ExecOutput, ExecRequest, Execute, FileInfo, FileKind,
    Filesystem, FilesystemExt, GREP_MAX_FILE_BYTES, GlobOutput, GlobRequest, GrepMatch, GrepOutput,
    GrepRequest, Links, ListRequest, Listing, ReadWindow, RenameOptions, TextWindow, Version,
    WriteMode, WriteOptions,
};
#[cfg(feature = "local")]
pub use local::{INLINE_READ_MAX, LocalFs, LocalFsOptions};
pub use memory::InMemoryFs;
pub use namespace::{Isolation, MAX_ID_BYTES, Namespace, Scope, tenant_fs, validate_id};
pub use output::{CappedOutput, render_output};
pub use path::{FsPath, MAX_DEPTH, MAX_PATH_BYTES, MAX_SEGMENT_BYTES, NameCase, pattern_key};
#[cfg(feature = "local")]
pub use shell::{LocalShell, ShellOptions};
pub use wrappers::{CompositeFs, OverlayFs, PrefixFs, ReadOnlyFs};
