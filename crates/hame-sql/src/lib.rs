//! The SQL connection pieces of hame's sqlx backends — `hame-state`'s PostgreSQL and MySQL
//! stores and `hame-memory`'s PostgreSQL index — so that every one of them says the same
//! thing, in one line and without the password, when it cannot reach its database:
//! `cannot connect to PostgreSQL at db.internal:5432: connection refused`.
//!
//! Who should depend on it: only crates that speak SQL through sqlx themselves. Its
//! signatures carry `sqlx` types — it is the glue of those backends, which keep `sqlx` out
//! of their own public API — not something applications use.
//!
//! It also keeps the pools those backends opened, by URL ([`share`], [`shared`]): a reader
//! of the same database (a SQL skill repository on the state store's database) uses the
//! state store's pool instead of opening its own.
//!
//! No features.
//!
//! ```
//! use std::time::Duration;
//!
//! assert_eq!(hame_sql::host_of("postgres://app:s3cret@db.internal:5432/hame?sslmode=require"), "db.internal:5432");
//! assert_eq!(hame_sql::host_of("mysql:///hame"), "localhost");
//! let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
//! assert_eq!(hame_sql::connect_cause(&refused, Duration::from_secs(5)), "connection refused");
//! assert_eq!(hame_sql::connect_cause(&sqlx::Error::PoolTimedOut, Duration::from_secs(5)), "no connection within 5 s");
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::time::Duration;

/// Where a database URL points: `host:port` (no user, no password, no path, no query);
/// `localhost` when the URL names no host.
pub fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() {
        "localhost".to_owned()
    } else {
        host.to_owned()
    }
}

/// The cause of a failed connection in a few words: "connection refused", the server's
/// own message ("password authentication failed for user …"), "no connection within …"
/// (`timeout` is the pool's acquire timeout).
pub fn connect_cause(e: &sqlx::Error, timeout: Duration) -> String {
    match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused".to_owned()
        }
        sqlx::Error::Io(io) => io.to_string(),
        sqlx::Error::Database(db) => db.message().to_owned(),
        sqlx::Error::PoolTimedOut => format!("no connection within {} s", timeout.as_secs()),
        sqlx::Error::Tls(t) => format!("TLS: {t}"),
        other => other.to_string(),
    }
}

/// The pools [`share`]d, by [`pool_key`]. A pool is dropped from here once closed.
static POOLS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, sqlx::AnyPool>>,
> = std::sync::LazyLock::new(Default::default);

/// The key of a database URL in the shared pools: the scheme's canonical name
/// (`postgresql` → `postgres`, `mariadb` → `mysql`), the rest as given.
pub fn pool_key(url: &str) -> String {
    let url = url.trim();
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let scheme = match scheme.to_ascii_lowercase().as_str() {
                "postgresql" => "postgres".to_owned(),
                "mariadb" => "mysql".to_owned(),
                other => other.to_owned(),
            };
            format!("{scheme}://{rest}")
        }
        None => url.to_owned(),
    }
}

/// Offers `pool` (opened on `url`) to the other readers of that database in this process.
/// The first pool shared for a URL stays until it is closed.
pub fn share(url: &str, pool: &sqlx::AnyPool) {
    if let Ok(mut pools) = POOLS.lock() {
        let key = pool_key(url);
        if pools.get(&key).is_none_or(sqlx::Pool::is_closed) {
            pools.insert(key, pool.clone());
        }
    }
}

/// The open pool a backend [`share`]d for `url`, if any.
pub fn shared(url: &str) -> Option<sqlx::AnyPool> {
    let mut pools = POOLS.lock().ok()?;
    let key = pool_key(url);
    match pools.get(&key) {
        Some(p) if !p.is_closed() => Some(p.clone()),
        Some(_) => {
            pools.remove(&key);
            None
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_keys_name_one_database_one_way() {
        assert_eq!(pool_key("postgresql://u@h/db"), "postgres://u@h/db");
        assert_eq!(pool_key("MariaDB://u@h/db"), "mysql://u@h/db");
        assert_eq!(pool_key(" mysql://u@h/db "), "mysql://u@h/db");
        assert!(shared("postgres://nobody@nowhere/none").is_none());
    }

    #[test]
    fn a_url_shows_only_its_host_and_port() {
        for (url, want) in [
            ("postgres://u:p@h:5432/db", "h:5432"),
            ("postgres://u:p@w@h/db", "h"),
            ("mysql://h:3306?ssl=1", "h:3306"),
            ("postgres:///db", "localhost"),
            ("h:1/db", "h:1"),
        ] {
            assert_eq!(host_of(url), want, "{url}");
        }
    }
}
