//! [`SqliteIndex`]: the default [`SearchIndex`], on SQLite FTS5 through rusqlite.
//!
//! Layout (schema version [`SCHEMA_VERSION`] in `PRAGMA user_version`):
//! - `docs(tenant, path, hash)`: one row per document, for the incremental skip.
//! - `lines(id, tenant, path, line, content, cjk)`: one row per non-blank line.
//! - `lines_fts`: FTS5 over `lines` with the `unicode61` tokenizer (words, BM25, prefixes).
//! - `lines_tri`: FTS5 over the lines that contain CJK text with the `trigram` tokenizer.
//!
//! Both FTS tables are external-content tables kept in step by triggers. Every search
//! joins the FTS hits to `lines` and requires `lines.tenant = ?` in the same SQL statement,
//! so ranking, `LIMIT` and the OR fallback only ever see the tenant's rows. (An earlier
//! version also put a per-tenant token into every MATCH; it made a selective query 100×
//! slower on a large index because every search merged the tenant's whole posting list.)

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params, params_from_iter};

use super::memory::{needles, rank, score_row};
use super::{
    DocumentInfo, Hit, Query, QueryMode, SNIPPET_WORDS, SearchIndex, SearchOptions, UpsertOutcome,
    check_tenant, content_hash, highlight, is_cjk, parse_query, split_rows,
};
use crate::error::{Error, Result};

/// Version of the table layout; an index with another version is rebuilt.
pub const SCHEMA_VERSION: i64 = 1;
/// Most candidate rows a short-CJK substring scan reads before ranking.
pub const MAX_SCAN_ROWS: usize = 20_000;

const SCHEMA: &str = r"
CREATE TABLE docs(
  tenant TEXT NOT NULL,
  path TEXT NOT NULL,
  hash TEXT NOT NULL,
  PRIMARY KEY (tenant, path)
) WITHOUT ROWID;
CREATE TABLE lines(
  id INTEGER PRIMARY KEY,
  tenant TEXT NOT NULL,
  path TEXT NOT NULL,
  line INTEGER NOT NULL,
  content TEXT NOT NULL,
  cjk INTEGER NOT NULL
);
CREATE INDEX lines_by_doc ON lines(tenant, path);
CREATE VIRTUAL TABLE lines_fts USING fts5(
  content, content='lines', content_rowid='id',
  tokenize='unicode61 remove_diacritics 2'
);
CREATE VIRTUAL TABLE lines_tri USING fts5(
  content, content='lines', content_rowid='id', tokenize='trigram'
);
CREATE TRIGGER lines_ai AFTER INSERT ON lines BEGIN
  INSERT INTO lines_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER lines_ai_cjk AFTER INSERT ON lines WHEN new.cjk = 1 BEGIN
  INSERT INTO lines_tri(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER lines_ad AFTER DELETE ON lines BEGIN
  INSERT INTO lines_fts(lines_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER lines_ad_cjk AFTER DELETE ON lines WHEN old.cjk = 1 BEGIN
  INSERT INTO lines_tri(lines_tri, rowid, content) VALUES ('delete', old.id, old.content);
END;
";

/// A [`SearchIndex`] in one SQLite database file (or in memory).
///
/// One connection, used from a blocking thread (`spawn_blocking`) under a mutex: SQLite
/// serialises writers anyway, and searches of a memory index take well under a
/// millisecond (see `docs/memory.md`). The file is in WAL mode with `synchronous=NORMAL`:
/// the index is a cache of the workspace files, so a lost last transaction after a power
/// failure costs only a re-index.
///
/// Requires a tokio runtime.
#[derive(Debug, Clone)]
pub struct SqliteIndex {
    conn: Arc<Mutex<Connection>>,
    path: Option<PathBuf>,
    rebuilt: bool,
}

fn sql(what: &'static str) -> impl FnOnce(rusqlite::Error) -> Error {
    move |e| Error::index(what, e)
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(Duration::from_secs(5))?;
    // journal_mode answers with a row, so it is read rather than executed.
    let _mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    conn.execute_batch(
        "PRAGMA synchronous=NORMAL; PRAGMA temp_store=MEMORY; PRAGMA cache_size=-32000;",
    )?;
    Ok(())
}

/// Opens and checks a database, creating the schema when it is new.
fn open_checked(path: Option<&Path>) -> std::result::Result<Connection, String> {
    let conn = match path {
        Some(p) => Connection::open(p),
        None => Connection::open_in_memory(),
    }
    .map_err(|e| format!("open: {e}"))?;
    configure(&conn).map_err(|e| format!("configure: {e}"))?;
    let check: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(|e| format!("quick_check: {e}"))?;
    if check != "ok" {
        return Err(format!("quick_check reported: {check}"));
    }
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| format!("user_version: {e}"))?;
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .map_err(|e| format!("schema: {e}"))?;
    if version == SCHEMA_VERSION {
        return Ok(conn);
    }
    if version != 0 || tables != 0 {
        return Err(format!(
            "schema version {version} (tables: {tables}), expected {SCHEMA_VERSION}"
        ));
    }
    conn.execute_batch(&format!(
        "BEGIN; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
    ))
    .map_err(|e| format!("create schema: {e}"))?;
    Ok(conn)
}

fn remove_db_files(path: &Path) -> std::io::Result<()> {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        match std::fs::remove_file(PathBuf::from(p)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The MATCH expression for a parsed query; `any` joins terms with OR instead of AND.
fn match_expr(query: &Query, any: bool) -> String {
    let join = if any { " OR " } else { " AND " };
    let terms: Vec<String> = query
        .terms
        .iter()
        .map(|t| match query.mode {
            QueryMode::Words => {
                let phrase = t.words.join(" ");
                if t.prefix {
                    format!("\"{phrase}\" *")
                } else {
                    format!("\"{phrase}\"")
                }
            }
            _ => format!("\"{}\"", t.text.replace('"', "")),
        })
        .collect();
    terms.join(join)
}

/// `substr(path, 1, n) = prefix` arguments: (prefix, length in characters).
fn prefix_args(options: &SearchOptions) -> (Option<String>, i64) {
    match &options.path_prefix {
        Some(p) if !p.is_empty() => (
            Some(p.clone()),
            i64::try_from(p.chars().count()).unwrap_or(i64::MAX),
        ),
        _ => (None, 0),
    }
}

fn fts_search(
    conn: &Connection,
    tenant: &str,
    query: &Query,
    options: &SearchOptions,
    any: bool,
) -> Result<Vec<Hit>> {
    let table = if query.mode == QueryMode::Words {
        "lines_fts"
    } else {
        "lines_tri"
    };
    // CROSS JOIN keeps the FTS table as the outer loop: otherwise the planner may walk the
    // tenant's rows by index and run the full-text query once per row.
    let sql_text = format!(
        "SELECT l.path, l.line, snippet({table}, 0, '**', '**', '…', {SNIPPET_WORDS}), \
         bm25({table}) AS r \
         FROM {table} CROSS JOIN lines l ON l.id = {table}.rowid \
         WHERE {table} MATCH ?1 AND l.tenant = ?2 \
           AND (?3 IS NULL OR substr(l.path, 1, ?4) = ?3) \
         ORDER BY r, l.path, l.line LIMIT ?5"
    );
    let (prefix, prefix_len) = prefix_args(options);
    let limit = i64::try_from(options.effective_limit()).unwrap_or(i64::MAX);
    let mut stmt = conn
        .prepare_cached(&sql_text)
        .map_err(sql("prepare search"))?;
    let rows = stmt
        .query_map(
            params![match_expr(query, any), tenant, prefix, prefix_len, limit],
            |r| {
                Ok(Hit {
                    path: r.get(0)?,
                    line: r.get(1)?,
                    snippet: r.get(2)?,
                    score: -r.get::<_, f64>(3)?,
                })
            },
        )
        .map_err(sql("search"))?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .map_err(sql("read search results"))
}

fn like_pattern(text: &str) -> String {
    let mut p = String::with_capacity(text.len() + 2);
    p.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

/// Substring scan for CJK terms shorter than a trigram, restricted to the tenant's CJK rows.
fn scan_search(
    conn: &Connection,
    tenant: &str,
    query: &Query,
    options: &SearchOptions,
) -> Result<Vec<Hit>> {
    let (prefix, prefix_len) = prefix_args(options);
    let likes: Vec<String> = (0..query.terms.len())
        .map(|i| format!("content LIKE ?{} ESCAPE '\\'", i + 5))
        .collect();
    let sql_text = format!(
        "SELECT path, line, content FROM lines \
         WHERE tenant = ?1 AND cjk = 1 AND (?2 IS NULL OR substr(path, 1, ?3) = ?2) \
           AND ({}) LIMIT ?4",
        likes.join(" OR ")
    );
    let mut args: Vec<rusqlite::types::Value> = vec![
        tenant.to_owned().into(),
        prefix.map_or(rusqlite::types::Value::Null, Into::into),
        prefix_len.into(),
        i64::try_from(MAX_SCAN_ROWS).unwrap_or(i64::MAX).into(),
    ];
    args.extend(query.terms.iter().map(|t| like_pattern(&t.text).into()));
    let mut stmt = conn.prepare(&sql_text).map_err(sql("prepare scan"))?;
    let rows = stmt
        .query_map(params_from_iter(args), |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, u32>(1)?,
                r.get::<_, String>(2)?,
            ))
        })
        .map_err(sql("scan"))?;
    let needles = needles(query);
    let mut all = Vec::new();
    let mut any = Vec::new();
    for row in rows {
        let (path, line, content) = row.map_err(sql("read scan results"))?;
        let (matched, score) = score_row(&content, query);
        if matched == 0 {
            continue;
        }
        let hit = Hit {
            path,
            line,
            snippet: highlight(&content, &needles),
            score,
        };
        if matched == query.terms.len() {
            all.push(hit);
        } else {
            any.push(hit);
        }
    }
    Ok(rank(
        if all.is_empty() { any } else { all },
        options.effective_limit(),
    ))
}

impl SqliteIndex {
    /// Opens (or creates) the index file at `path`.
    ///
    /// When the file is unreadable, fails `PRAGMA quick_check` or has another schema
    /// version, it is deleted (with its `-wal`/`-shm` files) and created empty;
    /// [`SqliteIndex::was_rebuilt`] then returns `true` and the caller must feed every file
    /// again. Missing parent directories are created.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let p = path.clone();
        let (conn, rebuilt) = tokio::task::spawn_blocking(move || -> Result<(Connection, bool)> {
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| Error::index("create directory", e))?;
            }
            let existed = p.exists();
            match open_checked(Some(&p)) {
                Ok(c) => Ok((c, !existed)),
                Err(reason) => {
                    tracing::warn!(path = %p.display(), %reason, "search index unusable; rebuilding it");
                    remove_db_files(&p).map_err(|e| Error::index("delete corrupt index", e))?;
                    let c = open_checked(Some(&p)).map_err(|m| Error::Index {
                        message: format!("recreate index: {m}"),
                        source: None,
                    })?;
                    Ok((c, true))
                }
            }
        })
        .await
        .map_err(|e| Error::index("open task failed", e))??;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            path: Some(path),
            rebuilt,
        })
    }

    /// An index in memory (lost when dropped).
    pub fn open_in_memory() -> Result<Self> {
        let conn = open_checked(None).map_err(|m| Error::Index {
            message: m,
            source: None,
        })?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            path: None,
            rebuilt: true,
        })
    }

    /// Whether the index was created empty by [`SqliteIndex::open`] (new, corrupt or of
    /// another version): every file must then be fed again.
    pub fn was_rebuilt(&self) -> bool {
        self.rebuilt
    }

    /// The database file, `None` in memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    async fn with_conn<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut guard)
        })
        .await
        .map_err(|e| Error::index("index task failed", e))?
    }
}

#[async_trait]
impl SearchIndex for SqliteIndex {
    async fn upsert_document(
        &self,
        tenant: &str,
        path: &str,
        content: &str,
    ) -> Result<UpsertOutcome> {
        check_tenant(tenant)?;
        let hash = content_hash(content);
        let rows = split_rows(content);
        let (tenant, path) = (tenant.to_owned(), path.to_owned());
        self.with_conn(move |conn| {
            let old: Option<String> = conn
                .query_row(
                    "SELECT hash FROM docs WHERE tenant = ?1 AND path = ?2",
                    params![tenant, path],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql("read document hash"))?;
            if old.as_deref() == Some(hash.as_str()) {
                return Ok(UpsertOutcome::Unchanged);
            }
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sql("begin"))?;
            tx.execute(
                "DELETE FROM lines WHERE tenant = ?1 AND path = ?2",
                params![tenant, path],
            )
            .map_err(sql("delete old rows"))?;
            {
                let mut ins = tx
                    .prepare_cached(
                        "INSERT INTO lines(tenant, path, line, content, cjk) \
                         VALUES (?1, ?2, ?3, ?4, ?5)",
                    )
                    .map_err(sql("prepare insert"))?;
                for row in &rows {
                    let cjk = row.text.chars().any(is_cjk);
                    ins.execute(params![tenant, path, row.line, row.text, cjk])
                        .map_err(sql("insert row"))?;
                }
            }
            tx.execute(
                "INSERT INTO docs(tenant, path, hash) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(tenant, path) DO UPDATE SET hash = excluded.hash",
                params![tenant, path, hash],
            )
            .map_err(sql("write document hash"))?;
            tx.commit().map_err(sql("commit"))?;
            Ok(UpsertOutcome::Indexed { rows: rows.len() })
        })
        .await
    }

    async fn remove_document(&self, tenant: &str, path: &str) -> Result<bool> {
        check_tenant(tenant)?;
        let (tenant, path) = (tenant.to_owned(), path.to_owned());
        self.with_conn(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sql("begin"))?;
            tx.execute(
                "DELETE FROM lines WHERE tenant = ?1 AND path = ?2",
                params![tenant, path],
            )
            .map_err(sql("delete rows"))?;
            let n = tx
                .execute(
                    "DELETE FROM docs WHERE tenant = ?1 AND path = ?2",
                    params![tenant, path],
                )
                .map_err(sql("delete document"))?;
            tx.commit().map_err(sql("commit"))?;
            Ok(n > 0)
        })
        .await
    }

    async fn search(&self, tenant: &str, query: &str, options: &SearchOptions) -> Result<Vec<Hit>> {
        check_tenant(tenant)?;
        let Some(query) = parse_query(query) else {
            return Ok(Vec::new());
        };
        if options.effective_limit() == 0 {
            return Ok(Vec::new());
        }
        let tenant = tenant.to_owned();
        let options = options.clone();
        self.with_conn(move |conn| {
            if query.mode == QueryMode::Scan {
                return scan_search(conn, &tenant, &query, &options);
            }
            let hits = fts_search(conn, &tenant, &query, &options, false)?;
            if hits.is_empty() && query.terms.len() > 1 {
                return fts_search(conn, &tenant, &query, &options, true);
            }
            Ok(hits)
        })
        .await
    }

    async fn documents(&self, tenant: &str) -> Result<Vec<DocumentInfo>> {
        check_tenant(tenant)?;
        let tenant = tenant.to_owned();
        self.with_conn(move |conn| {
            let mut stmt = conn
                .prepare_cached("SELECT path, hash FROM docs WHERE tenant = ?1 ORDER BY path")
                .map_err(sql("prepare documents"))?;
            let rows = stmt
                .query_map(params![tenant], |r| {
                    Ok(DocumentInfo {
                        path: r.get(0)?,
                        hash: r.get(1)?,
                    })
                })
                .map_err(sql("documents"))?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
                .map_err(sql("read documents"))
        })
        .await
    }
}

#[cfg(test)]
#[path = "sqlite_tests.rs"]
mod tests;
