//! [`PgIndex`]: a [`SearchIndex`] on PostgreSQL full-text search, for deployments where
//! several replicas share one index.
//!
//! Layout (all table names start with [`PgIndexOptions::table_prefix`], default
//! `hame_memory_`; schema version [`PG_SCHEMA_VERSION`] in the `meta` table):
//! - `meta(key, value)`: the row `('schema_version', 1)`.
//! - `docs(tenant, path, hash)`: one row per document, for the incremental skip and as the
//!   lock that serialises concurrent upserts of one document.
//! - `lines(tenant, path, line, part, content, cjk, tsv)`: one row per non-blank line (or
//!   chunk `part` of a long line), keyed by `(tenant, path, line, part)`. `tsv` is a
//!   generated column, `to_tsvector('simple', content with every run of non-alphanumeric
//!   characters replaced by a space)`, with a GIN index.
//! - `lines_cjk`: a partial B-tree index on `(tenant, path)` of the rows with CJK text.
//! - `lines_trgm`: a `pg_trgm` GIN index on `content` of the rows that contain CJK text
//!   (when the extension is available), used by `ILIKE '%term%'`.
//!
//! The `'simple'` configuration only lower-cases: no stemming, no stop words, so a word is
//! found exactly as written in any language (the contract of [`SearchIndex`]). Replacing
//! punctuation by spaces before `to_tsvector` makes the PostgreSQL parser see the same
//! words as the query parser of this crate (otherwise `example.com`, `3.14` or
//! `/usr/bin` would be single lexemes that no word query finds).
//!
//! Every statement scopes by `tenant = $1` itself, so ranking, `LIMIT` and the OR fallback
//! only ever see the tenant's rows.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Row};

use super::scoring::rank_rows;
use super::{
    Document, DocumentInfo, Hit, Query, QueryMode, SNIPPET_WORDS, SearchIndex, SearchOptions,
    UpsertOutcome, check_tenant, content_hash, is_cjk, prepare_search, split_rows,
};
use crate::error::{Error, Result};

/// Version of the table layout written to the `meta` table. A database with a newer
/// version is refused (an older build must not write into a newer layout).
pub const PG_SCHEMA_VERSION: i64 = 1;
/// Most candidate rows a CJK substring search reads before ranking them.
pub const PG_MAX_SCAN_ROWS: i64 = 20_000;
/// Rows inserted per statement when a document is (re)indexed.
const INSERT_BATCH: usize = 5_000;
/// Longest table prefix (PostgreSQL identifiers have at most 63 bytes).
pub const MAX_TABLE_PREFIX_LEN: usize = 40;

/// Options of [`PgIndex::connect`]. Construct with `..Default::default()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgIndexOptions {
    /// Prefix of every table and index name (default `hame_memory_`): lower-case ASCII
    /// letters, digits and `_`, starting with a letter or `_`, at most
    /// [`MAX_TABLE_PREFIX_LEN`] characters. Two indexes with different prefixes in one
    /// database are independent.
    pub table_prefix: String,
    /// Largest number of pooled connections (default 8).
    pub max_connections: u32,
    /// How long to wait for a pooled connection (default 10 s).
    pub acquire_timeout: Duration,
    /// Create the `pg_trgm` extension and the trigram index for CJK queries (default
    /// true). Off: CJK queries scan the tenant's CJK rows (for databases where extensions
    /// are not allowed; an index created earlier is still used).
    pub trigram: bool,
}

impl Default for PgIndexOptions {
    fn default() -> Self {
        Self {
            table_prefix: "hame_memory_".to_owned(),
            max_connections: 8,
            acquire_timeout: Duration::from_secs(10),
            trigram: true,
        }
    }
}

impl PgIndexOptions {
    /// Default options with this table prefix.
    pub fn with_table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.table_prefix = prefix.into();
        self
    }
}

fn check_prefix(prefix: &str) -> Result<()> {
    let ok = !prefix.is_empty()
        && prefix.len() <= MAX_TABLE_PREFIX_LEN
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !prefix.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!(
            "table prefix {prefix:?} must be 1..={MAX_TABLE_PREFIX_LEN} characters of \
             [a-z0-9_], not starting with a digit"
        )))
    }
}

/// PostgreSQL text cannot hold NUL: tenants and paths with one are refused.
fn check_text(what: &str, value: &str) -> Result<()> {
    if value.contains('\0') {
        return Err(Error::InvalidInput(format!(
            "the {what} must not contain a NUL character"
        )));
    }
    Ok(())
}

/// A tenant must be non-empty and free of NUL.
fn check_pg_tenant(tenant: &str) -> Result<()> {
    check_tenant(tenant)?;
    check_text("tenant", tenant)
}

/// The `starts_with(path, $n)` argument: `NULL` when there is no prefix.
fn path_prefix_arg(options: &SearchOptions) -> Option<String> {
    options
        .path_prefix
        .as_deref()
        .filter(|p| !p.is_empty())
        .map(no_nul)
}

/// A 1-based line number from an `int4` column.
fn line_number(row: &PgRow, column: usize) -> std::result::Result<u32, sqlx::Error> {
    Ok(u32::try_from(row.try_get::<i32, _>(column)?).unwrap_or(0))
}

/// Decodes every row with `f`; `what` names the step in the error.
fn decode<T>(
    rows: &[PgRow],
    what: &'static str,
    f: impl Fn(&PgRow) -> std::result::Result<T, sqlx::Error>,
) -> Result<Vec<T>> {
    rows.iter()
        .map(f)
        .collect::<std::result::Result<Vec<_>, sqlx::Error>>()
        .map_err(pg(what))
}

/// Indexed and searched text: NUL (which PostgreSQL text cannot hold) becomes a space.
fn no_nul(text: &str) -> String {
    text.replace('\0', " ")
}

fn pg(what: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| Error::index(what, e)
}

/// The SQL text of every fixed statement, with the table prefix filled in once.
#[derive(Debug)]
struct Statements {
    prefix: String,
    read_hash: Arc<str>,
    claim_doc: Arc<str>,
    delete_lines: Arc<str>,
    insert_lines: Arc<str>,
    delete_doc: Arc<str>,
    documents: Arc<str>,
    search_words: Arc<str>,
}

impl Statements {
    fn new(p: &str) -> Self {
        let s = |text: String| -> Arc<str> { text.into() };
        Self {
            prefix: p.to_owned(),
            read_hash: s(format!(
                "SELECT hash FROM {p}docs WHERE tenant = $1 AND path = $2"
            )),
            // Takes the document's row lock first, so concurrent upserts of one document
            // run one after the other; returns no row when the hash is unchanged.
            claim_doc: s(format!(
                "INSERT INTO {p}docs(tenant, path, hash) VALUES ($1, $2, $3) \
                 ON CONFLICT (tenant, path) DO UPDATE SET hash = excluded.hash \
                 WHERE {p}docs.hash <> excluded.hash RETURNING 1"
            )),
            delete_lines: s(format!(
                "DELETE FROM {p}lines WHERE tenant = $1 AND path = $2"
            )),
            insert_lines: s(format!(
                "INSERT INTO {p}lines(tenant, path, line, part, content, cjk) \
                 SELECT $1, $2, u.l, u.p, u.c, u.k \
                 FROM UNNEST($3::int4[], $4::int4[], $5::text[], $6::bool[]) AS u(l, p, c, k)"
            )),
            delete_doc: s(format!(
                "DELETE FROM {p}docs WHERE tenant = $1 AND path = $2"
            )),
            documents: s(format!(
                "SELECT path, hash FROM {p}docs WHERE tenant = $1 ORDER BY path"
            )),
            // The inner query ranks and limits; ts_headline (the expensive part) only runs
            // on the rows returned. The tsquery is built once in a materialised CTE: in a
            // generic prepared plan `to_tsquery($2)` would otherwise be evaluated again for
            // every ranked row (measured 2x slower for common words).
            search_words: s(format!(
                "WITH tq AS MATERIALIZED (SELECT to_tsquery('simple', $2) AS q) \
                 SELECT h.path, h.line, ts_headline('simple', h.content, h.q, $5) AS snippet, \
                   h.rank \
                 FROM ( \
                   SELECT l.path, l.line, l.part, l.content, tq.q, \
                     ts_rank_cd(l.tsv, tq.q, 1)::float8 AS rank \
                   FROM tq, {p}lines l \
                   WHERE l.tenant = $1 AND l.tsv @@ tq.q \
                     AND ($3::text IS NULL OR starts_with(l.path, $3)) \
                   ORDER BY rank DESC, l.path, l.line, l.part \
                   LIMIT $4 \
                 ) h \
                 ORDER BY h.rank DESC, h.path, h.line, h.part"
            )),
        }
    }

    /// The CJK substring statement for `n` terms, all required (`any == false`) or any.
    fn search_substring(&self, n: usize, any: bool) -> String {
        let p = &self.prefix;
        let join = if any { " OR " } else { " AND " };
        let likes: Vec<String> = (0..n)
            .map(|i| format!("content ILIKE ${} ESCAPE '\\'", i + 4))
            .collect();
        format!(
            "SELECT path, line, content FROM {p}lines \
             WHERE tenant = $1 AND cjk AND ($2::text IS NULL OR starts_with(path, $2)) \
               AND ({}) \
             LIMIT $3",
            likes.join(join)
        )
    }
}

/// Options of `ts_headline`: matches in `**…**`, about [`SNIPPET_WORDS`] words.
fn headline_options() -> String {
    format!(
        "StartSel=\"{}\", StopSel=\"{}\", MaxWords={SNIPPET_WORDS}, MinWords={}, \
         ShortWord=0, FragmentDelimiter=\" … \"",
        super::HIGHLIGHT.0,
        super::HIGHLIGHT.1,
        SNIPPET_WORDS / 2
    )
}

/// A lexeme for `to_tsquery`, single-quoted with `'` and `\` escaped.
fn quote_lexeme(word: &str) -> String {
    let mut s = String::with_capacity(word.len() + 2);
    s.push('\'');
    for c in word.chars() {
        match c {
            '\'' => s.push_str("''"),
            '\\' => s.push_str("\\\\"),
            '\0' => s.push(' '),
            c => s.push(c),
        }
    }
    s.push('\'');
    s
}

/// The `to_tsquery` text of a word query: every word single-quoted, a term's words joined
/// as a phrase (`<->`), `:*` on the last word of a prefix term, terms joined by `&` (all)
/// or `|` (any). Built only from the parsed words, so it is always valid tsquery syntax.
pub(crate) fn tsquery_text(query: &Query, any: bool) -> String {
    let terms: Vec<String> = query
        .terms
        .iter()
        .map(|t| {
            let last = t.words.len().saturating_sub(1);
            let words: Vec<String> = t
                .words
                .iter()
                .enumerate()
                .map(|(k, w)| {
                    let mut q = quote_lexeme(w);
                    if t.prefix && k == last {
                        q.push_str(":*");
                    }
                    q
                })
                .collect();
            format!("({})", words.join(" <-> "))
        })
        .collect();
    terms.join(if any { " | " } else { " & " })
}

/// An `ILIKE` pattern that matches `text` anywhere (`%`, `_` and `\` escaped).
fn ilike_pattern(text: &str) -> String {
    let mut p = String::with_capacity(text.len() + 2);
    p.push('%');
    for c in text.chars() {
        match c {
            '%' | '_' | '\\' => {
                p.push('\\');
                p.push(c);
            }
            '\0' => p.push(' '),
            c => p.push(c),
        }
    }
    p.push('%');
    p
}

/// A [`SearchIndex`] on PostgreSQL full-text search (`tsvector` + GIN, `ts_rank_cd`,
/// `ts_headline`) with a `pg_trgm` index for CJK substring queries.
///
/// Several replicas can share one database: tables are created on
/// [`connect`](PgIndex::connect) (idempotent, serialised by an advisory lock), upserts of
/// one document are serialised by its `docs` row lock, and every statement is scoped to
/// the tenant. Cloning is cheap (the pool is shared).
///
/// ```no_run
/// use hame_memory::{PgIndex, PgIndexOptions, SearchIndex, SearchOptions};
/// # async fn demo() -> Result<(), hame_memory::Error> {
/// let index = PgIndex::connect(
///     "postgres://postgres:postgres@127.0.0.1:5432/postgres",
///     PgIndexOptions { table_prefix: "agent_memory_".into(), ..Default::default() },
/// )
/// .await?;
/// index.upsert_document("alice", "MEMORY.md", "- Prefers Rust\n- 喜欢喝咖啡\n").await?;
/// let hits = index.search("alice", "咖啡", &SearchOptions::default()).await?;
/// assert_eq!(hits[0].line, 2);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgIndex {
    pool: PgPool,
    sql: Arc<Statements>,
    trigram: bool,
    headline: Arc<str>,
}

impl PgIndex {
    /// Connects to `url` (`postgres://…`), creates the tables and indexes if needed and
    /// checks the schema version.
    ///
    /// The `pg_trgm` extension is created if missing (`CREATE EXTENSION IF NOT EXISTS`; it
    /// is a trusted extension, so a database owner may create it). If that fails, CJK
    /// queries fall back to a scan of the tenant's CJK rows and a warning is logged; see
    /// [`PgIndex::has_trigram_index`].
    pub async fn connect(url: &str, options: PgIndexOptions) -> Result<Self> {
        check_prefix(&options.table_prefix)?;
        // One plain connection first, bounded by the acquire timeout, so that a closed port
        // or a wrong password is reported as such, at once (the pool would retry until its
        // timeout and report only "pool timed out").
        let unreachable = |e: sqlx::Error| Error::Index {
            message: format!(
                "cannot connect to PostgreSQL at {}: {}",
                hame_sql::host_of(url),
                hame_sql::connect_cause(&e, options.acquire_timeout)
            ),
            source: None,
        };
        let probe = tokio::time::timeout(
            options.acquire_timeout,
            <sqlx::PgConnection as sqlx::Connection>::connect(url),
        )
        .await
        .map_err(|_| unreachable(sqlx::Error::PoolTimedOut))?
        .map_err(unreachable)?;
        let _ = sqlx::Connection::close(probe).await;
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            .connect(url)
            .await
            .map_err(pg("connect"))?;
        let sql = Arc::new(Statements::new(&options.table_prefix));
        let trigram = create_schema(&pool, &options.table_prefix, options.trigram).await?;
        Ok(Self {
            pool,
            sql,
            trigram,
            headline: headline_options().into(),
        })
    }

    /// Whether CJK queries use the `pg_trgm` GIN index (`false`: a scan of the tenant's
    /// CJK rows, because the extension could not be created).
    pub fn has_trigram_index(&self) -> bool {
        self.trigram
    }

    /// The table prefix of this index.
    pub fn table_prefix(&self) -> &str {
        &self.sql.prefix
    }

    /// Drops this index's tables (all tenants). The next [`PgIndex::connect`] with the same
    /// prefix creates them empty again. For tests and for a full re-index.
    pub async fn drop_tables(&self) -> Result<()> {
        let p = &self.sql.prefix;
        sqlx::query(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {p}lines, {p}docs, {p}meta"
        )))
        .execute(&self.pool)
        .await
        .map_err(pg("drop tables"))?;
        Ok(())
    }

    async fn search_words(
        &self,
        tenant: &str,
        query: &Query,
        options: &SearchOptions,
        any: bool,
    ) -> Result<Vec<Hit>> {
        let limit = i64::try_from(options.effective_limit()).unwrap_or(i64::MAX);
        let rows = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.search_words)))
            .bind(tenant)
            .bind(tsquery_text(query, any))
            .bind(path_prefix_arg(options))
            .bind(limit)
            .bind(&*self.headline)
            .fetch_all(&self.pool)
            .await
            .map_err(pg("search"))?;
        decode(&rows, "read search results", |r| {
            Ok(Hit {
                path: r.try_get(0)?,
                line: line_number(r, 1)?,
                snippet: r.try_get(2)?,
                score: r.try_get(3)?,
            })
        })
    }

    /// Deletes a document's rows (not its `docs` row).
    async fn delete_lines(
        &self,
        conn: &mut sqlx::PgConnection,
        tenant: &str,
        path: &str,
    ) -> Result<()> {
        sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.delete_lines)))
            .bind(tenant)
            .bind(path)
            .execute(conn)
            .await
            .map_err(pg("delete rows"))?;
        Ok(())
    }

    /// Substring search for queries with CJK text: `ILIKE '%term%'` over the tenant's CJK
    /// rows (through the trigram index when there is one), ranked here like
    /// [`InMemoryIndex`](crate::InMemoryIndex) ranks.
    async fn search_substring(
        &self,
        tenant: &str,
        query: &Query,
        options: &SearchOptions,
    ) -> Result<Vec<Hit>> {
        let mut found = self.substring_rows(tenant, query, options, false).await?;
        if found.is_empty() && query.terms.len() > 1 {
            found = self.substring_rows(tenant, query, options, true).await?;
        }
        Ok(rank_rows(found, query, options.effective_limit()))
    }

    async fn substring_rows(
        &self,
        tenant: &str,
        query: &Query,
        options: &SearchOptions,
        any: bool,
    ) -> Result<Vec<(String, u32, String)>> {
        let sql_text = self.sql.search_substring(query.terms.len(), any);
        let mut q = sqlx::query(AssertSqlSafe(sql_text))
            .bind(tenant)
            .bind(path_prefix_arg(options))
            .bind(PG_MAX_SCAN_ROWS);
        for t in &query.terms {
            q = q.bind(ilike_pattern(&t.text));
        }
        let rows = q.fetch_all(&self.pool).await.map_err(pg("scan"))?;
        decode(&rows, "read scan results", |r| {
            Ok((r.try_get(0)?, line_number(r, 1)?, r.try_get(2)?))
        })
    }
}

/// Creates the tables (idempotent) under an advisory lock and checks the version. Returns
/// whether the trigram index exists.
async fn create_schema(pool: &PgPool, p: &str, create_trigram: bool) -> Result<bool> {
    let mut tx = pool.begin().await.map_err(pg("begin"))?;
    // Serialises concurrent connects of several replicas; released at commit.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("hame-memory:{p}"))
        .execute(&mut *tx)
        .await
        .map_err(pg("schema lock"))?;
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {p}meta(key TEXT PRIMARY KEY, value BIGINT NOT NULL)"
    )))
    .execute(&mut *tx)
    .await
    .map_err(pg("create meta table"))?;
    let version: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT value FROM {p}meta WHERE key = 'schema_version'"
    )))
    .fetch_optional(&mut *tx)
    .await
    .map_err(pg("read schema version"))?;
    match version {
        Some(v) if v == PG_SCHEMA_VERSION => {}
        Some(v) => {
            return Err(Error::Index {
                message: format!(
                    "tables `{p}*` have schema version {v}; this build knows version \
                     {PG_SCHEMA_VERSION} (use another table prefix, or drop the tables to \
                     re-index)"
                ),
                source: None,
            });
        }
        None => {
            for stmt in [
                format!(
                    "CREATE TABLE IF NOT EXISTS {p}docs( \
                       tenant TEXT COLLATE \"C\" NOT NULL, \
                       path TEXT COLLATE \"C\" NOT NULL, \
                       hash TEXT NOT NULL, \
                       PRIMARY KEY (tenant, path))"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {p}lines( \
                       tenant TEXT COLLATE \"C\" NOT NULL, \
                       path TEXT COLLATE \"C\" NOT NULL, \
                       line INTEGER NOT NULL, \
                       part INTEGER NOT NULL, \
                       content TEXT NOT NULL, \
                       cjk BOOLEAN NOT NULL, \
                       tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, \
                         regexp_replace(content, '[^[:alnum:]]+', ' ', 'g'))) STORED, \
                       PRIMARY KEY (tenant, path, line, part))"
                ),
                format!("CREATE INDEX IF NOT EXISTS {p}lines_tsv ON {p}lines USING gin (tsv)"),
                // The tenant's CJK rows, for CJK terms too short for a trigram (and for all
                // CJK queries without pg_trgm): the scan reads only these rows.
                format!(
                    "CREATE INDEX IF NOT EXISTS {p}lines_cjk ON {p}lines (tenant, path) WHERE cjk"
                ),
                format!(
                    "INSERT INTO {p}meta(key, value) VALUES ('schema_version', {PG_SCHEMA_VERSION}) \
                     ON CONFLICT (key) DO NOTHING"
                ),
            ] {
                sqlx::query(AssertSqlSafe(stmt))
                    .execute(&mut *tx)
                    .await
                    .map_err(pg("create tables"))?;
            }
        }
    }
    let trigram = create_trigram_index(&mut tx, p, create_trigram).await?;
    tx.commit().await.map_err(pg("commit schema"))?;
    Ok(trigram)
}

/// Creates `pg_trgm` and the trigram index inside savepoints, so that a missing privilege
/// or extension only disables the index.
async fn create_trigram_index(tx: &mut sqlx::PgConnection, p: &str, create: bool) -> Result<bool> {
    let index = format!("{p}lines_trgm");
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE schemaname = current_schema() \
         AND indexname = $1)",
    )
    .bind(&index)
    .fetch_one(&mut *tx)
    .await
    .map_err(pg("look up trigram index"))?;
    if exists || !create {
        if !exists {
            tracing::info!(
                prefix = p,
                "trigram index disabled: CJK queries of the PostgreSQL search index scan the \
                 tenant's CJK rows with LIKE"
            );
        }
        return Ok(exists);
    }
    for (what, stmt) in [
        (
            "CREATE EXTENSION pg_trgm",
            "CREATE EXTENSION IF NOT EXISTS pg_trgm".to_owned(),
        ),
        (
            "CREATE INDEX (trigram)",
            format!(
                "CREATE INDEX IF NOT EXISTS {index} ON {p}lines \
                 USING gin (content gin_trgm_ops) WHERE cjk"
            ),
        ),
    ] {
        sqlx::query("SAVEPOINT hame_trgm")
            .execute(&mut *tx)
            .await
            .map_err(pg("savepoint"))?;
        if let Err(e) = sqlx::query(AssertSqlSafe(stmt)).execute(&mut *tx).await {
            sqlx::query("ROLLBACK TO SAVEPOINT hame_trgm")
                .execute(&mut *tx)
                .await
                .map_err(pg("rollback to savepoint"))?;
            tracing::warn!(
                step = what,
                error = %e,
                "pg_trgm is unavailable: CJK queries of the PostgreSQL search index will \
                 scan the tenant's CJK rows with LIKE instead of using a trigram index"
            );
            return Ok(false);
        }
        sqlx::query("RELEASE SAVEPOINT hame_trgm")
            .execute(&mut *tx)
            .await
            .map_err(pg("release savepoint"))?;
    }
    Ok(true)
}

#[async_trait]
impl SearchIndex for PgIndex {
    async fn upsert(&self, doc: Document<'_>) -> Result<UpsertOutcome> {
        let (tenant, path, content) = (doc.tenant, doc.path, doc.content);
        check_pg_tenant(tenant)?;
        check_text("path", path)?;
        let hash = content_hash(content);
        // Fast path without a transaction: most upserts of a memory folder are unchanged.
        let old: Option<String> =
            sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.sql.read_hash)))
                .bind(tenant)
                .bind(path)
                .fetch_optional(&self.pool)
                .await
                .map_err(pg("read document hash"))?;
        if old.as_deref() == Some(hash.as_str()) {
            return Ok(UpsertOutcome::Unchanged);
        }
        let rows = split_rows(content);
        let mut tx = self.pool.begin().await.map_err(pg("begin"))?;
        let claimed = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.claim_doc)))
            .bind(tenant)
            .bind(path)
            .bind(&hash)
            .fetch_optional(&mut *tx)
            .await
            .map_err(pg("write document hash"))?;
        if claimed.is_none() {
            // Another writer indexed the same content meanwhile.
            tx.rollback().await.map_err(pg("rollback"))?;
            return Ok(UpsertOutcome::Unchanged);
        }
        self.delete_lines(&mut tx, tenant, path).await?;
        let mut part = 0i32;
        let mut prev_line = 0u32;
        let mut batch = RowBatch::default();
        for row in &rows {
            part = if row.line == prev_line { part + 1 } else { 0 };
            prev_line = row.line;
            batch.push(row.line, part, &row.text);
            if batch.lines.len() >= INSERT_BATCH {
                batch.insert(&self.sql, tenant, path, &mut tx).await?;
            }
        }
        batch.insert(&self.sql, tenant, path, &mut tx).await?;
        tx.commit().await.map_err(pg("commit"))?;
        Ok(UpsertOutcome::Indexed { rows: rows.len() })
    }

    async fn remove_document(&self, tenant: &str, path: &str) -> Result<bool> {
        check_pg_tenant(tenant)?;
        if path.contains('\0') {
            return Ok(false);
        }
        let mut tx = self.pool.begin().await.map_err(pg("begin"))?;
        let n = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.delete_doc)))
            .bind(tenant)
            .bind(path)
            .execute(&mut *tx)
            .await
            .map_err(pg("delete document"))?
            .rows_affected();
        self.delete_lines(&mut tx, tenant, path).await?;
        tx.commit().await.map_err(pg("commit"))?;
        Ok(n > 0)
    }

    async fn search(&self, tenant: &str, query: &str, options: &SearchOptions) -> Result<Vec<Hit>> {
        check_pg_tenant(tenant)?;
        let Some(query) = prepare_search(tenant, query, options)? else {
            return Ok(Vec::new());
        };
        if query.mode != QueryMode::Words {
            return self.search_substring(tenant, &query, options).await;
        }
        let hits = self.search_words(tenant, &query, options, false).await?;
        if hits.is_empty() && query.terms.len() > 1 {
            return self.search_words(tenant, &query, options, true).await;
        }
        Ok(hits)
    }

    async fn documents(&self, tenant: &str) -> Result<Vec<DocumentInfo>> {
        check_pg_tenant(tenant)?;
        let rows = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.documents)))
            .bind(tenant)
            .fetch_all(&self.pool)
            .await
            .map_err(pg("documents"))?;
        decode(&rows, "read documents", |r| {
            Ok(DocumentInfo {
                path: r.try_get(0)?,
                hash: r.try_get(1)?,
            })
        })
    }
}

/// Rows of one document waiting to be inserted with one `UNNEST` statement.
#[derive(Debug, Default)]
struct RowBatch {
    lines: Vec<i32>,
    parts: Vec<i32>,
    texts: Vec<String>,
    cjk: Vec<bool>,
}

impl RowBatch {
    fn push(&mut self, line: u32, part: i32, text: &str) {
        self.lines.push(i32::try_from(line).unwrap_or(i32::MAX));
        self.parts.push(part);
        self.cjk.push(text.chars().any(is_cjk));
        self.texts.push(no_nul(text));
    }

    async fn insert(
        &mut self,
        sql: &Statements,
        tenant: &str,
        path: &str,
        conn: &mut sqlx::PgConnection,
    ) -> Result<()> {
        if self.lines.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(self);
        sqlx::query(AssertSqlSafe(Arc::clone(&sql.insert_lines)))
            .bind(tenant)
            .bind(path)
            .bind(batch.lines)
            .bind(batch.parts)
            .bind(batch.texts)
            .bind(batch.cjk)
            .execute(conn)
            .await
            .map_err(pg("insert rows"))?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "postgres_tests.rs"]
mod tests;
