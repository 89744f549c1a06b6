//! Redis specifics beyond the conformance suite, against a real server.

use std::time::Duration;

use crate::conformance::{service_url, unique_agent};
use crate::{Error, RedisOptions, RedisStore, Result, StateKey, StateStore};

/// A store with a fresh prefix, and a plain client to poke at its keys.
async fn store() -> Result<Option<(RedisStore, redis::aio::MultiplexedConnection, String)>> {
    let Some(url) = service_url("HAME_TEST_REDIS_URL")? else {
        return Ok(None);
    };
    let prefix = format!("hame-test:{}", uuid::Uuid::new_v4().simple());
    let store = RedisStore::connect(&url, RedisOptions::with_prefix(prefix.clone())).await?;
    let raw = redis::Client::open(url.as_str())
        .map_err(|e| Error::backend("redis", e))?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| Error::backend("redis", e))?;
    Ok(Some((store, raw, prefix)))
}

/// A lease written by an older hame (a `SET PX` string) is respected until it expires.
#[tokio::test]
async fn an_older_hames_lease_is_respected() -> Result<()> {
    let Some((store, mut raw, prefix)) = store().await? else {
        return Ok(());
    };
    let agent = unique_agent();
    let key = StateKey::new(&agent, Some("u1"), "s1")?;
    let () = redis::cmd("SET")
        .arg(format!("{prefix}:{{{agent}:u=u1}}:lease:s1"))
        .arg("old-token")
        .arg("PX")
        .arg(400)
        .query_async(&mut raw)
        .await
        .map_err(|e| Error::backend("redis", e))?;
    assert!(
        store
            .try_acquire(&key, Duration::from_secs(10))
            .await?
            .is_none()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lease = store.try_acquire(&key, Duration::from_secs(10)).await?;
    assert!(lease.is_some_and(|l| l.fence() == 1));
    Ok(())
}
