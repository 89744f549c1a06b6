//! Garbage collection of the snapshot store (ADR 0025): every scope keeps its last
//! snapshots, and blobs that none of them references are deleted, safely against the
//! snapshots and restores other processes run meanwhile, on any store (a directory, S3,
//! Redis) and without a lock.
//!
//! Layout, beside `blobs/` and `scopes/<key>/manifest.json` (see `state`):
//! `scopes/<key>/history/<millis>-<id>.json` (the scope's last snapshots, each a manifest;
//! [`crate::plan::history_name`]) and `trash/<sweep>/<sha256>` (blobs a sweep moved aside).
//!
//! The rules:
//! 1. A snapshot writes its history entry *before* it uploads its blobs, its manifest after
//!    them, and prunes its history to the last N after that (under the scope's lease).
//! 2. A sweep marks (reads every manifest and history entry), lists the blobs, and moves
//!    each unreferenced one into its trash folder (a rename: it is never absent from both);
//!    then it marks again, puts back what that second mark references (a snapshot that
//!    began meanwhile reuses or wrote it) and deletes the rest.
//! 3. A reader that misses a blob in `blobs/` looks in the trash folders, and again in
//!    `blobs/` ([`read_blob`]).
//!
//! Why it is safe: a blob leaves the trash for good only when the second mark did not see
//! it, and that mark began after the blob was moved; a snapshot that references it wrote
//! its history entry before looking for the blob, so either the mark saw the entry, or the
//! snapshot looked after the move, found no blob and uploaded it again.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hame_fs::generic::walk_files;
use hame_fs::{DeleteOptions, FileInfo, Filesystem, FsPath, RenameOptions, WriteOptions};

use crate::error::{Error, Result};
use crate::plan::{
    GcReport, Manifest, history_name, history_to_prune, is_history_name, sweep_started,
};

/// Where sweeps move blobs aside.
const TRASH: &str = "trash";
/// A trash folder older than this belongs to a sweep that did not finish (they take
/// seconds): the next sweep settles it.
const LEFTOVER_AFTER: Duration = Duration::from_secs(3600);
/// Rounds of `blobs/`, then the trash folders, a reader tries before a blob counts as gone.
const READ_ROUNDS: usize = 3;

fn path(text: &str) -> Result<FsPath> {
    Ok(FsPath::parse(text)?)
}

/// `blobs/<2 hex>/<sha256>`.
pub(crate) fn blob_path(sha: &str) -> Result<FsPath> {
    let prefix = sha.get(..2).unwrap_or("00");
    path(&format!("blobs/{prefix}/{sha}"))
}

fn history_dir(key: &str) -> Result<FsPath> {
    FsPath::parse(&format!("scopes/{key}/history"))
        .map_err(|e| Error::Config(format!("invalid sandbox scope key {key:?}: {e}")))
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn name_of(path: &FsPath) -> &str {
    path.segments().last().unwrap_or_default()
}

fn is_sha256(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Every file below `dir`; none when it does not exist.
async fn files_below(store: &dyn Filesystem, dir: &str) -> Result<Vec<FileInfo>> {
    match walk_files(store, &path(dir)?).await {
        Ok(files) => Ok(files),
        Err(e) if e.is_not_found() => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Rule 1: the new snapshot of `key` (`json`, of identity `identity`) enters the scope's
/// history before its blobs are uploaded. Returns the entry's name.
pub(crate) async fn write_intent(
    store: &dyn Filesystem,
    key: &str,
    json: &[u8],
    identity: &str,
) -> Result<String> {
    let name = history_name(now_millis(), identity);
    let entry = history_dir(key)?.join(&name)?;
    // Visible to other processes is what counts (a crash before the manifest is written
    // leaves a snapshot nobody restores anyway).
    store
        .write(&entry, json.to_vec(), WriteOptions::atomic())
        .await?;
    Ok(name)
}

/// Deletes the history entries of `key` but the newest `keep` and `current`. Called under
/// the scope's lease, after the manifest is written.
pub(crate) async fn prune_history(
    store: &dyn Filesystem,
    key: &str,
    keep: usize,
    current: &str,
) -> Result<usize> {
    let dir = history_dir(key)?;
    let names: Vec<String> = match store.list(&dir).await {
        Ok(entries) => entries
            .iter()
            .filter(|e| !e.is_dir())
            .map(|e| name_of(&e.path).to_owned())
            .collect(),
        Err(e) if e.is_not_found() => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let prune = history_to_prune(&names, keep, current);
    for name in &prune {
        match store
            .delete(&dir.join(name)?, DeleteOptions::default())
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(prune.len())
}

/// Rule 3: a blob's content, from `blobs/` or, while a sweep has moved it aside, from a
/// trash folder.
pub(crate) async fn read_blob(store: &dyn Filesystem, sha: &str) -> Result<Vec<u8>> {
    let blob = blob_path(sha)?;
    let trash = path(TRASH)?;
    for _ in 0..READ_ROUNDS {
        match store.read_bytes(&blob).await {
            Ok(bytes) => return Ok(bytes),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        let sweeps = match store.list(&trash).await {
            Ok(entries) => entries,
            Err(e) if e.is_not_found() => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        for sweep in sweeps.iter().filter(|e| e.is_dir()) {
            match store.read_bytes(&sweep.path.join(sha)?).await {
                Ok(bytes) => return Ok(bytes),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Err(hame_fs::Error::NotFound {
        path: blob.to_string(),
    }
    .into())
}

/// Every blob referenced by a scope's manifest or history entry, and how many of those
/// were read. A manifest that does not parse stops the sweep (nothing is deleted on a
/// guess); one deleted meanwhile (pruned) is skipped.
pub(crate) async fn mark(store: &dyn Filesystem) -> Result<(BTreeSet<String>, usize)> {
    let mut referenced = BTreeSet::new();
    let mut read = 0;
    for file in files_below(store, "scopes").await? {
        let name = name_of(&file.path);
        let in_history = file.path.parent().is_some_and(|p| name_of(&p) == "history");
        if name != "manifest.json" && !(in_history && is_history_name(name)) {
            continue;
        }
        let bytes = match store.read_bytes(&file.path).await {
            Ok(b) => b,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| Error::Snapshot {
            message: format!(
                "{} is not a snapshot manifest ({e}); no blob is collected",
                file.path
            ),
            source: None,
        })?;
        referenced.extend(manifest.files.into_values().map(|e| e.sha256));
        read += 1;
    }
    Ok((referenced, read))
}

/// One sweep of the store (rule 2).
pub(crate) async fn collect(store: &dyn Filesystem) -> Result<GcReport> {
    static SWEEPS: AtomicU64 = AtomicU64::new(0);
    let started = Instant::now();
    let begun = now_millis();
    let sweep = format!(
        "{begun:016}-{}-{}",
        std::process::id(),
        SWEEPS.fetch_add(1, Ordering::SeqCst)
    );
    let mut report = GcReport::default();
    let (referenced, read) = mark(store).await?;
    report.manifests = read;
    report.referenced = referenced.len();
    let trash = path(TRASH)?.join(&sweep)?;
    for blob in files_below(store, "blobs").await? {
        let sha = name_of(&blob.path);
        if !is_sha256(sha) {
            continue;
        }
        report.blobs += 1;
        if referenced.contains(sha) {
            continue;
        }
        let aside = trash.join(sha)?;
        match store
            .rename(&blob.path, &aside, RenameOptions::default())
            .await
        {
            Ok(()) => report.condemned += 1,
            // Another sweep moved it first.
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    // The second mark begins after every move: what it references was (re)used meanwhile.
    let (referenced, _) = mark(store).await?;
    let mut folders = vec![trash.clone()];
    let leftover_before = begun.saturating_sub(LEFTOVER_AFTER.as_millis() as u64);
    let all = match store.list(&path(TRASH)?).await {
        Ok(entries) => entries,
        Err(e) if e.is_not_found() => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    folders.extend(
        all.into_iter()
            .filter(|e| {
                e.is_dir()
                    && e.path != trash
                    && sweep_started(name_of(&e.path)).is_some_and(|t| t < leftover_before)
            })
            .map(|e| e.path),
    );
    for folder in folders {
        for item in files_below(store, folder.as_str()).await? {
            let sha = name_of(&item.path);
            if referenced.contains(sha) {
                let back = blob_path(sha)?;
                match store
                    .rename(&item.path, &back, RenameOptions::default())
                    .await
                {
                    Ok(()) => {
                        report.restored += 1;
                        continue;
                    }
                    // Uploaded again meanwhile: this copy is not needed.
                    Err(hame_fs::Error::AlreadyExists { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            match store.delete(&item.path, DeleteOptions::default()).await {
                Ok(()) => {
                    report.deleted += 1;
                    report.bytes_deleted += item.size;
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        match store
            .delete(&folder, DeleteOptions { recursive: true })
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

#[cfg(test)]
#[path = "gc_tests.rs"]
mod tests;
