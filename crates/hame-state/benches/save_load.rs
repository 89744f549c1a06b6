//! Save and load latency of a 200-message state (tool results of 16 KiB, about 1.1 MB of
//! JSON) on every backend available: memory and JSON always, Redis / PostgreSQL / MySQL when
//! `HAME_TEST_REDIS_URL` / `HAME_TEST_POSTGRES_URL` / `HAME_TEST_MYSQL_URL` are set and the
//! crate is built with the matching feature (`cargo bench -p hame-state --all-features`).
#![allow(missing_docs, clippy::print_stderr)]

mod common;

use std::cell::Cell;
use std::sync::{Arc, LazyLock};

use common::{RT, ok, read_call, read_result};
use divan::Bencher;
use divan::counter::BytesCount;
use hame_core::{AgentState, Message};
use hame_state::{StateKey, StateStore};

fn main() {
    let names: Vec<&str> = STORES.iter().map(|(n, _)| *n).collect();
    eprintln!(
        "hame-state bench: backends {names:?}; state {} bytes",
        serde_json::to_vec(&*STATE).map_or(0, |b| b.len())
    );
    divan::main();
}

static TMP: LazyLock<tempfile::TempDir> = LazyLock::new(|| match tempfile::tempdir() {
    Ok(d) => d,
    Err(e) => panic!("tempdir: {e}"),
});

static STATE: LazyLock<AgentState> = LazyLock::new(|| state(200, 16 * 1024));

static STORES: LazyLock<Vec<(&'static str, Arc<dyn StateStore>)>> = LazyLock::new(|| {
    let mut candidates = vec![
        ("memory", Some("memory://".to_owned())),
        ("json", Some(TMP.path().display().to_string())),
    ];
    for (name, var) in [
        ("redis", "HAME_TEST_REDIS_URL"),
        ("postgres", "HAME_TEST_POSTGRES_URL"),
        ("mysql", "HAME_TEST_MYSQL_URL"),
    ] {
        candidates.push((name, std::env::var(var).ok()));
    }
    let mut out = Vec::new();
    for (name, url) in candidates {
        let Some(url) = url else {
            eprintln!("hame-state bench: SKIPPED {name}: its URL variable is not set");
            continue;
        };
        match RT.block_on(hame_state::open(&url)) {
            Ok(store) => out.push((name, store)),
            Err(e) => eprintln!("hame-state bench: SKIPPED {name}: {e}"),
        }
    }
    out
});

fn backends() -> Vec<&'static str> {
    STORES.iter().map(|(n, _)| *n).collect()
}

fn store(name: &str) -> Arc<dyn StateStore> {
    match STORES.iter().find(|(n, _)| *n == name) {
        Some((_, s)) => s.clone(),
        None => panic!("no store {name}"),
    }
}

fn state(n: usize, result_bytes: usize) -> AgentState {
    let filler: String = "tool output line, with \"quotes\" and ünïcode\n"
        .chars()
        .cycle()
        .take(result_bytes)
        .collect();
    let mut s = AgentState::default();
    for i in 0..n {
        s.messages.push(match i % 3 {
            0 => Message::user(format!("question {i}")),
            1 => read_call(&format!("c{i}"), i),
            _ => read_result(&format!("c{}", i - 1), filler.clone()),
        });
    }
    s
}

fn key(tag: &str) -> StateKey {
    let agent = format!("bench-{}", uuid::Uuid::new_v4().simple());
    match StateKey::new(agent, Some("bench"), tag) {
        Ok(k) => k,
        Err(e) => panic!("{e}"),
    }
}

fn bytes() -> BytesCount {
    BytesCount::new(serde_json::to_vec(&*STATE).map_or(0, |b| b.len()))
}

#[divan::bench(args = backends(), sample_count = 30, sample_size = 1)]
fn save(bencher: Bencher, backend: &str) {
    let store = store(backend);
    let key = key("save");
    let version = Cell::new(ok(RT.block_on(store.save(&key, &STATE, None))));
    bencher.counter(bytes()).bench_local(|| {
        let v = ok(RT.block_on(store.save(&key, &STATE, Some(version.get()))));
        version.set(v);
    });
    ok(RT.block_on(store.delete(&key)));
}

#[divan::bench(args = backends(), sample_count = 30, sample_size = 1)]
fn load(bencher: Bencher, backend: &str) {
    let store = store(backend);
    let key = key("load");
    ok(RT.block_on(store.save(&key, &STATE, None)));
    bencher.counter(bytes()).bench_local(|| {
        let got = ok(RT.block_on(store.load(&key)));
        divan::black_box(got);
    });
    ok(RT.block_on(store.delete(&key)));
}

#[divan::bench(args = backends(), sample_count = 30, sample_size = 1)]
fn save_fenced(bencher: Bencher, backend: &str) {
    let store = store(backend);
    let key = key("fenced");
    let lease = ok(RT.block_on(store.acquire(&key, hame_state::LeaseOptions::default())));
    let version = Cell::new(ok(
        RT.block_on(store.save_fenced(&key, &STATE, None, &lease))
    ));
    bencher.counter(bytes()).bench_local(|| {
        let v = ok(RT.block_on(store.save_fenced(&key, &STATE, Some(version.get()), &lease)));
        version.set(v);
    });
    ok(RT.block_on(store.delete(&key)));
    ok(RT.block_on(lease.release()));
}

#[divan::bench(args = backends(), sample_count = 30, sample_size = 10)]
fn acquire_release(bencher: Bencher, backend: &str) {
    let store = store(backend);
    let key = key("lease");
    bencher.bench_local(|| {
        let lease = ok(RT.block_on(store.acquire(&key, hame_state::LeaseOptions::default())));
        ok(RT.block_on(lease.release()));
    });
}
