use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hame_fs::{CountingFs, Filesystem, FsPath, LocalFs};
use pretty_assertions::assert_eq;

use super::*;
use crate::{Identity, Workspace, WorkspaceMode};

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// Writes `rel` under `root`, dated a minute ago (older than the racy window).
fn put(root: &std::path::Path, rel: &str, text: &str) -> std::io::Result<()> {
    let p = root.join(rel);
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(&p, text)?;
    let f = std::fs::File::options().write(true).open(&p)?;
    f.set_modified(SystemTime::now() - Duration::from_secs(60))
}

fn workspace(dir: &std::path::Path) -> std::result::Result<(Workspace, CountingFs), Error> {
    let counting = CountingFs::new(Arc::new(LocalFs::new(dir)?));
    let fs: Arc<dyn Filesystem> = Arc::new(counting.clone());
    let ws = Workspace::new(
        Identity::new("hame", Some("ada"), "s1"),
        WorkspaceMode::SharedStore,
        fs.clone(),
        fs,
    );
    Ok((ws, counting))
}

fn seed(dir: &std::path::Path) -> std::io::Result<()> {
    put(dir, "AGENTS.md", "You are careful.\n")?;
    put(dir, "tools.json", "{}")?;
    put(dir, "notes.txt", "not held")?;
    put(dir, "knowledge/KNOWLEDGE.md", "Catalogue.\n")?;
    put(dir, "knowledge/faq/q1.md", "answer")?;
    for i in 0..5 {
        put(dir, &format!("skills/s{i}/SKILL.md"), &format!("skill {i}"))?;
        put(dir, &format!("skills/s{i}/scripts/run.sh"), "echo")?;
    }
    put(dir, "skills/s1-x/SKILL.md", "a name that sorts between")?;
    put(dir, "subagents/a.md", "spec a")?;
    put(dir, "src/main.rs", "fn main() {}")
}

/// An unchanged step costs one `list_many` (the root's children and every file below each
/// held folder), whatever the number of skills and folders, and reads nothing.
#[tokio::test]
async fn an_unchanged_step_costs_only_the_probes() -> TestResult {
    let dir = tempfile::tempdir()?;
    seed(dir.path())?;
    let (ws, counting) = workspace(dir.path())?;
    let cache = SnapshotCache::default();
    let first = WorkspaceSnapshot::take(&ws, &cache, 1).await;
    assert_eq!(
        first.reads(),
        10,
        "AGENTS.md, tools.json, KNOWLEDGE.md, 6 skills, 1 spec"
    );
    counting.reset();
    let second = WorkspaceSnapshot::take(&ws, &cache, 2).await;
    let counts = counting.counts();
    assert_eq!((second.probes(), second.reads()), (1, 0));
    assert_eq!((counts.total(), counts.of("list_many")), (1, 1));
    let agents = second
        .file(SnapshotRoot::Files, "AGENTS.md")
        .ok_or("AGENTS.md held")?;
    assert_eq!(
        agents.version,
        Some(hame_fs::Version::of(b"You are careful.\n"))
    );
    Ok(())
}

/// The view answers as the store does: listings, reads, absent names; paths it does not
/// hold go to the store.
#[tokio::test]
async fn the_view_answers_as_the_store_does() -> TestResult {
    let dir = tempfile::tempdir()?;
    seed(dir.path())?;
    let (ws, counting) = workspace(dir.path())?;
    let cache = SnapshotCache::default();
    let snap = WorkspaceSnapshot::take(&ws, &cache, 1).await;
    let view = snap.workspace().files().clone();
    let store = ws.files().clone();
    for d in ["", "skills", "skills/s1", "knowledge", "subagents"] {
        let p = FsPath::parse(d)?;
        let mut a = view.list(&p).await?;
        let mut b = store.list(&p).await?;
        a.sort_by(|x, y| x.path.cmp(&y.path));
        b.sort_by(|x, y| x.path.cmp(&y.path));
        let names = |v: &[FileInfo]| {
            v.iter()
                .map(|f| (f.path.as_str().to_owned(), f.is_dir()))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&a), names(&b), "list {d}");
    }
    counting.reset();
    for f in ["AGENTS.md", "skills/s3/SKILL.md", "subagents/a.md"] {
        let p = FsPath::parse(f)?;
        assert_eq!(view.read_bytes(&p).await?, store.read_bytes(&p).await?);
    }
    // Three reads of the store (the comparison's), none of the view.
    assert_eq!(counting.counts().of("read_bytes"), 3);
    let missing = FsPath::parse("MEMORY.md")?;
    assert!(
        view.read_bytes(&missing)
            .await
            .is_err_and(|e| e.is_not_found())
    );
    assert!(!view.exists(&FsPath::parse("skills/nope/SKILL.md")?).await?);
    counting.reset();
    // Not held: from the store.
    assert_eq!(
        view.read_bytes(&FsPath::parse("src/main.rs")?).await?,
        b"fn main() {}"
    );
    assert_eq!(
        view.read_bytes(&FsPath::parse("skills/s0/scripts/run.sh")?)
            .await?,
        b"echo"
    );
    assert_eq!(counting.counts().of("read_bytes"), 2);
    Ok(())
}

/// An edit shows at the next snapshot: a new size, a new time, a file added or removed.
#[tokio::test]
async fn an_edit_shows_at_the_next_snapshot() -> TestResult {
    let dir = tempfile::tempdir()?;
    seed(dir.path())?;
    let (ws, _) = workspace(dir.path())?;
    let cache = SnapshotCache::default();
    let _ = WorkspaceSnapshot::take(&ws, &cache, 1).await;
    // Same size, another time (dated ahead of the clock: racy, so also read again next
    // time, however long the steps take).
    std::fs::write(dir.path().join("AGENTS.md"), "You are CAREFUL.\n")?;
    std::fs::File::options()
        .write(true)
        .open(dir.path().join("AGENTS.md"))?
        .set_modified(SystemTime::now() + Duration::from_millis(10_000_123))?;
    put(dir.path(), "skills/new/SKILL.md", "new")?;
    std::fs::remove_file(dir.path().join("subagents/a.md"))?;
    let snap = WorkspaceSnapshot::take(&ws, &cache, 2).await;
    let view = snap.workspace().files().clone();
    assert_eq!(
        view.read_bytes(&FsPath::parse("AGENTS.md")?).await?,
        b"You are CAREFUL.\n"
    );
    assert_eq!(
        view.read_bytes(&FsPath::parse("skills/new/SKILL.md")?)
            .await?,
        b"new"
    );
    assert!(view.list(&FsPath::parse("subagents")?).await?.is_empty());
    assert_eq!(snap.reads(), 2);
    // Racy: the just-written AGENTS.md is read again, the rest is not.
    let again = WorkspaceSnapshot::take(&ws, &cache, 3).await;
    assert_eq!(again.reads(), 1);
    Ok(())
}

/// Sandbox mode: the host template's top level joins the snapshot (one `list`, its
/// `tools.json` read once and then served from the cache), and reads through
/// [`WorkspaceSnapshot::host`] get the host's file, not the caller's.
#[tokio::test]
async fn the_sandbox_host_is_probed_once_and_read_when_changed() -> TestResult {
    let caller = tempfile::tempdir()?;
    let host_dir = tempfile::tempdir()?;
    put(caller.path(), "tools.json", r#"{"allow": ["everything"]}"#)?;
    put(host_dir.path(), "tools.json", r#"{"deny": ["execute"]}"#)?;
    put(host_dir.path(), "skills/s0/SKILL.md", "not probed")?;
    let (ws, _) = workspace(caller.path())?;
    let host_count = CountingFs::new(Arc::new(LocalFs::new(host_dir.path())?));
    let host: Arc<dyn Filesystem> = Arc::new(host_count.clone());
    let cache = SnapshotCache::default();
    let tools = FsPath::parse("tools.json")?;
    for step in 1..=2 {
        host_count.reset();
        let snap = WorkspaceSnapshot::take(&ws, &cache, step)
            .await
            .with_host(&host, &cache, "k")
            .await;
        let view = snap.host().ok_or("no host view")?;
        assert_eq!(
            view.read_bytes(&tools).await?,
            br#"{"deny": ["execute"]}"#.to_vec()
        );
        // One listing of the host's top level; its tools.json read at the first step only.
        let counts = host_count.counts();
        assert_eq!(counts.of("list_many"), 1, "{:?}", counts.ops);
        assert_eq!(counts.of("list") + counts.of("glob"), 0, "{:?}", counts.ops);
        assert_eq!(
            counts.of("read_bytes"),
            u64::from(step == 1),
            "{:?}",
            counts.ops
        );
        assert!(snap.file(SnapshotRoot::Host, "tools.json").is_some());
    }
    Ok(())
}

/// The racy window follows the time's precision: a file dated with nanoseconds a second
/// ago is trusted at the next step (its filesystem's clock steps by a tick, far less than
/// a second); one dated on a whole second (object storage, FAT) less than two seconds ago is
/// read again; one dated ahead of the clock always.
#[tokio::test]
async fn the_racy_window_follows_the_times_precision() -> TestResult {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_secs();
    let at = |secs: u64, nanos: u32| SystemTime::UNIX_EPOCH + Duration::new(secs, nanos);
    for (when, reads_again) in [
        (at(now - 1, 123_457), 0),
        (at(now, 0), 1),
        (at(now + 10, 123_457), 1),
        (at(now - 60, 0), 0),
    ] {
        let dir = tempfile::tempdir()?;
        seed(dir.path())?;
        std::fs::File::options()
            .write(true)
            .open(dir.path().join("AGENTS.md"))?
            .set_modified(when)?;
        let (ws, _) = workspace(dir.path())?;
        let cache = SnapshotCache::default();
        let first = WorkspaceSnapshot::take(&ws, &cache, 1).await;
        assert!(first.reads() >= 1, "{when:?}");
        let next = WorkspaceSnapshot::take(&ws, &cache, 2).await;
        assert_eq!(next.reads(), reads_again, "{when:?}");
    }
    let dated = |nanos| DateTime::from_timestamp(1_700_000_000, nanos).unwrap_or_default();
    assert_eq!(racy_window(dated(5_000_000)), RACY_WINDOW);
    assert_eq!(racy_window(dated(5_000_001)), RACY_WINDOW_FINE);
    Ok(())
}
