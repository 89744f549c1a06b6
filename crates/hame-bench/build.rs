//! Records the optimisation level `bench-peer` is compiled at, so that every
//! `BENCH_RESULT` says which build it measured (`release` is opt-level 1 and spends about a
//! third more CPU per turn than the `dist` build of the published figures; ADR 0026).

fn main() {
    let level = std::env::var("OPT_LEVEL").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=HAME_BENCH_OPT_LEVEL={level}");
    println!("cargo:rerun-if-changed=build.rs");
}
