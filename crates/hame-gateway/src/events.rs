//! The events of each session: a bounded ring with ids that only grow, for `after=ID`
//! replay, and a broadcast for followers (created only while someone follows).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

/// Past this many sessions, the hub forgets the rings of idle sessions, oldest first.
const MAX_SESSIONS: usize = 100_000;
/// Capacity of a follower broadcast; a follower that lags re-reads the ring.
const FOLLOW_CAPACITY: usize = 256;

/// The event names the gateway sends (and reads back from a shared store).
const NAMES: [&str; 7] = [
    "text_delta",
    "tool_started",
    "tool_finished",
    "approval_needed",
    "finished",
    "failed",
    "subagent",
];

/// The static name of a known event name.
pub(crate) fn known_name(name: &str) -> Option<&'static str> {
    NAMES.iter().copied().find(|n| *n == name)
}

/// One event of a session's stream.
#[derive(Debug)]
pub(crate) struct Event {
    /// Per session, starting at 1, never reused while the process lives.
    pub(crate) id: u64,
    /// `text_delta`, `tool_started`, `tool_finished`, `approval_needed`, `finished`,
    /// `failed` (and `subagent` for background work after a turn).
    pub(crate) name: &'static str,
    /// The JSON data.
    pub(crate) data: String,
    /// Whether it ends a turn.
    pub(crate) terminal: bool,
}

#[derive(Debug, Default)]
struct Session {
    next: u64,
    ring: VecDeque<Arc<Event>>,
    follow: Option<broadcast::Sender<Arc<Event>>>,
    /// Turns running or waiting.
    active: usize,
    /// When the session was last touched (an ordinal, for forgetting the oldest).
    touched: u64,
}

/// What [`Hub::replay`] gives: the events still in the ring after the id, whether a turn is
/// active, and a receiver of later events when asked.
pub(crate) type Replay = (
    Vec<Arc<Event>>,
    bool,
    Option<broadcast::Receiver<Arc<Event>>>,
);

/// The rings of all sessions.
#[derive(Debug)]
pub(crate) struct Hub {
    sessions: Mutex<(u64, HashMap<String, Session>)>,
    ring: usize,
}

impl Hub {
    pub(crate) fn new(ring: usize) -> Self {
        Self {
            sessions: Mutex::new((0, HashMap::new())),
            ring: ring.max(1),
        }
    }

    fn with<R>(&self, key: &str, f: impl FnOnce(&mut Session) -> R) -> R {
        let mut guard = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let (clock, map) = &mut *guard;
        *clock += 1;
        let now = *clock;
        if map.len() >= MAX_SESSIONS && !map.contains_key(key) {
            forget_oldest(map);
        }
        let s = map.entry(key.to_owned()).or_default();
        s.touched = now;
        f(s)
    }

    /// Appends an event, giving it the session's next id.
    pub(crate) fn publish(
        &self,
        key: &str,
        name: &'static str,
        data: String,
        terminal: bool,
    ) -> Arc<Event> {
        self.publish_as(key, None, name, data, terminal)
    }

    /// Appends an event with the id a shared store gave it (`None`: the session's next id
    /// here). Ids only grow: a given id at or below the last one is replaced by the next.
    pub(crate) fn publish_as(
        &self,
        key: &str,
        id: Option<u64>,
        name: &'static str,
        data: String,
        terminal: bool,
    ) -> Arc<Event> {
        let ring = self.ring;
        self.with(key, |s| {
            s.next = match id {
                Some(id) if id > s.next => id,
                _ => s.next + 1,
            };
            let ev = Arc::new(Event {
                id: s.next,
                name,
                data,
                terminal,
            });
            if s.ring.len() >= ring {
                s.ring.pop_front();
            }
            s.ring.push_back(ev.clone());
            if let Some(tx) = &s.follow {
                if tx.receiver_count() == 0 {
                    s.follow = None;
                } else {
                    let _ = tx.send(ev.clone());
                }
            }
            ev
        })
    }

    /// A turn of the session starts (`+1`) or ends (`-1`).
    pub(crate) fn active(&self, key: &str, delta: isize) {
        self.with(key, |s| {
            s.active = s.active.saturating_add_signed(delta);
        });
    }

    /// The events after `after` still in the ring, whether a turn is active, and (when
    /// `follow`) a receiver of later events.
    pub(crate) fn replay(&self, key: &str, after: u64, follow: bool) -> Replay {
        self.with(key, |s| {
            let past: Vec<Arc<Event>> = s.ring.iter().filter(|e| e.id > after).cloned().collect();
            let rx = follow.then(|| {
                s.follow
                    .get_or_insert_with(|| broadcast::channel(FOLLOW_CAPACITY).0)
                    .subscribe()
            });
            (past, s.active > 0, rx)
        })
    }

    /// The ring size (events kept per session).
    pub(crate) fn ring_size(&self) -> usize {
        self.ring
    }

    /// Sessions with a ring.
    pub(crate) fn len(&self) -> usize {
        self.sessions.lock().map(|s| s.1.len()).unwrap_or(0)
    }
}

fn forget_oldest(map: &mut HashMap<String, Session>) {
    // Drop the older half of the idle sessions at once, so this runs rarely.
    let mut idle: Vec<(u64, String)> = map
        .iter()
        .filter(|(_, s)| s.active == 0 && s.follow.is_none())
        .map(|(k, s)| (s.touched, k.clone()))
        .collect();
    idle.sort_unstable();
    let n = idle.len().div_ceil(2);
    for (_, k) in idle.into_iter().take(n) {
        map.remove(&k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_grow_and_the_ring_is_bounded() {
        let hub = Hub::new(3);
        for i in 0..5 {
            let ev = hub.publish("s", "text_delta", format!("{i}"), false);
            assert_eq!(ev.id, i + 1);
        }
        let (past, active, rx) = hub.replay("s", 0, false);
        assert_eq!(past.iter().map(|e| e.id).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert!(!active && rx.is_none());
        let (past, _, _) = hub.replay("s", 4, false);
        assert_eq!(past.iter().map(|e| e.id).collect::<Vec<_>>(), vec![5]);
        // Another session has its own ids.
        assert_eq!(hub.publish("t", "finished", "{}".into(), true).id, 1);
    }
}
