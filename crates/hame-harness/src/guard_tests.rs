use super::*;
use hame_fs::InMemoryFs;

fn p(s: &str) -> FsPath {
    FsPath::parse(s).unwrap_or_default()
}

async fn seeded() -> Arc<InMemoryFs> {
    let mem = Arc::new(InMemoryFs::new());
    for (path, text) in [
        ("notes.md", "needle in notes"),
        ("agents/hame/sessions/s.log.jsonl", "needle in the log"),
        ("large_tool_results/c-1.txt", "needle offloaded"),
        ("alice/AGENTS.md", "needle alice persona"),
        ("bob/AGENTS.md", "needle bob persona"),
        ("state/x.json", "needle state"),
    ] {
        let _ = mem
            .write(&p(path), text.as_bytes().to_vec(), WriteOptions::default())
            .await;
    }
    mem
}

fn rules(own: Option<&str>) -> GuardRules {
    GuardRules {
        hidden: vec![p("state")],
        runtime: vec![p("agents"), p("large_tool_results")],
        read_only: vec![p("tools.json")],
        user_folders: Some(own.map(str::to_owned)),
    }
}

#[tokio::test]
async fn conformance_without_rules() {
    let mem = Arc::new(InMemoryFs::new());
    hame_fs::conformance::run_all(&GuardFs::new(mem, GuardRules::default())).await;
}

/// The names a listing of the root shows.
async fn root_names(g: &GuardFs) -> Result<Vec<String>> {
    Ok(g.list(&FsPath::root())
        .await?
        .into_iter()
        .map(|e| e.path.as_str().to_owned())
        .collect())
}

/// The paths a literal search for `needle` finds, sorted.
async fn grep_paths(g: &GuardFs, needle: &str) -> Result<Vec<String>> {
    let mut req = GrepRequest::new(needle);
    req.literal = true;
    let mut hits: Vec<String> = g
        .grep(&req)
        .await?
        .matches
        .into_iter()
        .map(|m| m.path.as_str().to_owned())
        .collect();
    hits.sort();
    Ok(hits)
}

/// A registry over `store` that knows `users`.
async fn registry(store: Arc<InMemoryFs>, users: &[&str]) -> Result<Arc<UserRegistry>> {
    let r = Arc::new(UserRegistry::new(store.clone(), store));
    for u in users {
        r.register(u).await?;
    }
    Ok(r)
}

#[tokio::test]
async fn walks_skip_runtime_roots_and_other_users() -> Result<()> {
    let mem = seeded().await;
    let g = GuardFs::new(mem.clone(), rules(Some("alice")))
        .with_users(registry(mem, &["alice", "bob"]).await?);
    assert_eq!(
        grep_paths(&g, "needle").await?,
        vec!["alice/AGENTS.md", "notes.md"]
    );
    assert_eq!(root_names(&g).await?, vec!["alice", "notes.md"]);
    let mut req = GrepRequest::new("needle");
    req.literal = true;
    // Named, a runtime root is readable and searchable.
    assert!(
        g.read_bytes(&p("agents/hame/sessions/s.log.jsonl"))
            .await
            .is_ok()
    );
    req.path = p("agents");
    assert_eq!(g.grep(&req).await?.matches.len(), 1);
    // Another user's folder and the state home do not exist.
    for hidden in ["bob/AGENTS.md", "bob", "state/x.json"] {
        assert!(
            g.read_bytes(&p(hidden))
                .await
                .is_err_and(|e| e.is_not_found())
        );
        assert!(!g.exists(&p(hidden)).await?);
    }
    let all = g.glob(&GlobRequest::new("**/*")).await?;
    assert!(
        all.files
            .iter()
            .all(|f| !f.path.as_str().starts_with("bob"))
    );
    Ok(())
}

#[tokio::test]
async fn runtime_roots_are_never_written() -> Result<()> {
    let g = GuardFs::new(seeded().await, rules(None));
    let log = p("agents/hame/sessions/s.log.jsonl");
    let denied = |e: &Error| e.code() == hame_fs::codes::PERMISSION_DENIED;
    assert!(
        g.write(&log, vec![], WriteOptions::default())
            .await
            .is_err_and(|e| denied(&e))
    );
    assert!(
        g.append(&log, vec![b'x'], hame_fs::AppendOptions::default())
            .await
            .is_err_and(|e| denied(&e))
    );
    assert!(
        g.delete(&log, DeleteOptions::default())
            .await
            .is_err_and(|e| denied(&e))
    );
    assert!(
        g.rename(&log, &p("x.jsonl"), RenameOptions::default())
            .await
            .is_err_and(|e| denied(&e))
    );
    assert!(
        g.rename(&p("notes.md"), &log, RenameOptions::default())
            .await
            .is_err_and(|e| denied(&e))
    );
    assert!(
        g.delete(&p("agents"), DeleteOptions::default())
            .await
            .is_err_and(|e| denied(&e))
    );
    assert!(
        g.write(&p("out/a.txt"), b"a".to_vec(), WriteOptions::default())
            .await
            .is_ok()
    );
    Ok(())
}

/// A read-only file (an isolated tenant's `tools.json`) is read and listed, and refused to
/// every change, under every spelling, as the operator's configuration.
#[tokio::test]
async fn read_only_files_are_read_but_never_changed() -> Result<()> {
    let mem = seeded().await;
    mem.write(&p("tools.json"), b"{}".to_vec(), WriteOptions::default())
        .await?;
    let g = GuardFs::new(mem, rules(None));
    assert_eq!(g.read_bytes(&p("tools.json")).await?, b"{}".to_vec());
    assert!(root_names(&g).await?.contains(&"tools.json".to_owned()));
    let refused = |r: Result<()>| match r {
        Err(Error::PermissionDenied { reason, .. }) => {
            reason.contains("tools.json is the operator's configuration")
        }
        _ => false,
    };
    for spelling in ["tools.json", "/tools.json", "./tools.json", "tools.json/"] {
        let path = FsPath::parse(spelling)?;
        let write = g.write(&path, b"x".to_vec(), WriteOptions::default()).await;
        assert!(refused(write.map(|_| ())), "{spelling}");
    }
    let t = p("tools.json");
    assert!(refused(
        g.delete(&t, DeleteOptions::default()).await.map(|_| ())
    ));
    assert!(refused(
        g.rename(&t, &p("x.json"), RenameOptions::default())
            .await
            .map(|_| ())
    ));
    assert!(refused(
        g.rename(&p("notes.md"), &t, RenameOptions::default())
            .await
            .map(|_| ())
    ));
    Ok(())
}

/// A folder is a user's because its name is a registered id, not because of what it holds:
/// a user's folder without any marker is hidden, a project folder with `skills/` is not.
#[tokio::test]
async fn user_folders_are_the_registered_ids_whatever_they_hold() -> Result<()> {
    let mem = Arc::new(InMemoryFs::new());
    for path in ["carol/notes.md", "proj/skills/x/SKILL.md", "proj/AGENTS.md"] {
        mem.write(&p(path), b"needle".to_vec(), WriteOptions::default())
            .await?;
    }
    let reg = registry(mem.clone(), &["carol"]).await?;
    let bob = GuardFs::new(mem.clone(), rules(Some("bob"))).with_users(reg.clone());
    assert!(
        bob.read_bytes(&p("carol/notes.md"))
            .await
            .is_err_and(|e| e.is_not_found())
    );
    assert_eq!(bob.read_bytes(&p("proj/AGENTS.md")).await?, b"needle");
    assert_eq!(root_names(&bob).await?, vec!["proj"]);
    assert_eq!(
        grep_paths(&bob, "needle").await?,
        vec!["proj/AGENTS.md", "proj/skills/x/SKILL.md"]
    );
    // Carol sees her own folder.
    let carol = GuardFs::new(mem, rules(Some("carol"))).with_users(reg);
    assert_eq!(carol.read_bytes(&p("carol/notes.md")).await?, b"needle");
    Ok(())
}

/// A view reads the registry once (one `list` of the store) and then pays no probe per
/// file operation: the old marker rule paid up to 8 `exists` (Redis round trips in store
/// mode) for each one.
#[tokio::test]
async fn file_operations_pay_no_probe_for_user_folders() -> Result<()> {
    let mem = seeded().await;
    registry(mem.clone(), &["alice", "bob"]).await?;
    let store = Arc::new(hame_fs::CountingFs::new(mem.clone()));
    let files = Arc::new(hame_fs::CountingFs::new(mem.clone()));
    let reg = Arc::new(UserRegistry::new(store.clone(), mem.clone()));
    let g = GuardFs::new(files.clone(), rules(Some("alice"))).with_users(reg);
    for _ in 0..10 {
        g.read_bytes(&p("notes.md")).await?;
        g.read_bytes(&p("alice/AGENTS.md")).await?;
        assert!(g.read_bytes(&p("bob/AGENTS.md")).await.is_err());
    }
    let (files, store) = (files.counts(), store.counts());
    assert_eq!(
        files.of("exists") + files.of("stat"),
        0,
        "no probe: {files:?}"
    );
    assert_eq!(files.total(), 20, "the reads themselves: {files:?}");
    assert_eq!(store.total(), 1, "one list of the registry: {store:?}");
    assert_eq!(store.of("list"), 1);
    Ok(())
}

/// Bob's own links lead to alice's folder, to her file, up to the root and out of the
/// workspace: no file tool of his returns her content or changes it, and a walk never
/// follows a link (item 4 of #30).
#[tokio::test]
async fn links_do_not_lead_out_of_the_callers_view()
-> std::result::Result<(), Box<dyn std::error::Error>> {
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("ws");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(root.join("alice/agents/hame/sessions"))?;
    std::fs::create_dir_all(root.join("bob"))?;
    std::fs::create_dir_all(&outside)?;
    std::fs::write(
        root.join("alice/agents/hame/sessions/s.log.jsonl"),
        "alice-secret log",
    )?;
    std::fs::write(root.join("alice/notes.md"), "alice-secret notes")?;
    std::fs::write(outside.join("o.md"), "outside-secret")?;
    std::fs::write(root.join("bob/mine.md"), "bob's own")?;
    symlink("../alice", root.join("bob/x"))?;
    symlink("../alice/notes.md", root.join("bob/y"))?;
    symlink("..", root.join("bob/up"))?;
    symlink(&outside, root.join("bob/out"))?;
    let local = hame_fs::LocalFs::new(&root)?;
    let inner: Arc<dyn Filesystem> = Arc::new(local.clone());
    let store = Arc::new(hame_fs::LocalFs::new(&root)?);
    let reg = Arc::new(UserRegistry::new(store, inner.clone()));
    for u in ["alice", "bob"] {
        reg.register(u).await?;
    }
    let bob = GuardFs::new(
        inner,
        GuardRules {
            hidden: vec![p("agents")],
            runtime: vec![p("bob/agents")],
            read_only: Vec::new(),
            user_folders: Some(Some("bob".into())),
        },
    )
    .with_users(reg)
    .with_links(Arc::new(local));
    let mut seen = Vec::new();
    for base in ["", "bob", "bob/x", "bob/up"] {
        let mut req = GrepRequest::new("secret");
        req.path = p(base);
        match bob.grep(&req).await {
            Ok(out) => seen.extend(
                out.matches
                    .into_iter()
                    .map(|m| format!("{}:{}", m.path, m.text)),
            ),
            Err(e) => assert!(e.is_not_found(), "{base}: {e}"),
        }
        let mut glob = GlobRequest::new("**");
        glob.path = p(base);
        match bob.glob(&glob).await {
            Ok(out) => seen.extend(out.files.into_iter().map(|f| f.path.to_string())),
            Err(e) => assert!(e.is_not_found(), "{base}: {e}"),
        }
    }
    for dir in ["bob", "bob/x", "bob/up", "bob/up/alice", "bob/out"] {
        if let Ok(entries) = bob.list(&p(dir)).await {
            seen.extend(entries.into_iter().map(|e| e.path.to_string()));
        }
    }
    // A listing of named entries checks their links one by one: it hides what `list` hides.
    let names = ["x", "y", "up", "out", "mine.md", "alice", "nope"];
    for dir in ["", "bob", "bob/up"] {
        let named = bob
            .list_many(&[ListRequest::named(p(dir), names)])
            .await?
            .into_iter()
            .next();
        let Some(Ok(named)) = named else { continue };
        let listed: Vec<FileInfo> = bob
            .list(&p(dir))
            .await?
            .into_iter()
            .filter(|e| names.contains(&e.path.file_name()))
            .collect();
        assert_eq!(named.entries, listed, "named listing of {dir:?}");
        seen.extend(named.entries.into_iter().map(|e| e.path.to_string()));
    }
    // A batch's recursive listings through a link into another user's folder find nothing,
    // as `glob` does; one of a folder that is not there neither; one of bob's own folder
    // what `glob` finds.
    let dirs = [
        "bob/x",
        "bob/y",
        "bob/up/alice",
        "bob/up",
        "bob/nope",
        "bob",
    ];
    let walks = bob
        .list_many(&dirs.map(|d| ListRequest::recursive(p(d))))
        .await?;
    for (dir, got) in dirs.iter().zip(walks) {
        let mut glob = GlobRequest::new("**");
        glob.path = p(dir);
        match (got, bob.glob(&glob).await) {
            (Ok(l), Ok(g)) => {
                assert_eq!(l.entries, g.files, "{dir}");
                seen.extend(l.entries.into_iter().map(|e| e.path.to_string()));
            }
            (Err(e), _) => assert!(e.is_not_found() || *dir == "bob/up", "{dir}: {e}"),
            (Ok(l), Err(e)) => panic!("{dir}: the batch listed {l:?}, glob said {e}"),
        }
    }
    assert!(
        !seen.iter().any(|s| s == "/bob/x" || s == "/bob/y"),
        "links into another user's folder or above are left out: {seen:#?}"
    );
    for file in [
        "bob/y",
        "bob/x/notes.md",
        "bob/up/alice/notes.md",
        "bob/x/agents/hame/sessions/s.log.jsonl",
        "bob/out/o.md",
    ] {
        if let Ok(b) = bob.read_bytes(&p(file)).await {
            seen.push(String::from_utf8_lossy(&b).into_owned());
        }
        assert!(
            !matches!(bob.exists(&p(file)).await, Ok(true)),
            "{file} exists for bob"
        );
        assert!(
            bob.write(&p(file), b"bob was here".to_vec(), WriteOptions::default())
                .await
                .is_err(),
            "bob wrote {file}"
        );
    }
    assert!(
        seen.iter()
            .all(|s| !s.contains("secret") && !s.contains("notes") && !s.contains("/x/")),
        "{seen:#?}"
    );
    // A walk of the root or of bob's folder follows no link: bob's file, once.
    let all = bob.glob(&GlobRequest::new("**")).await?;
    let names: Vec<String> = all.files.iter().map(|f| f.path.to_string()).collect();
    assert_eq!(names, vec!["/bob/mine.md"]);
    let mut req = GrepRequest::new("own");
    req.path = p("bob");
    assert_eq!(bob.grep(&req).await?.matches.len(), 1);
    assert_eq!(
        std::fs::read_to_string(root.join("alice/notes.md"))?,
        "alice-secret notes"
    );
    // A link into a runtime root is no way to write it.
    symlink("agents", root.join("bob/rt"))?;
    std::fs::create_dir_all(root.join("bob/agents"))?;
    assert!(
        bob.write(&p("bob/rt/x.jsonl"), b"x".to_vec(), WriteOptions::default())
            .await
            .is_err_and(|e| e.code() == hame_fs::codes::PERMISSION_DENIED)
    );
    Ok(())
}

/// A batch of listings through the guard hides what its `list` and `glob` hide: each
/// listing equals the one made through the view's own methods, one at a time.
#[tokio::test]
async fn list_many_hides_what_list_and_glob_hide() -> Result<()> {
    let mem = seeded().await;
    let g = GuardFs::new(mem.clone(), rules(Some("alice")))
        .with_users(registry(mem, &["alice", "bob"]).await?);
    let requests = [
        ListRequest::children(FsPath::root()),
        ListRequest::children(FsPath::root()).max_results(1),
        ListRequest::recursive(FsPath::root()),
        ListRequest::recursive(p("alice")),
        ListRequest::children(p("agents/hame")),
        ListRequest::children(p("bob")),
        ListRequest::recursive(p("state")),
    ];
    let batch = g.list_many(&requests).await?;
    assert_eq!(batch.len(), requests.len());
    for (r, got) in requests.iter().zip(batch) {
        let one = generic::list_one(&g, r).await;
        match (got, one) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{r:?}"),
            (Err(a), Err(b)) => assert_eq!(a.code(), b.code(), "{r:?}"),
            (a, b) => panic!("{r:?}: the batch gave {a:?}, one by one {b:?}"),
        }
    }
    let root = g.list_many(&requests[..1]).await?.remove(0)?;
    let names: Vec<&str> = root.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(names, vec!["alice", "notes.md"]);
    Ok(())
}
