//! The figures of `docs/sandbox.md`, against the local Docker engine:
//!
//! ```text
//! cargo run -p hame-sandbox --features docker --example sandbox_bench
//! ```
//!
//! Runs in the dev profile (no release build needed); the time goes to the engine, not
//! to hame's code. Prints one line per figure with its goal.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use hame_fs::{ExecRequest, Execute, LocalFs};
use hame_sandbox::{DockerOptions, DockerSandboxes, Sandboxes};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

async fn connect(dir: &std::path::Path) -> DockerSandboxes {
    let store = Arc::new(LocalFs::new(dir).unwrap());
    let s = DockerSandboxes::connect(DockerOptions::default(), store)
        .await
        .unwrap();
    s.ensure_image().await.unwrap();
    s
}

async fn sh(s: &dyn Execute, command: &str) {
    let out = s
        .execute(ExecRequest {
            command: command.into(),
            timeout: None,
        })
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0), "{}", out.output);
}

/// Fills a scope with `files` files of `kib` KiB, snapshots it, and returns the key.
async fn prepare(sbs: &DockerSandboxes, key: &str, files: usize, kib: usize) {
    let sb = sbs.scope(key);
    sb.begin(Vec::new()).await.unwrap();
    sh(
        sb.as_ref(),
        &format!(
            "mkdir -p data; i=0; while [ $i -lt {files} ]; do dd if=/dev/urandom of=data/f$i bs=1024 count={kib} 2>/dev/null; i=$((i+1)); done"
        ),
    )
    .await;
    sb.end().await.unwrap();
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let sbs = connect(dir.path()).await;
    let run = std::process::id();

    // Cold start: a fresh container for a scope without a snapshot.
    let mut cold = Vec::new();
    for i in 0..5 {
        let sb = sbs.scope(&format!("bench/{run}/cold{i}"));
        let t = Instant::now();
        sb.begin(Vec::new()).await.unwrap();
        cold.push(t.elapsed());
    }

    // Warm exec round trip.
    let sb = sbs.scope(&format!("bench/{run}/cold0"));
    let mut warm = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        sh(sb.as_ref(), "true").await;
        warm.push(t.elapsed());
    }
    // Warm `begin` + `end` of a call that changes nothing: the stored manifest's identity
    // is read (staleness check), the projection hashed, the listing compared.
    let mut warm_begin = Vec::new();
    let mut warm_end = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let r = sb.begin(Vec::new()).await.unwrap();
        warm_begin.push(t.elapsed());
        assert!(!r.started);
        let t = Instant::now();
        sb.end().await.unwrap();
        warm_end.push(t.elapsed());
    }
    // A warm container made stale by another "process" (a second value on the same store):
    // replaced by a new one with the newer snapshot.
    let other = connect(dir.path()).await;
    let mut refresh = Vec::new();
    for i in 0..5 {
        let theirs = other.scope(&format!("bench/{run}/cold0"));
        theirs.begin(Vec::new()).await.unwrap();
        sh(theirs.as_ref(), &format!("echo {i} > theirs.txt")).await;
        theirs.end().await.unwrap();
        let t = Instant::now();
        let r = sb.begin(Vec::new()).await.unwrap();
        refresh.push(t.elapsed());
        assert!(r.refreshed, "{i}: {r:?}");
        sb.end().await.unwrap();
    }
    other.shutdown().await;
    sbs.shutdown().await;

    // Restore of 1 MB and 100 MB in a new "process" (a new value, no container left).
    let (small, big) = (format!("bench/{run}/small"), format!("bench/{run}/big"));
    let prep = connect(dir.path()).await;
    prepare(&prep, &small, 10, 100).await;
    prepare(&prep, &big, 100, 1024).await;
    prep.shutdown().await;

    let sbs = connect(dir.path()).await;
    let t = Instant::now();
    let r = sbs.scope(&small).begin(Vec::new()).await.unwrap();
    let restore_small = t.elapsed();
    assert_eq!(r.restored_files, 10);
    let big_sb = sbs.scope(&big);
    let t = Instant::now();
    let r = big_sb.begin(Vec::new()).await.unwrap();
    let restore_big = t.elapsed();
    assert_eq!(r.restored_files, 100);
    big_sb.end().await.unwrap();

    // Snapshot after a call that changed one file of the 100 MB workspace.
    let mut snaps = Vec::new();
    for i in 0..5 {
        big_sb.begin(Vec::new()).await.unwrap();
        sh(big_sb.as_ref(), &format!("echo change {i} >> data/f7")).await;
        let t = Instant::now();
        let rep = big_sb.end().await.unwrap();
        snaps.push(t.elapsed());
        assert_eq!(rep.uploaded, 1);
    }
    // A sweep of the store (~120 blobs, ~110 MB, 6 scopes): the first deletes what the
    // snapshots above dropped, the others find nothing.
    let mut sweeps = Vec::new();
    let mut first = None;
    for _ in 0..5 {
        let t = Instant::now();
        let r = sbs.collect_garbage().await.unwrap();
        sweeps.push(t.elapsed());
        first.get_or_insert(r);
    }
    let first = first.unwrap_or_default();
    sbs.shutdown().await;

    println!("| figure | measured | goal |");
    println!("|---|---|---|");
    println!(
        "| warm exec round trip, p50 of 50 | {} | ≤ 50 ms |",
        ms(median(warm))
    );
    println!(
        "| warm `begin` (staleness check + projection), p50 of 20 | {} | |",
        ms(median(warm_begin))
    );
    println!(
        "| warm `end` of a call that changed nothing, p50 of 20 | {} | |",
        ms(median(warm_end))
    );
    println!(
        "| `begin` of a warm container made stale by another process (replaced + restored), median of 5 | {} | |",
        ms(median(refresh))
    );
    println!(
        "| cold start of a fresh container (`begin` without a snapshot, median of 5) | {} | ≤ 1 s |",
        ms(median(cold))
    );
    println!(
        "| restore 1 MB (10 files) into a new container, incl. its start | {} | ≤ 300 ms |",
        ms(restore_small)
    );
    println!(
        "| restore 100 MB (100 files) into a new container, incl. its start | {} | ≤ 3 s |",
        ms(restore_big)
    );
    println!(
        "| snapshot after one changed file in 100 MB (median of 5) | {} | ≤ 200 ms |",
        ms(median(snaps))
    );
    println!(
        "| sweep of the snapshot store ({} blobs, {} deleted by the first), median of 5 | {} | |",
        first.blobs,
        first.deleted,
        ms(median(sweeps))
    );
}
