//! The sessions' events shared between replicas ([`EventLog`]): each event of a session
//! gets the next id of that session's counter in the shared store and is kept among the
//! session's last ones, so a reader on any replica replays what a turn on another one
//! published, with the same ids (`hame serve`'s `GET …/events?after=ID`, docs/replicas.md).
//!
//! Backends: Redis ([`RedisEventLog`], feature `redis`: a counter and a bounded list per
//! session, one Lua script per event), PostgreSQL ([`PgEventLog`], feature `postgres`: one
//! statement per event) and MySQL / MariaDB ([`MySqlEventLog`], feature `mysql`: one
//! transaction per event); [`connect_event_log`] picks one by URL. Every backend runs the one
//! suite, [`conformance::check`], against the real service.
//!
//! A session's events are forgotten after [`EventOptions::idle_ttl`] without a new one (24 h
//! by default): Redis expires its keys; the SQL backends sweep idle sessions when a session
//! publishes its first event and at every 512th event of one. A session whose events were
//! forgotten starts again at id 1.
//!
//! ```no_run
//! # async fn demo() -> hame_state::Result<()> {
//! use hame_state::events::{EventOptions, connect_event_log};
//!
//! let log = connect_event_log("postgres://hame@db/hame", EventOptions::default()).await?;
//! let id = log.publish("support/alice/s1", "text_delta 0 {\"text\":\"hi\"}", 1000).await?;
//! // On another replica: what came after the last id its client saw.
//! let missed = log.replay("support/alice/s1", id - 1).await?;
//! assert_eq!(missed.last().map(|e| e.id), Some(id));
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, Result};

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "postgres")]
mod sql;

#[cfg(feature = "mysql")]
pub use mysql::MySqlEventLog;
#[cfg(feature = "redis")]
pub use redis::RedisEventLog;
#[cfg(feature = "postgres")]
pub use sql::PgEventLog;

/// The longest key an [`EventLog`] takes, in bytes.
pub const MAX_EVENT_KEY_BYTES: usize = 768;

/// The SQL backends sweep idle sessions at every this many events of one session (and at its
/// first).
pub const SWEEP_EVERY: u64 = 512;

/// One stored event: its id in the session's sequence and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// 1, 2, … per key.
    pub id: u64,
    /// The text as published.
    pub body: String,
}

impl StoredEvent {
    /// An event of id `id`.
    pub fn new(id: u64, body: String) -> Self {
        Self { id, body }
    }
}

/// Where the sessions' events are shared between processes.
#[async_trait]
pub trait EventLog: Send + Sync + std::fmt::Debug {
    /// Stores `body` as the next event of `key` (at most [`MAX_EVENT_KEY_BYTES`]) and keeps
    /// only its last `keep` events (at least 1); the event's id: one more than the last one
    /// the key had.
    async fn publish(&self, key: &str, body: &str, keep: usize) -> Result<u64>;

    /// The kept events of `key` with an id above `after`, oldest first.
    async fn replay(&self, key: &str, after: u64) -> Result<Vec<StoredEvent>>;
}

/// How an [`EventLog`] is opened.
#[derive(Debug, Clone)]
pub struct EventOptions {
    /// How long a session's events stay without a new one (default 24 h).
    pub idle_ttl: Duration,
    /// Redis: the prefix of every key (default `hame:events`).
    pub prefix: String,
}

impl Default for EventOptions {
    fn default() -> Self {
        Self {
            idle_ttl: Duration::from_secs(24 * 3600),
            prefix: "hame:events".to_owned(),
        }
    }
}

/// The key's refusal, when it is empty or longer than [`MAX_EVENT_KEY_BYTES`].
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_EVENT_KEY_BYTES {
        return Err(Error::Config(format!(
            "an event key must have 1 to {MAX_EVENT_KEY_BYTES} bytes (got {})",
            key.len()
        )));
    }
    Ok(())
}

/// `keep` as the backends store it: at least 1.
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
pub(crate) fn keep_of(keep: usize) -> u64 {
    u64::try_from(keep).unwrap_or(u64::MAX).max(1)
}

/// Opens the event log at `url`: `redis://` / `rediss://`, `postgres://` / `postgresql://`
/// (applies hame-state's migrations), `mysql://` / `mariadb://` (the same). A scheme whose
/// feature is not compiled in is [`Error::FeatureDisabled`]; another one is
/// [`Error::Config`].
pub async fn connect_event_log(url: &str, options: EventOptions) -> Result<Arc<dyn EventLog>> {
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    let _ = &options;
    match scheme.as_str() {
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(Arc::new(RedisEventLog::connect(url, options).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(PgEventLog::connect(url, options).await?)),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Arc::new(MySqlEventLog::connect(url, options).await?)),
        _ => Err(match feature_of(&scheme) {
            Some(feature) => Error::FeatureDisabled { scheme, feature },
            None => Error::Config(format!(
                "no event log for {}: use redis://, postgres:// or mysql://",
                crate::redact_url(url)
            )),
        }),
    }
}

/// The feature of this crate that serves a URL scheme's event log.
fn feature_of(scheme: &str) -> Option<&'static str> {
    match scheme {
        "redis" | "rediss" => Some("redis"),
        "postgres" | "postgresql" => Some("postgres"),
        "mysql" | "mariadb" => Some("mysql"),
        _ => None,
    }
}

/// The SQL backends' log: a pool of `P`, the idle time to live, where it points (no
/// password). [`PgEventLog`] and [`MySqlEventLog`].
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub struct SqlEventLog<P> {
    pool: P,
    ttl: Duration,
    target: String,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<P> std::fmt::Debug for SqlEventLog<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlEventLog")
            .field("target", &self.target)
            .field("idle_ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// The suite every [`EventLog`] backend runs (feature `conformance`, or this crate's tests).
#[cfg(any(test, feature = "conformance"))]
pub mod conformance {
    use std::time::Duration;

    use super::{EventLog, StoredEvent};
    use crate::error::{Error, Result};

    fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(Error::Config(format!("event log conformance: {}", what())))
        }
    }

    /// Runs the suite on `log`, opened with an idle time to live of `ttl` (short: the suite
    /// waits it out once). Keys are made unique with `unique` (e.g. a random id).
    pub async fn check(log: &dyn EventLog, ttl: Duration, unique: &str) -> Result<()> {
        let a = format!("agent/{unique}/a");
        let b = format!("agent/{unique}/b");
        // Ids count per key from 1; bodies come back as published (spaces, JSON, UTF-8).
        let bodies = [
            "text_delta 0 {\"text\":\"a b\"}",
            "finished 1 {\"reply\":\"é ✓\"}",
        ];
        for (i, body) in bodies.iter().enumerate() {
            let id = log.publish(&a, body, 10).await?;
            ensure(id == i as u64 + 1, || format!("id {id} for event {i} of a"))?;
        }
        ensure(log.publish(&b, "x", 10).await? == 1, || {
            "a second key does not start at 1".into()
        })?;
        let got = log.replay(&a, 0).await?;
        let want: Vec<StoredEvent> = bodies
            .iter()
            .enumerate()
            .map(|(i, b)| StoredEvent {
                id: i as u64 + 1,
                body: (*b).to_owned(),
            })
            .collect();
        ensure(got == want, || format!("replay of a: {got:?}"))?;
        let after = log.replay(&a, 1).await?;
        ensure(after.len() == 1 && after[0].id == 2, || {
            format!("replay after 1: {after:?}")
        })?;
        ensure(log.replay(&a, 2).await?.is_empty(), || {
            "replay after the last id is not empty".into()
        })?;
        ensure(
            log.replay(&format!("{a}-none"), 0).await?.is_empty(),
            || "an unknown key has events".into(),
        )?;

        // Only the last `keep` stay; ids go on.
        let c = format!("agent/{unique}/c");
        for i in 1..=7u64 {
            let id = log.publish(&c, &format!("e{i}"), 3).await?;
            ensure(id == i, || format!("id {id} for event {i} of c"))?;
        }
        let kept: Vec<u64> = log.replay(&c, 0).await?.iter().map(|e| e.id).collect();
        ensure(kept == [5, 6, 7], || format!("kept of c: {kept:?}"))?;
        let tail: Vec<u64> = log.replay(&c, 5).await?.iter().map(|e| e.id).collect();
        ensure(tail == [6, 7], || format!("replay of c after 5: {tail:?}"))?;
        ensure(log.replay(&c, 9).await?.is_empty(), || {
            "a replay after an id the key never had is not empty".into()
        })?;

        // Concurrent publishers of one key get distinct ids, none lost.
        let d = format!("agent/{unique}/d");
        let published: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
        let ids = futures::future::try_join_all(published.iter().map(|p| log.publish(&d, p, 100)))
            .await?;
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        ensure(sorted == (1..=20).collect::<Vec<u64>>(), || {
            format!("concurrent ids: {ids:?}")
        })?;
        ensure(log.replay(&d, 0).await?.len() == 20, || {
            "concurrent events lost".into()
        })?;

        // A bad key is refused in one line.
        for bad in [String::new(), "k".repeat(super::MAX_EVENT_KEY_BYTES + 1)] {
            let r = log.publish(&bad, "x", 1).await;
            ensure(matches!(r, Err(Error::Config(_))), || {
                format!("a key of {} bytes: {r:?}", bad.len())
            })?;
        }

        // Idle sessions are forgotten after the time to live; a new one starts at 1 and
        // sweeps them.
        tokio::time::sleep(ttl + Duration::from_millis(300)).await;
        let e = format!("agent/{unique}/e");
        ensure(log.publish(&e, "new", 10).await? == 1, || {
            "a new key after the sweep does not start at 1".into()
        })?;
        ensure(log.replay(&a, 0).await?.is_empty(), || {
            "an idle session's events outlived the time to live".into()
        })?;
        ensure(log.publish(&a, "again", 10).await? == 1, || {
            "a forgotten session does not start again at 1".into()
        })?;
        Ok(())
    }
}
