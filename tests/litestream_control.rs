//! End to end with REAL stock litestream 0.5.17 and its control API (PROTOCOL.md §8.1c): the
//! service runs with `--litestream-control-url unix:…` and `--litestream-db-path`; a backup
//! replica ([`BackupReplica`]) follows it with `mode=backup` into its own SQLite file, which a
//! real `litestream replicate` backs up to a `file://` replica with an hourly sync interval, so
//! that whatever the backup holds within a test was synced because the service asked. The
//! service confirms each acked commit through the control socket, reads nothing of the backup,
//! and purges as it does with the other sources; with litestream unreachable it backs off,
//! says why, and purges nothing. The `s3_` variant runs the same check with the replica in a
//! bucket of a local S3 server (issue 44).

use std::path::Path;
use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::backup_files::{Store, ASKED_AND_PURGED_AT_ONCE};
use change_streamer_test_support::backup_replica::read_replica;
use change_streamer_test_support::litestream_world::{LitestreamWorld, Source};
use change_streamer_test_support::service::TestService;
use serde_json::{json, Value};

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// The service asking litestream's control socket, fed by a fake change source, with the
/// backup replica following it; litestream is started by [`LitestreamWorld::replicate`].
type Controlled = LitestreamWorld<TestService>;

/// Initial sync at watermark 100, then the backup replica subscribes from it. The
/// periodic poll is an hour apart: every confirmation comes from an ack.
async fn start() -> Controlled {
    start_on(Store::File).await
}

/// [`start`] with the backup replicated to `store`.
async fn start_on(store: Store) -> Controlled {
    let mut c = LitestreamWorld::builder(env!("CARGO_BIN_EXE_change-streamer"))
        .store(store)
        .source(Source::Control)
        .flags(&ASKED_AND_PURGED_AT_ONCE)
        .start()
        .await;
    assert_eq!(c.initial["backup"]["source"], "control", "{}", c.initial);
    c.follow().await;
    c
}

/// The processes this test process started other than litestream and `also` (an S3 server):
/// a VFS reader would be one.
fn children_other_than(litestream: &Path, also: Option<u32>) -> Vec<u32> {
    let me = std::process::id().to_string();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        if fields.get(1) == Some(&me.as_str())
            && fields.first() != Some(&"Z")
            && exe != litestream
            && Some(pid) != also
        {
            pids.push(pid);
        }
    }
    pids
}

#[actix_rt::test]
async fn control_source_confirms_each_acked_commit_and_the_purge_follows_with_no_backup_read() {
    confirms_each_acked_commit(Store::File).await;
}

#[actix_rt::test]
async fn s3_control_source_confirms_each_acked_commit_and_the_purge_follows_with_no_backup_read() {
    confirms_each_acked_commit(Store::S3).await;
}

async fn confirms_each_acked_commit(store: Store) {
    let mut c = start_on(store).await;
    c.replicate().await;
    c.send(101, 103).await;
    let st = c
        .svc
        .wait_status("103 confirmed through the control socket", |s| {
            s["backup"]["monitor"]["backupWatermark"] == w(103)
        })
        .await;
    assert_eq!(st["backup"]["monitor"]["lastError"], Value::Null, "{st}");
    assert_eq!(st["backup"]["monitor"]["backupReadsTotal"], 0, "{st}");
    // The backup replicator's starting point may have been asked about before litestream ran
    // (PROTOCOL.md §8.1c): from here on, no request fails.
    let errors = st["backup"]["monitor"]["pollErrorsTotal"].clone();
    // litestream syncs hourly by itself: the backup holds 103 because the service asked.
    let (restored, _) = read_replica(&c.restore("backup", "check.db"));
    assert!(restored >= w(103), "restored {restored}");

    // The purge rules are those of every source: scheduled, then purged below 103.
    let st = c
        .svc
        .wait_status("a purge below 103", |s| {
            s["purge"]["lastPurgedBefore"] == w(103)
        })
        .await;
    assert!(st["purge"]["rowsPurged"].as_u64() > Some(0), "{st}");
    c.send(104, 105).await;
    c.svc
        .wait_status("105 confirmed", |s| {
            s["backup"]["monitor"]["backupWatermark"] == w(105)
        })
        .await;
    let st = c.svc.status().await;
    assert_eq!(st["backup"]["monitor"]["pollErrorsTotal"], errors, "{st}");
    assert_eq!(st["backup"]["monitor"]["backupReadsTotal"], 0, "{st}");
    let litestream_bin = c.litestream.bin.canonicalize().unwrap();
    assert_eq!(
        children_other_than(
            &litestream_bin,
            c.files().s3.as_ref().and_then(|(server, _)| server.pid())
        ),
        Vec::<u32>::new(),
        "no VFS reader"
    );
    if let Some(bucket) = c.files().bucket() {
        // litestream uploaded to the bucket; the service read nothing of it (only litestream's
        // own requests: its uploads, and the LISTs a sync and its restore start with).
        let requests = bucket.requests();
        assert!(
            requests
                .iter()
                .any(|r| r.starts_with("PUT /backup/replica/")),
            "{requests:?}"
        );
    }
    c.svc.stop().await;
}

#[actix_rt::test]
async fn control_source_unreachable_backs_off_with_a_clear_last_error_and_purges_nothing() {
    let mut c = start().await;
    let started = Instant::now();
    c.send(101, 103).await;
    let st = c
        .svc
        .wait_status("three failed requests", |s| {
            s["backup"]["monitor"]["pollErrorsTotal"].as_u64() >= Some(3)
        })
        .await;
    // The first after the ack, then 250 ms and 500 ms later (at least).
    assert!(started.elapsed() >= Duration::from_millis(750), "{st}");
    let error = st["backup"]["monitor"]["lastError"]
        .as_str()
        .unwrap_or_default();
    assert!(
        error.contains("cannot connect")
            && error.contains("ls.sock")
            && error.contains("is litestream running"),
        "{st}"
    );
    assert_eq!(
        st["backup"]["monitor"]["backupWatermark"],
        Value::Null,
        "{st}"
    );
    assert_eq!(st["backup"]["pendingWatermarks"], json!([]), "{st}");
    assert_eq!(st["backup"]["lastScheduledWatermark"], Value::Null, "{st}");
    assert_eq!(st["purge"]["rowsPurged"], 0, "{st}");

    // litestream comes up: the request that ends the backoff confirms 103.
    c.replicate().await;
    let st = c
        .svc
        .wait_status("103 confirmed once litestream answers", |s| {
            s["backup"]["monitor"]["backupWatermark"] == w(103)
        })
        .await;
    assert_eq!(st["backup"]["monitor"]["lastError"], Value::Null, "{st}");
    c.svc.stop().await;
}
