//! Session events in a store shared by replicas behind one load balancer: each event gets
//! its id from the session's counter there and is kept among the session's last
//! [`GatewayOptions::ring_size`](crate::GatewayOptions) events, so `GET …/events?after=ID` on
//! any replica replays what a turn on another replica published, with the same ids.
//!
//! The store is a [`hame::state::events::EventLog`]: Redis, PostgreSQL or MySQL / MariaDB
//! (docs/replicas.md). An event is stored as `<name> <0|1 terminal> <json>`, under the key
//! `<agent>/<user>/<session>`; a session's events are forgotten after
//! [`SharedEvents::IDLE_TTL`] without a new one.

use std::sync::Arc;
use std::time::Duration;

use hame::state::events::{EventLog, EventOptions, StoredEvent};

use crate::events::Event;

/// The store that holds the sessions' events.
#[derive(Clone, Debug)]
pub struct SharedEvents {
    log: Arc<dyn EventLog>,
}

impl SharedEvents {
    /// How long a session's events stay without a new one.
    pub const IDLE_TTL: Duration = Duration::from_secs(24 * 3600);

    /// Connects to `url`: `redis://` / `rediss://`, `postgres://` / `postgresql://` or
    /// `mysql://` / `mariadb://` (the SQL ones apply hame-state's migrations); the password
    /// is never printed. Redis keys start with `prefix` (`hame:events` when empty).
    pub async fn connect(url: &str, prefix: &str) -> crate::Result<Self> {
        let mut options = EventOptions {
            idle_ttl: Self::IDLE_TTL,
            ..EventOptions::default()
        };
        if !prefix.is_empty() {
            prefix.clone_into(&mut options.prefix);
        }
        let log = hame::state::events::connect_event_log(url, options)
            .await
            .map_err(|e| {
                crate::Error::Config(format!(
                    "shared events at {}: {e}",
                    hame::state::redact_url(url)
                ))
            })?;
        Ok(Self { log })
    }

    /// Events in `log` (an application's own backend).
    pub fn new(log: Arc<dyn EventLog>) -> Self {
        Self { log }
    }

    /// Stores an event; its id.
    pub(crate) async fn publish(
        &self,
        key: &str,
        name: &str,
        data: &str,
        terminal: bool,
        ring: usize,
    ) -> hame::state::Result<u64> {
        let body = format!("{name} {} {data}", u8::from(terminal));
        self.log.publish(&store_key(key), &body, ring).await
    }

    /// The stored events after `after`, oldest first.
    pub(crate) async fn replay(
        &self,
        key: &str,
        after: u64,
    ) -> hame::state::Result<Vec<Arc<Event>>> {
        let events = self.log.replay(&store_key(key), after).await?;
        Ok(events.iter().filter_map(parse).map(Arc::new).collect())
    }
}

/// The gateway's session key (`agent\0user\0session`) as the store's.
fn store_key(key: &str) -> String {
    key.replace('\u{0}', "/")
}

/// `<name> <terminal> <json>` back to an event (names are the gateway's own).
fn parse(e: &StoredEvent) -> Option<Event> {
    let mut parts = e.body.splitn(3, ' ');
    let name = crate::events::known_name(parts.next()?)?;
    let terminal = parts.next()? == "1";
    let data = parts.next().unwrap_or("{}").to_owned();
    Some(Event {
        id: e.id,
        name,
        data,
        terminal,
    })
}

#[cfg(test)]
mod tests {
    use hame::state::events::StoredEvent;

    fn stored(id: u64, body: &str) -> StoredEvent {
        StoredEvent {
            id,
            body: body.to_owned(),
        }
    }

    #[test]
    fn stored_lines_parse_back() {
        let ev = super::parse(&stored(7, r#"finished 1 {"reply":"a b"}"#));
        assert!(
            ev.as_ref().is_some_and(|e| e.id == 7
                && e.name == "finished"
                && e.terminal
                && e.data == r#"{"reply":"a b"}"#),
            "{ev:?}"
        );
        assert!(super::parse(&stored(3, "not_an_event 0 {}")).is_none());
        assert_eq!(super::store_key("a\u{0}u\u{0}s"), "a/u/s");
    }
}
