//! [`RedisStore`]: state in Redis hashes, a sorted-set index and `SET NX PX` leases.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hame_core::AgentState;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::{Error, Result};
use crate::key::StateKey;
use crate::store::{Lease, LeaseHandle, SessionSummary, StateStore, Stored};

/// Default key prefix of [`RedisStore`].
pub const DEFAULT_REDIS_PREFIX: &str = "hame:state";

/// Options of [`RedisStore::connect`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisOptions {
    /// Prefix of every key (default `hame:state`); must not contain `{` or `}`.
    pub prefix: String,
    /// Timeout of one connection attempt (default 5 s).
    pub connect_timeout: Duration,
    /// Timeout of one command (default 10 s; a 2 MB state takes a few ms on a LAN).
    pub response_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_REDIS_PREFIX.to_owned(),
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
        }
    }
}

impl RedisOptions {
    /// Default options with another key prefix.
    pub fn with_prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            ..Self::default()
        }
    }
}

/// A shared store on Redis.
///
/// Keys (`{…}` is a cluster hash tag, so one tenant's keys live in one slot and the Lua
/// scripts may touch them together; the tenant is `~` for anonymous, `u=<user>` otherwise):
///
/// ```text
/// <prefix>:{<agent>:<tenant>}:doc:<session>     hash: v = version, s = state JSON, t = updated (ms)
/// <prefix>:{<agent>:<tenant>}:idx               sorted set: session -> updated (ms)
/// <prefix>:{<agent>:<tenant>}:lease:<session>   string: holder token, with PX expiry
/// ```
///
/// `save` is one Lua script (compare version, write hash, update index), so it is atomic.
/// Leases are `SET NX PX`; renewal and release are compare-token Lua scripts.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: Arc<str>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

const SAVE: &str = r"
local cur = redis.call('HGET', KEYS[1], 'v')
if ARGV[1] == '' then
  if cur then return {0, cur} end
elseif cur ~= ARGV[1] then
  return {0, cur or ''}
end
local nv = (tonumber(cur) or 0) + 1
redis.call('HSET', KEYS[1], 'v', nv, 's', ARGV[2], 't', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return {1, tostring(nv)}
";

const DELETE: &str = r"
local n = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return n
";

const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

static SAVE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SAVE));
static DELETE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(DELETE));
static RENEW_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RENEW));
static RELEASE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RELEASE));

fn backend(e: redis::RedisError) -> Error {
    Error::backend("redis", e)
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl RedisStore {
    /// Connects to `url` (`redis://`, `rediss://`, with optional credentials and db).
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self> {
        if options.prefix.contains(['{', '}']) || options.prefix.is_empty() {
            return Err(Error::Config(
                "redis key prefix must be non-empty and contain no `{` or `}`".into(),
            ));
        }
        let client = redis::Client::open(url).map_err(backend)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(backend)?;
        Ok(Self {
            conn,
            prefix: options.prefix.into(),
        })
    }

    fn tenant(&self, agent: &str, user: Option<&str>) -> String {
        match user {
            Some(u) => format!("{}:{{{agent}:u={u}}}", self.prefix),
            None => format!("{}:{{{agent}:~}}", self.prefix),
        }
    }

    fn doc_key(&self, key: &StateKey) -> String {
        format!(
            "{}:doc:{}",
            self.tenant(key.agent(), key.user()),
            key.session()
        )
    }

    fn idx_key(&self, agent: &str, user: Option<&str>) -> String {
        format!("{}:idx", self.tenant(agent, user))
    }

    fn lease_key(&self, key: &StateKey) -> String {
        format!(
            "{}:lease:{}",
            self.tenant(key.agent(), key.user()),
            key.session()
        )
    }

    async fn write(&self, key: &StateKey, json: &[u8], expected: Option<u64>) -> Result<u64> {
        let mut conn = self.conn.clone();
        let now = Utc::now().timestamp_millis();
        let (ok, v): (i64, String) = SAVE_SCRIPT
            .key(self.doc_key(key))
            .key(self.idx_key(key.agent(), key.user()))
            .arg(expected.map(|v| v.to_string()).unwrap_or_default())
            .arg(json)
            .arg(now)
            .arg(key.session())
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        if ok == 1 {
            v.parse()
                .map_err(|_| Error::backend("redis", format!("bad version {v:?} from script")))
        } else {
            Err(Error::Conflict {
                key: key.to_string(),
                expected,
                found: v.parse().ok(),
            })
        }
    }

    #[cfg(any(test, feature = "conformance"))]
    async fn put_raw_doc(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
        self.delete(key).await?;
        let json = serde_json::to_vec(&state).map_err(Error::Serialize)?;
        self.write(key, &json, None).await.map(|_| ())
    }
}

#[async_trait]
impl StateStore for RedisStore {
    async fn load(&self, key: &StateKey) -> Result<Option<Stored>> {
        let mut conn = self.conn.clone();
        let (version, json): (Option<u64>, Option<Vec<u8>>) = redis::cmd("HMGET")
            .arg(self.doc_key(key))
            .arg("v")
            .arg("s")
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let (Some(version), Some(json)) = (version, json) else {
            return Ok(None);
        };
        let state = AgentState::from_slice(&json).map_err(|source| Error::Format {
            key: key.to_string(),
            source,
        })?;
        Ok(Some(Stored { state, version }))
    }

    async fn save(&self, key: &StateKey, state: &AgentState, expected: Option<u64>) -> Result<u64> {
        let json = serde_json::to_vec(state).map_err(Error::Serialize)?;
        self.write(key, &json, expected).await
    }

    async fn delete(&self, key: &StateKey) -> Result<bool> {
        let mut conn = self.conn.clone();
        let n: i64 = DELETE_SCRIPT
            .key(self.doc_key(key))
            .key(self.idx_key(key.agent(), key.user()))
            .arg(key.session())
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(n > 0)
    }

    async fn list_sessions(&self, agent: &str, user: Option<&str>) -> Result<Vec<SessionSummary>> {
        crate::validate_scope(agent, user)?;
        let mut conn = self.conn.clone();
        let entries: Vec<(String, f64)> = redis::cmd("ZREVRANGE")
            .arg(self.idx_key(agent, user))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let mut out: Vec<SessionSummary> = entries
            .into_iter()
            .map(|(session, ms)| SessionSummary {
                session,
                #[allow(clippy::cast_possible_truncation)]
                updated_at: DateTime::from_timestamp_millis(ms as i64).unwrap_or_default(),
            })
            .collect();
        crate::sort_summaries(&mut out);
        Ok(out)
    }

    async fn try_acquire(&self, key: &StateKey, ttl: Duration) -> Result<Option<Lease>> {
        let mut conn = self.conn.clone();
        let token = uuid::Uuid::new_v4().to_string();
        let lease_key = self.lease_key(key);
        let set: Option<String> = redis::cmd("SET")
            .arg(&lease_key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms(ttl))
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        if set.is_none() {
            return Ok(None);
        }
        let handle = RedisLease {
            conn: self.conn.clone(),
            lease_key,
            token: token.clone(),
            key: key.to_string(),
        };
        Ok(Some(Lease::new(key.clone(), token, ttl, Arc::new(handle))))
    }

    fn is_shared(&self) -> bool {
        true
    }
}

struct RedisLease {
    conn: ConnectionManager,
    lease_key: String,
    token: String,
    key: String,
}

impl std::fmt::Debug for RedisLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLease")
            .field("lease_key", &self.lease_key)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LeaseHandle for RedisLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let mut conn = self.conn.clone();
        let n: i64 = RENEW_SCRIPT
            .key(&self.lease_key)
            .arg(&self.token)
            .arg(ttl_ms(ttl))
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        if n == 1 {
            Ok(())
        } else {
            Err(Error::LeaseLost {
                key: self.key.clone(),
            })
        }
    }

    async fn release(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        let _: i64 = RELEASE_SCRIPT
            .key(&self.lease_key)
            .arg(&self.token)
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(())
    }
}

#[cfg(any(test, feature = "conformance"))]
#[async_trait]
impl crate::conformance::RawAccess for RedisStore {
    async fn put_raw(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
        self.put_raw_doc(key, state).await
    }
}
