//! The Docker backend: [`DockerSandboxes`] through bollard (no docker CLI).

mod exec;
mod fs;
mod gc;
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
use bollard::models::{ContainerCreateBody, ContainerSummaryStateEnum, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
};
use hame_fs::Filesystem;

pub use image::{BUSYBOX_CANDIDATES, DEFAULT_IMAGE, find_busybox};

use crate::api::{Sandboxes, ScopeSandbox};
use crate::error::{Error, Result};
use crate::plan::{GcReport, Manifest};

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
    /// Leave idle containers running when [`Sandboxes::shutdown`] is called (the process
    /// exits), for the next process's call of their scope to adopt within the idle TTL;
    /// each stops and is removed by itself once idle longer than the TTL + a grace of
    /// TTL/10 (1 to 10 s). Default `false`: every container is removed.
    pub keep_on_exit: bool,
    /// Command timeout when a request gives none. Default 120 s.
    pub default_timeout: Duration,
    /// Longest command timeout. Default 600 s.
    pub max_timeout: Duration,
    /// Output kept per command (stdout + stderr), bytes. Default 100,000.
    pub max_output_bytes: usize,
    /// Between `SIGTERM` and `SIGKILL` of a command's process group. Default 500 ms.
    pub kill_grace: Duration,
    /// Snapshots kept per scope (at least 1): the blobs of older ones that no kept snapshot
    /// of any scope references are deleted by the store's sweeps. Default 3.
    pub keep_snapshots: usize,
    /// How often at most this value sweeps the snapshot store for unreferenced blobs: in
    /// the background after a call that stored a snapshot, the first time at once, then
    /// when this long has passed since the last sweep. `None`: never by itself (see
    /// [`DockerSandboxes::collect_garbage`]). Default 60 s.
    pub gc_interval: Option<Duration>,
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
            keep_on_exit: false,
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(600),
            max_output_bytes: 100_000,
            kill_grace: Duration::from_millis(500),
            keep_snapshots: 3,
            gc_interval: Some(Duration::from_secs(60)),
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
        // The watchdog below ends the container once it is idle past its TTL; the engine
        // then removes it, whether or not a hame process is still running.
        auto_remove: Some(true),
        privileged: Some(false),
        ipc_mode: Some("private".to_owned()),
        binds: None,
        mounts: None,
        ..Default::default()
    };
    let limit = options.idle_ttl + orphan_grace(options.idle_ttl);
    let period = (options.idle_ttl / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
    ContainerCreateBody {
        image: Some(options.image.clone()),
        entrypoint: Some(vec![
            "sh".to_owned(),
            "-c".to_owned(),
            scripts::WATCHDOG.to_owned(),
            "hame-watchdog".to_owned(),
            limit.as_secs().max(1).to_string(),
            period.as_secs().to_string(),
        ]),
        cmd: None,
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
    /// The controller per container id ([`scripts::CONTROLLER`]).
    controllers: Mutex<HashMap<String, server::ControlSlot>>,
    /// When the last sweep of the snapshot store began, and the sweep running now.
    sweeps: Mutex<Sweeps>,
}

#[derive(Debug, Default)]
struct Sweeps {
    last: Option<Instant>,
    running: Option<tokio::task::JoinHandle<()>>,
}

/// How long [`Sandboxes::shutdown`] waits for a sweep of the snapshot store that runs.
const SWEEP_AT_EXIT: Duration = Duration::from_secs(30);

impl Shared {
    /// Starts a sweep of the snapshot store in the background when one is due (see
    /// [`DockerOptions::gc_interval`]) and none runs.
    pub(crate) fn sweep_if_due(self: &Arc<Self>) {
        let Some(every) = self.options.gc_interval else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(mut sweeps) = self.sweeps.lock() else {
            return;
        };
        if sweeps.running.as_ref().is_some_and(|t| !t.is_finished())
            || sweeps.last.is_some_and(|t| t.elapsed() < every)
        {
            return;
        }
        sweeps.last = Some(Instant::now());
        let store = self.snapshots.clone();
        sweeps.running = Some(runtime.spawn(async move {
            match gc::collect(store.as_ref()).await {
                Ok(r) => tracing::debug!(
                    blobs = r.blobs,
                    deleted = r.deleted,
                    bytes_deleted = r.bytes_deleted,
                    restored = r.restored,
                    elapsed_ms = r.elapsed.as_millis() as u64,
                    "swept the sandbox snapshot store"
                ),
                Err(e) => tracing::warn!(error = %e, "sweeping the sandbox snapshot store failed"),
            }
        }));
    }
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
    /// The identity of that manifest as stored (empty: none stored yet).
    identity: Mutex<String>,
}

impl Live {
    fn new(id: String, manifest: Manifest, identity: String) -> Self {
        Self {
            id,
            manifest: tokio::sync::Mutex::new(manifest),
            identity: Mutex::new(identity),
        }
    }

    pub(crate) fn identity(&self) -> String {
        self.identity.lock().map(|i| i.clone()).unwrap_or_default()
    }

    pub(crate) fn set_identity(&self, identity: String) {
        if let Ok(mut i) = self.identity.lock() {
            *i = identity;
        }
    }
}

/// How [`DockerScope::live`] got the scope's container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Got {
    /// This process's warm container, up to date.
    Warm,
    /// An idle container of a process that is gone, taken over.
    Adopted,
    /// A new container with the stored snapshot restored (`refreshed`: it replaces a warm
    /// one that was stale).
    Started {
        /// Files restored.
        restored: usize,
        /// A stale warm container was replaced.
        refreshed: bool,
    },
}

/// What to do with a container of another process found by its labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Orphan {
    /// Its process (or the one that took it over) lives: not ours to touch.
    Theirs,
    /// Idle within the TTL and its process gone: another call of its scope may adopt it.
    Adoptable,
    /// Its process is gone and it is busy (killed mid-call), idle past the TTL, or has no
    /// state: remove it.
    Remove,
}

/// Extra idle time past the TTL (TTL/10, 1 to 10 s) before a process that did not use an
/// orphan removes it, or it ends itself (so neither happens to one that a call of its scope
/// is adopting at that moment).
pub(crate) fn orphan_grace(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_secs(1), Duration::from_secs(10))
}

/// Decides about a container of another process (a pure function, unit-tested):
/// `label_owner` its [`OWNER_LABEL`], `state` its state file, `me` this process, `alive`
/// whether an owner names a live process, `limit` the idle time past which it is removed.
pub(crate) fn judge_orphan(
    label_owner: &str,
    state: Option<&state::ContainerState>,
    me: &str,
    alive: &dyn Fn(&str) -> bool,
    limit: Duration,
) -> Orphan {
    let owner = match state {
        Some(s) if !s.owner.is_empty() => s.owner.as_str(),
        _ => label_owner,
    };
    if owner == me || alive(owner) {
        return Orphan::Theirs;
    }
    match state {
        Some(s) if s.idle && Duration::from_secs(s.age_secs) <= limit => Orphan::Adoptable,
        _ => Orphan::Remove,
    }
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
            controllers: Mutex::new(HashMap::new()),
            sweeps: Mutex::new(Sweeps::default()),
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

    /// Sweeps the snapshot store now (see `docs/sandbox.md`, *Snapshots*): deletes the blobs
    /// no scope's kept snapshots reference. Safe while other processes snapshot and restore.
    pub async fn collect_garbage(&self) -> Result<GcReport> {
        gc::collect(self.shared.snapshots.as_ref()).await
    }

    /// Removes the containers of hame processes that are gone (found by [`OWNER_LABEL`]
    /// and the state file inside): those killed in the middle of a call, and those idle
    /// longer than the idle TTL (+ 10 s). Idle ones within it are left for a call of their
    /// scope to adopt. Runs when this value connects and then with the idle reaper.
    /// Returns how many were removed.
    pub async fn reap_orphans(&self) -> usize {
        self.shared.reap_orphans().await
    }
}

impl Shared {
    /// The containers `filters` lists (stopped ones too when `all`) that are neither this
    /// process's nor of another live process (by [`OWNER_LABEL`]; no need to look inside
    /// those): each one's id, owner label and whether it runs.
    async fn others_containers(
        &self,
        filters: HashMap<String, Vec<String>>,
        all: bool,
    ) -> Result<Vec<(String, String, bool)>, bollard::errors::Error> {
        let list = self
            .docker
            .list_containers(Some(ListContainersOptions {
                all,
                filters: Some(filters),
                ..Default::default()
            }))
            .await?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let running = c.state == Some(ContainerSummaryStateEnum::RUNNING);
                let owner = c
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(OWNER_LABEL))
                    .cloned()
                    .unwrap_or_default();
                let theirs = owner == self.owner || owner_alive(&owner);
                Some((c.id?, owner, running)).filter(|_| !theirs)
            })
            .collect())
    }

    async fn reap_orphans(&self) -> usize {
        let filters = HashMap::from([("label".to_owned(), vec![LABEL.to_owned()])]);
        let list = self.others_containers(filters, true).await;
        let mut removed = 0;
        for (id, label_owner, running) in list.unwrap_or_default() {
            let state = if running {
                state::read_state(self, &id, false).await
            } else {
                None
            };
            let limit = self.options.idle_ttl + orphan_grace(self.options.idle_ttl);
            if judge_orphan(
                &label_owner,
                state.as_ref(),
                &self.owner,
                &owner_alive,
                limit,
            ) == Orphan::Remove
            {
                self.remove(&id).await;
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(removed, "removed sandbox containers of dead hame processes");
        }
        removed
    }

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
        // Unique in the process, whatever the number of `DockerSandboxes` values.
        static CONTAINERS: AtomicU64 = AtomicU64::new(0);
        let n = CONTAINERS.fetch_add(1, Ordering::SeqCst);
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

/// How often the idle reaper looks for containers of dead processes.
const ORPHAN_SCAN_EVERY: Duration = Duration::from_secs(30);

/// Removes containers idle past the TTL (their state is in the last snapshot).
fn spawn_reaper(shared: Weak<Shared>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut last_orphan_scan = Instant::now();
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
            // Containers of processes that died are removed by whichever hame process runs.
            if last_orphan_scan.elapsed() >= ORPHAN_SCAN_EVERY {
                last_orphan_scan = Instant::now();
                s.reap_orphans().await;
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
        let keep = self.shared.options.keep_on_exit;
        let removals = slots.iter().map(|slot| async move {
            if let Some(l) = slot.live.lock().await.take() {
                // A container in the middle of a call is never kept (not adoptable).
                if keep && slot.active.load(Ordering::SeqCst) == 0 {
                    self.shared.forget_servers(&l.id);
                    tracing::debug!(scope = %slot.key, container = %l.id, "sandbox container left warm for the next process");
                } else {
                    self.shared.remove(&l.id).await;
                }
            }
        });
        let sweep = self
            .shared
            .sweeps
            .lock()
            .ok()
            .and_then(|mut s| s.running.take());
        let (_, swept) = tokio::join!(futures::future::join_all(removals), async {
            match sweep {
                Some(task) => tokio::time::timeout(SWEEP_AT_EXIT, task).await.is_ok(),
                None => true,
            }
        });
        if !swept {
            tracing::warn!("the sweep of the sandbox snapshot store did not finish before exit");
        }
    }
}

/// The sandbox of one scope.
#[derive(Debug, Clone)]
pub struct DockerScope {
    shared: Arc<Shared>,
    slot: Arc<Slot>,
}

impl DockerScope {
    /// The running container of the scope. With `check` (at the start of a call): a warm
    /// container that is gone, or stale (the stored snapshot is not the one it last wrote
    /// or restored: another process ran a call of the scope since), is replaced; without a
    /// warm one, an idle container of a dead process with the stored snapshot is adopted;
    /// else a new one starts with the snapshot restored.
    async fn live(&self, check: bool) -> Result<(Arc<Live>, Got)> {
        self.slot.touch();
        let mut guard = self.slot.live.lock().await;
        let mut refreshed = false;
        if let Some(live) = guard.as_ref() {
            if !check {
                return Ok((live.clone(), Got::Warm));
            }
            if self.shared.running(&live.id).await {
                let stored =
                    state::stored_identity(self.shared.snapshots.as_ref(), &self.slot.key).await?;
                if stored == live.identity() {
                    return Ok((live.clone(), Got::Warm));
                }
                tracing::info!(scope = %self.slot.key, "another process stored a newer snapshot of this scope; the warm container is replaced");
                refreshed = true;
            } else {
                tracing::warn!(scope = %self.slot.key, "the sandbox container is gone; restoring its snapshot in a new one");
            }
            self.shared.remove(&live.id).await;
            *guard = None;
        }
        if let Some(live) = self.adopt().await {
            self.start_controller(&live.id);
            *guard = Some(live.clone());
            return Ok((live, Got::Adopted));
        }
        let id = self.shared.start(&self.slot).await?;
        self.start_controller(&id);
        let live = Arc::new(Live::new(id, Manifest::default(), String::new()));
        let restored = match state::restore(&self.shared, &self.slot.key, &live).await {
            Ok(n) => n,
            Err(e) => {
                self.shared.remove(&live.id).await;
                return Err(e);
            }
        };
        *guard = Some(live.clone());
        Ok((
            live,
            Got::Started {
                restored,
                refreshed,
            },
        ))
    }

    /// Starts the controller of a container started or adopted now, in the background (see
    /// [`Shared::ensure_controller`]).
    fn start_controller(&self, container: &str) {
        let (shared, container) = (self.shared.clone(), container.to_owned());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { shared.ensure_controller(&container).await });
        }
    }

    /// Takes over a running container of this scope left by a process that is gone, if
    /// its last call ended within the idle TTL with the snapshot that is stored now;
    /// removes the other orphans of the scope it finds. The caller holds the scope (the
    /// sandbox or session lease), so two processes never adopt one container.
    async fn adopt(&self) -> Option<Arc<Live>> {
        let key = &self.slot.key;
        let filters = HashMap::from([
            ("label".to_owned(), vec![format!("{SCOPE_LABEL}={key}")]),
            ("status".to_owned(), vec!["running".to_owned()]),
        ]);
        // Leaves out one this process started (being removed) or one of a live process.
        let list = self.shared.others_containers(filters, false).await.ok()?;
        let mut stored: Option<(Manifest, String)> = None;
        for (id, label_owner, _) in list {
            // Through a pooled command server (the calls that follow in an adopted container
            // need one anyway), while the stored manifest is read.
            let (state, stored_now) =
                tokio::join!(state::read_state(&self.shared, &id, true), async {
                    match &stored {
                        Some(_) => None,
                        None => state::load_manifest(self.shared.snapshots.as_ref(), key)
                            .await
                            .ok(),
                    }
                });
            if stored.is_none() {
                stored = stored_now;
            }
            let verdict = judge_orphan(
                &label_owner,
                state.as_ref(),
                &self.shared.owner,
                &owner_alive,
                self.shared.options.idle_ttl,
            );
            match (verdict, state) {
                (Orphan::Theirs, _) => {
                    self.shared.forget_servers(&id);
                    continue;
                }
                (Orphan::Adoptable, Some(st)) => {
                    let (manifest, identity) = stored.clone()?;
                    if st.identity == identity {
                        let live = Arc::new(Live::new(id.clone(), manifest, identity));
                        // Claimed: from now on it is this process's (busy) container.
                        if state::write_state(&self.shared, &live, false).await.is_ok() {
                            tracing::info!(scope = %key, container = %live.id, "adopted the idle sandbox container of a process that is gone");
                            return Some(live);
                        }
                    }
                    self.shared.remove(&id).await;
                }
                _ => self.shared.remove(&id).await,
            }
        }
        None
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
        // The watchdog: idle past 300 s + 10 s, looked at every 30 s; removed when it ends.
        let entry = body.entrypoint.unwrap_or_default();
        assert_eq!(entry[3..], ["hame-watchdog", "310", "30"]);
        assert_eq!(host.auto_remove, Some(true));
        assert_eq!(orphan_grace(Duration::from_secs(2)), Duration::from_secs(1));
    }

    #[test]
    fn orphans_are_judged_by_owner_state_and_age() {
        use state::ContainerState;
        let alive = |o: &str| o == "live:1";
        let ttl = Duration::from_secs(300);
        let st = |idle: bool, owner: &str, age: u64| ContainerState {
            idle,
            identity: "id".into(),
            owner: owner.into(),
            age_secs: age,
        };
        let judge = |label: &str, s: Option<ContainerState>| {
            judge_orphan(label, s.as_ref(), "me:1", &alive, ttl)
        };
        use Orphan::{Adoptable, Remove, Theirs};
        let d = "dead:1";
        // (label, state, expected, why)
        let cases = [
            ("live:1", None, Theirs, "its process lives"),
            (
                d,
                Some(st(true, "live:1", 5)),
                Theirs,
                "a live owner adopted it",
            ),
            (d, Some(st(false, "me:1", 5)), Theirs, "adopted by this one"),
            (d, Some(st(true, d, 5)), Adoptable, "idle, its owner dead"),
            (
                d,
                Some(st(true, "", 300)),
                Adoptable,
                "owner from its label",
            ),
            (d, Some(st(true, d, 301)), Remove, "idle past the TTL"),
            (d, Some(st(false, d, 1)), Remove, "killed mid-call"),
            (d, None, Remove, "never finished a call"),
        ];
        for (label, state, expected, why) in cases {
            assert_eq!(judge(label, state), expected, "{why}");
        }
    }

    #[test]
    fn owner_labels() {
        let me = owner_of(std::process::id()).unwrap_or_default();
        assert!(owner_alive(&me), "{me}");
        assert!(!owner_alive("999999999:1"));
        assert!(!owner_alive("garbage"));
    }
}
