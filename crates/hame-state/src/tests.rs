//! Backend test wiring: every backend runs the whole conformance suite.

mod memory_conf {
    use std::sync::Arc;

    use crate::{InMemoryStore, Result};

    async fn make() -> Result<Option<Arc<InMemoryStore>>> {
        Ok(Some(Arc::new(InMemoryStore::new())))
    }

    crate::conformance_tests!(make());
}

#[cfg(feature = "json")]
pub(crate) mod json_conf {
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;
    use hame_core::AgentState;

    use crate::conformance::RawAccess;
    use crate::{Error, JsonStore, Lease, Result, SessionSummary, StateKey, StateStore, Stored};

    /// A JSON store in a temp dir that is removed with the store.
    #[derive(Debug)]
    pub(crate) struct TempJson {
        pub(crate) store: JsonStore,
        pub(crate) _dir: tempfile::TempDir,
    }

    impl TempJson {
        pub(crate) fn new() -> Result<Self> {
            let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
            Ok(Self {
                store: JsonStore::open(dir.path())?,
                _dir: dir,
            })
        }
    }

    #[async_trait]
    impl StateStore for TempJson {
        async fn load(&self, key: &StateKey) -> Result<Option<Stored>> {
            self.store.load(key).await
        }
        async fn save(
            &self,
            key: &StateKey,
            state: &AgentState,
            expected: Option<u64>,
        ) -> Result<u64> {
            self.store.save(key, state, expected).await
        }
        async fn delete(&self, key: &StateKey) -> Result<bool> {
            self.store.delete(key).await
        }
        async fn list_sessions(
            &self,
            agent: &str,
            user: Option<&str>,
        ) -> Result<Vec<SessionSummary>> {
            self.store.list_sessions(agent, user).await
        }
        async fn try_acquire(&self, key: &StateKey, ttl: Duration) -> Result<Option<Lease>> {
            self.store.try_acquire(key, ttl).await
        }
        fn is_shared(&self) -> bool {
            self.store.is_shared()
        }
    }

    #[async_trait]
    impl RawAccess for TempJson {
        async fn put_raw(&self, key: &StateKey, state: serde_json::Value) -> Result<()> {
            self.store.put_raw(key, state).await
        }

        fn ttl_expires_live_holders(&self) -> bool {
            false
        }
    }

    async fn make() -> Result<Option<Arc<TempJson>>> {
        Ok(Some(Arc::new(TempJson::new()?)))
    }

    crate::conformance_tests!(make());
}

mod open_url;

#[cfg(feature = "redis")]
mod redis_conf {
    use std::sync::Arc;

    use crate::conformance::service_url;
    use crate::{RedisOptions, RedisStore, Result};

    async fn make() -> Result<Option<Arc<RedisStore>>> {
        let Some(url) = service_url("HAME_TEST_REDIS_URL")? else {
            return Ok(None);
        };
        // A per-test prefix on top of the suite's random agent ids.
        let prefix = format!("hame-test:{}", uuid::Uuid::new_v4().simple());
        Ok(Some(Arc::new(
            RedisStore::connect(&url, RedisOptions::with_prefix(prefix)).await?,
        )))
    }

    crate::conformance_tests!(make());
}

#[cfg(feature = "postgres")]
mod postgres_conf {
    use std::sync::Arc;

    use crate::conformance::service_url;
    use crate::{PostgresStore, Result, SqlOptions};

    async fn make() -> Result<Option<Arc<PostgresStore>>> {
        let Some(url) = service_url("HAME_TEST_POSTGRES_URL")? else {
            return Ok(None);
        };
        Ok(Some(Arc::new(
            PostgresStore::connect(&url, SqlOptions::default()).await?,
        )))
    }

    crate::conformance_tests!(make());
}

#[cfg(feature = "mysql")]
mod mysql_conf {
    use std::sync::Arc;

    use crate::conformance::service_url;
    use crate::{MySqlStore, Result, SqlOptions};

    async fn make() -> Result<Option<Arc<MySqlStore>>> {
        let Some(url) = service_url("HAME_TEST_MYSQL_URL")? else {
            return Ok(None);
        };
        Ok(Some(Arc::new(
            MySqlStore::connect(&url, SqlOptions::default()).await?,
        )))
    }

    crate::conformance_tests!(make());
}
