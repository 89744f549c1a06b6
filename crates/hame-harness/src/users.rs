//! [`UserRegistry`]: the explicit set of user ids whose `<userId>/` folder of the workspace
//! is that user's own (ADR 0022, `docs/filesystem.md`).
//!
//! A top-level folder is a user's folder exactly when its name is a registered user id:
//!
//! * every user id hame serves a call for is registered before the call touches a file
//!   (one empty-ish file `agents/.users/<userId>` in the tenancy's store, written once);
//! * ids the application declares (`HarnessAgentBuilder::users`, `users` in `hame.toml`)
//!   count as registered in that process;
//! * once per workspace, the first process that finds no `agents/.users/.v1` migrates: if
//!   the workspace was used by an earlier hame (its store holds `agents/`, or a top-level
//!   folder holds `agents/`), every top-level folder that holds one of
//!   [the old marker names](crate::guard::USER_FOLDER_MARKERS) is registered, so those
//!   folders stay private; then `.v1` is written.
//!
//! Nothing is inferred after that: a folder whose name is not a registered id is an
//! ordinary project folder, whatever it holds. `agents/` is hidden from or read-only for
//! every caller's file tools, and agent ids never start with `.`, so no tenant's namespace
//! reaches `agents/.users/`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use hame_fs::{Error, Filesystem, FsPath, Result, WriteOptions};

use crate::guard::USER_FOLDER_MARKERS;

/// Where the registry lives in the tenancy's store.
pub const USERS_DIR: &str = "agents/.users";
/// The file that says the one-time migration from marker files is done.
pub const MIGRATED_MARK: &str = ".v1";

/// The registered user ids of one workspace (see the [module docs](self)).
#[derive(Debug)]
pub struct UserRegistry {
    store: Arc<dyn Filesystem>,
    workspace: Arc<dyn Filesystem>,
    declared: BTreeSet<String>,
    /// Ids this process registered or saw registered (never written again).
    known: Mutex<BTreeSet<String>>,
    /// Whether this process saw the migration mark.
    migrated: std::sync::atomic::AtomicBool,
}

impl UserRegistry {
    /// The registry kept in `store` (the tenancy's store: the workspace in the local modes,
    /// the shared store in store mode); `workspace` is scanned by the migration.
    pub fn new(store: Arc<dyn Filesystem>, workspace: Arc<dyn Filesystem>) -> Self {
        Self {
            store,
            workspace,
            declared: BTreeSet::new(),
            known: Mutex::new(BTreeSet::new()),
            migrated: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Adds ids the application declares (users whose folders exist before their first
    /// call).
    pub fn with_declared(mut self, users: impl IntoIterator<Item = String>) -> Self {
        self.declared.extend(users);
        self
    }

    fn dir() -> Result<FsPath> {
        FsPath::parse(USERS_DIR)
    }

    /// The registered ids: one `list` of the registry (after the one-time migration, when
    /// it has not run), plus the declared ones. A view reads it once per call.
    pub async fn users(&self) -> Result<BTreeSet<String>> {
        let dir = Self::dir()?;
        let mut names: BTreeSet<String> = match self.store.list(&dir).await {
            Ok(entries) => entries
                .into_iter()
                .filter(|e| !e.is_dir())
                .map(|e| e.path.file_name().to_owned())
                .collect(),
            Err(Error::NotFound { .. }) => BTreeSet::new(),
            Err(e) => return Err(e),
        };
        let migrated = names.remove(MIGRATED_MARK);
        if !migrated && !self.migrated.load(std::sync::atomic::Ordering::Relaxed) {
            for u in self.migrate().await? {
                names.insert(u);
            }
        }
        self.migrated
            .store(true, std::sync::atomic::Ordering::Relaxed);
        names.extend(self.declared.iter().cloned());
        if let Ok(mut known) = self.known.lock() {
            known.extend(names.iter().cloned());
        }
        Ok(names)
    }

    /// Registers `user` (a validated id) durably, once per process; the registry is read
    /// (and migrated) first, so a workspace's first call cannot skip the migration.
    pub async fn register(&self, user: &str) -> Result<()> {
        if self.known.lock().is_ok_and(|k| k.contains(user)) {
            return Ok(());
        }
        if self.users().await?.contains(user) {
            return Ok(());
        }
        self.write_id(user).await?;
        if let Ok(mut known) = self.known.lock() {
            known.insert(user.to_owned());
        }
        tracing::info!(
            user,
            "registered a user id: its top-level folder is its own"
        );
        Ok(())
    }

    async fn write_id(&self, name: &str) -> Result<()> {
        let path = Self::dir()?.join(name)?;
        let stamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        match self
            .store
            .write(&path, stamp.into_bytes(), WriteOptions::create_new())
            .await
        {
            Ok(_) | Err(Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The one-time migration (see the [module docs](self)); returns the ids it registered.
    async fn migrate(&self) -> Result<Vec<String>> {
        let mut found = Vec::new();
        let top = match self.workspace.list(&FsPath::root()).await {
            Ok(t) => t,
            Err(Error::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(e),
        };
        let agents = FsPath::parse("agents")?;
        let mut used = self.store.exists(&agents).await?;
        for entry in top.iter().filter(|e| e.is_dir()) {
            let name = entry.path.file_name();
            if crate::guard::is_workspace_name(name) || hame_id::validate("user id", name).is_err()
            {
                continue;
            }
            let mut holds = Vec::new();
            for marker in USER_FOLDER_MARKERS {
                if self.workspace.exists(&entry.path.join(marker)?).await? {
                    holds.push(*marker);
                }
            }
            used |= holds.contains(&"agents");
            if !holds.is_empty() {
                found.push(name.to_owned());
            }
        }
        if !used {
            found.clear();
        }
        for name in &found {
            self.write_id(name).await?;
        }
        self.write_id(MIGRATED_MARK).await?;
        if !found.is_empty() {
            tracing::info!(users = ?found, "registered the user folders of an earlier hame (one-time migration)");
        }
        Ok(found)
    }
}

#[cfg(test)]
#[path = "users_tests.rs"]
mod tests;
