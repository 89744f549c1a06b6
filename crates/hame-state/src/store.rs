//! The [`StateStore`] trait and its value types.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hame_core::AgentState;

use crate::error::{Error, Result};
use crate::key::StateKey;

/// Default lease time-to-live: a holder that neither renews nor releases within this time
/// loses the session.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// Default time a caller waits for a busy session before [`Error::SessionBusy`].
pub const DEFAULT_LEASE_WAIT: Duration = Duration::from_secs(10);
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
///   not renewed within its TTL expires (so a dead holder cannot block a session forever).
///   Leases are advisory: `save` does not check them; callers serialise turns by holding one.
/// - **Sharing.** [`is_shared`](Self::is_shared) is true when several machines may use the
///   store at once (Redis, PostgreSQL, MySQL) and false for single-machine stores.
#[async_trait]
pub trait StateStore: Send + Sync + fmt::Debug + 'static {
    /// Loads the state of a session; `None` when it was never saved or was deleted.
    async fn load(&self, key: &StateKey) -> Result<Option<Stored>>;

    /// Saves a state if the stored version is `expected` (`None`: only if absent) and
    /// returns the new version.
    async fn save(&self, key: &StateKey, state: &AgentState, expected: Option<u64>) -> Result<u64>;

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

macro_rules! forward_store {
    ($ty:ty) => {
        #[async_trait]
        impl<T: StateStore + ?Sized> StateStore for $ty {
            async fn load(&self, key: &StateKey) -> Result<Option<Stored>> {
                (**self).load(key).await
            }
            async fn save(
                &self,
                key: &StateKey,
                state: &AgentState,
                expected: Option<u64>,
            ) -> Result<u64> {
                (**self).save(key, state, expected).await
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
}

/// A held session lease. Release it with [`Lease::release`]; dropping it releases it in
/// the background (on the current tokio runtime, if any).
pub struct Lease {
    key: StateKey,
    token: String,
    ttl: Duration,
    handle: Option<Arc<dyn LeaseHandle>>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("held", &self.handle.is_some())
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// Wraps a backend lease.
    pub fn new(key: StateKey, token: String, ttl: Duration, handle: Arc<dyn LeaseHandle>) -> Self {
        Self {
            key,
            token,
            ttl,
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

    /// The TTL the lease was taken with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Extends the lease by its TTL from now. Call it well before the TTL passes (every
    /// `ttl / 3` is a good rhythm) during long turns.
    pub async fn renew(&self) -> Result<()> {
        match &self.handle {
            Some(h) => h.renew(self.ttl).await,
            None => Err(Error::LeaseLost {
                key: self.key.to_string(),
            }),
        }
    }

    /// Releases the lease now.
    pub async fn release(mut self) -> Result<()> {
        match self.handle.take() {
            Some(h) => h.release().await,
            None => Ok(()),
        }
    }

    /// Renews the lease every `ttl / 3` in the background until the returned guard is
    /// dropped or a renewal fails (then [`KeepAlive::is_lost`] turns true). Use it around a
    /// turn that may outlast the TTL.
    pub fn keep_alive(&self) -> KeepAlive {
        let lost = Arc::new(AtomicBool::new(false));
        let Some(handle) = self.handle.clone() else {
            lost.store(true, Ordering::Relaxed);
            return KeepAlive { task: None, lost };
        };
        let ttl = self.ttl;
        let every = (ttl / 3).max(Duration::from_millis(1));
        let flag = lost.clone();
        let key = self.key.to_string();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = handle.renew(ttl).await {
                    tracing::warn!(%key, error = %e, "lease keep-alive stopped");
                    flag.store(true, Ordering::Relaxed);
                    return;
                }
            }
        });
        KeepAlive {
            task: Some(task),
            lost,
        }
    }

    /// Drops the lease without releasing it, as a crashed holder would: shared stores keep
    /// it until its TTL passes; the JSON store's OS lock goes with the file handle at once.
    pub fn abandon(mut self) {
        self.handle = None;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
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
    lost: Arc<AtomicBool>,
}

impl KeepAlive {
    /// Whether a renewal failed: the lease may now belong to someone else, so the turn
    /// should stop before saving (its save would most likely conflict anyway).
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
