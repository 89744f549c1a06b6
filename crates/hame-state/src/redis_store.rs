//! [`RedisStore`]: state in Redis hashes, a sorted-set index and `SET NX PX` leases.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hame_core::AgentState;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::{Error, FORMAT_VERSION, MAX_SCHEMA, Result};
use crate::key::StateKey;
use crate::shared_lease::{self, Claim, LeaseRecord, LeaseTable};
use crate::store::Save;
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
    /// How long a call whose connection broke (a restart, a dropped link) is sent again
    /// on the re-established connection, pausing 50 ms doubling to 1 s
    /// (`hame_redis::RetryPolicy`); zero sends every call once. Default 10 s.
    pub retry_window: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_REDIS_PREFIX.to_owned(),
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            retry_window: hame_redis::DEFAULT_RETRY_WINDOW,
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
/// <prefix>:{<agent>:<tenant>}:doc:<session>     hash: v = version, s = state JSON, t = updated (ms),
///                                               sv = schema version of s, w = id of the last write,
///                                               f = storage format (the N of hame-state/N; absent = 1)
/// <prefix>:{<agent>:<tenant>}:idx               sorted set: session -> updated (ms)
/// <prefix>:{<agent>:<tenant>}:lease:<session>   hash: t = token, f = fence, h = holder, e = expiry (ms)
/// ```
///
/// `save` is one Lua script (compare version, and for `save_fenced` the lease's token and
/// fence, write hash, update index), so it is atomic. A lease is a hash whose expiry `e` is
/// compared with the server's `TIME` in Lua; it is never deleted (a release blanks `t`), so
/// its fence `f` only grows. Acquire, takeover, renewal and release are Lua scripts.
///
/// A call that fails because the connection broke (reset, broken pipe, refused, `LOADING`
/// after a restart: not a timeout, not an error of the call) is sent again on the
/// connection the manager re-establishes, with backoff (50 ms doubling to 1 s), for up to
/// [`RedisOptions::retry_window`] (10 s) after the first failure — the one policy of
/// hame's Redis backends (`hame_redis`). Every call is idempotent, so that is safe even if
/// an earlier run was applied and only its reply was lost: a `save` carries a write id and
/// a retry that finds its own write reports it as done; lease calls carry their token.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    prefix: Arc<str>,
    /// The URL, password redacted.
    target: Arc<str>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.target)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// KEYS: doc, idx, lease. ARGV: expected version ('' = absent), state, now ms, session,
/// lease token ('' = not fenced), fence, write id, schema version of the state, newest
/// schema version this build reads, storage format of this build. Returns {1, new
/// version}, {0, found version}, {2, ''} (the lease is not current), {3, stored schema
/// version} or {4, stored format} (the document is of a newer hame: it is never
/// overwritten). A write whose id is already stored is this call, retried after its reply
/// was lost: it reports success again.
const SAVE: &str = r"
local mine = redis.call('HMGET', KEYS[1], 'v', 'w', 'sv', 'f')
if mine[1] and mine[2] == ARGV[7] then return {1, mine[1]} end
if ARGV[5] ~= '' then
  if redis.call('TYPE', KEYS[3]).ok ~= 'hash' then return {2, ''} end
  local l = redis.call('HMGET', KEYS[3], 't', 'f')
  if l[1] ~= ARGV[5] or l[2] ~= ARGV[6] then return {2, ''} end
end
if mine[4] and (tonumber(mine[4]) or math.huge) > tonumber(ARGV[10]) then return {4, mine[4]} end
local cur = redis.call('HGET', KEYS[1], 'v')
if ARGV[1] == '' then
  if cur then return {0, cur} end
elseif cur ~= ARGV[1] then
  return {0, cur or ''}
end
if (tonumber(mine[3]) or 0) > tonumber(ARGV[9]) then return {3, mine[3]} end
local nv = (tonumber(cur) or 0) + 1
redis.call('HSET', KEYS[1], 'v', nv, 's', ARGV[2], 't', ARGV[3], 'w', ARGV[7], 'sv', ARGV[8],
  'f', ARGV[10])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return {1, tostring(nv)}
";

const DELETE: &str = r"
local n = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return n
";

/// The server's clock in ms, for lease expiry.
pub(crate) const NOW: &str = r"
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
";

/// KEYS: lease. ARGV: token, holder, ttl ms. Takes the lease if free, released or lapsed
/// (or already this token's: a retried call). Returns the record: {token, fence, holder}.
const ACQUIRE: &str = r"
if redis.call('TYPE', KEYS[1]).ok == 'string' then
  return {'', '0', ''} -- the lease of an older hame (SET PX): wait for its expiry
end
local cur = redis.call('HMGET', KEYS[1], 't', 'f', 'h', 'e')
local t = cur[1] or ''
if t == ARGV[1] or (t ~= '' and (tonumber(cur[4]) or 0) > now()) then
  return {t, cur[2] or '0', cur[3] or ''}
end
local f = (tonumber(cur[2]) or 0) + 1
redis.call('HSET', KEYS[1], 't', ARGV[1], 'f', f, 'h', ARGV[2], 'e', now() + tonumber(ARGV[3]))
return {ARGV[1], tostring(f), ARGV[2]}
";

/// KEYS: lease. ARGV: old token, old fence, token, holder, ttl ms. Returns 1 if taken over.
const TAKE_OVER: &str = r"
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
local cur = redis.call('HMGET', KEYS[1], 't', 'f')
if cur[1] == ARGV[3] then return 1 end
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 't', ARGV[3], 'f', tonumber(ARGV[2]) + 1, 'h', ARGV[4],
  'e', now() + tonumber(ARGV[5]))
return 1
";

/// KEYS: lease. ARGV: token, ttl ms. Returns 1 if renewed.
const RENEW: &str = r"
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
local cur = redis.call('HMGET', KEYS[1], 't', 'e')
if cur[1] ~= ARGV[1] or (tonumber(cur[2]) or 0) <= now() then return 0 end
redis.call('HSET', KEYS[1], 'e', now() + tonumber(ARGV[2]))
return 1
";

/// KEYS: lease. ARGV: token. Blanks the token (the fence stays).
const RELEASE: &str = r"
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 't', '', 'e', 0)
return 1
";

fn with_clock(script: &str) -> redis::Script {
    redis::Script::new(&format!("{NOW}{script}"))
}

static SAVE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SAVE));
static DELETE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(DELETE));
static ACQUIRE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| with_clock(ACQUIRE));
static TAKE_OVER_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| with_clock(TAKE_OVER));
static RENEW_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| with_clock(RENEW));
static RELEASE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RELEASE));

fn backend(e: redis::RedisError) -> Error {
    Error::backend("redis", e)
}

/// The store's connection: a [`ConnectionManager`] (which reconnects after a broken
/// connection) and the retry policy of its calls.
#[derive(Clone)]
pub(crate) struct Conn {
    manager: ConnectionManager,
    retry: hame_redis::RetryPolicy,
}

impl Conn {
    /// Checks `options`, connects to `url` once (so that a wrong URL, password or port
    /// fails at once instead of after the manager's reconnection backoff, about 6 s) and
    /// returns the client and a managed connection. A failure never names the password.
    pub(crate) async fn connect(
        url: &str,
        options: &RedisOptions,
    ) -> Result<(redis::Client, Self)> {
        if options.prefix.contains(['{', '}']) || options.prefix.is_empty() {
            return Err(Error::Config(
                "redis key prefix must be non-empty and contain no `{` or `}`".into(),
            ));
        }
        let fail = |e: redis::RedisError| Error::backend_at("redis", &e, url);
        let client = redis::Client::open(url).map_err(fail)?;
        let probe = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout));
        drop(
            client
                .get_multiplexed_async_connection_with_config(&probe)
                .await
                .map_err(fail)?,
        );
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout));
        let manager = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(fail)?;
        Ok((
            client,
            Self {
                manager,
                retry: hame_redis::RetryPolicy {
                    window: options.retry_window,
                    ..hame_redis::RetryPolicy::default()
                },
            },
        ))
    }

    pub(crate) async fn query<T: redis::FromRedisValue + Send>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T> {
        self.send("command", hame_redis::Call::Cmd(cmd)).await
    }

    pub(crate) async fn invoke<T: redis::FromRedisValue + Send>(
        &self,
        script: &redis::ScriptInvocation<'_>,
    ) -> Result<T> {
        self.send("script", hame_redis::Call::Script(script)).await
    }

    /// Sends an (idempotent) call, again after a broken connection within the retry
    /// window.
    async fn send<T: redis::FromRedisValue + Send>(
        &self,
        what: &str,
        call: hame_redis::Call<'_>,
    ) -> Result<T> {
        hame_redis::send(&self.manager, &self.retry, what, call)
            .await
            .map_err(backend)
    }
}

/// The error for a stored format `f` this build does not read: newer, or not a number.
fn format_error(key: &StateKey, f: &str) -> Error {
    match f.parse::<u64>() {
        Ok(n) => Error::newer_format(key, n),
        Err(_) => Error::Config(format!(
            "state of {key} is in an unknown format {f:?} (this build reads {})",
            crate::STATE_FORMAT
        )),
    }
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl RedisStore {
    /// Connects to `url` (`redis://`, `rediss://`, with optional credentials and db). A
    /// failure names the cause but never the URL's password.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self> {
        let (_, conn) = Conn::connect(url, &options).await?;
        Ok(Self {
            conn,
            prefix: options.prefix.into(),
            target: crate::redact_url(url).into(),
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

    /// The compare-and-set of `save`; with a lease, of `save_fenced`.
    async fn write(
        &self,
        key: &StateKey,
        (json, schema): (&[u8], u64),
        expected: Option<u64>,
        lease: Option<&Lease>,
    ) -> Result<u64> {
        let write_id = uuid::Uuid::new_v4().simple().to_string();
        self.write_as(&write_id, key, (json, schema), expected, lease)
            .await
    }

    /// [`write`](Self::write) with a given write id: a second call with the same id (a
    /// retry whose first reply was lost) reports the first call's version.
    async fn write_as(
        &self,
        write_id: &str,
        key: &StateKey,
        (json, schema): (&[u8], u64),
        expected: Option<u64>,
        lease: Option<&Lease>,
    ) -> Result<u64> {
        let now = Utc::now().timestamp_millis();
        let (token, fence) = lease.map_or(("", 0), |l| (l.token(), l.fence()));
        let mut call = SAVE_SCRIPT.prepare_invoke();
        call.key(self.doc_key(key))
            .key(self.idx_key(key.agent(), key.user()))
            .key(self.lease_key(key))
            .arg(expected.map(|v| v.to_string()).unwrap_or_default())
            .arg(json)
            .arg(now)
            .arg(key.session())
            .arg(token)
            .arg(fence)
            .arg(write_id)
            .arg(schema)
            .arg(MAX_SCHEMA)
            .arg(FORMAT_VERSION);
        let (status, v): (i64, String) = self.conn.invoke(&call).await?;
        match (status, lease) {
            (1, _) => v
                .parse()
                .map_err(|_| Error::backend("redis", format!("bad version {v:?} from script"))),
            (2, Some(lease)) => {
                lease.mark_lost();
                Err(Error::lease_lost(key))
            }
            (3, _) => Err(Error::too_new(key, v.parse().unwrap_or(u64::MAX))),
            (4, _) => Err(format_error(key, &v)),
            _ => Err(Error::Conflict {
                key: key.to_string(),
                expected,
                found: v.parse().ok(),
            }),
        }
    }

    /// The server's id of the current connection (`CLIENT ID`), for tests that drop it.
    #[cfg(test)]
    pub(crate) async fn client_id(&self) -> Result<i64> {
        self.conn.query(redis::cmd("CLIENT").arg("ID")).await
    }

    #[cfg(any(test, feature = "conformance"))]
    async fn put_raw_doc(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
        self.delete(key).await?;
        let schema = state
            .get("schema_version")
            .and_then(serde_json::Value::as_u64);
        let json = serde_json::to_vec(&state).map_err(Error::Serialize)?;
        self.write(key, (&json, schema.unwrap_or(0)), None, None)
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl StateStore for RedisStore {
    async fn load(&self, key: &StateKey) -> Result<Option<Stored>> {
        let (version, json, format): (Option<u64>, Option<Vec<u8>>, Option<String>) = self
            .conn
            .query(
                redis::cmd("HMGET")
                    .arg(self.doc_key(key))
                    .arg("v")
                    .arg("s")
                    .arg("f"),
            )
            .await?;
        // The format first: a newer one is refused before anything else is read.
        if let Some(f) = &format
            && !f.parse::<u64>().is_ok_and(|f| f <= FORMAT_VERSION)
        {
            return Err(format_error(key, f));
        }
        let (Some(version), Some(json)) = (version, json) else {
            return Ok(None);
        };
        let state = AgentState::from_slice(&json).map_err(|source| Error::Format {
            key: key.to_string(),
            source,
        })?;
        Ok(Some(Stored { state, version }))
    }

    async fn put(&self, key: &StateKey, save: Save<'_>) -> Result<u64> {
        let (json, schema) = Error::encode(key, save.state)?;
        self.write(key, (json.as_bytes(), schema), save.expected, save.lease)
            .await
    }

    async fn delete(&self, key: &StateKey) -> Result<bool> {
        let mut call = DELETE_SCRIPT.prepare_invoke();
        call.key(self.doc_key(key))
            .key(self.idx_key(key.agent(), key.user()))
            .arg(key.session());
        let n: i64 = self.conn.invoke(&call).await?;
        Ok(n > 0)
    }

    async fn list_sessions(&self, agent: &str, user: Option<&str>) -> Result<Vec<SessionSummary>> {
        crate::validate_scope(agent, user)?;
        let mut cmd = redis::cmd("ZREVRANGE");
        cmd.arg(self.idx_key(agent, user))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES");
        let entries: Vec<(String, f64)> = self.conn.query(&cmd).await?;
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
        let Some(grant) = shared_lease::try_take(self, key, ttl).await? else {
            return Ok(None);
        };
        let handle = RedisLease {
            conn: self.conn.clone(),
            lease_key: self.lease_key(key),
            token: grant.token.clone(),
            key: key.to_string(),
        };
        Ok(Some(Lease::new(key.clone(), grant, Arc::new(handle))))
    }

    fn is_shared(&self) -> bool {
        true
    }
}

#[async_trait]
impl LeaseTable for RedisStore {
    async fn take_free(&self, claim: &Claim<'_>) -> Result<Option<LeaseRecord>> {
        let Claim {
            key,
            token,
            holder,
            ttl,
        } = *claim;
        let mut call = ACQUIRE_SCRIPT.prepare_invoke();
        call.key(self.lease_key(key))
            .arg(token)
            .arg(holder)
            .arg(ttl_ms(ttl));
        let (token, fence, holder): (String, String, String) = self.conn.invoke(&call).await?;
        Ok(Some(LeaseRecord {
            token,
            fence: fence.parse().unwrap_or(0),
            holder,
        }))
    }

    async fn take_over(&self, claim: &Claim<'_>, old: &LeaseRecord) -> Result<bool> {
        let mut call = TAKE_OVER_SCRIPT.prepare_invoke();
        call.key(self.lease_key(claim.key))
            .arg(&old.token)
            .arg(old.fence)
            .arg(claim.token)
            .arg(claim.holder)
            .arg(ttl_ms(claim.ttl));
        let n: i64 = self.conn.invoke(&call).await?;
        Ok(n == 1)
    }
}

struct RedisLease {
    conn: Conn,
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
        let mut call = RENEW_SCRIPT.prepare_invoke();
        call.key(&self.lease_key).arg(&self.token).arg(ttl_ms(ttl));
        let n: i64 = self.conn.invoke(&call).await?;
        Error::lease_held(n == 1, &self.key)
    }

    async fn release(&self) -> Result<()> {
        let mut call = RELEASE_SCRIPT.prepare_invoke();
        call.key(&self.lease_key).arg(&self.token);
        let _: i64 = self.conn.invoke(&call).await?;
        Ok(())
    }
}

#[cfg(any(test, feature = "conformance"))]
#[async_trait]
impl crate::conformance::RawAccess for RedisStore {
    async fn put_raw(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
        self.put_raw_doc(key, state).await
    }

    async fn set_raw_format(&self, key: &StateKey, format: u64) -> Result<bool> {
        let _: i64 = self
            .conn
            .query(
                redis::cmd("HSET")
                    .arg(self.doc_key(key))
                    .arg("f")
                    .arg(format),
            )
            .await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::{service_url, unique_agent};

    /// A save retried after its reply was lost (same write id) is reported as done, once.
    #[tokio::test]
    async fn a_retried_save_is_not_applied_twice() -> Result<()> {
        let Some(url) = service_url("HAME_TEST_REDIS_URL")? else {
            return Ok(());
        };
        let prefix = format!("hame-test:{}", uuid::Uuid::new_v4().simple());
        let store = RedisStore::connect(&url, RedisOptions::with_prefix(prefix)).await?;
        let key = StateKey::new(unique_agent(), None::<String>, "s1")?;
        for expected in [None, Some(1)] {
            let id = uuid::Uuid::new_v4().simple().to_string();
            let first = store
                .write_as(&id, &key, (b"{}", 1), expected, None)
                .await?;
            let again = store
                .write_as(&id, &key, (b"{}", 1), expected, None)
                .await?;
            assert_eq!((first, again), (expected.map_or(1, |v| v + 1), first));
        }
        assert_eq!(store.load(&key).await?.map(|s| s.version), Some(2));
        // Another write with the stale version still conflicts.
        let other = store.write(&key, (b"{}", 1), Some(1), None).await;
        assert!(other.is_err_and(|e| e.is_conflict()));
        Ok(())
    }
}
