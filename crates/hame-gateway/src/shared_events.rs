//! Session events in Redis, for replicas behind one load balancer (feature `redis`): each
//! event gets its id from a per-session counter in Redis and is kept in a bounded list
//! there, so `GET …/events?after=ID` on any replica replays what a turn on another replica
//! published, with the same ids.
//!
//! Keys (per session; `<prefix>` default `hame:events`): `<prefix>:<agent>/<user>/<session>:seq`
//! (the last id) and `…:ring` (the last [`GatewayOptions::ring_size`](crate::GatewayOptions)
//! events as `<id> <name> <0|1 terminal> <json>`); both expire after
//! [`SharedEvents::IDLE_TTL`] without a new event. One event is one round trip (a Lua
//! script: increment, push, trim, expire).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::events::Event;

const PUBLISH: &str = r"
local id = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], id .. ' ' .. ARGV[1])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[2]), -1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return id
";

/// A connection to the Redis that holds the sessions' events.
#[derive(Clone)]
pub struct SharedEvents {
    conn: ConnectionManager,
    prefix: Arc<str>,
    target: Arc<str>,
    script: Arc<redis::Script>,
}

impl std::fmt::Debug for SharedEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedEvents")
            .field("target", &self.target)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl SharedEvents {
    /// How long a session's events stay without a new one.
    pub const IDLE_TTL: Duration = Duration::from_secs(24 * 3600);

    /// Connects to `url` (`redis://`, `rediss://`; the password is never printed). Keys
    /// start with `prefix` (`hame:events` when empty).
    pub async fn connect(url: &str, prefix: &str) -> crate::Result<Self> {
        let target = hame::state::redact_url(url);
        let fail =
            |e: redis::RedisError| crate::Error::Config(format!("shared events at {target}: {e}"));
        let client = redis::Client::open(url).map_err(fail)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(5)));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(fail)?;
        let prefix = if prefix.is_empty() {
            "hame:events"
        } else {
            prefix
        };
        Ok(Self {
            conn,
            prefix: prefix.into(),
            target: target.into(),
            script: Arc::new(redis::Script::new(PUBLISH)),
        })
    }

    fn keys(&self, key: &str) -> (String, String) {
        let base = format!("{}:{}", self.prefix, key.replace('\u{0}', "/"));
        (format!("{base}:seq"), format!("{base}:ring"))
    }

    /// Stores an event; its id.
    pub(crate) async fn publish(
        &self,
        key: &str,
        name: &str,
        data: &str,
        terminal: bool,
        ring: usize,
    ) -> Result<u64, redis::RedisError> {
        let (seq, list) = self.keys(key);
        let mut conn = self.conn.clone();
        self.script
            .key(seq)
            .key(list)
            .arg(format!("{name} {} {data}", u8::from(terminal)))
            .arg(ring.max(1))
            .arg(Self::IDLE_TTL.as_secs())
            .invoke_async(&mut conn)
            .await
    }

    /// The stored events after `after`, oldest first.
    pub(crate) async fn replay(
        &self,
        key: &str,
        after: u64,
    ) -> Result<Vec<Arc<Event>>, redis::RedisError> {
        let (_, list) = self.keys(key);
        let mut conn = self.conn.clone();
        let items: Vec<String> = redis::cmd("LRANGE")
            .arg(list)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await?;
        Ok(items
            .iter()
            .filter_map(|s| parse(s))
            .filter(|e| e.id > after)
            .map(Arc::new)
            .collect())
    }
}

/// `<id> <name> <terminal> <json>` back to an event (names are the gateway's own).
fn parse(s: &str) -> Option<Event> {
    let mut parts = s.splitn(4, ' ');
    let id = parts.next()?.parse().ok()?;
    let name = crate::events::known_name(parts.next()?)?;
    let terminal = parts.next()? == "1";
    let data = parts.next().unwrap_or("{}").to_owned();
    Some(Event {
        id,
        name,
        data,
        terminal,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn stored_lines_parse_back() {
        let ev = super::parse(r#"7 finished 1 {"reply":"a b"}"#);
        assert!(
            ev.as_ref().is_some_and(|e| e.id == 7
                && e.name == "finished"
                && e.terminal
                && e.data == r#"{"reply":"a b"}"#),
            "{ev:?}"
        );
        assert!(super::parse("x finished 1 {}").is_none());
        assert!(super::parse("3 not_an_event 0 {}").is_none());
    }
}
