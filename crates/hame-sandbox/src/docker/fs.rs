//! [`DockerScope`] as a [`Filesystem`], an [`Execute`] and a [`ScopeSandbox`]: every file
//! operation is one process in the container (busybox `sh`, `stat`, `find`, `cat`, `mv`)
//! on `/workspace`; the specialisable methods use the generic fallbacks except `append`.

use std::sync::atomic::Ordering;
use std::time::Instant;

use async_trait::async_trait;
use hame_fs::{
    DeleteOptions, ExecOutput, ExecRequest, Execute, FileInfo, Filesystem, FsPath, RenameOptions,
    Version, WriteMode, WriteOptions,
};

use super::{DockerScope, Got, scripts, state};
use crate::api::{Asset, BeginReport, SANDBOX_WORKSPACE, ScopeSandbox, SnapshotReport};
use crate::error::Result;

/// Largest file `read_bytes` returns (the `/workspace` tmpfs is 1 GiB by default).
const READ_CAP: usize = 1 << 30;

fn abs(path: &FsPath) -> String {
    if path.is_root() {
        SANDBOX_WORKSPACE.to_owned()
    } else {
        format!("{SANDBOX_WORKSPACE}/{}", path.as_str())
    }
}

fn mtime(secs: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(secs.parse().ok()?, 0)
}

impl DockerScope {
    /// Runs one filesystem operation; maps its exit code to a `hame_fs` error naming
    /// `path` (or `other`, the destination of a move, for the codes about it).
    async fn op(
        &self,
        args: &[&str],
        stdin: Option<Vec<u8>>,
        path: &FsPath,
        other: Option<&FsPath>,
    ) -> hame_fs::Result<Vec<u8>> {
        let (live, _) = self.live(false).await?;
        let raw = self
            .shared
            .script(&live.id, scripts::FS_OPS, args, stdin, READ_CAP)
            .await?;
        self.slot.touch();
        let named = |p: &FsPath| p.to_string();
        let dest = other.unwrap_or(path);
        let stderr = String::from_utf8_lossy(&raw.stderr.kept).trim().to_owned();
        Err(match raw.exit {
            Some(0) => return Ok(raw.stdout.kept),
            Some(scripts::NOT_FOUND) => hame_fs::Error::NotFound { path: named(path) },
            Some(scripts::IS_DIR) => hame_fs::Error::IsDirectory { path: named(dest) },
            Some(scripts::NOT_DIR) => hame_fs::Error::NotADirectory { path: named(dest) },
            Some(scripts::EXISTS) => hame_fs::Error::AlreadyExists { path: named(dest) },
            Some(scripts::CONFLICT) => hame_fs::Error::Conflict {
                path: named(path),
                reason: "the content is not the version given".into(),
            },
            Some(scripts::DENIED) => hame_fs::Error::PermissionDenied {
                path: named(path),
                reason: if stderr.is_empty() {
                    "refused in the sandbox".into()
                } else {
                    stderr
                },
            },
            Some(scripts::INVALID) => {
                hame_fs::Error::invalid_argument(format!("cannot move {path} into itself ({dest})"))
            }
            code => hame_fs::Error::Backend {
                message: format!("sandbox file operation failed (exit {code:?}): {stderr}"),
                source: None,
            },
        })
    }
}

#[async_trait]
impl Filesystem for DockerScope {
    async fn stat(&self, path: &FsPath) -> hame_fs::Result<FileInfo> {
        let out = self.op(&["stat", &abs(path)], None, path, None).await?;
        let text = String::from_utf8_lossy(&out);
        let mut parts = text.split_whitespace();
        let (kind, size, time) = (parts.next(), parts.next(), parts.next());
        let mut info = match kind {
            Some("d") => FileInfo::dir(path.clone()),
            _ => FileInfo::file(path.clone(), size.and_then(|s| s.parse().ok()).unwrap_or(0)),
        };
        info.modified = time.and_then(mtime);
        Ok(info)
    }

    async fn list(&self, path: &FsPath) -> hame_fs::Result<Vec<FileInfo>> {
        let base = abs(path);
        let out = self.op(&["list", &base], None, path, None).await?;
        let prefix = format!("{base}/");
        let mut entries = Vec::new();
        for line in String::from_utf8_lossy(&out).lines() {
            let mut parts = line.splitn(4, '|');
            let (Some(kind), Some(size), Some(time), Some(name)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let Some(name) = name.strip_prefix(&prefix) else {
                continue;
            };
            if name.starts_with(".hame-tmp-") {
                continue;
            }
            let Ok(child) = path.join(name) else {
                continue;
            };
            let mut info = match kind {
                "directory" => FileInfo::dir(child),
                k if k.starts_with("regular") => FileInfo::file(child, size.parse().unwrap_or(0)),
                _ => continue,
            };
            info.modified = mtime(time);
            entries.push(info);
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(entries)
    }

    async fn read_bytes(&self, path: &FsPath) -> hame_fs::Result<Vec<u8>> {
        self.op(&["read", &abs(path)], None, path, None).await
    }

    async fn write(
        &self,
        path: &FsPath,
        data: Vec<u8>,
        options: WriteOptions,
    ) -> hame_fs::Result<Version> {
        let version = Version::of(&data);
        let target = abs(path);
        let (mode, expected) = match &options.mode {
            WriteMode::Overwrite => ("o", String::new()),
            WriteMode::CreateNew => ("c", String::new()),
            WriteMode::IfMatch(v) => ("m", v.as_str().to_owned()),
        };
        self.op(&["write", &target, mode, &expected], Some(data), path, None)
            .await?;
        Ok(version)
    }

    async fn delete(&self, path: &FsPath, options: DeleteOptions) -> hame_fs::Result<()> {
        let recursive = if options.recursive { "1" } else { "0" };
        self.op(&["delete", &abs(path), recursive], None, path, None)
            .await
            .map(|_| ())
    }

    async fn rename(
        &self,
        from: &FsPath,
        to: &FsPath,
        options: RenameOptions,
    ) -> hame_fs::Result<()> {
        if hame_fs::generic::rename_is_noop(self, from, to).await? {
            return Ok(());
        }
        let overwrite = if options.overwrite { "1" } else { "0" };
        self.op(
            &["rename", &abs(from), &abs(to), overwrite],
            None,
            from,
            Some(to),
        )
        .await
        .map(|_| ())
    }

    async fn append(
        &self,
        path: &FsPath,
        data: Vec<u8>,
        _: hame_fs::AppendOptions,
    ) -> hame_fs::Result<()> {
        self.op(&["append", &abs(path)], Some(data), path, None)
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl Execute for DockerScope {
    async fn execute(&self, request: ExecRequest) -> hame_fs::Result<ExecOutput> {
        let options = &self.shared.options;
        let timeout = request
            .timeout
            .unwrap_or(options.default_timeout)
            .min(options.max_timeout);
        let (live, _) = self.live(false).await?;
        let out = self
            .shared
            .execute(&live.id, &request.command, timeout)
            .await?;
        self.slot.touch();
        Ok(out)
    }
}

#[async_trait]
impl ScopeSandbox for DockerScope {
    fn key(&self) -> &str {
        &self.slot.key
    }

    async fn begin(&self, assets: Vec<Asset>) -> Result<BeginReport> {
        let began = Instant::now();
        self.slot.active.fetch_add(1, Ordering::SeqCst);
        let result = async {
            let (live, got) = self.live(true).await?;
            let (started, restored_files, refreshed) = match got {
                Got::Started {
                    restored,
                    refreshed,
                } => (true, restored, refreshed),
                Got::Warm | Got::Adopted => (false, 0, false),
            };
            let (projected, unprojected) =
                state::project(&self.shared, &live, assets, started).await?;
            Ok(BeginReport {
                started,
                adopted: got == Got::Adopted,
                refreshed,
                restored_files,
                projected,
                unprojected,
                elapsed: began.elapsed(),
            })
        }
        .await;
        if result.is_err() {
            self.slot.active.fetch_sub(1, Ordering::SeqCst);
        }
        result
    }

    async fn end(&self) -> Result<SnapshotReport> {
        let result = async {
            let live = self.slot.live.lock().await.clone();
            match live {
                Some(live) => state::snapshot(&self.shared, &self.slot.key, &live).await,
                None => Ok(SnapshotReport::default()),
            }
        }
        .await;
        if result.as_ref().is_ok_and(|r| r.stored) {
            self.shared.sweep_if_due();
        }
        let _ = self
            .slot
            .active
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        self.slot.touch();
        result
    }

    async fn discard(&self) {
        if let Some(live) = self.slot.live.lock().await.take() {
            self.shared.remove(&live.id).await;
        }
        let _ = self
            .slot
            .active
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        self.slot.touch();
    }
}
