//! End to end: snapshot reservations over real websockets against the real server (PROTOCOL.md §6,
//! §5, §11, §12), with a fake change source feeding the change log.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::own_thread::on_own_thread;
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use futures_util::StreamExt;
use serde_json::json;

const BACKUP: &str = "s3://bucket/replica";

/// A service whose change log holds the initial sync (watermark 100) and one more transaction.
async fn initialized(extra: &[&str]) -> (TestService, FakeUpstream) {
    let upstream = FakeUpstream::start().await;
    let url = upstream.url();
    let mut args = vec!["--litestream-backup-url", BACKUP, "--upstream", &url];
    args.extend_from_slice(extra);
    let svc = TestService::start(&args).await;
    upstream.wait_connections(1).await;
    upstream.send(txn(100, 1));
    upstream.send(txn(101, 2));
    svc.wait_status("the change log holds 7 rows", |s| {
        s["changeLog"]["rows"] == json!(7)
    })
    .await;
    (svc, upstream)
}

#[actix_rt::test]
async fn status_message_has_backup_url_replica_version_and_min_watermark() {
    let (svc, _up) = initialized(&[]).await;
    let mut c = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=t1")).await;
    let (id, msg) = c.msg().await;
    assert_eq!(id, 1);
    assert_eq!(
        msg,
        json!(["status", {"tag": "status", "backupURL": BACKUP, "replicaVersion": "12s", "minWatermark": "12s"}])
    );
    c.ack(1).await;
    let st = svc.status().await;
    assert_eq!(st["reservations"][0]["taskID"], "t1");
    assert_eq!(st["backup"]["paused"], true);
    c.close().await;
    svc.stop().await;
}

#[actix_rt::test]
async fn one_reservation_per_task_and_the_replaced_sockets_late_stop_keeps_the_new_one() {
    let (svc, _up) = initialized(&[]).await;
    let mut first = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=t1")).await;
    first.msg().await;
    let mut second = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=t1")).await;
    second.msg().await;
    let (code, reason) = first.closed().await;
    assert_eq!(code, 1000, "{reason}");
    // The first socket is gone; the second still holds the task's reservation.
    actix_rt::time::sleep(Duration::from_millis(100)).await;
    let st = svc.status().await;
    assert_eq!(st["reservations"].as_array().map(Vec::len), Some(1), "{st}");
    assert_eq!(st["backup"]["paused"], true);
    second.close().await;
    svc.wait_status("no reservation left", |s| s["reservations"] == json!([]))
        .await;
    // The ReservationActor tells the CleanupActor after ending a reservation; a `/status` asked
    // after one that showed it ended reads the CleanupActor after that message.
    let st = svc.status().await;
    assert_eq!(st["backup"]["paused"], false, "{st}");
    svc.stop().await;
}

#[actix_rt::test]
async fn dropped_reservation_ends_without_extending_the_delay() {
    let (svc, _up) = initialized(&["--min-cleanup-delay-ms", "10"]).await;
    let mut c = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=slow")).await;
    c.msg().await;
    actix_rt::time::sleep(Duration::from_millis(300)).await;
    c.close().await;
    svc.wait_status("no reservation left", |s| s["reservations"] == json!([]))
        .await;
    // The ReservationActor tells the CleanupActor after ending a reservation; a `/status` asked
    // after one that showed it ended reads the CleanupActor after that message.
    let st = svc.status().await;
    assert_eq!(
        st["backup"]["cleanupDelayMs"], 10,
        "a dropped reservation must not grow the delay: {st}"
    );
    svc.stop().await;
}

#[actix_rt::test]
async fn bad_requests_are_refused_with_the_specified_answers() {
    let (svc, _up) = initialized(&[]).await;
    for (path, want) in [
        (
            "/replication/v6/snapshot",
            "Missing taskID in snapshot request",
        ),
        (
            "/replication/v6/snapshot?taskID=",
            "Missing taskID in snapshot request",
        ),
        (
            "/replication/v7/snapshot?taskID=t",
            "Cannot service client at protocol v7. Supported protocols: [v1 ... v6]",
        ),
        (
            "/replication/v0/changes?id=a",
            "Cannot service client at protocol v0. Supported protocols: [v1 ... v6]",
        ),
    ] {
        let mut c = WsClient::connect(&svc.ws(path)).await;
        assert_eq!(c.closed().await, (1002, want.to_string()), "{path}");
    }
    assert_eq!(svc.get("/replication/v6/snapshot?taskID=t").await.0, 400);
    assert_eq!(svc.get("/replication/v6/changes").await.0, 400);
    assert_eq!(svc.get("/nope").await.0, 404);
    // An unknown path is 404 with an upgrade too.
    let err = awc::Client::new()
        .ws(svc.ws("/replication/v6/nope"))
        .connect()
        .await
        .err();
    assert!(format!("{err:?}").contains("404"), "{err:?}");
    assert_eq!(svc.get("/replication/vx/snapshot").await.0, 404);
    assert_eq!(svc.get("/healthz").await, (200, "ok".to_string()));
    svc.stop().await;
}

#[actix_rt::test]
async fn snapshot_without_a_backup_url_is_refused() {
    let svc = TestService::start(&[]).await;
    let mut c = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=t1")).await;
    assert_eq!(
        c.closed().await,
        (
            1002,
            "replication-manager is not configured with a ZERO_LITESTREAM_BACKUP_URL".to_string()
        )
    );
    svc.stop().await;
}

#[actix_rt::test]
async fn snapshot_before_the_initial_sync_closes_with_1011() {
    let svc = TestService::start(&["--litestream-backup-url", BACKUP]).await;
    let mut c = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=t1")).await;
    let (code, reason) = c.closed().await;
    assert_eq!(code, 1011);
    assert!(reason.contains("not initialized"), "{reason}");
    svc.stop().await;
}

#[actix_rt::test]
async fn a_bad_ack_closes_with_1002_and_ends_the_reservation_as_a_drop() {
    let (svc, _up) = initialized(&[]).await;
    let mut c = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=t1")).await;
    c.msg().await;
    c.send_text(r#"{"ack":2}"#.into()).await;
    let (code, _) = c.closed().await;
    assert_eq!(code, 1002);
    let mut c = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=t2")).await;
    c.msg().await;
    c.send_text("not json".into()).await;
    assert_eq!(c.closed().await.0, 1002);
    svc.wait_status("both reservations ended", |s| {
        s["reservations"] == json!([])
    })
    .await;
    svc.stop().await;
}

#[actix_rt::test]
async fn liveness_closes_a_silent_client_with_1001_no_pong() {
    // An interval a busy machine's round trips fit in (at 100 ms they did not always).
    let (svc, _up) = initialized(&["--ping-interval-ms", "1000"]).await;
    // This client answers pings (in `next`), so it stays. It reads on a thread of its own until
    // told to stop: on the test's thread it would be silent while the test waits.
    let url = svc.ws("/replication/v6/snapshot?taskID=t1");
    let stop = Arc::new(AtomicBool::new(false));
    let (reserved_tx, reserved) = tokio::sync::oneshot::channel();
    let stopped = stop.clone();
    let answering = on_own_thread(move || async move {
        let mut c = WsClient::connect(&url).await;
        c.msg().await;
        let _ = reserved_tx.send(());
        while !stopped.load(Ordering::SeqCst) {
            if let Some(seen) = c.next(Duration::from_millis(50)).await {
                return (Some(seen), c.pings_answered);
            }
        }
        (None, c.pings_answered)
    });
    reserved.await.expect("the answering client's thread");
    // A client that reads nothing (and so never pongs) is dropped after about two intervals;
    // the one answering pings outlives it.
    let (_, mut silent) = awc::Client::new()
        .ws(svc.ws("/replication/v6/snapshot?taskID=mute"))
        .connect()
        .await
        .unwrap();
    svc.wait_status("the silent client's reservation", |s| {
        s["reservations"].as_array().map(Vec::len) == Some(2)
    })
    .await;
    let st = svc
        .wait_status("the silent client dropped", |s| {
            s["reservations"].as_array().map(Vec::len) == Some(1)
        })
        .await;
    assert_eq!(st["reservations"][0]["taskID"], "t1", "{st}");
    // PROTOCOL.md §5: the silent client is told why, in a close frame after the pings it left
    // unanswered.
    let close = loop {
        match silent.next().await {
            Some(Ok(awc::ws::Frame::Close(reason))) => break reason,
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    let close = close.expect("a close frame with a code");
    assert_eq!(u16::from(close.code), 1001);
    assert_eq!(close.description.as_deref(), Some("no pong for 1000 ms"));
    stop.store(true, Ordering::SeqCst);
    let (seen, pings) = answering.await.expect("the answering client's thread");
    assert_eq!(seen, None);
    assert!(pings >= 1, "the answering client was never pinged");
    svc.stop().await;
}

#[actix_rt::test]
async fn service_stop_closes_reservations_with_1001() {
    let (svc, _up) = initialized(&[]).await;
    let mut c = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=t1")).await;
    c.msg().await;
    let stopping = actix_rt::spawn(async move { svc.stop().await });
    assert_eq!(c.closed().await.0, 1001);
    let _ = stopping.await;
}

/// PROTOCOL.md §13: without `--litestream-backup-url` nothing reads the reservations a previous
/// run left open, so `/status` lists none (and nothing is purged); they are kept, and come back as
/// orphans at the next start with the flag.
#[actix_rt::test]
async fn orphans_are_hidden_from_status_without_a_backup_url_and_come_back_with_it() {
    let (svc, _up) = initialized(&[]).await;
    let mut c = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=t1")).await;
    c.msg().await;
    svc.wait_status("reserved", |s| s["reservations"][0]["taskID"] == "t1")
        .await;
    let dir = svc.stop().await;

    let svc = TestService::start_in(dir, &[]).await;
    let st = svc.status().await;
    assert_eq!(st["reservations"], json!([]), "{st}");
    let dir = svc.stop().await;

    let svc = TestService::start_in(dir, &["--litestream-backup-url", BACKUP]).await;
    let st = svc.status().await;
    assert_eq!(st["reservations"][0]["taskID"], "t1", "{st}");
    assert_eq!(st["reservations"][0]["orphaned"], true, "{st}");
    assert_eq!(st["backup"]["paused"], true, "{st}");
    svc.stop().await;
}
