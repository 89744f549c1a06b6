//! The Redis connection of hame's Redis backends — `hame-state`'s `RedisStore` and
//! `hame-fs-remote`'s `RedisFs` — and the one policy both follow when a connection breaks:
//! the call is sent again on the re-established connection, with backoff, for a bounded
//! time ([`RetryPolicy`], default: 50 ms doubling to 1 s, for at most 10 s after the first
//! failure). A Redis restart of a second or two is ridden out instead of failing the call.
//!
//! Who should depend on it: only crates that speak Redis themselves. Its signatures carry
//! `redis` types — it is the glue of those backends, which keep `redis` out of their own
//! public API — not something applications use.
//!
//! Retrying is only safe for calls that may run twice: a reply lost with the connection
//! may belong to a call the server applied. Reads are; a write must make its second run a
//! no-op (both backends' writes carry a write id their Lua scripts remember, ADR 0024).
//!
//! No features.
//!
//! ```
//! use std::time::Duration;
//! use hame_redis::RetryPolicy;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let policy = RetryPolicy::default();
//! assert_eq!(policy.window, Duration::from_secs(10));
//! // A call that fails once with a broken connection, then succeeds.
//! let mut calls = 0;
//! let got: redis::RedisResult<u32> = hame_redis::retry(&policy, "GET", || {
//!     calls += 1;
//!     let n = calls;
//!     async move {
//!         if n == 1 {
//!             Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into())
//!         } else {
//!             Ok(7)
//!         }
//!     }
//! })
//! .await;
//! assert_eq!(got.ok(), Some(7));
//! # }
//! ```
#![deny(missing_docs)]

use std::future::Future;
use std::time::Duration;

use redis::{RedisError, RedisResult, RetryMethod};
use tokio::time::Instant;

/// How long and how often a call whose connection broke is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The retries end this long after the first failure; an attempt still running then is
    /// abandoned and the call fails. Default 10 s.
    pub window: Duration,
    /// Pause before the first retry; it doubles after each failed one. Default 50 ms.
    pub first_pause: Duration,
    /// Longest pause between two retries. Default 1 s.
    pub max_pause: Duration,
}

/// [`RetryPolicy::window`] by default.
pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(10);

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            window: DEFAULT_RETRY_WINDOW,
            first_pause: Duration::from_millis(50),
            max_pause: Duration::from_secs(1),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries (every call is sent once).
    pub fn none() -> Self {
        Self {
            window: Duration::ZERO,
            ..Self::default()
        }
    }
}

/// Whether a failed call may succeed when sent again on a new connection: the connection
/// broke or was refused (a restart, a dropped link), or the server said to wait
/// (`LOADING` while it reads its data after a restart, `TRYAGAIN`, `MASTERDOWN`). A timeout
/// does not count — the call may still be running, and waiting again multiplies the time
/// the caller waits — nor do errors of the call itself.
pub fn is_retryable(e: &RedisError) -> bool {
    if e.is_timeout() {
        return false;
    }
    match e.retry_method() {
        RetryMethod::WaitAndRetry => true,
        RetryMethod::NoRetry => false,
        _ => e.is_io_error() || e.is_connection_dropped(),
    }
}

/// Runs `attempt`; after a [retryable](is_retryable) failure runs it again, pausing as
/// `policy` says, until it succeeds, fails otherwise, or `policy.window` has passed since
/// the first failure (then that first failure is returned: it names the cause, the
/// retries' failures only that the server stayed away). `what` names the call in logs.
/// Each attempt gets a fresh future: build the command inside `attempt`.
pub async fn retry<T, F, Fut>(policy: &RetryPolicy, what: &str, mut attempt: F) -> RedisResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let first = match attempt().await {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    if !is_retryable(&first) || policy.window.is_zero() {
        return Err(first);
    }
    let mut last_retry = None;
    let started = Instant::now();
    let deadline = started + policy.window;
    let mut pause = policy.first_pause;
    let mut tries = 1u32;
    tracing::warn!(call = what, error = %first, "redis connection broke; retrying on a new one");
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        tries += 1;
        match tokio::time::timeout(left, attempt()).await {
            Ok(Ok(v)) => {
                tracing::info!(
                    call = what,
                    tries,
                    waited_ms = started.elapsed().as_millis() as u64,
                    "redis call succeeded after reconnecting"
                );
                return Ok(v);
            }
            Ok(Err(e)) if is_retryable(&e) => last_retry = Some(e),
            Ok(Err(e)) => return Err(e),
            // The window ended during an attempt: it is abandoned.
            Err(_) => break,
        }
        pause = pause.saturating_mul(2).min(policy.max_pause);
    }
    tracing::warn!(
        call = what,
        tries,
        error = %first,
        last = ?last_retry.map(|e| e.to_string()),
        "redis call failed: the server stayed unreachable for the whole retry window"
    );
    // The first failure says what happened (the connection broke); the retries' ("refused")
    // only that the server stayed away.
    Err(first)
}

/// One command, pipeline or script call: what [`send`] sends, again as a whole after a
/// broken connection.
#[derive(Clone, Copy)]
pub enum Call<'a> {
    /// A command.
    Cmd(&'a redis::Cmd),
    /// A pipeline (of reads: a pipeline is sent again whole).
    Pipeline(&'a redis::Pipeline),
    /// A Lua script (`EVALSHA`, loaded again after a restart emptied the script cache).
    Script(&'a redis::ScriptInvocation<'a>),
}

impl std::fmt::Debug for Call<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Call::Cmd(_) => "Call::Cmd",
            Call::Pipeline(_) => "Call::Pipeline",
            Call::Script(_) => "Call::Script",
        })
    }
}

/// Sends `call` on `conn` (a [`ConnectionManager`](redis::aio::ConnectionManager), which
/// re-establishes a broken connection by itself), again after a broken connection as
/// `policy` says ([`retry`]).
pub async fn send<T: redis::FromRedisValue + Send>(
    conn: &redis::aio::ConnectionManager,
    policy: &RetryPolicy,
    what: &str,
    call: Call<'_>,
) -> RedisResult<T> {
    retry(policy, what, || {
        let mut conn = conn.clone();
        async move {
            match call {
                Call::Cmd(cmd) => cmd.query_async(&mut conn).await,
                Call::Pipeline(pipe) => pipe.query_async(&mut conn).await,
                Call::Script(script) => script.invoke_async(&mut conn).await,
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broken() -> RedisError {
        std::io::Error::from(std::io::ErrorKind::ConnectionReset).into()
    }

    #[test]
    fn what_is_retried() {
        assert!(is_retryable(&broken()));
        let refused: RedisError =
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert!(is_retryable(&refused));
        let timeout: RedisError = std::io::Error::from(std::io::ErrorKind::TimedOut).into();
        assert!(!is_retryable(&timeout));
        let loading = RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading),
            "LOADING",
        ));
        assert!(is_retryable(&loading));
        let script = RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "ERR bad",
        ));
        assert!(!is_retryable(&script));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_end_after_the_window() {
        let policy = RetryPolicy::default();
        let started = Instant::now();
        let mut calls = 0u32;
        let got: RedisResult<()> = retry(&policy, "t", || {
            calls += 1;
            async { Err(broken()) }
        })
        .await;
        assert!(got.is_err());
        let waited = started.elapsed();
        assert!(
            waited >= policy.window && waited < policy.window + Duration::from_millis(10),
            "{waited:?}"
        );
        // The first attempt, then retries after 50, 100, 200, 400, 800 ms and eight 1 s
        // pauses (1.55 s + 8 s); the ninth 1 s pause reaches the end of the window.
        assert_eq!(calls, 14);
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_error_is_not_retried() {
        let mut calls = 0u32;
        let got: RedisResult<()> = retry(&RetryPolicy::default(), "t", || {
            calls += 1;
            async {
                Err(RedisError::from((
                    redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                    "ERR bad",
                )))
            }
        })
        .await;
        assert!(got.is_err());
        assert_eq!(calls, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_hanging_past_the_window_is_abandoned() {
        let started = Instant::now();
        let mut calls = 0u32;
        let got: RedisResult<()> = retry(&RetryPolicy::default(), "t", || {
            calls += 1;
            let n = calls;
            async move {
                if n == 1 {
                    Err(broken())
                } else {
                    std::future::pending().await
                }
            }
        })
        .await;
        assert!(got.is_err());
        assert!(started.elapsed() <= DEFAULT_RETRY_WINDOW + Duration::from_millis(10));
    }
}
