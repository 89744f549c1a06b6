//! What both benches share: the synthetic facts (the same in both, so SQLite and
//! PostgreSQL figures compare), indexing them, and timing search queries.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

use std::time::{Duration, Instant};

use hame_memory::{SearchIndex, SearchOptions};

/// The one tenant of the benches.
pub const TENANT: &str = "bench";
/// Facts per indexed document.
pub const FACTS_PER_DOC: usize = 1_000;

/// The English vocabulary of the facts.
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
/// The Chinese words of the facts.
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

/// `HAME_BENCH_FACTS`, or `default`.
pub fn facts_count(default: usize) -> usize {
    std::env::var("HAME_BENCH_FACTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A deterministic pseudo-random short fact: ~8 words from a 50-word vocabulary; every 20th
/// is Chinese.
pub fn fact(i: usize) -> String {
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

/// Document `d` of `n` facts: facts `d × FACTS_PER_DOC + salt…` (at most `FACTS_PER_DOC`,
/// none past `n`), one a line.
pub fn doc(d: usize, n: usize, salt: usize) -> String {
    let lo = d * FACTS_PER_DOC;
    let hi = (lo + FACTS_PER_DOC).min(n);
    (lo..hi).map(|i| fact(i + salt) + "\n").collect()
}

/// The path of document `d`.
pub fn doc_path(d: usize) -> String {
    format!("memory/doc-{d:05}.md")
}

/// The runtime of the benches: two workers, as the two cores of the CI container.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The `p` quantile of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Indexes `n` facts as documents of [`FACTS_PER_DOC`], one upsert after the other, and
/// prints the throughput. Returns the number of documents.
pub fn index_facts(rt: &tokio::runtime::Runtime, index: &dyn SearchIndex, n: usize) -> usize {
    let docs = n.div_ceil(FACTS_PER_DOC);
    let start = Instant::now();
    rt.block_on(async {
        for d in 0..docs {
            index
                .upsert_document(TENANT, &doc_path(d), &doc(d, n, 0))
                .await
                .unwrap();
        }
    });
    let took = start.elapsed();
    println!(
        "indexed {n} facts in {docs} upserts of up to {FACTS_PER_DOC} in {:.1} s: {:.0} facts/s",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
    docs
}

/// A group of search queries timed together.
pub struct Searches {
    /// Printed with the figures.
    pub label: &'static str,
    /// The queries, each run `rounds` times.
    pub queries: &'static [&'static str],
    /// Whether every query must find something (checked in the first round).
    pub must_hit: bool,
}

/// The query groups both benches time: common words, a prefix, CJK of 3+ and of 2
/// characters, and `rare` (fact numbers, about one hit each; which numbers exist depends on
/// the number of facts).
pub fn standard_searches(rare: &'static [&'static str]) -> Vec<Searches> {
    vec![
        Searches {
            label: "2 common words",
            queries: &[
                "deploy rust",
                "billing alice",
                "postgres latency",
                "tokyo meeting",
            ],
            must_hit: true,
        },
        Searches {
            label: "prefix of a common word",
            queries: &["migr*", "encrypt*", "dead*", "rollb*"],
            must_hit: true,
        },
        Searches {
            label: "CJK 3+ chars (trigram)",
            queries: &["数据库", "负责人", "咖啡项目", "截止日期"],
            must_hit: true,
        },
        Searches {
            label: "CJK 2 chars",
            queries: &["咖啡", "东京", "预算", "发布"],
            must_hit: true,
        },
        Searches {
            label: "rare word (a fact number, ~1 hit)",
            queries: rare,
            must_hit: false,
        },
    ]
}

/// Runs every group's queries `rounds` times and prints p50 and p99 per group.
pub fn time_searches(
    rt: &tokio::runtime::Runtime,
    index: &dyn SearchIndex,
    groups: &[Searches],
    rounds: usize,
) {
    let opts = SearchOptions::default();
    for group in groups {
        let mut times = Vec::new();
        for round in 0..rounds {
            for q in group.queries {
                let t = Instant::now();
                let hits = rt.block_on(index.search(TENANT, q, &opts)).unwrap();
                times.push(t.elapsed());
                if round == 0 && group.must_hit {
                    assert!(!hits.is_empty(), "{q}: no hits");
                }
            }
        }
        times.sort();
        println!(
            "search {}: p50 {:.2} ms, p99 {:.2} ms ({} queries)",
            group.label,
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.99)),
            times.len()
        );
    }
}
