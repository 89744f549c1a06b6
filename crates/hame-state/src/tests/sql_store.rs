//! PostgreSQL and MySQL specifics beyond the conformance suite, against real servers.

use crate::conformance::{service_url, unique_agent};
use crate::{Result, SqlDialect, SqlOptions, SqlStore, StateKey, StateStore};

/// The pool checks a connection before it hands it out, so a connection the server dropped
/// (a restart, a network blip, an idle timeout) between two calls is replaced unseen.
async fn rides_out_a_dropped_connection<D: SqlDialect>(url: &str) -> Result<()> {
    let one = SqlOptions {
        max_connections: 1,
        ..SqlOptions::default()
    };
    let store = SqlStore::<D>::connect(url, one).await?;
    let other = SqlStore::<D>::connect(url, SqlOptions::default()).await?;
    let key = StateKey::new(unique_agent(), Some("u1"), "s1")?;
    let state = hame_core::AgentState::default();
    assert_eq!(store.save(&key, &state, None).await?, 1);
    let session = store.session_id().await?;
    other.kill_session(session).await?;
    assert_eq!(store.load(&key).await?.map(|s| s.version), Some(1));
    assert_ne!(
        store.session_id().await?,
        session,
        "the dropped connection was reused"
    );
    assert_eq!(store.save(&key, &state, Some(1)).await?, 2);
    Ok(())
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_rides_out_a_dropped_connection() -> Result<()> {
    match service_url("HAME_TEST_POSTGRES_URL")? {
        Some(url) => rides_out_a_dropped_connection::<crate::Postgres>(&url).await,
        None => Ok(()),
    }
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_rides_out_a_dropped_connection() -> Result<()> {
    match service_url("HAME_TEST_MYSQL_URL")? {
        Some(url) => rides_out_a_dropped_connection::<crate::MySql>(&url).await,
        None => Ok(()),
    }
}
