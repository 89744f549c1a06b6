//! Shared session events, figures for `docs/gateway.md`: one `publish` and one `replay`
//! (of a session's last 100 events) as p50/p99, one at a time, and events/s with 20
//! concurrent publishers on 20 sessions.
//!
//! `cargo run --release -p hame-state --all-features --example event_log_bench -- URL…`
//! (each `redis://`, `postgres://` or `mysql://` URL given).
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use hame_state::events::{EventLog, EventOptions, connect_event_log};

type R<T> = Result<T, Box<dyn std::error::Error>>;

/// The event a streamed turn publishes most: one text delta.
const BODY: &str = r#"text_delta 0 {"text":"a few words of a streamed reply"}"#;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

async fn bench(url: &str, log: &dyn EventLog) -> R<()> {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let key = format!("bench/{run}/one");
    let (mut publish, mut replay) = (Vec::new(), Vec::new());
    for _ in 0..1000 {
        let t = Instant::now();
        log.publish(&key, BODY, 1000).await?;
        publish.push(t.elapsed());
    }
    for i in 0..200u64 {
        let t = Instant::now();
        let got = log.replay(&key, 900 - (i % 100)).await?;
        replay.push(t.elapsed());
        if got.is_empty() {
            return Err("replay found nothing".into());
        }
    }
    let n = 2000;
    let t = Instant::now();
    let keys: Vec<String> = (0..20).map(|s| format!("bench/{run}/s{s}")).collect();
    futures::future::try_join_all(keys.iter().map(|k| async move {
        for _ in 0..n / 20 {
            log.publish(k, BODY, 1000).await?;
        }
        Ok::<_, hame_state::Error>(())
    }))
    .await?;
    let rate = f64::from(n) / t.elapsed().as_secs_f64();
    println!(
        "{:<10} publish p50 {} p99 {} | replay(≤100) p50 {} p99 {} | 20 publishers: {rate:.0} events/s",
        url.split("://").next().unwrap_or(url),
        ms(pct(&mut publish, 0.5)),
        ms(pct(&mut publish, 0.99)),
        ms(pct(&mut replay, 0.5)),
        ms(pct(&mut replay, 0.99)),
    );
    Ok(())
}

#[tokio::main]
async fn main() -> R<()> {
    let urls: Vec<String> = std::env::args().skip(1).collect();
    if urls.is_empty() {
        return Err("usage: event_log_bench URL… (redis://, postgres://, mysql://)".into());
    }
    for url in &urls {
        let log = connect_event_log(url, EventOptions::default()).await?;
        bench(url, log.as_ref()).await?;
    }
    Ok(())
}
