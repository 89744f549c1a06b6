//! The JSON store's journal, packed (ADR 0021) and plain: the bytes and the time of one
//! appended turn (a user message, a `read_file` call, its 10 KB result, a reply) on a
//! 40-message state, for three kinds of tool output: Rust source (this crate's own files),
//! Markdown (the repository's `docs/`) and the peer benchmark's synthetic knowledge text.
//!
//! `cargo bench -p hame-state --bench journal`. The bytes are printed first (20 turns
//! each); the store lives in `HAME_BENCH_DIR`, else `/dev/shm` when there is one (so the
//! time is the CPU's, not the disk's `fdatasync`), else the system's temp directory.
#![allow(missing_docs, clippy::print_stderr)]

mod common;

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::sync::LazyLock;

use common::{RT, ok, read_call, read_result};
use divan::Bencher;
use hame_core::{AgentState, Message};
use hame_state::{JsonStore, StateKey, StateStore};

const KINDS: [&str; 3] = ["rust", "markdown", "synthetic"];

const RUST: &[&str] = &[
    include_str!("../src/json.rs"),
    include_str!("../src/json_journal.rs"),
    include_str!("../src/sql.rs"),
    include_str!("../src/redis_store.rs"),
    include_str!("../src/store.rs"),
];

const MARKDOWN: &[&str] = &[
    include_str!("../../../docs/state.md"),
    include_str!("../../../docs/harness.md"),
    include_str!("../../../docs/memory.md"),
    include_str!("../../../docs/crash-safety.md"),
    include_str!("../../../docs/tools.md"),
];

fn main() {
    eprintln!("hame-state journal bench: store under {}", DIR.display());
    for kind in KINDS {
        let (plain, packed) = (journal_bytes(kind, false), journal_bytes(kind, true));
        eprintln!(
            "{kind:>9}: 20 turns of 10 KB results: plain {plain} bytes, packed {packed} bytes ({:.2}x smaller)",
            plain as f64 / packed.max(1) as f64
        );
    }
    divan::main();
}

static DIR: LazyLock<PathBuf> = LazyLock::new(|| {
    std::env::var_os("HAME_BENCH_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let shm = PathBuf::from("/dev/shm");
            shm.is_dir().then_some(shm)
        })
        .unwrap_or_else(std::env::temp_dir)
});

static TMP: LazyLock<tempfile::TempDir> = LazyLock::new(|| match tempfile::tempdir_in(&*DIR) {
    Ok(d) => d,
    Err(e) => panic!("tempdir in {}: {e}", DIR.display()),
});

/// The `n`th 10 KB tool output of `kind`.
fn output(kind: &str, n: usize) -> String {
    let text = match kind {
        "rust" => RUST[n % RUST.len()].to_owned(),
        "markdown" => MARKDOWN[n % MARKDOWN.len()].to_owned(),
        _ => synthetic(n),
    };
    let start = (n * 4_099) % text.len().saturating_sub(10_000).max(1);
    text.chars().skip(start).take(10_000).collect()
}

/// The peer workload's knowledge text (`workload.knowledge_text`), from line `n`.
fn synthetic(n: usize) -> String {
    let topics = ["Harbor", "scheduler", "gateway", "memory", "compaction"];
    (n..n + 200)
        .map(|i| {
            let t = topics[i % topics.len()];
            format!(
                "- Fact {i:03}: Zephyr's {t} component, revision {}, handles case {} within {} ms and stores its state under harbor/{t}/{i:03}.\n",
                i % 7,
                i * 37 % 101,
                5 + i % 40
            )
        })
        .collect()
}

/// Appends turn `n` to `state`.
fn turn(state: &mut AgentState, kind: &str, n: usize) {
    state
        .messages
        .push(Message::user(format!("Please read file {n} and tell me.")));
    let id = format!("c{n}");
    state.messages.push(read_call(&id, n));
    state.messages.push(read_result(&id, output(kind, n)));
    state.messages.push(Message::assistant(format!(
        "File {n} holds what you asked; the relevant part is quoted above."
    )));
}

fn base(kind: &str) -> AgentState {
    let mut s = AgentState::default();
    for n in 0..10 {
        turn(&mut s, kind, n);
    }
    s
}

fn store(packed: bool) -> JsonStore {
    match JsonStore::open(TMP.path()) {
        Ok(s) => s.with_packed_journal(packed),
        Err(e) => panic!("{e}"),
    }
}

fn key(tag: &str) -> StateKey {
    let session = format!("{tag}-{}", uuid::Uuid::new_v4().simple());
    match StateKey::new("bench", Some("bench"), session) {
        Ok(k) => k,
        Err(e) => panic!("{e}"),
    }
}

/// The journal's size after 20 appended turns.
fn journal_bytes(kind: &str, packed: bool) -> u64 {
    let store = store(packed);
    let key = key("bytes");
    let mut state = base(kind);
    let mut v = ok(RT.block_on(store.save(&key, &state, None)));
    for n in 10..30 {
        turn(&mut state, kind, n);
        v = ok(RT.block_on(store.save(&key, &state, Some(v))));
    }
    let path = TMP
        .path()
        .join("bench/users/bench")
        .join(format!("{}.journal", key.session()));
    let len = std::fs::metadata(&path).map_or(0, |m| m.len());
    ok(RT.block_on(store.delete(&key)));
    len
}

/// One appending save of a turn, packed or plain.
#[divan::bench(args = KINDS, consts = [false, true], sample_count = 40, sample_size = 1)]
fn append_turn<const PACKED: bool>(bencher: Bencher, kind: &str) {
    let store = store(PACKED);
    let key = key("append");
    let state = RefCell::new(base(kind));
    let version = Cell::new(ok(RT.block_on(store.save(&key, &state.borrow(), None))));
    let n = Cell::new(10);
    bencher
        .with_inputs(|| {
            let mut s = state.borrow_mut();
            turn(&mut s, kind, n.get());
            n.set(n.get() + 1);
            s.clone()
        })
        .bench_local_values(|next| {
            let v = ok(RT.block_on(store.save(&key, &next, Some(version.get()))));
            version.set(v);
        });
    ok(RT.block_on(store.delete(&key)));
}
