//! End to end, PROTOCOL.md §8.4 "On S3" and "The environment" (issue 44), with REAL stock
//! litestream 0.5.17 and a local S3 server (moto, `scripts/install-moto.sh`): a `--backups`
//! file's `s3_` keys are what the service's VFS reader reads the bucket with (the credentials
//! from a file, nothing in this process's environment); `AWS_CA_BUNDLE` in the environment is a
//! start error naming it; a 403 from the object store (s3s-fs, which checks signatures,
//! `scripts/install-s3s-fs.sh`, given a wrong secret) is the backup's `lastError`, said for what
//! it may be (litestream's VFS gives no reason of its own) and counted.
//!
//! The tests change this process's environment (the in-process service's readers inherit it),
//! so they take [`ENV`] in turn.

use std::path::Path;

use change_streamer_actors::vfs::ENV_READER;
use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::backup_files::Store;
use change_streamer_test_support::litestream_world::{LitestreamWorld, Source};
use change_streamer_test_support::s3::{S3Bucket, ACCESS_KEY, SECRET_KEY};
use change_streamer_test_support::s3s_fs::SigningS3;
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::stock_litestream;
use serde_json::Value;

/// Held by each test while it relies on this process's environment; held across awaits (the
/// service runs while the environment is set), so an async lock.
static ENV: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The AWS variables a reader could take credentials or a CA bundle from.
const AWS_VARS: [&str; 6] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CA_BUNDLE",
];

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// One `vfs` backup named `east` of `url` with `keys` (TOML lines), written to `dir`.
fn backups_file(dir: &Path, url: &str, vfs: &Path, keys: &str) -> String {
    let path = dir.join("backups.toml");
    std::fs::write(
        &path,
        format!(
            "[[backup]]\nname = \"east\"\nurl = \"{url}\"\nsource = \"vfs\"\nvfs = \"{}\"\n{keys}",
            vfs.display()
        ),
    )
    .expect("write the backups file");
    path.display().to_string()
}

/// A bucket's URL as a deployment writes it, without the local server's endpoint.
fn plain_url(bucket: &S3Bucket) -> String {
    format!("s3://{}/{}", bucket.name, S3Bucket::PREFIX)
}

#[actix_rt::test]
async fn s3_keys_of_the_backups_file_are_what_the_vfs_reader_reads_the_bucket_with() {
    let _env = ENV.lock().await;
    for v in AWS_VARS {
        std::env::remove_var(v);
    }
    let mut world = LitestreamWorld::builder(env!("CARGO_BIN_EXE_change-streamer"))
        .store(Store::S3)
        .without_exported_credentials()
        .source(Source::Vfs)
        .backups(&["east"])
        .table(|files| {
            let bucket = files.bucket().expect("a bucket");
            let credentials = files.dir.join("credentials");
            std::fs::write(
                &credentials,
                format!(
                    "[default]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
                ),
            )
            .expect("write the credentials file");
            // The URL as a deployment writes it; where and how to reach the bucket is in the
            // s3_ keys.
            let keys = format!(
                "s3_endpoint = \"{}\"\ns3_region = \"us-east-1\"\ns3_path_style = true\ns3_credentials_file = \"{}\"\n",
                bucket.endpoint(),
                credentials.display()
            );
            (plain_url(bucket), keys)
        })
        .flags(&["--backup-check-interval-ms", "200"])
        .start()
        .await;
    let plain = plain_url(world.files().bucket().expect("a bucket"));
    world.follow().await;
    world.replicate().await;
    world.send(101, 103).await;
    let svc = &world.svc;
    let st = svc
        .wait_status("the bucket read at 103 through the s3_ keys", |s| {
            s["backups"][0]["watermark"] == w(103)
        })
        .await;
    assert_eq!(st["backups"][0]["lastError"], Value::Null, "{st}");
    // Restoring replicas get the URL as written.
    assert_eq!(st["backup"]["backupURL"], plain, "{st}");
    // Nothing of the credentials file is shown.
    let text = st.to_string() + &svc.get("/metrics").await.1;
    assert!(!text.contains(SECRET_KEY), "{text}");
    world.svc.stop().await;
}

#[actix_rt::test]
async fn s3_aws_ca_bundle_in_the_environment_is_a_start_error_naming_the_backup_and_what_to_do() {
    let _env = ENV.lock().await;
    std::env::set_var(ENV_READER, env!("CARGO_BIN_EXE_change-streamer"));
    std::env::set_var("AWS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt");
    let litestream = stock_litestream::install();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = backups_file(
        dir.path(),
        "s3://bucket/replica",
        &litestream.vfs,
        "s3_endpoint = \"http://127.0.0.1:9\"\n",
    );
    let e = TestService::start_error(&["--backups", &file]).await;
    std::env::remove_var("AWS_CA_BUNDLE");
    assert!(
        e.contains("\"east\"")
            && e.contains("AWS_CA_BUNDLE is set")
            && e.contains("unset it")
            && e.contains("SSL_CERT_FILE"),
        "{e}"
    );
    // A file:// backup is not concerned.
    std::env::set_var("AWS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt");
    let url = format!("file://{}", dir.path().join("backup").display());
    let file = backups_file(dir.path(), &url, &litestream.vfs, "");
    let svc = TestService::start(&["--backups", &file]).await;
    std::env::remove_var("AWS_CA_BUNDLE");
    svc.stop().await;
}

#[actix_rt::test]
async fn s3_a_403_from_the_object_store_is_the_backups_last_error_naming_refused_credentials() {
    let _env = ENV.lock().await;
    std::env::remove_var("AWS_CA_BUNDLE");
    std::env::set_var(ENV_READER, env!("CARGO_BIN_EXE_change-streamer"));
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "a-wrong-secret");
    let litestream = stock_litestream::install();
    let dir = tempfile::tempdir().expect("tempdir");
    // A server that checks signatures, with the right secret; the service's is wrong.
    let store = SigningS3::start(&dir.path().join("s3"), ACCESS_KEY, SECRET_KEY, &["bucket"]);
    let keys = format!(
        "s3_endpoint = \"{}\"\ns3_region = \"us-east-1\"\ns3_path_style = true\n",
        store.endpoint()
    );
    let file = backups_file(dir.path(), "s3://bucket/replica", &litestream.vfs, &keys);
    let svc = TestService::start(&["--backups", &file, "--backup-check-interval-ms", "200"]).await;
    let st = svc
        .wait_status("the refused read shown", |s| {
            s["backups"][0]["lastError"]
                .as_str()
                .is_some_and(|e| e.contains("refused credentials (403"))
        })
        .await;
    let error = st["backups"][0]["lastError"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("backup s3://bucket/replica")
            && error.contains("litestream ltx")
            && error.contains("SQL logic error"),
        "{st}"
    );
    assert!(!error.contains("a-wrong-secret"), "{st}");
    // The refusal is the store's own: litestream, asked the same with the same wrong secret,
    // is answered 403 SignatureDoesNotMatch.
    let ltx = std::process::Command::new(&litestream.bin)
        .arg("ltx")
        .arg(format!(
            "s3://bucket/replica?endpoint={}&forcePathStyle=true",
            store.endpoint()
        ))
        .env_remove("AWS_CA_BUNDLE")
        .env("AWS_REGION", "us-east-1")
        .output()
        .expect("run litestream ltx");
    let said =
        String::from_utf8_lossy(&ltx.stderr).to_string() + &String::from_utf8_lossy(&ltx.stdout);
    assert!(
        said.contains("StatusCode: 403") && said.contains("SignatureDoesNotMatch"),
        "{said}"
    );
    let (_, metrics) = svc.get("/metrics").await;
    let failed = metrics
        .lines()
        .find(|l| l.starts_with("change_streamer_litestream_poll_errors_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(failed >= Some(1.0), "counted: {metrics}");
    std::env::remove_var("AWS_SECRET_ACCESS_KEY");
    std::env::remove_var("AWS_ACCESS_KEY_ID");
    svc.stop().await;
}
