//! `cargo xtask bench-peers`: hame beside the peer harnesses, in one run.
//!
//! Builds `bench-peer` (crate `hame-bench`) with the `dist` profile (fat LTO, like every
//! published figure since ADR 0019), installs the peers' virtualenvs
//! (`setup.sh` of the peer benchmark, idempotent; `--no-setup` skips it), runs the peer
//! benchmark's `bench.py` with hame added through `--extra`, and prints the ratio table:
//! hame against the best peer of each cell. Not part of CI (a `dist` build, ~35 minutes for
//! the full matrix); `docs/benchmarks.md` holds a run.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::proc;

/// Options of `bench-peers`.
#[derive(Debug, Default)]
pub struct BenchOptions {
    /// The peer benchmark (`bench.py`, `setup.sh`).
    pub peers_dir: Option<PathBuf>,
    /// Skip `setup.sh`.
    pub no_setup: bool,
    /// Arguments passed to `bench.py` as they are (`--quick`, `--scenarios 1x200`, ...).
    pub pass: Vec<String>,
}

impl BenchOptions {
    /// Parses `[--peers-dir DIR] [--no-setup] [bench.py arguments...]`.
    pub fn parse(args: &[String]) -> Result<Self> {
        let mut o = Self::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--peers-dir" => {
                    let Some(d) = it.next() else {
                        bail!("--peers-dir needs a directory");
                    };
                    o.peers_dir = Some(PathBuf::from(d));
                }
                "--no-setup" => o.no_setup = true,
                _ => o.pass.push(a.clone()),
            }
        }
        Ok(o)
    }
}

fn peers_dir(root: &Path, given: Option<&Path>) -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = match given {
        Some(d) => vec![d.to_path_buf()],
        None => {
            let mut c = Vec::new();
            if let Ok(d) = std::env::var("HAME_BENCH_PEERS") {
                c.push(PathBuf::from(d));
            }
            c.push(root.join("../shared/bench/peers"));
            c.push(root.join("../../shared/bench/peers"));
            c
        }
    };
    candidates
        .into_iter()
        .find(|d| d.join("bench.py").is_file())
        .with_context(|| {
            "the peer benchmark (bench.py) was not found: pass --peers-dir DIR or set HAME_BENCH_PEERS"
        })
}

/// Runs the whole thing.
pub fn run(root: &Path, options: &BenchOptions) -> Result<()> {
    let dir = peers_dir(root, options.peers_dir.as_deref())?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    proc::run(Command::new(&cargo).current_dir(root).args([
        "build",
        "--profile",
        "dist",
        "-p",
        "hame-bench",
        "--bin",
        "bench-peer",
    ]))?;
    // The published figures are fat-LTO builds (ADR 0019): `dist`, not `release` (ADR 0026).
    // Under the effective target directory (CARGO_TARGET_DIR or a cargo config's), not
    // always `<root>/target`.
    let target = crate::target_dir(root);
    let driver = target.join("dist/bench-peer");
    if !driver.is_file() {
        bail!(
            "the driver was built but is not at {}: is the target directory set by something cargo metadata does not see?",
            driver.display()
        );
    }
    if !options.no_setup {
        proc::run(Command::new("bash").arg(dir.join("setup.sh")))?;
    }
    let out = target.join("bench-peers");
    std::fs::create_dir_all(&out)?;
    let extra = format!(
        "hame={} --mode {{mode}} --base-url {{base_url}} --sessions {{sessions}} --turns {{turns}} --workdir {{workdir}} --context-window {{context_window}}",
        driver.display()
    );
    let before: Vec<PathBuf> = stamps(&out);
    let mut cmd = Command::new("python3");
    cmd.arg(dir.join("bench.py"))
        .arg("--extra")
        .arg(&extra)
        .arg("--out")
        .arg(&out)
        .args(&options.pass);
    // bench.py adds every `--extra` to the peers it runs.
    proc::run(&mut cmd)?;
    let newest = stamps(&out)
        .into_iter()
        .filter(|p| !before.contains(p))
        .max()
        .context("bench.py wrote no results directory")?;
    let results: Value = serde_json::from_str(
        &std::fs::read_to_string(newest.join("results.json")).context("reading results.json")?,
    )?;
    let table = ratio_table(&results);
    println!("\n{table}");
    std::fs::write(newest.join("ratios.md"), &table)?;
    println!("(also in {})", newest.join("ratios.md").display());
    Ok(())
}

fn stamps(out: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(out)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

fn median(agg: &Value, key: &str) -> Option<f64> {
    agg.get(key)?.get("median")?.as_f64()
}

/// One row per (mode, scenario): hame's figure, the best peer's, and the ratio, for turn
/// p50, turns/s, peak RSS, MB written and compactions. Ratios read "hame is N× better".
pub fn ratio_table(results: &Value) -> String {
    let empty = Vec::new();
    let cells = results
        .get("results")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let mut keys: Vec<(String, String)> = Vec::new();
    for c in cells {
        let k = (
            c["mode"].as_str().unwrap_or("").to_owned(),
            c["scenario"].as_str().unwrap_or("").to_owned(),
        );
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    // (column, key, lower is better, scale)
    let metrics: [(&str, &str, bool, f64); 6] = [
        ("process s", "proc_wall_s", true, 1.0),
        ("turn p50 ms", "turn_ms_p50", true, 1.0),
        ("turns/s", "turns_per_s", false, 1.0),
        ("peak RSS MB", "rss_peak_mb", true, 1.0),
        (
            "MB written",
            "bytes_new_or_changed",
            true,
            1.0 / (1024.0 * 1024.0),
        ),
        ("summary calls", "compactions", true, 1.0),
    ];
    let mut out = String::from(
        "| mode | scenario | figure | hame | best peer | ratio (hame vs best) |\n|---|---|---|---|---|---|\n",
    );
    for (mode, scen) in &keys {
        let here: Vec<&Value> = cells
            .iter()
            .filter(|c| c["mode"].as_str() == Some(mode) && c["scenario"].as_str() == Some(scen))
            .collect();
        let Some(hame) = here.iter().find(|c| c["peer"].as_str() == Some("hame")) else {
            continue;
        };
        for (label, key, lower, scale) in metrics {
            let Some(h) = median(&hame["agg"], key) else {
                continue;
            };
            let best = here
                .iter()
                .filter(|c| c["peer"].as_str() != Some("hame"))
                .filter_map(|c| Some((c["peer"].as_str()?, median(&c["agg"], key)?)))
                .min_by(|a, b| {
                    let (x, y) = if lower { (a.1, b.1) } else { (b.1, a.1) };
                    x.total_cmp(&y)
                });
            let Some((peer, b)) = best else { continue };
            let (num, den) = if lower { (b, h) } else { (h, b) };
            let ratio = if num == 0.0 && den == 0.0 {
                "equal".to_owned()
            } else if den == 0.0 {
                "∞".to_owned()
            } else if num / den < 1.0 {
                format!("{:.2}x (worse)", num / den)
            } else {
                format!("{:.1}x", num / den)
            };
            out.push_str(&format!(
                "| {mode} | {scen} | {label} | {:.3} | {:.3} ({peer}) | {ratio} |\n",
                h * scale,
                b * scale
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_compare_hame_with_the_best_peer() {
        let r = serde_json::json!({"results": [
            {"peer": "a", "mode": "inproc", "scenario": "1x200", "agg": {"turn_ms_p50": {"median": 20.0}, "turns_per_s": {"median": 50.0}}},
            {"peer": "b", "mode": "inproc", "scenario": "1x200", "agg": {"turn_ms_p50": {"median": 30.0}, "turns_per_s": {"median": 30.0}}},
            {"peer": "hame", "mode": "inproc", "scenario": "1x200", "agg": {"turn_ms_p50": {"median": 2.0}, "turns_per_s": {"median": 500.0}}},
        ]});
        let t = ratio_table(&r);
        assert!(
            t.contains("| inproc | 1x200 | turn p50 ms | 2.000 | 20.000 (a) | 10.0x |"),
            "{t}"
        );
        assert!(
            t.contains("| inproc | 1x200 | turns/s | 500.000 | 50.000 (a) | 10.0x |"),
            "{t}"
        );
    }
}
