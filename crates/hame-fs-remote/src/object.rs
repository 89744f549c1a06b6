//! [`ObjectStoreFs`]: files as objects in S3, GCS, Azure, a local directory or memory.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt, stream};
use hame_fs::generic::{self, GrepSearch};
use hame_fs::{
    AppendOptions, DeleteOptions, EditOutcome, EditRequest, Error, FileInfo, FileKind, Filesystem,
    FsPath, GlobOutput, GlobRequest, GrepOutput, GrepRequest, ListRequest, Listing, RenameOptions,
    Result, Version, WriteMode, WriteOptions,
};
use object_store::path::Path;
use object_store::{
    ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
    UpdateVersion,
};
use tokio::sync::{Mutex, MutexGuard};

use crate::ObjectStoreOptions;
use crate::retry::backoff;

mod keys;

/// Stripes of the in-process lock used where the store has no conditional update.
const LOCK_STRIPES: usize = 64;
/// Retries of one request inside `object_store` (transient HTTP errors).
const REQUEST_RETRIES: usize = 3;
/// Total time `object_store` may spend retrying one request.
const REQUEST_RETRY_TIMEOUT: Duration = Duration::from_secs(30);

/// How compare-and-set is enforced.
enum Cas {
    /// The store's conditional writes (`PutMode::Create` / `PutMode::Update`): safe across
    /// processes and machines.
    Native,
    /// The store has create-only writes but no conditional update (a local directory):
    /// the striped in-process lock around read-check-write is all there is. Safe within
    /// one process.
    InProcess,
}

/// A filesystem stored in an object store.
///
/// Files are objects named `<url prefix>/<namespace>/<path>`, each path segment
/// percent-encoded where object stores or local file names would misread it (`%`, `#`,
/// `~`, `*`, `?`, `[`, `]`, `{`, `}`, `<`, `>`, `|`, `^`, `` ` ``, `"`, `\`, controls).
/// Directories are implicit: a directory exists while an object lies below it.
///
/// # Atomicity and compare-and-set
///
/// Every object put is atomic (readers see the old or the new object). [`WriteMode::CreateNew`]
/// is a conditional create (`If-None-Match: *` on S3, a hard link on a local directory).
/// [`WriteMode::IfMatch`] reads the object, compares the SHA-256 of its bytes, and writes with
/// `If-Match: <etag of what was read>`, so a concurrent change makes the write fail with
/// `conflict`. Object stores cannot append: `append` is read + conditional write, retried
/// with backoff up to [`ObjectStoreOptions::cas_retries`] times, O(file size) per call.
/// `edit` re-applies its replacement on the fresh content after a conflict, within the same
/// bound.
///
/// Compare-and-set, `append` and `edit` also take a striped lock held by this
/// `ObjectStoreFs`, so writers of one process never race each other. A local directory
/// (`file://`) has no conditional update: there that lock is all there is, which makes
/// them atomic within one process only. Share one instance per directory.
///
/// `rename` is copy-then-delete (a crash in between leaves both), and a directory `rename`
/// or recursive `delete` handles one object at a time. The file/directory checks
/// (`is_directory`, `not_a_directory`) are separate requests before the write, so two
/// writers creating `a` as a file and `a/b` at the same instant can both succeed.
pub struct ObjectStoreFs {
    store: Arc<dyn ObjectStore>,
    root: Path,
    cas: Cas,
    /// Striped locks around every read-check-write of this instance (compare-and-set,
    /// `append`, `edit`), with any `cas`: writers of one process never race each other,
    /// so they do not spend retries on conflicts, and a store whose conditional writes
    /// are weaker than advertised (moto's `If-Match` under concurrency) loses nothing
    /// written through one instance.
    stripes: Box<[Mutex<()>]>,
    options: ObjectStoreOptions,
    label: String,
}

impl fmt::Debug for ObjectStoreFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectStoreFs")
            .field("store", &self.label)
            .field("root", &self.root.as_ref())
            .field(
                "cas",
                &match self.cas {
                    Cas::Native => "conditional writes",
                    Cas::InProcess => "in-process lock",
                },
            )
            .finish_non_exhaustive()
    }
}

fn bad_url(url: &url::Url, why: impl fmt::Display) -> Error {
    Error::invalid_argument(format!(
        "invalid object store URL {}://{}: {why}",
        url.scheme(),
        url.host_str().unwrap_or("")
    ))
}

/// Refuses an S3 store with no credentials configured, before anything is sent: without
/// them the AWS credential chain falls back to the cloud instance-metadata endpoint
/// (169.254.169.254), which on any machine outside a cloud hangs and retries for a long
/// time. Instance credentials stay available to those who ask for them by setting a
/// metadata endpoint (`AWS_METADATA_ENDPOINT` / `aws_metadata_endpoint`).
fn require_s3_credentials(options: &ObjectStoreOptions) -> Result<()> {
    let config = |k: &str| {
        options
            .config
            .iter()
            .any(|(key, v)| key.eq_ignore_ascii_case(k) && !v.trim().is_empty())
    };
    let env = |k: &str| options.from_env && std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    let set = |k: &str| {
        config(&format!("aws_{k}")) || config(k) || env(&format!("AWS_{}", k.to_ascii_uppercase()))
    };
    let keys = set("access_key_id") && set("secret_access_key");
    let web_identity = set("web_identity_token_file") && set("role_arn");
    let container = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
        || env("AWS_CONTAINER_CREDENTIALS_FULL_URI")
        || config("aws_container_credentials_relative_uri");
    let unsigned = config("aws_skip_signature") || env("AWS_SKIP_SIGNATURE");
    let metadata = set("metadata_endpoint");
    if keys || web_identity || container || unsigned || metadata {
        return Ok(());
    }
    Err(Error::invalid_argument(
        "no S3 credentials configured: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
         (or AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN; or AWS_METADATA_ENDPOINT to use \
         instance credentials); hame never probes the cloud metadata endpoint on its own",
    ))
}

fn retry_config() -> RetryConfig {
    RetryConfig {
        max_retries: REQUEST_RETRIES,
        retry_timeout: REQUEST_RETRY_TIMEOUT,
        ..RetryConfig::default()
    }
}

/// Applies `options.config` to a builder through its config-key type.
macro_rules! configure {
    ($builder:expr, $key:ty, $url:expr, $options:expr) => {{
        let mut builder = $builder.with_url($url.as_str()).with_retry(retry_config());
        for (k, v) in &$options.config {
            let key: $key = k
                .to_ascii_lowercase()
                .parse()
                .map_err(|_| bad_url($url, format!("unknown configuration key {k:?}")))?;
            builder = builder.with_config(key, v.clone());
        }
        builder.build().map_err(|e| {
            Error::invalid_argument(format!("cannot configure the object store: {e}"))
        })?
    }};
}

impl ObjectStoreFs {
    /// Opens `url` and keeps files under `namespace`:
    ///
    /// * `s3://bucket[/prefix]` (also `s3a://`): endpoint, region and credentials from the
    ///   environment (when [`ObjectStoreOptions::from_env`]) and [`ObjectStoreOptions::config`]
    ///   (`aws_endpoint`, `aws_allow_http`, `aws_region`, ...). S3-compatible stores (OSS,
    ///   MinIO, R2, moto) are `s3://` with an endpoint; they must support conditional writes.
    /// * `gs://bucket[/prefix]`, `az://container[/prefix]` with the matching feature.
    /// * `file:///dir` (created when missing) and `memory://[prefix]`.
    ///
    /// No request is made here; the first operation reports an unreachable store.
    pub fn open(url: &str, namespace: &str, options: ObjectStoreOptions) -> Result<Self> {
        crate::validate_namespace(namespace)?;
        let parsed = url::Url::parse(url)
            .map_err(|e| Error::invalid_argument(format!("invalid object store URL: {e}")))?;
        let label = format!(
            "{}://{}",
            parsed.scheme(),
            parsed.host_str().unwrap_or_default()
        );
        let mut cas = Cas::Native;
        let (store, prefix): (Arc<dyn ObjectStore>, String) = match parsed.scheme() {
            "memory" => (
                Arc::new(object_store::memory::InMemory::new()),
                format!("{}{}", parsed.host_str().unwrap_or(""), parsed.path()),
            ),
            "file" => {
                let dir = parsed
                    .to_file_path()
                    .map_err(|()| bad_url(&parsed, "not a local directory path"))?;
                std::fs::create_dir_all(&dir)
                    .map_err(|e| Error::backend("cannot create the object store directory", e))?;
                let local = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(|e| Error::backend("cannot open the object store directory", e))?
                    .with_automatic_cleanup(true);
                cas = Cas::InProcess;
                (Arc::new(local), String::new())
            }
            "s3" | "s3a" => {
                let builder = if options.from_env {
                    object_store::aws::AmazonS3Builder::from_env()
                } else {
                    object_store::aws::AmazonS3Builder::new()
                };
                let s3 = configure!(
                    builder,
                    object_store::aws::AmazonS3ConfigKey,
                    &parsed,
                    options
                );
                // Building sends nothing; the first request would probe for credentials.
                require_s3_credentials(&options)?;
                (Arc::new(s3), parsed.path().to_owned())
            }
            #[cfg(feature = "object-store-gcp")]
            "gs" => {
                let builder = if options.from_env {
                    object_store::gcp::GoogleCloudStorageBuilder::from_env()
                } else {
                    object_store::gcp::GoogleCloudStorageBuilder::new()
                };
                let gcs = configure!(
                    builder,
                    object_store::gcp::GoogleConfigKey,
                    &parsed,
                    options
                );
                (Arc::new(gcs), parsed.path().to_owned())
            }
            #[cfg(feature = "object-store-azure")]
            "az" | "adl" | "azure" | "abfs" | "abfss" => {
                let builder = if options.from_env {
                    object_store::azure::MicrosoftAzureBuilder::from_env()
                } else {
                    object_store::azure::MicrosoftAzureBuilder::new()
                };
                let az = configure!(
                    builder,
                    object_store::azure::AzureConfigKey,
                    &parsed,
                    options
                );
                (Arc::new(az), parsed.path().to_owned())
            }
            other => {
                let feature = crate::feature_of(other).unwrap_or("object-store");
                return Err(Error::not_supported(
                    format!("opening a {other}:// object store"),
                    format!("hame-fs-remote was built without the `{feature}` feature"),
                ));
            }
        };
        let mut root = String::new();
        for seg in prefix.split('/').filter(|s| !s.is_empty()) {
            root.push_str(seg);
            root.push('/');
        }
        root.push_str(namespace);
        let root = Path::parse(&root).map_err(|e| bad_url(&parsed, e))?;
        tracing::debug!(store = %label, root = %root, "ObjectStoreFs opened");
        Ok(ObjectStoreFs {
            store,
            root,
            cas,
            stripes: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            options,
            label,
        })
    }

    fn key(&self, path: &FsPath) -> Result<Path> {
        if path.is_root() {
            return Ok(self.root.clone());
        }
        Path::parse(format!(
            "{}/{}",
            self.root.as_ref(),
            keys::encode_path(path)
        ))
        .map_err(|e| Error::InvalidPath {
            path: path.to_string(),
            reason: format!("not representable as an object key: {e}"),
        })
    }

    /// The virtual path of an object, when it lies below the root.
    fn virtual_path(&self, location: &Path) -> Option<FsPath> {
        let parts = location.prefix_match(&self.root)?;
        let mut out = String::new();
        for part in parts {
            let seg = keys::decode_segment(part.as_ref())?;
            out.push('/');
            out.push_str(&seg);
        }
        match FsPath::parse(&out) {
            Ok(p) if !p.is_root() => Some(p),
            _ => {
                tracing::warn!(object = %location, "skipping an object whose name is not a valid path");
                None
            }
        }
    }

    fn err(&self, op: &str, path: &FsPath, e: object_store::Error) -> Error {
        match e {
            object_store::Error::NotFound { .. } => Error::NotFound {
                path: path.to_string(),
            },
            object_store::Error::AlreadyExists { .. } => Error::AlreadyExists {
                path: path.to_string(),
            },
            object_store::Error::Precondition { .. } => Error::Conflict {
                path: path.to_string(),
                reason: "the object changed since it was read".into(),
            },
            e @ (object_store::Error::NotSupported { .. }
            | object_store::Error::NotImplemented { .. }) => Error::NotSupported {
                operation: op.to_owned(),
                reason: format!("{} does not support it: {e}", self.label),
            },
            e => Error::backend(format!("{op} of {path} on {} failed", self.label), e),
        }
    }

    async fn lock(&self, path: &FsPath) -> MutexGuard<'_, ()> {
        self.stripes[stripe(path, self.stripes.len())].lock().await
    }

    /// Locks two paths in a fixed order (one stripe when they share it).
    async fn lock2(&self, a: &FsPath, b: &FsPath) -> Vec<MutexGuard<'_, ()>> {
        let n = self.stripes.len();
        let (x, y) = (stripe(a, n), stripe(b, n));
        let mut idx = vec![x.min(y), x.max(y)];
        idx.dedup();
        let mut guards = Vec::with_capacity(2);
        for i in idx {
            guards.push(self.stripes[i].lock().await);
        }
        guards
    }

    async fn head(&self, path: &FsPath) -> Result<Option<ObjectMeta>> {
        if path.is_root() {
            return Ok(None);
        }
        match self.store.head(&self.key(path)?).await {
            Ok(m) => Ok(Some(m)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) if below_a_file(&e) => Ok(None),
            Err(e) => Err(self.err("stat", path, e)),
        }
    }

    /// Whether something lies below `path`.
    async fn has_children(&self, path: &FsPath) -> Result<bool> {
        let key = self.key(path)?;
        match self.store.list(Some(&key)).next().await {
            Some(Ok(_)) => Ok(true),
            None | Some(Err(object_store::Error::NotFound { .. })) => Ok(false),
            Some(Err(e)) if below_a_file(&e) => Ok(false),
            Some(Err(e)) => Err(self.err("list", path, e)),
        }
    }

    /// The nearest proper ancestor of `path` that is a file.
    async fn file_ancestor(&self, path: &FsPath) -> Result<Option<FsPath>> {
        let mut ancestors = Vec::new();
        let mut p = path.parent();
        while let Some(a) = p {
            if a.is_root() {
                break;
            }
            p = a.parent();
            ancestors.push(a);
        }
        let heads = futures::future::join_all(ancestors.iter().map(|a| self.head(a))).await;
        for (a, h) in ancestors.into_iter().zip(heads) {
            if h?.is_some() {
                return Ok(Some(a));
            }
        }
        Ok(None)
    }

    /// Fails unless a file may be created at `path`.
    async fn check_target(&self, path: &FsPath) -> Result<()> {
        if path.is_root() {
            return Err(Error::IsDirectory {
                path: path.to_string(),
            });
        }
        let (dir, ancestor) = tokio::join!(self.has_children(path), self.file_ancestor(path));
        if dir? {
            return Err(Error::IsDirectory {
                path: path.to_string(),
            });
        }
        if let Some(a) = ancestor? {
            return Err(Error::NotADirectory {
                path: a.to_string(),
            });
        }
        Ok(())
    }

    /// Content and the object's version, or `None` when absent.
    async fn get(&self, path: &FsPath) -> Result<Option<(Vec<u8>, UpdateVersion)>> {
        let key = self.key(path)?;
        let got = match self.store.get(&key).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) if below_a_file(&e) => return Ok(None),
            Err(e) => {
                if self.has_children(path).await.unwrap_or(false) {
                    return Err(Error::IsDirectory {
                        path: path.to_string(),
                    });
                }
                return Err(self.err("read", path, e));
            }
        };
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        match got.bytes().await {
            Ok(b) => Ok(Some((b.to_vec(), version))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err("read", path, e)),
        }
    }

    /// Content, or `file_not_found` / `is_directory`.
    async fn get_existing(&self, path: &FsPath) -> Result<(Vec<u8>, UpdateVersion)> {
        match self.get(path).await? {
            Some(v) => Ok(v),
            None if path.is_root() || self.has_children(path).await? => Err(Error::IsDirectory {
                path: path.to_string(),
            }),
            None => Err(Error::NotFound {
                path: path.to_string(),
            }),
        }
    }

    async fn put(&self, path: &FsPath, data: Vec<u8>, mode: PutMode) -> Result<()> {
        let key = self.key(path)?;
        self.store
            .put_opts(&key, PutPayload::from(data), PutOptions::from(mode))
            .await
            .map(|_| ())
            .map_err(|e| self.err("write", path, e))
    }

    /// Writes `data` if the object is still `current` (`None`: still absent).
    async fn put_if(
        &self,
        path: &FsPath,
        data: Vec<u8>,
        current: Option<UpdateVersion>,
    ) -> Result<()> {
        let mode = match (&self.cas, current) {
            (_, None) => PutMode::Create,
            // Under the in-process lock: nothing else in this process writes the path.
            (Cas::InProcess, Some(_)) => PutMode::Overwrite,
            (Cas::Native, Some(v)) => PutMode::Update(v),
        };
        match self.put(path, data, mode).await {
            // Deleted between read and write.
            Err(Error::NotFound { .. }) => Err(Error::Conflict {
                path: path.to_string(),
                reason: "the object was deleted since it was read".into(),
            }),
            Err(Error::AlreadyExists { .. }) => Err(Error::Conflict {
                path: path.to_string(),
                reason: "the object was created since it was read".into(),
            }),
            other => other,
        }
    }

    /// Every file strictly below `base` (all of it for the root), sorted by path.
    async fn walk(&self, base: &FsPath) -> Result<Vec<FileInfo>> {
        let key = self.key(base)?;
        let metas: Vec<ObjectMeta> = match self.store.list(Some(&key)).try_collect().await {
            Ok(m) => m,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(e) if below_a_file(&e) => Vec::new(),
            Err(e) => return Err(self.err("list", base, e)),
        };
        let mut out: Vec<FileInfo> = metas
            .into_iter()
            .filter_map(|m| {
                Some(FileInfo {
                    path: self.virtual_path(&m.location)?,
                    kind: FileKind::File,
                    size: m.size,
                    modified: Some(m.last_modified),
                })
            })
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Why nothing was listed below `path` (not the root): a file there, or nothing.
    async fn nothing_listed(&self, path: &FsPath) -> Result<Error> {
        let path_s = path.to_string();
        Ok(if self.head(path).await?.is_some() {
            Error::NotADirectory { path: path_s }
        } else {
            Error::NotFound { path: path_s }
        })
    }

    /// One listing of `list_many`: `list` (with a delimiter), or every object below.
    async fn listing(&self, request: &ListRequest) -> Result<Listing> {
        let path = &request.path;
        let entries = if request.recursive {
            let files = self.walk(path).await?;
            if files.is_empty() && !path.is_root() {
                return Err(self.nothing_listed(path).await?);
            }
            files
        } else {
            self.list(path).await?
        };
        Ok(request.answer(entries))
    }

    async fn delete_objects(&self, base: &FsPath, files: Vec<FileInfo>) -> Result<()> {
        let keys: Vec<Result<Path>> = files.iter().map(|f| self.key(&f.path)).collect();
        let keys: Vec<Path> = keys.into_iter().collect::<Result<_>>()?;
        let results: Vec<object_store::Result<Path>> = self
            .store
            .delete_stream(stream::iter(keys.into_iter().map(Ok)).boxed())
            .collect()
            .await;
        for r in results {
            match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.err("delete", base, e)),
            }
        }
        Ok(())
    }
}

/// Whether a local-directory error says a parent of the path is a file (`ENOTDIR`): for a
/// key-value view that just means "nothing there".
fn below_a_file(e: &object_store::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::NotADirectory;
        }
        source = s.source();
    }
    false
}

fn stripe(path: &FsPath, n: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    (h.finish() % n.max(1) as u64) as usize
}

#[async_trait]
impl Filesystem for ObjectStoreFs {
    async fn stat(&self, path: &FsPath) -> Result<FileInfo> {
        if path.is_root() {
            return Ok(FileInfo::dir(FsPath::root()));
        }
        if let Some(m) = self.head(path).await? {
            return Ok(FileInfo {
                path: path.clone(),
                kind: FileKind::File,
                size: m.size,
                modified: Some(m.last_modified),
            });
        }
        if self.has_children(path).await? {
            return Ok(FileInfo::dir(path.clone()));
        }
        Err(Error::NotFound {
            path: path.to_string(),
        })
    }

    async fn list(&self, path: &FsPath) -> Result<Vec<FileInfo>> {
        let key = self.key(path)?;
        let listed = match self.store.list_with_delimiter(Some(&key)).await {
            Ok(l) => Some(l),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) if below_a_file(&e) => None,
            Err(e) => return Err(self.err("list", path, e)),
        };
        let mut out = Vec::new();
        if let Some(l) = listed {
            for m in l.objects {
                if let Some(p) = self.virtual_path(&m.location) {
                    out.push(FileInfo {
                        path: p,
                        kind: FileKind::File,
                        size: m.size,
                        modified: Some(m.last_modified),
                    });
                }
            }
            for d in l.common_prefixes {
                if let Some(p) = self.virtual_path(&d) {
                    out.push(FileInfo::dir(p));
                }
            }
        }
        if out.is_empty() && !path.is_root() {
            return Err(self.nothing_listed(path).await?);
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out.dedup_by(|a, b| a.path == b.path);
        Ok(out)
    }

    async fn read_bytes(&self, path: &FsPath) -> Result<Vec<u8>> {
        self.get_existing(path).await.map(|(data, _)| data)
    }

    /// A range GET: a window of a large object moves only its bytes. A missing object, a
    /// directory, an empty object or an offset past the end (which stores answer with an
    /// error, 416 for S3) go the whole-read way, which names each case.
    async fn read_range(&self, path: &FsPath, offset: u64, len: u64) -> Result<Vec<u8>> {
        if len == 0 || path.is_root() {
            return generic::read_range_via_read(self, path, offset, len).await;
        }
        let key = self.key(path)?;
        let options = object_store::GetOptions {
            range: Some(object_store::GetRange::Bounded(
                offset..offset.saturating_add(len),
            )),
            ..object_store::GetOptions::default()
        };
        match self.store.get_opts(&key, options).await {
            Ok(got) => match got.bytes().await {
                Ok(b) => Ok(b.to_vec()),
                Err(e) => Err(self.err("read", path, e)),
            },
            Err(_) => generic::read_range_via_read(self, path, offset, len).await,
        }
    }

    async fn write(&self, path: &FsPath, data: Vec<u8>, options: WriteOptions) -> Result<Version> {
        self.check_target(path).await?;
        let version = Version::of(&data);
        let _guard = self.lock(path).await;
        match options.mode {
            WriteMode::Overwrite => self.put(path, data, PutMode::Overwrite).await?,
            WriteMode::CreateNew => self.put(path, data, PutMode::Create).await?,
            WriteMode::IfMatch(expected) => {
                let Some((current, tag)) = self.get(path).await? else {
                    return Err(Error::Conflict {
                        path: path.to_string(),
                        reason: "the file no longer exists".into(),
                    });
                };
                if Version::of(&current) != expected {
                    return Err(Error::Conflict {
                        path: path.to_string(),
                        reason: "the content is not the expected version".into(),
                    });
                }
                self.put_if(path, data, Some(tag)).await?;
            }
        }
        Ok(version)
    }

    async fn delete(&self, path: &FsPath, options: DeleteOptions) -> Result<()> {
        if path.is_root() {
            return Err(Error::PermissionDenied {
                path: path.to_string(),
                reason: "the root cannot be deleted".into(),
            });
        }
        if self.head(path).await?.is_some() {
            let _guard = self.lock(path).await;
            return self
                .store
                .delete(&self.key(path)?)
                .await
                .map_err(|e| self.err("delete", path, e));
        }
        let files = self.walk(path).await?;
        if files.is_empty() {
            return Err(Error::NotFound {
                path: path.to_string(),
            });
        }
        if !options.recursive {
            return Err(Error::IsDirectory {
                path: path.to_string(),
            });
        }
        self.delete_objects(path, files).await
    }

    async fn rename(&self, from: &FsPath, to: &FsPath, options: RenameOptions) -> Result<()> {
        if generic::rename_is_noop(self, from, to).await? {
            return Ok(());
        }
        if self.head(from).await?.is_some() {
            self.check_target(to).await?;
            let _guards = self.lock2(from, to).await;
            let (data, _) = self.get_existing(from).await?;
            let mode = if options.overwrite {
                PutMode::Overwrite
            } else {
                PutMode::Create
            };
            self.put(to, data, mode).await?;
            return self
                .store
                .delete(&self.key(from)?)
                .await
                .map_err(|e| self.err("delete", from, e));
        }
        let files = self.walk(from).await?;
        if files.is_empty() {
            return Err(Error::NotFound {
                path: from.to_string(),
            });
        }
        generic::check_directory_move(self, from, to).await?;
        if let Some(a) = self.file_ancestor(to).await? {
            return Err(Error::NotADirectory {
                path: a.to_string(),
            });
        }
        let concurrency = self.options.concurrency.max(1);
        let moves: Vec<(FsPath, FsPath)> = files
            .iter()
            .filter_map(|f| {
                let rel = f.path.strip_prefix(from)?;
                Some((f.path.clone(), to.join_path(&rel)))
            })
            .collect();
        stream::iter(moves)
            .map(|(src, dest)| async move {
                self.store
                    .copy(&self.key(&src)?, &self.key(&dest)?)
                    .await
                    .map_err(|e| self.err("copy", &src, e))
            })
            .buffer_unordered(concurrency)
            .try_collect::<Vec<()>>()
            .await?;
        self.delete_objects(from, files).await
    }

    async fn exists(&self, path: &FsPath) -> Result<bool> {
        if path.is_root() || self.head(path).await?.is_some() {
            return Ok(true);
        }
        self.has_children(path).await
    }

    /// Both durabilities alike: every object write is durable when the store acknowledges it.
    async fn append(&self, path: &FsPath, data: Vec<u8>, _: AppendOptions) -> Result<()> {
        self.check_target(path).await?;
        if data.is_empty() && self.head(path).await?.is_some() {
            // Nothing to add and nothing to flush: no read-modify-write of the object.
            return Ok(());
        }
        let attempts = self.options.cas_retries.max(1);
        for attempt in 0..attempts {
            backoff(attempt).await;
            let _guard = self.lock(path).await;
            let (mut content, tag) = match self.get(path).await? {
                Some((c, t)) => (c, Some(t)),
                None => (Vec::new(), None),
            };
            content.extend_from_slice(&data);
            match self.put_if(path, content, tag).await {
                Ok(()) => return Ok(()),
                Err(Error::Conflict { .. }) => {
                    tracing::debug!(%path, attempt, "append raced another writer; retrying");
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Conflict {
            path: path.to_string(),
            reason: format!("{attempts} append attempts raced other writers"),
        })
    }

    async fn edit(&self, path: &FsPath, request: &EditRequest) -> Result<EditOutcome> {
        generic::validate_edit(request)?;
        let attempts = self.options.cas_retries.max(1);
        for attempt in 0..attempts {
            backoff(attempt).await;
            let _guard = self.lock(path).await;
            let (data, tag) = self.get_existing(path).await?;
            let (new_data, replacements) = generic::edited(path, &data, request)?;
            let version = Version::of(&new_data);
            match self.put_if(path, new_data, Some(tag)).await {
                Ok(()) => {
                    return Ok(EditOutcome {
                        replacements,
                        version,
                    });
                }
                Err(Error::Conflict { .. }) => {
                    tracing::debug!(%path, attempt, "edit raced another writer; re-applying");
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Conflict {
            path: path.to_string(),
            reason: format!("{attempts} edit attempts raced other writers"),
        })
    }

    async fn grep(&self, request: &GrepRequest) -> Result<GrepOutput> {
        let search = GrepSearch::new(request)?;
        let files = generic::files_at(self, &request.path, self.walk(&request.path)).await?;
        let concurrency = self.options.concurrency;
        generic::grep_files(search, files, concurrency, |path| async move {
            self.read_bytes(&path).await
        })
        .await
    }

    async fn glob(&self, request: &GlobRequest) -> Result<GlobOutput> {
        generic::compile_glob(&request.pattern)?;
        let files = generic::files_at(self, &request.path, self.walk(&request.path)).await?;
        generic::glob_filter(request, files)
    }

    /// The listings side by side, [`ObjectStoreOptions::concurrency`] requests in flight:
    /// one round trip of latency for a batch. Object stores have no multi-prefix listing,
    /// so a batch is still one LIST request (or more, past 1,000 keys) per listing.
    async fn list_many(&self, requests: &[ListRequest]) -> Result<Vec<Result<Listing>>> {
        // Collected first, as in `download`: a closure inside the stream would need a
        // higher-ranked `Send` bound.
        let listings: Vec<_> = requests.iter().map(|r| self.listing(r)).collect();
        Ok(stream::iter(listings)
            .buffered(self.options.concurrency.max(1))
            .collect()
            .await)
    }
}
