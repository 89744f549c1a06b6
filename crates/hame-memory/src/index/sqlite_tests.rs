use super::*;
use crate::index::conformance;
use pretty_assertions::assert_eq;

#[tokio::test]
async fn conformance_in_memory() -> Result<()> {
    conformance::run_all(&SqliteIndex::open_in_memory()?).await
}

#[tokio::test]
async fn conformance_on_disk_through_arc_dyn() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::index("tempdir", e))?;
    let index: Arc<dyn SearchIndex> = Arc::new(SqliteIndex::open(dir.path().join("idx.db")).await?);
    conformance::run_all(&index).await
}

#[tokio::test]
async fn persists_and_reports_rebuilds() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::index("tempdir", e))?;
    let path = dir.path().join("sub/dir/index.db");
    {
        let idx = SqliteIndex::open(&path).await?;
        assert!(idx.was_rebuilt(), "a new file counts as rebuilt");
        idx.upsert_document("t", "a.md", "persisted fact\n").await?;
    }
    let idx = SqliteIndex::open(&path).await?;
    assert!(!idx.was_rebuilt());
    let hits = idx
        .search("t", "persisted", &SearchOptions::default())
        .await?;
    assert_eq!(hits.len(), 1);
    assert_eq!(
        idx.upsert_document("t", "a.md", "persisted fact\n").await?,
        UpsertOutcome::Unchanged
    );
    Ok(())
}

#[tokio::test]
async fn corrupt_file_is_deleted_and_recreated() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::index("tempdir", e))?;
    let path = dir.path().join("index.db");
    std::fs::write(
        &path,
        b"this is not a sqlite database at all, just garbage bytes",
    )
    .map_err(|e| Error::index("write", e))?;
    let idx = SqliteIndex::open(&path).await?;
    assert!(idx.was_rebuilt());
    idx.upsert_document("t", "a.md", "fresh start\n").await?;
    assert_eq!(
        idx.search("t", "fresh", &SearchOptions::default())
            .await?
            .len(),
        1
    );
    Ok(())
}

#[tokio::test]
async fn damaged_pages_are_detected() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::index("tempdir", e))?;
    let path = dir.path().join("index.db");
    {
        let idx = SqliteIndex::open(&path).await?;
        let doc: String = (0..2000).map(|i| format!("fact number {i}\n")).collect();
        idx.upsert_document("t", "a.md", &doc).await?;
        // Checkpoint the WAL into the main file so the damage below hits real pages.
        idx.with_conn(|c| {
            c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .map_err(sql("checkpoint"))
        })
        .await?;
    }
    let mut bytes = std::fs::read(&path).map_err(|e| Error::index("read", e))?;
    let len = bytes.len();
    assert!(len > 16 * 4096);
    // Overwrite a stretch of pages after the first one with garbage.
    for b in &mut bytes[8192..len - 4096] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).map_err(|e| Error::index("write", e))?;
    let idx = SqliteIndex::open(&path).await?;
    assert!(idx.was_rebuilt());
    assert!(idx.documents("t").await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn other_schema_version_is_rebuilt() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::index("tempdir", e))?;
    let path = dir.path().join("index.db");
    {
        let c = Connection::open(&path).map_err(sql("open"))?;
        c.execute_batch("CREATE TABLE foreign_thing(x); PRAGMA user_version = 99;")
            .map_err(sql("setup"))?;
    }
    let idx = SqliteIndex::open(&path).await?;
    assert!(idx.was_rebuilt());
    idx.upsert_document("t", "a.md", "works\n").await?;
    Ok(())
}

#[tokio::test]
async fn concurrent_writers_and_readers() -> Result<()> {
    let idx = SqliteIndex::open_in_memory()?;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let idx = idx.clone();
        tasks.push(tokio::spawn(async move {
            let tenant = format!("t{}", i % 2);
            idx.upsert_document(&tenant, &format!("f{i}.md"), &format!("shared word {i}\n"))
                .await?;
            idx.search(&tenant, "shared", &SearchOptions::default())
                .await
        }));
    }
    for t in tasks {
        t.await.map_err(|e| Error::index("join", e))??;
    }
    let hits = idx
        .search("t0", "shared", &SearchOptions::limit(100))
        .await?;
    assert_eq!(hits.len(), 4);
    Ok(())
}

#[test]
fn match_expression_quotes_everything() -> std::result::Result<(), String> {
    let q = parse_query("say \"hi\" foo* NEAR").ok_or("no query")?;
    assert_eq!(
        match_expr(&q, false),
        "\"say\" AND \"hi\" AND \"foo\" * AND \"near\""
    );
    Ok(())
}
