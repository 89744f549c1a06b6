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

mod common;

use std::sync::OnceLock;

use common::{FACTS_PER_DOC, TENANT, doc, facts_count, index_facts, runtime};
use divan::counter::ItemsCount;
use hame_core::{ContentBlock, Message, Role, ToolCall, ToolResult};
use hame_memory::compaction::{CompactionPolicy, plan_forced};
use hame_memory::tokens::EstimateCounter;
use hame_memory::{SearchIndex, SearchOptions, SqliteIndex};

struct Big {
    rt: tokio::runtime::Runtime,
    index: SqliteIndex,
}

/// The index file of this run, with its `-wal`/`-shm` files removed.
fn clean_index_path() -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("hame-bench-{}.db", std::process::id()));
    for s in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{s}", path.display()));
    }
    path
}

fn big() -> &'static Big {
    static BIG: OnceLock<Big> = OnceLock::new();
    BIG.get_or_init(|| {
        let rt = runtime();
        let path = clean_index_path();
        let index = rt.block_on(SqliteIndex::open(&path)).unwrap();
        index_facts(&rt, &index, facts_count(1_000_000));
        let size: u64 = ["", "-wal"]
            .iter()
            .filter_map(|s| std::fs::metadata(format!("{}{s}", path.display())).ok())
            .map(|m| m.len())
            .sum();
        println!("index size on disk: {:.0} MB", size as f64 / 1e6);
        let searches = common::standard_searches(&["123457", "999", "54321", "700001"]);
        common::time_searches(&rt, &index, &searches, 50);
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
            let text = doc(0, FACTS_PER_DOC, round * FACTS_PER_DOC);
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
            })]
            .into(),
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
    clean_index_path();
}
