//! The conformance suite every [`StateStore`] backend runs.
//!
//! Each function checks one part of the trait contract against a live store and uses fresh,
//! random agent ids, so runs against a shared server never collide. Backends implement
//! [`RawAccess`] to plant documents of old schema versions, then call
//! [`conformance_tests!`](crate::conformance_tests) to get one `#[tokio::test]` per check.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hame_core::{AgentState, ContentBlock, Message, Role, ToolCall, ToolResult};

use crate::error::{Error, Result};
use crate::key::StateKey;
use crate::store::{Lease, LeaseGrant, LeaseHandle, LeaseOptions, StateStore};

/// Backend access the suite needs beyond the trait.
#[async_trait]
pub trait RawAccess: Send + Sync + Debug {
    /// Stores `state` verbatim (any schema version, no migration) as version 1 of `key`,
    /// replacing whatever is there.
    async fn put_raw(&self, key: &StateKey, state: serde_json::Value) -> Result<()>;

    /// Marks the document [`put_raw`](Self::put_raw) stored at `key` as written in storage
    /// format `format` (the `N` of `hame-state/N`) and returns true; false (changing
    /// nothing) for a backend whose documents carry no storage format apart from the
    /// state's schema version.
    async fn set_raw_format(&self, key: &StateKey, format: u64) -> Result<bool> {
        let _ = (key, format);
        Ok(false)
    }

    /// Whether a lease whose holder is alive but stopped renewing expires after its TTL
    /// (true for Redis/SQL/memory; false for OS file locks).
    fn ttl_expires_live_holders(&self) -> bool {
        true
    }
}

fn fail(msg: impl Into<String>) -> Error {
    Error::Config(format!("conformance: {}", msg.into()))
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(fail(format!($($msg)+)));
        }
    };
}

macro_rules! ensure_eq {
    ($left:expr, $right:expr) => {{
        let (l, r) = (&$left, &$right);
        if l != r {
            return Err(fail(format!(
                "{} != {}\n left: {:?}\nright: {:?}",
                stringify!($left),
                stringify!($right),
                l,
                r
            )));
        }
    }};
}

/// A fresh agent id, unique per call.
pub fn unique_agent() -> String {
    format!("conf-{}", uuid::Uuid::new_v4().simple())
}

fn key(agent: &str, user: Option<&str>, session: &str) -> Result<StateKey> {
    StateKey::new(agent, user, session)
}

fn sample(text: &str) -> AgentState {
    let mut s = AgentState::default();
    s.messages.push(Message::user(text));
    s.messages.push(Message::assistant(format!("re: {text}")));
    s
}

/// A state of `n` messages: user turns, tool calls and tool results of `result_bytes` bytes.
pub fn large_state(n: usize, result_bytes: usize) -> AgentState {
    let mut s = AgentState::default();
    let filler: String = "lorem ipsum dolor sit amet, \"quoted\" \\ ünïcode ✓\n"
        .chars()
        .cycle()
        .take(result_bytes)
        .collect();
    for i in 0..n {
        let m = match i % 3 {
            0 => Message::user(format!("question {i}")),
            1 => Message {
                role: Role::Assistant,
                content: vec![ContentBlock::ToolCall(ToolCall {
                    id: format!("call-{i}"),
                    name: "read_file".into(),
                    arguments: format!("{{\"path\":\"/src/file{i}.rs\"}}"),
                })]
                .into(),
                usage: None,
            },
            _ => Message::tool_results(vec![ToolResult {
                id: format!("call-{}", i - 1),
                content: filler.clone(),
                is_error: false,
                code: None,
            }]),
        };
        s.messages.push(m);
    }
    s.usage.input_tokens = 123_456;
    s.extensions
        .insert("memory".into(), serde_json::json!({"watermark": n}));
    s
}

/// Save then load returns the same state; versions count up from 1.
pub async fn round_trip<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let k = key(&unique_agent(), Some("alice"), "s1")?;
    ensure!(store.load(&k).await?.is_none(), "fresh key has a document");
    let a = sample("first");
    ensure_eq!(store.save(&k, &a, None).await?, 1);
    let got = store
        .load(&k)
        .await?
        .ok_or_else(|| fail("missing after save"))?;
    ensure_eq!(got.version, 1);
    ensure_eq!(got.state, a);
    let mut b = got.state;
    b.messages.push(Message::user("second"));
    b.set_extension("todo", &serde_json::json!(["x"]))
        .map_err(Error::Serialize)?;
    ensure_eq!(store.save(&k, &b, Some(1)).await?, 2);
    let got = store.load(&k).await?.ok_or_else(|| fail("missing"))?;
    ensure_eq!(got.version, 2);
    ensure_eq!(got.state, b);
    Ok(())
}

/// A save based on a stale version fails with `Conflict` and changes nothing.
pub async fn stale_save_conflicts<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let k = key(&unique_agent(), None, "s1")?;
    store.save(&k, &sample("v1"), None).await?;
    store.save(&k, &sample("v2"), Some(1)).await?;
    match store.save(&k, &sample("stale"), Some(1)).await {
        Err(Error::Conflict {
            expected, found, ..
        }) => {
            ensure_eq!(expected, Some(1));
            ensure!(
                found.is_none() || found == Some(2),
                "found should be 2, was {found:?}"
            );
        }
        other => return Err(fail(format!("stale save gave {other:?}"))),
    }
    ensure!(
        store
            .save(&k, &sample("future"), Some(7))
            .await
            .is_err_and(|e| e.is_conflict()),
        "save with a future version must conflict"
    );
    let got = store.load(&k).await?.ok_or_else(|| fail("missing"))?;
    ensure_eq!(got.version, 2);
    ensure_eq!(got.state, sample("v2"));
    let other = key(&unique_agent(), None, "absent")?;
    ensure!(
        store
            .save(&other, &sample("x"), Some(1))
            .await
            .is_err_and(|e| e.is_conflict()),
        "update of an absent document must conflict"
    );
    ensure!(
        store.load(&other).await?.is_none(),
        "conflicting save created a document"
    );
    Ok(())
}

/// `expected: None` only creates.
pub async fn create_only_conflicts<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let k = key(&unique_agent(), Some("u1"), "s1")?;
    store.save(&k, &sample("one"), None).await?;
    match store.save(&k, &sample("two"), None).await {
        Err(Error::Conflict { expected: None, .. }) => {}
        other => return Err(fail(format!("second create gave {other:?}"))),
    }
    let got = store.load(&k).await?.ok_or_else(|| fail("missing"))?;
    ensure_eq!(got.state, sample("one"));
    ensure_eq!(got.version, 1);
    Ok(())
}

/// Delete removes the document; a new create starts over at version 1.
pub async fn delete<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let agent = unique_agent();
    let k = key(&agent, Some("u1"), "s1")?;
    ensure!(
        !store.delete(&k).await?,
        "deleting an absent key reported true"
    );
    store.save(&k, &sample("a"), None).await?;
    store.save(&k, &sample("b"), Some(1)).await?;
    ensure!(store.delete(&k).await?, "delete reported false");
    ensure!(store.load(&k).await?.is_none(), "document survived delete");
    ensure!(
        store.list_sessions(&agent, Some("u1")).await?.is_empty(),
        "deleted session still listed"
    );
    ensure!(!store.delete(&k).await?, "second delete reported true");
    ensure!(
        store
            .save(&k, &sample("c"), Some(2))
            .await
            .is_err_and(|e| e.is_conflict()),
        "update after delete must conflict"
    );
    ensure_eq!(store.save(&k, &sample("c"), None).await?, 1);
    Ok(())
}

/// Listing returns exactly the tenant's sessions, most recent first.
pub async fn list<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let agent = unique_agent();
    ensure!(
        store.list_sessions(&agent, Some("u1")).await?.is_empty(),
        "fresh agent lists sessions"
    );
    for s in ["s-a", "s-b", "s-c"] {
        store
            .save(&key(&agent, Some("u1"), s)?, &sample(s), None)
            .await?;
        // Distinct update times, so the order below is defined.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store
        .save(&key(&agent, Some("u2"), "s-x")?, &sample("x"), None)
        .await?;
    store
        .save(&key(&agent, None, "s-y")?, &sample("y"), None)
        .await?;
    store
        .save(&key(&agent, Some("u1"), "s-a")?, &sample("again"), Some(1))
        .await?;
    let listed = store.list_sessions(&agent, Some("u1")).await?;
    let names: Vec<&str> = listed.iter().map(|s| s.session.as_str()).collect();
    ensure_eq!(names, vec!["s-a", "s-c", "s-b"]);
    ensure!(
        listed
            .windows(2)
            .all(|w| w[0].updated_at >= w[1].updated_at),
        "not sorted by update time: {listed:?}"
    );
    let now = chrono::Utc::now();
    ensure!(
        listed
            .iter()
            .all(|s| (now - s.updated_at).num_seconds().abs() < 300),
        "update times are not current: {listed:?}"
    );
    let anon: Vec<String> = store
        .list_sessions(&agent, None)
        .await?
        .into_iter()
        .map(|s| s.session)
        .collect();
    ensure_eq!(anon, vec!["s-y".to_owned()]);
    ensure!(
        matches!(
            store.list_sessions("../etc", None).await,
            Err(Error::InvalidId { .. })
        ),
        "list accepted an invalid agent id"
    );
    ensure!(
        matches!(
            store.list_sessions(&agent, Some("a/b")).await,
            Err(Error::InvalidId { .. })
        ),
        "list accepted an invalid user id"
    );
    Ok(())
}

/// Two users (and the anonymous tenant, and another agent) with the same session id never
/// see each other's state.
pub async fn tenant_isolation<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let agent = unique_agent();
    let other_agent = unique_agent();
    let keys = [
        key(&agent, Some("alice"), "shared")?,
        key(&agent, Some("bob"), "shared")?,
        key(&agent, None, "shared")?,
        key(&other_agent, Some("alice"), "shared")?,
    ];
    for (i, k) in keys.iter().enumerate() {
        ensure!(
            store.load(k).await?.is_none(),
            "{k} visible before its save"
        );
        store.save(k, &sample(&format!("tenant {i}")), None).await?;
    }
    for (i, k) in keys.iter().enumerate() {
        let got = store
            .load(k)
            .await?
            .ok_or_else(|| fail(format!("{k} missing")))?;
        ensure_eq!(got.state, sample(&format!("tenant {i}")));
        ensure_eq!(got.version, 1);
    }
    for (user, n) in [(Some("alice"), 1), (Some("bob"), 1), (None, 1)] {
        ensure_eq!(store.list_sessions(&agent, user).await?.len(), n);
    }
    ensure!(store.delete(&keys[0]).await?, "delete alice");
    for k in &keys[1..] {
        ensure!(store.load(k).await?.is_some(), "deleting alice removed {k}");
    }
    // Leases are per tenant too.
    let lease = store
        .acquire(
            &keys[1],
            LeaseOptions::new(Duration::from_secs(30), Duration::ZERO),
        )
        .await?;
    for k in [&keys[0], &keys[2], &keys[3]] {
        let other = store.try_acquire(k, Duration::from_secs(30)).await?;
        ensure!(other.is_some(), "bob's lease blocked {k}");
        if let Some(l) = other {
            l.release().await?;
        }
    }
    lease.release().await?;
    Ok(())
}

/// A second acquirer waits, then gets `SessionBusy`; after release it gets the lease.
pub async fn lease_exclusion<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let k = key(&unique_agent(), Some("u1"), "s1")?;
    let first = store
        .acquire(
            &k,
            LeaseOptions::new(Duration::from_secs(30), Duration::ZERO),
        )
        .await?;
    ensure!(first.key() == &k, "lease key");
    ensure!(
        store
            .try_acquire(&k, Duration::from_secs(30))
            .await?
            .is_none(),
        "second holder while the first holds"
    );
    match store
        .acquire(
            &k,
            LeaseOptions::new(Duration::from_secs(30), Duration::from_millis(200)),
        )
        .await
    {
        Err(Error::SessionBusy { waited, .. }) => {
            ensure!(
                waited >= Duration::from_millis(200),
                "gave up before the wait: {waited:?}"
            );
        }
        other => return Err(fail(format!("busy session gave {other:?}"))),
    }
    first.renew().await?;
    first.release().await?;
    let second = store
        .acquire(
            &k,
            LeaseOptions::new(Duration::from_secs(30), Duration::from_secs(2)),
        )
        .await?;
    ensure!(second.token() != "", "empty token");
    // A waiter is granted the lease once the holder releases it.
    let waiter = {
        let store_key = k.clone();
        let opts = LeaseOptions::new(Duration::from_secs(30), Duration::from_secs(10));
        async move { store.acquire(&store_key, opts).await }
    };
    let release = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        second.release().await
    };
    let (got, released) = tokio::join!(waiter, release);
    released?;
    let third = got?;
    // Dropping a lease releases it (in the background).
    drop(third);
    let fourth = store
        .acquire(
            &k,
            LeaseOptions::new(Duration::from_secs(30), Duration::from_secs(10)),
        )
        .await?;
    fourth.release().await?;
    Ok(())
}

/// A kept-alive lease outlives its TTL; a released one makes keep-alive report the loss.
pub async fn lease_keep_alive<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let k = key(&unique_agent(), Some("u1"), "long-turn")?;
    let lease = store
        .acquire(
            &k,
            LeaseOptions::new(Duration::from_millis(600), Duration::ZERO),
        )
        .await?;
    let keep = lease.keep_alive();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ensure!(!keep.is_lost(), "keep-alive lost a held lease");
    ensure!(lease.check().is_ok(), "a kept-alive lease failed its check");
    ensure!(
        store
            .try_acquire(&k, Duration::from_secs(30))
            .await?
            .is_none(),
        "a kept-alive lease expired"
    );
    drop(keep);
    lease.release().await?;
    ensure!(
        store
            .try_acquire(&k, Duration::from_secs(30))
            .await?
            .is_some(),
        "released lease still held"
    );
    Ok(())
}

/// A holder that dies (drops its lease without releasing) does not block the session forever.
pub async fn lease_expiry<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let k = key(&unique_agent(), None, "s1")?;
    let dead = store
        .acquire(
            &k,
            LeaseOptions::new(Duration::from_millis(300), Duration::ZERO),
        )
        .await?;
    dead.abandon();
    let next = store
        .acquire(
            &k,
            LeaseOptions::new(Duration::from_secs(30), Duration::from_secs(10)),
        )
        .await?;
    next.release().await?;

    if store.ttl_expires_live_holders() {
        let stalled = store
            .acquire(
                &k,
                LeaseOptions::new(Duration::from_millis(200), Duration::ZERO),
            )
            .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let taker = store
            .acquire(
                &k,
                LeaseOptions::new(Duration::from_secs(30), Duration::from_secs(5)),
            )
            .await?;
        ensure!(
            matches!(stalled.renew().await, Err(Error::LeaseLost { .. })),
            "an expired lease was renewed over a new holder"
        );
        // Releasing the stale lease must not release the new holder's.
        stalled.release().await?;
        ensure!(
            store
                .try_acquire(&k, Duration::from_secs(30))
                .await?
                .is_none(),
            "a stale release freed the new holder's lease"
        );
        taker.release().await?;
    }
    Ok(())
}

/// The handle of a lease that a paused or partitioned process still believes it holds:
/// renewing and releasing do nothing, so only the store can stop its writes.
#[derive(Debug)]
struct Stale;

#[async_trait]
impl LeaseHandle for Stale {
    async fn renew(&self, _ttl: Duration) -> Result<()> {
        Ok(())
    }
    async fn release(&self) -> Result<()> {
        Ok(())
    }
}

/// A copy of an old lease (token and fence) whose local clock says it is still held, as a
/// paused or partitioned process would keep it: only the store can refuse its writes.
pub fn stale_copy(key: &StateKey, token: &str, fence: u64) -> Lease {
    let grant = LeaseGrant::new(
        token.to_owned(),
        fence,
        Duration::from_secs(60),
        Instant::now(),
    );
    Lease::new(key.clone(), grant, Arc::new(Stale))
}

/// `save_fenced` writes under the current lease, refuses a superseded one (checked by the
/// store, not only by the lease's clock) and leaves the state unchanged; fences grow.
pub async fn fenced_save<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let hold = LeaseOptions::new(Duration::from_secs(30), Duration::from_secs(5));
    let agent = unique_agent();
    let k = key(&agent, Some("u1"), "fenced")?;
    let first = store.acquire(&k, hold).await?;
    ensure!(first.check().is_ok(), "a fresh lease is lost");
    ensure!(
        first.remaining().is_some() == store.ttl_expires_live_holders(),
        "remaining {:?} does not match the store's TTL behaviour",
        first.remaining()
    );
    ensure_eq!(
        store.save_fenced(&k, &sample("one"), None, &first).await?,
        1
    );
    ensure_eq!(
        store
            .save_fenced(&k, &sample("two"), Some(1), &first)
            .await?,
        2
    );
    ensure!(
        store
            .save_fenced(&k, &sample("stale version"), Some(1), &first)
            .await
            .is_err_and(|e| e.is_conflict()),
        "a fenced save with a stale version must conflict"
    );
    ensure!(first.check().is_ok(), "a conflict lost the lease");
    let other = key(&agent, Some("u1"), "other")?;
    let other_lease = store.acquire(&other, hold).await?;
    ensure!(
        matches!(
            store
                .save_fenced(&k, &sample("x"), Some(2), &other_lease)
                .await,
            Err(Error::Config(_))
        ),
        "a lease on another key fenced a write"
    );
    other_lease.release().await?;

    let (token, fence) = (first.token().to_owned(), first.fence());
    first.release().await?;
    let second = store.acquire(&k, hold).await?;
    ensure!(
        second.fence() > fence,
        "fences must grow: {fence} then {}",
        second.fence()
    );
    let stale = stale_copy(&k, &token, fence);
    ensure!(
        stale.check().is_ok(),
        "the stale copy's clock should still run"
    );
    match store
        .save_fenced(&k, &sample("stale holder"), Some(2), &stale)
        .await
    {
        Err(Error::LeaseLost { .. }) => {}
        other => return Err(fail(format!("a superseded lease's save gave {other:?}"))),
    }
    ensure!(stale.is_lost(), "a refused lease is not marked lost");
    let got = store.load(&k).await?.ok_or_else(|| fail("missing"))?;
    ensure_eq!((got.version, got.state), (2, sample("two")));
    ensure_eq!(
        store
            .save_fenced(&k, &sample("three"), Some(2), &second)
            .await?,
        3
    );
    // Plain saves do not look at leases.
    ensure_eq!(store.save(&k, &sample("four"), Some(3)).await?, 4);
    let second_fence = second.fence();
    second.release().await?;
    let third = store.acquire(&k, hold).await?;
    ensure!(third.fence() > second_fence, "fences must keep growing");
    third.release().await?;

    // A stale holder cannot create a document either.
    let fresh = key(&agent, None, "fresh")?;
    let gone = store.acquire(&fresh, hold).await?;
    let (token, fence) = (gone.token().to_owned(), gone.fence());
    gone.release().await?;
    let now = store.acquire(&fresh, hold).await?;
    let stale = stale_copy(&fresh, &token, fence);
    ensure!(
        matches!(
            store.save_fenced(&fresh, &sample("x"), None, &stale).await,
            Err(Error::LeaseLost { .. })
        ),
        "a superseded lease created a document"
    );
    ensure!(store.load(&fresh).await?.is_none(), "refused create wrote");
    ensure_eq!(
        store.save_fenced(&fresh, &sample("y"), None, &now).await?,
        1
    );
    now.release().await?;
    Ok(())
}

/// A lease past its TTL is lost for good, even before anyone else takes it: `check`,
/// `renew` and `save_fenced` fail and nothing is written. (TTL stores only.)
pub async fn lapsed_lease_is_lost<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    if !store.ttl_expires_live_holders() {
        return Ok(());
    }
    let k = key(&unique_agent(), Some("u1"), "lapsed")?;
    // Long enough that acquiring it on a loaded machine leaves some of it (300 ms did not).
    let ttl = Duration::from_millis(1000);
    let lease = store
        .acquire(&k, LeaseOptions::new(ttl, Duration::ZERO))
        .await?;
    ensure!(
        lease
            .remaining()
            .is_some_and(|r| r > Duration::ZERO && r <= ttl),
        "remaining {:?}",
        lease.remaining()
    );
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    ensure!(
        matches!(lease.check(), Err(Error::LeaseLost { .. })),
        "a lapsed lease passed its check"
    );
    ensure!(
        matches!(
            store.save_fenced(&k, &sample("late"), None, &lease).await,
            Err(Error::LeaseLost { .. })
        ),
        "a lapsed lease's save was not refused"
    );
    ensure!(store.load(&k).await?.is_none(), "a lapsed lease wrote");
    ensure!(
        matches!(lease.renew().await, Err(Error::LeaseLost { .. })),
        "a lapsed lease was renewed"
    );
    let next = store
        .acquire(
            &k,
            LeaseOptions::new(Duration::from_secs(30), Duration::from_secs(2)),
        )
        .await?;
    ensure!(next.fence() > lease.fence(), "fence did not grow on expiry");
    next.release().await?;
    Ok(())
}

/// N tasks doing read-modify-write with compare-and-set retry lose no increment.
pub async fn concurrent_savers<S: StateStore + RawAccess>(store: Arc<S>) -> Result<()> {
    const TASKS: u64 = 8;
    const EACH: u64 = 10;
    let k = key(&unique_agent(), Some("u1"), "counter")?;
    store.save(&k, &AgentState::default(), None).await?;
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        let store = store.clone();
        let k = k.clone();
        handles.push(tokio::spawn(async move {
            let mut conflicts = 0u64;
            for _ in 0..EACH {
                loop {
                    let cur = store
                        .load(&k)
                        .await?
                        .ok_or_else(|| fail("counter vanished"))?;
                    let mut state = cur.state;
                    let n = state.extension::<u64>("counter").unwrap_or(0);
                    state
                        .set_extension("counter", &(n + 1))
                        .map_err(Error::Serialize)?;
                    match store.save(&k, &state, Some(cur.version)).await {
                        Ok(_) => break,
                        Err(e) if e.is_conflict() => conflicts += 1,
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok::<u64, Error>(conflicts)
        }));
    }
    for h in handles {
        h.await.map_err(|e| fail(format!("task panicked: {e}")))??;
    }
    let got = store.load(&k).await?.ok_or_else(|| fail("missing"))?;
    ensure_eq!(got.state.extension::<u64>("counter"), Some(TASKS * EACH));
    ensure_eq!(got.version, 1 + TASKS * EACH);
    Ok(())
}

/// A version-0 document (no `schema_version`) is migrated on load and can be saved over.
pub async fn migrates_v0<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let k = key(&unique_agent(), Some("u1"), "old")?;
    let v0 = serde_json::json!({
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi from v0"}]}]
    });
    store.put_raw(&k, v0).await?;
    let got = store
        .load(&k)
        .await?
        .ok_or_else(|| fail("raw document missing"))?;
    ensure_eq!(got.state.schema_version, hame_core::STATE_SCHEMA_VERSION);
    ensure_eq!(got.state.messages, vec![Message::user("hi from v0")]);
    let mut next = got.state;
    next.messages.push(Message::assistant("hello"));
    let v = store.save(&k, &next, Some(got.version)).await?;
    let again = store.load(&k).await?.ok_or_else(|| fail("missing"))?;
    ensure_eq!(again.version, v);
    ensure_eq!(again.state, next);

    let newer = key(&unique_agent(), None, "future")?;
    store
        .put_raw(
            &newer,
            serde_json::json!({"schema_version": 9999, "messages": []}),
        )
        .await?;
    ensure!(
        matches!(store.load(&newer).await, Err(Error::Format { .. })),
        "a document from a newer hame was accepted"
    );
    Ok(())
}

/// An older build's saves over `k` — plain, then fenced under a lease it takes — are
/// `refused` and leave the lease held; returns the lease.
async fn saves_over_are_refused<S: StateStore + RawAccess>(
    store: &S,
    k: &StateKey,
    what: &str,
    refused: impl Fn(&Result<u64>) -> bool,
) -> Result<Lease> {
    let got = store.save(k, &sample("older build"), Some(1)).await;
    ensure!(refused(&got), "a save over {what} gave {got:?}");
    let lease = store
        .acquire(
            k,
            LeaseOptions::new(Duration::from_secs(30), Duration::from_secs(5)),
        )
        .await?;
    let got = store
        .save_fenced(k, &sample("older build"), Some(1), &lease)
        .await;
    ensure!(refused(&got), "a fenced save over {what} gave {got:?}");
    ensure!(lease.check().is_ok(), "refusing the save lost the lease");
    Ok(lease)
}

/// A document written by a newer hame (a larger `schema_version`) is refused by `load` with a
/// clear error and never overwritten by `save` or `save_fenced`; a state claiming a newer
/// schema is not written either. Deleting it is allowed.
pub async fn future_schema_is_never_overwritten<S: StateStore + RawAccess>(
    store: &S,
) -> Result<()> {
    let agent = unique_agent();
    let k = key(&agent, Some("u1"), "future")?;
    let doc = serde_json::json!({"schema_version": 9999, "messages": [], "new_field": true});
    store.put_raw(&k, doc).await?;
    let refused = |r: &Result<u64>| r.as_ref().is_err_and(Error::is_too_new);
    match store.load(&k).await {
        Err(e) if e.is_too_new() => ensure!(
            e.to_string().contains("9999") && e.to_string().contains("newer than this build"),
            "unclear error: {e}"
        ),
        other => return Err(fail(format!("loading a newer document gave {other:?}"))),
    }
    let lease = saves_over_are_refused(store, &k, "a newer document", refused).await?;
    ensure!(
        store
            .save(&k, &sample("older build"), None)
            .await
            .is_err_and(|e| e.is_conflict()),
        "a create over an existing newer document must conflict"
    );
    ensure!(
        store.load(&k).await.is_err_and(|e| e.is_too_new()),
        "the newer document was rewritten"
    );

    let mut newer = sample("claims a newer schema");
    newer.schema_version = hame_core::STATE_SCHEMA_VERSION + 1;
    let other = key(&agent, Some("u1"), "other")?;
    let got = store.save(&other, &newer, None).await;
    ensure!(
        refused(&got),
        "a state of a newer schema was saved: {got:?}"
    );
    ensure!(store.load(&other).await?.is_none(), "it was written anyway");

    ensure!(
        store.delete(&k).await?,
        "a newer document cannot be deleted"
    );
    ensure_eq!(
        store
            .save_fenced(&k, &sample("fresh"), None, &lease)
            .await?,
        1
    );
    lease.release().await?;
    Ok(())
}

/// A document in a storage format newer than this build's (`hame-state/99`) is refused by
/// `load` with [`Error::NewerFormat`] naming the format, whatever the rest of it holds, and
/// never overwritten by `save` or `save_fenced`. Backends whose documents carry no storage
/// format ([`RawAccess::set_raw_format`] false) pass trivially; their schema version is
/// checked by [`future_schema_is_never_overwritten`].
pub async fn newer_format_is_refused<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let agent = unique_agent();
    let k = key(&agent, Some("u1"), "newer-format")?;
    // A state this build could read, apart from its format.
    let state = serde_json::to_value(sample("from a newer hame")).map_err(Error::Serialize)?;
    store.put_raw(&k, state.clone()).await?;
    if !store.set_raw_format(&k, 99).await? {
        return Ok(());
    }
    let is_newer =
        |e: &Error| matches!(e, Error::NewerFormat { found, .. } if found == "hame-state/99");
    match store.load(&k).await {
        Err(e) if is_newer(&e) && e.is_too_new() => ensure!(
            e.to_string().contains("hame-state/99") && e.to_string().contains("newer"),
            "unclear error: {e}"
        ),
        other => {
            return Err(fail(format!(
                "loading a newer-format document gave {other:?}"
            )));
        }
    }
    let lease = saves_over_are_refused(store, &k, "a newer-format document", |r| {
        r.as_ref().is_err_and(is_newer)
    })
    .await?;
    lease.release().await?;
    ensure!(
        store.load(&k).await.is_err_and(|e| is_newer(&e)),
        "the newer-format document was rewritten"
    );
    // A document of a newer format whose envelope this build cannot parse at all is
    // refused by its format too, not as corrupt.
    let odd = key(&agent, Some("u1"), "newer-layout")?;
    store
        .put_raw(&odd, serde_json::json!({"totally": ["new"]}))
        .await?;
    store.set_raw_format(&odd, 99).await?;
    let got = store.load(&odd).await;
    ensure!(
        got.as_ref().is_err_and(is_newer),
        "a newer-format document of another layout gave {got:?}"
    );
    // Formats up to this build's load as before.
    let current = key(&agent, Some("u1"), "current-format")?;
    store.put_raw(&current, state).await?;
    store
        .set_raw_format(&current, crate::error::FORMAT_VERSION)
        .await?;
    ensure_eq!(
        store.load(&current).await?.map(|s| s.state.messages.len()),
        Some(2)
    );
    Ok(())
}

/// 200 messages with large tool results survive a round trip intact.
pub async fn large_state_round_trip<S: StateStore + RawAccess>(store: &S) -> Result<()> {
    let k = key(&unique_agent(), Some("u1"), "big")?;
    let big = large_state(200, 16 * 1024);
    store.save(&k, &big, None).await?;
    let got = store.load(&k).await?.ok_or_else(|| fail("missing"))?;
    ensure!(got.state == big, "large state changed in the round trip");
    let mut more = got.state;
    more.messages.truncate(50);
    store.save(&k, &more, Some(1)).await?;
    let got = store.load(&k).await?.ok_or_else(|| fail("missing"))?;
    ensure_eq!(got.state.messages.len(), 50);
    ensure!(got.state == more, "shrunk state changed in the round trip");
    Ok(())
}

/// Generates one `#[tokio::test]` per conformance check. `$make` is an async expression
/// returning `Result<Option<Arc<S>>>`; `None` skips the test (service not configured).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@one $make, round_trip, stale_save_conflicts, create_only_conflicts,
            delete, list, tenant_isolation, lease_exclusion, lease_expiry, lease_keep_alive, migrates_v0,
            large_state_round_trip, fenced_save, lapsed_lease_is_lost,
            future_schema_is_never_overwritten, newer_format_is_refused);
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_savers() -> $crate::Result<()> {
            let Some(store) = $make.await? else { return Ok(()) };
            $crate::conformance::concurrent_savers(store).await
        }
    };
    (@one $make:expr, $($name:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() -> $crate::Result<()> {
                let Some(store) = $make.await? else { return Ok(()) };
                $crate::conformance::$name(&*store).await
            }
        )+
    };
}

/// Reads a service URL from the environment for a backend test.
///
/// Unset: prints a loud `SKIPPED` line and returns `None`, except under CI, where a
/// missing service is an error.
pub fn service_url(var: &str) -> Result<Option<String>> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Ok(Some(url)),
        _ if hame_test_env::ci() => Err(Error::Config(format!(
            "{var} is not set but CI is set: the service must be available in CI"
        ))),
        _ => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("SKIPPED: {var} is not set; this backend's conformance test did not run");
            }
            Ok(None)
        }
    }
}
