//! Run queue figures for `docs/runs.md`: the queue's own cost per run (submit, claim,
//! finish, and a message turn's submit-and-claim plus finish) as p50/p99, and runs/s for 1,000 empty runs (200 on JSON) over 100 sessions with 1, 2 and 3
//! workers, each worker with its own connection pool (its own `JsonRunQueue` handle), as
//! separate worker processes would have.
//!
//! `cargo run --release -p hame-state --all-features --example run_queue_bench -- [URL…] [--no-json]`
//! (the JSON queue unless `--no-json`; then each `postgres://` or `redis://` URL given).
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use hame_state::runs::{
    ClaimOptions, JsonRunQueue, NewRun, PgRunQueue, RedisRunQueue, RunEnd, RunQueue,
};
use hame_state::{RedisOptions, SqlOptions, StateKey};

type R<T> = Result<T, Box<dyn std::error::Error>>;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or_default()
}

fn agent() -> String {
    format!("bench-{}", uuid::Uuid::new_v4().simple())
}

/// Latency of each queue operation over `n` runs, one at a time.
async fn latency(q: &dyn RunQueue, n: usize) -> R<()> {
    let agent = agent();
    let opts = ClaimOptions::new(&agent, "bench", Duration::from_secs(15));
    let (mut sub, mut claim, mut fin) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let key = StateKey::new(&agent, Some("u"), format!("s{}", i % 100))?;
        let t = Instant::now();
        q.submit(NewRun::message(key, "m", None)?).await?;
        sub.push(t.elapsed());
        let t = Instant::now();
        let c = q.claim(&opts).await?.ok_or("nothing to claim")?;
        claim.push(t.elapsed());
        let t = Instant::now();
        q.finish(&c, &completed()).await?;
        fin.push(t.elapsed());
    }
    let mut total: Vec<Duration> = (0..n).map(|i| sub[i] + claim[i] + fin[i]).collect();
    // What a `POST …/messages` turn pays: submit and claim in one step, then finish.
    let mut turn = Vec::with_capacity(n);
    for i in 0..n {
        let key = StateKey::new(&agent, Some("u"), format!("t{}", i % 100))?;
        let t = Instant::now();
        let (_, c) = q
            .submit_claimed(NewRun::message(key, "m", None)?, &opts)
            .await?;
        q.finish(&c.ok_or("a free session's run is claimed")?, &completed())
            .await?;
        turn.push(t.elapsed());
    }
    for (name, v) in [
        ("submit", &mut sub),
        ("claim", &mut claim),
        ("finish", &mut fin),
        ("all three", &mut total),
        ("message turn (submit_claimed + finish)", &mut turn),
    ] {
        println!(
            "  {name:<10} p50 {:>8.3} ms  p99 {:>8.3} ms",
            pct(v, 0.5).as_secs_f64() * 1e3,
            pct(v, 0.99).as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// The end of a run that completed with no reply, usage or verdict.
fn completed() -> RunEnd {
    RunEnd::Completed {
        reply: String::new(),
        usage: serde_json::json!({}),
        verification: None,
    }
}

/// Runs/s draining `n` queued runs over 100 sessions with one queue handle per worker.
async fn throughput(queues: Vec<Arc<dyn RunQueue>>, n: usize) -> R<f64> {
    let agent = agent();
    let first = queues.first().ok_or("no queue")?.clone();
    for i in 0..n {
        let key = StateKey::new(&agent, Some("u"), format!("s{}", i % 100))?;
        first.submit(NewRun::message(key, "m", None)?).await?;
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (w, q) in queues.into_iter().enumerate() {
        let opts = ClaimOptions::new(&agent, format!("w{w}"), Duration::from_secs(15));
        tasks.push(tokio::spawn(async move {
            let mut done = 0usize;
            while let Some(c) = q.claim(&opts).await? {
                q.finish(&c, &completed()).await?;
                done += 1;
            }
            Ok::<_, hame_state::Error>(done)
        }));
    }
    let mut done = 0;
    for t in tasks {
        done += t.await??;
    }
    if done != n {
        return Err(format!("{done} of {n} runs done").into());
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// A queue for `url`, with its own connections (as a separate worker process has).
async fn open(url: &str) -> R<Arc<dyn RunQueue>> {
    Ok(if url.starts_with("redis") {
        Arc::new(RedisRunQueue::connect(url, RedisOptions::default()).await?)
    } else {
        Arc::new(PgRunQueue::connect(url, SqlOptions::default()).await?)
    })
}

#[tokio::main]
async fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = !args.iter().any(|a| a == "--no-json");
    let urls: Vec<&String> = args.iter().filter(|a| a.contains("://")).collect();
    let dir = tempfile::tempdir()?;
    // The JSON queue reads every record per claim: 200 runs keep its run short.
    if json {
        println!("JSON queue (one host), 200 runs:");
        latency(&JsonRunQueue::open(dir.path())?, 200).await?;
        for workers in 1..=3 {
            // A fresh directory per measurement: the JSON queue reads every record per claim.
            let fresh = tempfile::tempdir()?;
            let qs: Vec<Arc<dyn RunQueue>> = (0..workers)
                .map(|_| JsonRunQueue::open(fresh.path()).map(|q| Arc::new(q) as Arc<dyn RunQueue>))
                .collect::<Result<_, _>>()?;
            println!(
                "  {workers} worker(s): {:.0} runs/s",
                throughput(qs, 200).await?
            );
        }
    }
    for url in urls {
        let name = if url.starts_with("redis") {
            "Redis"
        } else {
            "PostgreSQL"
        };
        println!("{name} queue, 1,000 runs:");
        latency(&*open(url).await?, 1000).await?;
        for workers in 1..=3 {
            let mut qs: Vec<Arc<dyn RunQueue>> = Vec::new();
            for _ in 0..workers {
                qs.push(open(url).await?);
            }
            println!(
                "  {workers} worker(s): {:.0} runs/s",
                throughput(qs, 1000).await?
            );
        }
    }
    Ok(())
}
