//! [`InMemoryStore`]: a process-local store for tests and throwaway sessions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hame_core::AgentState;

use crate::error::{Error, MAX_SCHEMA, Result};
use crate::key::StateKey;
use crate::store::Save;
use crate::store::{Lease, LeaseGrant, LeaseHandle, SessionSummary, StateStore, Stored};

#[derive(Debug, Clone)]
struct Doc {
    version: u64,
    json: Arc<serde_json::Value>,
    updated_at: DateTime<Utc>,
}

/// A lease entry; kept (with an empty token) after release, so fences only grow.
#[derive(Debug)]
struct MemLease {
    token: String,
    fence: u64,
    expiry: Instant,
}

type Leases = Arc<Mutex<HashMap<StateKey, MemLease>>>;

/// A store that keeps documents in memory (as JSON values, so loads go through the same
/// migration as every other backend). Nothing survives the process; not shared.
#[derive(Debug, Default, Clone)]
pub struct InMemoryStore {
    docs: Arc<Mutex<HashMap<StateKey, Doc>>>,
    leases: Leases,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a map half-updated (every update is a
    // single insert or remove), so a poisoned lock is safe to use.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl InMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn decode(key: &StateKey, doc: &Doc) -> Result<Stored> {
        let state = AgentState::from_json((*doc.json).clone()).map_err(|source| Error::Format {
            key: key.to_string(),
            source,
        })?;
        Ok(Stored {
            state,
            version: doc.version,
        })
    }

    /// The compare-and-set of `save`.
    fn write(
        &self,
        key: &StateKey,
        json: Arc<serde_json::Value>,
        expected: Option<u64>,
    ) -> Result<u64> {
        let mut docs = lock(&self.docs);
        let old = docs.get(key);
        let version = Error::next_version(key, expected, old.map(|d| d.version))?;
        // Never overwrite a document of a newer hame.
        if let Some(found) = old.and_then(|d| d.json.get("schema_version")?.as_u64())
            && found > MAX_SCHEMA
        {
            return Err(Error::too_new(key, found));
        }
        docs.insert(
            key.clone(),
            Doc {
                version,
                json,
                updated_at: Utc::now(),
            },
        );
        Ok(version)
    }

    #[cfg(any(test, feature = "conformance"))]
    fn put_raw_sync(&self, key: &StateKey, json: serde_json::Value) -> u64 {
        let mut docs = lock(&self.docs);
        let version = docs.get(key).map_or(1, |d| d.version + 1);
        docs.insert(
            key.clone(),
            Doc {
                version,
                json: Arc::new(json),
                updated_at: Utc::now(),
            },
        );
        version
    }
}

#[async_trait]
impl StateStore for InMemoryStore {
    async fn load(&self, key: &StateKey) -> Result<Option<Stored>> {
        let doc = lock(&self.docs).get(key).cloned();
        doc.map(|d| Self::decode(key, &d)).transpose()
    }

    async fn put(&self, key: &StateKey, save: Save<'_>) -> Result<u64> {
        Error::writable_schema(key, save.state)?;
        let json = Arc::new(serde_json::to_value(save.state).map_err(Error::Serialize)?);
        let Some(lease) = save.lease else {
            return self.write(key, json, save.expected);
        };
        let expected = save.expected;
        // The lease map stays locked across the write, so no takeover can slip in between.
        let leases = lock(&self.leases);
        let held = leases
            .get(key)
            .is_some_and(|l| l.token == lease.token() && l.fence == lease.fence());
        if !held {
            lease.mark_lost();
            return Err(Error::lease_lost(key));
        }
        let out = self.write(key, json, expected);
        drop(leases);
        out
    }

    async fn delete(&self, key: &StateKey) -> Result<bool> {
        Ok(lock(&self.docs).remove(key).is_some())
    }

    async fn list_sessions(&self, agent: &str, user: Option<&str>) -> Result<Vec<SessionSummary>> {
        crate::validate_scope(agent, user)?;
        let mut out: Vec<SessionSummary> = lock(&self.docs)
            .iter()
            .filter(|(k, _)| k.agent() == agent && k.user() == user)
            .map(|(k, d)| SessionSummary {
                session: k.session().to_owned(),
                updated_at: d.updated_at,
            })
            .collect();
        crate::sort_summaries(&mut out);
        Ok(out)
    }

    async fn try_acquire(&self, key: &StateKey, ttl: Duration) -> Result<Option<Lease>> {
        let ttl = ttl.max(Duration::from_millis(1));
        let now = Instant::now();
        let token = uuid::Uuid::new_v4().to_string();
        let fence = {
            let mut leases = lock(&self.leases);
            let old = leases.get(key);
            if old.is_some_and(|l| !l.token.is_empty() && l.expiry > now) {
                return Ok(None);
            }
            let fence = old.map_or(1, |l| l.fence + 1);
            let entry = MemLease {
                token: token.clone(),
                fence,
                expiry: now + ttl,
            };
            leases.insert(key.clone(), entry);
            fence
        };
        let handle = MemoryLease {
            leases: self.leases.clone(),
            key: key.clone(),
            token: token.clone(),
        };
        let grant = LeaseGrant::new(token, fence, ttl, now);
        Ok(Some(Lease::new(key.clone(), grant, Arc::new(handle))))
    }

    fn is_shared(&self) -> bool {
        false
    }
}

#[derive(Debug)]
struct MemoryLease {
    leases: Leases,
    key: StateKey,
    token: String,
}

#[async_trait]
impl LeaseHandle for MemoryLease {
    async fn renew(&self, ttl: Duration) -> Result<()> {
        let now = Instant::now();
        let mut leases = lock(&self.leases);
        match leases.get_mut(&self.key) {
            Some(l) if l.token == self.token && l.expiry > now => {
                l.expiry = now + ttl;
                Ok(())
            }
            _ => Err(Error::lease_lost(&self.key)),
        }
    }

    async fn release(&self) -> Result<()> {
        if let Some(l) = lock(&self.leases).get_mut(&self.key)
            && l.token == self.token
        {
            l.token.clear();
            l.expiry = Instant::now();
        }
        Ok(())
    }
}

#[cfg(any(test, feature = "conformance"))]
#[async_trait]
impl crate::conformance::RawAccess for InMemoryStore {
    async fn put_raw(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
        self.put_raw_sync(key, state);
        Ok(())
    }
}
