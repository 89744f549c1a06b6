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
        user_folders: Some(own.map(str::to_owned)),
    }
}

#[tokio::test]
async fn conformance_without_rules() {
    let mem = Arc::new(InMemoryFs::new());
    hame_fs::conformance::run_all(&GuardFs::new(mem, GuardRules::default())).await;
}

#[tokio::test]
async fn walks_skip_runtime_roots_and_other_users() -> Result<()> {
    let g = GuardFs::new(seeded().await, rules(Some("alice")));
    let mut req = GrepRequest::new("needle");
    req.literal = true;
    let mut hits: Vec<String> = g
        .grep(&req)
        .await?
        .matches
        .into_iter()
        .map(|m| m.path.as_str().to_owned())
        .collect();
    hits.sort();
    assert_eq!(hits, vec!["alice/AGENTS.md", "notes.md"]);
    let names: Vec<String> = g
        .list(&FsPath::root())
        .await?
        .into_iter()
        .map(|e| e.path.as_str().to_owned())
        .collect();
    assert_eq!(names, vec!["alice", "notes.md"]);
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
