//! [`InMemoryStore`]: a process-local store for tests and throwaway sessions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use hame_core::AgentState;

use crate::error::{Error, Result};
use crate::key::StateKey;
use crate::store::{Lease, LeaseHandle, SessionSummary, StateStore, Stored};

#[derive(Debug, Clone)]
struct Doc {
    version: u64,
    json: Arc<serde_json::Value>,
    updated_at: DateTime<Utc>,
}

type Leases = Arc<Mutex<HashMap<StateKey, (String, Instant)>>>;

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

    async fn save(&self, key: &StateKey, state: &AgentState, expected: Option<u64>) -> Result<u64> {
        let json = Arc::new(serde_json::to_value(state).map_err(Error::Serialize)?);
        let mut docs = lock(&self.docs);
        let found = docs.get(key).map(|d| d.version);
        if found != expected {
            return Err(Error::Conflict {
                key: key.to_string(),
                expected,
                found,
            });
        }
        let version = found.map_or(1, |v| v + 1);
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
        {
            let mut leases = lock(&self.leases);
            if let Some((_, expiry)) = leases.get(key)
                && *expiry > now
            {
                return Ok(None);
            }
            leases.insert(key.clone(), (token.clone(), now + ttl));
        }
        let handle = MemoryLease {
            leases: self.leases.clone(),
            key: key.clone(),
            token: token.clone(),
        };
        Ok(Some(Lease::new(key.clone(), token, ttl, Arc::new(handle))))
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
            Some((token, expiry)) if *token == self.token && *expiry > now => {
                *expiry = now + ttl;
                Ok(())
            }
            _ => Err(Error::LeaseLost {
                key: self.key.to_string(),
            }),
        }
    }

    async fn release(&self) -> Result<()> {
        let mut leases = lock(&self.leases);
        if leases.get(&self.key).is_some_and(|(t, _)| *t == self.token) {
            leases.remove(&self.key);
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
