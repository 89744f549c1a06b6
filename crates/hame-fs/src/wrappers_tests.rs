#![allow(clippy::unwrap_used)]

use pretty_assertions::assert_eq;

use super::*;
use crate::codes;
use crate::{FilesystemExt, InMemoryFs};

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

fn p(s: &str) -> FsPath {
    FsPath::parse(s).unwrap()
}

fn mem() -> Arc<dyn Filesystem> {
    Arc::new(InMemoryFs::new())
}

fn template() -> Arc<dyn Filesystem> {
    Arc::new(
        InMemoryFs::with_files([
            ("AGENTS.md", b"# Agents\n".as_slice()),
            ("tpl/knowledge/k.md", b"knowledge\n".as_slice()),
        ])
        .unwrap(),
    )
}

#[tokio::test]
async fn conformance_prefix() {
    crate::conformance::run_all(&PrefixFs::new(InMemoryFs::new(), p("tenants/t1"))).await;
}

#[tokio::test]
async fn conformance_read_only() {
    let mem = Arc::new(InMemoryFs::new());
    crate::conformance::run_read_only(&*mem, &ReadOnlyFs::new(mem.clone())).await;
}

#[cfg(feature = "local")]
#[tokio::test]
async fn conformance_read_only_on_disk() -> TestResult {
    let dir = tempfile::tempdir()?;
    let local = crate::LocalFs::new(dir.path())?;
    crate::conformance::run_read_only(&local, &ReadOnlyFs::new(local.clone())).await;
    Ok(())
}

#[tokio::test]
async fn conformance_composite() {
    let fs = CompositeFs::new(mem())
        .mount(p("grep"), mem())
        .mount(p("mv/new"), mem())
        .mount(p("list/sub"), mem());
    crate::conformance::run_all(&fs).await;
}

#[tokio::test]
async fn conformance_overlay() {
    let fs = OverlayFs::new(mem(), Arc::new(ReadOnlyFs::new(template())));
    crate::conformance::run_all(&fs).await;
}

#[tokio::test]
async fn conformance_overlay_on_prefix_in_composite() {
    let store: Arc<dyn Filesystem> = Arc::new(PrefixFs::new(InMemoryFs::new(), p("ns")));
    let fs = CompositeFs::new(Arc::new(OverlayFs::new(store, template()))).mount(p("glob"), mem());
    crate::conformance::run_all(&fs).await;
}

#[tokio::test]
async fn prefix_hides_the_prefix_and_siblings() -> TestResult {
    let store = Arc::new(InMemoryFs::new());
    store
        .write(
            &p("a/secret"),
            b"other tenant".to_vec(),
            WriteOptions::default(),
        )
        .await?;
    let fs = PrefixFs::new(store.clone(), p("b"));
    fs.write(&p("/x.txt"), b"mine".to_vec(), WriteOptions::default())
        .await?;
    assert_eq!(store.read_bytes(&p("b/x.txt")).await?, b"mine");
    let err = fs.read_bytes(&p("/a/secret")).await.unwrap_err();
    assert_eq!(err.to_string(), "/a/secret: no such file or directory");
    let all = fs.glob(&GlobRequest::new("**")).await?;
    assert_eq!(all.files.len(), 1);
    assert_eq!(all.files[0].path, p("x.txt"));
    assert!(FsPath::parse("../a/secret").is_err());
    Ok(())
}

#[tokio::test]
async fn read_only_refuses_every_change() -> TestResult {
    let fs = ReadOnlyFs::new(template());
    let f = p("AGENTS.md");
    assert_eq!(fs.read_bytes(&f).await?, b"# Agents\n");
    let errs = [
        fs.write(&f, b"x".to_vec(), WriteOptions::default())
            .await
            .err(),
        fs.append(&f, b"x".to_vec(), crate::AppendOptions::default())
            .await
            .err(),
        fs.delete(&f, DeleteOptions::default()).await.err(),
        fs.rename(&f, &p("b"), RenameOptions::default()).await.err(),
        fs.edit(
            &f,
            &EditRequest {
                old: "#".into(),
                new: "!".into(),
                replace_all: false,
            },
        )
        .await
        .err(),
        fs.upload(vec![(f.clone(), vec![])]).await.remove(0).err(),
    ];
    for e in errs {
        assert_eq!(e.map(|e| e.code()), Some(codes::PERMISSION_DENIED));
    }
    Ok(())
}

#[tokio::test]
async fn overlay_reads_through_writes_up_and_never_touches_the_template() -> TestResult {
    let lower = template();
    let upper = mem();
    let fs = OverlayFs::new(upper.clone(), Arc::new(ReadOnlyFs::new(lower.clone())));
    let agents = p("AGENTS.md");
    assert_eq!(fs.read_bytes(&agents).await?, b"# Agents\n");
    fs.edit(
        &agents,
        &EditRequest {
            old: "Agents".into(),
            new: "Mine".into(),
            replace_all: false,
        },
    )
    .await?;
    assert_eq!(fs.read_bytes(&agents).await?, b"# Mine\n");
    assert_eq!(lower.read_bytes(&agents).await?, b"# Agents\n");
    fs.append(
        &p("tpl/knowledge/k.md"),
        b"more\n".to_vec(),
        crate::AppendOptions::default(),
    )
    .await?;
    assert_eq!(
        upper.read_bytes(&p("tpl/knowledge/k.md")).await?,
        b"knowledge\nmore\n"
    );
    let names = crate::conformance::paths(&fs.list(&FsPath::root()).await?);
    assert_eq!(names, vec!["/AGENTS.md", "/tpl"]);
    // Deleting the override reverts to the template; the template itself cannot be deleted.
    fs.delete(&agents, DeleteOptions::default()).await?;
    assert_eq!(fs.read_bytes(&agents).await?, b"# Agents\n");
    let e = fs
        .delete(&agents, DeleteOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), codes::NOT_SUPPORTED);
    let e = fs
        .rename(&agents, &p("x"), RenameOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), codes::NOT_SUPPORTED);
    let e = fs
        .write(&agents, b"x".to_vec(), WriteOptions::create_new())
        .await
        .unwrap_err();
    assert_eq!(e.code(), codes::ALREADY_EXISTS);
    let hits = fs.grep(&GrepRequest::new("knowledge|Agents")).await?;
    assert_eq!(hits.matches.len(), 2);
    Ok(())
}

#[tokio::test]
async fn composite_routes_by_longest_prefix_and_merges() -> TestResult {
    let default = mem();
    let memory = mem();
    let sessions = mem();
    let fs = CompositeFs::new(default.clone())
        .mount(p("memory"), memory.clone())
        .mount(p("memory/sessions"), sessions.clone());
    fs.write(&p("a.txt"), b"needle a".to_vec(), WriteOptions::default())
        .await?;
    fs.write(
        &p("memory/m.md"),
        b"needle m".to_vec(),
        WriteOptions::default(),
    )
    .await?;
    fs.write(
        &p("memory/sessions/s.jsonl"),
        b"needle s".to_vec(),
        WriteOptions::default(),
    )
    .await?;
    assert_eq!(memory.read_bytes(&p("m.md")).await?, b"needle m");
    assert_eq!(sessions.read_bytes(&p("s.jsonl")).await?, b"needle s");
    assert!(!memory.exists(&p("sessions/s.jsonl")).await?);
    let names = crate::conformance::paths(&fs.list(&FsPath::root()).await?);
    assert_eq!(names, vec!["/a.txt", "/memory"]);
    let hits = fs.grep(&GrepRequest::new("needle")).await?;
    let paths: Vec<String> = hits.matches.iter().map(|m| m.path.to_string()).collect();
    assert_eq!(
        paths,
        vec!["/a.txt", "/memory/m.md", "/memory/sessions/s.jsonl"]
    );
    let e = fs.read_bytes(&p("memory/nope")).await.unwrap_err();
    assert_eq!(e.to_string(), "/memory/nope: no such file or directory");
    fs.rename(&p("memory/m.md"), &p("m.md"), RenameOptions::default())
        .await?;
    assert_eq!(default.read_bytes(&p("m.md")).await?, b"needle m");
    Ok(())
}

/// A batch of listings through an overlay over a composite is one `list_many` on each
/// backend below, whatever the number of listings, and merges like `list` and `glob`: the
/// upper copy wins, a template file shows where the upper side has none.
#[tokio::test]
async fn list_many_is_one_operation_per_backend() -> TestResult {
    let store = crate::CountingFs::new(mem());
    let mounted = crate::CountingFs::new(mem());
    let lower = crate::CountingFs::new(template());
    let upper = CompositeFs::new(Arc::new(PrefixFs::new(store.clone(), p("ns"))))
        .mount(p("skills"), Arc::new(mounted.clone()));
    let fs = OverlayFs::new(Arc::new(upper), Arc::new(lower.clone()));
    for (path, data) in [
        ("AGENTS.md", "mine"),
        ("tpl/knowledge/new.md", "n"),
        ("skills/a/SKILL.md", "a"),
    ] {
        fs.write(&p(path), data.into(), WriteOptions::default())
            .await?;
    }
    for c in [&store, &mounted, &lower] {
        c.reset();
    }
    let requests = [
        ListRequest::children(FsPath::root()),
        ListRequest::recursive(p("tpl")),
        ListRequest::recursive(p("skills")),
        ListRequest::recursive(p("subagents")),
    ];
    let out = fs.list_many(&requests).await?;
    for c in [&store, &mounted, &lower] {
        assert_eq!(c.counts().ops, [("list_many", 1)].into_iter().collect());
    }
    let mut out = out.into_iter();
    let mut next = || out.next().ok_or("a listing is missing");
    let root = next()?.map_err(|e| e.to_string())?;
    assert_eq!(root.entries, fs.list(&FsPath::root()).await?);
    assert_eq!(
        crate::conformance::paths(&root.entries),
        vec!["/AGENTS.md", "/skills", "/tpl"]
    );
    assert_eq!(root.entries[0].size, 4, "the upper copy wins");
    let tpl = next()?.map_err(|e| e.to_string())?;
    assert_eq!(
        crate::conformance::paths(&tpl.entries),
        vec!["/tpl/knowledge/k.md", "/tpl/knowledge/new.md"]
    );
    let skills = next()?.map_err(|e| e.to_string())?;
    assert_eq!(
        crate::conformance::paths(&skills.entries),
        vec!["/skills/a/SKILL.md"]
    );
    assert_eq!(
        next()?.map_err(|e| e.code()).unwrap_err(),
        codes::FILE_NOT_FOUND
    );
    Ok(())
}
