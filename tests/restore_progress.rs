//! End to end: restore progress on a `/snapshot` socket (PROTOCOL.md §6.8), over real websockets
//! against the real server, with the metrics backup source (which knows no `replicaSize`) and a
//! fake change source. The VFS source's `replicaSize` and restore ratio are in
//! `tests/litestream.rs`, against real litestream.

use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::service::{service_with_upstream, TestService};
use change_streamer_test_support::upstream::FakeUpstream;
use serde_json::{json, Value};

const BACKUP: &str = "s3://bucket/replica";

async fn started() -> (TestService, FakeUpstream) {
    service_with_upstream(&["--litestream-backup-url", BACKUP]).await
}

/// Opens a reservation of `task`, reads and acks its status message, and returns both.
async fn reserved(svc: &TestService, task: &str) -> (WsClient, Value) {
    let mut c =
        WsClient::connect(&svc.ws(&format!("/replication/v6/snapshot?taskID={task}"))).await;
    let (id, status) = c.msg().await;
    c.ack(id).await;
    (c, status)
}

/// The page's samples of the restore ratio.
async fn ratio_lines(svc: &TestService) -> Vec<String> {
    let (code, page) = svc.get("/metrics").await;
    assert_eq!(code, 200);
    page.lines()
        .filter(|l| l.starts_with("change_streamer_reservation_restore_ratio{"))
        .map(str::to_string)
        .collect()
}

#[actix_rt::test]
async fn without_progress_messages_nothing_changes() {
    let (svc, _up) = started().await;
    let (c, status) = reserved(&svc, "t1").await;
    // No backup is read with the metrics source: the status has no replicaSize at all.
    assert_eq!(status[1].get("replicaSize"), None, "{status}");
    let st = svc.status().await;
    let entry = &st["reservations"][0];
    let keys: Vec<&str> = entry
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    assert_eq!(keys, ["heldMs", "orphaned", "taskID", "verified"], "{st}");
    assert_eq!(ratio_lines(&svc).await, Vec::<String>::new());
    c.close().await;
    svc.stop().await;
}

#[actix_rt::test]
async fn progress_messages_show_restored_bytes_and_a_rate_in_status() {
    let (svc, _up) = started().await;
    let (mut c, _) = reserved(&svc, "t1").await;
    c.send_text(r#"["progress",{"bytes":0}]"#.into()).await;
    let st = svc
        .wait_status("the first progress shown", |s| {
            s["reservations"][0]["restoredBytes"] == 0
        })
        .await;
    let entry = &st["reservations"][0];
    assert_eq!(entry["replicaSize"], Value::Null, "{st}");
    // Whitespace is allowed, as in any JSON.
    c.send_text(r#" [ "progress" , { "bytes" : 65536 } ] "#.into())
        .await;
    // Once the window reaches 1 s the rate is a number: 65536 bytes over at least that.
    let st = svc
        .wait_status("a rate over at least 1 s", |s| {
            s["reservations"][0]["restoreBytesPerSecond"].is_u64()
                && s["reservations"][0]["restoredBytes"] == 65536
        })
        .await;
    let rate = st["reservations"][0]["restoreBytesPerSecond"]
        .as_u64()
        .unwrap_or(u64::MAX);
    assert!(rate <= 65536, "{st}");
    // Without a replicaSize there is no ratio to export.
    assert_eq!(ratio_lines(&svc).await, Vec::<String>::new());
    // The reservation is as before otherwise: it still holds cleanup.
    assert_eq!(st["backup"]["paused"], true, "{st}");
    c.close().await;
    svc.stop().await;
}

#[actix_rt::test]
async fn bad_progress_messages_close_with_1002_and_end_the_reservation_as_a_drop() {
    let (svc, _up) = started().await;
    let shape = r#"bad progress message: expected ["progress", {"bytes": n}]"#;
    let bytes =
        "bad progress message: bytes must be an integer from 0 to 9223372036854775807, got ";
    let cases = [
        ("[progress", shape.to_string()),
        (r#"["progress",{"bytes":1,"pages":2}]"#, shape.to_string()),
        (r#"["progress",{}]"#, shape.to_string()),
        (r#"["progress",5]"#, shape.to_string()),
        (r#"["status",{"bytes":5}]"#, shape.to_string()),
        (r#"["progress",{"bytes":-5}]"#, format!("{bytes}-5")),
        (r#"["progress",{"bytes":2.5}]"#, format!("{bytes}2.5")),
        (r#"["progress",{"bytes":"5"}]"#, format!("{bytes}\"5\"")),
        (
            "progress 5",
            r#"expected {"ack": n} or ["progress", {"bytes": n}]"#.to_string(),
        ),
    ];
    for (i, (text, reason)) in cases.iter().enumerate() {
        let (mut c, _) = reserved(&svc, &format!("t{i}")).await;
        c.send_text(text.to_string()).await;
        assert_eq!(c.closed().await, (1002, reason.clone()), "{text}");
    }
    let st = svc
        .wait_status("every reservation ended", |s| {
            s["reservations"] == json!([])
        })
        .await;
    let delay = st["backup"]["cleanupDelayMs"].clone();
    // A drop: the delay did not grow, the service serves on.
    let (c, _) = reserved(&svc, "after").await;
    assert_eq!(svc.status().await["backup"]["cleanupDelayMs"], delay);
    c.close().await;
    svc.stop().await;
}
