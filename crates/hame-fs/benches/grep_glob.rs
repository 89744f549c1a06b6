//! Grep and glob over a generated 10,000-file workspace on `LocalFs`.
//! Run: `cargo bench -p hame-fs --bench grep_glob`. Compare with
//! `rg -c needle <dir>` on the same tree (the xtask step prints both).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::OnceLock;

use hame_fs::{Filesystem, GlobRequest, GrepRequest, LocalFs};

fn main() {
    divan::main();
}

struct Workspace {
    _dir: tempfile::TempDir,
    fs: LocalFs,
    rt: tokio::runtime::Runtime,
}

/// 100 directories x 100 files, ~1 KB each; every 50th file contains `needle`.
fn workspace() -> &'static Workspace {
    static WS: OnceLock<Workspace> = OnceLock::new();
    WS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        for d in 0..100 {
            let sub = dir.path().join(format!("pkg{d:03}/src"));
            std::fs::create_dir_all(&sub).unwrap();
            for f in 0..100 {
                let n = d * 100 + f;
                let mut body = String::new();
                for l in 0..20 {
                    body.push_str(&format!(
                        "fn item_{n}_{l}() -> u32 {{ {l} }} // filler text\n"
                    ));
                }
                if n % 50 == 0 {
                    body.push_str("// needle here\n");
                }
                let ext = if f % 2 == 0 { "rs" } else { "md" };
                std::fs::write(sub.join(format!("file{f:03}.{ext}")), body).unwrap();
            }
        }
        let fs = LocalFs::new(dir.path()).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        Workspace { _dir: dir, fs, rt }
    })
}

#[divan::bench(sample_count = 10)]
fn grep_literal_10k_files() -> usize {
    let ws = workspace();
    let req = GrepRequest {
        literal: true,
        max_matches: 10_000,
        ..GrepRequest::new("needle")
    };
    ws.rt.block_on(ws.fs.grep(&req)).unwrap().matches.len()
}

#[divan::bench(sample_count = 10)]
fn grep_regex_with_glob_10k_files() -> usize {
    let ws = workspace();
    let req = GrepRequest {
        glob: Some("*.rs".into()),
        max_matches: 10_000,
        ..GrepRequest::new(r"needle\s+\w+")
    };
    ws.rt.block_on(ws.fs.grep(&req)).unwrap().matches.len()
}

#[divan::bench(sample_count = 10)]
fn glob_all_rs_10k_files() -> usize {
    let ws = workspace();
    let req = GlobRequest {
        max_results: 100_000,
        ..GlobRequest::new("**/*.rs")
    };
    ws.rt.block_on(ws.fs.glob(&req)).unwrap().files.len()
}
