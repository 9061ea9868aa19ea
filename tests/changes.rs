//! End to end: subscriptions on `/replication/v{N}/changes` against the real server with a fake
//! change source (PROTOCOL.md §4, §7, §9, §10): catch-up then live with no gap and no duplicate,
//! errors type 1 and 2, bad parameters, protocol v4's messages, the reservation ended by an
//! initial subscription, the ack-gated purge, and the 1001 close on stop. What the upstream's
//! side does to them (drop, violation, restart, status) is in `changes_upstream.rs`.

mod changes_support;

use std::time::Duration;

use change_streamer_actors::watermark::Watermark;
use change_streamer_test_support::client::WsClient;
use change_streamer_test_support::litestream::{render_page, Answer, FakeLitestream};
use change_streamer_test_support::upstream::txn;
use change_streamer_test_support::wait::wait_until;
use changes_support::{changes_url, read_txns, service_with_upstream, w};
use serde_json::json;

#[actix_rt::test]
async fn catches_up_from_the_log_then_follows_live_changes() {
    let (svc, up) = service_with_upstream(&[]).await;
    for n in 100..110 {
        up.send(txn(n, 3));
    }
    svc.wait_status("10 transactions stored", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(109))
    })
    .await;
    let mut c = WsClient::connect(&changes_url(&svc, "r1", 104, "")).await;
    let (_, first) = c.msg().await;
    assert_eq!(first, json!(["status", {"tag": "status"}]));
    c.ack(1).await;
    assert_eq!(read_txns(&mut c, 109).await, (105..110).collect::<Vec<_>>());
    for n in 110..115 {
        up.send(txn(n, 2));
    }
    assert_eq!(read_txns(&mut c, 114).await, (110..115).collect::<Vec<_>>());
    // The upstream was acked for every durable commit.
    let last_ack = format!(
        r#"["status",{{"tag":"commit"}},{{"watermark":"{}"}}]"#,
        w(114)
    );
    wait_until(
        "the last commit acked upstream",
        Duration::from_secs(5),
        || up.acks().contains(&last_ack),
    )
    .await;
    let expected: Vec<String> = (100..115)
        .map(|n| {
            format!(
                r#"["status",{{"tag":"commit"}},{{"watermark":"{}"}}]"#,
                w(n)
            )
        })
        .collect();
    assert_eq!(up.acks(), expected, "one ack per commit, in order");
    let st = svc.status().await;
    assert_eq!(st["subscribers"][0]["id"], "r1");
    assert_eq!(st["subscribers"][0]["watermark"], json!(w(114)));
    let (_, metrics) = svc.get("/metrics").await;
    for line in [
        "change_streamer_subscribers 1",
        "change_streamer_subscriber_pending_messages{id=\"r1\",mode=\"serving\"}",
        "change_streamer_changes_stored_total 70",
    ] {
        assert!(metrics.contains(line), "{line} missing from\n{metrics}");
    }
    c.close().await;
    svc.stop().await;
}

#[actix_rt::test]
async fn no_gap_and_no_duplicate_while_subscribers_join_and_leave() {
    let (svc, up) = service_with_upstream(&[]).await;
    let total = 10_000u64;
    let first = 100u64;
    let last = first + total - 1;
    // Pseudo-random join points and lifetimes, fixed for repeatability.
    let mut seed = 0x2545_f491_u64;
    let mut next = move |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    let mut sent = first;
    let mut readers = Vec::new();
    while sent <= last {
        let batch = 1 + next(400);
        let end = (sent + batch).min(last + 1);
        let frames: Vec<String> = (sent..end).flat_map(|n| txn(n, 1 + n % 3)).collect();
        up.send(frames);
        sent = end;
        // A subscriber joins at a recent stored watermark, reads for a while, and maybe leaves.
        let st = svc.status().await;
        if let Some(max) = st["changeLog"]["maxWatermark"].as_str() {
            let max = Watermark::parse(max).unwrap().to_u64().unwrap();
            let from = max.saturating_sub(next(50)).max(first);
            let url = changes_url(&svc, &format!("r{}", readers.len()), from, "");
            let until = if next(2) == 0 {
                (from + 1 + next(300)).min(last)
            } else {
                last
            };
            readers.push(actix_rt::spawn(async move {
                let mut c = WsClient::connect(&url).await;
                let got = read_txns(&mut c, until).await;
                c.close().await;
                (from, until, got)
            }));
        }
    }
    for r in readers {
        let (from, until, got) = r.await.expect("reader");
        let want: Vec<u64> = (from + 1..=until).collect();
        assert_eq!(got.len(), want.len(), "subscriber from {from} to {until}");
        assert_eq!(got, want, "subscriber from {from} to {until}");
    }
    svc.stop().await;
}

#[actix_rt::test]
async fn wrong_replica_version_is_error_type_1_then_closed_after_its_ack() {
    let (svc, up) = service_with_upstream(&[]).await;
    up.send(txn(100, 1));
    svc.wait_status("initial sync", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    // `999` is no LexiVersion either (its prefix promises ten digits): the replicaVersion is
    // compared as text, never parsed (PROTOCOL.md §7), so it is type 1, not a 1002.
    let mut c =
        WsClient::connect(&svc.ws("/replication/v6/changes?id=r&replicaVersion=999&watermark=00"))
            .await;
    let (id, msg) = c.msg().await;
    assert_eq!(
        msg,
        json!(["error", {"type": 1, "message": format!("current replica version is {} (requested 999)", w(100))}])
    );
    c.ack(id).await;
    assert_eq!(c.closed().await.0, 1000);
    svc.stop().await;
}

#[actix_rt::test]
async fn unservable_watermarks_are_refused_type_1_inside_the_range_type_2_below_it() {
    let (svc, up) = service_with_upstream(&["--ping-interval-ms", "300"]).await;
    up.send(txn(100, 1));
    up.send(txn(102, 1));
    svc.wait_status("stored", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(102))
    })
    .await;
    // Inside the stored range but not a stored commit: a history this log does not hold, not a
    // replica behind it (PROTOCOL.md §7).
    let mut c = WsClient::connect(&changes_url(&svc, "r", 101, "")).await;
    let (_, msg) = c.msg().await;
    assert_eq!(
        msg,
        json!(["error", {"type": 1, "message": format!("watermark {} is not a commit of this change log (it holds {} to {})", w(101), w(100), w(102))}])
    );
    // Not acked: closed after one ping interval.
    assert_eq!(c.closed().await.0, 1000);
    // Older than the oldest stored transaction.
    let mut c = WsClient::connect(&changes_url(&svc, "r", 99, "")).await;
    assert_eq!(c.msg().await.1[1]["type"], 2);
    svc.stop().await;
}

#[actix_rt::test]
async fn bad_subscription_parameters_close_with_1002_naming_them() {
    let (svc, up) = service_with_upstream(&[]).await;
    up.send(txn(100, 1));
    for (path, name) in [
        (
            "/replication/v6/changes?replicaVersion=1&watermark=00",
            "id",
        ),
        (
            "/replication/v6/changes?id=a&watermark=00",
            "replicaVersion",
        ),
        ("/replication/v6/changes?id=a&replicaVersion=1", "watermark"),
        (
            "/replication/v6/changes?id=a&replicaVersion=1&watermark=ZZ",
            "watermark",
        ),
    ] {
        let mut c = WsClient::connect(&svc.ws(path)).await;
        let (code, reason) = c.closed().await;
        assert_eq!(code, 1002, "{path}");
        assert!(reason.contains(name), "{path}: {reason}");
    }
    svc.stop().await;
}

#[actix_rt::test]
async fn initial_subscription_ends_the_reservation_and_grows_the_delay() {
    let (svc, up) = service_with_upstream(&[
        "--litestream-backup-url",
        "s3://b/r",
        "--min-cleanup-delay-ms",
        "50",
    ])
    .await;
    up.send(txn(100, 1));
    svc.wait_status("initial sync", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    let mut res = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=task-1")).await;
    let (id, _) = res.msg().await;
    res.ack(id).await;
    // "Restore" for a while: longer than the 50 ms delay.
    assert_eq!(res.next(Duration::from_millis(400)).await, None);
    let mut sub = WsClient::connect(&changes_url(
        &svc,
        "r1",
        100,
        "&taskID=task-1&initial=true&mode=backup",
    ))
    .await;
    assert_eq!(sub.msg().await.1, json!(["status", {"tag": "status"}]));
    assert_eq!(res.closed().await.0, 1000);
    svc.wait_status("reservation ended", |s| s["reservations"] == json!([]))
        .await;
    // The ReservationActor tells the CleanupActor after ending a reservation; a `/status` asked
    // after one that showed it ended reads the CleanupActor after that message.
    let st = svc.status().await;
    let delay = st["backup"]["cleanupDelayMs"].as_i64().unwrap();
    assert!(
        delay >= 400,
        "delay should have grown to the restore time: {st}"
    );
    assert_eq!(st["subscribers"][0]["mode"], "backup");
    svc.stop().await;
}

#[actix_rt::test]
async fn purge_waits_for_a_lagging_subscriber_and_keeps_the_newest_transaction() {
    let lite = FakeLitestream::start(Answer::default()).await;
    let lite_url = lite.url();
    let (svc, up) = service_with_upstream(&[
        "--litestream-backup-url",
        "s3://b/r",
        "--litestream-metrics-url",
        &lite_url,
        "--backup-check-interval-ms",
        "50",
        "--min-cleanup-delay-ms",
        "0",
        "--purge-delay-ms",
        "50",
        "--change-log-retention-ms",
        "0",
    ])
    .await;
    for n in 100..105 {
        up.send(txn(n, 2));
    }
    svc.wait_status("stored", |s| {
        s["changeLog"]["maxWatermark"] == json!(w(104))
    })
    .await;
    // A subscriber that has not acked beyond 101.
    let mut lag = WsClient::connect(&changes_url(&svc, "lagging", 100, "")).await;
    let (id, _) = lag.msg().await;
    lag.ack(id).await;
    loop {
        let (id, msg) = lag.msg().await;
        lag.ack(id).await;
        if msg[0] == "commit" && msg[2]["watermark"] == json!(w(101)) {
            break;
        }
    }
    // litestream reports everything up to 104 backed up long ago.
    lite.set_body(render_page(
        "/db",
        &[(Some(w(104).as_str()), "s3", "1.0".into())],
    ));
    let st = svc
        .wait_status("cleanup scheduled and blocked", |s| {
            s["backup"]["lastScheduledWatermark"] == json!(w(104))
                && s["purge"]["waiting"].is_string()
        })
        .await;
    assert_eq!(st["purge"]["rowsPurged"], 0);
    assert!(
        st["purge"]["waiting"].as_str().unwrap().contains("lagging"),
        "{st}"
    );
    // Now it catches up and acks everything: the purge goes through, keeping the newest txn.
    let got = read_txns(&mut lag, 104).await;
    assert_eq!(got, vec![102, 103, 104]);
    let st = svc
        .wait_status("purged", |s| s["purge"]["rowsPurged"].as_u64() > Some(0))
        .await;
    assert_eq!(st["changeLog"]["minWatermark"], json!(w(104)));
    assert_eq!(st["changeLog"]["rows"], 4);
    assert_eq!(st["purge"]["lastPurgedBefore"], json!(w(104)));
    // A subscriber asking for a purged watermark gets error type 2; a new reservation's
    // minWatermark is the new minimum.
    let mut old = WsClient::connect(&changes_url(&svc, "late", 100, "")).await;
    assert_eq!(old.msg().await.1[1]["type"], 2);
    let mut r = WsClient::connect(&svc.ws("/replication/v6/snapshot?taskID=t9")).await;
    assert_eq!(r.msg().await.1[1]["minWatermark"], json!(w(104)));
    let (_, metrics) = svc.get("/metrics").await;
    assert!(
        metrics.contains("change_streamer_changes_purged_total 16"),
        "{metrics}"
    );
    svc.stop().await;
}

#[actix_rt::test]
async fn protocol_v4_does_not_receive_update_table_metadata() {
    let (svc, up) = service_with_upstream(&[]).await;
    up.send(txn(100, 1));
    svc.wait_status("initial sync", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    let url4 = svc.ws(&format!(
        "/replication/v4/changes?id=old&replicaVersion={}&watermark={}",
        w(100),
        w(100)
    ));
    let mut v4 = WsClient::connect(&url4).await;
    let mut v6 = WsClient::connect(&changes_url(&svc, "new", 100, "")).await;
    for c in [&mut v4, &mut v6] {
        let (id, _) = c.msg().await;
        c.ack(id).await;
    }
    actix_rt::time::sleep(Duration::from_millis(100)).await;
    let wm = w(101);
    up.send(vec![
        format!(r#"["begin",{{"tag":"begin"}},{{"commitWatermark":"{wm}"}}]"#),
        r#"["data",{"tag":"update-table-metadata","table":{"schema":"public","name":"items"},"old":{"rowKey":{}},"new":{"rowKey":{}}}]"#.to_string(),
        format!(r#"["commit",{{"tag":"commit"}},{{"watermark":"{wm}"}}]"#),
    ]);
    let mut got4 = Vec::new();
    let mut got6 = Vec::new();
    for (c, got, n) in [(&mut v4, &mut got4, 2), (&mut v6, &mut got6, 3)] {
        for _ in 0..n {
            let (id, msg) = c.msg().await;
            c.ack(id).await;
            got.push(msg[0].as_str().unwrap().to_string());
        }
    }
    assert_eq!(got4, vec!["begin", "commit"]);
    assert_eq!(got6, vec!["begin", "data", "commit"]);
    match v4.next(Duration::from_millis(100)).await {
        None => {}
        other => panic!("v4 got more: {other:?}"),
    }
    svc.stop().await;
}

#[actix_rt::test]
async fn service_stop_closes_subscriptions_with_1001() {
    let (svc, up) = service_with_upstream(&[]).await;
    up.send(txn(100, 1));
    svc.wait_status("initial sync", |s| s["replicaVersion"] == json!(w(100)))
        .await;
    let mut c = WsClient::connect(&changes_url(&svc, "r", 100, "")).await;
    let (id, _) = c.msg().await;
    c.ack(id).await;
    let stopping = actix_rt::spawn(async move { svc.stop().await });
    assert_eq!(c.closed().await.0, 1001);
    let _ = stopping.await;
}
