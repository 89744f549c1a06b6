//! Decisions without I/O: what a snapshot must upload, what a projection must change, how
//! a duration is spelled.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The version of the snapshot manifest format.
pub const MANIFEST_VERSION: u32 = 1;

/// One file of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Hex SHA-256 of the content (the blob's name in the store).
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`0o755`, `0o644`, ...).
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: u64,
}

/// The files of a scope's `/workspace` at its last snapshot (paths relative to it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version ([`MANIFEST_VERSION`]).
    pub version: u32,
    /// Path → entry.
    pub files: BTreeMap<String, ManifestEntry>,
}

/// One file as the container lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Path relative to `/workspace`.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: u64,
}

/// What a snapshot has to do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotPlan {
    /// Files to read from the container (new, or changed by size, mode or time, or written
    /// since the last snapshot's marker).
    pub fetch: Vec<String>,
    /// Files of the last manifest that are gone.
    pub removed: Vec<String>,
}

/// Compares the container's listing with the last manifest. `touched` are the files the
/// container reports as modified since the last snapshot (a marker file), which catches a
/// change within the same second that keeps the size.
pub fn plan_snapshot(
    last: &Manifest,
    listed: &[Listed],
    touched: &BTreeSet<String>,
) -> SnapshotPlan {
    let mut plan = SnapshotPlan::default();
    let mut seen = BTreeSet::new();
    for f in listed {
        seen.insert(f.path.as_str());
        let same = last
            .files
            .get(&f.path)
            .is_some_and(|e| e.size == f.size && e.mode == f.mode && e.mtime == f.mtime);
        if !same || touched.contains(&f.path) {
            plan.fetch.push(f.path.clone());
        }
    }
    plan.removed = last
        .files
        .keys()
        .filter(|p| !seen.contains(p.as_str()))
        .cloned()
        .collect();
    plan.fetch.sort();
    plan
}

/// What a projection has to do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProjectionPlan {
    /// Host files to upload (absent from the sandbox or with another hash).
    pub upload: Vec<String>,
    /// Sandbox files under the projection roots that the host does not have.
    pub delete: Vec<String>,
}

/// Compares the host's assets (path → SHA-256) with the sandbox's files under the
/// projection roots (path → SHA-256).
pub fn plan_projection(
    host: &BTreeMap<String, String>,
    sandbox: &BTreeMap<String, String>,
) -> ProjectionPlan {
    ProjectionPlan {
        upload: host
            .iter()
            .filter(|(p, h)| sandbox.get(*p) != Some(*h))
            .map(|(p, _)| p.clone())
            .collect(),
        delete: sandbox
            .keys()
            .filter(|p| !host.contains_key(*p))
            .cloned()
            .collect(),
    }
}

/// The name of a snapshot in a scope's history (`scopes/<key>/history/<name>`): the time it
/// was taken (milliseconds since the epoch, 16 digits, so names sort by time) and the first
/// 16 hex digits of its identity.
pub fn history_name(millis: u64, identity: &str) -> String {
    let short = identity.get(..16).unwrap_or(identity);
    format!("{millis:016}-{short}.json")
}

/// Whether `name` is a history entry written by [`history_name`].
pub fn is_history_name(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".json") else {
        return false;
    };
    let Some((millis, short)) = stem.split_once('-') else {
        return false;
    };
    millis.len() == 16
        && millis.bytes().all(|b| b.is_ascii_digit())
        && !short.is_empty()
        && short.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The history entries to delete so that the newest `keep` (at least one) remain, and
/// `current` (the entry just written) in any case. Names that are not history entries are
/// never touched.
pub fn history_to_prune(names: &[String], keep: usize, current: &str) -> Vec<String> {
    let mut entries: Vec<&String> = names.iter().filter(|n| is_history_name(n)).collect();
    entries.sort();
    entries.dedup();
    let cut = entries.len().saturating_sub(keep.max(1));
    entries[..cut]
        .iter()
        .filter(|n| n.as_str() != current)
        .map(|n| (*n).clone())
        .collect()
}

/// The start time (milliseconds since the epoch) in the name of a sweep's trash folder
/// (`<16 digits>-…`).
pub fn sweep_started(name: &str) -> Option<u64> {
    let (millis, _) = name.split_once('-')?;
    (millis.len() == 16).then(|| millis.parse().ok())?
}

/// What a garbage collection of the snapshot store did (see `docs/sandbox.md`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Snapshot manifests read (every scope's current one and its history).
    pub manifests: usize,
    /// Distinct blobs they reference.
    pub referenced: usize,
    /// Blobs in the store when the sweep looked.
    pub blobs: usize,
    /// Blobs no manifest referenced, moved aside.
    pub condemned: usize,
    /// Of those, put back because a snapshot taken meanwhile references them.
    pub restored: usize,
    /// Blobs deleted (condemned by this sweep, or left aside by one that did not finish).
    pub deleted: usize,
    /// Bytes deleted.
    pub bytes_deleted: u64,
    /// Time spent.
    pub elapsed: Duration,
}

/// Parses a duration: `300` (seconds), `300s`, `500ms`, `5m`, `1h`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    match unit.trim() {
        "" | "s" => Some(Duration::from_secs(n)),
        "ms" => Some(Duration::from_millis(n)),
        "m" | "min" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn entry(size: u64, mtime: u64) -> ManifestEntry {
        ManifestEntry {
            sha256: "h".into(),
            size,
            mode: 0o644,
            mtime,
        }
    }

    fn listed(path: &str, size: u64, mtime: u64) -> Listed {
        Listed {
            path: path.into(),
            size,
            mode: 0o644,
            mtime,
        }
    }

    #[test]
    fn snapshot_fetches_only_changes_and_sees_deletions() {
        let mut last = Manifest::default();
        last.files.insert("same".into(), entry(1, 10));
        last.files.insert("grown".into(), entry(1, 10));
        last.files.insert("gone".into(), entry(1, 10));
        last.files.insert("touched".into(), entry(1, 10));
        let now = [
            listed("same", 1, 10),
            listed("grown", 2, 10),
            listed("new", 1, 11),
            listed("touched", 1, 10),
        ];
        let touched = BTreeSet::from(["touched".to_owned()]);
        assert_eq!(
            plan_snapshot(&last, &now, &touched),
            SnapshotPlan {
                fetch: vec!["grown".into(), "new".into(), "touched".into()],
                removed: vec!["gone".into()],
            }
        );
    }

    #[test]
    fn unchanged_workspace_needs_nothing() {
        let mut last = Manifest::default();
        last.files.insert("a".into(), entry(3, 5));
        let plan = plan_snapshot(&last, &[listed("a", 3, 5)], &BTreeSet::new());
        assert_eq!(plan, SnapshotPlan::default());
    }

    #[test]
    fn projection_uploads_changes_and_deletes_what_the_host_dropped() {
        let host = BTreeMap::from([
            ("AGENTS.md".to_owned(), "h2".to_owned()),
            ("skills/a/SKILL.md".to_owned(), "s".to_owned()),
        ]);
        let sandbox = BTreeMap::from([
            ("AGENTS.md".to_owned(), "h1".to_owned()),
            ("skills/a/SKILL.md".to_owned(), "s".to_owned()),
            ("skills/old/SKILL.md".to_owned(), "o".to_owned()),
        ]);
        assert_eq!(
            plan_projection(&host, &sandbox),
            ProjectionPlan {
                upload: vec!["AGENTS.md".into()],
                delete: vec!["skills/old/SKILL.md".into()],
            }
        );
    }

    #[test]
    fn history_keeps_the_newest_and_the_current_entry() {
        let names: Vec<String> = [
            "0000000000000003-cc.json",
            "0000000000000001-aa.json",
            "notes.txt",
            "0000000000000002-bb.json",
            "0000000000000004-dd.json",
            "manifest.json",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        assert_eq!(
            history_to_prune(&names, 2, "0000000000000004-dd.json"),
            vec!["0000000000000001-aa.json", "0000000000000002-bb.json"]
        );
        assert_eq!(
            history_to_prune(&names, 0, "0000000000000001-aa.json"),
            vec!["0000000000000002-bb.json", "0000000000000003-cc.json"],
            "at least one is kept, and the current one whatever its time"
        );
        assert!(history_to_prune(&names, 10, "x").is_empty());
        assert_eq!(
            history_name(42, "0123456789abcdef0123"),
            "0000000000000042-0123456789abcdef.json"
        );
        assert!(is_history_name(&history_name(1_796_000_000_000, "ab")));
        assert!(!is_history_name("0000000000000042-.json"));
        assert!(!is_history_name("42-ab.json"));
        assert_eq!(sweep_started("0000000000000042-77-1"), Some(42));
        assert_eq!(sweep_started("x-1"), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("20s"), Some(Duration::from_secs(20)));
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(parse_duration("-1"), None);
        assert_eq!(parse_duration("5d"), None);
    }
}
