//! Redis specifics beyond the conformance suite, against a real server.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Drops the store's connection on the server side, as a Redis restart or a network blip
/// would (only this connection: other clients of the shared server are not touched).
async fn drop_connection(
    store: &RedisStore,
    raw: &mut redis::aio::MultiplexedConnection,
) -> Result<()> {
    let id = store.client_id().await?;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query_async(raw)
        .await
        .map_err(|e| Error::backend("redis", e))?;
    assert_eq!(killed, 1, "CLIENT KILL ID {id}");
    Ok(())
}

/// Every call rides out a dropped connection: it is retried once on a new one.
#[tokio::test]
async fn calls_ride_out_a_dropped_connection() -> Result<()> {
    let Some((store, mut raw, _)) = store().await? else {
        return Ok(());
    };
    let key = StateKey::new(unique_agent(), Some("u1"), "s1")?;
    let state = hame_core::AgentState::default();
    drop_connection(&store, &mut raw).await?;
    assert_eq!(store.save(&key, &state, None).await?, 1);
    drop_connection(&store, &mut raw).await?;
    assert_eq!(store.load(&key).await?.map(|s| s.version), Some(1));
    Ok(())
}

/// A TCP proxy in front of the real Redis that can "restart": cut every connection and
/// refuse new ones, then listen again on the same port.
struct Proxy {
    addr: std::net::SocketAddr,
    upstream: String,
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    async fn start(upstream: &str) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let proxy = Self {
            addr: listener.local_addr()?,
            upstream: upstream.to_owned(),
            tasks: Arc::default(),
        };
        proxy.serve(listener);
        Ok(proxy)
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let (upstream, tasks) = (self.upstream.clone(), self.tasks.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let pipe = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                lock(&tasks).push(pipe.abort_handle());
            }
        });
        lock(&self.tasks).push(accept.abort_handle());
    }

    /// Drops every connection and stops listening (new connections are refused).
    fn cut(&self) {
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
    }

    /// Listens again on the same address.
    fn restore(&self) -> std::io::Result<()> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind(self.addr)?;
        self.serve(socket.listen(64)?);
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `host:port` of a `redis://host:port/db` URL without credentials.
fn host_port(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    (!authority.contains('@')).then_some(authority)
}

async fn proxied_store() -> Result<Option<(RedisStore, Proxy)>> {
    let Some(url) = service_url("HAME_TEST_REDIS_URL")? else {
        return Ok(None);
    };
    let upstream = host_port(&url).ok_or_else(|| Error::Config(format!("unusable {url}")))?;
    let proxy = Proxy::start(upstream)
        .await
        .map_err(|e| Error::io("proxy", e))?;
    let prefix = format!("hame-test:{}", uuid::Uuid::new_v4().simple());
    let store = RedisStore::connect(
        &format!("redis://{}/", proxy.addr),
        RedisOptions::with_prefix(prefix),
    )
    .await?;
    Ok(Some((store, proxy)))
}

/// The case: Redis restarts for 1 s while a turn saves. The save waits for the
/// server and succeeds; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_second_restart_during_a_save_is_ridden_out() -> Result<()> {
    let Some((store, proxy)) = proxied_store().await? else {
        return Ok(());
    };
    let key = StateKey::new(unique_agent(), Some("u1"), "s1")?;
    let lease = store.acquire(&key, crate::LeaseOptions::default()).await?;
    let mut state = hame_core::AgentState::default();
    assert_eq!(store.save_fenced(&key, &state, None, &lease).await?, 1);

    proxy.cut();
    let restart = Instant::now();
    let back = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.restore()
    };
    state.messages.push(hame_core::Message::user("the answer"));
    let (saved, restored) = tokio::join!(store.save_fenced(&key, &state, Some(1), &lease), back);
    restored.map_err(|e| Error::io("proxy", e))?;
    assert_eq!(saved?, 2);
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "FIGURE redis: a save during a 1 s restart returned after {} ms",
            restart.elapsed().as_millis()
        );
    }
    let loaded = store.load(&key).await?.map(|s| (s.version, s.state));
    assert_eq!(loaded, Some((2, state)));
    lease.renew().await?;
    lease.release().await
}

/// A server that stays away: the call fails with the first failure (the broken
/// connection), not with the retry's "connection refused".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_retry_reports_the_first_failure() -> Result<()> {
    let Some((store, proxy)) = proxied_store().await? else {
        return Ok(());
    };
    let key = StateKey::new(unique_agent(), Some("u1"), "s1")?;
    let state = hame_core::AgentState::default();
    assert_eq!(store.save(&key, &state, None).await?, 1);
    proxy.cut();
    let err = store.save(&key, &state, Some(1)).await.err();
    let text = err
        .as_ref()
        .map(|e| format!("{e} / {e:?}"))
        .unwrap_or_default();
    assert!(
        matches!(err, Some(Error::Backend { .. })),
        "a save to a vanished server gave {err:?}"
    );
    assert!(!text.to_lowercase().contains("refused"), "{text}");
    #[allow(clippy::print_stderr)]
    {
        eprintln!("FIGURE redis: a save to a server that stays away fails with: {text}");
    }
    Ok(())
}
