//! Store credentials never appear in an error message or a `Debug` of this crate: a wrong
//! password, an unreachable port and a malformed URL, on every network backend, against the
//! real servers.

use std::error::Error as _;
use std::fmt::Debug;

#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
use crate::conformance::service_url;
use crate::{Error, Result};

/// The password every URL below carries; it must show nowhere.
const PW: &str = "hunter2-Zq9x";

/// Everything a caller could print of a connect result: `Display` and `Debug` of the error
/// and of each of its causes, or `Debug` of the store.
fn everything<T: Debug>(result: &Result<T>) -> String {
    match result {
        Ok(store) => format!("{store:?}"),
        Err(e) => {
            let mut text = format!("{e} | {e:?}");
            let mut next = e.source();
            while let Some(cause) = next {
                text.push_str(&format!(" | {cause} | {cause:?}"));
                next = cause.source();
            }
            text
        }
    }
}

fn assert_no_password<T: Debug>(what: &str, result: &Result<T>) {
    let text = everything(result);
    assert!(!text.contains(PW), "{what} shows the password: {text}");
    assert!(
        result.is_ok() || matches!(result, Err(Error::Backend { .. } | Error::Config(_))),
        "{what}: {text}"
    );
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{what}: {}", text.split(" | ").next().unwrap_or_default());
    }
}

/// `scheme://user:PW@host:port/rest` for the service URL's scheme, host and path.
fn with_password(url: &str, user: &str, port: Option<&str>) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let port = port.map_or_else(
        || authority.rsplit_once(':').map(|(_, p)| p.to_owned()),
        |p| Some(p.to_owned()),
    );
    let port = port.map(|p| format!(":{p}")).unwrap_or_default();
    Some(format!("{scheme}://{user}:{PW}@{host}{port}/{path}"))
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_errors_hide_the_password() -> Result<()> {
    use crate::{RedisOptions, RedisStore};
    let Some(url) = service_url("HAME_TEST_REDIS_URL")? else {
        return Ok(());
    };
    let wrong = with_password(&url, "", None).ok_or_else(|| Error::Config(url.clone()))?;
    let store = RedisStore::connect(&wrong, RedisOptions::default()).await;
    assert_no_password("redis, wrong password", &store);
    let user = with_password(&url, "nobody", None).ok_or_else(|| Error::Config(url.clone()))?;
    assert_no_password(
        "redis, unknown user",
        &RedisStore::connect(&user, RedisOptions::default()).await,
    );
    let closed = with_password(&url, "", Some("1")).ok_or_else(|| Error::Config(url.clone()))?;
    assert_no_password(
        "redis, closed port",
        &RedisStore::connect(&closed, RedisOptions::default()).await,
    );
    let bad = format!("redis://:{PW}@127.0.0.1:99999999/");
    assert_no_password("redis, malformed URL", &crate::open(&bad).await);
    Ok(())
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn sql_errors_hide_the_password<D: crate::SqlDialect>(
    name: &str,
    url: &str,
    user: &str,
) -> Result<()> {
    use std::time::Duration;

    use crate::{SqlOptions, SqlStore};
    let quick = SqlOptions {
        acquire_timeout: Duration::from_secs(3),
        ..SqlOptions::default()
    };
    let wrong = with_password(url, user, None).ok_or_else(|| Error::Config(url.to_owned()))?;
    let store = SqlStore::<D>::connect(&wrong, quick.clone()).await;
    assert_no_password(&format!("{name}, wrong password"), &store);
    let closed =
        with_password(url, user, Some("1")).ok_or_else(|| Error::Config(url.to_owned()))?;
    assert_no_password(
        &format!("{name}, closed port"),
        &SqlStore::<D>::connect(&closed, quick.clone()).await,
    );
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    let bad = format!("{scheme}://{user}:{PW}@127.0.0.1:notaport/db");
    assert_no_password(
        &format!("{name}, malformed URL"),
        &SqlStore::<D>::connect(&bad, quick).await,
    );
    // A store that did connect shows its URL redacted.
    let good = SqlStore::<D>::connect(url, SqlOptions::default()).await?;
    let shown = format!("{good:?}");
    assert!(
        shown.contains(":***@") || !url.contains('@'),
        "{name} store Debug: {shown}"
    );
    Ok(())
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_errors_hide_the_password() -> Result<()> {
    match service_url("HAME_TEST_POSTGRES_URL")? {
        Some(url) => {
            sql_errors_hide_the_password::<crate::Postgres>("postgres", &url, "postgres").await
        }
        None => Ok(()),
    }
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_errors_hide_the_password() -> Result<()> {
    match service_url("HAME_TEST_MYSQL_URL")? {
        Some(url) => sql_errors_hide_the_password::<crate::MySql>("mysql", &url, "test").await,
        None => Ok(()),
    }
}
