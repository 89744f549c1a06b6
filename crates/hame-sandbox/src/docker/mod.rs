//! The Docker backend: [`DockerSandboxes`] through bollard (no docker CLI).

mod exec;
mod fs;
mod image;
mod scripts;
mod server;
mod state;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
};
use hame_fs::Filesystem;

pub use image::{BUSYBOX_CANDIDATES, DEFAULT_IMAGE, find_busybox};

use crate::api::{Sandboxes, ScopeSandbox};
use crate::error::{Error, Result};
use crate::plan::Manifest;

/// Label on every container hame starts.
pub const LABEL: &str = "hame.sandbox";
/// Label naming the process that owns a container (`<pid>:<start time>`), so a later run
/// can remove the containers of a process that died without cleaning up.
pub const OWNER_LABEL: &str = "hame.sandbox.owner";
/// Label holding the container's scope key.
pub const SCOPE_LABEL: &str = "hame.sandbox.scope";

/// The user commands and file operations run as inside the container.
pub const SANDBOX_USER: &str = "1000:1000";

/// Settings of the Docker sandbox; every default is in `docs/sandbox.md`.
#[derive(Debug, Clone, PartialEq)]
pub struct DockerOptions {
    /// The image. Default [`DEFAULT_IMAGE`], built offline when missing.
    pub image: String,
    /// A static busybox for building the default image (default: the first of
    /// [`BUSYBOX_CANDIDATES`]).
    pub busybox: Option<PathBuf>,
    /// Give the container a network (`bridge`). Default `false`: network `none`.
    pub network: bool,
    /// Memory limit, bytes (swap included). Default 2 GiB.
    pub memory_bytes: i64,
    /// CPUs. Default 1.0.
    pub cpus: f64,
    /// Most processes at once. Default 256.
    pub pids: i64,
    /// Size of the `/workspace` tmpfs, bytes (counts toward memory). Default 1 GiB.
    pub workspace_bytes: u64,
    /// Size of the `/tmp` tmpfs, bytes. Default 256 MiB.
    pub tmp_bytes: u64,
    /// How long an idle container is kept warm. Default 5 min.
    pub idle_ttl: Duration,
    /// Command timeout when a request gives none. Default 120 s.
    pub default_timeout: Duration,
    /// Longest command timeout. Default 600 s.
    pub max_timeout: Duration,
    /// Output kept per command (stdout + stderr), bytes. Default 100,000.
    pub max_output_bytes: usize,
    /// Between `SIGTERM` and `SIGKILL` of a command's process group. Default 500 ms.
    pub kill_grace: Duration,
}

impl Default for DockerOptions {
    fn default() -> Self {
        Self {
            image: DEFAULT_IMAGE.to_owned(),
            busybox: None,
            network: false,
            memory_bytes: 2 << 30,
            cpus: 1.0,
            pids: 256,
            workspace_bytes: 1 << 30,
            tmp_bytes: 256 << 20,
            idle_ttl: Duration::from_secs(300),
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(600),
            max_output_bytes: 100_000,
            kill_grace: Duration::from_millis(500),
        }
    }
}

/// The create request of a sandbox container: the security defaults in one place (a pure
/// function, unit-tested without an engine).
pub(crate) fn container_body(
    options: &DockerOptions,
    labels: HashMap<String, String>,
) -> ContainerCreateBody {
    let tmpfs = HashMap::from([
        (
            "/workspace".to_owned(),
            format!(
                "rw,exec,nosuid,nodev,size={},uid=1000,gid=1000,mode=0755",
                options.workspace_bytes
            ),
        ),
        (
            "/tmp".to_owned(),
            format!(
                "rw,exec,nosuid,nodev,size={},uid=1000,gid=1000,mode=1777",
                options.tmp_bytes
            ),
        ),
    ]);
    let host = HostConfig {
        network_mode: Some(if options.network { "bridge" } else { "none" }.to_owned()),
        memory: Some(options.memory_bytes),
        memory_swap: Some(options.memory_bytes),
        nano_cpus: Some((options.cpus * 1e9) as i64),
        pids_limit: Some(options.pids),
        readonly_rootfs: Some(true),
        cap_drop: Some(vec!["ALL".to_owned()]),
        security_opt: Some(vec!["no-new-privileges:true".to_owned()]),
        tmpfs: Some(tmpfs),
        init: Some(true),
        privileged: Some(false),
        ipc_mode: Some("private".to_owned()),
        binds: None,
        mounts: None,
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(options.image.clone()),
        entrypoint: Some(vec!["sleep".to_owned()]),
        cmd: Some(vec!["2147483647".to_owned()]),
        user: Some(SANDBOX_USER.to_owned()),
        working_dir: Some("/workspace".to_owned()),
        env: Some(exec::base_env()),
        labels: Some(labels),
        network_disabled: Some(!options.network),
        host_config: Some(host),
        ..Default::default()
    }
}

/// `<pid>:<start time>` of a process, from `/proc` (the start time tells a reused pid
/// apart).
fn owner_of(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    // Fields after the command: state is field 3, starttime field 22.
    let start = rest.split_whitespace().nth(19)?;
    Some(format!("{pid}:{start}"))
}

/// Whether the owner label names a live process.
fn owner_alive(label: &str) -> bool {
    let Some(pid) = label.split(':').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    owner_of(pid).as_deref() == Some(label)
}

pub(crate) struct Shared {
    docker: Docker,
    options: DockerOptions,
    snapshots: Arc<dyn Filesystem>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    owner: String,
    counter: AtomicU64,
    closed: AtomicBool,
    /// Idle command servers per container id.
    servers: Mutex<HashMap<String, Vec<server::Server>>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("image", &self.options.image)
            .field("owner", &self.owner)
            .finish()
    }
}

/// One scope's container (when running) and its bookkeeping.
#[derive(Debug)]
pub(crate) struct Slot {
    key: String,
    live: tokio::sync::Mutex<Option<Arc<Live>>>,
    active: AtomicUsize,
    last_used: Mutex<Instant>,
}

impl Slot {
    fn touch(&self) {
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }
}

/// A running container.
#[derive(Debug)]
pub(crate) struct Live {
    id: String,
    /// The manifest of the last snapshot (or restore) of this container.
    manifest: tokio::sync::Mutex<Manifest>,
}

/// The Docker sandboxes of one agent (see [`Sandboxes`]). Cheap to clone.
///
/// ```no_run
/// # async fn demo() -> hame_sandbox::Result<()> {
/// use std::sync::Arc;
/// use hame_fs::{Execute, ExecRequest, Filesystem, FsPath, LocalFs, WriteOptions};
/// use hame_sandbox::{DockerOptions, DockerSandboxes, Sandboxes};
///
/// let snapshots = Arc::new(LocalFs::new("/tmp/hame-snapshots").map_err(hame_sandbox::Error::from)?);
/// let sandboxes = DockerSandboxes::connect(DockerOptions::default(), snapshots).await?;
/// sandboxes.ensure_image().await?; // builds the default image offline when missing
/// let sandbox = sandboxes.scope("agents/hame/users/alice/home");
/// sandbox.begin(Vec::new()).await?;
/// sandbox.write(&FsPath::parse("notes.txt")?, b"hi\n".to_vec(), WriteOptions::default()).await?;
/// let out = sandbox.execute(ExecRequest { command: "cat notes.txt".into(), timeout: None }).await?;
/// assert_eq!(out.output, "hi\n");
/// sandbox.end().await?; // incremental snapshot of /workspace
/// sandboxes.shutdown().await; // no container outlives this
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct DockerSandboxes {
    shared: Arc<Shared>,
}

impl DockerSandboxes {
    /// Connects to the local engine (`DOCKER_HOST` or the default socket), negotiates the
    /// API version, removes containers left by hame processes that died, and starts the
    /// idle reaper. Snapshots go to `snapshots` (a directory, S3 or Redis filesystem).
    /// [`Error::Unavailable`] when the engine does not answer.
    pub async fn connect(options: DockerOptions, snapshots: Arc<dyn Filesystem>) -> Result<Self> {
        let unavailable = |e: bollard::errors::Error| Error::Unavailable {
            message: e.to_string(),
        };
        let docker = Docker::connect_with_local_defaults().map_err(unavailable)?;
        let docker = tokio::time::timeout(Duration::from_secs(10), docker.negotiate_version())
            .await
            .map_err(|_| Error::Unavailable {
                message: "no answer within 10 s".into(),
            })?
            .map_err(unavailable)?;
        docker.ping().await.map_err(unavailable)?;
        let owner = owner_of(std::process::id()).unwrap_or_else(|| std::process::id().to_string());
        let shared = Arc::new(Shared {
            docker,
            options,
            snapshots,
            slots: Mutex::new(HashMap::new()),
            owner,
            counter: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            servers: Mutex::new(HashMap::new()),
        });
        let this = Self { shared };
        this.reap_orphans().await;
        spawn_reaper(Arc::downgrade(&this.shared));
        Ok(this)
    }

    /// The settings.
    pub fn options(&self) -> &DockerOptions {
        &self.shared.options
    }

    /// Makes sure the image exists: the default image is built offline when missing
    /// (from a static busybox, see [`find_busybox`]); another image must already be in the
    /// engine (no registry pull). Returns the image name.
    pub async fn ensure_image(&self) -> Result<String> {
        let image = &self.shared.options.image;
        if self.shared.docker.inspect_image(image).await.is_ok() {
            return Ok(image.clone());
        }
        if image != DEFAULT_IMAGE {
            return Err(Error::Image(format!(
                "image {image} is not in the Docker engine; load or build it first (hame never pulls)"
            )));
        }
        self.build_image().await
    }

    /// (Re)builds [`DEFAULT_IMAGE`] offline.
    pub async fn build_image(&self) -> Result<String> {
        let busybox = find_busybox(self.shared.options.busybox.as_deref())?;
        tracing::info!(busybox = %busybox.display(), "building {DEFAULT_IMAGE}");
        image::build(&self.shared.docker, &busybox).await
    }

    /// The containers this value runs now (ids), for tests and diagnostics.
    pub async fn running(&self) -> Vec<String> {
        let slots: Vec<Arc<Slot>> = self.shared.slot_list();
        let mut ids = Vec::new();
        for slot in slots {
            if let Some(live) = slot.live.lock().await.as_ref() {
                ids.push(live.id.clone());
            }
        }
        ids
    }

    /// Removes the containers of hame processes that are gone (found by [`OWNER_LABEL`]).
    /// Returns how many were removed.
    pub async fn reap_orphans(&self) -> usize {
        let filters = HashMap::from([("label".to_owned(), vec![LABEL.to_owned()])]);
        let list = self
            .shared
            .docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .unwrap_or_default();
        let mut removed = 0;
        for c in list {
            let owner = c
                .labels
                .as_ref()
                .and_then(|l| l.get(OWNER_LABEL))
                .cloned()
                .unwrap_or_default();
            if owner == self.shared.owner || owner_alive(&owner) {
                continue;
            }
            if let Some(id) = c.id {
                self.shared.remove(&id).await;
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(removed, "removed sandbox containers of dead hame processes");
        }
        removed
    }
}

impl Shared {
    fn slot_list(&self) -> Vec<Arc<Slot>> {
        self.slots
            .lock()
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default()
    }

    fn slot(&self, key: &str) -> Arc<Slot> {
        let mut slots = match self.slots.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        slots
            .entry(key.to_owned())
            .or_insert_with(|| {
                Arc::new(Slot {
                    key: key.to_owned(),
                    live: tokio::sync::Mutex::new(None),
                    active: AtomicUsize::new(0),
                    last_used: Mutex::new(Instant::now()),
                })
            })
            .clone()
    }

    async fn remove(&self, id: &str) {
        self.forget_servers(id);
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        if let Err(e) = self.docker.remove_container(id, Some(options)).await {
            tracing::warn!(container = id, error = %e, "removing a sandbox container failed");
        }
    }

    /// Starts a container for `slot`.
    async fn start(&self, slot: &Slot) -> Result<String> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Config("the sandboxes were shut down".into()));
        }
        let n = self.counter.fetch_add(1, Ordering::SeqCst);
        let name = format!("hame-sbx-{}-{n}", std::process::id());
        let labels = HashMap::from([
            (LABEL.to_owned(), "1".to_owned()),
            (OWNER_LABEL.to_owned(), self.owner.clone()),
            (SCOPE_LABEL.to_owned(), slot.key.clone()),
        ]);
        let body = container_body(&self.options, labels);
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name),
                    ..Default::default()
                }),
                body,
            )
            .await
            .map_err(|e| match &e {
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                } => Error::Image(format!(
                    "image {} is not in the Docker engine (run `hame sandbox image`)",
                    self.options.image
                )),
                _ => Error::backend("creating the sandbox container failed", e),
            })?;
        if let Err(e) = self.docker.start_container(&created.id, None).await {
            self.remove(&created.id).await;
            return Err(Error::backend("starting the sandbox container failed", e));
        }
        Ok(created.id)
    }

    async fn running(&self, id: &str) -> bool {
        match self.docker.inspect_container(id, None).await {
            Ok(c) => c.state.and_then(|s| s.running).unwrap_or(false),
            Err(_) => false,
        }
    }
}

/// Removes containers idle past the TTL (their state is in the last snapshot).
fn spawn_reaper(shared: Weak<Shared>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        loop {
            let period = match shared.upgrade() {
                Some(s) => (s.options.idle_ttl / 2)
                    .clamp(Duration::from_millis(100), Duration::from_secs(30)),
                None => return,
            };
            tokio::time::sleep(period).await;
            let Some(s) = shared.upgrade() else { return };
            if s.closed.load(Ordering::SeqCst) {
                return;
            }
            for slot in s.slot_list() {
                if slot.active.load(Ordering::SeqCst) > 0 || slot.idle_for() < s.options.idle_ttl {
                    continue;
                }
                let Ok(mut live) = slot.live.try_lock() else {
                    continue;
                };
                if let Some(l) = live.take() {
                    tracing::debug!(scope = %slot.key, "sandbox idle past its TTL: removed");
                    s.remove(&l.id).await;
                }
            }
        }
    });
}

#[async_trait]
impl Sandboxes for DockerSandboxes {
    fn scope(&self, key: &str) -> Arc<dyn ScopeSandbox> {
        Arc::new(DockerScope {
            shared: self.shared.clone(),
            slot: self.shared.slot(key),
        })
    }

    fn describe(&self) -> String {
        format!(
            "Docker image {}, network {}",
            self.shared.options.image,
            if self.shared.options.network {
                "on"
            } else {
                "off"
            }
        )
    }

    async fn shutdown(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        let slots = self.shared.slot_list();
        let removals = slots.iter().map(|slot| async {
            if let Some(l) = slot.live.lock().await.take() {
                self.shared.remove(&l.id).await;
            }
        });
        futures::future::join_all(removals).await;
    }
}

/// The sandbox of one scope.
#[derive(Debug, Clone)]
pub struct DockerScope {
    shared: Arc<Shared>,
    slot: Arc<Slot>,
}

impl DockerScope {
    /// The running container of the scope, started (and the snapshot restored) if none
    /// runs. Returns it, and the number of restored files when it was started now.
    async fn live(&self, check: bool) -> Result<(Arc<Live>, Option<usize>)> {
        self.slot.touch();
        let mut guard = self.slot.live.lock().await;
        if let Some(live) = guard.as_ref() {
            if !check || self.shared.running(&live.id).await {
                return Ok((live.clone(), None));
            }
            tracing::warn!(scope = %self.slot.key, "the sandbox container is gone; restoring its snapshot in a new one");
            self.shared.remove(&live.id).await;
            *guard = None;
        }
        let id = self.shared.start(&self.slot).await?;
        let live = Arc::new(Live {
            id,
            manifest: tokio::sync::Mutex::new(Manifest::default()),
        });
        let restored = match state::restore(&self.shared, &self.slot.key, &live).await {
            Ok(n) => n,
            Err(e) => {
                self.shared.remove(&live.id).await;
                return Err(e);
            }
        };
        *guard = Some(live.clone());
        Ok((live, Some(restored)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn security_defaults() {
        let body = container_body(&DockerOptions::default(), HashMap::new());
        let host = body.host_config.clone().unwrap_or_default();
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(body.network_disabled, Some(true));
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(
            host.security_opt,
            Some(vec!["no-new-privileges:true".to_owned()])
        );
        assert_eq!(host.pids_limit, Some(256));
        assert_eq!(host.memory, Some(2 << 30));
        assert_eq!(host.memory_swap, host.memory);
        assert_eq!(host.nano_cpus, Some(1_000_000_000));
        assert!(
            host.binds.is_none() && host.mounts.is_none(),
            "no host mounts"
        );
        assert_eq!(body.user.as_deref(), Some(SANDBOX_USER));
        let env = body.env.unwrap_or_default();
        assert!(
            env.iter().all(|v| v.starts_with("PATH=")
                || v.starts_with("HOME=")
                || v.starts_with("LANG="))
        );
        let with_net = container_body(
            &DockerOptions {
                network: true,
                ..DockerOptions::default()
            },
            HashMap::new(),
        );
        assert_eq!(
            with_net.host_config.and_then(|h| h.network_mode).as_deref(),
            Some("bridge")
        );
    }

    #[test]
    fn owner_labels() {
        let me = owner_of(std::process::id()).unwrap_or_default();
        assert!(owner_alive(&me), "{me}");
        assert!(!owner_alive("999999999:1"));
        assert!(!owner_alive("garbage"));
    }
}
