//! # hame-sandbox
//!
//! The sandbox of the hame agent harness: tools run in a locked-down container per
//! isolation scope, the host workspace's static assets are projected in, and the state of
//! `/workspace` survives calls, processes and lost containers through incremental
//! snapshots.
//!
//! A scope's sandbox ([`ScopeSandbox`]) is a `hame_fs::Filesystem` rooted at `/workspace`
//! in the container plus a `hame_fs::Execute` that runs commands there (deepagents'
//! lesson: a sandbox needs only exec, upload and download; file access is derived from
//! them). It passes the `hame-fs` conformance suite against a real engine.
//!
//! Depend on it through the `hame` facade (feature `sandbox`); the harness uses the
//! backend-free [`Sandboxes`] contract, and the CLI makes a [`DockerSandboxes`].
//!
//! | feature | what it adds |
//! |---|---|
//! | `docker` | [`DockerSandboxes`] through bollard (no docker CLI), the offline image build |
//!
//! Defaults (all in `docs/sandbox.md`): no network, 2 GiB memory, 1 CPU, 256 processes,
//! read-only root filesystem with tmpfs `/workspace` (1 GiB) and `/tmp` (256 MiB), every
//! capability dropped, `no-new-privileges`, uid 1000, no host mount, no host environment;
//! the last 3 snapshots kept per scope, unreferenced blobs swept from the store (ADR 0025).
//!
//! ```no_run
//! # #[cfg(feature = "docker")]
//! # async fn demo() -> hame_sandbox::Result<()> {
//! use std::sync::Arc;
//! use hame_fs::{ExecRequest, Execute, LocalFs};
//! use hame_sandbox::{DockerOptions, DockerSandboxes, Sandboxes};
//!
//! let snapshots = Arc::new(LocalFs::new("/tmp/snapshots").map_err(hame_sandbox::Error::from)?);
//! let sandboxes = DockerSandboxes::connect(DockerOptions::default(), snapshots).await?;
//! sandboxes.ensure_image().await?;
//! let sandbox = sandboxes.scope("agents/hame/users/alice/home");
//! sandbox.begin(Vec::new()).await?; // start (or reuse), restore, project
//! let out = sandbox.execute(ExecRequest { command: "echo hi > a; cat a".into(), timeout: None }).await?;
//! assert_eq!(out.output, "hi\n");
//! sandbox.end().await?; // snapshot what changed
//! sandboxes.shutdown().await;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod api;
#[cfg(feature = "docker")]
mod docker;
mod error;
pub mod plan;

pub use api::{
    Asset, BeginReport, PROJECTION_ROOTS, SANDBOX_WORKSPACE, Sandboxes, ScopeSandbox,
    SnapshotReport, is_projected,
};
#[cfg(feature = "docker")]
pub use docker::{
    BUSYBOX_CANDIDATES, DEFAULT_IMAGE, DockerOptions, DockerSandboxes, DockerScope, LABEL,
    OWNER_LABEL, SANDBOX_USER, SCOPE_LABEL, find_busybox,
};
pub use error::{Error, Result};
