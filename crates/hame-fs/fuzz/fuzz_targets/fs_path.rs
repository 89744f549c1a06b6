//! `FsPath::parse` on arbitrary input: it never panics, it accepts exactly what an
//! independent model of the rules accepts, and whatever it accepts is normalised (no `..`,
//! no empty or `.` segments, no NUL/control/`\`, within the byte and depth limits) and a
//! fixed point (re-parsing `as_str()` or the display form gives the same value).
#![no_main]

use hame_fs::{FsPath, MAX_DEPTH, MAX_PATH_BYTES, MAX_SEGMENT_BYTES};
use libfuzzer_sys::fuzz_target;

/// The documented rules, written independently of `path.rs`: `Some(normal form)` or `None`.
fn model(input: &str) -> Option<String> {
    if input.chars().any(|c| c.is_ascii_control() || c == '\\') {
        return None;
    }
    let segs: Vec<&str> = input
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    if segs
        .iter()
        .any(|s| *s == ".." || s.len() > MAX_SEGMENT_BYTES)
    {
        return None;
    }
    let joined = segs.join("/");
    if joined.len() > MAX_PATH_BYTES || segs.len() > MAX_DEPTH {
        return None;
    }
    Some(joined)
}

fn check_normalised(p: &FsPath) {
    let s = p.as_str();
    assert!(s.len() <= MAX_PATH_BYTES, "too long: {} bytes", s.len());
    assert!(
        !s.starts_with('/') && !s.ends_with('/'),
        "slash at an end: {s:?}"
    );
    assert!(
        !s.contains('\0') && !s.contains('\\'),
        "NUL or backslash: {s:?}"
    );
    assert!(
        !s.chars().any(|c| c.is_ascii_control()),
        "control char: {s:?}"
    );
    if p.is_root() {
        assert_eq!(s, "");
        assert_eq!(p.parent(), None);
        return;
    }
    let segs: Vec<&str> = s.split('/').collect();
    assert!(segs.len() <= MAX_DEPTH, "too deep: {}", segs.len());
    for seg in &segs {
        assert!(
            !seg.is_empty() && *seg != "." && *seg != "..",
            "bad segment {seg:?} in {s:?}"
        );
        assert!(seg.len() <= MAX_SEGMENT_BYTES, "segment too long in {s:?}");
    }
    assert_eq!(p.segments().collect::<Vec<_>>(), segs, "segments()");
    // Fixed point, through every string form.
    assert_eq!(FsPath::parse(s).ok().as_ref(), Some(p), "re-parse as_str");
    assert_eq!(
        FsPath::parse(&p.to_string()).ok().as_ref(),
        Some(p),
        "re-parse Display"
    );
    let json = serde_json::to_string(p).expect("serialise");
    assert_eq!(
        serde_json::from_str::<FsPath>(&json).ok().as_ref(),
        Some(p),
        "serde"
    );
    // Parent, file name, prefix relations.
    let parent = p.parent().expect("a non-root path has a parent");
    assert_eq!(
        parent.join(p.file_name()).ok().as_ref(),
        Some(p),
        "parent + name"
    );
    assert!(p.starts_with(&parent) && p.starts_with(p) && p.starts_with(&FsPath::root()));
    assert_eq!(
        p.strip_prefix(&parent).map(|r| r.as_str().to_owned()),
        Some(p.file_name().to_owned())
    );
}

fuzz_target!(|data: &[u8]| {
    let input = String::from_utf8_lossy(data);
    let parsed = FsPath::parse(&input);
    match (&parsed, model(&input)) {
        (Ok(p), Some(want)) => {
            assert_eq!(p.as_str(), want, "normal form of {input:?}");
            check_normalised(p);
        }
        (Err(e), None) => {
            assert_eq!(e.code(), hame_fs::codes::INVALID_PATH, "{e}");
        }
        (Ok(p), None) => panic!("accepted {input:?} as {p:?}, the rules refuse it"),
        (Err(e), Some(want)) => panic!("refused {input:?} ({e}), the rules give {want:?}"),
    }
    // Joining two accepted paths stays accepted when within the limits, and never escapes.
    if let Some(mid) = input.find('|') {
        let (a, b) = (&input[..mid], &input[mid + 1..]);
        if let (Ok(a), Ok(b)) = (FsPath::parse(a), FsPath::parse(b)) {
            let joined = a.join_path(&b);
            assert!(joined.starts_with(&a), "{joined:?} left {a:?}");
            assert_eq!(joined.strip_prefix(&a).as_ref(), Some(&b));
            if joined.as_str().len() <= MAX_PATH_BYTES && joined.segments().count() <= MAX_DEPTH {
                assert_eq!(FsPath::parse(joined.as_str()).ok().as_ref(), Some(&joined));
            }
        }
    }
});
