//! The gateway's benchmark: turns/s over loopback at 1, 50 and 500 concurrent sessions (or
//! the levels `--concurrency` names), the
//! p50 latency the gateway adds over the library call, and the RSS with 10,000 idle
//! sessions. Everything runs in this process: the Rust scripted model server (recording
//! off), the agent (local mode, JSON state, memory off) and the gateway.
//!
//! ```sh
//! cargo run --profile dist -p hame-gateway --example gateway_bench
//! ```
//! Figures are recorded in docs/gateway.md. Options: `--seconds N` per concurrency level
//! (default 5), `--idle N` idle sessions (default 10000), `--tmpfs` workspace and state on
//! /dev/shm (fsync is free there: the CPU cost of a turn without the disk's), `--idle-only`
//! only the memory figure (in a fresh process), `--users-only` only the runs with a user
//! per session, `--concurrency 1,50,1000` the levels of concurrent sessions (default
//! `1,50,500`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use hame::{HarnessAgent, Message, RuntimeContext};
use hame_gateway::{Gateway, GatewayOptions};
use hame_test_support::{RecordedRequest, ScriptStep, ScriptedServer};

/// Turns per session before a worker moves on to a new one (conversations stay short, as
/// in a chat service where most sessions are new).
const TURNS_PER_SESSION: u64 = 10;

fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The value after option `name`, if given.
fn value(name: &str) -> Option<String> {
    let mut args = std::env::args();
    args.position(|a| a == name)?;
    args.next()
}

/// `--concurrency a,b,c`: the levels of concurrent sessions (each ≥ 1).
fn levels(default: &[u64]) -> anyhow::Result<Vec<u64>> {
    let Some(v) = value("--concurrency") else {
        return Ok(default.to_vec());
    };
    v.split(',')
        .map(|n| match n.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => anyhow::bail!("--concurrency: `{n}` is not a number of sessions (1 or more)"),
        })
        .collect()
}

fn arg(name: &str, default: u64) -> u64 {
    value(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

async fn post(
    client: &reqwest::Client,
    base: &str,
    user: Option<&str>,
    session: &str,
) -> anyhow::Result<()> {
    let mut req = client
        .post(format!("{base}/v1/sessions/{session}/messages"))
        .json(&serde_json::json!({"message": "hi"}));
    if let Some(u) = user {
        req = req.header("x-hame-user", u);
    }
    let r = req.send().await?;
    anyhow::ensure!(r.status() == 200, "status {}", r.status());
    r.bytes().await?;
    Ok(())
}

/// Where a load sends its turns.
#[derive(Clone)]
enum Via {
    Http(reqwest::Client, String),
    Library(HarnessAgent),
}

impl Via {
    async fn turn(&self, user: Option<&str>, session: &str) -> anyhow::Result<()> {
        match self {
            Via::Http(client, base) => post(client, base, user, session).await,
            Via::Library(agent) => {
                let mut ctx = RuntimeContext::new(session);
                if let Some(u) = user {
                    ctx = ctx.with_user(u);
                }
                agent.call(Message::user("hi"), &ctx).await?;
                Ok(())
            }
        }
    }
}

/// `workers` concurrent sessions (each worker its own user when `users`) sending turns
/// for `secs`; returns turns/s and p50/p99.
async fn load(
    via: &Via,
    tag: &str,
    workers: u64,
    secs: u64,
    users: bool,
) -> anyhow::Result<(f64, Duration, Duration)> {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let mut handles = Vec::new();
    for w in 0..workers {
        let via = via.clone();
        let done = done.clone();
        let tag = tag.to_owned();
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut n = 0u64;
            let user = users.then(|| format!("{tag}u{w}"));
            while Instant::now() < stop {
                let session = format!("{tag}{workers}-w{w}-{}", n / TURNS_PER_SESSION);
                let t = Instant::now();
                via.turn(user.as_deref(), &session).await?;
                lat.push(t.elapsed());
                n += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(lat)
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    Ok((
        done.load(Ordering::Relaxed) as f64 / elapsed,
        pct(&all, 0.5),
        pct(&all, 0.99),
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let secs = arg("--seconds", 5);
    let idle = arg("--idle", 10_000);
    // `--tmpfs`: workspace and state on /dev/shm, where fsync costs nothing: the CPU cost
    // of a turn without the disk's.
    let tmpfs = std::env::args().any(|a| a == "--tmpfs");
    let dir = if tmpfs {
        tempfile::tempdir_in("/dev/shm")?
    } else {
        tempfile::tempdir()?
    };
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    std::fs::write(ws.join("AGENTS.md"), "You are a benchmark agent.")?;
    let model = ScriptedServer::start().await?;
    model.set_recording(false);
    model.set_responder(|_: &RecordedRequest| ScriptStep::text("ok"));
    let base_url = model.base_url();
    let env = move |k: &str| match k {
        "OPENAI_BASE_URL" => Some(base_url.clone()),
        "OPENAI_API_KEY" => Some("bench".to_owned()),
        _ => None,
    };
    let agent = HarnessAgent::builder()
        .name("bench")
        .model(hame::model::open("openai:m", &env)?)
        .workspace(ws.clone())
        .state_store(Arc::new(hame::state::JsonStore::open(
            dir.path().join("state"),
        )?))
        .memory(hame::harness::MemoryOptions::disabled())
        .build()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let gateway = Gateway::new(
        agent.clone(),
        RuntimeContext::new("default"),
        GatewayOptions::default(),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(gateway.serve(listener, async move {
        let _ = stop_rx.await;
    }));
    let base = format!("http://{addr}");
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .build()?;
    println!(
        "gateway_bench: release={} cores={} dir={}",
        !cfg!(debug_assertions),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if tmpfs {
            "/dev/shm (tmpfs)"
        } else {
            "temp dir (disk)"
        }
    );

    let http = Via::Http(client.clone(), base.clone());
    let lib = Via::Library(agent.clone());
    // Warm up (connections, the model client, file caches).
    load(&http, "warm", 10, 1, false).await.context("warm-up")?;

    // `--idle-only`: only the memory figure, in a fresh process.
    let idle_only = std::env::args().any(|a| a == "--idle-only");
    // Added latency: the same turn through the library and over HTTP, one at a time,
    // interleaved so drift (page cache, allocator) hits both alike.
    let n = if idle_only { 0 } else { 300u64 };
    let mut lib_lat = Vec::new();
    let mut http_lat = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        lib.turn(None, &format!("lib-{}", i / TURNS_PER_SESSION))
            .await?;
        lib_lat.push(t.elapsed());
        let t = Instant::now();
        http.turn(None, &format!("http-{}", i / TURNS_PER_SESSION))
            .await?;
        http_lat.push(t.elapsed());
    }
    lib_lat.sort();
    http_lat.sort();
    let (lib50, http50) = (pct(&lib_lat, 0.5), pct(&http_lat, 0.5));
    if n > 0 {
        println!(
            "latency, 1 at a time ({n} turns each): library p50 {:.3} ms, HTTP p50 {:.3} ms, added p50 {:.3} ms",
            lib50.as_secs_f64() * 1e3,
            http50.as_secs_f64() * 1e3,
            (http50.as_secs_f64() - lib50.as_secs_f64()) * 1e3
        );
    }

    // `--users-only`: only the runs with a user per session.
    let users_only = std::env::args().any(|a| a == "--users-only");
    let concurrency = levels(&[1, 50, 500])?;
    let modes: &[(bool, &str)] = if idle_only {
        &[]
    } else if users_only {
        &[(true, "a user per session")]
    } else {
        &[(false, "one user"), (true, "a user per session")]
    };
    for &(users, what) in modes {
        for &workers in &concurrency {
            for (via, name) in [(&lib, "library"), (&http, "HTTP")] {
                let tag = format!("{}{}", &name[..1], if users { "u" } else { "s" });
                let (tps, p50, p99) = load(via, &tag, workers, secs, users).await?;
                println!(
                    "throughput, {what:<18}, {workers:>3} concurrent sessions, {name:<7}: {tps:>6.0} turns/s (p50 {:.1} ms, p99 {:.1} ms)",
                    p50.as_secs_f64() * 1e3,
                    p99.as_secs_f64() * 1e3
                );
            }
        }
    }
    // Idle sessions last: each had one turn (each its own user, as in a chat service), so
    // the gateway holds its gate entry and event ring for each.
    let before = rss_mb();
    let sem = Arc::new(tokio::sync::Semaphore::new(50));
    let mut handles = Vec::new();
    let idle_started = Instant::now();
    for i in 0..idle {
        let permit = sem.clone().acquire_owned().await?;
        let client = client.clone();
        let base = base.clone();
        handles.push(tokio::spawn(async move {
            let r = post(&client, &base, Some(&format!("idle{i}")), "s").await;
            drop(permit);
            r
        }));
    }
    for h in handles {
        h.await??;
    }
    let idle_secs = idle_started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_mb();
    println!(
        "memory: RSS {before:.1} MB before, {after:.1} MB with {idle} idle sessions (+{:.1} MB; whole process: model server, agent, gateway, client; {idle} turns took {idle_secs:.1} s)",
        after - before
    );

    let _ = stop_tx.send(());
    server.await??;
    Ok(())
}
