//! End to end with REAL stock litestream 0.5.17 and its VFS (PROTOCOL.md §6.3, §6.7, §6.8, §8.1b): the service runs
//! with `--litestream-vfs`; a backup replica ([`BackupReplica`]) follows it with `mode=backup`
//! into its own SQLite file, which a real `litestream replicate` backs up to a `file://`
//! replica; the service reads the backed-up watermark back out of that replica. litestream is
//! installed on first use by `scripts/install-litestream.sh`; these tests never skip. The
//! `s3_` variants run the same checks with the replica in a bucket of a local S3 server (moto,
//! installed by `scripts/install-moto.sh`, issue 44).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::backup_files::Store;
use change_streamer_test_support::backup_replica::read_replica;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::litestream_world::{LitestreamWorld, Source, ROWS};
use change_streamer_test_support::service::TestService;
use serde_json::{json, Value};

/// The backup monitor's poll period in these tests.
const POLL_MS: u64 = 200;
/// The cleanup delay floor in these tests.
const DELAY_MS: u64 = 1500;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// The service reading its backup through the VFS, fed by a fake change source, with the
/// backup replica following it; litestream is started by [`LitestreamWorld::replicate`].
type Backed = LitestreamWorld<TestService>;

/// Initial sync at watermark 100, then the backup replica subscribes from it.
async fn start() -> Backed {
    start_on(Store::File).await
}

/// [`start`] with the backup replicated to `store`.
async fn start_on(store: Store) -> Backed {
    let (poll, delay) = (POLL_MS.to_string(), DELAY_MS.to_string());
    let mut b = LitestreamWorld::builder(env!("CARGO_BIN_EXE_change-streamer"))
        .store(store)
        .source(Source::Vfs)
        .flags(&[
            "--backup-check-interval-ms",
            &poll,
            "--min-cleanup-delay-ms",
            &delay,
            "--purge-delay-ms",
            "100",
        ])
        .start()
        .await;
    assert_eq!(b.initial["backup"]["source"], "vfs", "{}", b.initial);
    b.follow().await;
    b
}

fn row_ids(rows: impl IntoIterator<Item = Value>) -> Vec<u64> {
    rows.into_iter()
        .map(|r| r["id"].as_u64().expect("row id"))
        .collect()
}

#[actix_rt::test]
async fn cleanup_is_scheduled_to_a_watermark_only_once_the_backup_holds_it_and_the_delay_passed() {
    cleanup_scheduled_once_held(Store::File).await;
}

#[actix_rt::test]
async fn s3_cleanup_is_scheduled_to_a_watermark_only_once_the_backup_holds_it_and_the_delay_passed()
{
    cleanup_scheduled_once_held(Store::S3).await;
}

async fn cleanup_scheduled_once_held(store: Store) {
    let mut b = start_on(store).await;
    b.send(101, 103).await;
    // No backup yet: polls fail, nothing is recorded or scheduled.
    let st = b
        .svc
        .wait_status("failed polls without a backup", |s| {
            s["backup"]["monitor"]["pollErrorsTotal"].as_u64() >= Some(2)
        })
        .await;
    assert_eq!(st["backup"]["lastScheduledWatermark"], Value::Null, "{st}");
    assert_eq!(st["backup"]["pendingWatermarks"], json!([]), "{st}");

    // Watched from the start: the VFS may read litestream's first files before its snapshot.
    b.replicate().await;
    let st = b
        .svc
        .wait_status("the backup read back at 103", |s| {
            s["backup"]["monitor"]["backupWatermark"] == w(103)
        })
        .await;
    let seen = Instant::now();
    assert_eq!(st["backup"]["lastScheduledWatermark"], Value::Null, "{st}");
    assert_eq!(
        st["backup"]["pendingWatermarks"][0]["replica"], "vfs",
        "{st}"
    );
    let st = b
        .svc
        .wait_status("a cleanup scheduled to 103", |s| {
            s["backup"]["lastScheduledWatermark"] == w(103)
        })
        .await;
    assert!(
        seen.elapsed() >= Duration::from_millis(DELAY_MS - 2 * POLL_MS),
        "scheduled {:?} after the backup was first read, before the {DELAY_MS} ms delay: {st}",
        seen.elapsed()
    );
    // What was scheduled is in the backup: a restore holds it.
    let (restored, _) = read_replica(&b.restore("backup", "check.db"));
    assert!(restored >= w(103), "restored {restored}");
    if let Some(bucket) = b.files().bucket() {
        // The VFS read it out of the bucket: its LISTs and ranged GETs are in the server's log.
        let requests = bucket.requests();
        assert!(
            requests
                .iter()
                .any(|r| r.starts_with("GET /backup?list-type=2")),
            "{requests:?}"
        );
    }
    b.svc.stop().await;
}

#[actix_rt::test]
async fn a_replica_restores_the_backup_and_follows_from_its_watermark_without_a_gap() {
    restores_and_follows(Store::File).await;
}

#[actix_rt::test]
async fn s3_a_replica_restores_the_backup_and_follows_from_its_watermark_without_a_gap() {
    restores_and_follows(Store::S3).await;
}

async fn restores_and_follows(store: Store) {
    let mut b = start_on(store).await;
    b.replicate_and_wait().await;
    b.send(101, 105).await;

    let mut res = WsClient::connect(&b.svc.ws("/replication/v6/snapshot?taskID=r1")).await;
    let (id, status) = res.msg().await;
    res.ack(id).await;
    assert_eq!(status[0], "status", "{status}");
    assert_eq!(status[1]["backupURL"], b.files().url());
    let st = b.svc.status().await;
    assert_eq!(st["reservations"][0]["verified"], true, "{st}");

    // Changes keep coming while the replica restores.
    b.send(106, 108).await;
    let (restored, rows) = read_replica(&b.restore("backup", "restored.db"));
    let restored_n = Watermark::parse(&restored)
        .ok()
        .and_then(|w| w.to_u64())
        .expect("the restored stateVersion is a watermark");
    // Any backed-up state is a valid start, the initial sync's (100) included: litestream may
    // not have shipped the later transactions yet on a busy machine.
    assert!((100..=108).contains(&restored_n), "restored {restored}");

    let mut sub = WsClient::connect(&b.svc.ws(&format!(
        "/replication/v6/changes?id=r1&taskID=r1&mode=serving&replicaVersion={}&watermark={restored}&initial=true",
        w(100)
    )))
    .await;
    let (id, first) = sub.msg().await;
    assert_eq!(first, json!(["status", {"tag": "status"}]));
    sub.ack(id).await;
    assert_eq!(res.closed().await.0, 1000, "the reservation ends");
    b.send(109, 110).await;

    let mut received = Vec::new();
    let mut commits = Vec::new();
    while commits.last() != Some(&w(110)) {
        let (id, msg) = sub.msg().await;
        match msg[0].as_str() {
            Some("data") => received.push(msg[1]["new"].clone()),
            Some("commit") => commits.push(msg[2]["watermark"].as_str().unwrap_or("").to_string()),
            _ => {}
        }
        sub.ack(id).await;
    }
    let expected_commits: Vec<String> = (restored_n + 1..=110).map(w).collect();
    assert_eq!(commits, expected_commits, "restored at {restored}");
    let mut all = row_ids(rows);
    all.extend(row_ids(received));
    let unique: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "a row arrived twice");
    let expected: BTreeSet<u64> = (101..=110)
        .flat_map(|n| (0..ROWS).map(move |i| n * 1000 + i))
        .collect();
    assert_eq!(unique, expected, "restore + stream hold every row");
    sub.close().await;
    b.svc.stop().await;
}

#[actix_rt::test]
async fn no_backup_yet_means_no_status_until_there_is_one() {
    no_status_until_a_backup(Store::File).await;
}

#[actix_rt::test]
async fn s3_no_backup_yet_means_no_status_until_there_is_one() {
    no_status_until_a_backup(Store::S3).await;
}

async fn no_status_until_a_backup(store: Store) {
    let mut b = start_on(store).await;
    b.send(101, 102).await;
    let mut res = WsClient::connect(&b.svc.ws("/replication/v6/snapshot?taskID=t1")).await;
    assert_eq!(
        res.next(Duration::from_millis(3 * POLL_MS + 1000)).await,
        None,
        "a status before any backup"
    );
    let st = b.svc.status().await;
    assert_eq!(
        st["reservations"],
        json!([{"taskID": "t1", "heldMs": st["reservations"][0]["heldMs"], "orphaned": false, "verified": false}]),
        "{st}"
    );
    assert_eq!(st["backup"]["paused"], true, "{st}");

    b.replicate_and_wait().await;
    let (id, status) = res.msg().await;
    res.ack(id).await;
    // The VFS read the backup's size too (PROTOCOL.md §6.3); its value is checked below.
    let size = status[1]["replicaSize"].clone();
    assert!(size.as_u64().is_some_and(|s| s > 0), "{status}");
    assert_eq!(
        status,
        json!(["status", {"tag": "status", "backupURL": b.files().url(), "replicaVersion": w(100), "minWatermark": w(100), "replicaSize": size}])
    );
    let st = b.svc.status().await;
    assert_eq!(st["reservations"][0]["verified"], true, "{st}");
    assert!(
        res.next(Duration::from_millis(100)).await.is_none(),
        "the reservation stays open"
    );
    b.svc.stop().await;
}

/// Waits until a poll that began after this call has ended (so it read the backup as it is now).
async fn a_later_poll(svc: &TestService) {
    let polls = |s: &Value| s["backup"]["monitor"]["pollsTotal"].as_u64().unwrap_or(0);
    let now = polls(&svc.status().await);
    svc.wait_status("two more polls", |s| polls(s) >= now + 2)
        .await;
}

#[actix_rt::test]
async fn the_status_carries_the_size_of_the_database_the_backup_restores_to() {
    let mut b = start().await;
    b.replicate_and_wait().await;
    b.send(101, 140).await;
    b.svc
        .wait_status("the backup read back at 140", |s| {
            s["backup"]["monitor"]["backupWatermark"] == w(140)
        })
        .await;
    a_later_poll(&b.svc).await;
    let mut res = WsClient::connect(&b.svc.ws("/replication/v6/snapshot?taskID=r1")).await;
    let (id, status) = res.msg().await;
    res.ack(id).await;
    // What `litestream restore` writes from the same backup: page count × page size.
    let restored = b.restore("backup", "sized.db");
    let file_bytes = std::fs::metadata(&restored)
        .expect("the restored file")
        .len();
    assert_eq!(status[1]["replicaSize"], file_bytes, "{status}");
    // One read per poll still: the size came with the watermark's read.
    let st = b.svc.status().await;
    let monitor = &st["backup"]["monitor"];
    assert_eq!(monitor["backupReadsTotal"], monitor["pollsTotal"], "{st}");

    // Half restored: the ratio is exported, and /status shows the size beside the bytes.
    let half = file_bytes / 2;
    res.send_text(format!(r#"["progress",{{"bytes":{half}}}]"#))
        .await;
    let st = b
        .svc
        .wait_status("the progress shown", |s| {
            s["reservations"][0]["restoredBytes"] == half
        })
        .await;
    assert_eq!(st["reservations"][0]["replicaSize"], file_bytes, "{st}");
    let (_, page) = b.svc.get("/metrics").await;
    let ratio: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("change_streamer_reservation_restore_ratio{"))
        .collect();
    let want = half as f64 / file_bytes as f64;
    assert_eq!(
        ratio,
        [format!(
            "change_streamer_reservation_restore_ratio{{task=\"r1\"}} {want}"
        )],
        "{page}"
    );
    res.close().await;
    b.svc.stop().await;
}

#[actix_rt::test]
async fn progress_before_the_status_message_closes_with_1002() {
    let b = start().await;
    // No backup yet: the status waits (PROTOCOL.md §6.7), so a progress message is early.
    let mut res = WsClient::connect(&b.svc.ws("/replication/v6/snapshot?taskID=early")).await;
    b.svc
        .wait_status("the reservation open", |s| {
            s["reservations"][0]["taskID"] == "early"
        })
        .await;
    res.send_text(r#"["progress",{"bytes":0}]"#.into()).await;
    assert_eq!(
        res.closed().await,
        (1002, "progress before the status message".to_string())
    );
    b.svc
        .wait_status("the reservation dropped", |s| {
            s["reservations"] == json!([])
        })
        .await;
    b.svc.stop().await;
}
