//! Snapshots, restores and projections of a container's `/workspace`.
//!
//! Store layout (any `hame_fs::Filesystem`: a directory, S3, Redis):
//! `blobs/<2 hex>/<sha256>` (content-addressed, shared by every scope, written once) and
//! `scopes/<scope key>/manifest.json` (path → hash, size, mode, time).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use hame_fs::{Filesystem, FilesystemExt, FsPath, WriteOptions};
use sha2::Digest;

use super::gc::{self, blob_path};
use super::{Live, Shared, scripts};
use crate::api::{Asset, SnapshotReport, is_projected};
use crate::error::{Error, Result};
use crate::plan::{
    Listed, MANIFEST_VERSION, Manifest, ManifestEntry, plan_projection, plan_snapshot,
};

/// Output kept from a listing or an archive (the workspace tmpfs is at most this big).
const BIG: usize = 4 << 30;
/// Files per `tar -c` process.
const FETCH_CHUNK: usize = 256;
/// Blob uploads in flight.
const UPLOADS: usize = 8;

fn sha256(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

fn snapshot_error(message: impl Into<String>) -> Error {
    Error::Snapshot {
        message: message.into(),
        source: None,
    }
}

pub(crate) fn manifest_path(key: &str) -> Result<FsPath> {
    FsPath::parse(&format!("scopes/{key}/manifest.json"))
        .map_err(|e| Error::Config(format!("invalid sandbox scope key {key:?}: {e}")))
}

/// The identity of a stored manifest: the SHA-256 of its bytes (empty: no snapshot yet).
/// Two processes that store the same files store the same identity; any other change of
/// the scope's snapshot changes it.
fn identity_of(bytes: &[u8]) -> String {
    sha256(bytes)
}

/// The scope's stored manifest and its identity.
pub(crate) async fn load_manifest(store: &dyn Filesystem, key: &str) -> Result<(Manifest, String)> {
    match store.read_bytes(&manifest_path(key)?).await {
        Ok(bytes) => {
            let manifest = serde_json::from_slice(&bytes)
                .map_err(|e| snapshot_error(format!("the manifest of {key} is not valid: {e}")))?;
            Ok((manifest, identity_of(&bytes)))
        }
        Err(e) if e.is_not_found() => Ok((Manifest::default(), String::new())),
        Err(e) => Err(e.into()),
    }
}

/// The identity of the scope's stored manifest (one read of the store).
pub(crate) async fn stored_identity(store: &dyn Filesystem, key: &str) -> Result<String> {
    match store.read_bytes(&manifest_path(key)?).await {
        Ok(bytes) => Ok(identity_of(&bytes)),
        Err(e) if e.is_not_found() => Ok(String::new()),
        Err(e) => Err(e.into()),
    }
}

/// What a container's state file says (see [`scripts::STATE_WRITE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContainerState {
    /// Its last call ended with its snapshot stored (else a call runs, or ran when its
    /// process died).
    pub(crate) idle: bool,
    /// The identity of the manifest of its last snapshot.
    pub(crate) identity: String,
    /// The process that uses it (`<pid>:<start time>`).
    pub(crate) owner: String,
    /// Seconds since the state was written.
    pub(crate) age_secs: u64,
}

/// Parses the output of [`scripts::STATE_READ`]: `None` when the container has no state
/// file (it never finished a call).
pub(crate) fn parse_state(text: &str) -> Option<ContainerState> {
    let mut lines = text.lines();
    if lines.next()? != "state" {
        return None;
    }
    let idle = lines.next()?.trim() == "idle";
    let identity = lines.next()?.trim().to_owned();
    let owner = lines.next()?.trim().to_owned();
    let age_secs = lines
        .next()?
        .trim()
        .parse::<i64>()
        .ok()?
        .max(0)
        .unsigned_abs();
    Some(ContainerState {
        idle,
        identity,
        owner,
        age_secs,
    })
}

/// Reads a container's state file: through a command server that stays in the pool when
/// `pooled` (a container about to be adopted), else as its own `docker exec` (no server is
/// left in a container that may not become ours).
pub(crate) async fn read_state(shared: &Shared, id: &str, pooled: bool) -> Option<ContainerState> {
    let raw = if pooled {
        shared
            .script(id, scripts::STATE_READ, &[], None, 4096)
            .await
    } else {
        shared
            .script_exec(id, scripts::STATE_READ, &[], None, 4096)
            .await
    };
    match raw {
        Ok(raw) if raw.exit == Some(0) => parse_state(&String::from_utf8_lossy(&raw.stdout.kept)),
        _ => None,
    }
}

/// Writes the container's state file: `idle` (a call ended with the snapshot of
/// `live`'s identity stored) or `busy` (a call begins; an adoption claims it).
pub(crate) async fn write_state(shared: &Shared, live: &Live, idle: bool) -> Result<()> {
    let identity = live.identity();
    let status = if idle { "idle" } else { "busy" };
    let raw = shared
        .script(
            &live.id,
            scripts::STATE_WRITE,
            &[status, identity.as_str(), shared.owner.as_str()],
            None,
            4096,
        )
        .await?;
    check(&raw, "writing the sandbox state file")
}

fn relative(path: &str) -> &str {
    path.strip_prefix("./").unwrap_or(path)
}

fn skipped(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with(".hame-tmp-") || FsPath::parse(path).map_or(true, |p| is_projected(&p))
}

fn check(raw: &super::exec::Raw, what: &str) -> Result<()> {
    match raw.exit {
        Some(0) => Ok(()),
        code => Err(Error::Backend {
            message: format!(
                "{what} failed (exit {code:?}): {}",
                String::from_utf8_lossy(&raw.stderr.kept).trim()
            ),
            source: None,
        }),
    }
}

/// Restores the scope's last snapshot into a fresh container; returns the file count.
pub(crate) async fn restore(shared: &Shared, key: &str, live: &Live) -> Result<usize> {
    // The container's first command server starts while the snapshot is read.
    let (prepared, ()) = tokio::join!(restore_archive(shared, key), shared.warm(&live.id));
    let (manifest, identity, archive) = prepared?;
    let count = manifest.files.len();
    if let Some(archive) = archive {
        let raw = shared
            .script(&live.id, scripts::RESTORE, &[], Some(archive), 64 << 10)
            .await?;
        check(&raw, "restoring the snapshot")?;
    }
    // Without a snapshot there is no marker yet: the first snapshot takes every file.
    *live.manifest.lock().await = manifest;
    live.set_identity(identity);
    Ok(count)
}

/// The last snapshot of `key`: its manifest, its identity and, when it has files, their
/// tar.
async fn restore_archive(
    shared: &Shared,
    key: &str,
) -> Result<(Manifest, String, Option<Vec<u8>>)> {
    let (manifest, identity) = load_manifest(shared.snapshots.as_ref(), key).await?;
    if manifest.files.is_empty() {
        return Ok((manifest, identity, None));
    }
    let paths: Vec<FsPath> = manifest
        .files
        .values()
        .map(|e| blob_path(&e.sha256))
        .collect::<Result<_>>()?;
    let blobs = shared.snapshots.download(&paths).await;
    let mut tar = tar::Builder::new(Vec::new());
    for ((path, entry), blob) in manifest.files.iter().zip(blobs) {
        let blob = match blob {
            // Moved aside by a sweep of the store at this moment (see `gc`).
            Err(e) if e.is_not_found() => {
                gc::read_blob(shared.snapshots.as_ref(), &entry.sha256).await
            }
            other => other.map_err(Error::from),
        };
        let bytes = blob.map_err(|e| {
            snapshot_error(format!(
                "the snapshot of {key} misses the content of {path}: {e}"
            ))
        })?;
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(entry.mode);
        h.set_mtime(entry.mtime);
        h.set_uid(1000);
        h.set_gid(1000);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, format!("./{path}"), bytes.as_slice())
            .map_err(|e| snapshot_error(format!("cannot pack {path}: {e}")))?;
    }
    let archive = tar
        .into_inner()
        .map_err(|e| snapshot_error(format!("cannot pack the snapshot: {e}")))?;
    Ok((manifest, identity, Some(archive)))
}

fn parse_listing(text: &str) -> Vec<Listed> {
    let mut listed = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(4, ' ');
        let (Some(size), Some(mode), Some(mtime), Some(path)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (Ok(size), Ok(mode), Ok(mtime)) = (
            size.parse::<u64>(),
            u32::from_str_radix(mode, 8),
            mtime.parse::<u64>(),
        ) else {
            continue;
        };
        listed.push(Listed {
            path: relative(path).to_owned(),
            size,
            mode,
            mtime,
        });
    }
    listed.retain(|l| !skipped(&l.path));
    listed
}

/// The `marker <seconds>` line of a snapshot listing: the time of the last snapshot's
/// marker.
fn parse_marker(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("marker "))
        .and_then(|t| t.trim().parse().ok())
}

/// The regular files of a tar archive: path (relative) → bytes; projected and temporary
/// files left out.
fn untar(bytes: &[u8], out: &mut BTreeMap<String, Vec<u8>>) -> Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    let bad = |e: std::io::Error| {
        snapshot_error(format!("cannot read the archive of changed files: {e}"))
    };
    let mut archive = tar::Archive::new(bytes);
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = entry
            .path()
            .map(|p| relative(&p.to_string_lossy()).to_owned())
            .map_err(bad)?;
        let mut data = Vec::new();
        entry.read_to_end(&mut data).map_err(bad)?;
        if !skipped(&path) {
            out.insert(path, data);
        }
    }
    Ok(())
}

/// Reads `paths` (relative to `/workspace`) out of the container: path → bytes. Files that
/// vanished since they were listed are absent.
async fn fetch(
    shared: &Shared,
    live: &Live,
    paths: &[String],
) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for chunk in paths.chunks(FETCH_CHUNK) {
        let args: Vec<String> = chunk.iter().map(|p| format!("./{p}")).collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let raw = shared
            .script_exec(
                &live.id,
                "cd /workspace && tar -cf - \"$@\"",
                &refs,
                None,
                BIG,
            )
            .await?;
        untar(&raw.stdout.kept, &mut out)?;
    }
    Ok(out)
}

/// Snapshots the container's `/workspace`: lists it, reads only what changed since the
/// last snapshot, uploads the blobs the store lacks and writes the new manifest; then
/// records the manifest's identity in the container's state file (the container is idle
/// and can be adopted by another process from now on).
pub(crate) async fn snapshot(shared: &Shared, key: &str, live: &Live) -> Result<SnapshotReport> {
    let report = snapshot_files(shared, key, live).await?;
    if let Err(e) = write_state(shared, live, true).await {
        // Not adoptable by another process then; nothing else depends on it.
        tracing::debug!(error = %e, "recording the sandbox's idle state failed");
    }
    Ok(report)
}

async fn snapshot_files(shared: &Shared, key: &str, live: &Live) -> Result<SnapshotReport> {
    let started = Instant::now();
    let mut manifest = live.manifest.lock().await;
    let raw = shared
        .script(&live.id, scripts::SNAPSHOT, &[], None, BIG)
        .await?;
    let text = String::from_utf8_lossy(&raw.stderr.kept);
    let listed = parse_listing(&text);
    let marker = parse_marker(&text);
    // The archive of what was modified since the marker; a failed `tar` (too many files
    // for one command line) leaves it to the fallback below.
    let mut fetched = BTreeMap::new();
    if raw.exit == Some(0) {
        untar(&raw.stdout.kept, &mut fetched)?;
    }
    // `-newer` sees whole seconds only: a file modified in the second of the last
    // snapshot (same size, same second) counts as touched too.
    let touched: BTreeSet<String> = fetched
        .keys()
        .cloned()
        .chain(
            listed
                .iter()
                .filter(|l| marker.is_some_and(|m| l.mtime >= m))
                .map(|l| l.path.clone()),
        )
        .collect();
    let plan = plan_snapshot(&manifest, &listed, &touched);
    let mut report = SnapshotReport {
        files: listed.len(),
        removed: plan.removed.len(),
        ..SnapshotReport::default()
    };
    if plan.fetch.is_empty() && plan.removed.is_empty() && manifest.version == MANIFEST_VERSION {
        report.elapsed = started.elapsed();
        return Ok(report);
    }
    // Changes the marker missed (a mode change, a failed archive) are read in a second step.
    let missing: Vec<String> = plan
        .fetch
        .iter()
        .filter(|p| !fetched.contains_key(*p))
        .cloned()
        .collect();
    if !missing.is_empty() {
        fetched.extend(fetch(shared, live, &missing).await?);
    }
    let by_path: BTreeMap<&str, &Listed> = listed.iter().map(|l| (l.path.as_str(), l)).collect();
    let mut next = manifest.clone();
    next.version = MANIFEST_VERSION;
    for p in &plan.removed {
        next.files.remove(p);
    }
    let mut uploads = Vec::new();
    for p in &plan.fetch {
        let (Some(bytes), Some(l)) = (fetched.get(p), by_path.get(p.as_str())) else {
            next.files.remove(p);
            continue;
        };
        let sha = sha256(bytes);
        if manifest.files.get(p).map(|e| &e.sha256) != Some(&sha) {
            uploads.push((sha.clone(), p.clone()));
        }
        next.files.insert(
            p.clone(),
            ManifestEntry {
                sha256: sha,
                size: l.size,
                mode: l.mode,
                mtime: l.mtime,
            },
        );
    }
    let json = serde_json::to_vec(&next)
        .map_err(|e| snapshot_error(format!("cannot encode the manifest: {e}")))?;
    let identity = identity_of(&json);
    // The new snapshot enters the scope's history before its blobs are looked for or
    // uploaded, so a sweep of the store running meanwhile sees what it references.
    let entry = gc::write_intent(shared.snapshots.as_ref(), key, &json, &identity).await?;
    let store = shared.snapshots.clone();
    let results: Vec<Result<u64>> = futures::stream::iter(uploads.into_iter().map(|(sha, p)| {
        let store = store.clone();
        let bytes = fetched.get(&p).cloned().unwrap_or_default();
        async move {
            let path = blob_path(&sha)?;
            if store.exists(&path).await? {
                return Ok(0);
            }
            let len = bytes.len() as u64;
            match store.write(&path, bytes, WriteOptions::default()).await {
                Ok(_) => Ok(len),
                // Written meanwhile by another process's snapshot, or put back by a sweep:
                // the path is the content's hash, so it is the same content.
                Err(hame_fs::Error::AlreadyExists { .. }) => Ok(0),
                Err(e) => Err(e.into()),
            }
        }
    }))
    .buffer_unordered(UPLOADS)
    .collect()
    .await;
    for r in results {
        let n = r?;
        if n > 0 {
            report.uploaded += 1;
            report.bytes_uploaded += n;
        }
    }
    shared
        .snapshots
        .write(&manifest_path(key)?, json, WriteOptions::default())
        .await?;
    *manifest = next;
    live.set_identity(identity);
    let keep = shared.options.keep_snapshots;
    match gc::prune_history(shared.snapshots.as_ref(), key, keep, &entry).await {
        Ok(n) => report.pruned = n,
        Err(e) => {
            tracing::warn!(scope = key, error = %e, "pruning the sandbox's snapshot history failed")
        }
    }
    report.stored = true;
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Projects the host's assets: uploads those whose hash differs from the sandbox's copy,
/// deletes projected files the host no longer has. Returns (uploaded, deleted).
pub(crate) async fn project(
    shared: &Shared,
    live: &Live,
    assets: Vec<Asset>,
    fresh: bool,
) -> Result<(usize, usize)> {
    // A container started now holds no projected file (snapshots leave them out).
    let sandbox: BTreeMap<String, String> = if fresh {
        BTreeMap::new()
    } else {
        let raw = shared
            .script(
                &live.id,
                scripts::PROJECTION_HASHES,
                &[shared.owner.as_str()],
                None,
                BIG,
            )
            .await?;
        check(&raw, "hashing the projected files")?;
        String::from_utf8_lossy(&raw.stdout.kept)
            .lines()
            .filter_map(|l| l.split_once("  "))
            .map(|(h, p)| (relative(p).to_owned(), h.to_owned()))
            .collect()
    };
    let assets: BTreeMap<String, Vec<u8>> = assets
        .into_iter()
        .filter(|a| is_projected(&a.path))
        .map(|a| (a.path.as_str().to_owned(), a.bytes))
        .collect();
    let host: BTreeMap<String, String> =
        assets.iter().map(|(p, b)| (p.clone(), sha256(b))).collect();
    let plan = plan_projection(&host, &sandbox);
    if !plan.delete.is_empty() {
        let args: Vec<String> = plan.delete.iter().map(|p| format!("./{p}")).collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let raw = shared
            .script(&live.id, scripts::REMOVE, &refs, None, 4096)
            .await?;
        check(&raw, "removing projected files")?;
    }
    if !plan.upload.is_empty() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut tar = tar::Builder::new(Vec::new());
        for p in &plan.upload {
            let bytes = assets.get(p).map(Vec::as_slice).unwrap_or_default();
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(now);
            h.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut h, format!("./{p}"), bytes)
                .map_err(|e| Error::backend("cannot pack the projection", e))?;
        }
        let archive = tar
            .into_inner()
            .map_err(|e| Error::backend("cannot pack the projection", e))?;
        let raw = shared
            .script(
                &live.id,
                "cd /workspace && tar -xf -",
                &[],
                Some(archive),
                64 << 10,
            )
            .await?;
        check(&raw, "projecting the workspace")?;
    }
    Ok((plan.upload.len(), plan.delete.len()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_marker_time_is_parsed() {
        assert_eq!(
            parse_marker("5 644 100 ./a\nmarker 1796150087\n"),
            Some(1796150087)
        );
        assert_eq!(parse_marker("5 644 100 ./a\n"), None);
        assert!(parse_listing("marker 17\n").is_empty(), "not a file");
    }

    #[test]
    fn state_files_are_parsed() {
        assert_eq!(
            parse_state("state\nidle\nabc\n12:34\n7\n"),
            Some(ContainerState {
                idle: true,
                identity: "abc".into(),
                owner: "12:34".into(),
                age_secs: 7
            })
        );
        assert_eq!(
            parse_state("state\nbusy\n\n12:34\n-2\n").map(|s| (s.idle, s.identity, s.age_secs)),
            Some((false, String::new(), 0)),
            "a call runs; a clock step back counts as new"
        );
        assert_eq!(parse_state("none\n"), None);
        assert_eq!(parse_state(""), None);
        assert_eq!(parse_state("state\nidle\nabc\n"), None);
    }

    #[test]
    fn listing_is_parsed_and_projection_and_temp_files_left_out() {
        let text = "5 644 100 ./a b.txt\n3 755 101 ./bin/run\n1 644 1 ./AGENTS.md\n1 644 1 ./skills/x/SKILL.md\n\
                    1 600 1 ./d/.hame-tmp-77\n";
        let listed = parse_listing(text);
        assert_eq!(
            listed,
            vec![
                Listed {
                    path: "a b.txt".into(),
                    size: 5,
                    mode: 0o644,
                    mtime: 100
                },
                Listed {
                    path: "bin/run".into(),
                    size: 3,
                    mode: 0o755,
                    mtime: 101
                },
            ]
        );
    }
}
