//! [`InMemoryIndex`]: a naive, exact implementation for tests and small workspaces.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

use super::scoring::rank_rows;
use super::{
    Document, DocumentInfo, Hit, Row, SearchIndex, SearchOptions, UpsertOutcome, check_tenant,
    content_hash, prepare_search, split_rows,
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

#[async_trait]
impl SearchIndex for InMemoryIndex {
    async fn upsert(&self, doc: Document<'_>) -> Result<UpsertOutcome> {
        let (tenant, path, content) = (doc.tenant, doc.path, doc.content);
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
        let Some(query) = prepare_search(tenant, query, options)? else {
            return Ok(Vec::new());
        };
        let prefix = options.path_prefix.as_deref().unwrap_or("");
        let docs = self.docs.lock().unwrap_or_else(PoisonError::into_inner);
        let rows = docs
            .iter()
            .filter(|((t, path), _)| t == tenant && path.starts_with(prefix))
            .flat_map(|((_, path), doc)| {
                doc.rows
                    .iter()
                    .map(move |row| (path.as_str(), row.line, row.text.as_str()))
            });
        Ok(rank_rows(rows, &query, options.effective_limit()))
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
