//! [`InMemoryIndex`]: a naive, exact implementation for tests and small workspaces.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

use super::{
    DocumentInfo, Hit, Query, QueryMode, Row, SearchIndex, SearchOptions, Term, UpsertOutcome,
    check_tenant, content_hash, highlight, is_cjk, parse_query, split_rows, words_of,
};
use crate::error::Result;

#[derive(Debug)]
struct Doc {
    hash: String,
    rows: Vec<Row>,
}

/// A [`SearchIndex`] that keeps rows in memory and scans them on every search.
///
/// It follows the same contract as [`SqliteIndex`](crate::SqliteIndex) (both run the same
/// conformance suite); scores are a simple term-frequency measure rather than BM25.
#[derive(Debug, Default)]
pub struct InMemoryIndex {
    docs: Mutex<BTreeMap<(String, String), Doc>>,
}

impl InMemoryIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Whether `words` contains the term's words in order, the last one as a prefix if asked.
fn words_match(words: &[String], term: &Term) -> usize {
    let n = term.words.len();
    if n == 0 || words.len() < n {
        return 0;
    }
    let mut count = 0;
    for start in 0..=(words.len() - n) {
        let ok = term.words.iter().enumerate().all(|(k, w)| {
            let got = &words[start + k];
            if k == n - 1 && term.prefix {
                got.starts_with(w.as_str())
            } else {
                got == w
            }
        });
        if ok {
            count += 1;
        }
    }
    count
}

/// Scores a row for a query: occurrences per term, normalised by line length.
/// Returns how many terms matched and the score.
pub(crate) fn score_row(text: &str, query: &Query) -> (usize, f64) {
    let mut matched = 0;
    let mut occurrences = 0usize;
    match query.mode {
        QueryMode::Words => {
            let words = words_of(text);
            for t in &query.terms {
                let c = words_match(&words, t);
                if c > 0 {
                    matched += 1;
                    occurrences += c;
                }
            }
        }
        QueryMode::Trigram | QueryMode::Scan => {
            if !text.chars().any(is_cjk) {
                return (0, 0.0);
            }
            let lower = text.to_lowercase();
            for t in &query.terms {
                let c = lower.matches(t.text.as_str()).count();
                if c > 0 {
                    matched += 1;
                    occurrences += c;
                }
            }
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let score = occurrences as f64 / (1.0 + text.chars().count() as f64 / 40.0);
    (matched, score)
}

/// The needles to highlight for a query.
pub(crate) fn needles(query: &Query) -> Vec<String> {
    match query.mode {
        QueryMode::Words => query.terms.iter().flat_map(|t| t.words.clone()).collect(),
        _ => query.terms.iter().map(|t| t.text.clone()).collect(),
    }
}

/// Sorts hits best first, then by path and line, and cuts to `limit`.
pub(crate) fn rank(mut hits: Vec<Hit>, limit: usize) -> Vec<Hit> {
    hits.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.path.cmp(&b.path))
            .then_with(|| a.line.cmp(&b.line))
    });
    hits.truncate(limit);
    hits
}

#[async_trait]
impl SearchIndex for InMemoryIndex {
    async fn upsert_document(
        &self,
        tenant: &str,
        path: &str,
        content: &str,
    ) -> Result<UpsertOutcome> {
        check_tenant(tenant)?;
        let hash = content_hash(content);
        let mut docs = self.docs.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (tenant.to_owned(), path.to_owned());
        if docs.get(&key).is_some_and(|d| d.hash == hash) {
            return Ok(UpsertOutcome::Unchanged);
        }
        let rows = split_rows(content);
        let n = rows.len();
        docs.insert(key, Doc { hash, rows });
        Ok(UpsertOutcome::Indexed { rows: n })
    }

    async fn remove_document(&self, tenant: &str, path: &str) -> Result<bool> {
        check_tenant(tenant)?;
        let mut docs = self.docs.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(docs.remove(&(tenant.to_owned(), path.to_owned())).is_some())
    }

    async fn search(&self, tenant: &str, query: &str, options: &SearchOptions) -> Result<Vec<Hit>> {
        check_tenant(tenant)?;
        let limit = options.effective_limit();
        let Some(query) = parse_query(query) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let needles = needles(&query);
        let docs = self.docs.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all = Vec::new();
        let mut any = Vec::new();
        for ((t, path), doc) in docs.iter() {
            if t != tenant {
                continue;
            }
            if let Some(p) = &options.path_prefix
                && !path.starts_with(p.as_str())
            {
                continue;
            }
            for row in &doc.rows {
                let (matched, score) = score_row(&row.text, &query);
                if matched == 0 {
                    continue;
                }
                let hit = Hit {
                    path: path.clone(),
                    line: row.line,
                    snippet: highlight(&row.text, &needles),
                    score,
                };
                if matched == query.terms.len() {
                    all.push(hit);
                } else {
                    any.push(hit);
                }
            }
        }
        Ok(rank(if all.is_empty() { any } else { all }, limit))
    }

    async fn documents(&self, tenant: &str) -> Result<Vec<DocumentInfo>> {
        check_tenant(tenant)?;
        let docs = self.docs.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(docs
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .map(|((_, path), d)| DocumentInfo {
                path: path.clone(),
                hash: d.hash.clone(),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn conformance() -> Result<()> {
        super::super::conformance::run_all(&InMemoryIndex::new()).await
    }
}
