#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use async_trait::async_trait;
use pretty_assertions::assert_eq;
use proptest::prelude::*;

use super::*;
use crate::InMemoryFs;
use crate::fs::{DeleteOptions, RenameOptions};

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// A backend that implements only the six required methods, so every provided method runs
/// the generic fallback of this module (`append_via_cas`, `edit_via_cas`, `grep_via_walk`,
/// `read_range_via_read`, ...) on top of a real store.
#[derive(Debug)]
struct RequiredOnly<F>(F);

#[async_trait]
impl<F: Filesystem> Filesystem for RequiredOnly<F> {
    async fn stat(&self, path: &FsPath) -> Result<FileInfo> {
        self.0.stat(path).await
    }
    async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
        self.0.list(path).await
    }
    async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
        self.0.read_bytes(path).await
    }
    async fn write(&self, path: &FsPath, data: Vec<u8>, options: WriteOptions) -> Result<Version> {
        self.0.write(path, data, options).await
    }
    async fn delete(&self, path: &FsPath, options: DeleteOptions) -> Result<()> {
        self.0.delete(path, options).await
    }
    async fn rename(&self, from: &FsPath, to: &FsPath, options: RenameOptions) -> Result<()> {
        self.0.rename(from, to, options).await
    }
}

fn p(s: &str) -> FsPath {
    FsPath::parse(s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_of_the_fallbacks_in_memory() {
    crate::conformance::run_all(&RequiredOnly(InMemoryFs::new())).await;
}

#[cfg(feature = "local")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_of_the_fallbacks_on_disk() -> TestResult {
    let dir = tempfile::tempdir()?;
    crate::conformance::run_all(&RequiredOnly(crate::LocalFs::new(dir.path())?)).await;
    Ok(())
}

/// Many tasks on several threads append through read + compare-and-set to one file of a
/// store shared by all of them: every line must land, none twice.
#[cfg(feature = "local")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contended_appends_all_land() -> TestResult {
    let dir = tempfile::tempdir()?;
    let fs = Arc::new(RequiredOnly(crate::LocalFs::new(dir.path())?));
    let path = p("log.txt");
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (fs, path) = (fs.clone(), path.clone());
            tokio::spawn(async move {
                fs.append(
                    &path,
                    format!("{i}\n").into_bytes(),
                    crate::AppendOptions::default(),
                )
                .await
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let text = String::from_utf8(fs.read_bytes(&path).await?)?;
    let mut got: Vec<u32> = text.lines().map(|l| l.parse().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, (0..32).collect::<Vec<u32>>());
    Ok(())
}

/// Concurrent edits of different parts of one file are re-applied on conflict, so none is
/// lost and none overwrites another.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contended_edits_are_reapplied() -> TestResult {
    let fs = Arc::new(RequiredOnly(InMemoryFs::new()));
    let path = p("f.txt");
    let original: String = (0..24).map(|i| format!("slot {i};\n")).collect();
    fs.write(&path, original.into_bytes(), WriteOptions::default())
        .await?;
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let (fs, path) = (fs.clone(), path.clone());
            tokio::spawn(async move {
                let req = EditRequest {
                    old: format!("slot {i};"),
                    new: format!("done {i};"),
                    replace_all: false,
                };
                fs.edit(&path, &req).await
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await??.replacements, 1);
    }
    let want: String = (0..24).map(|i| format!("done {i};\n")).collect();
    assert_eq!(String::from_utf8(fs.read_bytes(&path).await?)?, want);
    Ok(())
}

/// An edit whose text a concurrent writer removed fails with `no_match` on re-application
/// instead of overwriting the other change.
#[tokio::test]
async fn edit_after_a_concurrent_change_does_not_overwrite() -> TestResult {
    let fs = RequiredOnly(InMemoryFs::new());
    let path = p("f.txt");
    fs.write(&path, b"a\n".to_vec(), WriteOptions::default())
        .await?;
    fs.write(&path, b"b\n".to_vec(), WriteOptions::default())
        .await?;
    let req = EditRequest {
        old: "a".into(),
        new: "z".into(),
        replace_all: false,
    };
    let err = fs.edit(&path, &req).await.unwrap_err();
    assert_eq!(err.code(), crate::codes::NO_MATCH);
    assert_eq!(fs.read_bytes(&path).await?, b"b\n");
    Ok(())
}

#[test]
fn backoff_grows_is_capped_and_starts_at_zero() {
    assert_eq!(cas_backoff_delay(0), Duration::ZERO);
    for attempt in 1..200 {
        let exp = (attempt - 1).min(16) as u32;
        let ceiling = (CAS_BACKOFF_BASE * (1u32 << exp)).min(CAS_BACKOFF_MAX);
        let d = cas_backoff_delay(attempt);
        assert!(d <= ceiling, "attempt {attempt}: {d:?} > {ceiling:?}");
    }
    let worst: Duration = (0..CAS_RETRIES)
        .map(|a| {
            if a == 0 {
                Duration::ZERO
            } else {
                (CAS_BACKOFF_BASE * (1u32 << (a - 1).min(16) as u32)).min(CAS_BACKOFF_MAX)
            }
        })
        .sum();
    assert!(
        worst < Duration::from_secs(3),
        "documented bound: {worst:?}"
    );
}

#[test]
fn backoff_is_jittered() {
    let delays: std::collections::BTreeSet<Duration> =
        (0..50).map(|_| cas_backoff_delay(10)).collect();
    assert!(delays.len() > 1, "50 pauses were all equal: {delays:?}");
}

proptest! {
    /// `slice_range` is the clamped window of a byte vector.
    #[test]
    fn slice_range_is_the_clamped_window(
        data in proptest::collection::vec(any::<u8>(), 0..64),
        offset in prop_oneof![0u64..80, any::<u64>()],
        len in prop_oneof![0u64..80, any::<u64>()],
    ) {
        let got = slice_range(&data, offset, len);
        let want: Vec<u8> = data
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                let i = *i as u128;
                i >= u128::from(offset) && i < u128::from(offset) + u128::from(len)
            })
            .map(|(_, b)| *b)
            .collect();
        prop_assert_eq!(got, want.as_slice());
    }
}

/// Each listing of a batch as its paths, or its error's code.
fn outcomes(out: &[Result<crate::Listing>]) -> Vec<std::result::Result<Vec<String>, &'static str>> {
    out.iter()
        .map(|r| match r {
            Ok(l) => Ok(crate::conformance::paths(&l.entries)),
            Err(e) => Err(e.code()),
        })
        .collect()
}

/// The fallback `list_many` answers a recursive listing of a folder that the batch's
/// listing of its parent settles (lacks it, or shows a file) without a call of its own, and
/// walks the others; a probe by name settles the names it asks for, and only those.
#[tokio::test]
async fn list_many_each_asks_nothing_of_a_folder_its_parent_listing_lacks() -> TestResult {
    let walks = ["knowledge", "skills", "AGENTS.md"].map(|d| ListRequest::recursive(p(d)));
    let want = [
        Err(crate::codes::FILE_NOT_FOUND),
        Ok(vec!["/skills/s/SKILL.md".to_owned()]),
        Err(crate::codes::NOT_A_DIRECTORY),
    ];
    // The root's listing, then the walk of skills/ (its stat, two listings); nothing for
    // knowledge/ or AGENTS.md, unless the probe does not name knowledge/.
    for (probe, root, asked) in [
        (
            ListRequest::children(FsPath::root()),
            vec!["/AGENTS.md", "/skills"],
            (3, 1),
        ),
        (
            ListRequest::named(FsPath::root(), ["AGENTS.md", "knowledge", "skills"]),
            vec!["/AGENTS.md", "/skills"],
            (3, 1),
        ),
        (
            ListRequest::named(FsPath::root(), ["AGENTS.md", "skills"]),
            vec!["/AGENTS.md", "/skills"],
            (3, 2),
        ),
    ] {
        let counting = crate::CountingFs::new(Arc::new(InMemoryFs::with_files([
            ("AGENTS.md", b"a".as_slice()),
            ("skills/s/SKILL.md", b"s".as_slice()),
        ])?));
        let fs = RequiredOnly(counting.clone());
        let mut requests = vec![probe.clone()];
        requests.extend(walks.iter().cloned());
        let got = outcomes(&fs.list_many(&requests).await?);
        let root: Vec<String> = root.into_iter().map(str::to_owned).collect();
        assert_eq!(got[0], Ok(root), "{probe:?}");
        assert_eq!(got[1..], want[..], "{probe:?}");
        let counts = counting.counts();
        assert_eq!(
            (counts.of("list"), counts.of("stat")),
            asked,
            "{probe:?}: {:?}",
            counts.ops
        );
    }
    Ok(())
}
