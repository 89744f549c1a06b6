//! The [`SearchIndex`] conformance suite (feature `conformance`, always in this crate's
//! tests). Every implementation and wrapper runs [`run_all`].
//!
//! Each check uses its own tenants, so the suite also proves that data of other tenants in
//! the same index does not leak into results. Checks panic (via `assert!`) on a contract
//! violation and return `Err` when the index itself fails.
#![allow(clippy::missing_panics_doc)]

use super::{DocumentInfo, HIGHLIGHT, SearchIndex, SearchOptions, UpsertOutcome, content_hash};
use crate::error::{Error, Result};

/// Runs every check against `index`.
pub async fn run_all(index: &dyn SearchIndex) -> Result<()> {
    finds_words_with_line_numbers(index).await?;
    skips_unchanged_and_replaces_changed(index).await?;
    removes_documents(index).await?;
    isolates_tenants(index).await?;
    prefix_queries(index).await?;
    hostile_queries_never_fail(index).await?;
    all_terms_then_any_term(index).await?;
    path_prefix_and_limit(index).await?;
    ranks_better_hits_first(index).await?;
    cjk_queries(index).await?;
    rejects_empty_tenant(index).await?;
    Ok(())
}

fn paths_lines(hits: &[super::Hit]) -> Vec<(String, u32)> {
    hits.iter().map(|h| (h.path.clone(), h.line)).collect()
}

/// Words are found case-insensitively with their 1-based line numbers and a highlighted
/// snippet; blank lines count for numbering.
pub async fn finds_words_with_line_numbers(index: &dyn SearchIndex) -> Result<()> {
    let t = "conf-words";
    let doc = "# Notes\n\nThe user prefers Rust for services.\n- Deploys run on Fridays\n";
    let out = index.upsert_document(t, "memory/a.md", doc).await?;
    assert_eq!(out, UpsertOutcome::Indexed { rows: 3 });
    let hits = index.search(t, "rust", &SearchOptions::default()).await?;
    assert_eq!(paths_lines(&hits), vec![("memory/a.md".to_owned(), 3)]);
    let snippet = &hits[0].snippet;
    assert!(
        snippet.contains(&format!("{}Rust{}", HIGHLIGHT.0, HIGHLIGHT.1)),
        "snippet {snippet:?} does not highlight the match"
    );
    let hits = index
        .search(t, "FRIDAYS", &SearchOptions::default())
        .await?;
    assert_eq!(paths_lines(&hits), vec![("memory/a.md".to_owned(), 4)]);
    let none = index.search(t, "python", &SearchOptions::default()).await?;
    assert!(none.is_empty());
    Ok(())
}

/// The content hash makes an unchanged upsert a no-op; a changed one replaces all rows.
pub async fn skips_unchanged_and_replaces_changed(index: &dyn SearchIndex) -> Result<()> {
    let t = "conf-hash";
    let v1 = "alpha line\nbeta line\n";
    let v2 = "gamma line\n";
    assert_eq!(
        index.upsert_document(t, "f.md", v1).await?,
        UpsertOutcome::Indexed { rows: 2 }
    );
    assert_eq!(
        index.upsert_document(t, "f.md", v1).await?,
        UpsertOutcome::Unchanged
    );
    assert_eq!(
        index.documents(t).await?,
        vec![DocumentInfo {
            path: "f.md".into(),
            hash: content_hash(v1)
        }]
    );
    assert_eq!(
        index.upsert_document(t, "f.md", v2).await?,
        UpsertOutcome::Indexed { rows: 1 }
    );
    assert!(
        index
            .search(t, "alpha", &SearchOptions::default())
            .await?
            .is_empty()
    );
    assert_eq!(
        paths_lines(&index.search(t, "gamma", &SearchOptions::default()).await?),
        vec![("f.md".to_owned(), 1)]
    );
    assert_eq!(
        index.documents(t).await?,
        vec![DocumentInfo {
            path: "f.md".into(),
            hash: content_hash(v2)
        }]
    );
    // An empty document is still a document (the file exists).
    assert_eq!(
        index.upsert_document(t, "empty.md", "").await?,
        UpsertOutcome::Indexed { rows: 0 }
    );
    assert_eq!(index.documents(t).await?.len(), 2);
    Ok(())
}

/// Removal forgets rows and the document, and reports whether there was one.
pub async fn removes_documents(index: &dyn SearchIndex) -> Result<()> {
    let t = "conf-remove";
    index.upsert_document(t, "x.md", "kiwi fruit\n").await?;
    index.upsert_document(t, "y.md", "kiwi bird\n").await?;
    assert!(index.remove_document(t, "x.md").await?);
    assert!(!index.remove_document(t, "x.md").await?);
    let hits = index.search(t, "kiwi", &SearchOptions::default()).await?;
    assert_eq!(paths_lines(&hits), vec![("y.md".to_owned(), 1)]);
    assert_eq!(
        index
            .documents(t)
            .await?
            .into_iter()
            .map(|d| d.path)
            .collect::<Vec<_>>(),
        vec!["y.md".to_owned()]
    );
    // Re-adding the same content after removal indexes it again.
    assert_eq!(
        index.upsert_document(t, "x.md", "kiwi fruit\n").await?,
        UpsertOutcome::Indexed { rows: 1 }
    );
    Ok(())
}

/// Same paths and words in two tenants never mix, including tenants whose names are
/// prefixes of each other.
pub async fn isolates_tenants(index: &dyn SearchIndex) -> Result<()> {
    let (a, b, ab) = ("conf-iso-a", "conf-iso-b", "conf-iso-ab");
    index
        .upsert_document(a, "MEMORY.md", "secret mango plan\n")
        .await?;
    index
        .upsert_document(b, "MEMORY.md", "public mango list\n東京の会議\n")
        .await?;
    index
        .upsert_document(ab, "MEMORY.md", "other mango\n")
        .await?;
    let ha = index.search(a, "mango", &SearchOptions::default()).await?;
    assert_eq!(ha.len(), 1);
    assert!(ha[0].snippet.contains("secret"));
    assert!(
        index
            .search(a, "public", &SearchOptions::default())
            .await?
            .is_empty()
    );
    assert!(
        index
            .search(a, "東京", &SearchOptions::default())
            .await?
            .is_empty()
    );
    assert!(
        index
            .search(a, "東京の会", &SearchOptions::default())
            .await?
            .is_empty()
    );
    let hb = index.search(b, "mango", &SearchOptions::default()).await?;
    assert_eq!(hb.len(), 1);
    assert!(hb[0].snippet.contains("public"));
    assert_eq!(index.documents(a).await?.len(), 1);
    assert!(index.documents("conf-iso-nobody").await?.is_empty());
    // Removing in one tenant leaves the other alone.
    assert!(index.remove_document(a, "MEMORY.md").await?);
    assert_eq!(
        index
            .search(b, "mango", &SearchOptions::default())
            .await?
            .len(),
        1
    );
    Ok(())
}

/// `foo*` matches words starting with `foo`; without the star only the whole word.
pub async fn prefix_queries(index: &dyn SearchIndex) -> Result<()> {
    let t = "conf-prefix";
    index
        .upsert_document(t, "d.md", "deployment failed\nwe deploy daily\nundeploy\n")
        .await?;
    let mut star = paths_lines(
        &index
            .search(t, "deploy*", &SearchOptions::default())
            .await?,
    );
    star.sort();
    assert_eq!(star, vec![("d.md".to_owned(), 1), ("d.md".to_owned(), 2)]);
    let exact = paths_lines(&index.search(t, "deploy", &SearchOptions::default()).await?);
    assert_eq!(exact, vec![("d.md".to_owned(), 2)]);
    Ok(())
}

/// Query syntax, quotes and operators in user text are plain words; nothing fails.
pub async fn hostile_queries_never_fail(index: &dyn SearchIndex) -> Result<()> {
    let t = "conf-hostile";
    index
        .upsert_document(
            t,
            "h.md",
            "C++ and C# notes: don't use \"quotes\"; x AND y OR z\n100% sure_thing\n",
        )
        .await?;
    for q in [
        "\"",
        "\"\"",
        "'",
        "*",
        "**",
        "foo\"bar",
        "AND",
        "OR OR",
        "NOT",
        "NEAR(a b)",
        "a:b",
        "content:x",
        "tkey:t00t",
        "^start",
        "(unbalanced",
        "-minus",
        "+plus",
        "col : \"x\"",
        "'; DROP TABLE lines; --",
        "%",
        "_",
        "\\",
        "\u{0}",
        "😀",
        "é",
        "\u{301}",
        "«»",
        "",
        "   ",
        "C++",
        "don't",
        "100%",
    ] {
        let r = index.search(t, q, &SearchOptions::default()).await;
        assert!(r.is_ok(), "query {q:?} failed: {r:?}");
    }
    let hits = index
        .search(t, "\"quotes\"", &SearchOptions::default())
        .await?;
    assert_eq!(paths_lines(&hits), vec![("h.md".to_owned(), 1)]);
    let hits = index.search(t, "AND", &SearchOptions::default()).await?;
    assert_eq!(paths_lines(&hits), vec![("h.md".to_owned(), 1)]);
    let hits = index
        .search(t, "sure_thing", &SearchOptions::default())
        .await?;
    assert_eq!(paths_lines(&hits), vec![("h.md".to_owned(), 2)]);
    Ok(())
}

/// Lines with every term win; when none has all of them, lines with any term are returned.
pub async fn all_terms_then_any_term(index: &dyn SearchIndex) -> Result<()> {
    let t = "conf-andor";
    index
        .upsert_document(t, "a.md", "red apple\ngreen apple\nred car\n")
        .await?;
    let both = paths_lines(
        &index
            .search(t, "red apple", &SearchOptions::default())
            .await?,
    );
    assert_eq!(both, vec![("a.md".to_owned(), 1)]);
    let mut either = paths_lines(
        &index
            .search(t, "green banana car", &SearchOptions::default())
            .await?,
    );
    either.sort();
    assert_eq!(either, vec![("a.md".to_owned(), 2), ("a.md".to_owned(), 3)]);
    Ok(())
}

/// `path_prefix` restricts documents (literally: `_` and `%` are not wildcards); `limit`
/// caps the hits; a zero limit returns nothing.
pub async fn path_prefix_and_limit(index: &dyn SearchIndex) -> Result<()> {
    let t = "conf-prefix-limit";
    let many: String = (0..30).map(|i| format!("lemon {i}\n")).collect();
    index.upsert_document(t, "memory/a_b.md", &many).await?;
    index
        .upsert_document(t, "memoryXa.md", "lemon outside\n")
        .await?;
    index
        .upsert_document(t, "notes/n.md", "lemon note\n")
        .await?;
    let hits = index
        .search(
            t,
            "lemon",
            &SearchOptions::limit(100).with_path_prefix("memory/"),
        )
        .await?;
    assert_eq!(hits.len(), 30);
    assert!(hits.iter().all(|h| h.path == "memory/a_b.md"));
    let hits = index
        .search(
            t,
            "lemon",
            &SearchOptions::limit(5).with_path_prefix("memory/a_"),
        )
        .await?;
    assert_eq!(hits.len(), 5);
    let hits = index
        .search(
            t,
            "lemon",
            &SearchOptions::limit(100).with_path_prefix("memory%"),
        )
        .await?;
    assert!(hits.is_empty());
    assert_eq!(
        index
            .search(t, "lemon", &SearchOptions::default())
            .await?
            .len(),
        super::DEFAULT_SEARCH_LIMIT
    );
    assert!(
        index
            .search(t, "lemon", &SearchOptions::limit(0))
            .await?
            .is_empty()
    );
    Ok(())
}

/// A short line that repeats the word ranks above a long line that mentions it once.
pub async fn ranks_better_hits_first(index: &dyn SearchIndex) -> Result<()> {
    let t = "conf-rank";
    let long = format!(
        "postgres {}\n",
        (0..40)
            .map(|i| format!("word{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    index.upsert_document(t, "long.md", &long).await?;
    index
        .upsert_document(t, "short.md", "postgres postgres tuning\n")
        .await?;
    let hits = index
        .search(t, "postgres", &SearchOptions::default())
        .await?;
    assert_eq!(
        hits.iter().map(|h| h.path.as_str()).collect::<Vec<_>>(),
        vec!["short.md", "long.md"]
    );
    assert!(hits[0].score > hits[1].score);
    Ok(())
}

/// Chinese and Japanese queries of one, two and three or more characters find their line.
pub async fn cjk_queries(index: &dyn SearchIndex) -> Result<()> {
    let t = "conf-cjk";
    let doc = "用户喜欢喝咖啡\n项目截止日期是周五\n東京で会議があります\nplain english line\n混合 mixed 内容\n";
    index.upsert_document(t, "memory/zh.md", doc).await?;
    let find = |q: &'static str| async move {
        Ok::<_, Error>(paths_lines(
            &index.search(t, q, &SearchOptions::default()).await?,
        ))
    };
    let l = |n: u32| vec![("memory/zh.md".to_owned(), n)];
    assert_eq!(find("咖啡").await?, l(1));
    assert_eq!(find("喝咖啡").await?, l(1));
    assert_eq!(find("截止日期").await?, l(2));
    assert_eq!(find("周五").await?, l(2));
    assert_eq!(find("会議").await?, l(3));
    assert_eq!(find("東京で会議").await?, l(3));
    assert_eq!(find("啡").await?, l(1));
    assert_eq!(find("混合 mixed").await?, l(5));
    assert!(find("茶").await?.is_empty());
    assert!(find("喝红茶").await?.is_empty());
    let hits = index.search(t, "咖啡", &SearchOptions::default()).await?;
    assert!(
        hits[0]
            .snippet
            .contains(&format!("{}咖啡{}", HIGHLIGHT.0, HIGHLIGHT.1)),
        "snippet {:?}",
        hits[0].snippet
    );
    Ok(())
}

/// An empty tenant is refused rather than silently shared.
pub async fn rejects_empty_tenant(index: &dyn SearchIndex) -> Result<()> {
    assert!(matches!(
        index.upsert_document("", "a.md", "x").await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        index.search("", "x", &SearchOptions::default()).await,
        Err(Error::InvalidInput(_))
    ));
    Ok(())
}
