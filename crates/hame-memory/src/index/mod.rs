//! Full-text search over workspace files (memory logs, `MEMORY.md`, notes).
//!
//! The files are the truth and the index is a cache of them: callers feed every file with
//! [`SearchIndex::upsert_document`] (cheap when unchanged: the content hash is compared
//! first), remove deleted files with [`SearchIndex::remove_document`], and use
//! [`SearchIndex::documents`] to diff the index against the files after a restart.
//!
//! # Contract
//! - A document is split into lines; each non-blank line is one searchable row with its
//!   1-based line number. Lines longer than [`MAX_CHUNK_CHARS`] are split into chunks that
//!   keep the line number.
//! - Every operation is scoped to a tenant; a search never sees another tenant's rows.
//!   Tenants are non-empty strings.
//! - Queries are plain user text. Words are matched as words (case-insensitive); `foo*` is a
//!   prefix query; quotes, operators and punctuation are never interpreted as query syntax,
//!   so no user text can make a search fail. All words must match; when no line has all of
//!   them, lines with any of them are returned instead.
//! - Queries with Chinese, Japanese or Korean characters are matched as substrings (CJK text
//!   has no spaces between words), down to one CJK character.
//! - Hits are ranked best first; `score` is larger for better hits and is only comparable
//!   within one result list.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod scoring;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use memory::InMemoryIndex;
#[cfg(feature = "postgres")]
pub use postgres::{
    MAX_TABLE_PREFIX_LEN, PG_MAX_SCAN_ROWS, PG_SCHEMA_VERSION, PgIndex, PgIndexOptions,
};
#[cfg(feature = "sqlite")]
pub use sqlite::{SQLITE_APPLICATION_ID, SQLITE_SCHEMA_VERSION, SqliteIndex};

/// Default number of hits of a search.
pub const DEFAULT_SEARCH_LIMIT: usize = 10;
/// Largest number of hits a search returns, whatever the caller asks.
pub const MAX_SEARCH_LIMIT: usize = 200;
/// Lines longer than this many characters are indexed as several chunks.
pub const MAX_CHUNK_CHARS: usize = 2_000;
/// Words of context a snippet shows around the match.
pub const SNIPPET_WORDS: usize = 24;
/// Markers around matched words in snippets.
pub const HIGHLIGHT: (&str, &str) = ("**", "**");

/// How to search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchOptions {
    /// Maximum number of hits (default [`DEFAULT_SEARCH_LIMIT`], capped at
    /// [`MAX_SEARCH_LIMIT`]; 0 returns nothing).
    pub limit: usize,
    /// Only documents whose path starts with this (e.g. `memory/`).
    pub path_prefix: Option<String>,
}

impl Default for SearchOptions {
    fn default() -> Self {
        Self {
            limit: DEFAULT_SEARCH_LIMIT,
            path_prefix: None,
        }
    }
}

impl SearchOptions {
    /// Options with this limit.
    pub fn limit(limit: usize) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Restricts the search to paths starting with `prefix`.
    pub fn with_path_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.path_prefix = Some(prefix.into());
        self
    }

    pub(crate) fn effective_limit(&self) -> usize {
        self.limit.min(MAX_SEARCH_LIMIT)
    }
}

/// One matching line.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// Document path.
    pub path: String,
    /// 1-based line number.
    pub line: u32,
    /// The line (or a window of it) with matches wrapped in [`HIGHLIGHT`] markers.
    pub snippet: String,
    /// Relevance, larger is better (BM25 for word queries).
    pub score: f64,
}

/// A document known to the index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DocumentInfo {
    /// Document path.
    pub path: String,
    /// Hex SHA-256 of the content last indexed (see [`content_hash`]).
    pub hash: String,
}

/// What [`SearchIndex::upsert_document`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpsertOutcome {
    /// The content hash was unchanged; nothing was written.
    Unchanged,
    /// The document's rows were (re)written.
    Indexed {
        /// Number of rows (non-blank lines and chunks) now indexed for the document.
        rows: usize,
    },
}

/// One document to index: what [`SearchIndex::upsert`] receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Document<'a> {
    /// The tenant the document belongs to.
    pub tenant: &'a str,
    /// Its path (the key within the tenant).
    pub path: &'a str,
    /// Its text.
    pub content: &'a str,
}

/// A tenant-scoped full-text index of documents. See the [module docs](self) for the
/// contract every implementation follows (checked by the conformance suite).
#[async_trait]
pub trait SearchIndex: Send + Sync + fmt::Debug + 'static {
    /// Indexes `doc.content` as the document `doc.path` of `doc.tenant`, replacing what was
    /// indexed for it before. Does nothing when the content hash is unchanged. (The one
    /// write a backend implements; callers use [`upsert_document`](Self::upsert_document).)
    async fn upsert(&self, doc: Document<'_>) -> Result<UpsertOutcome>;

    /// [`upsert`](Self::upsert) of `content` as the document `path` of `tenant`.
    async fn upsert_document(
        &self,
        tenant: &str,
        path: &str,
        content: &str,
    ) -> Result<UpsertOutcome> {
        self.upsert(Document {
            tenant,
            path,
            content,
        })
        .await
    }

    /// Forgets a document. Returns whether it was indexed.
    async fn remove_document(&self, tenant: &str, path: &str) -> Result<bool>;

    /// Searches the tenant's documents, best hits first.
    async fn search(&self, tenant: &str, query: &str, options: &SearchOptions) -> Result<Vec<Hit>>;

    /// The tenant's documents with their content hashes, sorted by path.
    async fn documents(&self, tenant: &str) -> Result<Vec<DocumentInfo>>;
}

/// Implements [`SearchIndex`] for a smart pointer by forwarding every method (one list of
/// methods for every wrapper, so none can be forgotten).
macro_rules! forward_search_index {
    ($($wrapper:ident),+) => {$(
        #[async_trait]
        impl<T: SearchIndex + ?Sized> SearchIndex for $wrapper<T> {
            async fn upsert(&self, doc: Document<'_>) -> Result<UpsertOutcome> {
                (**self).upsert(doc).await
            }
            async fn remove_document(&self, tenant: &str, path: &str) -> Result<bool> {
                (**self).remove_document(tenant, path).await
            }
            async fn search(
                &self,
                tenant: &str,
                query: &str,
                options: &SearchOptions,
            ) -> Result<Vec<Hit>> {
                (**self).search(tenant, query, options).await
            }
            async fn documents(&self, tenant: &str) -> Result<Vec<DocumentInfo>> {
                (**self).documents(tenant).await
            }
        }
    )+};
}

forward_search_index!(Arc, Box);

/// Hex SHA-256 of a document's content, as reported by [`SearchIndex::documents`].
pub fn content_hash(content: &str) -> String {
    hex::encode(Sha256::digest(content.as_bytes()))
}

pub(crate) fn check_tenant(tenant: &str) -> Result<()> {
    if tenant.is_empty() {
        return Err(Error::InvalidInput("the tenant must not be empty".into()));
    }
    Ok(())
}

/// The start every [`SearchIndex::search`] shares: checks the tenant and parses the
/// query. `None` when there is nothing to search for (no searchable text, or a limit of 0).
pub(crate) fn prepare_search(
    tenant: &str,
    query: &str,
    options: &SearchOptions,
) -> Result<Option<Query>> {
    check_tenant(tenant)?;
    if options.effective_limit() == 0 {
        return Ok(None);
    }
    Ok(parse_query(query))
}

/// One indexed row: a non-blank line or a chunk of a long line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub line: u32,
    pub text: String,
}

/// Splits a document into rows (see the contract).
pub(crate) fn split_rows(content: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for (i, raw) in content.lines().enumerate() {
        let text = raw.trim();
        if text.is_empty() {
            continue;
        }
        let line = u32::try_from(i + 1).unwrap_or(u32::MAX);
        if text.len() <= MAX_CHUNK_CHARS {
            rows.push(Row {
                line,
                text: text.to_owned(),
            });
            continue;
        }
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(MAX_CHUNK_CHARS) {
            let t: String = chunk.iter().collect();
            let t = t.trim();
            if !t.is_empty() {
                rows.push(Row {
                    line,
                    text: t.to_owned(),
                });
            }
        }
    }
    rows
}

/// Whether a character belongs to a script written without spaces between words
/// (Han, Hiragana, Katakana, Hangul, CJK punctuation-free letters).
pub fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // Hiragana, Katakana
        | 0x3400..=0x4DBF    // CJK Extension A
        | 0x4E00..=0x9FFF    // CJK Unified Ideographs
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0x1100..=0x11FF    // Hangul Jamo
        | 0x3130..=0x318F    // Hangul compatibility Jamo
        | 0xF900..=0xFAFF    // CJK compatibility ideographs
        | 0xFF66..=0xFF9F    // half-width Katakana
        | 0x20000..=0x2FA1F  // CJK Extensions B.. and supplement
    )
}

/// One search term: a run of words (matched as a phrase) or a CJK substring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Term {
    /// Lower-cased words of the term (alphanumeric runs).
    pub words: Vec<String>,
    /// The term's text for substring matching (lower-cased, punctuation kept inside).
    pub text: String,
    /// Whether the last word is a prefix (`foo*`).
    pub prefix: bool,
}

/// How a parsed query must be matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueryMode {
    /// Word matching (unicode61 FTS table, BM25).
    Words,
    /// Substring matching of terms of at least three characters (trigram FTS table).
    Trigram,
    /// Substring scan for short CJK terms (LIKE), restricted to the tenant.
    Scan,
}

/// A safe, parsed query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Query {
    pub terms: Vec<Term>,
    pub mode: QueryMode,
}

/// Longest query the parser reads (characters); the rest is ignored.
pub const MAX_QUERY_CHARS: usize = 1_000;
/// Most terms a query keeps; the rest are ignored.
pub const MAX_QUERY_TERMS: usize = 32;

/// Parses user text into terms. Never fails; `None` when nothing searchable is left.
pub(crate) fn parse_query(input: &str) -> Option<Query> {
    let input: String = input.chars().take(MAX_QUERY_CHARS).collect();
    let mut terms = Vec::new();
    for chunk in input.split_whitespace() {
        let prefix = chunk.ends_with('*');
        // Keep only letters and digits, so that no quote or operator survives; other
        // characters separate words inside the chunk (as the unicode61 tokenizer does).
        let mut words = Vec::new();
        let mut cur = String::new();
        let mut text = String::new();
        for c in chunk.chars() {
            if c.is_alphanumeric() {
                cur.extend(c.to_lowercase());
                text.extend(c.to_lowercase());
            } else {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
                if !text.is_empty() && c != '*' && c != '"' && c != '\'' {
                    text.push(c);
                }
            }
        }
        if !cur.is_empty() {
            words.push(cur);
        }
        if words.is_empty() {
            continue;
        }
        let text = text.trim_matches(|c: char| !c.is_alphanumeric()).to_owned();
        terms.push(Term {
            words,
            text,
            prefix,
        });
        if terms.len() >= MAX_QUERY_TERMS {
            break;
        }
    }
    if terms.is_empty() {
        return None;
    }
    let cjk = terms.iter().any(|t| t.text.chars().any(is_cjk));
    let mode = if !cjk {
        QueryMode::Words
    } else if terms.iter().all(|t| t.text.chars().count() >= 3) {
        QueryMode::Trigram
    } else {
        QueryMode::Scan
    };
    Some(Query { terms, mode })
}

/// Splits text into lower-cased alphanumeric words (the word model of [`QueryMode::Words`]).
pub(crate) fn words_of(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        if c.is_alphanumeric() {
            cur.extend(c.to_lowercase());
        } else if !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Wraps every case-insensitive occurrence of the needles in [`HIGHLIGHT`] markers and cuts
/// a window of about [`SNIPPET_WORDS`] words around the first match.
pub(crate) fn highlight(line: &str, needles: &[String]) -> String {
    let lower: Vec<char> = line.chars().flat_map(char::to_lowercase).collect();
    let chars: Vec<char> = line.chars().collect();
    // Lower-casing can change the length (rare); fall back to the plain line then.
    if lower.len() != chars.len() {
        return window(line, 0);
    }
    let mut marks = vec![false; chars.len()];
    for n in needles {
        let n: Vec<char> = n.chars().collect();
        if n.is_empty() || n.len() > lower.len() {
            continue;
        }
        for start in 0..=(lower.len() - n.len()) {
            if lower[start..start + n.len()] == n[..] {
                for m in &mut marks[start..start + n.len()] {
                    *m = true;
                }
            }
        }
    }
    let mut out = String::with_capacity(line.len() + 8);
    let mut first_mark = None;
    let mut inside = false;
    for (i, c) in chars.iter().enumerate() {
        if marks[i] && !inside {
            first_mark.get_or_insert(out.len());
            out.push_str(HIGHLIGHT.0);
            inside = true;
        } else if !marks[i] && inside {
            out.push_str(HIGHLIGHT.1);
            inside = false;
        }
        out.push(*c);
    }
    if inside {
        out.push_str(HIGHLIGHT.1);
    }
    window(&out, first_mark.unwrap_or(0))
}

/// About [`SNIPPET_WORDS`] words of `text` around byte offset `at`, with `…` where cut.
fn window(text: &str, at: usize) -> String {
    const MAX_CHARS: usize = SNIPPET_WORDS * 8;
    if text.chars().count() <= MAX_CHARS {
        return text.to_owned();
    }
    let before: Vec<(usize, char)> = text[..at].char_indices().collect();
    let start = if before.len() > MAX_CHARS / 3 {
        before[before.len() - MAX_CHARS / 3].0
    } else {
        0
    };
    let end = text[start..]
        .char_indices()
        .nth(MAX_CHARS)
        .map_or(text.len(), |(i, _)| start + i);
    let mut s = String::new();
    if start > 0 {
        s.push('…');
    }
    s.push_str(&text[start..end]);
    if end < text.len() {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn parses_hostile_text_into_plain_terms() -> Result<(), String> {
        let q = parse_query(r#"foo" OR bar* NOT (baz) "unterminated -x ^y:z"#).ok_or("no query")?;
        let words: Vec<Vec<String>> = q.terms.iter().map(|t| t.words.clone()).collect();
        assert_eq!(
            words,
            vec![
                vec!["foo".to_owned()],
                vec!["or".to_owned()],
                vec!["bar".to_owned()],
                vec!["not".to_owned()],
                vec!["baz".to_owned()],
                vec!["unterminated".to_owned()],
                vec!["x".to_owned()],
                vec!["y".to_owned(), "z".to_owned()],
            ]
        );
        assert!(q.terms[2].prefix);
        assert_eq!(q.mode, QueryMode::Words);
        Ok(())
    }

    #[test]
    fn only_punctuation_is_no_query() {
        assert_eq!(parse_query(r#" "" * ( ) - : ^ "#), None);
    }

    #[test]
    fn cjk_modes() -> Result<(), String> {
        assert_eq!(
            parse_query("咖啡店").ok_or("none")?.mode,
            QueryMode::Trigram
        );
        assert_eq!(parse_query("咖啡").ok_or("none")?.mode, QueryMode::Scan);
        assert_eq!(
            parse_query("東京 tower").ok_or("none")?.mode,
            QueryMode::Scan
        );
        Ok(())
    }

    #[test]
    fn splits_rows_and_chunks_long_lines() {
        let long = "x".repeat(MAX_CHUNK_CHARS + 10);
        let doc = format!("a\n\n  b  \n{long}\n");
        let rows = split_rows(&doc);
        assert_eq!(rows.len(), 4);
        assert_eq!((rows[0].line, rows[0].text.as_str()), (1, "a"));
        assert_eq!((rows[1].line, rows[1].text.as_str()), (3, "b"));
        assert_eq!((rows[2].line, rows[3].line), (4, 4));
        assert_eq!(rows[3].text.len(), 10);
    }

    #[test]
    fn highlights_case_insensitively() {
        assert_eq!(
            highlight("Rust and rust", &["rust".to_owned()]),
            "**Rust** and **rust**"
        );
    }
}
