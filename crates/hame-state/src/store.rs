//! The [`StateStore`] trait and its value types.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hame_core::AgentState;

use crate::error::{Error, Result};
use crate::key::StateKey;

/// Default lease time-to-live: a holder that neither renews nor releases within this time
/// loses the session. Renew every `ttl / 3` ([`Lease::keep_alive`] does). A holder that dies
/// on the caller's own machine is taken over at once; one on another machine frees the
/// session after at most this long.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// Default time a caller waits for a busy session before [`Error::SessionBusy`]: longer than
/// [`DEFAULT_LEASE_TTL`], so a caller that meets the lease of a holder that crashed on another
/// machine gets the session when the lease lapses instead of failing.
pub const DEFAULT_LEASE_WAIT: Duration = Duration::from_secs(12);
/// First pause between two attempts to take a busy lease; doubled up to [`LEASE_POLL_MAX`].
pub const LEASE_POLL_MIN: Duration = Duration::from_millis(10);
/// Longest pause between two attempts to take a busy lease.
pub const LEASE_POLL_MAX: Duration = Duration::from_millis(250);

/// A loaded state and the version it was stored at.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// The state, migrated to the current schema.
    pub state: AgentState,
    /// The version to pass as `expected` to the next [`StateStore::save`].
    pub version: u64,
}

/// One entry of [`StateStore::list_sessions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSummary {
    /// The session id.
    pub session: String,
    /// When the session's state was last saved.
    pub updated_at: DateTime<Utc>,
}

/// How to take a session lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseOptions {
    /// How long the lease lasts without [`Lease::renew`]. Ignored by the JSON store, whose
    /// lease is an OS file lock that lasts until release or process death.
    pub ttl: Duration,
    /// How long to wait for a busy session before giving up with [`Error::SessionBusy`].
    /// `Duration::ZERO` tries once.
    pub wait: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self {
            ttl: DEFAULT_LEASE_TTL,
            wait: DEFAULT_LEASE_WAIT,
        }
    }
}

impl LeaseOptions {
    /// Options with this TTL and wait.
    pub fn new(ttl: Duration, wait: Duration) -> Self {
        Self { ttl, wait }
    }
}

/// Persistent, versioned storage of [`AgentState`] per session, with per-session leases.
///
/// # Contract
///
/// - **Versions.** Every stored document has a version `>= 1`. The first save creates
///   version 1 and each later save returns the previous version plus one.
/// - **Compare-and-set.** [`save`](Self::save) writes only when the stored version equals
///   `expected` (`None` = no document may exist). Otherwise it fails with
///   [`Error::Conflict`] and changes nothing: a stale writer never overwrites silently.
/// - **Migration.** [`load`](Self::load) reads documents of every known schema version
///   through [`AgentState::from_json`]; a document from a newer hame is [`Error::Format`].
/// - **Isolation.** Keys with different agent, user or session ids never share data;
///   `user: None` is a separate anonymous tenant.
/// - **Leases.** [`acquire`](Self::acquire) grants at most one live lease per key across
///   every process that uses the same store. A loser polls with backoff until
///   [`LeaseOptions::wait`] has passed, then gets [`Error::SessionBusy`]. A lease that is
///   not renewed within its TTL expires (so a dead holder cannot block a session forever);
///   a lease whose holder is a process of the caller's own machine that has exited is taken
///   over at once (see [`crate::Holder`]).
/// - **Fencing.** Every acquisition of a key gets a larger [`Lease::fence`] than all before
///   it. [`save_fenced`](Self::save_fenced) writes only while its lease is the key's current
///   one and not lost; a stale holder's write fails with [`Error::LeaseLost`] and changes
///   nothing. Plain [`save`](Self::save) does not look at leases.
/// - **Sharing.** [`is_shared`](Self::is_shared) is true when several machines may use the
///   store at once (Redis, PostgreSQL, MySQL) and false for single-machine stores.
#[async_trait]
pub trait StateStore: Send + Sync + fmt::Debug + 'static {
    /// Loads the state of a session; `None` when it was never saved or was deleted.
    async fn load(&self, key: &StateKey) -> Result<Option<Stored>>;

    /// The one write a backend implements: `save.state` if the stored version is
    /// `save.expected` (`None`: only if absent), returning the new version. With
    /// `save.lease` (already checked to be a live lease on `key`), also fails with
    /// [`Error::LeaseLost`] unless the store still records that lease as the key's current
    /// one (same token and fence), checked atomically with the write. Callers use
    /// [`save`](Self::save) and [`save_fenced`](Self::save_fenced).
    async fn put(&self, key: &StateKey, save: Save<'_>) -> Result<u64>;

    /// Saves a state if the stored version is `expected` (`None`: only if absent) and
    /// returns the new version.
    async fn save(&self, key: &StateKey, state: &AgentState, expected: Option<u64>) -> Result<u64> {
        let lease = None;
        self.put(
            key,
            Save {
                state,
                expected,
                lease,
            },
        )
        .await
    }

    /// [`save`](Self::save) under a lease: also fails with [`Error::LeaseLost`] (and marks
    /// the lease lost) unless `lease` is a lease on `key` that is not lost and that the store
    /// still records as the key's current lease (same token and fence), checked atomically
    /// with the write. A holder whose lease lapsed or was taken over can never overwrite its
    /// successor's state.
    async fn save_fenced(
        &self,
        key: &StateKey,
        state: &AgentState,
        expected: Option<u64>,
        lease: &Lease,
    ) -> Result<u64> {
        lease.check_for(key)?;
        let out = self
            .put(
                key,
                Save {
                    state,
                    expected,
                    lease: Some(lease),
                },
            )
            .await;
        if matches!(out, Err(Error::LeaseLost { .. })) {
            lease.mark_lost();
        }
        out
    }

    /// Deletes a session's state; returns whether it existed. A later save must pass
    /// `expected: None` and starts again at version 1.
    async fn delete(&self, key: &StateKey) -> Result<bool>;

    /// The sessions stored for an agent and user (`None`: the anonymous tenant), most
    /// recently updated first.
    async fn list_sessions(&self, agent: &str, user: Option<&str>) -> Result<Vec<SessionSummary>>;

    /// One attempt to take the lease of a session: `None` when someone else holds it.
    async fn try_acquire(&self, key: &StateKey, ttl: Duration) -> Result<Option<Lease>>;

    /// Takes the lease of a session, waiting up to `options.wait` with backoff.
    async fn acquire(&self, key: &StateKey, options: LeaseOptions) -> Result<Lease> {
        let start = Instant::now();
        let mut pause = LEASE_POLL_MIN;
        loop {
            if let Some(lease) = self.try_acquire(key, options.ttl).await? {
                return Ok(lease);
            }
            let waited = start.elapsed();
            if waited >= options.wait {
                return Err(Error::SessionBusy {
                    key: key.to_string(),
                    waited,
                });
            }
            tokio::time::sleep(pause.min(options.wait - waited)).await;
            pause = (pause * 2).min(LEASE_POLL_MAX);
        }
    }

    /// Whether several machines may share this store (see the trait contract).
    fn is_shared(&self) -> bool;
}

/// One write of a state: what [`StateStore::put`] receives.
#[derive(Debug, Clone, Copy)]
pub struct Save<'a> {
    /// The state to write.
    pub state: &'a AgentState,
    /// The version it replaces (`None`: only if there is none).
    pub expected: Option<u64>,
    /// For a fenced save, the lease it is made under.
    pub lease: Option<&'a Lease>,
}

macro_rules! forward_store {
    ($ty:ty) => {
        #[async_trait]
        impl<T: StateStore + ?Sized> StateStore for $ty {
            async fn load(&self, key: &StateKey) -> Result<Option<Stored>> {
                (**self).load(key).await
            }
            async fn put(&self, key: &StateKey, save: Save<'_>) -> Result<u64> {
                (**self).put(key, save).await
            }
            async fn delete(&self, key: &StateKey) -> Result<bool> {
                (**self).delete(key).await
            }
            async fn list_sessions(
                &self,
                agent: &str,
                user: Option<&str>,
            ) -> Result<Vec<SessionSummary>> {
                (**self).list_sessions(agent, user).await
            }
            async fn try_acquire(&self, key: &StateKey, ttl: Duration) -> Result<Option<Lease>> {
                (**self).try_acquire(key, ttl).await
            }
            async fn acquire(&self, key: &StateKey, options: LeaseOptions) -> Result<Lease> {
                (**self).acquire(key, options).await
            }
            fn is_shared(&self) -> bool {
                (**self).is_shared()
            }
        }
    };
}

forward_store!(Arc<T>);
forward_store!(Box<T>);

/// The backend side of a [`Lease`]; implement it when writing a [`StateStore`].
#[async_trait]
pub trait LeaseHandle: Send + Sync + fmt::Debug + 'static {
    /// Extends the lease to `ttl` from now; [`Error::LeaseLost`] when it is no longer held.
    async fn renew(&self, ttl: Duration) -> Result<()>;
    /// Releases the lease; releasing a lease that already expired is not an error.
    async fn release(&self) -> Result<()>;
    /// Whether the lease lapses after its TTL unless renewed (true but for leases that last
    /// as long as their holder, like the JSON store's OS locks).
    fn expires(&self) -> bool {
        true
    }
}

/// What a backend grants: the parts of a [`Lease`] besides its key and handle.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseGrant {
    /// Unique token of this holder.
    pub token: String,
    /// Fencing token: larger than that of every earlier lease of the key.
    pub fence: u64,
    /// The TTL the lease was taken with.
    pub ttl: Duration,
    /// When the request that took the lease was sent. The lease counts as lost `ttl` after
    /// it (or after the last renewal's request), so the holder stops before the store's
    /// expiry, never after.
    pub requested_at: Instant,
}

impl LeaseGrant {
    /// A grant.
    pub fn new(token: String, fence: u64, ttl: Duration, requested_at: Instant) -> Self {
        Self {
            token,
            fence,
            ttl,
            requested_at,
        }
    }
}

/// When a lease lapses, as this process sees it, and whether it is known to be lost.
#[derive(Debug)]
struct LeaseClock {
    base: Instant,
    /// Nanoseconds after `base`; `u64::MAX`: never.
    deadline: AtomicU64,
    lost: AtomicBool,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl LeaseClock {
    fn new(grant: &LeaseGrant, expires: bool) -> Self {
        let clock = Self {
            base: grant.requested_at,
            deadline: AtomicU64::new(if expires { 0 } else { u64::MAX }),
            lost: AtomicBool::new(false),
        };
        if expires {
            clock.extend(grant.requested_at, grant.ttl);
        }
        clock
    }

    /// Moves the deadline to `requested_at + ttl` if that is later.
    fn extend(&self, requested_at: Instant, ttl: Duration) {
        let at =
            nanos(requested_at.saturating_duration_since(self.base)).saturating_add(nanos(ttl));
        self.deadline.fetch_max(at, Ordering::AcqRel);
    }

    /// Lost for good: released, taken over, refused by the store, or past its deadline.
    fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return true;
        }
        let deadline = self.deadline.load(Ordering::Acquire);
        if deadline != u64::MAX && nanos(self.base.elapsed()) >= deadline {
            self.lose();
            return true;
        }
        false
    }

    fn lose(&self) {
        self.lost.store(true, Ordering::Release);
    }

    /// The time left before the deadline; `None`: no deadline.
    fn remaining(&self) -> Option<Duration> {
        let deadline = self.deadline.load(Ordering::Acquire);
        (deadline != u64::MAX)
            .then(|| Duration::from_nanos(deadline.saturating_sub(nanos(self.base.elapsed()))))
    }
}

/// One renewal through `handle`, keeping `clock` current. A transient failure (the store is
/// unreachable) leaves the lease held until its deadline; [`Error::LeaseLost`] loses it.
async fn renew_on(
    handle: &dyn LeaseHandle,
    clock: &LeaseClock,
    ttl: Duration,
    key: &StateKey,
) -> Result<()> {
    if clock.is_lost() {
        return Err(lost(key));
    }
    let requested_at = Instant::now();
    match handle.renew(ttl).await {
        Ok(()) => {
            clock.extend(requested_at, ttl);
            if clock.is_lost() {
                return Err(lost(key));
            }
            Ok(())
        }
        Err(e @ Error::LeaseLost { .. }) => {
            clock.lose();
            Err(e)
        }
        Err(e) => Err(e),
    }
}

fn lost(key: &StateKey) -> Error {
    Error::lease_lost(key)
}

/// A held session lease. Release it with [`Lease::release`]; dropping it releases it in
/// the background (on the current tokio runtime, if any).
///
/// A lease carries a fencing token ([`fence`](Self::fence)) and knows when it lapses: it is
/// **lost** once it was refused or taken over by the store, or once its TTL has passed since
/// the request of its last successful acquisition or renewal. [`check`](Self::check) fails
/// from then on, and [`StateStore::save_fenced`] refuses to write with it.
pub struct Lease {
    key: StateKey,
    token: String,
    fence: u64,
    ttl: Duration,
    clock: Arc<LeaseClock>,
    handle: Option<Arc<dyn LeaseHandle>>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .field("held", &self.handle.is_some())
            .field("lost", &self.clock.is_lost())
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// Wraps a backend lease.
    pub fn new(key: StateKey, grant: LeaseGrant, handle: Arc<dyn LeaseHandle>) -> Self {
        let clock = Arc::new(LeaseClock::new(&grant, handle.expires()));
        Self {
            key,
            token: grant.token,
            fence: grant.fence,
            ttl: grant.ttl,
            clock,
            handle: Some(handle),
        }
    }

    /// The leased session.
    pub fn key(&self) -> &StateKey {
        &self.key
    }

    /// The unique token identifying this holder.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The fencing token: every acquisition of a key gets a larger one than all before it,
    /// so a durable write elsewhere can refuse a stale holder by comparing numbers.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The TTL the lease was taken with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// `Ok` while the lease is held; [`Error::LeaseLost`] once it is lost (see the type's
    /// documentation). Call it before every durable write made under the lease.
    pub fn check(&self) -> Result<()> {
        if self.handle.is_none() || self.clock.is_lost() {
            Err(lost(&self.key))
        } else {
            Ok(())
        }
    }

    /// Whether the lease is lost (the negation of [`check`](Self::check) succeeding).
    pub fn is_lost(&self) -> bool {
        self.check().is_err()
    }

    /// How long the lease lasts without renewal, as this process counts; `None` for a lease
    /// without TTL (the JSON store's), `Some(ZERO)` once it has lapsed.
    pub fn remaining(&self) -> Option<Duration> {
        self.clock.remaining()
    }

    /// Checks that the lease is held and is the lease of `key`; for backends, before a
    /// fenced write.
    pub fn check_for(&self, key: &StateKey) -> Result<()> {
        if &self.key != key {
            return Err(Error::Config(format!(
                "a lease on {} cannot fence a write to {key}",
                self.key
            )));
        }
        self.check()
    }

    /// Marks the lease lost; for backends whose store refused a fenced write.
    pub fn mark_lost(&self) {
        self.clock.lose();
    }

    /// Extends the lease by its TTL from now. Call it well before the TTL passes (every
    /// `ttl / 3` is a good rhythm) during long turns. [`Error::LeaseLost`] (and the lease is
    /// lost for good) when it lapsed or someone else holds it; another error (the store is
    /// unreachable) leaves it held until its TTL passes, so the next renewal may succeed.
    pub async fn renew(&self) -> Result<()> {
        match &self.handle {
            Some(h) => renew_on(h.as_ref(), &self.clock, self.ttl, &self.key).await,
            None => Err(lost(&self.key)),
        }
    }

    /// Releases the lease now.
    pub async fn release(mut self) -> Result<()> {
        self.clock.lose();
        match self.handle.take() {
            Some(h) => h.release().await,
            None => Ok(()),
        }
    }

    /// Renews the lease every `ttl / 3` in the background until the returned guard is
    /// dropped or the lease is lost (then [`KeepAlive::is_lost`] and [`Lease::check`] report
    /// it). A renewal that fails without losing the lease is retried after `ttl / 12`. Use
    /// it around a turn that may outlast the TTL.
    pub fn keep_alive(&self) -> KeepAlive {
        let clock = self.clock.clone();
        let Some(handle) = self.handle.clone() else {
            clock.lose();
            return KeepAlive { task: None, clock };
        };
        let ttl = self.ttl;
        let every = (ttl / 3).max(Duration::from_millis(1));
        let retry = (ttl / 12).max(Duration::from_millis(1));
        let shared = clock.clone();
        let key = self.key.clone();
        let task = tokio::spawn(async move {
            let mut pause = every;
            loop {
                tokio::time::sleep(pause).await;
                match renew_on(handle.as_ref(), &shared, ttl, &key).await {
                    Ok(()) => pause = every,
                    Err(e) if shared.is_lost() => {
                        tracing::warn!(%key, error = %e, "lease lost; keep-alive stopped");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(%key, error = %e, "lease renewal failed; retrying");
                        pause = retry;
                    }
                }
            }
        });
        KeepAlive {
            task: Some(task),
            clock,
        }
    }

    /// Drops the lease without releasing it, as a crashed holder would: shared stores keep
    /// it until its TTL passes; the JSON store's OS lock goes with the file handle at once.
    pub fn abandon(mut self) {
        self.clock.lose();
        self.handle = None;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.clock.lose();
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    let key = self.key.to_string();
                    rt.spawn(async move {
                        if let Err(e) = h.release().await {
                            tracing::warn!(%key, error = %e, "releasing a dropped lease failed");
                        }
                    });
                }
                Err(_) => {
                    tracing::debug!(key = %self.key, "lease dropped outside a runtime; it will expire")
                }
            }
        }
    }
}

/// Background renewal of a [`Lease`], from [`Lease::keep_alive`]; stops when dropped.
/// It must be created inside a tokio runtime.
#[derive(Debug)]
pub struct KeepAlive {
    task: Option<tokio::task::JoinHandle<()>>,
    clock: Arc<LeaseClock>,
}

impl KeepAlive {
    /// Whether the lease is lost (a renewal was refused, or none succeeded within the TTL):
    /// it may now belong to someone else, so the turn should stop before saving.
    pub fn is_lost(&self) -> bool {
        self.clock.is_lost()
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
