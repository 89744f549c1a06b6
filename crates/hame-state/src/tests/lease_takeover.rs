//! A lease holder killed with SIGKILL: on the same machine the next `acquire` takes its
//! lease over at once (not after the TTL), and the dead holder's lease can no longer write.
//! Runs on every store that several processes share: JSON, Redis, PostgreSQL, MySQL.

use std::process::Stdio;
use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;
use tokio::io::{AsyncBufReadExt, BufReader};

#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
use crate::conformance::service_url;
use crate::conformance::{stale_copy, unique_agent};
use crate::{DEFAULT_LEASE_TTL, Error, LeaseOptions, Result, StateKey};

/// Set in the child: `<store URL>\n<agent id>`.
const CHILD: &str = "HAME_STATE_TEST_LEASE_CHILD";
/// The child's line once it holds the lease: `HAME_STATE_LEASE_HELD <fence> <token>`.
const HELD: &str = "HAME_STATE_LEASE_HELD";
/// The longest acceptable time from the kill to the next holder's lease.
const TAKEOVER_LIMIT: Duration = Duration::from_secs(2);

fn session(agent: &str) -> Result<StateKey> {
    StateKey::new(agent, Some("u1"), "s1")
}

/// Not a test of its own: the child process of [`takeover_after_sigkill`] (this test binary,
/// run again with [`CHILD`] set). Without the variable it does nothing.
#[tokio::test]
async fn lease_holder_child() -> Result<()> {
    let Ok(spec) = std::env::var(CHILD) else {
        return Ok(());
    };
    let (url, agent) = spec
        .split_once('\n')
        .ok_or_else(|| Error::Config(format!("bad {CHILD}")))?;
    let store = crate::open(url).await?;
    // A long TTL: only the takeover of a dead holder can free it within the test.
    let options = LeaseOptions::new(Duration::from_secs(120), Duration::from_secs(10));
    let lease = store.acquire(&session(agent)?, options).await?;
    #[allow(clippy::print_stdout)]
    {
        println!("{HELD} {} {}", lease.fence(), lease.token());
    }
    tokio::time::sleep(Duration::from_secs(120)).await;
    Err(Error::Config("the lease holder was not killed".into()))
}

async fn takeover_after_sigkill(backend: &str, url: &str) -> Result<()> {
    let io = |e: std::io::Error| Error::io("lease holder child", e);
    let store = crate::open(url).await?;
    let agent = unique_agent();
    let key = session(&agent)?;
    let exe = std::env::current_exe().map_err(io)?;
    let mut child = tokio::process::Command::new(exe)
        .args(["--exact", "tests::lease_takeover::lease_holder_child"])
        .args(["--nocapture", "--test-threads", "1"])
        .env(CHILD, format!("{url}\n{agent}"))
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(io)?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::Config("no child stdout".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let held = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            // libtest may have written `test … ... ` on the same line before it.
            if let Some(at) = line.find(HELD) {
                return Ok(line[at + HELD.len()..].trim().to_owned());
            }
        }
        Err(std::io::Error::other("the child exited without the lease"))
    })
    .await
    .map_err(|_| Error::Config("the child took no lease within 60 s".into()))?
    .map_err(io)?;
    let (fence, token) = held
        .split_once(' ')
        .ok_or_else(|| Error::Config(format!("bad line {held:?}")))?;
    let fence: u64 = fence
        .parse()
        .map_err(|_| Error::Config(format!("bad fence {fence:?}")))?;

    // While the child lives, its lease holds.
    assert!(
        store.try_acquire(&key, DEFAULT_LEASE_TTL).await?.is_none(),
        "{backend}: the live child's lease was taken"
    );

    child.start_kill().map_err(io)?;
    let killed = Instant::now();
    let status = child.wait().await.map_err(io)?;
    assert!(!status.success(), "{backend}: child {status}");
    let lease = store
        .acquire(
            &key,
            LeaseOptions::new(DEFAULT_LEASE_TTL, Duration::from_secs(10)),
        )
        .await?;
    let took = killed.elapsed();
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "FIGURE {backend}: lease of a SIGKILLed holder taken over {} ms after the kill (fence {fence} -> {})",
            took.as_millis(),
            lease.fence()
        );
    }
    assert!(took <= TAKEOVER_LIMIT, "{backend}: takeover took {took:?}");
    assert!(lease.fence() > fence, "{backend}: fence did not grow");

    // The dead holder's lease, replayed as a paused process would, cannot write.
    let stale = stale_copy(&key, token, fence);
    let state = hame_core::AgentState::default();
    let refused = store.save_fenced(&key, &state, None, &stale).await;
    assert!(
        matches!(refused, Err(Error::LeaseLost { .. })),
        "{backend}: the dead holder's save gave {refused:?}"
    );
    assert!(
        store.load(&key).await?.is_none(),
        "{backend}: refused save wrote"
    );
    assert_eq!(store.save_fenced(&key, &state, None, &lease).await?, 1);
    lease.release().await
}

#[cfg(feature = "json")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_after_sigkill_json() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
    takeover_after_sigkill("json", &dir.path().display().to_string()).await
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_after_sigkill_redis() -> Result<()> {
    match service_url("HAME_TEST_REDIS_URL")? {
        Some(url) => takeover_after_sigkill("redis", &url).await,
        None => Ok(()),
    }
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_after_sigkill_postgres() -> Result<()> {
    match service_url("HAME_TEST_POSTGRES_URL")? {
        Some(url) => takeover_after_sigkill("postgres", &url).await,
        None => Ok(()),
    }
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_after_sigkill_mysql() -> Result<()> {
    match service_url("HAME_TEST_MYSQL_URL")? {
        Some(url) => takeover_after_sigkill("mysql", &url).await,
        None => Ok(()),
    }
}
