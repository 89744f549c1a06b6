//! `ObjectStoreFs` on object_store's local and in-memory backends, and on a real
//! S3-protocol server (moto, `HAME_TEST_S3_ENDPOINT`, bucket `hame-test`).

use std::sync::Arc;

use hame_fs::{Filesystem, WriteOptions};
use hame_fs_remote::{ObjectStoreFs, ObjectStoreOptions};
use pretty_assertions::assert_eq;

use super::support::{self, p};

const BUCKET: &str = "hame-test";

fn s3_options(endpoint: &str) -> ObjectStoreOptions {
    let mut o = hame_test_env::moto_s3_settings(endpoint)
        .into_iter()
        .fold(ObjectStoreOptions::default(), |o, (k, v)| o.with(k, v));
    o.from_env = false;
    o
}

fn s3(tag: &str) -> Option<ObjectStoreFs> {
    let endpoint = support::service("HAME_TEST_S3_ENDPOINT", "S3 (moto)")?;
    Some(
        ObjectStoreFs::open(
            &format!("s3://{BUCKET}/runs"),
            &support::namespace(tag),
            s3_options(&endpoint),
        )
        .unwrap(),
    )
}

fn memory(tag: &str) -> ObjectStoreFs {
    ObjectStoreFs::open(
        "memory://",
        &support::namespace(tag),
        ObjectStoreOptions::default(),
    )
    .unwrap()
}

fn local(dir: &tempfile::TempDir, tag: &str) -> ObjectStoreFs {
    let url = format!("file://{}", dir.path().display());
    ObjectStoreFs::open(
        &url,
        &support::namespace(tag),
        ObjectStoreOptions::default(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_in_memory() {
    hame_fs::conformance::run_all(&memory("conformance")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_local_directory() {
    let dir = tempfile::tempdir().unwrap();
    hame_fs::conformance::run_all(&local(&dir, "conformance")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_s3() {
    let Some(fs) = s3("conformance") else { return };
    hame_fs::conformance::run_all(&fs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_editors_lose_no_update_in_memory() {
    support::concurrent_editors(Arc::new(memory("editors")), 16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_editors_lose_no_update_local_directory() {
    let dir = tempfile::tempdir().unwrap();
    support::concurrent_editors(Arc::new(local(&dir, "editors")), 16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_editors_lose_no_update_s3() {
    let Some(fs) = s3("editors") else { return };
    support::concurrent_editors(Arc::new(fs), 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_s3_clients_edit_one_file() {
    // Two independent clients (two "replicas") on one namespace: only the server's
    // conditional writes keep them from losing updates.
    let Some(endpoint) = support::service("HAME_TEST_S3_ENDPOINT", "S3 (moto)") else {
        return;
    };
    let ns = support::namespace("replicas");
    let url = format!("s3://{BUCKET}/runs");
    let a = ObjectStoreFs::open(&url, &ns, s3_options(&endpoint)).unwrap();
    let b = ObjectStoreFs::open(&url, &ns, s3_options(&endpoint)).unwrap();
    a.write(&p("f"), b"<end>".to_vec(), WriteOptions::default())
        .await
        .unwrap();
    tokio::join!(edit_many(&a, "a", 6), edit_many(&b, "b", 6));
    let text = String::from_utf8(a.read_bytes(&p("f")).await.unwrap()).unwrap();
    let mut words: Vec<&str> = text.split_whitespace().filter(|w| *w != "<end>").collect();
    words.sort_unstable();
    let mut want: Vec<String> = (0..6)
        .flat_map(|i| [format!("a{i}"), format!("b{i}")])
        .collect();
    want.sort_unstable();
    assert_eq!(words, want);
}

#[tokio::test]
async fn tenants_are_isolated_in_memory_store() {
    // Two namespaces must share one store to prove anything: use one local directory.
    let dir = tempfile::tempdir().unwrap();
    support::tenants_are_isolated(&local(&dir, "tenant-a"), &local(&dir, "tenant-b")).await;
}

#[tokio::test]
async fn tenants_are_isolated_s3() {
    let (Some(a), Some(b)) = (s3("tenant-a"), s3("tenant-b")) else {
        return;
    };
    support::tenants_are_isolated(&a, &b).await;
}

#[tokio::test]
async fn objects_are_named_under_the_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let fs = ObjectStoreFs::open(&url, "tenant-x", ObjectStoreOptions::default()).unwrap();
    fs.write(&p("notes/~a#1.md"), b"x".to_vec(), WriteOptions::default())
        .await
        .unwrap();
    assert!(dir.path().join("tenant-x/notes/%7Ea%231.md").is_file());
    let listed: Vec<String> = fs
        .list(&p("notes"))
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.path.to_string())
        .collect();
    assert_eq!(listed, vec!["/notes/~a#1.md".to_owned()]);
}

#[tokio::test]
async fn open_picks_the_backend_from_the_url() {
    let fs = hame_fs_remote::open("memory://", "t1").await.unwrap();
    fs.append(&p("log"), b"a".to_vec(), hame_fs::AppendOptions::default())
        .await
        .unwrap();
    assert!(format!("{fs:?}").contains("ObjectStoreFs"));
    let err = hame_fs_remote::open("file://relative", "t1")
        .await
        .err()
        .map(|e| e.code());
    assert_eq!(err, Some(hame_fs::codes::INVALID_ARGUMENTS));
    let mut options = hame_fs_remote::OpenOptions::default();
    options.object_store = ObjectStoreOptions::default().with("no_such_key", "1");
    let err = hame_fs_remote::open_with("s3://bucket", "t1", &options)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("unknown configuration key"), "{err}");
}

async fn edit_many(fs: &ObjectStoreFs, tag: &str, n: usize) {
    for i in 0..n {
        let req = hame_fs::EditRequest {
            old: "<end>".into(),
            new: format!("{tag}{i} <end>"),
            replace_all: false,
        };
        fs.edit(&p("f"), &req).await.unwrap();
    }
}

/// Without credentials an S3 store is refused at once, naming what to set: the AWS
/// credential chain would otherwise probe the cloud metadata endpoint.
#[test]
fn s3_without_credentials_is_refused_before_any_request() {
    // The endpoint is a listener of this test: a request would be a connection to it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let mut options = ObjectStoreOptions::default()
        .with("aws_endpoint", &endpoint)
        .with("aws_region", "us-east-1");
    options.from_env = false;
    let err = ObjectStoreFs::open("s3://bucket/prefix", "t", options)
        .err()
        .map(|e| (e.code(), e.to_string()));
    let accepted = listener.accept();
    assert!(
        accepted
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "a connection reached the endpoint: {accepted:?}"
    );
    let (code, message) = err.unwrap_or_default();
    assert_eq!(code, hame_fs::codes::INVALID_ARGUMENTS);
    assert!(message.contains("AWS_ACCESS_KEY_ID"), "{message}");
    // A metadata endpoint set on purpose is the user's choice.
    let mut chosen = ObjectStoreOptions::default()
        .with("aws_endpoint", "http://127.0.0.1:9")
        .with("aws_region", "us-east-1")
        .with("aws_metadata_endpoint", "http://127.0.0.1:9");
    chosen.from_env = false;
    assert!(ObjectStoreFs::open("s3://bucket/prefix", "t", chosen).is_ok());
}
