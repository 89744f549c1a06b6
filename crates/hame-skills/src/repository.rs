//! Skill repositories: skills from outside the workspace (ADR 0030).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hame_fs::Filesystem;

use crate::Result;

/// Default time a repository's snapshot is used before it is fetched again.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(300);

/// One version of a repository's skills.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The skills: `<name>/SKILL.md` at the root, their resources beside it. Read-only by
    /// convention (nothing writes it).
    pub files: Arc<dyn Filesystem>,
    /// The version: a Git commit id, a digest of a table's rows.
    pub version: String,
}

/// A source of skills beside the workspace layers: a Git repository, a SQL table.
///
/// # Contract
///
/// - [`fetch`](Self::fetch) returns the repository's current skills as a tree with
///   `<name>/SKILL.md` at its root (what `skills/` of a workspace holds) and a version that
///   names exactly that content: the same version means the same files.
/// - It may take time (a network fetch); the caller ([`crate::Skills`]) calls it at most
///   once per refresh interval per repository and keeps using the last snapshot when it
///   fails.
/// - Errors are one line saying what to check; they never carry a password.
#[async_trait]
pub trait SkillRepository: Send + Sync + std::fmt::Debug + 'static {
    /// What `hame skills list` and the log show as the source: `git <url>@<ref>`,
    /// `sql <url> table <table>` (no password).
    fn label(&self) -> String;

    /// The current skills and their version.
    async fn fetch(&self) -> Result<Snapshot>;
}

#[async_trait]
impl<T: SkillRepository + ?Sized> SkillRepository for Arc<T> {
    fn label(&self) -> String {
        (**self).label()
    }

    async fn fetch(&self) -> Result<Snapshot> {
        (**self).fetch().await
    }
}

#[async_trait]
impl<T: SkillRepository + ?Sized> SkillRepository for Box<T> {
    fn label(&self) -> String {
        (**self).label()
    }

    async fn fetch(&self) -> Result<Snapshot> {
        (**self).fetch().await
    }
}

/// A repository with its last snapshot, fetched again after the refresh interval.
#[derive(Debug)]
pub(crate) struct Cached {
    pub(crate) repo: Arc<dyn SkillRepository>,
    pub(crate) label: String,
    refresh: Duration,
    last: tokio::sync::Mutex<Option<(Instant, Snapshot)>>,
}

/// What [`Cached::current`] got.
pub(crate) struct Current {
    /// The snapshot to use (the last good one when a refresh failed).
    pub(crate) snapshot: Option<Snapshot>,
    /// The error of a fetch made now.
    pub(crate) error: Option<String>,
}

impl Cached {
    pub(crate) fn new(repo: Arc<dyn SkillRepository>, refresh: Duration) -> Self {
        Self {
            label: repo.label(),
            repo,
            refresh,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// The snapshot, fetched when there is none or it is older than the interval. A
    /// failed fetch keeps the last snapshot (and is tried again at the next call after
    /// the interval).
    pub(crate) async fn current(&self) -> Current {
        let mut last = self.last.lock().await;
        if let Some((at, snap)) = last.as_ref()
            && at.elapsed() < self.refresh
        {
            return Current {
                snapshot: Some(snap.clone()),
                error: None,
            };
        }
        match self.repo.fetch().await {
            Ok(snap) => {
                if last.as_ref().is_none_or(|(_, s)| s.version != snap.version) {
                    tracing::info!(repository = %self.label, version = %snap.version, "skill repository fetched");
                }
                *last = Some((Instant::now(), snap.clone()));
                Current {
                    snapshot: Some(snap),
                    error: None,
                }
            }
            Err(e) => {
                let error = e.to_string();
                let snapshot = match last.as_mut() {
                    Some((at, snap)) => {
                        // Try again after another interval, not at every step.
                        *at = Instant::now();
                        Some(snap.clone())
                    }
                    None => None,
                };
                Current {
                    snapshot,
                    error: Some(error),
                }
            }
        }
    }
}
