//! Retries of a request get the first attempt's answer instead of running a second turn.
//!
//! A request is known across its retries by:
//!
//! - its `Idempotency-Key` header (any client): the key, the caller and the route; the same
//!   key with another body (or `X-Hame-Session`) is refused (409 `idempotency_key_reused`);
//! - else the OpenAI SDKs' `x-stainless-retry-count` header: the caller, the route, the
//!   `X-Hame-Session` header and the body. A first attempt (`0`) always starts a turn (the
//!   same message sent twice on purpose is two turns); a retry (`1`, `2`, …) gets the answer
//!   of the last first attempt with the same body, waiting for it while it runs.
//!
//! `X-Request-Id` is not used: proxies set and forward it for tracing, and two different
//! requests carrying the same one must not share an answer.
//!
//! An entry is kept while its turn runs and for [`GatewayOptions::replay_window`] after it
//! ended; the table holds at most [`GatewayOptions::replay_entries`], the oldest dropped
//! first. A request refused before its turn started (429, 503) leaves nothing behind, so
//! its retry starts the turn.
//!
//! [`GatewayOptions::replay_window`]: crate::GatewayOptions::replay_window
//! [`GatewayOptions::replay_entries`]: crate::GatewayOptions::replay_entries

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::events::Event;
use crate::turn::Outcome;

/// How a turn ended, as its retries replay it: the outcome and the events that ended it
/// (`finished`, `failed`, the `approval_needed`s), with their ids.
#[derive(Debug, Clone)]
pub(crate) struct Done {
    pub(crate) outcome: Outcome,
    pub(crate) events: Vec<Arc<Event>>,
    at: Instant,
}

impl Done {
    pub(crate) fn new(outcome: Outcome, events: Vec<Arc<Event>>) -> Self {
        Self {
            outcome,
            events,
            at: Instant::now(),
        }
    }
}

/// A request as its retries are known ([`RequestKey::of`]).
#[derive(Debug, Clone)]
pub(crate) struct RequestKey {
    key: String,
    body: u64,
    /// A first attempt: it starts a turn even when an entry exists.
    fresh: bool,
}

/// What [`Replays::claim`] decided.
#[derive(Debug)]
pub(crate) enum Claim {
    /// A retry: the first attempt's end (when it comes) and its session.
    Replay(watch::Receiver<Option<Done>>, String),
    /// A new turn: record its end with the [`Recorder`].
    New(Recorder),
}

#[derive(Debug)]
struct Entry {
    body: u64,
    generation: u64,
    session: String,
    done: watch::Receiver<Option<Done>>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Keys in the order they were claimed, with the generation that claimed them.
    order: VecDeque<(String, u64)>,
    next: u64,
}

impl Inner {
    fn remove_if(&mut self, key: &str, generation: u64) {
        if self
            .entries
            .get(key)
            .is_some_and(|e| e.generation == generation)
        {
            self.entries.remove(key);
        }
    }
}

/// The table of requests whose retries are answered from their first attempt.
#[derive(Debug)]
pub(crate) struct Replays {
    inner: Arc<Mutex<Inner>>,
    window: Duration,
    capacity: usize,
    hasher: std::hash::RandomState,
}

/// Records the end of a claimed turn; dropped without [`Recorder::finish`] (the turn never
/// started), it removes the claim so that a retry starts the turn.
#[derive(Debug)]
pub(crate) struct Recorder {
    inner: Arc<Mutex<Inner>>,
    key: String,
    generation: u64,
    tx: Option<watch::Sender<Option<Done>>>,
}

impl Recorder {
    /// The turn ended: its retries get `done`.
    pub(crate) fn finish(mut self, done: Done) {
        if let Some(tx) = self.tx.take() {
            tx.send_replace(Some(done));
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if self.tx.is_some() {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.remove_if(&self.key, self.generation);
        }
    }
}

/// A header's value as text, trimmed; `None` when absent or empty.
fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// Longest `Idempotency-Key` accepted.
const MAX_KEY_LEN: usize = 255;

impl Replays {
    pub(crate) fn new(window: Duration, capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner::default())),
            window,
            capacity: capacity.max(1),
            hasher: std::hash::RandomState::new(),
        }
    }

    /// Who the request is across its retries, if it says (see the module docs): `route`
    /// names the route and its path parameters; the body and the `X-Hame-Session` header
    /// are what must be the same.
    pub(crate) fn key_of(
        &self,
        headers: &HeaderMap,
        user: Option<&str>,
        route: &str,
        body: &[u8],
    ) -> Result<Option<RequestKey>, ApiError> {
        let session = header(headers, "x-hame-session").unwrap_or_default();
        let fingerprint = self.hasher.hash_one((session, body));
        let who = user.unwrap_or_default();
        if let Some(key) = header(headers, "idempotency-key") {
            if key.len() > MAX_KEY_LEN {
                return Err(ApiError::bad_request(format!(
                    "Idempotency-Key is longer than {MAX_KEY_LEN} characters"
                )));
            }
            return Ok(Some(RequestKey {
                key: format!("{who}\0{route}\0key\0{key}"),
                body: fingerprint,
                fresh: false,
            }));
        }
        let Some(count) = header(headers, "x-stainless-retry-count") else {
            return Ok(None);
        };
        Ok(Some(RequestKey {
            key: format!("{who}\0{route}\0sdk\0{fingerprint:x}"),
            body: fingerprint,
            fresh: count == "0",
        }))
    }

    /// Replays the first attempt of `key`, or claims a new turn on `session` for it.
    ///
    /// # Errors
    /// 409 `idempotency_key_reused` when the key was used for another request.
    pub(crate) fn claim(&self, key: &RequestKey, session: &str) -> Result<Claim, ApiError> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        self.prune(&mut inner);
        if !key.fresh
            && let Some(e) = inner.entries.get(&key.key)
        {
            if e.body != key.body {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "idempotency_key_reused",
                    "this Idempotency-Key was used for another request; use a new key for a new request",
                ));
            }
            return Ok(Claim::Replay(e.done.clone(), e.session.clone()));
        }
        let (tx, rx) = watch::channel(None);
        inner.next += 1;
        let generation = inner.next;
        inner.entries.insert(
            key.key.clone(),
            Entry {
                body: key.body,
                generation,
                session: session.to_owned(),
                done: rx,
            },
        );
        inner.order.push_back((key.key.clone(), generation));
        Ok(Claim::New(Recorder {
            inner: self.inner.clone(),
            key: key.key.clone(),
            generation,
            tx: Some(tx),
        }))
    }

    /// Drops, oldest first, what ended more than the window ago, and what is past the
    /// capacity.
    fn prune(&self, inner: &mut Inner) {
        let now = Instant::now();
        while let Some((key, generation)) = inner.order.front().cloned() {
            let live = inner
                .entries
                .get(&key)
                .filter(|e| e.generation == generation);
            let expired = match live {
                None => true,
                Some(e) => e
                    .done
                    .borrow()
                    .as_ref()
                    .is_some_and(|d| now.duration_since(d.at) > self.window),
            };
            if !expired && inner.entries.len() < self.capacity {
                break;
            }
            inner.remove_if(&key, generation);
            inner.order.pop_front();
        }
    }

    /// Entries held (for tests and the docs' figures).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().map(|i| i.entries.len()).unwrap_or(0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, axum::http::HeaderValue::from_static(v));
        }
        h
    }

    fn done(text: &str) -> Done {
        Done::new(Outcome::Finished(json!({ "reply": text })), Vec::new())
    }

    #[test]
    fn keys_come_from_idempotency_key_or_the_sdk_retry_count() {
        let r = Replays::new(Duration::from_secs(60), 10);
        assert!(
            r.key_of(&headers(&[]), None, "chat", b"x")
                .unwrap()
                .is_none()
        );
        let a = r
            .key_of(
                &headers(&[("idempotency-key", "k")]),
                Some("u"),
                "chat",
                b"x",
            )
            .unwrap()
            .unwrap();
        let b = r
            .key_of(
                &headers(&[("idempotency-key", "k")]),
                Some("v"),
                "chat",
                b"x",
            )
            .unwrap()
            .unwrap();
        assert_ne!(a.key, b.key, "users never share a key");
        let first = r
            .key_of(
                &headers(&[("x-stainless-retry-count", "0")]),
                None,
                "chat",
                b"x",
            )
            .unwrap()
            .unwrap();
        let retry = r
            .key_of(
                &headers(&[("x-stainless-retry-count", "2")]),
                None,
                "chat",
                b"x",
            )
            .unwrap()
            .unwrap();
        assert!(first.fresh && !retry.fresh);
        assert_eq!(first.key, retry.key);
        let other = r
            .key_of(
                &headers(&[("x-stainless-retry-count", "1")]),
                None,
                "chat",
                b"y",
            )
            .unwrap()
            .unwrap();
        assert_ne!(other.key, retry.key);
    }

    #[test]
    fn a_retry_replays_and_a_first_attempt_starts_anew() {
        let r = Replays::new(Duration::from_secs(60), 10);
        let h = |n: &'static str| headers(&[("x-stainless-retry-count", n)]);
        let first = r.key_of(&h("0"), None, "chat", b"x").unwrap().unwrap();
        let Ok(Claim::New(rec)) = r.claim(&first, "s") else {
            panic!("not new")
        };
        let retry = r.key_of(&h("1"), None, "chat", b"x").unwrap().unwrap();
        let Ok(Claim::Replay(rx, session)) = r.claim(&retry, "other") else {
            panic!("not a replay")
        };
        assert_eq!(session, "s");
        assert!(rx.borrow().is_none(), "still running");
        rec.finish(done("a"));
        assert!(rx.borrow().is_some());
        // The same message sent again on purpose is a new turn.
        assert!(matches!(r.claim(&first, "s"), Ok(Claim::New(_))));
    }

    #[test]
    fn a_turn_that_never_started_leaves_nothing() {
        let r = Replays::new(Duration::from_secs(60), 10);
        let k = r
            .key_of(&headers(&[("idempotency-key", "k")]), None, "m", b"x")
            .unwrap()
            .unwrap();
        let Ok(Claim::New(rec)) = r.claim(&k, "s") else {
            panic!("not new")
        };
        drop(rec);
        assert_eq!(r.len(), 0);
        assert!(matches!(r.claim(&k, "s"), Ok(Claim::New(_))));
    }

    #[test]
    fn a_reused_key_with_another_body_is_refused() {
        let r = Replays::new(Duration::from_secs(60), 10);
        let k = |body: &[u8]| {
            r.key_of(&headers(&[("idempotency-key", "k")]), None, "m", body)
                .unwrap()
                .unwrap()
        };
        let Ok(Claim::New(rec)) = r.claim(&k(b"x"), "s") else {
            panic!("not new")
        };
        rec.finish(done("a"));
        let e = r.claim(&k(b"y"), "s").err().map(|e| e.code);
        assert_eq!(e, Some("idempotency_key_reused"));
    }

    #[test]
    fn entries_expire_after_the_window_and_past_the_capacity() {
        let r = Replays::new(Duration::ZERO, 3);
        let key = |n: &str| RequestKey {
            key: n.to_owned(),
            body: 0,
            fresh: false,
        };
        let mut running = Vec::new();
        for n in ["a", "b", "c", "d", "e"] {
            if let Ok(Claim::New(rec)) = r.claim(&key(n), "s") {
                running.push(rec);
            }
        }
        assert_eq!(r.len(), 3, "bounded");
        for rec in running {
            rec.finish(done("x"));
        }
        std::thread::sleep(Duration::from_millis(2));
        let _new = r.claim(&key("f"), "s");
        assert_eq!(r.len(), 1, "ended entries past the window are gone");
    }
}
