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

use std::time::{Duration, Instant};

use hame_memory::{PgIndex, PgIndexOptions, SearchIndex, SearchOptions, UpsertOutcome};

const TENANT: &str = "bench";
const FACTS_PER_DOC: usize = 1_000;
const ROUNDS: usize = 50;

const WORDS: &[&str] = &[
    "user",
    "prefers",
    "rust",
    "deploy",
    "friday",
    "service",
    "billing",
    "alice",
    "bob",
    "database",
    "postgres",
    "redis",
    "cache",
    "latency",
    "budget",
    "deadline",
    "review",
    "incident",
    "rollback",
    "kubernetes",
    "cluster",
    "region",
    "europe",
    "tokyo",
    "customer",
    "invoice",
    "migration",
    "schema",
    "index",
    "query",
    "release",
    "version",
    "feature",
    "flag",
    "owner",
    "team",
    "meeting",
    "monday",
    "weekly",
    "report",
    "metrics",
    "alert",
    "threshold",
    "backup",
    "restore",
    "encryption",
    "key",
    "rotation",
    "audit",
    "policy",
];
const CJK: &[&str] = &[
    "用户",
    "喜欢",
    "咖啡",
    "项目",
    "截止",
    "日期",
    "周五",
    "部署",
    "数据库",
    "会议",
    "东京",
    "负责人",
    "预算",
    "发布",
];

/// The same deterministic facts as the SQLite bench (`benches/memory.rs`): ~8-word English
/// lines from a 50-word vocabulary, every 20th Chinese.
fn fact(i: usize) -> String {
    let mut x = (i as u64)
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1);
    let mut next = |n: usize| {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        (x % n as u64) as usize
    };
    if i.is_multiple_of(20) {
        let parts: Vec<&str> = (0..5).map(|_| CJK[next(CJK.len())]).collect();
        return format!("- {}，编号 {i}", parts.concat());
    }
    let words: Vec<&str> = (0..8).map(|_| WORDS[next(WORDS.len())]).collect();
    format!("- {} (fact {i})", words.join(" "))
}

fn doc(d: usize, n: usize, salt: usize) -> String {
    let lo = d * FACTS_PER_DOC;
    let hi = (lo + FACTS_PER_DOC).min(n);
    (lo..hi).map(|i| fact(i + salt) + "\n").collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

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
    let n: usize = std::env::var("HAME_BENCH_FACTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
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
    let docs = n.div_ceil(FACTS_PER_DOC);

    // 1. Initial indexing, one document after the other.
    let start = Instant::now();
    rt.block_on(async {
        for d in 0..docs {
            index
                .upsert_document(TENANT, &format!("memory/doc-{d:05}.md"), &doc(d, n, 0))
                .await
                .unwrap();
        }
    });
    let took = start.elapsed();
    println!(
        "indexed {n} facts in {docs} upserts in {:.1} s: {:.0} facts/s",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );

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
                .upsert_document(TENANT, &format!("memory/doc-{d:05}.md"), text)
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
                .upsert_document(TENANT, "memory/doc-00000.md", &text)
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
    rt.block_on(index.upsert_document(TENANT, "memory/doc-00000.md", &texts[0]))
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
    for (label, queries) in [
        (
            "2 common words",
            vec![
                "deploy rust",
                "billing alice",
                "postgres latency",
                "tokyo meeting",
            ],
        ),
        (
            "prefix of a common word",
            vec!["migr*", "encrypt*", "dead*", "rollb*"],
        ),
        (
            "CJK 3+ chars (trigram index)",
            vec!["数据库", "负责人", "咖啡项目", "截止日期"],
        ),
        ("CJK 2 chars", vec!["咖啡", "东京", "预算", "发布"]),
        (
            "no match, 2 words (AND, then OR fallback)",
            vec!["zzzz yyyy", "qqqq wwww", "xxxx vvvv", "kkkk jjjj"],
        ),
        (
            "rare word (a fact number, ~1 hit)",
            vec!["12345", "999", "54321", "70001"],
        ),
    ] {
        let mut times = Vec::new();
        let opts = SearchOptions::default();
        for round in 0..ROUNDS {
            for q in &queries {
                let t = Instant::now();
                let hits = rt.block_on(index.search(TENANT, q, &opts)).unwrap();
                times.push(t.elapsed());
                if round == 0 && !label.starts_with("no match") && !label.starts_with("rare") {
                    assert!(!hits.is_empty(), "{q}: no hits");
                }
            }
        }
        times.sort();
        println!(
            "search {label}: p50 {:.2} ms, p99 {:.2} ms ({} queries)",
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.99)),
            times.len()
        );
    }
    if std::env::var("HAME_BENCH_KEEP").is_ok_and(|v| v == "1") {
        println!("tables kept: {}*", index.table_prefix());
    } else {
        rt.block_on(index.drop_tables()).unwrap();
    }
}
