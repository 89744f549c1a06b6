#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use hame_fs::{FilesystemExt, InMemoryFs};
use pretty_assertions::assert_eq;
use sha2::Digest;
use tokio::sync::oneshot;

use super::*;
use crate::plan::{MANIFEST_VERSION, ManifestEntry};

fn sha(content: &str) -> String {
    hex::encode(sha2::Sha256::digest(content.as_bytes()))
}

fn manifest(files: &[(&str, &str)]) -> Vec<u8> {
    let files: BTreeMap<String, ManifestEntry> = files
        .iter()
        .map(|(p, content)| {
            (
                (*p).to_owned(),
                ManifestEntry {
                    sha256: sha(content),
                    size: content.len() as u64,
                    mode: 0o644,
                    mtime: 1,
                },
            )
        })
        .collect();
    serde_json::to_vec(&Manifest {
        version: MANIFEST_VERSION,
        files,
    })
    .unwrap()
}

async fn put(store: &dyn Filesystem, path: &str, bytes: Vec<u8>) {
    store
        .write(
            &FsPath::parse(path).unwrap(),
            bytes,
            WriteOptions::default(),
        )
        .await
        .unwrap();
}

async fn put_blob(store: &dyn Filesystem, content: &str) {
    store
        .write(
            &blob_path(&sha(content)).unwrap(),
            content.as_bytes().to_vec(),
            WriteOptions::default(),
        )
        .await
        .unwrap();
}

async fn has_blob(store: &dyn Filesystem, content: &str) -> bool {
    store
        .exists(&blob_path(&sha(content)).unwrap())
        .await
        .unwrap()
}

/// A store that stops at its first move of a blob into the trash (before or after it) until
/// the test has done what another process would do at that moment.
#[derive(Debug)]
struct Paused {
    inner: Arc<InMemoryFs>,
    after: bool,
    pause: Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
}

impl Paused {
    /// The store, a receiver that fires when it has stopped, and the sender that resumes it.
    fn new(
        inner: Arc<InMemoryFs>,
        after: bool,
    ) -> (Self, oneshot::Receiver<()>, oneshot::Sender<()>) {
        let (stopped_tx, stopped_rx) = oneshot::channel();
        let (resume_tx, resume_rx) = oneshot::channel();
        let store = Self {
            inner,
            after,
            pause: Mutex::new(Some((stopped_tx, resume_rx))),
        };
        (store, stopped_rx, resume_tx)
    }

    async fn maybe_pause(&self) {
        let pause = self.pause.lock().unwrap().take();
        if let Some((stopped, resume)) = pause {
            let _ = stopped.send(());
            let _ = resume.await;
        }
    }
}

hame_fs::forward_filesystem! {
    impl Filesystem for Paused {
        inner = |s| s.inner.as_ref();
        forward = [
            stat, list, read_bytes, write, delete, exists, read_range, append, edit, grep,
            glob, list_many,
        ];
        async fn rename(
            &self,
            from: &FsPath,
            to: &FsPath,
            options: RenameOptions,
        ) -> hame_fs::Result<()> {
            let into_trash = to.as_str().starts_with("trash/");
            if into_trash && !self.after {
                self.maybe_pause().await;
            }
            let done = self.inner.rename(from, to, options).await;
            if into_trash && self.after {
                self.maybe_pause().await;
            }
            done
        }
    }
}

#[tokio::test]
async fn unreferenced_blobs_go_and_every_kept_snapshot_keeps_its_own() {
    let store = InMemoryFs::new();
    for c in ["current", "older", "garbage", "shared"] {
        put_blob(&store, c).await;
    }
    put(
        &store,
        "scopes/a/manifest.json",
        manifest(&[("f", "current"), ("g", "shared")]),
    )
    .await;
    put(
        &store,
        "scopes/a/history/0000000000000001-aa.json",
        manifest(&[("f", "older")]),
    )
    .await;
    put(
        &store,
        "scopes/agents/x/users/u/home/manifest.json",
        manifest(&[("s", "shared")]),
    )
    .await;
    // Not a history entry: not read (and not a reason to stop).
    put(&store, "scopes/a/history/notes.txt", b"{".to_vec()).await;
    let report = collect(&store).await.unwrap();
    assert_eq!(
        (
            report.manifests,
            report.referenced,
            report.blobs,
            report.condemned,
            report.restored,
            report.deleted,
            report.bytes_deleted
        ),
        (3, 3, 4, 1, 0, 1, 7)
    );
    for c in ["current", "older", "shared"] {
        assert!(has_blob(&store, c).await, "{c}");
    }
    assert!(!has_blob(&store, "garbage").await);
    assert!(
        files_below(&store, TRASH).await.unwrap().is_empty(),
        "the trash is emptied"
    );
}

#[tokio::test]
async fn a_manifest_that_does_not_parse_stops_the_sweep() {
    let store = InMemoryFs::new();
    put_blob(&store, "garbage").await;
    put(&store, "scopes/a/manifest.json", b"not json".to_vec()).await;
    assert!(collect(&store).await.is_err());
    assert!(
        has_blob(&store, "garbage").await,
        "nothing deleted on a guess"
    );
}

/// A snapshot of another process begins between the sweep's first mark and its move of a
/// blob the snapshot reuses (it found the blob present, so it does not upload it): the
/// second mark sees its history entry and the blob goes back.
#[tokio::test]
async fn a_blob_reused_by_a_snapshot_during_the_sweep_is_put_back() {
    let inner = Arc::new(InMemoryFs::new());
    put_blob(inner.as_ref(), "old content").await;
    let (store, stopped, resume) = Paused::new(inner.clone(), false);
    let snapshot = async {
        stopped.await.unwrap();
        let json = manifest(&[("f", "old content")]);
        write_intent(inner.as_ref(), "b", &json, &sha("m"))
            .await
            .unwrap();
        assert!(
            has_blob(inner.as_ref(), "old content").await,
            "reused, not uploaded"
        );
        put(inner.as_ref(), "scopes/b/manifest.json", json).await;
        resume.send(()).unwrap();
    };
    let (report, ()) = tokio::join!(collect(&store), snapshot);
    let report = report.unwrap();
    assert_eq!(
        (report.condemned, report.restored, report.deleted),
        (1, 1, 0)
    );
    assert!(has_blob(inner.as_ref(), "old content").await);
    assert_eq!(
        read_blob(inner.as_ref(), &sha("old content"))
            .await
            .unwrap(),
        b"old content"
    );
}

/// While a blob is in the trash, a reader still gets it; a snapshot that looks for it then
/// does not find it and uploads it again, and the sweep drops its trash copy.
#[tokio::test]
async fn a_blob_in_the_trash_is_still_read_and_an_upload_meanwhile_wins() {
    let inner = Arc::new(InMemoryFs::new());
    put_blob(inner.as_ref(), "old content").await;
    let (store, stopped, resume) = Paused::new(inner.clone(), true);
    let others = async {
        stopped.await.unwrap();
        assert!(
            !has_blob(inner.as_ref(), "old content").await,
            "moved aside"
        );
        assert_eq!(
            read_blob(inner.as_ref(), &sha("old content"))
                .await
                .unwrap(),
            b"old content"
        );
        // A snapshot that begins now finds no blob and uploads it.
        let json = manifest(&[("f", "old content")]);
        write_intent(inner.as_ref(), "b", &json, &sha("m"))
            .await
            .unwrap();
        put_blob(inner.as_ref(), "old content").await;
        put(inner.as_ref(), "scopes/b/manifest.json", json).await;
        resume.send(()).unwrap();
    };
    let (report, ()) = tokio::join!(collect(&store), others);
    let report = report.unwrap();
    assert_eq!(
        (report.condemned, report.restored, report.deleted),
        (1, 0, 1)
    );
    assert!(has_blob(inner.as_ref(), "old content").await);
}

#[tokio::test]
async fn the_trash_of_a_sweep_that_did_not_finish_is_settled_an_hour_later() {
    let store = InMemoryFs::new();
    put(
        &store,
        "scopes/a/manifest.json",
        manifest(&[("f", "needed")]),
    )
    .await;
    let old = "trash/0000000000000001-7-0";
    let fresh = format!("trash/{:016}-7-1", now_millis());
    put(
        &store,
        &format!("{old}/{}", sha("needed")),
        b"needed".to_vec(),
    )
    .await;
    put(&store, &format!("{old}/{}", sha("gone")), b"gone".to_vec()).await;
    put(
        &store,
        &format!("{fresh}/{}", sha("other")),
        b"other".to_vec(),
    )
    .await;
    let report = collect(&store).await.unwrap();
    assert_eq!((report.restored, report.deleted), (1, 1));
    assert!(has_blob(&store, "needed").await);
    assert!(!store.exists(&FsPath::parse(old).unwrap()).await.unwrap());
    assert!(
        store
            .exists(&FsPath::parse(&format!("{fresh}/{}", sha("other"))).unwrap())
            .await
            .unwrap(),
        "another sweep may still be running"
    );
}

#[tokio::test]
async fn history_is_pruned_to_the_newest_entries() {
    let store = InMemoryFs::new();
    let mut names = Vec::new();
    for i in 0..5 {
        let json = manifest(&[("f", &format!("v{i}"))]);
        names.push(
            write_intent(&store, "k", &json, &sha(&i.to_string()))
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let current = names[4].clone();
    assert_eq!(prune_history(&store, "k", 3, &current).await.unwrap(), 2);
    let left: Vec<String> = store
        .list(&FsPath::parse("scopes/k/history").unwrap())
        .await
        .unwrap()
        .iter()
        .map(|e| name_of(&e.path).to_owned())
        .collect();
    assert_eq!(left, names[2..].to_vec());
    assert_eq!(
        store
            .download(&[FsPath::parse(&format!("scopes/k/history/{current}")).unwrap()])
            .await
            .len(),
        1
    );
}
