#![allow(clippy::unwrap_used)]

use std::os::unix::fs::symlink;

use pretty_assertions::assert_eq;
use proptest::prelude::*;

use super::*;
use crate::codes;

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// A root dir and, next to it, a secret outside the root.
struct Sandbox {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

fn sandbox() -> Sandbox {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "TOP SECRET\n").unwrap();
    Sandbox {
        _tmp: tmp,
        root,
        outside,
    }
}

fn p(s: &str) -> FsPath {
    FsPath::parse(s).unwrap()
}

#[tokio::test]
async fn conformance() {
    let sb = sandbox();
    crate::conformance::run_all(&LocalFs::new(&sb.root).unwrap()).await;
}

#[tokio::test]
async fn escaping_symlinks_are_refused() -> TestResult {
    let sb = sandbox();
    symlink(sb.outside.join("secret.txt"), sb.root.join("abs_link"))?;
    symlink("../outside/secret.txt", sb.root.join("rel_link"))?;
    symlink("../outside", sb.root.join("dir_link"))?;
    std::fs::create_dir(sb.root.join("inside"))?;
    std::fs::write(sb.root.join("inside/ok.txt"), "ok")?;
    symlink("inside/ok.txt", sb.root.join("good_link"))?;
    let fs = LocalFs::new(&sb.root)?;
    for bad in ["abs_link", "rel_link", "dir_link/secret.txt"] {
        let err = fs.read_bytes(&p(bad)).await.unwrap_err();
        assert_eq!(err.code(), codes::PERMISSION_DENIED, "{bad}: {err}");
        let err = fs
            .write(
                &p(&format!("{bad}/x")),
                b"x".to_vec(),
                WriteOptions::default(),
            )
            .await
            .unwrap_err();
        assert!(
            [codes::PERMISSION_DENIED, codes::NOT_A_DIRECTORY].contains(&err.code()),
            "{bad}: {err}"
        );
        let err = fs
            .append(&p(bad), b"x".to_vec(), crate::AppendOptions::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), codes::PERMISSION_DENIED, "{bad}: {err}");
        let err = fs.read_range(&p(bad), 0, 100).await.unwrap_err();
        assert_eq!(err.code(), codes::PERMISSION_DENIED, "{bad}: {err}");
    }
    assert_eq!(fs.read_bytes(&p("good_link")).await?, b"ok");
    assert_eq!(fs.read_range(&p("good_link"), 1, 9).await?, b"k");
    let listed = fs.list(&FsPath::root()).await?;
    let names = crate::conformance::paths(&listed);
    assert_eq!(names, vec!["/good_link", "/inside"]);
    // A symlink inside the root is listed as what it points at; other entries as
    // themselves.
    assert_eq!(
        listed
            .iter()
            .map(|i| (i.is_dir(), i.size))
            .collect::<Vec<_>>(),
        vec![(false, 2), (true, listed[1].size)]
    );
    let hits = fs.grep(&GrepRequest::new("SECRET")).await?;
    assert_eq!(hits.matches, vec![]);
    assert_eq!(
        std::fs::read_to_string(sb.outside.join("secret.txt"))?,
        "TOP SECRET\n"
    );
    assert_eq!(
        std::fs::read_dir(&sb.outside)?.count(),
        1,
        "nothing written outside"
    );
    Ok(())
}

#[tokio::test]
async fn hard_links_devices_and_fifos_are_refused() -> TestResult {
    let sb = sandbox();
    // Same filesystem (both in the tempdir), so the hard link succeeds.
    std::fs::hard_link(sb.outside.join("secret.txt"), sb.root.join("hard"))?;
    symlink("/dev/zero", sb.root.join("dev"))?;
    rustix::fs::mknodat(
        rustix::fs::CWD,
        sb.root.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )?;
    let fs = LocalFs::new(&sb.root)?;
    for bad in ["hard", "dev", "fifo"] {
        let err = fs.read_bytes(&p(bad)).await.unwrap_err();
        assert_eq!(err.code(), codes::PERMISSION_DENIED, "{bad}: {err}");
        let err = fs
            .append(&p(bad), b"x".to_vec(), crate::AppendOptions::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), codes::PERMISSION_DENIED, "{bad}: {err}");
        let err = fs.read_range(&p(bad), 0, 4).await.unwrap_err();
        assert_eq!(err.code(), codes::PERMISSION_DENIED, "{bad}: {err}");
    }
    // Overwriting the hard-linked name replaces the name, not the outside inode.
    fs.write(&p("hard"), b"mine".to_vec(), WriteOptions::default())
        .await?;
    assert_eq!(
        std::fs::read_to_string(sb.outside.join("secret.txt"))?,
        "TOP SECRET\n"
    );
    Ok(())
}

#[tokio::test]
async fn writes_leave_no_temp_files_and_keep_mode() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let sb = sandbox();
    let fs = LocalFs::new(&sb.root)?;
    fs.write(
        &p("run.sh"),
        b"#!/bin/sh\n".to_vec(),
        WriteOptions::default(),
    )
    .await?;
    std::fs::set_permissions(
        sb.root.join("run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )?;
    fs.write(
        &p("run.sh"),
        b"#!/bin/sh\necho\n".to_vec(),
        WriteOptions::default(),
    )
    .await?;
    let mode = std::fs::metadata(sb.root.join("run.sh"))?
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o755);
    let names: Vec<String> = std::fs::read_dir(&sb.root)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::result::Result<_, _>>()?;
    assert_eq!(names, vec!["run.sh"]);
    Ok(())
}

#[tokio::test]
async fn read_range_reads_only_the_range_and_caps_it() -> TestResult {
    let sb = sandbox();
    let options = LocalFsOptions {
        max_file_bytes: 100,
        ..LocalFsOptions::default()
    };
    let fs = LocalFs::with_options(&sb.root, options)?;
    let data: Vec<u8> = (0u8..250).collect();
    std::fs::write(sb.root.join("big.bin"), &data)?;
    // The whole file is over the limit, a page of it is not.
    let err = fs.read_bytes(&p("big.bin")).await.unwrap_err();
    assert_eq!(err.code(), codes::TOO_LARGE);
    assert_eq!(fs.read_range(&p("big.bin"), 200, 100).await?, data[200..]);
    assert_eq!(fs.read_range(&p("big.bin"), 10, 100).await?, data[10..110]);
    let err = fs.read_range(&p("big.bin"), 10, 101).await.unwrap_err();
    assert_eq!(err.code(), codes::TOO_LARGE, "{err}");
    assert_eq!(fs.read_range(&p("big.bin"), 250, 1000).await?, b"");
    Ok(())
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("..".to_owned()),
        Just(".".to_owned()),
        Just("%2e%2e".to_owned()),
        Just("%2f".to_owned()),
        Just("..%2f..".to_owned()),
        Just("outside".to_owned()),
        Just("secret.txt".to_owned()),
        Just("link".to_owned()),
        Just("\u{0}".to_owned()),
        Just("\\..\\".to_owned()),
        Just("~".to_owned()),
        Just("ü文".to_owned()),
        "[a-z.%]{1,4}",
        "\\PC{1,3}",
        Just("x".repeat(300)),
    ]
}

fn traversal() -> impl Strategy<Value = String> {
    (any::<bool>(), prop::collection::vec(segment(), 1..6)).prop_map(|(abs, segs)| {
        let s = segs.join("/");
        if abs { format!("/{s}") } else { s }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Whatever path string the model sends, nothing outside the root is read or written.
    #[test]
    fn no_path_escapes_the_root(paths in prop::collection::vec(traversal(), 1..8)) {
        let sb = sandbox();
        std::fs::create_dir(sb.root.join("d")).unwrap();
        symlink(&sb.outside, sb.root.join("link")).unwrap();
        symlink("../outside", sb.root.join("d/link")).unwrap();
        symlink("../../outside/secret.txt", sb.root.join("d/secret.txt")).unwrap();
        let fs = LocalFs::new(&sb.root).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            for raw in &paths {
                let Ok(path) = FsPath::parse(raw) else {
                    prop_assert!(raw.contains("..") || raw.contains('\0') || raw.contains('\\') || raw.len() > 255 || raw.chars().any(|c| c.is_control()), "refused {raw:?}");
                    continue;
                };
                prop_assert!(!path.segments().any(|s| s == ".."));
                if let Ok(data) = fs.read_bytes(&path).await {
                    prop_assert!(!String::from_utf8_lossy(&data).contains("SECRET"), "read outside via {raw:?}");
                }
                if let Ok(data) = fs.read_range(&path, 0, 64).await {
                    prop_assert!(!String::from_utf8_lossy(&data).contains("SECRET"), "range read outside via {raw:?}");
                }
                let _ = fs.write(&path, b"pwned".to_vec(), WriteOptions::default()).await;
                let _ = fs.append(&path, b"pwned".to_vec(), crate::AppendOptions::default()).await;
                let _ = fs.delete(&path, DeleteOptions { recursive: true }).await;
                let _ = fs.rename(&path, &FsPath::parse("moved").unwrap(), RenameOptions { overwrite: true }).await;
                if let Ok(g) = fs.grep(&GrepRequest { path: path.clone(), ..GrepRequest::new("SECRET") }).await {
                    prop_assert!(g.matches.is_empty(), "grep outside via {raw:?}");
                }
            }
            Ok(())
        })?;
        let names: Vec<_> = std::fs::read_dir(&sb.outside).unwrap().map(|e| e.unwrap().file_name()).collect();
        prop_assert_eq!(names.len(), 1, "outside dir changed: {:?}", names);
        prop_assert_eq!(std::fs::read_to_string(sb.outside.join("secret.txt")).unwrap(), "TOP SECRET\n");
    }
}

/// The calls made on the caller's thread: a compare-and-set whose file another process
/// has locked waits for it on the blocking pool (the runtime's worker stays free: a timer
/// task runs meanwhile) and then lands; a file over `INLINE_READ_MAX` is read whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_write_that_would_wait_moves_off_the_runtime_thread() -> TestResult {
    let sb = sandbox();
    let fs = LocalFs::new(&sb.root)?;
    let v1 = fs
        .write(&p("idx/a.json"), b"one".to_vec(), WriteOptions::default())
        .await?;
    // Another process's compare-and-set writer holds the file's lock.
    let held = std::fs::File::open(sb.root.join("idx/a.json"))?;
    rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive)?;
    let write = {
        let fs = fs.clone();
        tokio::spawn(async move {
            let mut o = WriteOptions::if_match(v1);
            o.durability = crate::fs::Durability::Atomic;
            fs.write(&p("idx/a.json"), b"two".to_vec(), o).await
        })
    };
    // The single worker is not blocked by the waiting write: this sleep completes.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!write.is_finished(), "the write waits for the lock");
    assert_eq!(fs.read_bytes(&p("idx/a.json")).await?, b"one");
    drop(held);
    write.await??;
    assert_eq!(fs.read_bytes(&p("idx/a.json")).await?, b"two");

    let big = vec![b'x'; (INLINE_READ_MAX + 10) as usize];
    std::fs::write(sb.root.join("big.bin"), &big)?;
    assert_eq!(fs.read_bytes(&p("big.bin")).await?.len(), big.len());
    let small = fs.read_range(&p("big.bin"), 5, 10).await?;
    assert_eq!(small, b"xxxxxxxxxx");
    Ok(())
}

fn current_thread_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// A write that is atomic but not synced: the kind that runs on the caller's thread.
fn atomic() -> WriteOptions {
    WriteOptions {
        durability: crate::fs::Durability::Atomic,
        ..Default::default()
    }
}

/// On a current-thread runtime (no blocking pool is needed for the inline calls) every
/// kind of call still completes.
#[test]
fn inline_calls_work_on_a_current_thread_runtime() -> TestResult {
    let sb = sandbox();
    let rt = current_thread_runtime()?;
    rt.block_on(async {
        let fs = LocalFs::new(&sb.root)?;
        fs.write(&p("a/b.txt"), b"hi".to_vec(), atomic()).await?;
        fs.append(
            &p("a/log"),
            b"1\n".to_vec(),
            crate::AppendOptions::default(),
        )
        .await?;
        assert_eq!(fs.read_bytes(&p("a/b.txt")).await?, b"hi");
        assert_eq!(fs.list(&p("a")).await?.len(), 2);
        assert_eq!(fs.stat(&p("a/log")).await?.size, 2);
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}

/// Open descriptors of this process that point at a deleted file below `root`.
fn deleted_fds_below(root: &std::path::Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd")? {
        if let Ok(target) = std::fs::read_link(e?.path()) {
            let t = target.to_string_lossy().into_owned();
            if t.starts_with(&*root.to_string_lossy()) && t.ends_with(" (deleted)") {
                out.push(t);
            }
        }
    }
    Ok(out)
}

/// A write on the caller's thread that replaces a file hands the replaced file to the
/// blocking pool to be closed (freeing its blocks may wait for the device): the content is
/// the new one at once, and the old file is closed soon after, for a plain overwrite and a
/// compare-and-set alike.
#[test]
fn a_write_that_replaces_a_file_closes_the_old_one() -> TestResult {
    let sb = sandbox();
    let rt = current_thread_runtime()?;
    rt.block_on(async {
        let fs = LocalFs::new(&sb.root)?;
        let o = atomic();
        fs.write(&p("a.txt"), b"one".to_vec(), o.clone()).await?;
        let v = fs.write(&p("a.txt"), b"two".to_vec(), o.clone()).await?;
        assert_eq!(fs.read_bytes(&p("a.txt")).await?, b"two");
        let cas = WriteOptions {
            mode: WriteMode::IfMatch(v),
            ..o
        };
        fs.write(&p("a.txt"), b"three".to_vec(), cas).await?;
        assert_eq!(fs.read_bytes(&p("a.txt")).await?, b"three");
        let root = std::fs::canonicalize(&sb.root)?;
        let mut open = deleted_fds_below(&root)?;
        for _ in 0..200 {
            if open.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            open = deleted_fds_below(&root)?;
        }
        assert!(open.is_empty(), "replaced files still open: {open:?}");
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}

/// `Links::resolve` and `links_among`: a path without links names itself (the cheap
/// `openat2(RESOLVE_NO_SYMLINKS)` answer), existing or not; a link anywhere on the way leads
/// where it points, the missing rest appended; a link out of the root is refused.
#[test]
fn resolve_follows_links_and_only_links() -> TestResult {
    let sb = sandbox();
    std::fs::create_dir_all(sb.root.join("real/sub"))?;
    std::fs::write(sb.root.join("real/sub/f.txt"), "x")?;
    symlink("real", sb.root.join("alias"))?;
    symlink("real/sub/f.txt", sb.root.join("file_alias"))?;
    symlink("../outside", sb.root.join("out"))?;
    symlink("missing_target", sb.root.join("dangling"))?;
    let fs = LocalFs::new(&sb.root)?;
    let cases = [
        ("real/sub/f.txt", Some("real/sub/f.txt")),
        ("real/sub/nope/deeper.txt", Some("real/sub/nope/deeper.txt")),
        ("nope/deeper.txt", Some("nope/deeper.txt")),
        ("alias/sub/f.txt", Some("real/sub/f.txt")),
        ("alias/sub/nope.txt", Some("real/sub/nope.txt")),
        ("alias", Some("real")),
        ("file_alias", Some("real/sub/f.txt")),
        ("dangling/x", Some("dangling/x")),
        ("out/secret.txt", None),
    ];
    for (path, want) in cases {
        let got = Links::resolve(&fs, &p(path));
        match want {
            Some(w) => assert_eq!(got.map_err(|e| e.to_string())?, p(w), "{path}"),
            None => assert!(
                got.is_err_and(|e| e.code() == codes::PERMISSION_DENIED),
                "{path}: a link out of the root is refused"
            ),
        }
    }
    let mut among = fs.links_among(
        &FsPath::root(),
        &[
            "alias", "real", "out", "nope", "alias", "real/sub", "..", ".", "", "alias/",
        ],
    )?;
    among.sort();
    assert_eq!(among, vec!["alias".to_owned(), "out".to_owned()]);
    Ok(())
}
