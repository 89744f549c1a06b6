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
        async fn put(&self, key: &StateKey, save: crate::Save<'_>) -> Result<u64> {
            self.store.put(key, save).await
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

        async fn set_raw_format(&self, key: &StateKey, format: u64) -> Result<bool> {
            self.store.set_raw_format(key, format).await
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

#[cfg(any(
    feature = "json",
    feature = "redis",
    feature = "postgres",
    feature = "mysql"
))]
mod lease_takeover;
mod open_url;
#[cfg(feature = "redis")]
mod redis_store;
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
mod secrets;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sql_store;

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

/// Compare-and-set against a reference model, on random operation sequences.
mod cas_model {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use crate::{InMemoryStore, Result, StateKey, StateStore};

    #[derive(Debug, Clone)]
    enum Op {
        Save { session: u8, expected: Option<u64> },
        Delete { session: u8 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..3, proptest::option::of(1u64..5))
                .prop_map(|(session, expected)| Op::Save { session, expected }),
            1 => (0u8..3).prop_map(|session| Op::Delete { session }),
        ]
    }

    async fn check(store: &dyn StateStore, ops: &[Op]) -> Result<()> {
        let mut model: HashMap<u8, u64> = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Save { session, expected } => {
                    let key = StateKey::new("model", Some("u"), format!("s{session}"))?;
                    let mut state = hame_core::AgentState::default();
                    state
                        .messages
                        .push(hame_core::Message::user(format!("op {i}")));
                    let got = store.save(&key, &state, expected).await;
                    let current = model.get(&session).copied();
                    if current == expected {
                        let v = got?;
                        assert_eq!(v, current.map_or(1, |c| c + 1), "op {i}: {op:?}");
                        model.insert(session, v);
                        let loaded = store.load(&key).await?.map(|s| (s.version, s.state));
                        assert_eq!(loaded, Some((v, state)));
                    } else {
                        assert!(
                            got.is_err_and(|e| e.is_conflict()),
                            "op {i}: {op:?} did not conflict"
                        );
                    }
                }
                Op::Delete { session } => {
                    let key = StateKey::new("model", Some("u"), format!("s{session}"))?;
                    assert_eq!(store.delete(&key).await?, model.remove(&session).is_some());
                }
            }
        }
        let mut listed: Vec<String> = store
            .list_sessions("model", Some("u"))
            .await?
            .into_iter()
            .map(|s| s.session)
            .collect();
        listed.sort();
        let mut expected: Vec<String> = model.keys().map(|s| format!("s{s}")).collect();
        expected.sort();
        assert_eq!(listed, expected);
        Ok(())
    }

    fn run(store: &dyn StateStore, ops: &[Op]) -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| crate::Error::Config(e.to_string()))?;
        rt.block_on(check(store, ops))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn memory_matches_model(ops in proptest::collection::vec(op(), 1..40)) {
            run(&InMemoryStore::new(), &ops).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }

        #[cfg(feature = "json")]
        #[test]
        fn json_matches_model(ops in proptest::collection::vec(op(), 1..25)) {
            let store = crate::tests::json_conf::TempJson::new()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            run(&store, &ops).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
    }
}

/// Every run queue runs the whole run-queue conformance suite.
mod run_queue_memory {
    use std::sync::Arc;

    use crate::Result;
    use crate::runs::InMemoryRunQueue;

    async fn make() -> Result<Option<Arc<InMemoryRunQueue>>> {
        Ok(Some(Arc::new(InMemoryRunQueue::new())))
    }

    crate::run_queue_tests!(make());
}

#[cfg(feature = "json")]
mod run_queue_json {
    use std::sync::Arc;

    use async_trait::async_trait;

    use crate::runs::{
        Beat, CancelOutcome, Claim, ClaimOptions, JsonRunQueue, NewRun, Run, RunEnd, RunFilter,
        RunQueue, Submitted,
    };
    use crate::{Error, Result};

    /// A JSON queue in a temp dir; every call opens a second handle on the same directory
    /// half of the time, as another process would.
    #[derive(Debug)]
    struct TempQueue {
        a: JsonRunQueue,
        b: JsonRunQueue,
        turn: std::sync::atomic::AtomicBool,
        _dir: tempfile::TempDir,
    }

    impl TempQueue {
        fn pick(&self) -> &JsonRunQueue {
            if self
                .turn
                .fetch_xor(true, std::sync::atomic::Ordering::Relaxed)
            {
                &self.a
            } else {
                &self.b
            }
        }
    }

    #[async_trait]
    impl RunQueue for TempQueue {
        async fn submit(&self, new: NewRun) -> Result<Submitted> {
            self.pick().submit(new).await
        }
        async fn submit_claimed(
            &self,
            new: NewRun,
            options: &ClaimOptions,
        ) -> Result<(Submitted, Option<Claim>)> {
            self.pick().submit_claimed(new, options).await
        }
        async fn get(&self, id: &str) -> Result<Option<Run>> {
            self.pick().get(id).await
        }
        async fn list(&self, filter: RunFilter<'_>) -> Result<Vec<Run>> {
            self.pick().list(filter).await
        }
        async fn claim(&self, options: &ClaimOptions) -> Result<Option<Claim>> {
            self.pick().claim(options).await
        }
        async fn heartbeat(&self, claim: &Claim) -> Result<Beat> {
            self.pick().heartbeat(claim).await
        }
        async fn finish(&self, claim: &Claim, end: &RunEnd) -> Result<Run> {
            self.pick().finish(claim, end).await
        }
        async fn cancel(&self, id: &str) -> Result<CancelOutcome> {
            self.pick().cancel(id).await
        }
        async fn decide(
            &self,
            key: &crate::StateKey,
            decision: &crate::runs::Decision,
            options: &ClaimOptions,
        ) -> Result<crate::runs::Decided> {
            self.pick().decide(key, decision, options).await
        }
        async fn purge_finished(
            &self,
            agent: &str,
            before: chrono::DateTime<chrono::Utc>,
            limit: usize,
        ) -> Result<usize> {
            self.pick().purge_finished(agent, before, limit).await
        }
        fn is_shared(&self) -> bool {
            false
        }
    }

    async fn make() -> Result<Option<Arc<TempQueue>>> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", e))?;
        Ok(Some(Arc::new(TempQueue {
            a: JsonRunQueue::open(dir.path())?,
            b: JsonRunQueue::open(dir.path())?,
            turn: std::sync::atomic::AtomicBool::new(false),
            _dir: dir,
        })))
    }

    crate::run_queue_tests!(make());
}

#[cfg(feature = "postgres")]
mod run_queue_postgres {
    use std::sync::Arc;

    use crate::conformance::service_url;
    use crate::runs::PgRunQueue;
    use crate::{Result, SqlOptions};

    async fn make() -> Result<Option<Arc<PgRunQueue>>> {
        let Some(url) = service_url("HAME_TEST_POSTGRES_URL")? else {
            return Ok(None);
        };
        Ok(Some(Arc::new(
            PgRunQueue::connect(&url, SqlOptions::default()).await?,
        )))
    }

    crate::run_queue_tests!(make());
}

#[cfg(feature = "mysql")]
mod run_queue_mysql {
    use std::sync::Arc;

    use crate::conformance::service_url;
    use crate::runs::MySqlRunQueue;
    use crate::{Result, SqlOptions};

    async fn make() -> Result<Option<Arc<MySqlRunQueue>>> {
        let Some(url) = service_url("HAME_TEST_MYSQL_URL")? else {
            return Ok(None);
        };
        Ok(Some(Arc::new(
            MySqlRunQueue::connect(&url, SqlOptions::default()).await?,
        )))
    }

    crate::run_queue_tests!(make());
}

#[cfg(feature = "redis")]
mod run_queue_redis {
    use std::sync::Arc;

    use crate::conformance::service_url;
    use crate::runs::RedisRunQueue;
    use crate::{RedisOptions, Result};

    async fn make() -> Result<Option<Arc<RedisRunQueue>>> {
        let Some(url) = service_url("HAME_TEST_REDIS_URL")? else {
            return Ok(None);
        };
        let prefix = format!("hame-test:{}", uuid::Uuid::new_v4().simple());
        Ok(Some(Arc::new(
            RedisRunQueue::connect(&url, RedisOptions::with_prefix(prefix)).await?,
        )))
    }

    crate::run_queue_tests!(make());
}

/// Every event log backend runs [`crate::events::conformance::check`] on its real service.
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
mod event_logs {
    use std::time::Duration;

    use crate::Result;
    use crate::conformance::service_url;
    use crate::events::{EventOptions, conformance, connect_event_log};

    async fn check(var: &str) -> Result<()> {
        let Some(url) = service_url(var)? else {
            return Ok(());
        };
        let ttl = Duration::from_secs(1);
        let unique = uuid::Uuid::new_v4().simple().to_string();
        let options = EventOptions {
            idle_ttl: ttl,
            prefix: format!("hame-test:{unique}"),
        };
        let log = connect_event_log(&url, options).await?;
        conformance::check(log.as_ref(), ttl, &unique).await
    }

    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn redis_event_log_conforms() -> Result<()> {
        check("HAME_TEST_REDIS_URL").await
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_event_log_conforms() -> Result<()> {
        check("HAME_TEST_POSTGRES_URL").await
    }

    #[cfg(feature = "mysql")]
    #[tokio::test]
    async fn mysql_event_log_conforms() -> Result<()> {
        check("HAME_TEST_MYSQL_URL").await
    }

    #[tokio::test]
    async fn an_event_log_url_of_another_kind_is_one_line() {
        let e = connect_event_log("s3://bucket/x", EventOptions::default())
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.ends_with("no event log for s3://bucket/x: use redis://, postgres:// or mysql://"),
            "{e}"
        );
    }
}
