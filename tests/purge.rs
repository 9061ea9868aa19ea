//! End to end: what holds a purge back (PROTOCOL.md §9, §11) and the reservation cap (PROTOCOL.md §6.6),
//! against the real server with a fake change source and a fake litestream: the retention
//! floor keeps rows younger than `--change-log-retention-ms` and the watermark stays scheduled;
//! `/status` `purge.blockedBy` and the `change_streamer_purge_blocked{reason}` series name the
//! reason; a reservation held past `--max-reservation-ms` is closed 1011 and counted.

use std::collections::HashMap;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use change_streamer_test_support::service::TestService;
use change_streamer_test_support::upstream::{txn, FakeUpstream};
use prometheus_parse::{Scrape, Value};
use serde_json::json;

fn w(n: u64) -> String {
    Watermark::from_u64(n).to_string()
}

/// The service, its change source and its litestream (reporting nothing yet), with
/// transactions 100..=104 of 2 rows each stored.
async fn stored_to_104(extra: &[&str]) -> (TestService, FakeUpstream, FakeLitestream) {
    let up = FakeUpstream::start().await;
    let lite = FakeLitestream::start(Answer::default()).await;
    let (up_url, lite_url) = (up.url(), lite.url());
    let mut args = vec![
        "--upstream",
        &up_url,
        "--litestream-backup-url",
        "s3://b/r",
        "--litestream-metrics-url",
        &lite_url,
        "--backup-check-interval-ms",
        "20",
        "--min-cleanup-delay-ms",
        "0",
        "--purge-delay-ms",
        "20",
    ];
    args.extend_from_slice(extra);
    let svc = TestService::start(&args).await;
    up.wait_connections(1).await;
    for n in 100..=104 {
        up.send(txn(n, 2));
    }
    svc.wait_status("stored up to 104", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(104))
    })
    .await;
    (svc, up, lite)
}

/// litestream reports 104 backed up long ago: with a 0 ms delay floor, a cleanup to 104 is
/// scheduled at the next poll.
fn report_backup_of_104(lite: &FakeLitestream) {
    lite.set_body(render_page(
        "/db",
        &[(Some(w(104).as_str()), "s3", "1.0".into())],
    ));
}

/// The `change_streamer_purge_blocked` series by reason, parsed as a Prometheus client does.
async fn purge_blocked(svc: &TestService) -> HashMap<String, f64> {
    let (code, text) = svc.get("/metrics").await;
    assert_eq!(code, 200, "{text}");
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parse");
    scrape
        .samples
        .into_iter()
        .filter(|s| s.metric == "change_streamer_purge_blocked")
        .map(|s| {
            let v = match s.value {
                Value::Gauge(v) => v,
                other => panic!("not a gauge: {other:?}"),
            };
            (s.labels.get("reason").unwrap_or_default().to_string(), v)
        })
        .collect()
}

fn only(reason: Option<&str>) -> HashMap<String, f64> {
    ["subscriber", "no-subscriber", "retention", "audit"]
        .into_iter()
        .map(|r| (r.to_string(), if Some(r) == reason { 1.0 } else { 0.0 }))
        .collect()
}

/// Reads and acks every message up to the commit of `last`.
async fn ack_through(c: &mut WsClient, last: u64) {
    loop {
        let (id, msg) = c.msg().await;
        c.ack(id).await;
        if msg[0] == "commit" && msg[2]["watermark"] == json!(w(last)) {
            return;
        }
    }
}

fn changes_url(svc: &TestService, id: &str) -> String {
    svc.ws(&format!(
        "/replication/v6/changes?id={id}&replicaVersion={}&watermark={}",
        w(100),
        w(100)
    ))
}

#[actix_rt::test]
async fn rows_younger_than_the_retention_stay_and_their_watermark_stays_scheduled() {
    let (svc, _up, lite) = stored_to_104(&["--change-log-retention-ms", "1500"]).await;
    let mut sub = WsClient::connect(&changes_url(&svc, "r")).await;
    ack_through(&mut sub, 104).await;
    report_backup_of_104(&lite);
    let st = svc
        .wait_status("blocked by retention", |s| {
            s["purge"]["blockedBy"] == json!("retention")
        })
        .await;
    assert_eq!(st["purge"]["scheduled"], json!([w(104)]), "{st}");
    assert_eq!(st["purge"]["rowsPurged"], 0, "{st}");
    assert_eq!(st["changeLog"]["minWatermark"], json!(w(100)), "{st}");
    assert_eq!(purge_blocked(&svc).await, only(Some("retention")));
    // Once the rows are old enough, the retried check purges them.
    let st = svc
        .wait_status("purged after the retention", |s| {
            s["purge"]["scheduled"] == json!([])
        })
        .await;
    assert_eq!(st["changeLog"]["minWatermark"], json!(w(104)), "{st}");
    assert_eq!(st["purge"]["rowsPurged"], 16, "{st}");
    assert_eq!(st["purge"]["blockedBy"], json!(null), "{st}");
    assert_eq!(purge_blocked(&svc).await, only(None));
    svc.stop().await;
}

#[actix_rt::test]
async fn purge_blocked_by_names_no_subscriber_then_a_subscriber_then_nothing() {
    let (svc, _up, lite) = stored_to_104(&["--change-log-retention-ms", "0"]).await;
    assert_eq!(
        purge_blocked(&svc).await,
        only(None),
        "all four series are exported while nothing blocks"
    );
    report_backup_of_104(&lite);
    svc.wait_status("blocked by no subscriber", |s| {
        s["purge"]["blockedBy"] == json!("no-subscriber")
    })
    .await;
    assert_eq!(purge_blocked(&svc).await, only(Some("no-subscriber")));
    // A subscriber that has acked only up to 101.
    let mut sub = WsClient::connect(&changes_url(&svc, "r")).await;
    ack_through(&mut sub, 101).await;
    let st = svc
        .wait_status("blocked by the subscriber", |s| {
            s["purge"]["blockedBy"] == json!("subscriber")
        })
        .await;
    assert_eq!(st["changeLog"]["minWatermark"], json!(w(100)), "{st}");
    assert_eq!(purge_blocked(&svc).await, only(Some("subscriber")));
    ack_through(&mut sub, 104).await;
    let st = svc
        .wait_status("purged", |s| s["purge"]["scheduled"] == json!([]))
        .await;
    assert_eq!(st["purge"]["blockedBy"], json!(null), "{st}");
    assert_eq!(st["changeLog"]["minWatermark"], json!(w(104)), "{st}");
    assert_eq!(purge_blocked(&svc).await, only(None));
    svc.stop().await;
}

#[actix_rt::test]
async fn a_scheduled_purge_survives_a_restart() {
    let (svc, up, lite) = stored_to_104(&["--change-log-retention-ms", "0"]).await;
    report_backup_of_104(&lite);
    svc.wait_status("blocked by no subscriber", |s| {
        s["purge"]["blockedBy"] == json!("no-subscriber")
    })
    .await;
    // litestream forgets it: only what was written down can bring the purge back.
    lite.set_body("");
    let dir = svc.stop().await;
    up.drop_connection();
    let (up_url, lite_url) = (up.url(), lite.url());
    let svc = TestService::start_in(
        dir,
        &[
            "--upstream",
            &up_url,
            "--litestream-backup-url",
            "s3://b/r",
            "--litestream-metrics-url",
            &lite_url,
            "--min-cleanup-delay-ms",
            "0",
            "--purge-delay-ms",
            "20",
            "--change-log-retention-ms",
            "0",
        ],
    )
    .await;
    let st = svc.status().await;
    assert_eq!(st["purge"]["scheduled"], json!([w(104)]), "{st}");
    let mut sub = WsClient::connect(&changes_url(&svc, "r")).await;
    ack_through(&mut sub, 104).await;
    let st = svc
        .wait_status("purged", |s| s["purge"]["scheduled"] == json!([]))
        .await;
    assert_eq!(st["changeLog"]["minWatermark"], json!(w(104)), "{st}");
    svc.stop().await;
}

#[actix_rt::test]
async fn a_reservation_held_past_the_cap_is_closed_1011_and_counted() {
    let (svc, _up, _lite) = stored_to_104(&["--max-reservation-ms", "300"]).await;
    let mut res = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=stuck")).await;
    let (id, _) = res.msg().await;
    res.ack(id).await;
    let (_, text) = svc.get("/metrics").await;
    assert!(
        text.contains("change_streamer_reservations_expired_total 0"),
        "{text}"
    );
    assert_eq!(
        res.closed().await,
        (
            1011,
            "reservation held longer than --max-reservation-ms (300 ms)".to_string()
        )
    );
    svc.wait_status("the reservation ended", |s| s["reservations"] == json!([]))
        .await;
    // The ReservationActor tells the CleanupActor after ending a reservation; a `/status` asked
    // after one that showed it ended reads the CleanupActor after that message.
    let st = svc.status().await;
    assert_eq!(st["backup"]["paused"], false, "{st}");
    assert_eq!(
        st["backup"]["cleanupDelayMs"], 0,
        "an expired reservation does not grow the delay: {st}"
    );
    let (_, text) = svc.get("/metrics").await;
    assert!(
        text.contains("change_streamer_reservations_expired_total 1"),
        "{text}"
    );
    svc.stop().await;
}

#[actix_rt::test]
async fn metrics_show_the_oldest_reservation_the_change_log_size_and_the_owner() {
    let (svc, _up, _lite) = stored_to_104(&[]).await;
    let gauge = |text: &str, name: &str| -> f64 {
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parse");
        match scrape
            .samples
            .iter()
            .find(|s| s.metric == name)
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
            .value
        {
            Value::Gauge(v) => v,
            ref other => panic!("{name} is not a gauge: {other:?}"),
        }
    };
    let (_, text) = svc.get("/metrics").await;
    assert_eq!(
        gauge(&text, "change_streamer_reservation_oldest_seconds"),
        0.0
    );
    assert_eq!(gauge(&text, "change_streamer_owner"), 1.0);
    assert!(gauge(&text, "change_streamer_change_log_bytes") > 0.0);
    let mut res = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=t1")).await;
    let (id, _) = res.msg().await;
    res.ack(id).await;
    actix_rt::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, text) = svc.get("/metrics").await;
    assert!(gauge(&text, "change_streamer_reservation_oldest_seconds") >= 0.3);
    let st = svc.status().await;
    assert_eq!(st["role"], "owner");
    assert_eq!(st["reservations"][0]["orphaned"], false, "{st}");
    assert_eq!(st["reservations"][0]["verified"], true, "{st}");
    res.close().await;
    svc.stop().await;
}
