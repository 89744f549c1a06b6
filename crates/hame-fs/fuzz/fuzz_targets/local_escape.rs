//! `LocalFs` against a hostile tree: a root directory whose symlinks lead out of it
//! (absolute and relative, to a sibling "outside" directory holding a canary, to single
//! files, to `/etc`), a hard link to the canary, a symlink loop and a dangling link. Every
//! input is a short sequence of operations (read, read_range, write, append, edit, list,
//! stat, rename, delete, glob, grep) on paths built from those names and arbitrary strings.
//!
//! After every input: no output carried the canary or `/etc/passwd`'s first line, no
//! reported entry resolves outside the root, no error message names a host path, the
//! outside directory (names and contents), the files next to the root, and `/etc/passwd`
//! are exactly as they were.
//!
//! `HAME_FUZZ_SELFTEST=1` also treats the content of `/file.txt` (inside the root) as a
//! secret, so the fuzzer must report a failure quickly: a check that the oracle works.
//!
//! Safety: as root, an escape through the `/etc` links could damage the host, so when the
//! process runs as root the `/etc` links point at a decoy directory beside the root unless
//! `HAME_FUZZ_REAL_ETC=1`. Run it as an unprivileged user to fuzz against the real `/etc`
//! (see docs/filesystem.md).
#![no_main]

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use hame_fs::{
    DeleteOptions, EditRequest, FileInfo, Filesystem, FilesystemExt, FsPath, GlobRequest,
    GrepRequest, LocalFs, ReadWindow, RenameOptions, WriteOptions,
};
use libfuzzer_sys::fuzz_target;

/// Names that exist in the tree (or are interesting to the parser), picked by index.
const KNOWN: &[&str] = &[
    "abs_out",
    "rel_out",
    "etc",
    "passwd",
    "canary_abs",
    "canary_rel",
    "hard",
    "sub",
    "deep_rel",
    "esc",
    "up",
    "in_link",
    "loop",
    "dangling",
    "file.txt",
    "canary.txt",
    "outside",
    "root",
    "inner",
    "new",
    "..",
    ".",
    "",
    "%2e%2e",
    "..\\..",
    "~",
    "hostname",
    ".hame-tmp-1-1",
];

#[derive(Arbitrary, Debug)]
enum Seg {
    Known(u8),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct P {
    absolute: bool,
    segs: Vec<Seg>,
}

impl P {
    fn render(&self) -> String {
        let segs: Vec<String> = self
            .segs
            .iter()
            .take(8)
            .map(|s| match s {
                Seg::Known(i) => KNOWN[usize::from(*i) % KNOWN.len()].to_owned(),
                Seg::Raw(s) => s.chars().take(64).collect(),
            })
            .collect();
        let joined = segs.join("/");
        if self.absolute {
            format!("/{joined}")
        } else {
            joined
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Mode {
    Overwrite,
    CreateNew,
    IfMatchCurrent,
}

#[derive(Arbitrary, Debug)]
enum Op {
    ReadBytes(P),
    Read(P, u8, u8),
    ReadRange(P, u16, u16),
    Stat(P),
    Exists(P),
    List(P),
    Write(P, Vec<u8>, Mode),
    Append(P, Vec<u8>),
    Edit(P, String, String, bool),
    Delete(P, bool),
    Rename(P, P, bool),
    Glob(P, String),
    Grep(P, String, bool, Option<String>),
}

struct World {
    rt: tokio::runtime::Runtime,
    base: PathBuf,
    root: PathBuf,
    canonical_root: PathBuf,
    outside: PathBuf,
    etc: PathBuf,
    /// Byte strings that must never appear in an output the input did not contain.
    secrets: Vec<Vec<u8>>,
    outside_snapshot: BTreeMap<PathBuf, Option<Vec<u8>>>,
    base_names: Vec<String>,
    passwd: Vec<u8>,
}

fn running_as_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(true)
}

/// Every entry below `dir` (not following symlinks): path → file content (`None` for
/// directories and symlinks, whose targets are compared by `read_link` below).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir outside") {
            let e = e.expect("entry");
            let ft = e.file_type().expect("file type");
            let path = e.path();
            if ft.is_dir() {
                stack.push(path.clone());
                out.insert(path, None);
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&path).expect("read_link");
                out.insert(path, Some(target.into_os_string().into_encoded_bytes()));
            } else {
                out.insert(path.clone(), Some(std::fs::read(&path).expect("read")));
            }
        }
    }
    out
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

impl World {
    fn new() -> World {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let shm = Path::new("/dev/shm");
        let tmp = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        // libFuzzer exits without running destructors, so trees of finished runs stay
        // behind: remove those whose process is gone.
        for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("hame-fs-fuzz-")
                && !Path::new("/proc").join(pid).exists()
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let base = tmp.join(format!("hame-fs-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(outside.join("inner")).expect("mkdir outside");
        let canary = format!(
            "CANARY-{:016x}-{}\n",
            std::collections::hash_map::RandomState::new().hash_one(std::process::id()),
            std::process::id()
        );
        std::fs::write(outside.join("canary.txt"), &canary).expect("canary");
        std::fs::write(outside.join("inner/canary.txt"), &canary).expect("canary 2");
        let etc = if running_as_root() && std::env::var_os("HAME_FUZZ_REAL_ETC").is_none() {
            let decoy = base.join("decoy_etc");
            std::fs::create_dir_all(&decoy).expect("decoy");
            std::fs::write(decoy.join("passwd"), "root:x:0:0:decoy:/root:/bin/sh\n")
                .expect("decoy passwd");
            std::fs::write(decoy.join("hostname"), "decoy\n").expect("decoy hostname");
            decoy
        } else {
            PathBuf::from("/etc")
        };
        let passwd = std::fs::read(etc.join("passwd")).unwrap_or_default();
        let first_line: Vec<u8> = passwd.split(|b| *b == b'\n').next().unwrap_or(b"").to_vec();
        let mut secrets = vec![canary.trim_end().as_bytes().to_vec()];
        if first_line.len() >= 8 {
            secrets.push(first_line);
        }
        if std::env::var_os("HAME_FUZZ_SELFTEST").is_some() {
            // Oracle self-test: treat a file inside the root as secret; the fuzzer must
            // report a "leak" within seconds, proving the check sees read outputs.
            secrets.push(b"inside the root".to_vec());
        }
        let mut w = World {
            rt,
            base: base.clone(),
            canonical_root: PathBuf::new(),
            root,
            outside: outside.clone(),
            etc,
            secrets,
            outside_snapshot: BTreeMap::new(),
            base_names: Vec::new(),
            passwd,
        };
        w.reset();
        w.outside_snapshot = snapshot(&outside);
        w.base_names = names(&base);
        w
    }

    /// Rebuilds the root (outside stays as it is, and is checked).
    fn reset(&mut self) {
        let r = &self.root;
        if r.exists() {
            std::fs::remove_dir_all(r).expect("clear root");
        }
        std::fs::create_dir_all(r.join("sub")).expect("mkdir root");
        std::fs::write(r.join("file.txt"), "hello\ninside the root\n").expect("file");
        std::fs::write(r.join("sub/file.txt"), "nested\n").expect("nested");
        let o = &self.outside;
        symlink(o, r.join("abs_out")).expect("abs_out");
        symlink("../outside", r.join("rel_out")).expect("rel_out");
        symlink(&self.etc, r.join("etc")).expect("etc");
        symlink(self.etc.join("passwd"), r.join("passwd")).expect("passwd");
        symlink(o.join("canary.txt"), r.join("canary_abs")).expect("canary_abs");
        symlink("../outside/canary.txt", r.join("canary_rel")).expect("canary_rel");
        symlink("../../outside", r.join("sub/deep_rel")).expect("deep_rel");
        symlink("../../outside/inner/canary.txt", r.join("sub/esc")).expect("esc");
        symlink("..", r.join("sub/up")).expect("up");
        symlink("sub", r.join("in_link")).expect("in_link");
        symlink("loop", r.join("loop")).expect("loop");
        symlink("nowhere", r.join("dangling")).expect("dangling");
        std::fs::hard_link(o.join("canary.txt"), r.join("hard")).expect("hard link");
        self.canonical_root = std::fs::canonicalize(r).expect("canonical root");
    }

    /// A secret in an output is a leak unless the input itself carried it (the fuzzer may
    /// write a secret it learned from our comparisons into a file and read it back).
    fn leaks(&self, input: &[u8], out: &[u8]) -> Option<String> {
        self.secrets
            .iter()
            .find(|s| contains(out, s) && !contains(input, s))
            .map(|s| String::from_utf8_lossy(s).into_owned())
    }

    fn check_outputs(&self, input: &[u8], what: &str, out: &[u8]) {
        if let Some(secret) = self.leaks(input, out) {
            panic!("{what}: output carries {secret:?}");
        }
        // The fuzzer learns strings it is compared against (libFuzzer's comparison
        // tracing), so it can write the host path into a file itself: only a host path the
        // input did not carry counts.
        let base = self.base.to_string_lossy();
        assert!(
            !contains(out, base.as_bytes()) || contains(input, base.as_bytes()),
            "{what}: output names the host path {base}"
        );
    }

    fn check_entry(&self, what: &str, info: &FileInfo) {
        let host = self.root.join(info.path.as_str());
        if let Ok(real) = std::fs::canonicalize(&host) {
            assert!(
                real.starts_with(&self.canonical_root),
                "{what}: reported {} which resolves to {}",
                info.path,
                real.display()
            );
        }
    }

    fn check_world(&self) {
        assert_eq!(
            snapshot(&self.outside),
            self.outside_snapshot,
            "outside changed"
        );
        assert_eq!(
            names(&self.base),
            self.base_names,
            "files appeared beside the root"
        );
        assert_eq!(
            std::fs::read(self.etc.join("passwd")).unwrap_or_default(),
            self.passwd,
            "passwd changed"
        );
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn world() -> &'static std::sync::Mutex<World> {
    static W: OnceLock<std::sync::Mutex<World>> = OnceLock::new();
    W.get_or_init(|| std::sync::Mutex::new(World::new()))
}

async fn run(w: &World, fs: &LocalFs, input: &[u8], op: &Op) {
    let parse = |p: &P| FsPath::parse(&p.render()).ok();
    let out = |what: &str, bytes: &[u8]| w.check_outputs(input, what, bytes);
    let err = |what: &str, e: &hame_fs::Error| out(what, e.to_string().as_bytes());
    match op {
        Op::ReadBytes(p) => {
            let Some(p) = parse(p) else { return };
            match fs.read_bytes(&p).await {
                Ok(d) => out("read_bytes", &d),
                Err(e) => err("read_bytes", &e),
            }
        }
        Op::Read(p, offset, limit) => {
            let Some(p) = parse(p) else { return };
            let window = ReadWindow {
                offset: usize::from(*offset),
                limit: Some(usize::from(*limit)),
            };
            match fs.read(&p, window).await {
                Ok(t) => out("read", t.text.as_bytes()),
                Err(e) => err("read", &e),
            }
        }
        Op::ReadRange(p, offset, len) => {
            let Some(p) = parse(p) else { return };
            match fs.read_range(&p, u64::from(*offset), u64::from(*len)).await {
                Ok(d) => out("read_range", &d),
                Err(e) => err("read_range", &e),
            }
        }
        Op::Stat(p) => {
            let Some(p) = parse(p) else { return };
            match fs.stat(&p).await {
                Ok(i) => w.check_entry("stat", &i),
                Err(e) => err("stat", &e),
            }
        }
        Op::Exists(p) => {
            let Some(p) = parse(p) else { return };
            if let Err(e) = fs.exists(&p).await {
                err("exists", &e);
            }
        }
        Op::List(p) => {
            let Some(p) = parse(p) else { return };
            match fs.list(&p).await {
                Ok(v) => v.iter().for_each(|i| w.check_entry("list", i)),
                Err(e) => err("list", &e),
            }
        }
        Op::Write(p, data, mode) => {
            let Some(p) = parse(p) else { return };
            let options = match mode {
                Mode::Overwrite => WriteOptions::default(),
                Mode::CreateNew => WriteOptions::create_new(),
                Mode::IfMatchCurrent => match fs.read_bytes(&p).await {
                    Ok(cur) => {
                        out("read_bytes", &cur);
                        WriteOptions::if_match(hame_fs::Version::of(&cur))
                    }
                    Err(_) => WriteOptions::if_match(hame_fs::Version::of(b"")),
                },
            };
            if let Err(e) = fs.write(&p, data.clone(), options).await {
                err("write", &e);
            }
        }
        Op::Append(p, data) => {
            let Some(p) = parse(p) else { return };
            if let Err(e) = fs.append(&p, data.clone(), hame_fs::AppendOptions::default()).await {
                err("append", &e);
            }
        }
        Op::Edit(p, old, new, replace_all) => {
            let Some(p) = parse(p) else { return };
            let req = EditRequest {
                old: old.clone(),
                new: new.clone(),
                replace_all: *replace_all,
            };
            if let Err(e) = fs.edit(&p, &req).await {
                err("edit", &e);
            }
        }
        Op::Delete(p, recursive) => {
            let Some(p) = parse(p) else { return };
            let options = DeleteOptions {
                recursive: *recursive,
            };
            if let Err(e) = fs.delete(&p, options).await {
                err("delete", &e);
            }
        }
        Op::Rename(from, to, overwrite) => {
            let (Some(from), Some(to)) = (parse(from), parse(to)) else {
                return;
            };
            let options = RenameOptions {
                overwrite: *overwrite,
            };
            if let Err(e) = fs.rename(&from, &to, options).await {
                err("rename", &e);
            }
        }
        Op::Glob(p, pattern) => {
            let Some(p) = parse(p) else { return };
            let req = GlobRequest {
                path: p,
                ..GlobRequest::new(pattern.clone())
            };
            match fs.glob(&req).await {
                Ok(g) => g.files.iter().for_each(|i| w.check_entry("glob", i)),
                Err(e) => err("glob", &e),
            }
        }
        Op::Grep(p, pattern, literal, glob) => {
            let Some(p) = parse(p) else { return };
            let req = GrepRequest {
                path: p,
                literal: *literal,
                glob: glob.clone(),
                ..GrepRequest::new(pattern.clone())
            };
            match fs.grep(&req).await {
                Ok(g) => {
                    for m in &g.matches {
                        out("grep", m.text.as_bytes());
                        w.check_entry("grep", &FileInfo::file(m.path.clone(), 0));
                    }
                }
                Err(e) => err("grep", &e),
            }
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let Ok(ops) = arbitrary::Unstructured::new(input).arbitrary::<Vec<Op>>() else {
        return;
    };
    let mut guard = world().lock().unwrap_or_else(|p| p.into_inner());
    let w: &mut World = &mut guard;
    w.reset();
    let fs = LocalFs::new(&w.root).expect("open root");
    let w: &World = w;
    w.rt.block_on(async {
        for op in ops.iter().take(16) {
            run(w, &fs, input, op).await;
            w.check_world();
        }
    });
});
