//! Benchmarks of hame-memory: indexing throughput and search latency over a large index
//! (`HAME_BENCH_FACTS` facts, default 1,000,000), and compaction planning of a
//! 500-message session. Run with `cargo bench -p hame-memory --bench memory`.
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_precision_loss
)]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use divan::counter::ItemsCount;
use hame_core::{ContentBlock, Message, Role, ToolCall, ToolResult};
use hame_memory::compaction::{CompactionPolicy, plan_forced};
use hame_memory::tokens::EstimateCounter;
use hame_memory::{SearchIndex, SearchOptions, SqliteIndex};

const TENANT: &str = "bench";
const FACTS_PER_DOC: usize = 1_000;

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

fn facts_count() -> usize {
    std::env::var("HAME_BENCH_FACTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// A deterministic pseudo-random short fact; every 20th is Chinese.
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

struct Big {
    rt: tokio::runtime::Runtime,
    index: SqliteIndex,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn big() -> &'static Big {
    static BIG: OnceLock<Big> = OnceLock::new();
    BIG.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let path = std::env::temp_dir().join(format!("hame-bench-{}.db", std::process::id()));
        for s in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{s}", path.display()));
        }
        let index = rt.block_on(SqliteIndex::open(&path)).unwrap();
        let n = facts_count();
        let docs = n.div_ceil(FACTS_PER_DOC);
        let start = Instant::now();
        rt.block_on(async {
            for d in 0..docs {
                let lo = d * FACTS_PER_DOC;
                let hi = (lo + FACTS_PER_DOC).min(n);
                let text: String = (lo..hi).map(|i| fact(i) + "\n").collect();
                index
                    .upsert_document(TENANT, &format!("memory/doc-{d:05}.md"), &text)
                    .await
                    .unwrap();
            }
        });
        let took = start.elapsed();
        println!(
            "indexed {n} facts in {docs} documents in {:.1} s: {:.0} facts/s",
            took.as_secs_f64(),
            n as f64 / took.as_secs_f64()
        );
        let size: u64 = ["", "-wal"]
            .iter()
            .filter_map(|s| std::fs::metadata(format!("{}{s}", path.display())).ok())
            .map(|m| m.len())
            .sum();
        println!("index size on disk: {:.0} MB", size as f64 / 1e6);
        for (label, queries) in [
            (
                "word (2 terms)",
                vec![
                    "deploy rust",
                    "billing alice",
                    "postgres latency",
                    "tokyo meeting",
                ],
            ),
            ("prefix", vec!["migr*", "encrypt*", "dead*", "rollb*"]),
            (
                "rare (fact number)",
                vec!["123457", "999", "54321", "700001"],
            ),
            (
                "CJK 3+ chars (trigram)",
                vec!["数据库", "负责人", "咖啡项目", "截止日期"],
            ),
            ("CJK 2 chars (scan)", vec!["咖啡", "东京", "预算", "发布"]),
        ] {
            let mut times = Vec::new();
            let opts = SearchOptions::default();
            for round in 0..50 {
                for q in &queries {
                    let t = Instant::now();
                    let hits = rt.block_on(index.search(TENANT, q, &opts)).unwrap();
                    times.push(t.elapsed());
                    if round == 0 {
                        assert!(
                            !hits.is_empty() || label.starts_with("rare"),
                            "{q}: no hits"
                        );
                    }
                }
            }
            times.sort();
            println!(
                "search {label}: p50 {:.2} ms, p99 {:.2} ms ({} queries)",
                percentile(&times, 0.5).as_secs_f64() * 1e3,
                percentile(&times, 0.99).as_secs_f64() * 1e3,
                times.len()
            );
        }
        Big { rt, index }
    })
}

#[divan::bench(sample_count = 50)]
fn search_words(bencher: divan::Bencher) {
    let b = big();
    let opts = SearchOptions::default();
    bencher.bench(|| {
        b.rt.block_on(b.index.search(TENANT, "deploy rust", &opts))
            .unwrap()
    });
}

#[divan::bench(sample_count = 50)]
fn search_cjk_trigram(bencher: divan::Bencher) {
    let b = big();
    let opts = SearchOptions::default();
    bencher.bench(|| {
        b.rt.block_on(b.index.search(TENANT, "数据库", &opts))
            .unwrap()
    });
}

#[divan::bench(sample_count = 20)]
fn upsert_1000_fact_document(bencher: divan::Bencher) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let index = SqliteIndex::open_in_memory().unwrap();
    let mut round = 0usize;
    bencher
        .counter(ItemsCount::new(FACTS_PER_DOC))
        .bench_local(|| {
            round += 1;
            let text: String = (round * FACTS_PER_DOC..(round + 1) * FACTS_PER_DOC)
                .map(|i| fact(i) + "\n")
                .collect();
            rt.block_on(index.upsert_document(TENANT, "memory/doc.md", &text))
                .unwrap()
        });
}

fn session(n: usize) -> Vec<Message> {
    let mut msgs = Vec::with_capacity(n);
    let mut i = 0;
    while msgs.len() < n {
        msgs.push(Message::user(format!(
            "request {i}: please look at file {i}"
        )));
        let id = format!("call_{i}");
        msgs.push(Message {
            role: Role::Assistant,
            content: vec![ContentBlock::ToolCall(ToolCall {
                id: id.clone(),
                name: "read_file".into(),
                arguments: format!("{{\"file_path\":\"/src/{i}.rs\"}}"),
            })],
            usage: None,
        });
        msgs.push(Message::tool_results(vec![ToolResult {
            id,
            content: "fn main() {}\n".repeat(40),
            is_error: false,
            code: None,
        }]));
        msgs.push(Message::assistant(format!("file {i} looks fine")));
        i += 1;
    }
    msgs.truncate(n);
    msgs
}

#[divan::bench]
fn plan_compaction_500_messages(bencher: divan::Bencher) {
    let msgs = session(500);
    let policy = CompactionPolicy::default().resolved_for_window(128_000);
    bencher.bench(|| plan_forced(&msgs, &policy, &EstimateCounter).unwrap());
}

fn main() {
    big();
    divan::main();
    let path = std::env::temp_dir().join(format!("hame-bench-{}.db", std::process::id()));
    for s in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{s}", path.display()));
    }
}
