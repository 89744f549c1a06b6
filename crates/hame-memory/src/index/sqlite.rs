//! [`SqliteIndex`]: the default [`SearchIndex`], on SQLite FTS5 through rusqlite.
//!
//! The file is marked as hame's with `PRAGMA application_id` ([`SQLITE_APPLICATION_ID`])
//! and its format in `PRAGMA user_version` ([`SQLITE_SCHEMA_VERSION`]);
//! [`SqliteIndex::open`] never changes a file without the mark. Layout:
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

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{
    Connection, OpenFlags, OptionalExtension, TransactionBehavior, params, params_from_iter,
};

use super::scoring::rank_rows;
use super::{
    Document, DocumentInfo, Hit, Query, QueryMode, SNIPPET_WORDS, SearchIndex, SearchOptions,
    UpsertOutcome, check_tenant, content_hash, is_cjk, prepare_search, split_rows,
};
use crate::error::{Error, Result};

/// `PRAGMA application_id` of every index file this crate creates (`HAME` in ASCII). A
/// SQLite database without it is another application's and is never changed.
pub const SQLITE_APPLICATION_ID: i32 = 0x4841_4D45;
/// Format of the index file, in `PRAGMA user_version`. Format 1 had no application id;
/// format 2 is format 1 marked with [`SQLITE_APPLICATION_ID`]. A hame index of an older
/// format is rebuilt; one of a newer format is refused ([`Error::IndexTooNew`]).
pub const SQLITE_SCHEMA_VERSION: i64 = 2;
/// Format 1, written before the application id: recognised by its table names.
const LEGACY_SCHEMA_VERSION: i64 = 1;
/// The first 16 bytes of every SQLite database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";
/// The tables every format has (the rest are FTS5 shadow tables, an index and triggers).
const REQUIRED_TABLES: [&str; 4] = ["docs", "lines", "lines_fts", "lines_tri"];
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

/// What an existing database file is, from its application id, `user_version` and the
/// names in `sqlite_master` (pure, see [`classify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// A hame index of this format.
    Current,
    /// No schema, no version, no application id: nothing to lose, the schema is created.
    Empty,
    /// A hame index of an older format (or one with tables missing): rebuilt.
    Older(String),
    /// A hame index of a newer format: refused.
    Newer(i64),
    /// Not a hame index: refused, never changed.
    Foreign(String),
}

fn has_required_tables(names: &[String]) -> bool {
    REQUIRED_TABLES.iter().all(|t| names.iter().any(|n| n == t))
}

/// Whether every schema object is one format 1 of this crate created (and the main tables
/// are there): format 1 wrote no application id, so its layout is its mark.
fn is_legacy_layout(names: &[String]) -> bool {
    const OTHERS: [&str; 5] = [
        "lines_by_doc",
        "lines_ai",
        "lines_ai_cjk",
        "lines_ad",
        "lines_ad_cjk",
    ];
    has_required_tables(names)
        && names.iter().all(|n| {
            REQUIRED_TABLES.contains(&n.as_str())
                || OTHERS.contains(&n.as_str())
                || n.starts_with("lines_fts_")
                || n.starts_with("lines_tri_")
                || n.starts_with("sqlite_")
        })
}

/// Decides what an existing database is (no I/O).
fn classify(application_id: i32, version: i64, names: &[String]) -> Kind {
    if application_id == SQLITE_APPLICATION_ID {
        return match version {
            v if v > SQLITE_SCHEMA_VERSION => Kind::Newer(v),
            v if v < SQLITE_SCHEMA_VERSION => Kind::Older(format!("format {v}")),
            _ if !has_required_tables(names) => Kind::Older("tables missing".into()),
            _ => Kind::Current,
        };
    }
    if application_id != 0 {
        return Kind::Foreign(format!(
            "a SQLite database of another application: application_id {application_id:#010x}"
        ));
    }
    if names.is_empty() && version == 0 {
        return Kind::Empty;
    }
    if version == LEGACY_SCHEMA_VERSION && is_legacy_layout(names) {
        return Kind::Older(format!("format {LEGACY_SCHEMA_VERSION}"));
    }
    Kind::Foreign(format!(
        "a SQLite database without hame's application id (user_version {version}, {} schema \
         objects)",
        names.len()
    ))
}

/// The fields of a SQLite file header that tell whose file it is.
#[derive(Debug, Clone, Copy)]
struct Header {
    application_id: i32,
    user_version: i64,
}

fn not_an_index(path: &Path, reason: impl Into<String>) -> Error {
    Error::NotAnIndex {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Reads the header of an existing file: `None` when the file is empty; `NotAnIndex` when
/// it is not a SQLite database at all.
fn read_header(path: &Path) -> Result<Option<Header>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::index("inspect index file", e))?;
    if !meta.is_file() {
        return Err(not_an_index(path, "not a regular file"));
    }
    let mut file = std::fs::File::open(path).map_err(|e| Error::index("read index file", e))?;
    let mut buf = [0u8; 100];
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::index("read index file", e)),
        }
    }
    if n == 0 {
        return Ok(None);
    }
    if n < SQLITE_MAGIC.len() || buf[..SQLITE_MAGIC.len()] != SQLITE_MAGIC[..] {
        return Err(not_an_index(path, "not a SQLite database"));
    }
    if n < buf.len() {
        return Err(not_an_index(path, "a SQLite header cut short"));
    }
    let be = |at: usize| i32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
    Ok(Some(Header {
        application_id: be(68),
        user_version: i64::from(be(60)),
    }))
}

/// `path` with a suffix (`-wal`, `-shm`, `-journal`).
fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// A `file:` URI for `path` with `immutable=1`: SQLite then reads the file without locks
/// and creates no `-wal`/`-shm` files next to it.
fn immutable_uri(path: &Path) -> String {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = path.to_string_lossy().replace('\\', "/").into_bytes();
    let mut uri = String::from("file:");
    for b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-' | b'~') {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    uri
}

/// Reads the application id, version and schema names without changing anything: through
/// the existing write-ahead log when there is one (it may hold pages the main file does
/// not), else from the main file alone, which is then the whole database.
fn probe(path: &Path) -> rusqlite::Result<(i32, i64, Vec<String>)> {
    let wal = std::fs::metadata(sidecar(path, "-wal")).is_ok_and(|m| m.len() > 0);
    let shm = sidecar(path, "-shm").exists();
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = if wal && shm {
        Connection::open_with_flags(path, flags)?
    } else {
        Connection::open_with_flags(immutable_uri(path), flags | OpenFlags::SQLITE_OPEN_URI)?
    };
    conn.busy_timeout(Duration::from_secs(5))?;
    let application_id: i32 = conn.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let mut stmt = conn.prepare("SELECT name FROM sqlite_master")?;
    let names = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok((application_id, version, names))
}

/// Creates the schema and marks the file as a hame index in one transaction; `false` when
/// the database was no longer empty (another process created it meanwhile).
fn create_schema(conn: &mut Connection) -> rusqlite::Result<bool> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let objects: i64 = tx.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
    let application_id: i32 = tx.query_row("PRAGMA application_id", [], |r| r.get(0))?;
    if objects != 0 || application_id != 0 {
        return Ok(false);
    }
    tx.execute_batch(&format!(
        "{SCHEMA} PRAGMA application_id = {SQLITE_APPLICATION_ID}; \
         PRAGMA user_version = {SQLITE_SCHEMA_VERSION};"
    ))?;
    tx.commit()?;
    Ok(true)
}

/// Opens a hame index of this format read-write and checks it; `Err` with the reason
/// when it is damaged.
fn open_current(path: &Path) -> std::result::Result<Connection, String> {
    let conn = Connection::open(path).map_err(|e| format!("open: {e}"))?;
    configure(&conn).map_err(|e| format!("configure: {e}"))?;
    let check: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(|e| format!("quick_check: {e}"))?;
    if check != "ok" {
        return Err(format!("quick_check reported: {check}"));
    }
    Ok(conn)
}

/// Creates the index in an empty file (the schema first, in rollback-journal mode, so that
/// a crash leaves either an empty file or a whole index; then WAL). `None` when another
/// process created it meanwhile.
fn create_in(path: &Path) -> Result<Option<Connection>> {
    let mut conn = Connection::open(path).map_err(sql("open index"))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(sql("configure index"))?;
    if !create_schema(&mut conn).map_err(sql("create schema"))? {
        return Ok(None);
    }
    configure(&conn).map_err(sql("configure index"))?;
    Ok(Some(conn))
}

/// Creates `dir` and its missing parents, each readable by the owner only.
fn create_private_dirs(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// Creates `path` empty, readable and writable by the owner only (SQLite gives its `-wal`,
/// `-shm` and `-journal` files the same mode). `false` when it already exists.
fn create_private_file(path: &Path) -> std::io::Result<bool> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    match options.open(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes an empty file hame takes over readable and writable by the owner only.
fn restrict_to_owner(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

fn remove_db_files(path: &Path) -> std::io::Result<()> {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        match std::fs::remove_file(sidecar(path, suffix)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Deletes a hame index (with its `-wal`/`-shm`/`-journal` files) and creates it empty.
fn rebuild(path: &Path, reason: &str) -> Result<Connection> {
    tracing::warn!(path = %path.display(), %reason, "search index unusable; rebuilding it");
    remove_db_files(path).map_err(|e| Error::index("delete unusable index", e))?;
    create_private_file(path).map_err(|e| Error::index("create index file", e))?;
    create_in(path)?.ok_or_else(|| Error::Index {
        message: "recreate index: another process wrote the file meanwhile".into(),
        source: None,
    })
}

/// What [`SqliteIndex::open`] does, on a blocking thread: the connection and whether the
/// index was created empty.
fn open_file(path: &Path) -> Result<(Connection, bool)> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_private_dirs(dir).map_err(|e| Error::index("create directory", e))?;
    }
    // A second round only when another process created the index between two steps.
    for _ in 0..2 {
        create_private_file(path).map_err(|e| Error::index("create index file", e))?;
        let header = read_header(path)?;
        let kind = match probe(path) {
            Ok((application_id, version, names)) => classify(application_id, version, &names),
            // Unreadable through SQLite: only the header can still say it is ours.
            Err(e) => match header {
                Some(h) if h.application_id == SQLITE_APPLICATION_ID => {
                    if h.user_version > SQLITE_SCHEMA_VERSION {
                        Kind::Newer(h.user_version)
                    } else {
                        Kind::Older(format!("unreadable: {e}"))
                    }
                }
                _ => Kind::Foreign(format!(
                    "a SQLite database hame cannot read and that has no hame application id: {e}"
                )),
            },
        };
        match kind {
            Kind::Current => {
                return match open_current(path) {
                    Ok(conn) => Ok((conn, false)),
                    Err(reason) => Ok((rebuild(path, &reason)?, true)),
                };
            }
            Kind::Empty => {
                restrict_to_owner(path).map_err(|e| Error::index("set index file mode", e))?;
                if let Some(conn) = create_in(path)? {
                    return Ok((conn, true));
                }
            }
            Kind::Older(reason) => return Ok((rebuild(path, &reason)?, true)),
            Kind::Newer(found) => {
                return Err(Error::IndexTooNew {
                    path: path.to_path_buf(),
                    found,
                    supported: SQLITE_SCHEMA_VERSION,
                });
            }
            Kind::Foreign(reason) => return Err(not_an_index(path, reason)),
        }
    }
    Err(Error::Index {
        message: format!(
            "open `{}`: the file kept changing while it was opened",
            path.display()
        ),
        source: None,
    })
}

/// An index in memory, with the schema.
fn open_memory() -> rusqlite::Result<Connection> {
    let mut conn = Connection::open_in_memory()?;
    create_schema(&mut conn)?;
    configure(&conn)?;
    Ok(conn)
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
    let rows = rows
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(sql("read scan results"))?;
    Ok(rank_rows(rows, query, options.effective_limit()))
}

/// Starts a write transaction and deletes a document's rows in it (the triggers keep both
/// FTS tables in step); its `docs` row is left to the caller.
fn begin_clearing<'c>(
    conn: &'c mut Connection,
    tenant: &str,
    path: &str,
) -> Result<rusqlite::Transaction<'c>> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql("begin"))?;
    tx.execute(
        "DELETE FROM lines WHERE tenant = ?1 AND path = ?2",
        params![tenant, path],
    )
    .map_err(sql("delete rows"))?;
    Ok(tx)
}

impl SqliteIndex {
    /// Opens (or creates) the index file at `path`.
    ///
    /// A missing or empty file is created (mode 0600 on Unix; missing parent directories
    /// 0700) and marked as a hame index with `PRAGMA application_id`
    /// ([`SQLITE_APPLICATION_ID`]) and the format in `user_version`
    /// ([`SQLITE_SCHEMA_VERSION`]).
    ///
    /// A file hame did not create is never changed: one that is not a SQLite database, or
    /// a SQLite database without hame's application id, is refused with
    /// [`Error::NotAnIndex`]. A hame index of a newer format is refused with
    /// [`Error::IndexTooNew`]. A hame index of an older format (format 1 is recognised by
    /// its tables), or one that fails `PRAGMA quick_check`, is deleted (with its
    /// `-wal`/`-shm` files) and created empty: the index is a cache of the workspace files.
    /// [`SqliteIndex::was_rebuilt`] then returns `true` and the caller must feed every file
    /// again.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let p = path.clone();
        let (conn, rebuilt) = tokio::task::spawn_blocking(move || open_file(&p))
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
        let conn = open_memory().map_err(sql("open index in memory"))?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            path: None,
            rebuilt: true,
        })
    }

    /// Whether the index was created empty by [`SqliteIndex::open`] (new, damaged or of an
    /// older format): every file must then be fed again.
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
    async fn upsert(&self, doc: Document<'_>) -> Result<UpsertOutcome> {
        let (tenant, path, content) = (doc.tenant, doc.path, doc.content);
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
            let tx = begin_clearing(conn, &tenant, &path)?;
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
            let tx = begin_clearing(conn, &tenant, &path)?;
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
        let Some(query) = prepare_search(tenant, query, options)? else {
            return Ok(Vec::new());
        };
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
