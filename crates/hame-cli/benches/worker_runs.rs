//! Runs/s with 1, 2 and 3 separate `hame worker` processes executing short model turns
//! (a scripted model that answers at once) from one run queue: PostgreSQL and/or Redis.
//! A benchmark, not a test: it prints the figures (docs/replicas.md, "Measured").
//!
//! ```text
//! cargo bench -p hame-cli --bench worker_runs -- [--runs N] [--workers 1,2,3] URL...
//! # the debug build, faster to build:
//! cargo test -p hame-cli --bench worker_runs -- --runs 1000 postgres://… redis://…
//! ```
//!
//! Each configuration gets a fresh agent id (its own runs), a fresh workspace, and `N`
//! runs (default 1,000) over 100 sessions, submitted before the workers start; the time
//! is from the workers' start (each printed its ready line) to the last run's end, read
//! from the queue. Each worker runs 4 runs at once (`--worker-concurrency 4`).

#![allow(clippy::print_stdout, clippy::print_stderr)] // a benchmark prints its figures

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hame::state::StateKey;
use hame::state::runs::{NewRun, RunFilter, RunStatus, open_queue};
use hame_test_support::{ScriptStep, ScriptedServer};

type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

const SESSIONS: usize = 100;

struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn start_worker(
    hame: &str,
    dir: &std::path::Path,
    model: &str,
    agent: &str,
    url: &str,
    i: usize,
) -> Result<Child> {
    let mut child = Command::new(hame)
        .args([
            "worker",
            "--model",
            "openai:m",
            "--no-memory",
            "--agent",
            agent,
        ])
        .args(["--state", url, "--worker-concurrency", "4"])
        .arg("--workspace")
        .arg(dir.join("ws"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("OPENAI_BASE_URL", model)
        .env("HAME_STATE_HOME", dir.join("state"))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join(format!("worker-{i}.err")))?)
        .spawn()?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    if !line.starts_with("worker ") {
        let _ = child.kill();
        return Err(format!("worker {i} did not start: {line:?}").into());
    }
    Ok(child)
}

/// Runs/s of `runs` runs drained by `workers` processes from the queue at `url`.
async fn measure(hame: &str, model: &str, url: &str, workers: usize, runs: usize) -> Result<f64> {
    let queue = open_queue(url).await?;
    let agent = format!("bench{}", uuid_like());
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("ws"))?;
    let mut last = Vec::new();
    for i in 0..runs {
        let session = format!("s{}", i % SESSIONS);
        let new = NewRun::message(
            StateKey::new(&agent, Some("u"), &session)?,
            format!("m{i}"),
            None,
        )?;
        let id = queue.submit(new).await?.run.id;
        if i + SESSIONS >= runs {
            last.push(id);
        }
    }
    let start = Instant::now();
    let mut procs = Workers(Vec::new());
    for i in 0..workers {
        procs
            .0
            .push(start_worker(hame, dir.path(), model, &agent, url, i)?);
    }
    loop {
        let mut open = 0;
        for id in &last {
            match queue.get(id).await? {
                Some(r) if r.status.is_finished() => {
                    if r.status != RunStatus::Completed {
                        return Err(format!("run {id} ended {}: {:?}", r.status, r.error).into());
                    }
                }
                _ => open += 1,
            }
        }
        if open == 0 {
            break;
        }
        if start.elapsed() > Duration::from_secs(1800) {
            return Err("runs did not finish in 30 min".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = start.elapsed();
    // Every run completed, one attempt each.
    let done = queue
        .list(RunFilter::new(&agent, Some("u"), None, runs + 1))
        .await?;
    let completed = done
        .iter()
        .filter(|r| r.status == RunStatus::Completed)
        .count();
    if completed != runs {
        return Err(format!("{completed} of {runs} runs completed").into());
    }
    drop(procs);
    Ok(runs as f64 / took.as_secs_f64())
}

fn uuid_like() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{:x}{}", t, std::process::id())
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut runs = 1000;
    let mut workers = vec![1, 2, 3];
    let mut urls = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().ok_or("--runs N")?.parse()?,
            "--workers" => {
                workers = args
                    .next()
                    .ok_or("--workers 1,2,3")?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
            }
            "--bench" => {}
            u if u.contains("://") => urls.push(u.to_owned()),
            other => {
                return Err(format!(
                    "unknown argument {other:?}; give queue URLs (postgres://…, redis://…)"
                )
                .into());
            }
        }
    }
    if urls.is_empty() {
        eprintln!("worker_runs: no queue URL given (postgres://…, redis://…); nothing measured");
        return Ok(());
    }
    let hame = std::env::var("HAME_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_hame").to_owned());
    let model = ScriptedServer::start().await?;
    model.set_responder(|_: &hame_test_support::RecordedRequest| ScriptStep::text("ok"));
    println!(
        "{runs} runs over {SESSIONS} sessions, short model turns (scripted, no delay), 4 runs at once per worker process"
    );
    for url in &urls {
        let name = url.split("://").next().unwrap_or("?");
        for &n in &workers {
            let rate = measure(&hame, &model.base_url(), url, n, runs).await?;
            println!("{name}: {n} worker process(es): {rate:.1} runs/s");
        }
    }
    Ok(())
}
