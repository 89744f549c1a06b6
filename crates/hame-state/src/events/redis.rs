//! [`RedisEventLog`]: per session a counter (`<prefix>:<key>:seq`) and a list of its last
//! events (`…:ring`, `<id> <body>`), both expiring after the idle time to live; one event is
//! one round trip (a Lua script: increment, push, trim, expire), and so is a replay (the
//! ring's tail after the id).

use async_trait::async_trait;

use super::{EventLog, EventOptions, StoredEvent, check_key, keep_of};
use crate::error::{Error, Result};
use crate::redis_store::Conn;
use crate::{RedisOptions, redact_url};

const PUBLISH: &str = r"
local id = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], id .. ' ' .. ARGV[1])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[2]), -1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return id
";

/// The ring's events after `ARGV[1]`: ids in the ring are consecutive and end at the
/// counter, so they are its last `counter - after` entries (a follower polling a long ring
/// reads only what is new).
const REPLAY: &str = r"
local want = tonumber(redis.call('GET', KEYS[1]) or '0') - tonumber(ARGV[1])
if want <= 0 then return {} end
return redis.call('LRANGE', KEYS[2], -want, -1)
";

/// The sessions' events in Redis.
pub struct RedisEventLog {
    conn: Conn,
    prefix: String,
    ttl_ms: u64,
    target: String,
    publish: redis::Script,
    replay: redis::Script,
}

impl std::fmt::Debug for RedisEventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisEventLog")
            .field("target", &self.target)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisEventLog {
    /// Connects to `url` (`redis://`, `rediss://`; a failure never names the password). An
    /// event is sent once: a call cut by a broken connection is an error, not sent again (a
    /// second `INCR` would give one event two ids).
    pub async fn connect(url: &str, options: EventOptions) -> Result<Self> {
        let redis = RedisOptions {
            prefix: options.prefix.clone(),
            retry_window: std::time::Duration::ZERO,
            ..RedisOptions::default()
        };
        let (_, conn) = Conn::connect(url, &redis).await?;
        Ok(Self {
            conn,
            prefix: options.prefix,
            ttl_ms: u64::try_from(options.idle_ttl.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            target: redact_url(url),
            publish: redis::Script::new(PUBLISH),
            replay: redis::Script::new(REPLAY),
        })
    }

    fn keys(&self, key: &str) -> (String, String) {
        // The keys of hame 0.1's gateway, so replicas of both versions share a session's
        // ids during a rolling upgrade (no hash tag: hame's Redis connections are not
        // Cluster clients).
        let base = format!("{}:{key}", self.prefix);
        (format!("{base}:seq"), format!("{base}:ring"))
    }
}

#[async_trait]
impl EventLog for RedisEventLog {
    async fn publish(&self, key: &str, body: &str, keep: usize) -> Result<u64> {
        check_key(key)?;
        let (seq, ring) = self.keys(key);
        let mut call = self.publish.key(seq);
        call.key(ring).arg(body).arg(keep_of(keep)).arg(self.ttl_ms);
        self.conn.invoke(&call).await
    }

    async fn replay(&self, key: &str, after: u64) -> Result<Vec<StoredEvent>> {
        check_key(key)?;
        let (seq, ring) = self.keys(key);
        let mut call = self.replay.key(seq);
        call.key(ring).arg(after);
        let items: Vec<String> = self.conn.invoke(&call).await?;
        items
            .into_iter()
            .filter_map(|s| {
                let (id, body) = s.split_once(' ')?;
                Some(id.parse().map(|id| StoredEvent {
                    id,
                    body: body.to_owned(),
                }))
            })
            .filter(|e| e.as_ref().map_or(true, |e| e.id > after))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::backend("redis", e))
    }
}
