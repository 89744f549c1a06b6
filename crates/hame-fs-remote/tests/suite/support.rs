//! Shared helpers: service discovery (loud skips, failures in CI) and race drivers.

use std::sync::Arc;

use hame_fs::{EditRequest, Filesystem, FsPath, GlobRequest, GrepRequest, WriteOptions};
use pretty_assertions::assert_eq;

/// The URL of a test service, or `None` after a loud `SKIPPED` line. Under CI a
/// missing service fails the test.
pub fn service(var: &str, what: &str) -> Option<String> {
    hame_test_env::service(var, what)
}

/// A fresh namespace per test, so runs never collide.
pub fn namespace(tag: &str) -> String {
    format!("{tag}-{}", uuid::Uuid::new_v4().simple())
}

pub fn p(s: &str) -> FsPath {
    FsPath::parse(s).unwrap()
}

/// `n` tasks each append their own marker line to one file through `edit` (compare-and-set
/// with re-application on conflict): every marker must survive.
pub async fn concurrent_editors(fs: Arc<dyn Filesystem>, n: usize) {
    let path = p("shared/notes.md");
    fs.write(&path, b"# notes\n<end>\n".to_vec(), WriteOptions::default())
        .await
        .unwrap();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let fs = Arc::clone(&fs);
            let path = path.clone();
            tokio::spawn(async move {
                let req = EditRequest {
                    old: "<end>\n".into(),
                    new: format!("marker {i}\n<end>\n"),
                    replace_all: false,
                };
                fs.edit(&path, &req).await
            })
        })
        .collect();
    for t in tasks {
        let outcome = t.await.unwrap().unwrap();
        assert_eq!(outcome.replacements, 1);
    }
    let text = String::from_utf8(fs.read_bytes(&path).await.unwrap()).unwrap();
    let mut markers: Vec<&str> = text.lines().filter(|l| l.starts_with("marker ")).collect();
    markers.sort_unstable();
    let mut want: Vec<String> = (0..n).map(|i| format!("marker {i}")).collect();
    want.sort_unstable();
    assert_eq!(markers, want, "no lost update");
    assert!(text.starts_with("# notes\n") && text.ends_with("<end>\n"));
}

/// Two namespaces on one store: nothing of one is visible through the other.
pub async fn tenants_are_isolated(a: &dyn Filesystem, b: &dyn Filesystem) {
    a.write(
        &p("secret/a.txt"),
        b"alpha secret\n".to_vec(),
        WriteOptions::default(),
    )
    .await
    .unwrap();
    b.write(
        &p("public/b.txt"),
        b"beta\n".to_vec(),
        WriteOptions::default(),
    )
    .await
    .unwrap();
    let listed: Vec<String> = b
        .list(&FsPath::root())
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.path.to_string())
        .collect();
    assert_eq!(listed, vec!["/public".to_owned()]);
    assert_eq!(
        b.read_bytes(&p("secret/a.txt"))
            .await
            .err()
            .map(|e| e.code()),
        Some(hame_fs::codes::FILE_NOT_FOUND)
    );
    assert!(!b.exists(&p("secret")).await.unwrap());
    let grep = b.grep(&GrepRequest::new("secret")).await.unwrap();
    assert_eq!(grep.matches, vec![]);
    let glob = b.glob(&GlobRequest::new("**")).await.unwrap();
    let globbed: Vec<String> = glob.files.iter().map(|f| f.path.to_string()).collect();
    assert_eq!(globbed, vec!["/public/b.txt".to_owned()]);
    // And the other way round.
    let grep = a.grep(&GrepRequest::new("beta")).await.unwrap();
    assert_eq!(grep.matches, vec![]);
}
