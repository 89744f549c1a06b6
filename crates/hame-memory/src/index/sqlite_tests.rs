use super::*;
use crate::index::{conformance, parse_query};
use pretty_assertions::assert_eq;

#[tokio::test]
async fn conformance_in_memory() -> Result<()> {
    conformance::run_all(&SqliteIndex::open_in_memory()?).await
}

#[tokio::test]
async fn conformance_on_disk_through_arc_dyn() -> Result<()> {
    let dir = tempdir()?;
    let index: Arc<dyn SearchIndex> = Arc::new(SqliteIndex::open(dir.path().join("idx.db")).await?);
    conformance::run_all(&index).await
}

fn tempdir() -> Result<tempfile::TempDir> {
    tempfile::tempdir().map_err(|e| Error::index("tempdir", e))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::index("read", e))
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| Error::index("write", e))
}

/// Runs `batch` on the database file at `path` (created if missing) with a plain
/// connection, as another program would; the connection is returned still open.
fn run_sql(path: &Path, batch: &str) -> Result<Connection> {
    let c = Connection::open(path).map_err(sql("open"))?;
    c.execute_batch(batch).map_err(sql("run batch"))?;
    Ok(c)
}

/// Opening `path` creates a fresh, usable, marked index.
async fn opens_as_fresh_index(path: &Path) -> Result<()> {
    let idx = SqliteIndex::open(path).await?;
    assert!(idx.was_rebuilt(), "{}", path.display());
    assert!(idx.documents("t").await?.is_empty());
    idx.upsert_document("t", "a.md", "works\n").await?;
    drop(idx);
    assert_eq!(marks(path)?, (SQLITE_APPLICATION_ID, SQLITE_SCHEMA_VERSION));
    Ok(())
}

/// The names in a directory, sorted (to see that no `-wal`/`-shm`/`-journal` was left).
fn listing(dir: &Path) -> Result<Vec<String>> {
    let mut names = std::fs::read_dir(dir)
        .map_err(|e| Error::index("read_dir", e))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| Error::index("read_dir", e))?;
    names.sort();
    Ok(names)
}

/// `PRAGMA application_id` and `user_version` of a database file.
fn marks(path: &Path) -> Result<(i32, i64)> {
    let c = run_sql(path, "")?;
    let id = c
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(sql("application_id"))?;
    let v = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sql("user_version"))?;
    Ok((id, v))
}

/// Opening `path` fails, and the file and its directory are exactly as before.
async fn refused_untouched(path: &Path) -> Result<Error> {
    let dir = path
        .parent()
        .ok_or_else(|| Error::InvalidInput("no parent".into()))?;
    let (before, files_before) = (read(path)?, listing(dir)?);
    let err = match SqliteIndex::open(path).await {
        Ok(_) => panic!("{} was opened as an index", path.display()),
        Err(e) => e,
    };
    assert_eq!(read(path)?, before, "the file changed");
    assert_eq!(listing(dir)?, files_before, "files were added or removed");
    Ok(err)
}

#[tokio::test]
async fn persists_and_reports_rebuilds() -> Result<()> {
    let dir = tempdir()?;
    let path = dir.path().join("sub/dir/index.db");
    {
        let idx = SqliteIndex::open(&path).await?;
        assert!(idx.was_rebuilt(), "a new file counts as rebuilt");
        idx.upsert_document("t", "a.md", "persisted fact\n").await?;
    }
    assert_eq!(
        marks(&path)?,
        (SQLITE_APPLICATION_ID, SQLITE_SCHEMA_VERSION)
    );
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

#[cfg(unix)]
#[tokio::test]
async fn files_and_directories_are_private() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| -> Result<u32> {
        Ok(std::fs::metadata(p)
            .map_err(|e| Error::index("metadata", e))?
            .permissions()
            .mode()
            & 0o777)
    };
    let dir = tempdir()?;
    let path = dir.path().join("a/b/index.db");
    let idx = SqliteIndex::open(&path).await?;
    idx.upsert_document("t", "a.md", "secret fact\n").await?;
    assert_eq!(mode(&path)?, 0o600);
    let wal = dir.path().join("a/b/index.db-wal");
    assert!(wal.exists(), "WAL mode with an open connection");
    assert_eq!(mode(&wal)?, 0o600);
    assert_eq!(mode(&dir.path().join("a/b/index.db-shm"))?, 0o600);
    assert_eq!(mode(&dir.path().join("a/b"))?, 0o700);
    assert_eq!(mode(&dir.path().join("a"))?, 0o700);
    // A rebuilt index is private as well.
    drop(idx);
    run_sql(&path, "PRAGMA user_version = 1;")?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| Error::index("chmod", e))?;
    assert!(SqliteIndex::open(&path).await?.was_rebuilt());
    assert_eq!(mode(&path)?, 0o600);
    Ok(())
}

#[tokio::test]
async fn empty_files_and_empty_databases_become_indexes() -> Result<()> {
    let dir = tempdir()?;
    let empty = dir.path().join("empty.db");
    write(&empty, b"")?;
    let blank = dir.path().join("blank.db");
    run_sql(&blank, "PRAGMA page_size = 4096; VACUUM;")?;
    assert!(
        read(&blank)?.starts_with(SQLITE_MAGIC),
        "a header was written"
    );
    opens_as_fresh_index(&empty).await?;
    opens_as_fresh_index(&blank).await
}

#[tokio::test]
async fn a_text_file_is_refused_and_left_byte_identical() -> Result<()> {
    let dir = tempdir()?;
    let path = dir.path().join("index.db");
    write(&path, b"my notes, not a database\nsecond line\n")?;
    let err = refused_untouched(&path).await?;
    assert!(
        matches!(&err, Error::NotAnIndex { path: p, reason }
            if p == &path && reason == "not a SQLite database"),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("will not overwrite"), "{message}");
    assert!(!err.is_retryable());
    // Shorter than a SQLite header, and a header cut short.
    for bytes in [&b"x"[..], b"SQLite format 3\0 and then nothing"] {
        write(&path, bytes)?;
        let err = refused_untouched(&path).await?;
        assert!(matches!(err, Error::NotAnIndex { .. }), "{err:?}");
    }
    Ok(())
}

#[tokio::test]
async fn another_applications_database_is_refused_and_left_byte_identical() -> Result<()> {
    let dir = tempdir()?;
    // Rollback journal, like most applications' databases.
    let plain = dir.path().join("app.db");
    run_sql(
        &plain,
        "CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT); \
         INSERT INTO customers(name) VALUES ('alice'), ('bob'); \
         PRAGMA user_version = 7;",
    )?;
    let err = refused_untouched(&plain).await?;
    assert!(
        matches!(&err, Error::NotAnIndex { path, .. } if path == &plain),
        "{err:?}"
    );
    let rows: i64 = run_sql(&plain, "")?
        .query_row("SELECT count(*) FROM customers", [], |r| r.get(0))
        .map_err(sql("count"))?;
    assert_eq!(rows, 2);

    // In WAL mode, with another application id, and one with hame's table names but no
    // application id and another user_version.
    for (name, setup) in [
        (
            "wal.db",
            "PRAGMA journal_mode = WAL; CREATE TABLE t(x); INSERT INTO t VALUES (1);",
        ),
        (
            "we?ird #name%20 é.db",
            "CREATE TABLE t(x); INSERT INTO t VALUES (1);",
        ),
        (
            "other-id.db",
            "PRAGMA application_id = 1234; CREATE TABLE t(x); INSERT INTO t VALUES (1);",
        ),
        (
            "lookalike.db",
            "CREATE TABLE docs(x); CREATE TABLE lines(y); INSERT INTO docs VALUES (1); \
             PRAGMA user_version = 2;",
        ),
        (
            "lookalike-v1.db",
            "CREATE TABLE docs(x); CREATE TABLE lines(y); CREATE TABLE lines_fts(z); \
             CREATE TABLE lines_tri(z); CREATE TABLE invoices(n); PRAGMA user_version = 1;",
        ),
    ] {
        let path = dir.path().join(name);
        run_sql(&path, setup)?;
        let err = refused_untouched(&path).await?;
        assert!(matches!(err, Error::NotAnIndex { .. }), "{name}: {err:?}");
    }

    // In use by the other application right now, with its write-ahead log.
    let busy = dir.path().join("busy.db");
    let other = run_sql(
        &busy,
        "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0; CREATE TABLE t(x); \
         INSERT INTO t VALUES (1), (2);",
    )?;
    assert!(dir.path().join("busy.db-wal").exists());
    let err = refused_untouched(&busy).await?;
    assert!(matches!(err, Error::NotAnIndex { .. }), "{err:?}");
    let rows: i64 = other
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .map_err(sql("count"))?;
    assert_eq!(rows, 2);
    Ok(())
}

#[tokio::test]
async fn a_newer_format_is_refused_and_left_byte_identical() -> Result<()> {
    let dir = tempdir()?;
    let bump = format!(
        "PRAGMA wal_autocheckpoint = 0; PRAGMA user_version = {};",
        SQLITE_SCHEMA_VERSION + 1
    );
    let path = dir.path().join("index.db");
    {
        let idx = SqliteIndex::open(&path).await?;
        idx.upsert_document("t", "a.md", "from the future\n")
            .await?;
    }
    run_sql(&path, &bump)?;
    let err = refused_untouched(&path).await?;
    assert!(
        matches!(
            &err,
            Error::IndexTooNew { path: p, found, supported }
                if p == &path
                    && *found == SQLITE_SCHEMA_VERSION + 1
                    && *supported == SQLITE_SCHEMA_VERSION
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("newer"), "{err}");

    // The newer format only in the write-ahead log of an index still open elsewhere.
    let path = dir.path().join("open.db");
    let idx = SqliteIndex::open(&path).await?;
    let bump = bump.clone();
    idx.with_conn(move |c| c.execute_batch(&bump).map_err(sql("bump")))
        .await?;
    let err = refused_untouched(&path).await?;
    assert!(matches!(err, Error::IndexTooNew { .. }), "{err:?}");
    drop(idx);
    Ok(())
}

#[tokio::test]
async fn an_older_hame_format_is_rebuilt() -> Result<()> {
    let dir = tempdir()?;
    // Format 1: the same tables, user_version 1, no application id.
    let v1 = dir.path().join("v1.db");
    run_sql(
        &v1,
        &format!(
            "PRAGMA journal_mode = WAL; {SCHEMA} PRAGMA user_version = 1; \
             INSERT INTO lines(tenant, path, line, content, cjk) \
             VALUES ('t', 'old.md', 1, 'stale', 0); \
             INSERT INTO docs VALUES ('t', 'old.md', 'h');"
        ),
    )?;
    // A marked index of an older format.
    let marked = dir.path().join("marked.db");
    SqliteIndex::open(&marked)
        .await?
        .upsert_document("t", "old.md", "stale\n")
        .await?;
    run_sql(&marked, "PRAGMA user_version = 1;")?;
    opens_as_fresh_index(&v1).await?;
    opens_as_fresh_index(&marked).await
}

#[tokio::test]
async fn damaged_pages_are_detected() -> Result<()> {
    let dir = tempdir()?;
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
    let mut bytes = read(&path)?;
    let len = bytes.len();
    assert!(len > 16 * 4096);
    // Overwrite a stretch of pages after the first one with garbage.
    for b in &mut bytes[8192..len - 4096] {
        *b = 0xA5;
    }
    write(&path, &bytes)?;
    opens_as_fresh_index(&path).await
}

#[tokio::test]
async fn a_directory_is_not_an_index() -> Result<()> {
    let dir = tempdir()?;
    let err = match SqliteIndex::open(dir.path()).await {
        Ok(_) => panic!("a directory was opened"),
        Err(e) => e,
    };
    assert!(matches!(err, Error::NotAnIndex { .. }), "{err:?}");
    Ok(())
}

#[test]
fn classify_decides_from_the_marks() {
    let names = |v: &[&str]| -> Vec<String> { v.iter().map(|s| (*s).to_owned()).collect() };
    let v1 = names(&[
        "docs",
        "lines",
        "lines_by_doc",
        "lines_fts",
        "lines_fts_data",
        "lines_fts_idx",
        "lines_fts_docsize",
        "lines_fts_config",
        "lines_tri",
        "lines_tri_data",
        "lines_tri_idx",
        "lines_tri_docsize",
        "lines_tri_config",
        "lines_ai",
        "lines_ai_cjk",
        "lines_ad",
        "lines_ad_cjk",
        "sqlite_stat1",
    ]);
    assert_eq!(
        classify(SQLITE_APPLICATION_ID, SQLITE_SCHEMA_VERSION, &v1),
        Kind::Current
    );
    assert_eq!(
        classify(
            SQLITE_APPLICATION_ID,
            SQLITE_SCHEMA_VERSION,
            &names(&["docs"])
        ),
        Kind::Older("tables missing".into())
    );
    assert_eq!(
        classify(SQLITE_APPLICATION_ID, SQLITE_SCHEMA_VERSION + 5, &v1),
        Kind::Newer(SQLITE_SCHEMA_VERSION + 5)
    );
    assert_eq!(
        classify(SQLITE_APPLICATION_ID, 1, &v1),
        Kind::Older("format 1".into())
    );
    assert_eq!(classify(0, 1, &v1), Kind::Older("format 1".into()));
    assert_eq!(classify(0, 0, &[]), Kind::Empty);
    for (id, version, objects) in [
        (0, 0, names(&["t"])),
        (0, 3, Vec::new()),
        (0, 0, v1.clone()),
        (0, 2, v1.clone()),
        (7, 0, Vec::new()),
        (7, SQLITE_SCHEMA_VERSION, v1.clone()),
        (0, 1, [v1.clone(), names(&["invoices"])].concat()),
        (0, 1, names(&["docs", "lines"])),
    ] {
        assert!(
            matches!(classify(id, version, &objects), Kind::Foreign(_)),
            "{id} {version} {objects:?}"
        );
    }
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
