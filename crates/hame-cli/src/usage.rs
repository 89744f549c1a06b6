//! `hame usage`: what the caller's sessions spent, by session and model.

use clap::Args;

use crate::ConfigError;
use crate::common::{Common, build_without_model};

#[derive(Debug, Args)]
pub(crate) struct UsageArgs {
    #[command(flatten)]
    common: Common,
    /// Only spend on this UTC day or later (YYYY-MM-DD) [default: all]
    #[arg(long, value_name = "DATE", value_parser = day)]
    since: Option<String>,
    /// Print one JSON object: `{"sessions": [...], "total": {...}}`.
    #[arg(long)]
    json: bool,
}

/// A UTC day as `YYYY-MM-DD` (checked when the flags are parsed: exit 2).
fn day(s: &str) -> Result<String, String> {
    chrono::NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d")
        .map(|d| d.format("%Y-%m-%d").to_string())
        .map_err(|_| format!("{s:?} is not a day: give YYYY-MM-DD (UTC), e.g. 2026-12-01"))
}

pub(crate) async fn usage(args: UsageArgs) -> anyhow::Result<()> {
    let (agent, ctx) = build_without_model(&args.common).await?;
    let rows = agent
        .usage(ctx.user_id.as_deref(), args.since.as_deref())
        .await
        .map_err(|e| {
            if e.is_config() {
                anyhow::Error::new(ConfigError(e.to_string()))
            } else {
                anyhow::Error::new(e)
            }
        })?;
    let mut total = hame::harness::cost::Spend::default();
    rows.iter().for_each(|r| total.add(&r.spend));
    if args.json {
        println!(
            "{}",
            serde_json::json!({"agent": agent.name(), "user": ctx.user_id,
                               "since": args.since, "sessions": rows, "total": total})
        );
        return Ok(());
    }
    if rows.is_empty() {
        println!("no spend recorded");
        return Ok(());
    }
    let header = [
        "SESSION",
        "MODEL",
        "REQUESTS",
        "INPUT",
        "CACHED",
        "CACHE_WRITE",
        "OUTPUT",
        "USD",
    ];
    let mut lines: Vec<[String; 8]> = vec![header.map(str::to_owned)];
    let line = |session: &str, model: &str, s: &hame::harness::cost::Spend| {
        let usd = if s.unpriced > 0 && s.usd == 0.0 {
            "-".to_owned()
        } else {
            format!("{:.4}", s.usd)
        };
        [
            session.to_owned(),
            model.to_owned(),
            s.requests.to_string(),
            s.usage.input_tokens.to_string(),
            s.usage.cached_input_tokens.to_string(),
            s.usage.cache_write_input_tokens.to_string(),
            s.usage.output_tokens.to_string(),
            usd,
        ]
    };
    for r in &rows {
        lines.push(line(&r.session, &r.model, &r.spend));
    }
    lines.push(line("total", "", &total));
    let widths: Vec<usize> = (0..8)
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i < 2 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        println!("{}", cells.join("  ").trim_end());
    }
    if total.unpriced > 0 {
        println!(
            "({} requests to models without a price count $0: add [prices.\"provider:model\"] to hame.toml)",
            total.unpriced
        );
    }
    Ok(())
}
