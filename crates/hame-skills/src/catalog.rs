//! Discovery over the caller's layers, loading, drafts and promotion (the I/O part).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use hame_core::{AgentEvent, EventSink};
use hame_fs::{DeleteOptions, Filesystem, FsPath, WriteOptions};
use hame_tools::Workspace;

use crate::repository::{Cached, DEFAULT_REFRESH, SkillRepository};
use crate::skill::{
    SkillDoc, SkillLayer, SkillState, Usage, curate, merge, parse_skill, render_skill, valid_name,
};
use crate::{Error, Result};

/// Folder of drafts inside `skills/` of the caller's home.
pub const DRAFTS_DIR: &str = "_drafts";
/// The usage record of agent-created skills, in `skills/` of the caller's home.
pub const USAGE_FILE: &str = ".usage.json";
/// Most skills read from one layer.
pub const MAX_SKILLS_PER_LAYER: usize = 500;
/// Most resource paths `load_skill` lists.
pub const MAX_RESOURCES: usize = 200;
/// Largest `SKILL.md` read, in bytes.
pub const MAX_SKILL_BYTES: usize = 256 * 1024;
/// Event kind of a skill skipped for invalid front matter (printed by `hame run`).
pub const INVALID_EVENT: &str = "workspace.skill_invalid";
/// Event kind of a skill repository that could not be fetched (printed by `hame run`).
pub const REPOSITORY_FAILED_EVENT: &str = "skills.repository_failed";
/// Event kind of a skill name held by more than one layer (reported once per process).
pub const SHADOWED_EVENT: &str = "skills.shadowed";

/// Settings of the skills capability.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SkillsOptions {
    /// The project/global skills directory on the host (`<dir>/<name>/SKILL.md`), above
    /// the repositories.
    pub global_dir: Option<PathBuf>,
    /// Skill repositories, the lowest layers, in precedence order (the first wins a name
    /// among them).
    pub repositories: Vec<Arc<dyn SkillRepository>>,
    /// How long a repository's snapshot is used before it is fetched again (default
    /// [`DEFAULT_REFRESH`], 300 s).
    pub refresh: Duration,
}

impl Default for SkillsOptions {
    fn default() -> Self {
        Self {
            global_dir: None,
            repositories: Vec::new(),
            refresh: DEFAULT_REFRESH,
        }
    }
}

impl SkillsOptions {
    /// With the global directory.
    pub fn with_global_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.global_dir = dir;
        self
    }

    /// With a repository after those already given (lower precedence).
    pub fn with_repository(mut self, repo: Arc<dyn SkillRepository>) -> Self {
        self.repositories.push(repo);
        self
    }

    /// With the refresh interval of the repositories.
    pub fn with_refresh(mut self, every: Duration) -> Self {
        self.refresh = every;
        self
    }
}

/// One skill as the caller sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    /// Its name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// The layer it comes from (the highest one holding the name).
    pub layer: SkillLayer,
    /// Its state.
    pub state: SkillState,
    /// Its folder as the caller's file tools see it (`skills/<name>`,
    /// `<userId>/skills/<name>`), or a host path for the global layer.
    pub dir: String,
    /// Whether `read_file` and `execute` reach [`dir`](Self::dir).
    pub in_workspace: bool,
    /// Where it comes from: `workspace`, `user`, `global <dir>`, or the repository's
    /// label (`git <url>@<ref>`, `sql <url> table <t>`).
    pub source: String,
    /// The repository's version it was read at (a commit id, a digest); `None` outside
    /// repositories.
    pub version: Option<String>,
}

/// A `SKILL.md` that was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Its path, as in [`Skill::dir`].
    pub path: String,
    /// Why.
    pub error: String,
}

/// A skill name held by more than one layer: the highest one wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shadowed {
    /// The name.
    pub name: String,
    /// The source whose skill is used ([`Skill::source`]).
    pub used: String,
    /// The sources whose skill of that name is hidden, highest first.
    pub hidden: Vec<String>,
}

/// A repository that could not be fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepositoryError {
    /// The repository's label.
    pub repository: String,
    /// Why (the last snapshot, if any, is still used).
    pub error: String,
}

/// Every skill of a caller, in every state, and the skipped ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    /// Sorted by name; one per name (the highest layer), then the drafts.
    pub skills: Vec<Skill>,
    /// Files skipped for invalid front matter.
    pub invalid: Vec<Invalid>,
    /// Names held by more than one layer, sorted by name.
    pub shadowed: Vec<Shadowed>,
    /// Repositories whose fetch failed now.
    pub repository_errors: Vec<RepositoryError>,
}

impl Catalog {
    /// The skills the model sees (active and stale), sorted by name.
    pub fn visible(&self) -> Vec<&Skill> {
        self.skills
            .iter()
            .filter(|s| s.state.is_visible())
            .collect()
    }
}

#[derive(Clone)]
struct Source {
    layer: SkillLayer,
    fs: Arc<dyn Filesystem>,
    base: FsPath,
    shown: String,
    in_workspace: bool,
    label: String,
    version: Option<String>,
}

/// The skills capability of an agent: the global directory, the repositories with their
/// last snapshots, and the warnings already given. One per agent; it holds no caller's
/// data.
#[derive(Debug)]
pub struct Skills {
    global: Option<(PathBuf, Arc<dyn Filesystem>)>,
    repositories: Vec<Cached>,
    warned: Mutex<HashSet<u64>>,
}

/// Warnings remembered before the set is cleared.
const MAX_WARNED: usize = 4096;

impl Skills {
    /// The capability; a global directory that is not a directory is a configuration
    /// error.
    pub fn new(options: SkillsOptions) -> Result<Self> {
        let global = match options.global_dir {
            Some(dir) => {
                if !dir.is_dir() {
                    return Err(Error::Config(format!(
                        "skills directory {} is not a directory (check --skills-dir)",
                        dir.display()
                    )));
                }
                let abs = std::fs::canonicalize(&dir).unwrap_or(dir);
                let fs = hame_fs::LocalFs::new(&abs).map_err(|e| {
                    Error::Config(format!(
                        "cannot open skills directory {}: {e}",
                        abs.display()
                    ))
                })?;
                Some((abs, Arc::new(fs) as Arc<dyn Filesystem>))
            }
            None => None,
        };
        let repositories = options
            .repositories
            .into_iter()
            .map(|r| Cached::new(r, options.refresh))
            .collect();
        Ok(Self {
            global,
            repositories,
            warned: Mutex::new(HashSet::new()),
        })
    }

    /// The sources, lowest first (the repositories in declared order, so the first wins
    /// a name among them), and the repositories that failed now.
    async fn sources(&self, ws: &Workspace) -> (Vec<Source>, Vec<RepositoryError>) {
        let mut out = Vec::new();
        let mut errors = Vec::new();
        let fetched = futures_join_all(self.repositories.iter().map(|r| r.current())).await;
        for (repo, current) in self.repositories.iter().zip(fetched) {
            if let Some(error) = current.error {
                errors.push(RepositoryError {
                    repository: repo.label.clone(),
                    error,
                });
            }
            if let Some(snap) = current.snapshot {
                out.push(Source {
                    layer: SkillLayer::Repository,
                    fs: snap.files,
                    base: FsPath::root(),
                    shown: repo.label.clone(),
                    in_workspace: false,
                    label: repo.label.clone(),
                    version: Some(snap.version),
                });
            }
        }
        if let Some((dir, fs)) = &self.global {
            out.push(Source {
                layer: SkillLayer::Global,
                fs: fs.clone(),
                base: FsPath::root(),
                shown: dir.display().to_string(),
                in_workspace: false,
                label: format!("global {}", dir.display()),
                version: None,
            });
        }
        let skills = FsPath::parse("skills").unwrap_or_else(|_| FsPath::root());
        out.push(Source {
            layer: SkillLayer::Workspace,
            fs: ws.files().clone(),
            base: skills.clone(),
            shown: "skills".into(),
            in_workspace: true,
            label: "workspace".into(),
            version: None,
        });
        if let (Some(o), Some(user)) = (ws.overrides(), ws.identity().user.as_deref()) {
            out.push(Source {
                layer: SkillLayer::User,
                fs: o.clone(),
                base: skills,
                shown: format!("{user}/skills"),
                in_workspace: true,
                label: "user".into(),
                version: None,
            });
        }
        (out, errors)
    }

    fn drafts(ws: &Workspace) -> Source {
        let home_in = ws.home_in_files();
        let prefix = if home_in.is_root() {
            String::new()
        } else {
            format!("{}/", home_in.as_str().trim_start_matches('/'))
        };
        Source {
            layer: if home_in.is_root() {
                SkillLayer::Workspace
            } else {
                SkillLayer::User
            },
            fs: ws.home().clone(),
            base: FsPath::parse(&format!("skills/{DRAFTS_DIR}")).unwrap_or_else(|_| FsPath::root()),
            shown: format!("{prefix}skills/{DRAFTS_DIR}"),
            in_workspace: true,
            label: "draft".into(),
            version: None,
        }
    }

    /// Every skill of the caller (all states) and the skipped files. With `events`, each
    /// skipped file is reported once per process and content as a
    /// [`INVALID_EVENT`] custom event (and a `tracing` warning).
    pub async fn catalog(&self, ws: &Workspace, events: Option<&EventSink>) -> Catalog {
        let (sources, repository_errors) = self.sources(ws).await;
        let draft_source = Self::drafts(ws);
        let reads = sources.iter().map(read_layer);
        let (layers, drafts, usage) = tokio::join!(
            futures_join_all(reads),
            read_layer(&draft_source),
            read_usage(ws)
        );
        let mut found = Vec::new();
        let mut invalid = Vec::new();
        for (source, (docs, bad)) in sources.iter().zip(layers) {
            invalid.extend(bad);
            for (dir, doc) in docs {
                found.push((source.layer, doc.name.clone(), (source.clone(), dir, doc)));
            }
        }
        let shadowed = shadowed(&found);
        let now = Utc::now();
        let mut skills: Vec<Skill> = merge(found)
            .into_iter()
            .map(|(layer, name, (source, dir, doc))| Skill {
                state: curate(usage.get(&name), now),
                name,
                description: doc.description,
                layer,
                dir: format!("{}/{dir}", source.shown),
                in_workspace: source.in_workspace,
                source: source.label.clone(),
                version: source.version.clone(),
            })
            .collect();
        let (draft_docs, bad) = drafts;
        invalid.extend(bad);
        for (dir, doc) in draft_docs {
            skills.push(Skill {
                name: doc.name,
                description: doc.description,
                layer: draft_source.layer,
                state: SkillState::Draft,
                dir: format!("{}/{dir}", draft_source.shown),
                in_workspace: true,
                source: draft_source.label.clone(),
                version: None,
            });
        }
        if let Some(events) = events {
            self.warn(ws, &invalid, events);
            self.report(&shadowed, &repository_errors, events);
        }
        Catalog {
            skills,
            invalid,
            shadowed,
            repository_errors,
        }
    }

    /// Whether `key` is new to this process (the warned set is bounded).
    fn first_time(&self, key: impl std::hash::Hash) -> bool {
        use std::hash::Hasher;
        let Ok(mut warned) = self.warned.lock() else {
            return false;
        };
        if warned.len() > MAX_WARNED {
            warned.clear();
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        warned.insert(h.finish())
    }

    /// Reports each shadowed name and each failed repository once per process and
    /// content.
    fn report(&self, shadowed: &[Shadowed], errors: &[RepositoryError], events: &EventSink) {
        for s in shadowed {
            if self.first_time(("shadowed", &s.name, &s.used, &s.hidden)) {
                tracing::info!(skill = %s.name, used = %s.used, hidden = ?s.hidden, "skill name held by more than one layer");
                events.emit(AgentEvent::Custom {
                    kind: SHADOWED_EVENT.into(),
                    data: serde_json::json!({
                        "name": s.name,
                        "used": s.used,
                        "hidden": s.hidden,
                    }),
                });
            }
        }
        for e in errors {
            if self.first_time(("repository", &e.repository, &e.error)) {
                tracing::warn!(repository = %e.repository, error = %e.error, "skill repository not fetched");
                events.emit(AgentEvent::Custom {
                    kind: REPOSITORY_FAILED_EVENT.into(),
                    data: serde_json::json!({
                        "path": e.repository,
                        "error": format!("{}; using its last fetched skills, if any", e.error),
                    }),
                });
            }
        }
    }

    fn warn(&self, ws: &Workspace, invalid: &[Invalid], events: &EventSink) {
        for bad in invalid {
            if self.first_time((&ws.identity().user, &bad.path, &bad.error)) {
                tracing::warn!(path = %bad.path, error = %bad.error, "skill skipped");
                events.emit(AgentEvent::Custom {
                    kind: INVALID_EVENT.into(),
                    data: serde_json::json!({
                        "path": bad.path,
                        "error": format!("skill skipped: {}", bad.error),
                    }),
                });
            }
        }
    }

    /// `load_skill`: the body of a visible skill and its resources, or (with `path`) one
    /// resource file. An unknown name is an error listing the available names.
    pub async fn load(&self, ws: &Workspace, name: &str, path: Option<&str>) -> Result<String> {
        let catalog = self.catalog(ws, None).await;
        let visible = catalog.visible();
        let Some(skill) = visible.iter().find(|s| s.name == name) else {
            let names: Vec<&str> = visible.iter().map(|s| s.name.as_str()).collect();
            return Err(Error::NotFound(format!(
                "no skill named `{name}`; available: {}",
                if names.is_empty() {
                    "(none)".to_owned()
                } else {
                    names.join(", ")
                }
            )));
        };
        let source = self
            .sources(ws)
            .await
            .0
            .into_iter()
            .find(|s| s.layer == skill.layer && s.label == skill.source)
            .ok_or_else(|| Error::NotFound(format!("skill `{name}` vanished")))?;
        let dir_name = skill.dir.rsplit('/').next().unwrap_or(name).to_owned();
        let dir = source
            .base
            .join(&dir_name)
            .map_err(|e| Error::NotFound(e.to_string()))?;
        if let Some(rel) = path {
            let p = FsPath::parse(rel).map_err(|e| Error::Invalid(format!("path `{rel}`: {e}")))?;
            let bytes = source
                .fs
                .read_bytes(&dir.join_path(&p))
                .await
                .map_err(|e| Error::NotFound(format!("skill `{name}` has no file `{rel}`: {e}")))?;
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
        let text = read_text(
            &source.fs,
            &dir.join("SKILL.md")
                .map_err(|e| Error::NotFound(e.to_string()))?,
        )
        .await
        .map_err(|e| Error::NotFound(format!("skill `{name}`: {e}")))?;
        let doc = parse_skill(&dir_name, &text).map_err(Error::Invalid)?;
        let mut resources = Vec::new();
        walk(&source.fs, &dir, &mut resources).await;
        resources.retain(|p| p != "SKILL.md");
        resources.sort();
        record_use(ws, name).await;
        Ok(render_loaded(skill, &doc, &resources, ws.exec().is_some()))
    }

    /// `propose_skill`: writes a draft `skills/_drafts/<name>/SKILL.md` into the caller's
    /// home (its namespace); it is not listed until promoted. Returns the draft's path.
    pub async fn propose(
        &self,
        ws: &Workspace,
        name: &str,
        description: &str,
        body: &str,
    ) -> Result<String> {
        if !valid_name(name) {
            return Err(Error::Invalid(format!(
                "`{name}` is not a valid skill name: use [A-Za-z0-9._-], at most 64 characters, not starting with `.` or `_`"
            )));
        }
        if description.trim().is_empty() {
            return Err(Error::Invalid("the description is empty".into()));
        }
        let text = render_skill(name, description, body).map_err(Error::Invalid)?;
        let draft = Self::drafts(ws);
        let path = draft
            .base
            .join(name)
            .and_then(|d| d.join("SKILL.md"))
            .map_err(|e| Error::Invalid(e.to_string()))?;
        ws.home()
            .write(&path, text.into_bytes(), WriteOptions::default())
            .await
            .map_err(|e| Error::storage("writing the draft failed", e))?;
        update_usage(ws, name, |u| {
            u.created = Some(Utc::now());
            u.promoted = None;
        })
        .await?;
        Ok(format!("{}/{name}/SKILL.md", draft.shown))
    }

    /// Promotes the draft `name` (moves `skills/_drafts/<name>/` to `skills/<name>/` of
    /// the caller's home), or restores an archived skill. Returns the skill.
    pub async fn promote(&self, ws: &Workspace, name: &str) -> Result<Skill> {
        let catalog = self.catalog(ws, None).await;
        let draft = catalog
            .skills
            .iter()
            .find(|s| s.name == name && s.state == SkillState::Draft);
        let archived = catalog
            .skills
            .iter()
            .find(|s| s.name == name && s.state == SkillState::Archived);
        match (draft, archived) {
            (Some(d), _) => {
                let dir_name = d.dir.rsplit('/').next().unwrap_or(name).to_owned();
                let home = ws.home();
                let from = Self::drafts(ws)
                    .base
                    .join(&dir_name)
                    .map_err(|e| Error::Invalid(e.to_string()))?;
                let to = FsPath::parse(&format!("skills/{name}"))
                    .map_err(|e| Error::Invalid(e.to_string()))?;
                if home
                    .exists(
                        &to.join("SKILL.md")
                            .map_err(|e| Error::Invalid(e.to_string()))?,
                    )
                    .await
                    .unwrap_or(false)
                {
                    return Err(Error::Invalid(format!(
                        "a skill `{name}` already exists in {}; remove it or rename the draft first",
                        d.layer.as_str()
                    )));
                }
                let mut files = Vec::new();
                walk(home, &from, &mut files).await;
                for rel in &files {
                    let src = from.join(rel).map_err(|e| Error::Invalid(e.to_string()))?;
                    let dst = to.join(rel).map_err(|e| Error::Invalid(e.to_string()))?;
                    let bytes = home
                        .read_bytes(&src)
                        .await
                        .map_err(|e| Error::storage("reading the draft failed", e))?;
                    home.write(&dst, bytes, WriteOptions::default())
                        .await
                        .map_err(|e| Error::storage("writing the skill failed", e))?;
                }
                home.delete(&from, DeleteOptions { recursive: true })
                    .await
                    .map_err(|e| Error::storage("removing the draft failed", e))?;
            }
            (None, Some(_)) => {}
            (None, None) => {
                let drafts: Vec<&str> = catalog
                    .skills
                    .iter()
                    .filter(|s| matches!(s.state, SkillState::Draft | SkillState::Archived))
                    .map(|s| s.name.as_str())
                    .collect();
                return Err(Error::NotFound(format!(
                    "no draft or archived skill named `{name}`; drafts and archived: {}",
                    if drafts.is_empty() {
                        "(none)".to_owned()
                    } else {
                        drafts.join(", ")
                    }
                )));
            }
        }
        update_usage(ws, name, |u| u.promoted = Some(Utc::now())).await?;
        let catalog = self.catalog(ws, None).await;
        catalog
            .skills
            .into_iter()
            .find(|s| s.name == name && s.state.is_visible())
            .ok_or_else(|| Error::NotFound(format!("skill `{name}` is not visible after promotion (a higher layer may hold the name)")))
    }
}

/// The `<available_skills>` block of the system prompt: names and descriptions only,
/// sorted by name, so it changes only when the skills do. `None` without skills.
pub fn prompt_block(skills: &[&Skill]) -> Option<String> {
    if skills.is_empty() {
        return None;
    }
    let mut out = String::from(
        "Skills are packaged instructions for particular tasks. When a task matches a skill's \
         description, call load_skill(name) first and follow its instructions.\n",
    );
    for s in skills {
        out.push_str(&format!("- {}: {}\n", s.name, s.description));
    }
    Some(out)
}

fn render_loaded(skill: &Skill, doc: &SkillDoc, resources: &[String], shell: bool) -> String {
    // A repository's skill names its source and version, so the session log pins the
    // run to the exact text it used (a commit id for Git).
    let origin = match &skill.version {
        Some(v) => format!(" source=\"{}\" version=\"{v}\"", skill.source),
        None => String::new(),
    };
    let mut out = format!(
        "<skill name=\"{}\" layer=\"{}\"{origin} dir=\"{}\">\n{}\n</skill>\n",
        skill.name,
        skill.layer.as_str(),
        skill.dir,
        doc.body.trim_end()
    );
    if !resources.is_empty() {
        if skill.in_workspace {
            out.push_str("\nResources (read them with read_file):\n");
            for r in resources {
                out.push_str(&format!("- {}/{r}\n", skill.dir));
            }
        } else {
            out.push_str(&format!(
                "\nResources (read them with load_skill(name=\"{}\", path=...)):\n",
                skill.name
            ));
            for r in resources {
                out.push_str(&format!("- {r}\n"));
            }
        }
    }
    let scripts: Vec<&String> = resources
        .iter()
        .filter(|r| r.starts_with("scripts/"))
        .collect();
    if !scripts.is_empty() {
        if shell {
            out.push_str(
                "\nRun its scripts with execute (the shell starts in the workspace root):\n",
            );
            for s in scripts {
                out.push_str(&format!("- `sh {}/{s}`\n", skill.dir));
            }
        } else {
            out.push_str("\nThis mode has no shell: the scripts cannot be run here; read them for reference.\n");
        }
    }
    out
}

/// The names held by more than one source (`found` lists sources lowest first), with
/// the source that wins and those it hides.
fn shadowed(found: &[(SkillLayer, String, (Source, String, SkillDoc))]) -> Vec<Shadowed> {
    let mut by_name: BTreeMap<&str, Vec<(SkillLayer, usize, &str)>> = BTreeMap::new();
    for (i, (layer, name, (source, _, _))) in found.iter().enumerate() {
        by_name
            .entry(name.as_str())
            .or_default()
            .push((*layer, i, source.label.as_str()));
    }
    let mut out = Vec::new();
    for (name, mut holders) in by_name {
        if holders.len() < 2 {
            continue;
        }
        // Highest layer first; within a layer, the first found (declared first).
        holders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        out.push(Shadowed {
            name: name.to_owned(),
            used: holders[0].2.to_owned(),
            hidden: holders[1..].iter().map(|h| h.2.to_owned()).collect(),
        });
    }
    out
}

async fn futures_join_all<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut out = Vec::new();
    for f in futs {
        out.push(f.await);
    }
    out
}

async fn read_text(fs: &Arc<dyn Filesystem>, path: &FsPath) -> std::result::Result<String, String> {
    let bytes = fs.read_bytes(path).await.map_err(|e| e.to_string())?;
    if bytes.len() > MAX_SKILL_BYTES {
        return Err(format!("larger than {MAX_SKILL_BYTES} bytes"));
    }
    String::from_utf8(bytes).map_err(|_| "not valid UTF-8".to_owned())
}

/// Skills parsed by directory name and text: the layers are read at every step, an
/// unchanged `SKILL.md` is not parsed again (`hame_tools::memo::ParseMemo`).
static PARSED: std::sync::LazyLock<hame_tools::memo::ParseMemo<Result<SkillDoc, String>>> =
    std::sync::LazyLock::new(|| hame_tools::memo::ParseMemo::new(256, 32 * 1024));

/// The valid skills of one layer (`(dir name, doc)`) and its invalid files.
async fn read_layer(source: &Source) -> (Vec<(String, SkillDoc)>, Vec<Invalid>) {
    let mut docs = Vec::new();
    let mut invalid = Vec::new();
    let Ok(entries) = source.fs.list(&source.base).await else {
        return (docs, invalid);
    };
    let mut dirs: Vec<String> = entries
        .into_iter()
        .filter(|e| e.is_dir())
        .map(|e| e.path.file_name().to_owned())
        .filter(|n| !n.starts_with('.') && !n.starts_with('_'))
        .collect();
    dirs.sort();
    dirs.truncate(MAX_SKILLS_PER_LAYER);
    for dir in dirs {
        let Ok(path) = source.base.join(&dir).and_then(|d| d.join("SKILL.md")) else {
            continue;
        };
        let shown = format!("{}/{dir}/SKILL.md", source.shown);
        let text = match source.fs.read_bytes(&path).await {
            Ok(b) if b.len() > MAX_SKILL_BYTES => {
                Err(format!("larger than {MAX_SKILL_BYTES} bytes"))
            }
            Ok(b) => String::from_utf8(b).map_err(|_| "not valid UTF-8".to_owned()),
            Err(e) if e.is_not_found() => continue,
            Err(e) => Err(e.to_string()),
        };
        let parsed =
            text.and_then(|t| PARSED.get_or_parse(&[dir.as_str(), &t], || parse_skill(&dir, &t)));
        match parsed {
            Ok(doc) => docs.push((dir, doc)),
            Err(error) => invalid.push(Invalid { path: shown, error }),
        }
    }
    (docs, invalid)
}

/// Files below `dir` (relative paths), at most [`MAX_RESOURCES`].
async fn walk(fs: &Arc<dyn Filesystem>, dir: &FsPath, out: &mut Vec<String>) {
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs.list(&d).await else {
            continue;
        };
        for e in entries {
            if e.is_dir() {
                stack.push(e.path);
            } else if let Some(rel) = e.path.strip_prefix(dir) {
                if out.len() >= MAX_RESOURCES {
                    return;
                }
                out.push(rel.as_str().trim_start_matches('/').to_owned());
            }
        }
    }
}

fn usage_path() -> Option<FsPath> {
    FsPath::parse(&format!("skills/{USAGE_FILE}")).ok()
}

async fn read_usage(ws: &Workspace) -> BTreeMap<String, Usage> {
    let Some(path) = usage_path() else {
        return BTreeMap::new();
    };
    match ws.home().read_bytes(&path).await {
        Ok(bytes) => match serde_json::from_slice::<UsageFile>(&bytes) {
            Ok(f) => f.skills,
            Err(e) => {
                tracing::warn!(error = %e, "skills/.usage.json is unreadable; every skill counts as active");
                BTreeMap::new()
            }
        },
        Err(_) => BTreeMap::new(),
    }
}

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct UsageFile {
    #[serde(default)]
    skills: BTreeMap<String, Usage>,
}

async fn update_usage(ws: &Workspace, name: &str, f: impl FnOnce(&mut Usage)) -> Result<()> {
    let path = usage_path().ok_or_else(|| Error::Invalid("usage path".into()))?;
    let mut file = UsageFile {
        skills: read_usage(ws).await,
    };
    f(file.skills.entry(name.to_owned()).or_default());
    let bytes = serde_json::to_vec_pretty(&file).map_err(|e| Error::storage("usage", e))?;
    ws.home()
        .write(&path, bytes, WriteOptions::default())
        .await
        .map_err(|e| Error::storage("writing skills/.usage.json failed", e))?;
    Ok(())
}

/// Records a use of an agent-created skill (others have no record and never age).
async fn record_use(ws: &Workspace, name: &str) {
    if read_usage(ws).await.contains_key(name)
        && let Err(e) = update_usage(ws, name, |u| u.last_used = Some(Utc::now())).await
    {
        tracing::warn!(error = %e, skill = name, "recording the use of a skill failed");
    }
}
