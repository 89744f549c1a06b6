//! `PgIndex` against a real PostgreSQL (`HAME_TEST_POSTGRES_URL`). Every test uses its own
//! table prefix, so parallel runs and other test binaries never collide.
#![allow(clippy::print_stderr)]

use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::index::{conformance, parse_query};
use pretty_assertions::assert_eq;

const URL_VAR: &str = "HAME_TEST_POSTGRES_URL";

/// The server URL, or `None` after a loud SKIPPED line; under CI a missing server
/// fails the test.
fn service_url() -> Option<String> {
    hame_test_env::service(URL_VAR, "PostgreSQL search index")
}

/// A table prefix no other test (or test run) uses.
fn unique_prefix(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "hmt_{tag}_{}_{}_{}_",
        std::process::id(),
        nanos % 1_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn fresh(tag: &str) -> Result<Option<(String, PgIndex)>> {
    let Some(url) = service_url() else {
        return Ok(None);
    };
    let options = PgIndexOptions::default().with_table_prefix(unique_prefix(tag));
    let index = PgIndex::connect(&url, options).await?;
    Ok(Some((url, index)))
}

#[tokio::test]
async fn conformance_through_arc_dyn() -> Result<()> {
    let Some((_, index)) = fresh("conf").await? else {
        return Ok(());
    };
    assert!(
        index.has_trigram_index(),
        "pg_trgm ships with PostgreSQL 15 on Debian"
    );
    let shared: Arc<dyn SearchIndex> = Arc::new(index.clone());
    conformance::run_all(&shared).await?;
    index.drop_tables().await
}

#[tokio::test]
async fn conformance_without_trigram_index() -> Result<()> {
    let Some(url) = service_url() else {
        return Ok(());
    };
    let options = PgIndexOptions {
        trigram: false,
        ..PgIndexOptions::default().with_table_prefix(unique_prefix("notrgm"))
    };
    let index = PgIndex::connect(&url, options).await?;
    assert!(!index.has_trigram_index());
    conformance::run_all(&index).await?;
    index.drop_tables().await
}

#[tokio::test]
async fn two_indexes_with_one_prefix_share_tables_and_version() -> Result<()> {
    let Some((url, a)) = fresh("ver").await? else {
        return Ok(());
    };
    let options = PgIndexOptions::default().with_table_prefix(a.table_prefix());
    // Connecting again (another replica) is idempotent and sees the same rows.
    a.upsert_document("t", "m.md", "shared replica fact\n")
        .await?;
    let b = PgIndex::connect(&url, options.clone()).await?;
    assert_eq!(
        b.search("t", "replica", &SearchOptions::default())
            .await?
            .len(),
        1
    );
    let p = a.table_prefix().to_owned();
    let version: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT value FROM {p}meta WHERE key = 'schema_version'"
    )))
    .fetch_one(&a.pool)
    .await
    .map_err(pg("read version"))?;
    assert_eq!(version, PG_SCHEMA_VERSION);
    // A newer layout is refused rather than written into.
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {p}meta SET value = 99 WHERE key = 'schema_version'"
    )))
    .execute(&a.pool)
    .await
    .map_err(pg("bump version"))?;
    let err = PgIndex::connect(&url, options.clone()).await;
    assert!(
        matches!(&err, Err(Error::Index { message, .. }) if message.contains("schema version 99")),
        "{err:?}"
    );
    a.drop_tables().await?;
    // After dropping, a connect creates everything again.
    let c = PgIndex::connect(&url, options).await?;
    assert!(c.documents("t").await?.is_empty());
    c.drop_tables().await
}

#[test]
fn table_prefixes_are_validated() {
    for bad in [
        "",
        "Upper_",
        "1abc",
        "a-b",
        "a b",
        "x;drop",
        "é",
        &"a".repeat(41),
    ] {
        assert!(
            matches!(check_prefix(bad), Err(Error::InvalidInput(_))),
            "{bad:?} accepted"
        );
    }
    for good in ["hame_memory_", "_x", "a1_", &"a".repeat(40)] {
        assert!(check_prefix(good).is_ok(), "{good:?} refused");
    }
}

#[tokio::test]
async fn invalid_prefix_fails_before_connecting() {
    let r = PgIndex::connect(
        "postgres://nobody@127.0.0.1:1/none",
        PgIndexOptions::default().with_table_prefix("bad-prefix"),
    )
    .await;
    assert!(matches!(r, Err(Error::InvalidInput(_))), "{r:?}");
}

#[test]
fn tsquery_text_quotes_every_word() -> std::result::Result<(), String> {
    let q = parse_query("it's foo* a:b:c* x'y \\ NOT").ok_or("no query")?;
    assert_eq!(
        tsquery_text(&q, false),
        "('it' <-> 's') & ('foo':*) & ('a' <-> 'b' <-> 'c':*) & ('x' <-> 'y') & ('not')"
    );
    let q = parse_query("red apple").ok_or("no query")?;
    assert_eq!(tsquery_text(&q, true), "('red') | ('apple')");
    assert_eq!(quote_lexeme("o'k\\"), "'o''k\\\\'");
    assert_eq!(ilike_pattern("a%b_c\\"), "%a\\%b\\_c\\\\%");
    Ok(())
}

/// Inputs aimed at tsquery syntax, LIKE patterns, SQL quoting and encodings, beyond the
/// conformance suite's list. None may fail.
const HOSTILE: &[&str] = &[
    "foo & bar",
    "foo | bar",
    "!foo",
    "!!",
    "a <-> b",
    "a <2> b",
    "<->",
    "'foo':*",
    "foo:*A",
    "foo:*",
    ":*",
    "(",
    ")",
    "()",
    "&|!",
    "'''",
    "\\'",
    "\\\\",
    "$1",
    "$$ $$",
    "E'\\x00'",
    "x::tsquery",
    "'; SELECT pg_sleep(10); --",
    "\" OR 1=1 --",
    "%咖%",
    "_啡",
    "咖'啡",
    "咖\\啡",
    "咖\u{0}啡",
    "a\u{0}b",
    "\u{0}\u{0}",
    "***a",
    "a*b*",
    "foo**",
    "-foo -bar",
    "\"foo bar\"",
    "example.com",
    "/usr/bin/env",
    "3.14159",
    "user@example.com",
    "🦀 rust 🦀",
    "مرحبا بالعالم",
    "a\u{301}\u{301}\u{301}",
    "\u{feff}bom",
    "\u{200b}zero\u{200b}width",
    "ＡＢＣ１２３",
    "İstanbul ß ǅ",
    "\r\n\t",
    "咖啡 & 'x' | !y",
    "テスト%_\\",
];

#[tokio::test]
async fn hostile_queries_never_fail_on_postgres() -> Result<()> {
    let Some((_, index)) = fresh("hostile").await? else {
        return Ok(());
    };
    let t = "hostile";
    index
        .upsert_document(
            t,
            "h.md",
            "foo & bar | baz: 'quoted' <-> op\n咖啡%_\\ 咖'啡\nexample.com 3.14159 /usr/bin/env\n",
        )
        .await?;
    let long_words: String = (0..500).map(|i| format!("w{i} ")).collect();
    let long_cjk = "咖".repeat(3_000);
    // Words longer than PostgreSQL's 2,047-byte lexeme limit (4-byte letters).
    let long_word = "\u{1D400}".repeat(1_000);
    let long_prefix = format!("{}*", "a".repeat(5_000));
    let mut inputs: Vec<&str> = HOSTILE.to_vec();
    inputs.extend([&*long_words, &*long_cjk, &*long_word, &*long_prefix]);
    assert!(inputs.len() >= 50);
    for q in inputs {
        for options in [
            SearchOptions::default(),
            SearchOptions::default().with_path_prefix(q),
        ] {
            let r = index.search(t, q, &options).await;
            assert!(r.is_ok(), "query {q:?} failed: {r:?}");
        }
    }
    // Operators are words; punctuation-joined words are phrases.
    let find = |q: &'static str| {
        let index = index.clone();
        async move {
            let hits = index.search(t, q, &SearchOptions::default()).await?;
            Ok::<_, Error>(hits.iter().map(|h| h.line).collect::<Vec<_>>())
        }
    };
    assert_eq!(find("'quoted'").await?, vec![1]);
    assert_eq!(find("example.com").await?, vec![3]);
    assert_eq!(find("example").await?, vec![3]);
    assert_eq!(find("3.14159").await?, vec![3]);
    assert_eq!(find("usr/bin").await?, vec![3]);
    assert_eq!(find("咖'啡").await?, vec![2]);
    assert_eq!(find("%_").await?, Vec::<u32>::new());
    index.drop_tables().await
}

#[tokio::test]
async fn nul_characters_are_handled() -> Result<()> {
    let Some((_, index)) = fresh("nul").await? else {
        return Ok(());
    };
    let out = index
        .upsert_document("t", "n.md", "before\u{0}after words\n")
        .await?;
    assert_eq!(out, UpsertOutcome::Indexed { rows: 1 });
    let hits = index
        .search("t", "after", &SearchOptions::default())
        .await?;
    assert_eq!(hits.len(), 1);
    // The hash is of the original content, so the skip still works.
    assert_eq!(
        index
            .upsert_document("t", "n.md", "before\u{0}after words\n")
            .await?,
        UpsertOutcome::Unchanged
    );
    assert!(matches!(
        index.upsert_document("t\u{0}x", "n.md", "x").await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        index.upsert_document("t", "n\u{0}.md", "x").await,
        Err(Error::InvalidInput(_))
    ));
    assert!(!index.remove_document("t", "n\u{0}.md").await?);
    index.drop_tables().await
}

#[tokio::test]
async fn long_lines_keep_their_line_number() -> Result<()> {
    let Some((_, index)) = fresh("chunks").await? else {
        return Ok(());
    };
    let long = format!(
        "{} needle {}",
        "hay ".repeat(600),
        "咖啡 straw ".repeat(400)
    );
    let doc = format!("first\n\n{long}\nlast\n");
    let rows = split_rows(&doc).len();
    assert!(rows > 3);
    assert_eq!(
        index.upsert_document("t", "c.md", &doc).await?,
        UpsertOutcome::Indexed { rows }
    );
    let lines = |hits: Vec<Hit>| hits.iter().map(|h| h.line).collect::<Vec<_>>();
    assert_eq!(
        lines(
            index
                .search("t", "needle", &SearchOptions::default())
                .await?
        ),
        vec![3]
    );
    let straw = lines(index.search("t", "咖啡", &SearchOptions::limit(50)).await?);
    assert!(
        !straw.is_empty() && straw.iter().all(|&l| l == 3),
        "{straw:?}"
    );
    index.drop_tables().await
}

#[tokio::test]
async fn concurrent_upserts_of_one_document_leave_one_version() -> Result<()> {
    let Some((_, index)) = fresh("race").await? else {
        return Ok(());
    };
    let mut tasks = Vec::new();
    for i in 0..12 {
        let index = index.clone();
        tasks.push(tokio::spawn(async move {
            let doc: String = (0..50).map(|k| format!("racer {i} line {k}\n")).collect();
            index.upsert_document("t", "same.md", &doc).await
        }));
    }
    for t in tasks {
        t.await.map_err(|e| Error::index("join", e))??;
    }
    let p = index.table_prefix().to_owned();
    let (rows, versions): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT count(*), count(DISTINCT split_part(content, ' ', 2)) FROM {p}lines \
         WHERE tenant = 't' AND path = 'same.md'"
    )))
    .fetch_one(&index.pool)
    .await
    .map_err(pg("count rows"))?;
    assert_eq!((rows, versions), (50, 1));
    let docs = index.documents("t").await?;
    assert_eq!(docs.len(), 1);
    let hits = index
        .search("t", "racer", &SearchOptions::limit(200))
        .await?;
    assert_eq!(hits.len(), 50);
    index.drop_tables().await
}

#[tokio::test]
async fn tenants_scope_inside_the_statement() -> Result<()> {
    let Some((_, index)) = fresh("tenant").await? else {
        return Ok(());
    };
    // Many rows of a noisy tenant must not crowd the quiet tenant's hits out of LIMIT.
    let noisy: String = (0..500).map(|i| format!("shared word {i}\n")).collect();
    index.upsert_document("noisy", "m.md", &noisy).await?;
    index
        .upsert_document("quiet", "m.md", "shared word once\n共享的词\n")
        .await?;
    let hits = index
        .search("quiet", "shared", &SearchOptions::limit(1))
        .await?;
    assert_eq!(hits.len(), 1);
    assert!(hits[0].snippet.contains("once"));
    assert_eq!(
        index
            .search("quiet", "共享", &SearchOptions::default())
            .await?
            .len(),
        1
    );
    assert!(
        index
            .search("noisy", "共享", &SearchOptions::default())
            .await?
            .is_empty()
    );
    index.drop_tables().await
}

mod property {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Any text, including control characters and mixed scripts, is a valid query.
        #[test]
        fn arbitrary_queries_never_fail(q in "\\PC{0,40}|[ -~\u{0}'\"\\\\%_*:&|!()<>咖啡東京]{0,30}") {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let outcome: Result<()> = rt.block_on(async {
                let Some(index) = shared_index().await? else { return Ok(()) };
                index.search("prop", &q, &SearchOptions::default()).await?;
                index
                    .search("prop", &q, &SearchOptions::default().with_path_prefix(q.clone()))
                    .await?;
                Ok(())
            });
            prop_assert!(outcome.is_ok(), "query {:?}: {:?}", q, outcome);
        }
    }

    /// One fixed prefix for all cases and runs: they only write the same document (an
    /// unchanged upsert after the first) and search, so concurrent runs can share it and
    /// nothing is left behind per run. Each case builds its own runtime, so its own pool.
    async fn shared_index() -> Result<Option<PgIndex>> {
        let Some(url) = service_url() else {
            return Ok(None);
        };
        let options = PgIndexOptions {
            table_prefix: "hame_memory_proptest_".to_owned(),
            max_connections: 1,
            ..PgIndexOptions::default()
        };
        let index = PgIndex::connect(&url, options).await?;
        index
            .upsert_document("prop", "p.md", "咖啡 rust 'x' & y\n東京 z:*\n")
            .await?;
        Ok(Some(index))
    }
}
