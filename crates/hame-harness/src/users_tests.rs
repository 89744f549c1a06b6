use super::*;
use hame_fs::InMemoryFs;
use pretty_assertions::assert_eq;

fn p(s: &str) -> FsPath {
    FsPath::parse(s).unwrap_or_default()
}

async fn with_files(files: &[&str]) -> Result<Arc<InMemoryFs>> {
    let mem = Arc::new(InMemoryFs::new());
    for f in files {
        mem.write(&p(f), b"x".to_vec(), WriteOptions::default())
            .await?;
    }
    Ok(mem)
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

/// A workspace an earlier hame used keeps its protected folders: every top-level folder
/// with a marker is registered, once; a folder made later is not guessed.
#[tokio::test]
async fn a_used_workspace_registers_its_marker_folders_once() -> Result<()> {
    let mem = with_files(&[
        "agents/hame/sessions/s.log.jsonl",
        "alice/AGENTS.md",
        "bob/memory/2024-01-01.md",
        "proj/src/main.rs",
        "skills/x/SKILL.md",
    ])
    .await?;
    let reg = UserRegistry::new(mem.clone(), mem.clone());
    assert_eq!(reg.users().await?, set(&["alice", "bob"]));
    assert!(mem.exists(&p("agents/.users/.v1")).await?);
    // A new process: the mark says done, the registry says who.
    mem.write(&p("dave/AGENTS.md"), b"x".to_vec(), WriteOptions::default())
        .await?;
    let again = UserRegistry::new(mem.clone(), mem.clone());
    assert_eq!(again.users().await?, set(&["alice", "bob"]));
    Ok(())
}

/// A workspace no hame used has nothing to migrate: marker folders are project folders
/// until a user with that id calls (or is declared).
#[tokio::test]
async fn a_fresh_workspace_registers_callers_and_declared_ids_only() -> Result<()> {
    let mem = with_files(&["proj/skills/x/SKILL.md", "alice/AGENTS.md"]).await?;
    let reg = UserRegistry::new(mem.clone(), mem.clone()).with_declared(["erin".to_owned()]);
    assert_eq!(reg.users().await?, set(&["erin"]));
    reg.register("carol").await?;
    reg.register("carol").await?;
    assert_eq!(reg.users().await?, set(&["carol", "erin"]));
    // Another process (another replica) sees carol from the store.
    let other = UserRegistry::new(mem.clone(), mem.clone());
    assert_eq!(other.users().await?, set(&["carol"]));
    Ok(())
}
