//! The conformance suite every [`Filesystem`] backend and wrapper runs.
//!
//! A backend calls it in one line from its tests:
//!
//! ```ignore
//! #[tokio::test]
//! async fn conformance() {
//!     hame_fs::conformance::run_all(&MyFs::new(/* empty */)).await;
//! }
//! ```
//!
//! The filesystem must start empty. Each check uses its own top-level directory (named
//! after the check), so the checks can also be called one by one. Failures panic with the
//! name of the check and what differed. This module is for tests: it is not API-stable.
//!
//! A wrapper that refuses every change (a read-only view) cannot run [`run_all`], which
//! writes through the filesystem under test. It runs [`run_read_only`] instead: fixtures are
//! written to the backing filesystem, and every read through the view must agree with the
//! backing one while every change through the view is `permission_denied` and changes
//! nothing.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Debug;

use crate::error::{Result, codes};
use crate::fs::{
    DeleteOptions, EditRequest, FileKind, Filesystem, FilesystemExt, GlobRequest, GrepRequest,
    ListRequest, Listing, ReadWindow, RenameOptions, Version, WriteOptions,
};
use crate::path::FsPath;

fn p(s: &str) -> FsPath {
    match FsPath::parse(s) {
        Ok(p) => p,
        Err(e) => panic!("bad test path {s:?}: {e}"),
    }
}

#[track_caller]
fn ok<T>(r: Result<T>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: unexpected error [{}] {e}", e.code()),
    }
}

#[track_caller]
fn code<T: Debug>(r: Result<T>, expected: &str, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected error `{expected}`, got Ok({v:?})"),
        Err(e) => assert_eq!(e.code(), expected, "{what}: wrong error code ({e})"),
    }
}

async fn put(fs: &dyn Filesystem, path: &str, data: &str) {
    ok(
        fs.write(&p(path), data.as_bytes().to_vec(), WriteOptions::default())
            .await,
        &format!("write {path}"),
    );
}

async fn get(fs: &dyn Filesystem, path: &str) -> String {
    let b = ok(fs.read_bytes(&p(path)).await, &format!("read {path}"));
    String::from_utf8_lossy(&b).into_owned()
}

/// The paths of `v`, as strings.
pub(crate) fn paths(v: &[crate::fs::FileInfo]) -> Vec<String> {
    v.iter().map(|f| f.path.to_string()).collect()
}

/// Runs every check.
pub async fn run_all(fs: &dyn Filesystem) {
    write_read_roundtrip(fs).await;
    not_found_codes(fs).await;
    create_new_and_compare_and_set(fs).await;
    directories_are_implicit(fs).await;
    list_is_sorted_and_shallow(fs).await;
    read_line_window(fs).await;
    read_byte_ranges(fs).await;
    append_creates_and_extends(fs).await;
    edit_semantics(fs).await;
    edit_preserves_crlf(fs).await;
    delete_semantics(fs).await;
    rename_semantics(fs).await;
    grep_semantics(fs).await;
    glob_semantics(fs).await;
    list_many_semantics(fs).await;
    upload_download_batch(fs).await;
    literal_names(fs).await;
    concurrent_compare_and_set(fs).await;
    concurrent_appends(fs).await;
}

/// Write, read back, stat, exists, versions.
pub async fn write_read_roundtrip(fs: &dyn Filesystem) {
    let path = p("roundtrip/a.txt");
    let v = ok(
        fs.write(&path, b"hello\n".to_vec(), WriteOptions::default())
            .await,
        "write",
    );
    assert_eq!(
        v,
        Version::of(b"hello\n"),
        "write returns the content version"
    );
    assert_eq!(get(fs, "roundtrip/a.txt").await, "hello\n");
    assert_eq!(
        get(fs, "/roundtrip//./a.txt").await,
        "hello\n",
        "path normalisation"
    );
    let st = ok(fs.stat(&path).await, "stat");
    assert_eq!(
        (st.path.clone(), st.kind, st.size),
        (path.clone(), FileKind::File, 6)
    );
    assert!(ok(fs.exists(&path).await, "exists"));
    assert!(ok(fs.exists(&p("roundtrip")).await, "exists dir"));
    assert!(ok(fs.exists(&FsPath::root()).await, "root exists"));
    assert!(!ok(fs.exists(&p("roundtrip/nope")).await, "exists missing"));
    put(fs, "roundtrip/a.txt", "bye").await;
    assert_eq!(get(fs, "roundtrip/a.txt").await, "bye", "overwrite");
    let empty = p("roundtrip/empty");
    ok(
        fs.write(&empty, Vec::new(), WriteOptions::default()).await,
        "empty write",
    );
    assert_eq!(
        ok(fs.read_bytes(&empty).await, "empty read"),
        Vec::<u8>::new()
    );
    let bin: Vec<u8> = (0u8..=255).collect();
    ok(
        fs.write(&p("roundtrip/bin"), bin.clone(), WriteOptions::default())
            .await,
        "binary",
    );
    assert_eq!(
        ok(fs.read_bytes(&p("roundtrip/bin")).await, "binary read"),
        bin
    );
}

/// Missing paths give `file_not_found` everywhere.
pub async fn not_found_codes(fs: &dyn Filesystem) {
    let m = p("nf/missing.txt");
    code(fs.read_bytes(&m).await, codes::FILE_NOT_FOUND, "read_bytes");
    code(
        fs.read(&m, ReadWindow::default()).await,
        codes::FILE_NOT_FOUND,
        "read",
    );
    code(fs.stat(&m).await, codes::FILE_NOT_FOUND, "stat");
    code(fs.list(&p("nf/dir")).await, codes::FILE_NOT_FOUND, "list");
    code(
        fs.delete(&m, DeleteOptions::default()).await,
        codes::FILE_NOT_FOUND,
        "delete",
    );
    code(
        fs.rename(&m, &p("nf/b"), RenameOptions::default()).await,
        codes::FILE_NOT_FOUND,
        "rename",
    );
    let edit = EditRequest {
        old: "a".into(),
        new: "b".into(),
        replace_all: false,
    };
    code(fs.edit(&m, &edit).await, codes::FILE_NOT_FOUND, "edit");
    code(
        fs.grep(&GrepRequest {
            path: p("nf/dir"),
            ..GrepRequest::new("x")
        })
        .await,
        codes::FILE_NOT_FOUND,
        "grep base",
    );
    code(
        fs.glob(&GlobRequest {
            path: p("nf/dir"),
            ..GlobRequest::new("*")
        })
        .await,
        codes::FILE_NOT_FOUND,
        "glob base",
    );
}

/// `CreateNew` and `IfMatch`.
pub async fn create_new_and_compare_and_set(fs: &dyn Filesystem) {
    let path = p("cas/f");
    let v1 = ok(
        fs.write(&path, b"one".to_vec(), WriteOptions::create_new())
            .await,
        "create",
    );
    code(
        fs.write(&path, b"two".to_vec(), WriteOptions::create_new())
            .await,
        codes::ALREADY_EXISTS,
        "create twice",
    );
    let v2 = ok(
        fs.write(&path, b"two".to_vec(), WriteOptions::if_match(v1.clone()))
            .await,
        "cas with current version",
    );
    code(
        fs.write(&path, b"three".to_vec(), WriteOptions::if_match(v1))
            .await,
        codes::CONFLICT,
        "cas with stale version",
    );
    assert_eq!(get(fs, "cas/f").await, "two", "a failed cas writes nothing");
    code(
        fs.write(&p("cas/absent"), b"x".to_vec(), WriteOptions::if_match(v2))
            .await,
        codes::CONFLICT,
        "cas on a missing file",
    );
    assert!(!ok(
        fs.exists(&p("cas/absent")).await,
        "exists after failed cas"
    ));
}

/// Parents are created; files and directories do not overlap.
pub async fn directories_are_implicit(fs: &dyn Filesystem) {
    put(fs, "dirs/a/b/c.txt", "x").await;
    let st = ok(fs.stat(&p("dirs/a/b")).await, "stat dir");
    assert_eq!(st.kind, FileKind::Dir);
    code(
        fs.write(&p("dirs/a/b"), b"x".to_vec(), WriteOptions::default())
            .await,
        codes::IS_DIRECTORY,
        "write over a directory",
    );
    code(
        fs.read_bytes(&p("dirs/a")).await,
        codes::IS_DIRECTORY,
        "read a directory",
    );
    code(
        fs.write(
            &p("dirs/a/b/c.txt/d"),
            b"x".to_vec(),
            WriteOptions::default(),
        )
        .await,
        codes::NOT_A_DIRECTORY,
        "write below a file",
    );
    code(
        fs.list(&p("dirs/a/b/c.txt")).await,
        codes::NOT_A_DIRECTORY,
        "list a file",
    );
    code(
        fs.write(&FsPath::root(), b"x".to_vec(), WriteOptions::default())
            .await,
        codes::IS_DIRECTORY,
        "write the root",
    );
}

/// `list` returns direct children, sorted.
pub async fn list_is_sorted_and_shallow(fs: &dyn Filesystem) {
    for f in [
        "list/b.txt",
        "list/a.txt",
        "list/sub/deep/x",
        "list/c/y",
        "list/a-b",
    ] {
        put(fs, f, "1").await;
    }
    let l = ok(fs.list(&p("list")).await, "list");
    assert_eq!(
        paths(&l),
        vec![
            "/list/a-b",
            "/list/a.txt",
            "/list/b.txt",
            "/list/c",
            "/list/sub"
        ]
    );
    let kinds: Vec<FileKind> = l.iter().map(|f| f.kind).collect();
    assert_eq!(
        kinds,
        vec![
            FileKind::File,
            FileKind::File,
            FileKind::File,
            FileKind::Dir,
            FileKind::Dir
        ]
    );
    assert_eq!(l[1].size, 1);
    let root = ok(fs.list(&FsPath::root()).await, "list root");
    assert!(
        root.iter().any(|f| f.path == p("list") && f.is_dir()),
        "root lists `list/`: {:?}",
        paths(&root)
    );
}

/// `list_many` answers each request, in order, as `list` (children) or `glob` of `**`
/// (recursive) of its directory would, cut at its `max_results`; a missing directory or a
/// file fails that request only; an empty batch is an empty answer.
pub async fn list_many_semantics(fs: &dyn Filesystem) {
    for f in [
        "many/a.txt",
        "many/sub/b.txt",
        "many/sub/deep/c.txt",
        "many/z/d.txt",
        "many/file",
    ] {
        put(fs, f, "12").await;
    }
    let requests = [
        ListRequest::children(p("many")),
        ListRequest::recursive(p("many")),
        ListRequest::recursive(p("many/sub")),
        ListRequest::recursive(p("many")).max_results(2),
        ListRequest::children(p("many")).max_results(1),
        ListRequest::children(p("many/missing")),
        ListRequest::recursive(p("many/missing")),
        ListRequest::children(p("many/file")),
        ListRequest::recursive(p("many/file")),
        ListRequest::children(FsPath::root()),
        ListRequest::recursive(p("many/z")).max_results(0),
        ListRequest::named(
            p("many"),
            [
                "sub",
                "nope",
                "a.txt",
                "a.txt",
                "sub/b.txt",
                "..",
                ".",
                "",
                "sub/",
                "./a.txt",
            ],
        ),
        ListRequest::named(p("many"), ["z", "file", "a.txt"]).max_results(2),
        ListRequest::named(p("many/missing"), ["a.txt"]),
        ListRequest::named(p("many/file"), ["a.txt"]),
        ListRequest::named(p("many"), Vec::<String>::new()),
        // Spellings of a child that are not its name name nothing.
        ListRequest::named(p("many"), ["sub/", "./a.txt", ".", "", "z/d.txt"]),
        // A recursive listing ignores `names`.
        ListRequest {
            names: Some(vec!["nope".into()]),
            ..ListRequest::recursive(p("many/sub"))
        },
    ];
    let out = ok(fs.list_many(&requests).await, "list_many");
    assert_eq!(
        out.len(),
        requests.len(),
        "list_many: one result per request"
    );
    let mut out = out.into_iter();
    let mut next = |what: &str| match out.next() {
        Some(r) => r,
        None => panic!("list_many: no result for {what}"),
    };
    let all = |pattern: &str, path: &str| GlobRequest {
        path: p(path),
        ..GlobRequest::new(pattern)
    };
    let whole = |entries| Listing {
        entries,
        truncated: false,
    };
    let children = whole(ok(fs.list(&p("many")).await, "list many"));
    assert_eq!(
        ok(next("children"), "children"),
        children,
        "children = list"
    );
    assert_eq!(
        paths(&children.entries),
        vec!["/many/a.txt", "/many/file", "/many/sub", "/many/z"]
    );
    let below = ok(fs.glob(&all("**", "many")).await, "glob many").files;
    assert_eq!(
        ok(next("recursive"), "recursive"),
        whole(below.clone()),
        "recursive = glob of **"
    );
    assert_eq!(
        paths(&below),
        vec![
            "/many/a.txt",
            "/many/file",
            "/many/sub/b.txt",
            "/many/sub/deep/c.txt",
            "/many/z/d.txt"
        ]
    );
    let sub = ok(fs.glob(&all("**", "many/sub")).await, "glob many/sub").files;
    assert_eq!(ok(next("recursive sub"), "recursive sub"), whole(sub));
    assert_eq!(
        ok(next("recursive, cut"), "recursive, cut"),
        Listing {
            entries: below[..2].to_vec(),
            truncated: true
        },
        "recursive cut at 2"
    );
    assert_eq!(
        ok(next("children, cut"), "children, cut"),
        Listing {
            entries: children.entries[..1].to_vec(),
            truncated: true
        },
        "children cut at 1"
    );
    code(
        next("missing"),
        codes::FILE_NOT_FOUND,
        "children of a missing dir",
    );
    code(
        next("missing"),
        codes::FILE_NOT_FOUND,
        "recursive of a missing dir",
    );
    code(next("file"), codes::NOT_A_DIRECTORY, "children of a file");
    code(next("file"), codes::NOT_A_DIRECTORY, "recursive of a file");
    let root = ok(next("root"), "root");
    assert_eq!(root, whole(ok(fs.list(&FsPath::root()).await, "list root")));
    assert!(
        root.entries
            .iter()
            .any(|f| f.path == p("many") && f.is_dir()),
        "the root lists `many/`: {:?}",
        paths(&root.entries)
    );
    assert_eq!(
        ok(next("cut at 0"), "cut at 0"),
        Listing {
            entries: Vec::new(),
            truncated: true
        }
    );
    let pick = |names: &[&str]| -> Vec<crate::fs::FileInfo> {
        children
            .entries
            .iter()
            .filter(|e| names.contains(&e.path.file_name()))
            .cloned()
            .collect()
    };
    assert_eq!(
        ok(next("named"), "named"),
        whole(pick(&["a.txt", "sub"])),
        "named = list filtered by name: each child once, a name that is not a child's left out"
    );
    let named = pick(&["a.txt", "file", "z"]);
    assert_eq!(
        ok(next("named, cut"), "named, cut"),
        Listing {
            entries: named[..2].to_vec(),
            truncated: true
        },
        "named cut at 2"
    );
    code(
        next("named missing"),
        codes::FILE_NOT_FOUND,
        "names in a missing dir",
    );
    code(
        next("named file"),
        codes::NOT_A_DIRECTORY,
        "names in a file",
    );
    assert_eq!(ok(next("no names"), "no names"), whole(Vec::new()));
    assert_eq!(
        ok(next("hostile names"), "hostile names"),
        whole(Vec::new()),
        "only a child's exact name names it"
    );
    assert_eq!(
        ok(next("recursive, names"), "recursive, names"),
        whole(ok(fs.glob(&all("**", "many/sub")).await, "glob many/sub").files),
        "a recursive listing ignores names"
    );
    assert_eq!(ok(fs.list_many(&[]).await, "an empty batch").len(), 0);
    // A probe by name beside walks of the names it asks for (the workspace snapshot's
    // batch): each walk answers as alone, whatever the probe found.
    let probe = [
        ListRequest::named(p("many"), ["nope", "file", "sub"]),
        ListRequest::recursive(p("many/nope")),
        ListRequest::recursive(p("many/file")),
        ListRequest::recursive(p("many/sub")),
        ListRequest::recursive(p("many/z")),
    ];
    let mut out = ok(fs.list_many(&probe).await, "a probe and its walks").into_iter();
    let mut next = |what: &str| match out.next() {
        Some(r) => r,
        None => panic!("list_many: no result for {what}"),
    };
    assert_eq!(ok(next("probe"), "probe"), whole(pick(&["file", "sub"])));
    code(
        next("walk"),
        codes::FILE_NOT_FOUND,
        "walk of a name the probe lacks",
    );
    code(
        next("walk"),
        codes::NOT_A_DIRECTORY,
        "walk of a file the probe found",
    );
    assert_eq!(
        ok(next("walk sub"), "walk sub"),
        whole(ok(fs.glob(&all("**", "many/sub")).await, "glob many/sub").files)
    );
    assert_eq!(
        ok(next("walk z"), "walk z"),
        whole(ok(fs.glob(&all("**", "many/z")).await, "glob many/z").files),
        "a walk of a name the probe did not ask for"
    );
}

/// Line windows, endings kept, binary refused.
pub async fn read_line_window(fs: &dyn Filesystem) {
    put(fs, "window/f.txt", "l1\nl2\r\nl3\nl4").await;
    let w = ok(
        fs.read(
            &p("window/f.txt"),
            ReadWindow {
                offset: 1,
                limit: Some(2),
            },
        )
        .await,
        "read",
    );
    assert_eq!(
        (w.text.as_str(), w.offset, w.lines, w.total_lines),
        ("l2\r\nl3\n", 1, 2, 4)
    );
    assert_eq!(w.version, Version::of(b"l1\nl2\r\nl3\nl4"));
    let all = ok(
        fs.read(&p("window/f.txt"), ReadWindow::default()).await,
        "read all",
    );
    assert_eq!(all.text, "l1\nl2\r\nl3\nl4");
    let past = ok(
        fs.read(
            &p("window/f.txt"),
            ReadWindow {
                offset: 10,
                limit: None,
            },
        )
        .await,
        "past end",
    );
    assert_eq!(
        (past.text.as_str(), past.lines, past.total_lines),
        ("", 0, 4)
    );
    put(fs, "window/empty", "").await;
    let e = ok(
        fs.read(&p("window/empty"), ReadWindow::default()).await,
        "empty",
    );
    assert_eq!((e.lines, e.total_lines), (0, 0));
    ok(
        fs.write(
            &p("window/bin"),
            vec![0x89, b'P', 0, 1, 2],
            WriteOptions::default(),
        )
        .await,
        "bin",
    );
    code(
        fs.read(&p("window/bin"), ReadWindow::default()).await,
        codes::BINARY_FILE,
        "binary",
    );
    code(
        fs.read(&p("window"), ReadWindow::default()).await,
        codes::IS_DIRECTORY,
        "read a dir",
    );
}

/// `read_range`: windows cut at the end, empty past it, errors as for `read_bytes`.
pub async fn read_byte_ranges(fs: &dyn Filesystem) {
    let f = p("range/f.bin");
    let data: Vec<u8> = (0u8..=255).cycle().take(1000).collect();
    ok(
        fs.write(&f, data.clone(), WriteOptions::default()).await,
        "write",
    );
    let cases: [(u64, u64, std::ops::Range<usize>); 8] = [
        (0, 1000, 0..1000),
        (0, 10, 0..10),
        (10, 20, 10..30),
        (990, 100, 990..1000),
        (999, 1, 999..1000),
        (1000, 5, 1000..1000),
        (5000, 5, 1000..1000),
        (7, 0, 7..7),
    ];
    for (offset, len, want) in cases {
        assert_eq!(
            ok(fs.read_range(&f, offset, len).await, "read_range"),
            data[want.clone()],
            "read_range({offset}, {len}) is bytes {want:?}"
        );
    }
    assert_eq!(
        ok(fs.read_range(&f, u64::MAX, u64::MAX).await, "huge range"),
        Vec::<u8>::new(),
        "offset and length near u64::MAX do not overflow"
    );
    assert_eq!(
        ok(fs.read_range(&f, 500, u64::MAX).await, "to the end"),
        data[500..],
    );
    ok(
        fs.append(&f, b"tail".to_vec(), crate::AppendOptions::default())
            .await,
        "append",
    );
    assert_eq!(
        ok(fs.read_range(&f, 998, 100).await, "after append"),
        [&data[998..], b"tail".as_slice()].concat(),
        "a range sees appended bytes"
    );
    put(fs, "range/empty", "").await;
    assert_eq!(
        ok(fs.read_range(&p("range/empty"), 0, 10).await, "empty file"),
        Vec::<u8>::new()
    );
    code(
        fs.read_range(&p("range/missing"), 0, 1).await,
        codes::FILE_NOT_FOUND,
        "missing file",
    );
    code(
        fs.read_range(&p("range"), 0, 1).await,
        codes::IS_DIRECTORY,
        "directory",
    );
}

/// `append` creates and extends, synced or not; an empty append adds nothing.
pub async fn append_creates_and_extends(fs: &dyn Filesystem) {
    let f = p("append/log.jsonl");
    ok(
        fs.append(&f, b"{\"a\":1}\n".to_vec(), crate::AppendOptions::default())
            .await,
        "append new",
    );
    ok(
        fs.append(&f, b"{\"a\":2}\n".to_vec(), crate::AppendOptions::default())
            .await,
        "append more",
    );
    assert_eq!(get(fs, "append/log.jsonl").await, "{\"a\":1}\n{\"a\":2}\n");
    put(fs, "append/d/x", "x").await;
    code(
        fs.append(
            &p("append/d"),
            b"x".to_vec(),
            crate::AppendOptions::default(),
        )
        .await,
        codes::IS_DIRECTORY,
        "append to a dir",
    );
    // Unflushed appends land as they do synced, in order; an empty synced append (the
    // flush) adds nothing, and creates an absent file as any append does.
    let g = p("append/steps.jsonl");
    ok(
        fs.append(&g, b"1\n".to_vec(), crate::AppendOptions::atomic())
            .await,
        "atomic append new",
    );
    ok(
        fs.append(&g, b"2\n".to_vec(), crate::AppendOptions::atomic())
            .await,
        "atomic append more",
    );
    ok(
        fs.append(&g, Vec::new(), crate::AppendOptions::default())
            .await,
        "empty synced append",
    );
    ok(
        fs.append(&g, b"3\n".to_vec(), crate::AppendOptions::default())
            .await,
        "synced append after atomic ones",
    );
    assert_eq!(get(fs, "append/steps.jsonl").await, "1\n2\n3\n");
    ok(
        fs.append(
            &p("append/empty"),
            Vec::new(),
            crate::AppendOptions::default(),
        )
        .await,
        "empty append of a new file",
    );
    assert_eq!(get(fs, "append/empty").await, "");
}

fn edit(old: &str, new: &str, replace_all: bool) -> EditRequest {
    EditRequest {
        old: old.into(),
        new: new.into(),
        replace_all,
    }
}

/// Exact, unique replacement; errors for ambiguity, no match, empty and identical strings.
pub async fn edit_semantics(fs: &dyn Filesystem) {
    put(fs, "edit/f.rs", "let a = 1;\nlet b = 1;\n").await;
    let f = p("edit/f.rs");
    code(
        fs.edit(&f, &edit("= 1", "= 2", false)).await,
        codes::AMBIGUOUS_MATCH,
        "ambiguous",
    );
    code(
        fs.edit(&f, &edit("", "x", false)).await,
        codes::INVALID_ARGUMENTS,
        "empty old",
    );
    code(
        fs.edit(&f, &edit("a", "a", false)).await,
        codes::INVALID_ARGUMENTS,
        "old == new",
    );
    code(
        fs.edit(&f, &edit("zzz", "y", false)).await,
        codes::NO_MATCH,
        "no match",
    );
    assert_eq!(
        get(fs, "edit/f.rs").await,
        "let a = 1;\nlet b = 1;\n",
        "failed edits change nothing"
    );
    let o = ok(fs.edit(&f, &edit("let a", "let x", false)).await, "unique");
    assert_eq!(o.replacements, 1);
    let o = ok(fs.edit(&f, &edit("= 1", "= 2", true)).await, "replace_all");
    assert_eq!(o.replacements, 2);
    assert_eq!(get(fs, "edit/f.rs").await, "let x = 2;\nlet b = 2;\n");
    assert_eq!(o.version, Version::of(b"let x = 2;\nlet b = 2;\n"));
    code(
        fs.edit(&p("edit"), &edit("a", "b", false)).await,
        codes::IS_DIRECTORY,
        "edit a dir",
    );
}

/// CRLF files stay CRLF; untouched lines keep their endings.
pub async fn edit_preserves_crlf(fs: &dyn Filesystem) {
    put(fs, "crlf/f.txt", "one\r\ntwo\r\nthree\nfour\r\n").await;
    let f = p("crlf/f.txt");
    ok(
        fs.edit(&f, &edit("one\ntwo", "uno\ndos", false)).await,
        "LF edit on CRLF file",
    );
    assert_eq!(get(fs, "crlf/f.txt").await, "uno\r\ndos\r\nthree\nfour\r\n");
    ok(
        fs.edit(&f, &edit("four", "cuatro", false)).await,
        "single line",
    );
    assert_eq!(
        get(fs, "crlf/f.txt").await,
        "uno\r\ndos\r\nthree\ncuatro\r\n"
    );
}

/// Delete files and directories.
pub async fn delete_semantics(fs: &dyn Filesystem) {
    put(fs, "del/a.txt", "a").await;
    put(fs, "del/d/x", "x").await;
    put(fs, "del/d/e/y", "y").await;
    ok(
        fs.delete(&p("del/a.txt"), DeleteOptions::default()).await,
        "delete file",
    );
    assert!(!ok(fs.exists(&p("del/a.txt")).await, "gone"));
    code(
        fs.delete(&p("del/d"), DeleteOptions::default()).await,
        codes::IS_DIRECTORY,
        "non-recursive dir",
    );
    assert_eq!(get(fs, "del/d/x").await, "x", "nothing deleted");
    ok(
        fs.delete(&p("del/d"), DeleteOptions { recursive: true })
            .await,
        "recursive",
    );
    assert!(!ok(fs.exists(&p("del/d/e/y")).await, "deep file gone"));
    assert!(!ok(fs.exists(&p("del/d")).await, "dir gone"));
}

/// Move files and directories.
pub async fn rename_semantics(fs: &dyn Filesystem) {
    put(fs, "mv/a", "A").await;
    put(fs, "mv/b", "B").await;
    code(
        fs.rename(&p("mv/a"), &p("mv/b"), RenameOptions::default())
            .await,
        codes::ALREADY_EXISTS,
        "no overwrite",
    );
    ok(
        fs.rename(&p("mv/a"), &p("mv/b"), RenameOptions { overwrite: true })
            .await,
        "overwrite",
    );
    assert_eq!(get(fs, "mv/b").await, "A");
    assert!(!ok(fs.exists(&p("mv/a")).await, "source gone"));
    ok(
        fs.rename(&p("mv/b"), &p("mv/new/dir/c"), RenameOptions::default())
            .await,
        "into new dir",
    );
    assert_eq!(get(fs, "mv/new/dir/c").await, "A");
    put(fs, "mv/tree/x", "x").await;
    put(fs, "mv/tree/sub/y", "y").await;
    ok(
        fs.rename(&p("mv/tree"), &p("mv/moved"), RenameOptions::default())
            .await,
        "dir",
    );
    assert_eq!(get(fs, "mv/moved/sub/y").await, "y");
    assert!(!ok(fs.exists(&p("mv/tree")).await, "old dir gone"));
}

/// Regex and literal search, glob filter, caps, binary skipped.
pub async fn grep_semantics(fs: &dyn Filesystem) {
    put(fs, "grep/a.rs", "fn main() {}\nlet a.b = 1;\nFN upper\n").await;
    put(fs, "grep/sub/b.rs", "fn helper() {}\r\nnothing\n").await;
    put(fs, "grep/sub/c.txt", "fn in text\n").await;
    ok(
        fs.write(
            &p("grep/bin.rs"),
            b"fn \0binary".to_vec(),
            WriteOptions::default(),
        )
        .await,
        "bin",
    );
    let base = p("grep");
    let r = ok(
        fs.grep(&GrepRequest {
            path: base.clone(),
            ..GrepRequest::new("^fn \\w+")
        })
        .await,
        "regex",
    );
    let got: Vec<(String, usize, String)> = r
        .matches
        .iter()
        .map(|m| (m.path.to_string(), m.line, m.text.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("/grep/a.rs".into(), 1, "fn main() {}".into()),
            ("/grep/sub/b.rs".into(), 1, "fn helper() {}".into()),
            ("/grep/sub/c.txt".into(), 1, "fn in text".into()),
        ]
    );
    assert!(!r.truncated);
    let lit = ok(
        fs.grep(&GrepRequest {
            path: base.clone(),
            literal: true,
            ..GrepRequest::new("a.b")
        })
        .await,
        "literal",
    );
    assert_eq!(
        lit.matches.len(),
        1,
        "literal `a.b` matches only the text a.b"
    );
    let ci = ok(
        fs.grep(&GrepRequest {
            path: base.clone(),
            case_insensitive: true,
            ..GrepRequest::new("^fn upper")
        })
        .await,
        "case-insensitive",
    );
    assert_eq!(ci.matches.len(), 1);
    let globbed = ok(
        fs.grep(&GrepRequest {
            path: base.clone(),
            glob: Some("*.txt".into()),
            ..GrepRequest::new("fn")
        })
        .await,
        "glob filter",
    );
    assert_eq!(paths_of(&globbed.matches), vec!["/grep/sub/c.txt"]);
    let capped = ok(
        fs.grep(&GrepRequest {
            path: base.clone(),
            max_matches: 2,
            ..GrepRequest::new("fn")
        })
        .await,
        "cap",
    );
    assert_eq!((capped.matches.len(), capped.truncated), (2, true));
    let one = ok(
        fs.grep(&GrepRequest {
            path: p("grep/a.rs"),
            ..GrepRequest::new("let")
        })
        .await,
        "file base",
    );
    assert_eq!(one.matches.len(), 1);
    code(
        fs.grep(&GrepRequest {
            path: base,
            ..GrepRequest::new("(")
        })
        .await,
        codes::INVALID_ARGUMENTS,
        "bad regex",
    );
}

fn paths_of(m: &[crate::fs::GrepMatch]) -> Vec<String> {
    m.iter().map(|m| m.path.to_string()).collect()
}

/// Glob semantics, sorting and caps.
pub async fn glob_semantics(fs: &dyn Filesystem) {
    for f in [
        "glob/a.txt",
        "glob/b.md",
        "glob/sub/c.txt",
        "glob/sub/deep/d.txt",
    ] {
        put(fs, f, "x").await;
    }
    let g = |pattern: &str| GlobRequest {
        path: p("glob"),
        ..GlobRequest::new(pattern)
    };
    let top = ok(fs.glob(&g("*.txt")).await, "*.txt");
    assert_eq!(
        paths(&top.files),
        vec!["/glob/a.txt"],
        "`*` stays in one segment"
    );
    let deep = ok(fs.glob(&g("**/*.txt")).await, "**/*.txt");
    assert_eq!(
        paths(&deep.files),
        vec!["/glob/a.txt", "/glob/sub/c.txt", "/glob/sub/deep/d.txt"]
    );
    let alt = ok(fs.glob(&g("*.{md,txt}")).await, "alternatives");
    assert_eq!(paths(&alt.files), vec!["/glob/a.txt", "/glob/b.md"]);
    let capped = ok(
        fs.glob(&GlobRequest {
            max_results: 1,
            ..g("**")
        })
        .await,
        "cap",
    );
    assert_eq!(
        (paths(&capped.files), capped.truncated),
        (vec!["/glob/a.txt".to_owned()], true)
    );
    let from_root = ok(
        fs.glob(&GlobRequest::new("glob/sub/*.txt")).await,
        "from root",
    );
    assert_eq!(paths(&from_root.files), vec!["/glob/sub/c.txt"]);
    code(
        fs.glob(&g("a[")).await,
        codes::INVALID_ARGUMENTS,
        "bad glob",
    );
}

/// Batch upload and download with per-file results.
pub async fn upload_download_batch(fs: &dyn Filesystem) {
    let res = fs
        .upload(vec![
            (p("batch/a"), b"A".to_vec()),
            (p("batch/b/c"), b"C".to_vec()),
        ])
        .await;
    assert!(res.iter().all(|r| r.is_ok()), "upload: {res:?}");
    let got = fs
        .download(&[p("batch/a"), p("batch/missing"), p("batch/b/c")])
        .await;
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].as_ref().ok(), Some(&b"A".to_vec()));
    assert_eq!(
        got[1].as_ref().err().map(|e| e.code()),
        Some(codes::FILE_NOT_FOUND)
    );
    assert_eq!(got[2].as_ref().ok(), Some(&b"C".to_vec()));
}

/// Names are taken literally: percent escapes, unicode, spaces, a leading `~`.
pub async fn literal_names(fs: &dyn Filesystem) {
    for name in ["%2e%2e", "ünïcødé 文件.txt", "with space", "~", "..."] {
        let path = format!("names/{name}");
        put(fs, &path, name).await;
        assert_eq!(get(fs, &path).await, name);
    }
    let l = ok(fs.list(&p("names")).await, "list");
    assert_eq!(l.len(), 5);
}

/// Two racing compare-and-set writes from the same version: exactly one wins.
pub async fn concurrent_compare_and_set(fs: &dyn Filesystem) {
    let path = p("race/f");
    for round in 0..10 {
        let v = ok(
            fs.write(
                &path,
                format!("base {round}").into_bytes(),
                WriteOptions::default(),
            )
            .await,
            "base",
        );
        let (a, b) = tokio::join!(
            fs.write(&path, b"A".to_vec(), WriteOptions::if_match(v.clone())),
            fs.write(&path, b"B".to_vec(), WriteOptions::if_match(v.clone())),
        );
        let wins = usize::from(a.is_ok()) + usize::from(b.is_ok());
        assert_eq!(
            wins, 1,
            "round {round}: exactly one CAS wins ({a:?}, {b:?})"
        );
        let loser = if a.is_ok() { b } else { a };
        code(loser, codes::CONFLICT, "loser");
    }
}

/// Concurrent appends are all kept.
pub async fn concurrent_appends(fs: &dyn Filesystem) {
    let path = p("race/log");
    let futs = (0..20).map(|i| {
        let path = path.clone();
        async move {
            fs.append(
                &path,
                format!("line {i}\n").into_bytes(),
                crate::AppendOptions::default(),
            )
            .await
        }
    });
    for r in futures::future::join_all(futs).await {
        ok(r, "append");
    }
    let content = get(fs, "race/log").await;
    let mut lines: Vec<&str> = content.lines().collect();
    lines.sort_unstable();
    let mut want: Vec<String> = (0..20).map(|i| format!("line {i}")).collect();
    want.sort_unstable();
    assert_eq!(lines, want);
}

/// The read-only part of the suite, for a `view` that shows `backing` and refuses every
/// change (like [`ReadOnlyFs`](crate::ReadOnlyFs)). `backing` must start empty; fixtures are
/// written to it under `ro/`. Checks: every read method through the view returns what the
/// backing filesystem returns (whole values, errors by code), and every change through the
/// view (`write` in all modes, `append`, `edit`, `delete`, `rename`, `upload`) is
/// `permission_denied` and leaves the backing filesystem byte-for-byte unchanged.
pub async fn run_read_only(backing: &dyn Filesystem, view: &dyn Filesystem) {
    let files: [(&str, &[u8]); 6] = [
        ("ro/a.txt", b"alpha\nbeta\n"),
        ("ro/crlf.txt", b"one\r\ntwo beta\r\n"),
        ("ro/sub/b.md", b"# B\nbeta\n"),
        ("ro/sub/deep/c.rs", b"fn main() {}\n"),
        ("ro/empty", b""),
        ("ro/bin", b"beta\0binary"),
    ];
    for (path, data) in files {
        ok(
            backing
                .write(&p(path), data.to_vec(), WriteOptions::default())
                .await,
            &format!("fixture {path}"),
        );
    }
    read_only_reads_agree(backing, view).await;
    read_only_refuses_changes(backing, view).await;
}

#[track_caller]
fn same<T: Debug + PartialEq>(view: Result<T>, backing: Result<T>, what: &str) {
    match (view, backing) {
        (Ok(v), Ok(b)) => assert_eq!(v, b, "{what}: the view differs from the backing fs"),
        (Err(v), Err(b)) => assert_eq!(v.code(), b.code(), "{what}: error codes differ"),
        (v, b) => panic!("{what}: view gave {v:?}, backing gave {b:?}"),
    }
}

/// Reads through the view agree with reads of the backing filesystem.
pub async fn read_only_reads_agree(backing: &dyn Filesystem, view: &dyn Filesystem) {
    let probes = [
        "ro",
        "ro/a.txt",
        "ro/crlf.txt",
        "ro/sub",
        "ro/sub/b.md",
        "ro/sub/deep/c.rs",
        "ro/empty",
        "ro/bin",
        "ro/missing",
        "ro/a.txt/below",
    ];
    for path in probes.map(p) {
        let what = |m: &str| format!("{m} {path}");
        same(
            view.stat(&path).await,
            backing.stat(&path).await,
            &what("stat"),
        );
        same(
            view.list(&path).await,
            backing.list(&path).await,
            &what("list"),
        );
        same(
            view.exists(&path).await,
            backing.exists(&path).await,
            &what("exists"),
        );
        same(
            view.read_bytes(&path).await,
            backing.read_bytes(&path).await,
            &what("read_bytes"),
        );
        for (offset, len) in [(0, 3), (2, 100), (100, 1)] {
            same(
                view.read_range(&path, offset, len).await,
                backing.read_range(&path, offset, len).await,
                &what(&format!("read_range({offset}, {len})")),
            );
        }
        let window = ReadWindow {
            offset: 1,
            limit: Some(1),
        };
        same(
            view.read(&path, window).await,
            backing.read(&path, window).await,
            &what("read"),
        );
    }
    let root = ok(view.list(&FsPath::root()).await, "list root");
    assert!(
        root.iter().any(|f| f.path == p("ro") && f.is_dir()),
        "the view's root lists `ro/`: {:?}",
        paths(&root)
    );
    let greps = [
        GrepRequest::new("beta"),
        GrepRequest {
            path: p("ro"),
            ..GrepRequest::new("^[a-z]+$")
        },
        GrepRequest {
            path: p("ro/sub"),
            glob: Some("*.md".into()),
            ..GrepRequest::new("beta")
        },
        GrepRequest {
            path: p("ro/a.txt"),
            case_insensitive: true,
            ..GrepRequest::new("ALPHA")
        },
        GrepRequest {
            max_matches: 1,
            ..GrepRequest::new("beta")
        },
        GrepRequest {
            path: p("ro/missing"),
            ..GrepRequest::new("x")
        },
        GrepRequest::new("("),
    ];
    for g in greps {
        same(
            view.grep(&g).await,
            backing.grep(&g).await,
            &format!("grep {:?} in {}", g.pattern, g.path),
        );
    }
    let globs = [
        GlobRequest::new("**"),
        GlobRequest::new("ro/*.txt"),
        GlobRequest {
            path: p("ro/sub"),
            ..GlobRequest::new("**/*.rs")
        },
        GlobRequest {
            max_results: 2,
            ..GlobRequest::new("**")
        },
        GlobRequest {
            path: p("ro/missing"),
            ..GlobRequest::new("*")
        },
        GlobRequest::new("a["),
    ];
    for g in globs {
        same(
            view.glob(&g).await,
            backing.glob(&g).await,
            &format!("glob {:?} in {}", g.pattern, g.path),
        );
    }
    let listings = [
        ListRequest::children(p("ro")),
        ListRequest::recursive(p("ro")),
        ListRequest::recursive(FsPath::root()).max_results(2),
        ListRequest::children(p("ro/missing")),
        ListRequest::recursive(p("ro/a.txt")),
        ListRequest::named(FsPath::root(), ["ro", "nope", "AGENTS.md"]),
        ListRequest::named(p("ro"), ["a.txt", "sub", "b.txt"]).max_results(1),
    ];
    let (v, b) = (
        ok(view.list_many(&listings).await, "list_many (view)"),
        ok(backing.list_many(&listings).await, "list_many (backing)"),
    );
    assert_eq!(v.len(), listings.len(), "list_many: one result per request");
    for ((v, b), r) in v.into_iter().zip(b).zip(&listings) {
        same(v, b, &format!("list_many {r:?}"));
    }
    let batch = [p("ro/a.txt"), p("ro/missing"), p("ro/sub")];
    let (v, b) = (view.download(&batch).await, backing.download(&batch).await);
    assert_eq!(v.len(), b.len(), "download: one result per path");
    for ((v, b), path) in v.into_iter().zip(b).zip(&batch) {
        same(v, b, &format!("download {path}"));
    }
}

/// Every file of `fs` with its content, sorted by path.
async fn snapshot(fs: &dyn Filesystem) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for f in ok(
        crate::generic::walk_files(fs, &FsPath::root()).await,
        "walk",
    ) {
        let data = ok(fs.read_bytes(&f.path).await, "snapshot read");
        out.push((f.path.to_string(), data));
    }
    out
}

/// Every change through the view is `permission_denied` and changes nothing.
pub async fn read_only_refuses_changes(backing: &dyn Filesystem, view: &dyn Filesystem) {
    let before = snapshot(backing).await;
    let (file, dir, new) = (p("ro/a.txt"), p("ro/sub"), p("ro/new.txt"));
    let current = Version::of(b"alpha\nbeta\n");
    let denied = codes::PERMISSION_DENIED;
    for (target, mode) in [
        (&file, WriteOptions::default()),
        (&file, WriteOptions::create_new()),
        (&file, WriteOptions::if_match(current)),
        (&new, WriteOptions::default()),
        (&new, WriteOptions::create_new()),
    ] {
        code(
            view.write(target, b"x".to_vec(), mode.clone()).await,
            denied,
            &format!("write {target} {mode:?}"),
        );
    }
    code(
        view.append(&file, b"x".to_vec(), crate::AppendOptions::default())
            .await,
        denied,
        "append",
    );
    code(
        view.append(&new, b"x".to_vec(), crate::AppendOptions::default())
            .await,
        denied,
        "append new",
    );
    code(
        view.edit(&file, &edit("alpha", "omega", false)).await,
        denied,
        "edit",
    );
    code(
        view.delete(&file, DeleteOptions::default()).await,
        denied,
        "delete file",
    );
    code(
        view.delete(&dir, DeleteOptions { recursive: true }).await,
        denied,
        "delete dir",
    );
    code(
        view.rename(&file, &new, RenameOptions { overwrite: true })
            .await,
        denied,
        "rename file",
    );
    code(
        view.rename(&dir, &p("ro/moved"), RenameOptions::default())
            .await,
        denied,
        "rename dir",
    );
    let up = view
        .upload(vec![
            (file.clone(), b"x".to_vec()),
            (new.clone(), b"y".to_vec()),
        ])
        .await;
    assert_eq!(up.len(), 2, "upload: one result per file");
    for r in up {
        code(r, denied, "upload");
    }
    assert_eq!(
        snapshot(backing).await,
        before,
        "a refused change must not touch the backing filesystem"
    );
}
