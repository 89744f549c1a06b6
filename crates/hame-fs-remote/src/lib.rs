//! # hame-fs-remote
//!
//! Shared-store backends for the [`hame_fs::Filesystem`] trait, for agents whose files must
//! outlive one process or be shared by several replicas:
//!
//! * `RedisFs` keeps each file as a Redis string with a directory index beside it.
//!   `append` is a native `APPEND`; compare-and-set, `edit` and `rename` are single Lua
//!   scripts, so two replicas editing one file never lose an update.
//! * `ObjectStoreFs` keeps each file as an object (S3 and S3-compatible stores such as OSS,
//!   MinIO or moto; GCS; Azure; a local directory; memory) and uses the store's conditional
//!   writes (`If-None-Match: *`, `If-Match: <etag>`) for create-new and compare-and-set.
//!
//! Every file lives under a **namespace** (a tenant, a user, a session): two filesystems
//! opened with different namespaces on one store never see each other's files.
//!
//! Depend on this crate when you deploy the harness with shared storage; [`open`] builds a
//! filesystem from a URL. Both backends run the whole `hame_fs::conformance` suite.
//! The error type is [`hame_fs::Error`] (re-exported as [`Error`]): a backend returns the
//! trait's own error, so callers branch on the same stable codes everywhere.
//!
//! | feature | what it adds |
//! |---|---|
//! | (none) | [`open`], [`OpenOptions`], [`validate_namespace`]; every URL is refused with the feature it needs |
//! | `redis` | `RedisFs` (`redis://`, `rediss://` needs the TLS feature of `redis`) |
//! | `object-store` | `ObjectStoreFs` for `s3://`, `s3a://`, `file://`, `memory://` |
//! | `object-store-gcp` | `gs://` for `ObjectStoreFs` |
//! | `object-store-azure` | `az://`, `abfs://`, `abfss://`, `azure://` for `ObjectStoreFs` |
//!
//! ```
//! # async fn demo() -> hame_fs::Result<()> {
//! use hame_fs::{AppendOptions, Filesystem, FsPath, WriteOptions};
//!
//! // Without the matching feature the URL is refused with the feature's name.
//! match hame_fs_remote::open("memory://", "tenant-a").await {
//!     Ok(fs) => {
//!         let path = FsPath::parse("/notes/today.md")?;
//!         fs.write(&path, b"# Today\n".to_vec(), WriteOptions::default()).await?;
//!         fs.append(&path, b"- shipped\n".to_vec(), AppendOptions::default()).await?;
//!         assert_eq!(fs.read_bytes(&path).await?, b"# Today\n- shipped\n");
//!     }
//!     Err(e) => assert_eq!(e.code(), hame_fs::codes::NOT_SUPPORTED),
//! }
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hame_fs::Filesystem;
pub use hame_fs::{Error, Result};

#[cfg(feature = "object-store")]
mod object;
#[cfg(feature = "redis")]
mod redis_fs;
#[cfg(any(feature = "redis", feature = "object-store"))]
mod retry;

#[cfg(feature = "object-store")]
pub use object::ObjectStoreFs;
#[cfg(feature = "redis")]
pub use redis_fs::RedisFs;

/// Longest namespace, in bytes.
pub const MAX_NAMESPACE_BYTES: usize = hame_id::MAX_ID_LEN;

/// Checks a namespace with the one id rule of [`hame_id::validate`]: 1 to
/// [`MAX_NAMESPACE_BYTES`] bytes of ASCII letters, digits, `-`, `_`, `.` and `@`, not starting
/// with `.`, without `..`. The narrow alphabet keeps a namespace one segment of an object
/// key and one Redis hash tag, so no namespace can be a prefix path of another.
pub fn validate_namespace(namespace: &str) -> Result<()> {
    hame_id::validate("namespace", namespace)
        .map(|_| ())
        .map_err(|e| Error::invalid_argument(e.to_string()))
}

/// Options of the Redis backend.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisOptions {
    /// Time to open a connection (also each reconnect attempt). Default 5 s.
    pub connect_timeout: Duration,
    /// Time to wait for one reply. Default 10 s.
    pub response_timeout: Duration,
    /// Reconnect attempts after the connection drops. Default 3.
    pub reconnect_retries: usize,
    /// `COUNT` hint of `ZSCAN` and page size of index range reads. Default 1000.
    pub scan_count: usize,
    /// Attempts of `edit` (re-applied on the fresh content) before it reports `conflict`.
    /// Default 16.
    pub edit_retries: usize,
    /// First part of every key: `<key_prefix>:{<namespace>}:`. Default `hame`.
    pub key_prefix: String,
    /// How long a command whose connection broke (a restart, a dropped link) is sent
    /// again on the re-established connection, pausing 50 ms doubling to 1 s
    /// (`hame_redis::RetryPolicy`); zero sends every command once. Writes carry a write id,
    /// so a retry never applies one twice. Default 10 s.
    pub retry_window: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            reconnect_retries: 3,
            scan_count: 1000,
            edit_retries: 16,
            key_prefix: "hame".into(),
            retry_window: Duration::from_secs(10),
        }
    }
}

/// Options of the object-store backend.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectStoreOptions {
    /// Store configuration, as `object_store` keys (`aws_endpoint`, `aws_access_key_id`,
    /// `aws_secret_access_key`, `aws_region`, `aws_allow_http`,
    /// `aws_virtual_hosted_style_request`, `google_service_account`, `azure_storage_account_name`,
    /// ...). Unknown keys are refused. Applied after the environment.
    pub config: BTreeMap<String, String>,
    /// Read `AWS_*` / `GOOGLE_*` / `AZURE_*` variables from the environment first. Default
    /// `true`.
    pub from_env: bool,
    /// Attempts of `append` and `edit` (read + conditional write) before `conflict`.
    /// Default 64.
    pub cas_retries: usize,
    /// Requests in flight at once for batch reads, copies and deletes. Default 8.
    pub concurrency: usize,
}

impl Default for ObjectStoreOptions {
    fn default() -> Self {
        ObjectStoreOptions {
            config: BTreeMap::new(),
            from_env: true,
            cas_retries: 64,
            concurrency: 8,
        }
    }
}

impl ObjectStoreOptions {
    /// Sets one configuration key (builder style).
    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.insert(key.into(), value.into());
        self
    }
}

/// Options of [`open_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenOptions {
    /// Used for `redis://` URLs.
    pub redis: RedisOptions,
    /// Used for object-store URLs.
    pub object_store: ObjectStoreOptions,
}

/// Opens a shared filesystem from a URL with default options; see [`open_with`].
pub async fn open(url: &str, namespace: &str) -> Result<Arc<dyn Filesystem>> {
    open_with(url, namespace, &OpenOptions::default()).await
}

/// Which backend (and feature) a URL scheme needs.
fn feature_of(scheme: &str) -> Option<&'static str> {
    match scheme {
        "redis" | "rediss" | "redis+unix" | "unix" => Some("redis"),
        "s3" | "s3a" | "file" | "memory" => Some("object-store"),
        "gs" => Some("object-store-gcp"),
        "az" | "adl" | "azure" | "abfs" | "abfss" => Some("object-store-azure"),
        _ => None,
    }
}

/// Opens a shared filesystem from a URL.
///
/// * `redis://[user:password@]host[:port][/db]` → `RedisFs` (feature `redis`);
/// * `s3://bucket[/prefix]`, `file:///dir`, `memory://` → `ObjectStoreFs` (feature
///   `object-store`); `gs://` and `az://` need `object-store-gcp` / `object-store-azure`.
///
/// Files are kept under `namespace` (see [`validate_namespace`]). A scheme whose feature
/// is not compiled in gives `not_supported` naming the feature; an unknown scheme gives
/// `invalid_arguments`; an unreachable server gives `backend_error` within the connect
/// timeout.
pub async fn open_with(
    url: &str,
    namespace: &str,
    options: &OpenOptions,
) -> Result<Arc<dyn Filesystem>> {
    validate_namespace(namespace)?;
    let scheme = url
        .split_once("://")
        .map(|(s, _)| s)
        .or_else(|| url.split_once(':').map(|(s, _)| s))
        .unwrap_or("")
        .to_ascii_lowercase();
    let Some(feature) = feature_of(&scheme) else {
        return Err(Error::invalid_argument(format!(
            "unsupported filesystem URL scheme {scheme:?}; use redis://, s3://, gs://, az://, file:// or memory://"
        )));
    };
    let _ = options;
    match feature {
        #[cfg(feature = "redis")]
        "redis" => Ok(Arc::new(
            RedisFs::connect(url, namespace, options.redis.clone()).await?,
        )),
        #[cfg(feature = "object-store")]
        "object-store" => Ok(Arc::new(ObjectStoreFs::open(
            url,
            namespace,
            options.object_store.clone(),
        )?)),
        #[cfg(feature = "object-store-gcp")]
        "object-store-gcp" => Ok(Arc::new(ObjectStoreFs::open(
            url,
            namespace,
            options.object_store.clone(),
        )?)),
        #[cfg(feature = "object-store-azure")]
        "object-store-azure" => Ok(Arc::new(ObjectStoreFs::open(
            url,
            namespace,
            options.object_store.clone(),
        )?)),
        other => Err(Error::not_supported(
            format!("opening a {scheme}:// filesystem"),
            format!("hame-fs-remote was built without the `{other}` feature"),
        )),
    }
}

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
