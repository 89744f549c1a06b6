//! Benchmark of `PgIndex` on a real PostgreSQL: upsert throughput and search latency
//! p50/p99 over `HAME_BENCH_FACTS` facts (default 100,000), in tables of their own that are
//! dropped at the end (kept with `HAME_BENCH_KEEP=1`, to inspect plans).
//!
//! `HAME_TEST_POSTGRES_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres \
//!  cargo bench -p hame-memory --features postgres --bench postgres`
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

mod common;

use std::time::Instant;

use common::{
    FACTS_PER_DOC, Searches, TENANT, doc, doc_path, facts_count, index_facts, ms, percentile,
    runtime,
};
use hame_memory::{PgIndex, PgIndexOptions, SearchIndex, UpsertOutcome};

const ROUNDS: usize = 50;

fn main() {
    let Some(url) = std::env::var("HAME_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!("hame-memory postgres bench: SKIPPED: HAME_TEST_POSTGRES_URL is not set");
        return;
    };
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this binary too: only
    // measure when asked to.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("hame-memory postgres bench: not run as `cargo bench`; nothing measured");
        return;
    }
    let n = facts_count(100_000);
    let rt = runtime();
    let prefix = format!("hame_bench_{}_", std::process::id());
    let index = rt
        .block_on(PgIndex::connect(
            &url,
            PgIndexOptions::default().with_table_prefix(prefix),
        ))
        .unwrap();
    println!(
        "PgIndex bench: {n} facts, {FACTS_PER_DOC} per document, trigram index: {}",
        index.has_trigram_index()
    );
    // 1. Initial indexing, one document after the other.
    let docs = index_facts(&rt, &index, n);

    let pool = rt.block_on(sqlx::PgPool::connect(&url)).unwrap();
    let size: i64 = rt
        .block_on(
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT pg_total_relation_size('{p}lines') + pg_total_relation_size('{p}docs')",
                p = index.table_prefix()
            )))
            .fetch_one(&pool),
        )
        .unwrap();
    println!("tables with indexes: {:.0} MB", size as f64 / 1e6);

    // 2. Unchanged upserts (hash skip) of every document.
    let texts: Vec<String> = (0..docs).map(|d| doc(d, n, 0)).collect();
    let start = Instant::now();
    rt.block_on(async {
        for (d, text) in texts.iter().enumerate() {
            let out = index
                .upsert_document(TENANT, &doc_path(d), text)
                .await
                .unwrap();
            assert_eq!(out, UpsertOutcome::Unchanged);
        }
    });
    println!(
        "unchanged upsert (hash skip): {:.2} ms per document",
        ms(start.elapsed()) / docs as f64
    );

    // 3. Replacing one 1,000-fact document with changed content.
    let mut times = Vec::new();
    rt.block_on(async {
        for round in 1..=20 {
            let text = doc(0, n, round * 7_919);
            let t = Instant::now();
            index
                .upsert_document(TENANT, &doc_path(0), &text)
                .await
                .unwrap();
            times.push(t.elapsed());
        }
    });
    times.sort();
    println!(
        "replace a {FACTS_PER_DOC}-fact document: p50 {:.1} ms ({:.0} facts/s), p99 {:.1} ms",
        ms(percentile(&times, 0.5)),
        FACTS_PER_DOC as f64 / percentile(&times, 0.5).as_secs_f64(),
        ms(percentile(&times, 0.99))
    );
    // Restore the original document so the searches below see the indexed facts.
    rt.block_on(index.upsert_document(TENANT, &doc_path(0), &texts[0]))
        .unwrap();

    // Steady state, as autovacuum leaves it after a bulk load: otherwise the first
    // searches pay for statistics, hint bits and a concurrent autovacuum.
    rt.block_on(
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "VACUUM ANALYZE {p}lines, {p}docs",
            p = index.table_prefix()
        )))
        .execute(&pool),
    )
    .unwrap();

    // 4. Searches.
    let mut searches = common::standard_searches(&["12345", "999", "54321", "70001"]);
    searches.push(Searches {
        label: "no match, 2 words (AND, then OR fallback)",
        queries: &["zzzz yyyy", "qqqq wwww", "xxxx vvvv", "kkkk jjjj"],
        must_hit: false,
    });
    common::time_searches(&rt, &index, &searches, ROUNDS);

    if std::env::var("HAME_BENCH_KEEP").is_ok_and(|v| v == "1") {
        println!("tables kept: {}*", index.table_prefix());
    } else {
        rt.block_on(index.drop_tables()).unwrap();
    }
}
